//! Shared helpers for the integration tests: paths into `tests/data` and parsers for the
//! golden files (see shared/models/SOURCES.md).

#![allow(dead_code)] // each test crate uses a different subset

use std::path::PathBuf;

use flm_tokenizer::Tokenizer;

/// A file under the workspace's `tests/data`.
pub fn data(rel: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data")).join(rel)
}

pub fn load(rel: &str) -> Tokenizer {
    Tokenizer::from_file(&data(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

pub fn json(rel: &str) -> serde_json::Value {
    let bytes = std::fs::read(data(rel)).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The 46 llama.cpp `ggml-vocab-llama-spm` cases: (text, ids without BOS). Format in
/// SOURCES.md section 4.
pub fn llama_cpp_cases() -> Vec<(String, Vec<u32>)> {
    llama_cpp_cases_of("llama-spm")
}

/// The 46 cases of llama.cpp's `ggml-vocab-{vocab}.gguf.inp` / `.out`.
pub fn llama_cpp_cases_of(vocab: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read(data(&format!("llama.cpp/ggml-vocab-{vocab}.gguf.inp"))).unwrap();
    let inp = String::from_utf8(inp).unwrap();
    let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    assert_eq!(texts.pop(), Some(""), "separator after the last case");
    let out = data(&format!("llama.cpp/ggml-vocab-{vocab}.gguf.out"));
    let out = std::fs::read_to_string(out).unwrap();
    let lines: Vec<&str> = out.split('\n').collect();
    assert!(lines.len() >= texts.len());
    let cases: Vec<(String, Vec<u32>)> = texts
        .iter()
        .zip(lines)
        .map(|(t, l)| {
            let ids = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
            (t.to_string(), ids)
        })
        .collect();
    assert_eq!(cases.len(), 46);
    cases
}

/// The five llama2.c test.c cases: (text, ids with BOS).
pub fn llama2_c_cases() -> Vec<(String, Vec<u32>)> {
    let v = json("tokenizer/llama2_tokenizer_cases.json");
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["text"].as_str().unwrap().to_string(), ids(&c["ids"])))
        .collect()
}

/// Decodes `ids` one at a time, returning each push's output.
pub fn stream(tok: &Tokenizer, ids: &[u32], at_start: bool) -> Vec<String> {
    let mut d = tok.stream_decoder(at_start);
    let mut parts: Vec<String> = ids.iter().map(|&id| d.push(id).unwrap()).collect();
    parts.push(d.finish());
    parts
}

/// A small deterministic PRNG (xorshift64*), so the tests need no extra crate.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
