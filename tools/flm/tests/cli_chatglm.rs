//! `flm convert` and `flm run` on ChatGLM checkpoints: random weights at the shapes of a
//! small THUDM `config.json` (the real weights are gigabytes; the graphs themselves are
//! checked against chatglm.cpp in `tests/chatglm_reference.rs`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tok512() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/stories260K/tok512.model")
        .display()
        .to_string()
}

fn flm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flm"))
        .args(args)
        .output()
        .expect("flm runs")
}

/// Writes `config` to `dir/config.json` and converts random weights of its shapes to
/// `dir/model.flm` in `dtype`, with the tok512 tokenizer (512 tokens, the configs' vocab).
fn convert_random(dir: &Path, config: serde_json::Value, dtype: &str) -> PathBuf {
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
        &tok512(),
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
