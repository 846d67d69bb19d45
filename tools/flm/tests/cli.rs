//! The `flm` binary end to end on the shipped stories260K, against references from
//! independent implementations (llama2.c `run.c`, HF transformers; tests/data/SOURCES.md),
//! and its behaviour on bad input: a clear message and exit status 1, never a panic.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

use common::flm_command;
use flm_tests::{data, greedy_run_args};

fn flm(args: &[&str]) -> Output {
    flm_command().args(args).output().expect("flm runs")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "flm failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf-8 output")
}

fn reference() -> Value {
    let text = std::fs::read_to_string(data("stories260K/stories260K_reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn id_list(v: &Value) -> String {
    let ids: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.to_string())
        .collect();
    ids.join(" ")
}

/// `flm run` greedy on `model` with `prompt`, for `max_tokens`, plus `extra` arguments.
fn greedy(model: &str, prompt: &str, max_tokens: &str, extra: &[&str]) -> Output {
    let mut args = greedy_run_args(model, prompt, max_tokens);
    args.extend_from_slice(extra);
    flm(&args)
}

fn bin_model() -> String {
    data("stories260K/stories260K.bin").display().to_string()
}

/// llama.cpp's short flags and `--temp` name the same options: the same greedy text, the
/// same bench.
#[test]
fn llama_cpp_short_flags_work() {
    let model = bin_model();
    let prompt = "Once upon a time";
    let long = greedy(&model, prompt, "24", &["--threads", "1", "--context", "64"]);
    let short = flm(&[
        "run", "-m", &model, "-p", prompt, "--temp", "0", "-n", "24", "-t", "1", "-c", "64", "-s",
        "7",
    ]);
    assert_eq!(stdout(&short), stdout(&long));
    let line = bench_json(&["-m", &model, "-d", "4"], "1");
    assert_eq!(line["depth"].as_u64(), Some(4));
    let out = flm(&[
        "bench",
        "-m",
        &model,
        "-p",
        "8",
        "-n",
        "4",
        "-t",
        "1",
        "-r",
        "1",
        "--stream-mib",
        "16",
        "--json",
    ]);
    let line: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let sizes = ["prompt_tokens", "gen_tokens", "threads", "reps"].map(|k| line[k].as_u64());
    assert_eq!(sizes, [Some(8), Some(4), Some(1), Some(1)]);
}

#[test]
fn greedy_from_bos_prints_llama2c_text_byte_for_byte() {
    let out = greedy(&bin_model(), "", "200", &[]);
    let expected = reference()["greedy_from_bos"]["output_text"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(stdout(&out), expected + "\n");
    let summary = String::from_utf8_lossy(&out.stderr);
    for field in [
        "prompt tokens: 1",
        "generated tokens: 200",
        "time to first token",
        "prefill",
        "decode",
    ] {
        assert!(
            summary.contains(field),
            "summary line lacks {field}: {summary}"
        );
    }
}

#[test]
fn greedy_ids_from_prompt_match_transformers_for_both_formats() {
    let case = &reference()["greedy_prompt"];
    let hf = data("hf-stories260K").display().to_string();
    for model in [bin_model(), hf] {
        let out = greedy(&model, "Once upon a time", "32", &["--ids"]);
        assert_eq!(
            stdout(&out).trim_end(),
            id_list(&case["output_ids"]),
            "{model}"
        );
    }
}

#[test]
fn prompt_text_is_not_echoed_and_continuation_matches_reference() {
    let case = &reference()["greedy_prompt"];
    let out = greedy(&bin_model(), "Once upon a time", "32", &[]);
    let full = case["output_text"].as_str().unwrap();
    let continuation = full.strip_prefix("Once upon a time").unwrap();
    assert_eq!(stdout(&out), format!("{continuation}\n"));
}

#[test]
fn tokenize_prints_reference_ids() {
    let case = &reference()["greedy_prompt"];
    let tokenize = |args: &[&str]| {
        stdout(&flm(&[&["tokenize"], args].concat()))
            .trim_end()
            .to_owned()
    };
    assert_eq!(
        tokenize(&["--model", &bin_model(), "--text", "Once upon a time"]),
        id_list(&case["input_ids"])
    );
    let llama2 = data("tokenizer/tokenizer.model").display().to_string();
    let text = "I believe the meaning of life is";
    // llama2.c test.c, without the BOS.
    assert_eq!(
        tokenize(&["--tokenizer", &llama2, "--text", text, "--no-bos"]),
        "306 4658 278 6593 310 2834 338"
    );
    // A GGUF file's tokenizer metadata (llama.cpp's GPT-2 vocabulary, whose
    // `add_bos_token` is false: no BOS); the ids are GPT-2's (gpt2_cases.json, case 46).
    let gguf = data("gguf/ggml-vocab-gpt-2.gguf").display().to_string();
    assert_eq!(
        tokenize(&["--tokenizer", &gguf, "--text", "Hello<|endoftext|> world"]),
        "15496 50256 995"
    );
}

#[test]
fn a_seed_makes_sampling_reproducible() {
    let run = |seed: &str| {
        stdout(&flm(&[
            "run",
            "--model",
            &bin_model(),
            "--prompt",
            "Once upon a time",
            "--temperature",
            "1.0",
            "--top-k",
            "0",
            "--top-p",
            "0.9",
            "--seed",
            seed,
            "--max-tokens",
            "40",
        ]))
    };
    assert_eq!(run("7"), run("7"));
}

/// Runs flm expecting failure with a message that contains `needle`.
fn expect_error(args: &[&str], needle: &str) {
    let out = flm(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert!(
        err.lines().any(|l| l.starts_with("error: ")),
        "{args:?}: {err}"
    );
    assert!(
        err.contains(needle),
        "{args:?}: expected {needle:?} in {err}"
    );
}

fn run_args<'a>(model: &'a str, tokenizer: Option<&'a str>) -> Vec<&'a str> {
    let mut args = vec![
        "run",
        "--model",
        model,
        "--prompt",
        "Hi",
        "--max-tokens",
        "4",
    ];
    if let Some(t) = tokenizer {
        args.extend(["--tokenizer", t]);
    }
    args
}

#[test]
fn truncated_and_corrupted_checkpoints_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(data("stories260K/stories260K.bin")).unwrap();
    let tok = data("stories260K/tok512.bin").display().to_string();

    let truncated = dir.path().join("truncated.bin");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    expect_error(
        &run_args(truncated.to_str().unwrap(), Some(&tok)),
        "truncated",
    );

    let mut corrupted = bytes.clone();
    corrupted[12..16].copy_from_slice(&3i32.to_le_bytes()); // n_heads = 3 does not divide 64
    let path = dir.path().join("corrupted.bin");
    std::fs::write(&path, &corrupted).unwrap();
    expect_error(
        &run_args(path.to_str().unwrap(), Some(&tok)),
        "nor a valid legacy llama2.c checkpoint",
    );

    // A 28-byte header claiming 2^24 layers is refused before anything is allocated.
    let mut header = bytes[..28].to_vec();
    header[8..12].copy_from_slice(&(1i32 << 24).to_le_bytes());
    let huge = dir.path().join("huge.bin");
    std::fs::write(&huge, &header).unwrap();
    expect_error(
        &run_args(huge.to_str().unwrap(), Some(&tok)),
        "exceeds 65536",
    );

    let tiny = dir.path().join("tiny.bin");
    std::fs::write(&tiny, b"abc").unwrap();
    expect_error(&run_args(tiny.to_str().unwrap(), Some(&tok)), "too short");

    let missing = dir.path().join("missing.bin");
    expect_error(
        &run_args(missing.to_str().unwrap(), Some(&tok)),
        "missing.bin",
    );

    // A safetensors file cut in the middle of its data.
    let hf = copy_hf_dir(dir.path());
    let st = hf.join("model.safetensors");
    let weights = std::fs::read(&st).unwrap();
    std::fs::write(&st, &weights[..weights.len() - 1000]).unwrap();
    expect_error(&run_args(hf.to_str().unwrap(), None), "invalid safetensors");
}

fn copy_hf_dir(to: &Path) -> PathBuf {
    let dst = to.join("hf");
    std::fs::create_dir_all(&dst).unwrap();
    for entry in std::fs::read_dir(data("hf-stories260K")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
    }
    dst
}

#[test]
fn config_with_a_missing_field_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let hf = copy_hf_dir(dir.path());
    let config = hf.join("config.json");
    let mut json: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    json.as_object_mut().unwrap().remove("hidden_size");
    std::fs::write(&config, json.to_string()).unwrap();
    expect_error(
        &run_args(hf.to_str().unwrap(), None),
        "missing field `hidden_size`",
    );

    for (field, value, needle) in [
        (
            "num_hidden_layers",
            1_000_000_000u64,
            "n_layers = 1000000000 exceeds",
        ),
        ("max_position_embeddings", 1 << 40, "exceeds 16777216"),
    ] {
        let mut bad = json.clone();
        bad["hidden_size"] = 64.into();
        bad[field] = value.into();
        std::fs::write(&config, bad.to_string()).unwrap();
        expect_error(&run_args(hf.to_str().unwrap(), None), needle);
    }

    std::fs::write(&config, "{ not json").unwrap();
    expect_error(&run_args(hf.to_str().unwrap(), None), "invalid config.json");
}

#[test]
fn a_file_that_is_not_a_tokenizer_is_rejected() {
    let not_tokenizer = data("hf-stories260K/config.json").display().to_string();
    expect_error(&run_args(&bin_model(), Some(&not_tokenizer)), "tokenizer");
    let weights = data("stories260K/stories260K.bin").display().to_string();
    expect_error(
        &["tokenize", "--tokenizer", &weights, "--text", "hi"],
        "cannot load the tokenizer",
    );
    // A tokenizer with more tokens than the model's vocabulary.
    let llama2 = data("tokenizer/tokenizer.model").display().to_string();
    expect_error(
        &run_args(&bin_model(), Some(&llama2)),
        "do not belong together",
    );
}

/// A missing file is named with its OS error once (the error prints it after the path and
/// also gives it as its cause).
#[test]
fn a_missing_file_names_its_os_error_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf").display().to_string();
    for args in [
        run_args(&missing, None),
        vec!["perplexity", "--model", &missing, "--file", &missing],
    ] {
        let out = flm(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(&missing), "{args:?}: {err}");
        let os_error = "(os error 2)";
        assert_eq!(err.matches(os_error).count(), 1, "{args:?}: {err}");
    }
}

