//! Fuzz targets for every parser of outside bytes, run by the stable harness of
//! `flm_tests::fuzz` for `FLM_FUZZ_SECONDS` each: the model files (.flm, GGUF,
//! safetensors, PyTorch pickle, llama2.c .bin) through the loader a host calls
//! (`load_model`), the tokenizer files (SentencePiece protobuf, tokenizer.json, tiktoken,
//! llama2.c tokenizer.bin) and chat templates. The HTTP request bodies of `flm serve` are
//! fuzzed by the unit tests of the `flm` binary, where its request types live.
//!
//! Each target's property: no panic, and a loaded model or tokenizer that works (a forward
//! pass of one token, an encode/decode round).

use std::path::Path;

use flm_core::DataType;
use flm_models::convert::Recipe;
use flm_models::llama::{Llama, LlamaWeights, Logits};
use flm_models::session::load_model;
use flm_models::{import, Graph, ModelConfig};
use flm_tests::fuzz::{corpus, fuzz};
use flm_tests::{convert_stories260k, cpu_executor, data};
use flm_tokenizer::{Message, Tokenizer};

/// Where failing inputs are written.
fn findings() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// The committed corpus of `target` with the files of `tests/data` named.
fn seeds(target: &str, files: &[&str]) -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(data(f)).unwrap())
        .collect();
    seeds.extend(corpus(target));
    seeds
}

/// Loads the model at `path` as a host does, with a context of 8 positions, and runs one
/// token through it: errors are fine, panics are not.
fn load_and_step(path: &Path) {
    let Ok((model, tokenizer)) = load_model(path, None, Some(8)) else {
        return;
    };
    let Ok(mut instance) = model.instance() else {
        return;
    };
    let prompt = tokenizer.encode("Once", true).unwrap_or_default();
    if !prompt.is_empty() {
        let _ = instance.forward(&cpu_executor(), &prompt, 0, Logits::Last);
    }
}

/// A model target: each input is written as `file` in a directory that holds `beside`
/// (files of `tests/data`), and the path `load` names is loaded.
fn model_target(name: &str, seeds: &[Vec<u8>], file: &str, beside: &[&str], load: &str) {
    let dir = tempfile::tempdir().unwrap();
    for b in beside {
        let from = data(b);
        std::fs::copy(&from, dir.path().join(from.file_name().unwrap())).unwrap();
    }
    let (file, load) = (dir.path().join(file), dir.path().join(load));
    fuzz(name, seeds, findings(), |input| {
        std::fs::write(&file, input).unwrap();
        load_and_step(&load);
    });
}

#[test]
fn flm_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seed.flm");
    convert_stories260k(&path, DataType::I4SymG32, Recipe::Mixed);
    let mut seeds = vec![std::fs::read(&path).unwrap()];
    seeds.extend(corpus("flm"));
    model_target("flm", &seeds, "model.flm", &[], "model.flm");
}

#[test]
fn gguf_files() {
    let seeds = seeds("gguf", &["gguf/stories260K-q4_0.gguf"]);
    model_target("gguf", &seeds, "model.gguf", &[], "model.gguf");
}

/// [`model_target`] for the checkpoint `file` of a Hugging Face directory, beside the
/// `config.json` and `tokenizer.model` of `dir` (below `tests/data`), the directory loaded;
/// its seeds are `seed_files` and the corpus of `name`.
fn hf_dir_target(name: &str, seed_files: &[&str], file: &str, dir: &str) {
    let beside = ["config.json", "tokenizer.model"].map(|f| format!("{dir}/{f}"));
    let beside = beside.each_ref().map(String::as_str);
    model_target(name, &seeds(name, seed_files), file, &beside, "");
}

#[test]
fn safetensors_files() {
    let files = ["hf-stories260K/model.safetensors"];
    hf_dir_target("safetensors", &files, "model.safetensors", "hf-stories260K");
}

