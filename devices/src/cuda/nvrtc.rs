//! Compiling the kernel modules with NVRTC (the CUDA run-time compiler), through the
//! [`super::ptx_cache`] disk cache.
//!
//! NVRTC needs no GPU: the compile test (`devices/tests/cuda_nvrtc.rs`) checks every module
//! for several architectures on machines that only have `libnvrtc`.

use flm_core::{Error, Result};

use super::kernels::Module;
use super::ptx_cache::PtxCache;

/// Options passed to NVRTC besides the architecture. No fast-math: the kernels must match
/// the CPU ops to f32 rounding, so `expf`, `tanhf` and division stay IEEE-accurate.
pub const OPTIONS: &[&str] = &["--std=c++17"];

/// Whether `libnvrtc` can be loaded (a `libnvrtc.so.13` or one of the names cudarc tries,
/// found by the dynamic loader: `LD_LIBRARY_PATH`, the ld cache).
pub fn available() -> bool {
    // SAFETY: this only asks the dynamic loader whether the library opens; no NVRTC
    // symbol is called.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The options of a compilation for `arch` (`compute_90`), in the order they are passed.
pub fn options(arch: &str) -> Vec<String> {
    let mut opts: Vec<String> = OPTIONS.iter().map(|o| o.to_string()).collect();
    opts.push(format!("--gpu-architecture={arch}"));
    opts
}

/// Compiles `module` for `arch` (`compute_80`, `compute_90`...) into PTX text.
///
/// Errors: [`Error::Device`] when libnvrtc cannot be loaded or the source does not compile
/// (with NVRTC's log).
pub fn compile(module: &Module, arch: &str) -> Result<String> {
    if !available() {
        return Err(Error::Device("libnvrtc not found".into()));
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: options(arch),
        name: Some(format!("{}.cu", module.name)),
        ..Default::default()
    };
    let source = module.full_source();
    let ptx = std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(source, opts))
        .map_err(|_| Error::Device(format!("NVRTC panicked compiling {}", module.name)))?
        .map_err(|e| match e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => Error::Device(format!(
                "NVRTC cannot compile {}.cu for {arch}:\n{}",
                module.name,
                log.to_string_lossy()
            )),
            e => Error::Device(format!("NVRTC on {}.cu: {e}", module.name)),
        })?;
    Ok(ptx.to_src())
}

/// The PTX of `module` for `arch`: from `cache` when it holds it, else compiled and stored
/// there (a cache that cannot be written only costs the next start a compilation).
///
/// Errors: as [`compile`].
pub fn compile_cached(module: &Module, arch: &str, cache: Option<&PtxCache>) -> Result<String> {
    let source = module.full_source();
    let opts = options(arch);
    if let Some(ptx) = cache.and_then(|c| c.get(&source, &opts, arch)) {
        return Ok(ptx);
    }
    let ptx = compile(module, arch)?;
    if let Some(cache) = cache {
        // Best effort: a read-only or full cache directory must not stop the device.
        let _ = cache.put(&source, &opts, arch, &ptx);
    }
    Ok(ptx)
}