#[test]
fn a_prompt_longer_than_the_context_is_rejected() {
    let prompt = "Once upon a time there was a cat. ".repeat(100);
    expect_error(
        &["run", "--model", &bin_model(), "--prompt", &prompt],
        "context holds 512 tokens",
    );
}

#[test]
fn invalid_sampling_parameters_are_rejected() {
    let model = bin_model();
    for (flag, needle) in [
        ("--top-p=1.5", "top-p"),
        ("--temperature=-1", "temperature"),
    ] {
        expect_error(&["run", "--model", &model, "--prompt", "Hi", flag], needle);
    }
    // A negative number is a value, not an option; and the values are checked before the
    // model loads (the model here does not exist).
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.bin").display().to_string();
    for (command, flag, value, needle) in [
        ("run", "--temperature", "-1", "temperature must be"),
        ("chat", "--top-p", "-0.5", "top-p must be"),
        (
            "run",
            "--repeat-penalty",
            "-1",
            "repetition penalty must be",
        ),
    ] {
        let mut args = vec![command, "--model", &missing, flag, value];
        if command == "run" {
            args.extend(["--prompt", "Hi"]);
        }
        expect_error(&args, needle);
    }
}

#[test]
fn flm_profile_prints_the_per_op_table_at_exit() {
    let out = flm_command()
        .args([
            "run",
            "--model",
            &bin_model(),
            "--prompt",
            "Hi",
            "--temperature",
            "0",
            "--max-tokens",
            "3",
        ])
        .env("FLM_PROFILE", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("flm profile"), "{err}");
    // For the prefill and 2 decode steps, per layer (5) the output and down projections
    // (plus the classifier) as Linear, Q/K/V and gate/up as Linears.
    let calls = |kind: &str| {
        let row = err
            .lines()
            .find(|l| l.split_whitespace().next() == Some(kind))
            .unwrap_or_else(|| panic!("no {kind} row: {err}"));
        row.split_whitespace().nth(1).map(str::to_string)
    };
    assert_eq!(calls("Linear").as_deref(), Some("33"), "{err}");
    assert_eq!(calls("Linears").as_deref(), Some("30"), "{err}");
    // Per weight: the classifier `[vocab 512, dim 64]` multiplies one row at each step,
    // the last prompt token's and the 2 decoded ones.
    let classifier = err
        .lines()
        .find(|l| l.ends_with("  f32 512x64"))
        .unwrap_or_else(|| panic!("no classifier row: {err}"));
    let fields: Vec<_> = classifier.split_whitespace().collect();
    assert_eq!(fields[..3], ["Linear", "matvec", "3"], "{err}");
}

