//! Criterion benchmarks of `Tokenizer::encode` in bytes of text per second (issue 48):
//! normal English text (`tests/data/text/tinystories_style.txt`, repeated to 1 MB) and 10
//! MB of one letter, of spaces and of random bytes read lossily as UTF-8, through a
//! SentencePiece BPE model, GPT-2's byte-level BPE with its own and Llama 3's
//! pre-tokenizer regexes, and GLM-4's tiktoken-style BPE. An input a tokenizer refuses is
//! reported and skipped.

use std::path::PathBuf;

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use flm_tokenizer::Tokenizer;
use rand::{Rng, SeedableRng};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data")).join(rel)
}

/// GPT-2's `tokenizer.json`, with Llama 3's `Split` regex if `llama3`.
fn gpt2(llama3: bool) -> Tokenizer {
    let bytes = std::fs::read(data("tokenizer/gpt2/tokenizer.json")).expect("gpt2 file");
    let mut file: serde_json::Value = serde_json::from_slice(&bytes).expect("gpt2 json");
    if llama3 {
        let cases = std::fs::read(data("tokenizer/gpt2/gpt2_cases.json")).expect("cases");
        let cases: serde_json::Value = serde_json::from_slice(&cases).expect("cases json");
        file["pre_tokenizer"] = cases["variants"]["llama3"]["pre_tokenizer"].clone();
        file["model"]["ignore_merges"] = true.into();
    }
    Tokenizer::from_bytes(&serde_json::to_vec(&file).expect("json")).expect("gpt2")
}

fn inputs() -> Vec<(&'static str, String)> {
    const LONG: usize = 10_000_000;
    let story = std::fs::read_to_string(data("text/tinystories_style.txt")).expect("text");
    let mut rng = rand::rngs::StdRng::seed_from_u64(48);
    let random: Vec<u8> = (0..LONG).map(|_| rng.random()).collect();
    vec![
        ("text-1MB", story.repeat(1_000_000 / story.len() + 1)),
        ("a-10MB", "a".repeat(LONG)),
        ("spaces-10MB", " ".repeat(LONG)),
        ("random-10MB", String::from_utf8_lossy(&random).into_owned()),
    ]
}

fn encode(c: &mut Criterion) {
    let tokenizers = [
        (
            "sentencepiece",
            Tokenizer::from_file(&data("tokenizer/tokenizer.model")).expect("model"),
        ),
        ("gpt2", gpt2(false)),
        ("llama3-regex", gpt2(true)),
        (
            "tiktoken-glm4",
            Tokenizer::from_file(&data("chatglm/tokenizers/glm4_small.tiktoken")).expect("glm4"),
        ),
    ];
    let inputs = inputs();
    let mut group = c.benchmark_group("encode");
    // One encode per sample: a 10 MB input takes about a second.
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    for (name, tok) in &tokenizers {
        for (input, text) in &inputs {
            if let Err(e) = tok.encode(text, false) {
                println!("encode/{name}/{input}: refused: {e}");
                continue;
            }
            group.throughput(Throughput::Bytes(text.len() as u64));
            group.bench_with_input(BenchmarkId::new(*name, input), text, |b, text| {
                b.iter(|| tok.encode(text, false).expect("encode"))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, encode);
criterion_main!(benches);
