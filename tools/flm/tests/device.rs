//! `--device` from the command line: on a machine without a usable CUDA GPU (or with a
//! build without the `cuda` feature) `auto` generates on the CPU after one line on stderr
//! saying why, the same tokens as `--device cpu`; `--device cuda` fails with that reason.
//! On a machine with a GPU (and the feature) the fallback cases are skipped with a message.

mod common;

use std::path::PathBuf;
use std::process::Output;

fn model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/stories260K/stories260K.bin")
}

fn run(device: &str) -> Output {
    common::flm_command()
        .arg("run")
        .arg("--model")
        .arg(model())
        .args(["--prompt", "Once upon a time", "--max-tokens", "12"])
        .args(["--temperature", "0", "--ids", "--device", device])
        .output()
        .unwrap()
}

const NOTICE: &str = "flm: no CUDA GPU (";

#[test]
fn auto_falls_back_to_the_cpu_with_one_line_and_cuda_fails() {
    let cpu = run("cpu");
    let cpu_err = String::from_utf8_lossy(&cpu.stderr);
    assert!(cpu.status.success(), "{cpu_err}");
    assert!(!cpu_err.contains(NOTICE), "{cpu_err}");
    let auto = run("auto");
    let auto_err = String::from_utf8_lossy(&auto.stderr);
    assert!(auto.status.success(), "{auto_err}");
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
    let cuda = run("cuda");
    let cuda_err = String::from_utf8_lossy(&cuda.stderr);
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
    let out = run("gpu");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cpu, cuda or auto"), "{err}");
}