/// `flm convert` with `args`; returns the output path.
fn convert(dir: &Path, input: &str, name: &str, args: &[&str]) -> String {
    let out = dir.join(name).display().to_string();
    let mut all = vec!["convert", "--input", input, "--output", &out];
    all.extend_from_slice(args);
    let result = flm(&all);
    assert!(
        result.status.success(),
        "{all:?}: {}",
        String::from_utf8_lossy(&result.stderr)
    );
    out
}

#[test]
fn converted_files_run_with_their_embedded_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let case = &reference()["greedy_prompt"];
    let hf = data("hf-stories260K").display().to_string();
    let f32 = convert(dir.path(), &hf, "f32.flm", &["--dtype", "f32"]);
    let out = greedy(&f32, "Once upon a time", "32", &["--ids"]);
    assert_eq!(stdout(&out).trim_end(), id_list(&case["output_ids"]));
    // A .flm file converts again (here to int8), and runs.
    let int8 = convert(dir.path(), &f32, "int8.flm", &["--dtype", "int8"]);
    assert!(std::fs::metadata(&int8).unwrap().len() < std::fs::metadata(&f32).unwrap().len());
    let text = stdout(&greedy(&int8, "Once upon a time", "16", &[]));
    assert!(!text.trim().is_empty());
    let out = flm(&["tokenize", "--model", &int8, "--text", "Once upon a time"]);
    assert_eq!(stdout(&out).trim_end(), id_list(&case["input_ids"]));
}