#[test]
fn pytorch_pickles() {
    let files = [
        "pytorch/stories260K/pytorch_model.bin",
        "pytorch/tensors.bin",
        "pytorch/compressed.bin",
        "pytorch/malicious/pytorch_model.bin",
    ];
    hf_dir_target("pickle", &files, "pytorch_model.bin", "pytorch/stories260K");
}

/// gpt-oss's MXFP4 experts: the tiny checkpoint's safetensors file (U8 blocks and scales
/// beside its `config.json`) and its GGUF file (stacked MXFP4 experts and their biases),
/// mutated, loaded and run for one token. They have no tokenizer, so they are loaded as
/// checkpoints rather than through `load_model`, with a context of 8 positions.
#[test]
fn gpt_oss_mxfp4_files() {
    let dir = tempfile::tempdir().unwrap();
    let config = data("hf-families/gpt_oss_mxfp4/config.json");
    std::fs::copy(config, dir.path().join("config.json")).unwrap();
    let files = [
        "hf-families/gpt_oss_mxfp4/model.safetensors",
        "hf-families/gpt_oss_mxfp4.gguf",
    ];
    let seeds = seeds("gpt_oss_mxfp4", &files);
    fuzz("gpt_oss_mxfp4", &seeds, findings(), |input| {
        let (file, load) = match input.starts_with(b"GGUF") {
            true => (dir.path().join("model.gguf"), dir.path().join("model.gguf")),
            false => (
                dir.path().join("model.safetensors"),
                dir.path().to_path_buf(),
            ),
        };
        std::fs::write(&file, input).unwrap();
        let Ok(ckpt) = import::load(&load) else {
            return;
        };
        let Ok(weights) = LlamaWeights::load(&ckpt) else {
            return;
        };
        let config = ModelConfig {
            max_seq_len: 8,
            ..ckpt.config.clone()
        };
        if let Ok(mut model) = Llama::new(config, weights) {
            let _ = model.forward(&cpu_executor(), &[3], 0, Logits::Last);
        }
    });
}

#[test]
fn llama2c_files() {
    let seeds = seeds("llama2c", &["stories260K/stories260K.bin"]);
    let beside = ["stories260K/tok512.bin"];
    model_target("llama2c", &seeds, "model.bin", &beside, "model.bin");
}

/// A tokenizer that loads must encode and decode.
fn use_tokenizer(tokenizer: &Tokenizer) {
    if let Ok(ids) = tokenizer.encode("Once upon a time, 你好 <s>\n\t!", true) {
        let _ = tokenizer.decode(&ids);
    }
    let ids: Vec<u32> = (0..tokenizer.vocab_size().min(300) as u32).collect();
    let _ = tokenizer.decode(&ids);
}

#[test]
fn tokenizer_files() {
    let files = [
        "stories260K/tok512.bin",
        "stories260K/tok512.model",
        "hf-stories260K/tokenizer.json",
        "chatglm/tokenizers/glm4_small.tiktoken",
    ];
    fuzz(
        "tokenizer",
        &seeds("tokenizer", &files),
        findings(),
        |input| {
            if let Ok(tokenizer) = Tokenizer::from_bytes(input) {
                use_tokenizer(&tokenizer);
            }
        },
    );
}

#[test]
fn chat_templates() {
    let base = Tokenizer::from_file(&data("hf-stories260K/tokenizer.json")).unwrap();
    let messages = [
        Message::new("system", "Be brief."),
        Message::new("user", "Hello {{ there }}"),
        Message::new("assistant", "Hi!"),
        Message::new("user", "Tell me a story."),
    ];
    fuzz(
        "chat_template",
        &corpus("chat_template"),
        findings(),
        |input| {
            let mut spec = base.spec();
            spec.chat_template = Some(String::from_utf8_lossy(input).into_owned());
            if let Ok(tokenizer) = Tokenizer::from_spec(spec) {
                let _ = tokenizer.encode_chat(&messages, true);
            }
        },
    );
}
