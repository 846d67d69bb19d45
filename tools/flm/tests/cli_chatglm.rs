//! `flm convert` and `flm run` on ChatGLM checkpoints: random weights at the shapes of a
//! small THUDM `config.json` (the real weights are gigabytes; the graphs themselves are
//! checked against chatglm.cpp in `tests/chatglm_reference.rs`).

mod common;
#[path = "common/piped.rs"]
mod piped;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::flm_command;
use flm_tests::data;

fn tok512() -> String {
    data("stories260K/tok512.model").display().to_string()
}

fn flm(args: &[&str]) -> Output {
    flm_command().args(args).output().expect("flm runs")
}

/// Writes `config` to `dir/config.json` and converts random weights of its shapes to
/// `dir/model.flm` in `dtype`, with the tok512 tokenizer (512 tokens, the configs' vocab).
fn convert_random(dir: &Path, config: serde_json::Value, dtype: &str) -> PathBuf {
    convert_random_with(dir, config, dtype, &tok512())
}

/// As [`convert_random`], with the tokenizer file `tokenizer`.
fn convert_random_with(
    dir: &Path,
    config: serde_json::Value,
    dtype: &str,
    tokenizer: &str,
) -> PathBuf {
    let config_path = dir.join("config.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let out = dir.join("model.flm");
    let status = flm(&[
        "convert",
        "--random",
        "--input",
        config_path.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--dtype",
        dtype,
        "--tokenizer",
        tokenizer,
    ]);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    out
}

fn run_ids(model: &Path) -> Output {
    flm(&[
        "run",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "Once upon a time",
        "--temperature",
        "0",
        "--max-tokens",
        "5",
        "--ignore-eos",
        "--ids",
    ])
}

#[test]
fn chatglm2_converts_in_every_dtype_and_generates() {
    let config = serde_json::json!({
        "model_type": "chatglm", "hidden_size": 64, "num_layers": 2,
        "num_attention_heads": 4, "kv_channels": 16, "ffn_hidden_size": 96,
        "padded_vocab_size": 512, "seq_length": 64, "layernorm_epsilon": 1e-5,
        "rmsnorm": true, "multi_query_attention": true, "multi_query_group_num": 2,
        "add_qkv_bias": true, "add_bias_linear": false, "eos_token_id": 2,
    });
    for dtype in ["f32", "f16", "bf16", "int8", "int4"] {
        let dir = tempfile::tempdir().unwrap();
        let model = convert_random(dir.path(), config.clone(), dtype);
        let out = run_ids(&model);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ids: Vec<u32> = String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(ids.len(), 5, "{dtype}");
        assert!(ids.iter().all(|&id| id < 512), "{dtype}: {ids:?}");
    }
}

/// ChatGLM-6B converts; a prompt without its `[gMASK]` and `sop` tokens (which the chat
/// prompt builder adds) is refused with a message, not a panic.
#[test]
fn chatglm_6b_converts_and_asks_for_its_prompt_marks() {
    let config = serde_json::json!({
        "model_type": "chatglm", "hidden_size": 64, "num_layers": 2,
        "num_attention_heads": 4, "inner_hidden_size": 256, "vocab_size": 512,
        "max_sequence_length": 64, "position_encoding_2d": true, "layernorm_epsilon": 1e-5,
        "bos_token_id": 500, "eos_token_id": 501, "mask_token_id": 502, "gmask_token_id": 503,
    });
    let dir = tempfile::tempdir().unwrap();
    let model = convert_random(dir.path(), config, "int8");
    let out = run_ids(&model);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("[gMASK]"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `flm chat` on ChatGLM-6B. Its context is bidirectional and must be run in one pass, so
/// the session never continues the previous turn's KV cache (every turn restarts at
/// position 0) and each reply equals a fresh `flm run` on the same prompt.
#[test]
fn chatglm_6b_chat_restarts_every_turn_and_matches_fresh_runs() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = dir.path().join("tok512.model");
    std::fs::copy(tok512(), &tokenizer).unwrap();
    // Every prompt ends in "Once upon a time", tok512 ids 403 407 261 378: the config takes
    // 407 as [gMASK] and 261 as sop.
    let template =
        "{{ bos_token }}{% for m in messages %}{{ m.content }} {% endfor %}Once upon a time";
    let hf_config = serde_json::json!({ "chat_template": template });
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        hf_config.to_string(),
    )
    .unwrap();
    let config = serde_json::json!({
        "model_type": "chatglm", "hidden_size": 64, "num_layers": 2,
        "num_attention_heads": 4, "inner_hidden_size": 256, "vocab_size": 512,
        "max_sequence_length": 128, "position_encoding_2d": true, "layernorm_epsilon": 1e-5,
        "bos_token_id": 261, "eos_token_id": 501, "mask_token_id": 502, "gmask_token_id": 407,
    });
    let model = convert_random_with(dir.path(), config, "f32", tokenizer.to_str().unwrap());
    let model = model.to_str().unwrap();
    let sampling = ["--temperature", "0", "--max-tokens", "6", "--ignore-eos"];
    let args = [&["chat", "--model", model, "--verbose"][..], &sampling].concat();
    let out = piped::run(&args, "Hello\nBye\n");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    let summaries: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("prompt tokens: "))
        .collect();
    assert_eq!(summaries.len(), 2, "{stderr}");
    assert!(summaries.iter().all(|l| !l.contains("reused")), "{stderr}");
    // Each reply (a line of stdout) is what `flm run` gives for the prompt --verbose printed.
    let prompts: Vec<&str> = stderr
        .split("--- prompt (")
        .skip(1)
        .map(|p| {
            p.split_once(")\n")
                .unwrap()
                .1
                .split_once("\n---\n")
                .unwrap()
                .0
        })
        .collect();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let replies: Vec<&str> = stdout.lines().collect();
    assert_eq!((prompts.len(), replies.len()), (2, 2), "{stdout}\n{stderr}");
    for (prompt, reply) in prompts.iter().zip(&replies) {
        let run = flm_command()
            .args(["run", "--model", model, "--prompt", &prompt["<s>".len()..]])
            .args(sampling)
            .output()
            .unwrap();
        let run_stderr = String::from_utf8_lossy(&run.stderr);
        assert!(run.status.success(), "{run_stderr}");
        let text = String::from_utf8(run.stdout).unwrap();
        assert_eq!(text.trim_start().trim_end_matches('\n'), reply.trim_start());
    }
}