#[test]
fn gguf_and_pytorch_checkpoints_convert_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let case = &reference()["greedy_prompt"];
    for (input, name) in [
        (data("gguf/stories260K-f32.gguf"), "from-gguf.flm"),
        (data("pytorch/stories260K"), "from-pytorch.flm"),
    ] {
        let input = input.display().to_string();
        let out = greedy(&input, "Once upon a time", "32", &["--ids"]);
        assert_eq!(
            stdout(&out).trim_end(),
            id_list(&case["output_ids"]),
            "{input}"
        );
        let flm_file = convert(dir.path(), &input, name, &["--dtype", "f32"]);
        let out = greedy(&flm_file, "Once upon a time", "32", &["--ids"]);
        assert_eq!(
            stdout(&out).trim_end(),
            id_list(&case["output_ids"]),
            "{name}"
        );
    }
    let q8 = data("gguf/stories260K-q8_0.gguf").display().to_string();
    let flm_file = convert(
        dir.path(),
        &q8,
        "q8.flm",
        &["--dtype", "int4", "--group-size", "64"],
    );
    assert!(!stdout(&greedy(&flm_file, "Once", "8", &[]))
        .trim()
        .is_empty());
}

/// The figure after `key` in `text` (`PPL = 4.8152`, `Same top p : 100.000`).
fn figure(text: &str, key: &str) -> f64 {
    text.split(key)
        .nth(1)
        .and_then(|rest| {
            rest.trim_start_matches([' ', ':', '='])
                .split_whitespace()
                .next()
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key:?} in {text}"))
}

/// llama.cpp's method through the CLI gives llama-perplexity's figure on the same GGUF and
/// text, and a log-probability file that starts as llama-perplexity's does and that
/// `--kl-divergence` reads back; the sliding window names itself.
#[test]
fn perplexity_and_kl_divergence_as_llama_perplexity_prints_them() {
    let text = data("text/tinystories_style.txt").display().to_string();
    let gguf = data("gguf/stories260K-f32.gguf").display().to_string();
    let want: Value = serde_json::from_str(
        &std::fs::read_to_string(data("llama.cpp/perplexity/expected.json")).unwrap(),
    )
    .unwrap();
    let base = [
        "perplexity",
        "--model",
        &gguf,
        "--file",
        &text,
        "--ctx",
        "128",
    ];
    let line = stdout(&flm(&base));
    assert!(
        line.starts_with("perplexity (llama.cpp's method: chunks of 128 tokens"),
        "{line}"
    );
    // Equal in the digits both print, give or take the last one's rounding.
    let f32_run = &want["ppl_f32_c128"];
    let ppl = figure(&line, "PPL") - f32_run["ppl"].as_f64().unwrap();
    let error = figure(&line, "+/-") - f32_run["error"].as_f64().unwrap();
    assert!(ppl.abs() <= 1.5e-4 && error.abs() <= 1.5e-5, "{line}");

    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("base.kld").display().to_string();
    let mut args = base.to_vec();
    args.extend(["--chunks", "8", "--save-logits", &saved]);
    stdout(&flm(&args));
    let ours = std::fs::read(&saved).unwrap();
    let theirs = std::fs::read(data("llama.cpp/perplexity/stories260K-f32-c128.kld")).unwrap();
    assert_eq!(ours.len(), theirs.len());
    assert_eq!(ours[..20 + 8 * 128 * 4], theirs[..20 + 8 * 128 * 4]);
    let kld = stdout(&flm(&[
        "perplexity",
        "--model",
        &gguf,
        "--kl-divergence",
        &saved,
    ]));
    // Only the file's 16-bit rounding of the log-probabilities.
    assert!(figure(&kld, "Mean    KLD") < 1e-5, "{kld}");
    assert_eq!(figure(&kld, "Same top p"), 100.0, "{kld}");

    let mut args = base.to_vec();
    args.extend(["--method", "sliding", "--stride", "64"]);
    let line = stdout(&flm(&args));
    assert!(
        line.starts_with("perplexity (sliding windows of 128 tokens every 64, BOS first)"),
        "{line}"
    );
    assert!(
        figure(&line, "PPL") > 1.0 && figure(&line, "PPL") < 20.0,
        "{line}"
    );
}

#[test]
fn bad_perplexity_requests_are_refused() {
    let text = data("text/tinystories_style.txt").display().to_string();
    let gguf = data("gguf/stories260K-f32.gguf").display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.kld");
    std::fs::write(&junk, b"_logits_ not really").unwrap();
    let junk = junk.display().to_string();
    // A well-formed file over 3 tokens: 2 chunks of 4, one scored row of 8 u16 each.
    let wrong_vocab = dir.path().join("vocab.kld");
    let mut bytes = b"_logits_".to_vec();
    for v in [4i32, 3, 2, 0, 1, 2, 0, 1, 2, 0, 1] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes.extend_from_slice(&[0; 32]);
    std::fs::write(&wrong_vocab, &bytes).unwrap();
    let wrong_vocab = wrong_vocab.display().to_string();
    let saved = dir.path().join("never.kld").display().to_string();
    let base = [
        "perplexity",
        "--model",
        gguf.as_str(),
        "--file",
        text.as_str(),
    ];
    for (extra, needle) in [
        (vec!["--stride", "8"], "--stride is for --method sliding"),
        (vec!["--ctx", "4000"], "needs at least 8000 (two windows)"),
        (
            vec!["--method", "sliding", "--stride", "0"],
            "the stride must be 1 to",
        ),
        (
            vec!["--method", "sliding", "--save-logits", &saved],
            "are for --method llama-cpp",
        ),
        (vec!["--ctx", "2"], "at least 4 tokens"),
    ] {
        let mut args = base.to_vec();
        args.extend(extra);
        expect_error(&args, needle);
    }
    assert!(!Path::new(&saved).exists());
    expect_error(
        &["perplexity", "--model", &gguf, "--kl-divergence", &junk],
        "too short",
    );
    expect_error(
        &[
            "perplexity",
            "--model",
            &gguf,
            "--kl-divergence",
            &wrong_vocab,
        ],
        "holds log-probabilities over 3 tokens and the model has 512",
    );
}

#[test]
fn bad_conversions_are_refused_and_leave_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.flm").display().to_string();
    let model = bin_model();
    for (extra, needle) in [
        (
            vec!["--dtype", "int4", "--group-size", "48"],
            "--group-size must be 32, 64 or 128",
        ),
        (
            vec!["--dtype", "int8", "--group-size", "32"],
            "applies to --dtype int4, int4-sym and int4-zp only",
        ),
    ] {
        let mut args = vec!["convert", "--input", &model, "--output", &out];
        args.extend(extra);
        expect_error(&args, needle);
    }
    let missing_dir = dir.path().join("no/such/dir/x.flm").display().to_string();
    expect_error(
        &[
            "convert",
            "--input",
            &model,
            "--output",
            &missing_dir,
            "--dtype",
            "f16",
        ],
        "no/such/dir",
    );
    let config = data("hf-stories260K/config.json").display().to_string();
    expect_error(
        &[
            "convert", "--random", "--input", &config, "--output", &out, "--dtype", "int8",
        ],
        "pass --tokenizer",
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing written"
    );
}

