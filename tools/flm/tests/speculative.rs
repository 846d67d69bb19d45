//! `flm run --draft-model`: speculative decoding end to end on the shipped stories260K, with
//! an int4 draft written by `flm convert` at test time, and `--draft mtp`'s refusals. Greedy output is llama2.c's
//! (tests/data/stories260K/stories260K_reference.json), the summary line reports the
//! acceptance rate, sampled runs are reproducible, and bad arguments get a clear error.

mod common;

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use common::flm_command;
use flm_tests::data;

fn flm(args: &[&str]) -> Output {
    flm_command().args(args).output().expect("flm runs")
}

fn success(out: &Output) -> (String, String) {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "flm failed: {stderr}");
    (String::from_utf8(out.stdout.clone()).unwrap(), stderr)
}

/// stories260K converted to int4 by `flm convert` in `dir`.
fn int4_draft(dir: &Path) -> String {
    let model = data("stories260K/stories260K.bin");
    let out = dir.join("stories260K-int4.flm");
    let (model, out_str) = (model.display().to_string(), out.display().to_string());
    let args = ["convert", "--input", &model, "--output", &out_str];
    success(&flm(&[&args[..], &["--dtype", "int4"]].concat()));
    out_str
}

#[test]
fn greedy_with_a_draft_prints_llama2c_text_and_the_acceptance_rate() {
    let dir = tempfile::tempdir().unwrap();
    let draft = int4_draft(dir.path());
    let model = data("stories260K/stories260K.bin").display().to_string();
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(data("stories260K/stories260K_reference.json")).unwrap(),
    )
    .unwrap();
    let expected = reference["greedy_from_bos"]["output_text"]
        .as_str()
        .unwrap();
    for k in ["1", "5"] {
        let out = flm(&[
            "run",
            "--model",
            &model,
            "--draft-model",
            &draft,
            "--draft-tokens",
            k,
            "--prompt",
            "",
            "--temperature",
            "0",
            "--max-tokens",
            "200",
        ]);
        let (stdout, stderr) = success(&out);
        assert_eq!(stdout, format!("{expected}\n"), "K = {k}");
        assert!(stderr.contains("generated tokens: 200"), "{stderr}");
        assert!(stderr.contains("draft acceptance: "), "{stderr}");
        assert!(
            stderr.contains(&format!("{k} tokens per round")),
            "{stderr}"
        );
    }
}

#[test]
fn sampled_runs_with_a_draft_are_reproducible() {
    let dir = tempfile::tempdir().unwrap();
    let draft = int4_draft(dir.path());
    let model = data("stories260K/stories260K.bin").display().to_string();
    let args = [
        "run",
        "--model",
        &model,
        "--draft-model",
        &draft,
        "--prompt",
        "Once upon a time",
        "--seed",
        "11",
        "--max-tokens",
        "80",
        "--ids",
    ];
    let (first, stderr) = success(&flm(&args));
    let (second, _) = success(&flm(&args));
    assert_eq!(first, second);
    let ids: Vec<u32> = first
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    assert!(!ids.is_empty() && ids.len() <= 80 && ids.iter().all(|&id| id < 512));
    assert!(stderr.contains("draft acceptance: "), "{stderr}");
}

#[test]
fn bad_draft_arguments_are_refused_clearly() {
    let model = data("stories260K/stories260K.bin").display().to_string();
    let run = |extra: &[&str]| {
        let args = [
            "run",
            "--model",
            &model,
            "--prompt",
            "Hi",
            "--max-tokens",
            "4",
        ];
        flm(&[&args[..], extra].concat())
    };
    let out = run(&["--draft-model", &model, "--draft-tokens", "0"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("at least 1 token"), "{stderr}");
    let missing = data("stories260K/no-such-draft.bin").display().to_string();
    let out = run(&["--draft-model", &missing]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-draft.bin"));
    // --draft-tokens without a draft, or two drafts, are usage errors.
    let out = run(&["--draft-tokens", "3"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["--draft-model", &model, "--draft", "mtp"]);
    assert_eq!(out.status.code(), Some(2));
    // A model without multi-token-prediction layers cannot draft with them.
    let out = run(&["--draft", "mtp"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no multi-token-prediction layers"),
        "{stderr}"
    );
}
