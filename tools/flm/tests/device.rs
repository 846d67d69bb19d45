//! `--device` from the command line: in a build without the `cuda` feature `auto`
//! generates on the CPU without a word; with the feature but no usable CUDA GPU it first
//! says why in one line on stderr; either way it writes the tokens of `--device cpu`, and
//! `--device cuda` fails with the reason. On a machine with a GPU (and the feature) the
//! fallback cases are skipped with a message.
//! `--gpu-layers` splits stories260K between the GPU and the CPU with the CPU's tokens, and
//! is refused where there is no GPU to place layers on. `--kv-dtype` takes f32, f16 or auto.

mod common;

use std::path::PathBuf;
use std::process::Output;

fn model() -> PathBuf {
    flm_tests::data("stories260K/stories260K.bin")
}

fn run(device: &str) -> Output {
    run_with(device, &[])
}

fn run_with(device: &str, extra: &[&str]) -> Output {
    common::flm_command()
        .arg("run")
        .arg("--model")
        .arg(model())
        .args(["--prompt", "Once upon a time", "--max-tokens", "12"])
        .args(["--temperature", "0", "--ids", "--device", device])
        .args(extra)
        .output()
        .unwrap()
}

/// `flm run` on `device` with the options `extra`, which it must refuse with an error
/// that says `why`.
fn assert_refused(device: &str, extra: &[&str], why: &str) {
    let out = run_with(device, extra);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(why), "{err}");
}

/// The tokens `flm run` writes on the CPU with the options `extra`, which it must accept.
fn cpu_tokens(extra: &[&str]) -> Vec<u8> {
    let out = run_with("cpu", extra);
    assert!(
        out.status.success(),
        "{extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

const NOTICE: &str = "flm: no CUDA GPU (";

/// What `--device cuda` says in a build without the `cuda` feature.
const NOT_BUILT: &str = "no CUDA GPU (this flm was built without the `cuda` feature)";

/// Whether this binary was built without GPU support (its `--device cuda` says so).
fn built_without_cuda() -> bool {
    String::from_utf8_lossy(&run("cuda").stderr).contains(NOT_BUILT)
}

#[test]
fn auto_falls_back_to_the_cpu_and_cuda_fails() {
    let cpu = run("cpu");
    let cpu_err = String::from_utf8_lossy(&cpu.stderr);
    assert!(cpu.status.success(), "{cpu_err}");
    assert!(!cpu_err.contains(NOTICE), "{cpu_err}");
    let auto = run("auto");
    let auto_err = String::from_utf8_lossy(&auto.stderr);
    assert!(auto.status.success(), "{auto_err}");
    let cuda = run("cuda");
    let cuda_err = String::from_utf8_lossy(&cuda.stderr);
    if cuda_err.contains(NOT_BUILT) {
        assert!(!cuda.status.success());
        assert!(
            !auto_err.contains(NOTICE),
            "no GPU was possible: {auto_err}"
        );
        assert_eq!(auto.stdout, cpu.stdout, "auto generates what cpu does");
        return;
    }
    let notices: Vec<&str> = auto_err.lines().filter(|l| l.starts_with(NOTICE)).collect();
    if notices.is_empty() {
        eprintln!("skipped: a CUDA GPU is in use, there is no fallback to check");
        return;
    }
    assert_eq!(notices.len(), 1, "{auto_err}");
    assert!(notices[0].ends_with("); using the CPU"), "{}", notices[0]);
    assert_eq!(
        auto.stdout, cpu.stdout,
        "auto on the CPU generates what cpu does"
    );
    assert!(!cuda.status.success());
    let why = &notices[0][NOTICE.len()..notices[0].len() - "); using the CPU".len()];
    assert!(
        cuda_err.contains(&format!(
            "error: invalid argument: --device cuda: no CUDA GPU ({why})"
        )),
        "{cuda_err}"
    );
}

#[test]
fn an_unknown_device_is_refused_by_name() {
    assert_refused("gpu", &[], "cpu, cuda or auto");
}

#[test]
fn gpu_layers_write_the_cpu_tokens_or_are_refused_without_a_gpu() {
    let cpu = run("cpu");
    assert!(cpu.status.success());
    // An f32 KV cache on the GPU, as the CPU's (auto would choose f16 there).
    let split = run_with("auto", &["--gpu-layers", "2", "--kv-dtype", "f32"]);
    let err = String::from_utf8_lossy(&split.stderr);
    if err.contains(NOTICE) || built_without_cuda() {
        assert!(!split.status.success());
        assert!(
            err.contains("--gpu-layers places layers on a GPU, and this flm has none to use"),
            "{err}"
        );
        return;
    }
    assert!(split.status.success(), "{err}");
    assert!(
        err.contains("--gpu-layers 2: 2 of 5 layers on cuda:0"),
        "{err}"
    );
    assert_eq!(
        split.stdout, cpu.stdout,
        "2 of 5 layers on the GPU: the CPU's tokens"
    );
}

#[test]
fn a_gpu_layer_count_that_is_not_one_is_refused() {
    assert_refused(
        "cpu",
        &["--gpu-layers", "most"],
        "neither a layer count nor auto",
    );
}

#[test]
fn activation_bits_are_8_or_16() {
    let cpu = run("cpu");
    // stories260K's f32 weights are dotted in f32 whatever the activation bits.
    assert_eq!(cpu_tokens(&["--activation-bits", "16"]), cpu.stdout);
    assert_refused(
        "cpu",
        &["--activation-bits", "12"],
        "\"12\" activation bits: 8 or 16",
    );
}

#[test]
fn kv_dtype_is_f32_f16_or_auto() {
    let cpu = run("cpu");
    // stories260K keeps its greedy tokens with an f16 cache (see tests/llama_reference.rs).
    for kv in ["f16", "f32", "auto"] {
        assert_eq!(
            cpu_tokens(&["--kv-dtype", kv]),
            cpu.stdout,
            "--kv-dtype {kv}"
        );
    }
    assert_refused(
        "cpu",
        &["--kv-dtype", "bf16"],
        "KV cache dtype \"bf16\": f32, f16 or auto",
    );
}