/// Bytes of one quantised or float row of `cols` values, from docs/flm-format.md.
fn row_bytes(dtype: &str, cols: usize) -> usize {
    let pad = |n: usize| cols.div_ceil(n) * n;
    match dtype {
        "f32" => 4 * cols,
        "int8" => 4 + pad(32),
        "int4-g32" => pad(32) / 32 * 20,
        "int4-sym-g32" => pad(32) / 32 * 18,
        "int4-zp-g32" => pad(32) / 32 * 20,
        other => panic!("no size for {other}"),
    }
}

/// `flm bench` of `source` (the model and its options) for 8 prompt tokens and 4 generated,
/// `reps` times on one thread, as its JSON line.
fn bench_json(source: &[&str], reps: &str) -> Value {
    let mut args = vec!["bench"];
    args.extend(source);
    args.extend([
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "4",
        "--reps",
        reps,
        "--threads",
        "1",
        "--stream-mib",
        "16",
        "--json",
    ]);
    let out = flm(&args);
    serde_json::from_str(stdout(&out).trim()).unwrap()
}

/// A file's weights are labelled by what it holds: stories260K's Q4_0 GGUF keeps its small
/// matrices in f16 (gguf-py: 31 Q4_0 matrices, 5 F16 ones; the embedding is most of f16's
/// share), and flm runs the Q4_0 ones as int4-sym-g32.
#[test]
fn bench_labels_a_file_by_the_weights_it_holds() {
    let model = data("gguf/stories260K-q4_0.gguf");
    let line = bench_json(&["--model", model.to_str().unwrap()], "1");
    let label = line["dtype"].as_str().unwrap();
    let parts: Vec<&str> = label.split(", ").collect();
    assert_eq!(parts.len(), 2, "{label}");
    assert!(
        parts.iter().any(|p| p.starts_with("int4-sym-g32 (Q4_0) ")),
        "{label}"
    );
    assert!(parts.iter().any(|p| p.starts_with("f16 ")), "{label}");
}

