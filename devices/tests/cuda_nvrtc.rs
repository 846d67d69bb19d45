//! Every CUDA kernel module compiles with NVRTC for the GPU generations flm targets, and
//! the PTX defines every kernel the device looks up. NVRTC needs no GPU, only `libnvrtc`
//! (for example the `nvidia-cuda-nvrtc` wheel's `nvidia/cu13/lib` on `LD_LIBRARY_PATH`);
//! without it the test says so and passes. With `FLM_PTXAS` naming a `ptxas` binary (the
//! `nvidia-cuda-nvcc` wheel has one), each PTX is also assembled for its `sm_` target,
//! which checks what NVRTC passes through unchecked (inline PTX, register limits).
#![cfg(feature = "cuda")]

use flm_devices::cuda::kernels::MODULES;
use flm_devices::cuda::nvrtc;
use flm_devices::cuda::ptx_cache::PtxCache;

/// Ampere (A100), Ada (L4, RTX 40xx), Hopper (H100/H200).
const ARCHS: [&str; 3] = ["compute_80", "compute_89", "compute_90"];

#[test]
fn every_module_compiles_and_defines_its_kernels() {
    if !nvrtc::available() {
        eprintln!("skipped: libnvrtc not found (put the CUDA toolkit's or the nvidia-cuda-nvrtc wheel's lib directory on LD_LIBRARY_PATH)");
        return;
    }
    for arch in ARCHS {
        for module in MODULES {
            let ptx = nvrtc::compile(module, arch).unwrap_or_else(|e| panic!("{e}"));
            if let Some(ptxas) = std::env::var_os("FLM_PTXAS") {
                assemble(&ptxas, &ptx, &arch.replace("compute_", "sm_"), module.name);
            }
            for kernel in module.kernels {
                let kernel = kernel.name();
                assert!(
                    ptx.contains(&format!(".entry {kernel}(")),
                    "{}.cu for {arch} has no kernel {kernel}",
                    module.name
                );
            }
        }
    }
}

/// Runs `ptxas` on `ptx` for `sm`, failing the test with its messages.
fn assemble(ptxas: &std::ffi::OsStr, ptx: &str, sm: &str, name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join(format!("{name}.ptx"));
    std::fs::write(&src, ptx).unwrap();
    let out = std::process::Command::new(ptxas)
        .arg(format!("-arch={sm}"))
        .arg(&src)
        .arg("-o")
        .arg(dir.path().join(format!("{name}.cubin")))
        .output()
        .expect("FLM_PTXAS runs");
    assert!(
        out.status.success(),
        "ptxas {name}.ptx for {sm}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn compiled_modules_are_reused_from_the_disk_cache() {
    if !nvrtc::available() {
        eprintln!("skipped: libnvrtc not found");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = PtxCache::new(dir.path());
    let module = &MODULES[0];
    let arch = "compute_90";
    let first = nvrtc::compile_cached(module, arch, Some(&cache)).unwrap();
    let path = cache.path(&module.full_source(), &nvrtc::options(arch), arch);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), first);
    // A marked entry proves the second call reads the file instead of compiling.
    std::fs::write(&path, format!("{first}// cached")).unwrap();
    let second = nvrtc::compile_cached(module, arch, Some(&cache)).unwrap();
    assert!(second.ends_with("// cached"));
}