#[test]
fn bench_reports_json_for_random_weights() {
    let config = data("hf-stories260K/config.json");
    // stories260K: dim 64, hidden 172, 5 layers, 8 heads of 8, 4 KV heads, vocab 512, tied.
    let (dim, hidden, layers, kv_dim, vocab) = (64, 172, 5, 32, 512);
    // Context already in the KV cache when the tests start (0: an empty one).
    for (dtype, depth) in [
        ("f32", "0"),
        ("int8", "5"),
        ("int4", "0"),
        ("int4-sym", "300"),
        ("int4-zp", "0"),
    ] {
        let config = config.to_str().unwrap();
        let source = ["--depth", depth, "--random", config, "--dtype", dtype];
        let line = bench_json(&source, "2");
        let stored = line["dtype"].as_str().unwrap();
        let named = match dtype {
            "int4" => "int4-g32",
            "int4-sym" => "int4-sym-g32",
            "int4-zp" => "int4-zp-g32",
            d => d,
        };
        assert_eq!(stored, named);
        for key in [
            "prefill_tok_s",
            "decode_tok_s",
            "decode_gb_s",
            "stream_gb_s",
            "prefill_tok_s_sd",
            "decode_tok_s_sd",
        ] {
            let v = line[key].as_f64().unwrap();
            assert!(v.is_finite() && v >= 0.0, "{key} = {v}");
        }
        assert!(line["decode_tok_s"].as_f64().unwrap() > 0.0);
        // The machine: the CPU's name as Linux gives it, its CPUs and the kernels' level.
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        {
            let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
            let name = line["cpu_model"].as_str().unwrap();
            assert!(cpuinfo.contains(&format!(": {name}\n")), "{name}");
        }
        assert!(line["cpus"].as_u64().unwrap() >= 1);
        assert!(!line["isa"].as_str().unwrap().is_empty());
        assert_eq!(line["threads"], 1);
        assert_eq!(line["prompt_tokens"], 8);
        assert_eq!(line["gen_tokens"], 4);
        assert_eq!(line["depth"], depth.parse::<u64>().unwrap());
        // Per layer: two f32 norms and the seven matrices; then the final norm, the tied
        // embedding as classifier and one embedding row.
        let m = |rows: usize, cols: usize| rows * row_bytes(stored, cols);
        let layer = 2 * 4 * dim
            + m(dim, dim)
            + 2 * m(kv_dim, dim)
            + m(dim, dim)
            + 2 * m(hidden, dim)
            + m(dim, hidden);
        let want = layers * layer + 4 * dim + m(vocab, dim) + m(1, dim);
        assert_eq!(line["weight_bytes_per_token"], want, "{dtype}");
        let gb = want as f64 * line["decode_tok_s"].as_f64().unwrap() / 1e9;
        assert!((line["decode_gb_s"].as_f64().unwrap() - gb).abs() <= 1e-9 * gb.max(1.0));
    }
}

#[test]
fn bench_measures_each_batch_size_of_a_list() {
    let config = data("hf-stories260K/config.json");
    let config = config.to_str().unwrap();
    let out = flm(&[
        "bench",
        "--random",
        config,
        "--dtype",
        "int8",
        "--batch",
        "1,3",
        "--prompt-tokens",
        "4",
        "--gen-tokens",
        "2",
        "--reps",
        "1",
        "--threads",
        "1",
        "--stream-mib",
        "1",
        "--json",
    ]);
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let batches: Vec<u64> = lines.iter().map(|l| l["batch"].as_u64().unwrap()).collect();
    assert_eq!(batches, [1, 3]);
    for line in &lines {
        assert!(line["decode_tok_s"].as_f64().unwrap() > 0.0, "{line}");
    }
    let zero = [
        "bench", "--random", config, "--dtype", "int8", "--batch", "2,0",
    ];
    expect_error(&zero, "--batch must be at least 1");
}

#[test]
fn bench_rejects_bad_requests() {
    let config = data("hf-stories260K/config.json");
    let config = config.to_str().unwrap();
    // Usage errors come from the argument parser (exit status 2, no panic).
    for (args, needle) in [
        (vec!["bench", "--random", config], "--dtype"),
        (vec!["bench", "--dtype", "int8"], "--model"),
        (
            vec![
                "bench", "--random", config, "--dtype", "int8", "--batch", "2", "--depth", "4",
            ],
            "--depth",
        ),
        (
            vec!["bench", "--random", config, "--dtype", "int5"],
            "invalid value 'int5' for '--dtype <DTYPE>'",
        ),
    ] {
        let out = flm(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.starts_with("error: ") && err.contains(needle), "{err}");
    }
    for (extra, needle) in [
        (
            ["--prompt-tokens", "600"],
            "exceeds the model's context of 512",
        ),
        (["--gen-tokens", "0"], "--gen-tokens must be at least 1"),
        (["--depth", "400"], "exceeds the model's context of 512"),
    ] {
        let mut args = vec!["bench", "--random", config];
        if extra[0] != "--dtype" {
            args.extend(["--dtype", "int8"]);
        }
        args.extend(extra);
        expect_error(&args, needle);
    }
}

/// `flm imatrix` writes llama.cpp's GGUF form by default and its legacy form for a `.dat`
/// name, both holding the matrix of every layer's Linear weights over the chunks of the
/// text; a text shorter than two chunks is refused with a message.
#[test]
fn imatrix_writes_both_of_llama_cpps_forms() {
    use flm_models::imatrix::ImportanceMatrix;
    let text = data("text/tinystories_style.txt").display().to_string();
    let gguf = data("gguf/stories260K-f32.gguf").display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let mut read = Vec::new();
    for name in ["m.gguf", "m.dat"] {
        let out = dir.path().join(name).display().to_string();
        let line = stdout(&flm(&[
            "imatrix", "--model", &gguf, "--file", &text, "--ctx", "128", "-o", &out,
        ]));
        assert!(line.starts_with("35 entries over 33 chunks"), "{line}");
        read.push(ImportanceMatrix::read(Path::new(&out)).unwrap());
    }
    assert!(std::fs::read(dir.path().join("m.gguf"))
        .unwrap()
        .starts_with(b"GGUF"));
    let (g, d) = (&read[0], &read[1]);
    assert_eq!(
        g.entries.keys().collect::<Vec<_>>(),
        d.entries.keys().collect::<Vec<_>>()
    );
    assert_eq!(
        (d.chunk_count, d.datasets.clone()),
        (33, vec![text.clone()])
    );
    let short = dir.path().join("short.txt");
    std::fs::write(&short, "Once upon a time").unwrap();
    let out = flm(&[
        "imatrix",
        "--model",
        &gguf,
        "--file",
        &short.display().to_string(),
        "-o",
        &dir.path().join("x.gguf").display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs at least"), "{err}");
    assert!(!dir.path().join("x.gguf").exists());
}

/// `flm convert --imatrix` rounds the matrices the importance matrix names (llama.cpp's,
/// in either form) and says how many; it needs a quantised `--dtype`, and a missing matrix
/// file is an error that writes nothing.
#[test]
fn convert_takes_an_importance_matrix() {
    let gguf = data("gguf/stories260K-f32.gguf").display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.flm").display().to_string();
    for (form, dtype) in [("gguf", "q4_k"), ("dat", "int4-sym")] {
        let matrix = data(&format!("llama.cpp/imatrix/stories260K.imatrix.{form}"))
            .display()
            .to_string();
        let args = [
            "convert",
            "--input",
            &gguf,
            "--output",
            &out,
            "--dtype",
            dtype,
            "--imatrix",
            &matrix,
        ];
        let run = flm(&args);
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(
            err.contains("matrices rounded with their importance (35 entries"),
            "{err}"
        );
    }
    let missing = dir.path().join("none.gguf").display().to_string();
    let other = dir.path().join("other.flm");
    let other_s = other.display().to_string();
    let usage = [
        "convert",
        "--input",
        &gguf,
        "--output",
        &other_s,
        "--imatrix",
        &missing,
    ];
    // clap's status for a usage error.
    assert_eq!(flm(&usage).status.code(), Some(2));
    let mut unreadable = usage.to_vec();
    unreadable.extend(["--dtype", "int4"]);
    let run = flm(&unreadable);
    assert_eq!(run.status.code(), Some(1));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("cannot read the importance matrix"), "{err}");
    assert!(!other.exists());
}

/// `--tp` splits the model among ranks of the process: the same greedy text as one rank;
/// a split that does not divide, or none, is a clear error.
#[test]
fn tensor_parallel_ranks_give_the_same_text() {
    let model = bin_model();
    let whole = greedy(&model, "Once upon a time", "60", &[]);
    for tp in ["2", "4"] {
        let split = greedy(
            &model,
            "Once upon a time",
            "60",
            &["--tp", tp, "--threads", "2"],
        );
        assert!(
            split.status.success(),
            "{}",
            String::from_utf8_lossy(&split.stderr)
        );
        assert_eq!(stdout(&split), stdout(&whole), "--tp {tp}");
    }
    let mut args = greedy_run_args(&model, "Once", "4");
    args.extend(["--tp", "3"]);
    expect_error(&args, "the attention heads (8) does not divide among 3");
    let mut args = greedy_run_args(&model, "Once", "4");
    args.extend(["--tp", "0"]);
    expect_error(&args, "--tp must be at least 1");
}
