//! Criterion benchmarks of `Tokenizer::encode` in bytes of text per second:
//! 10 MB of normal English text (`tests/data/text/tinystories_style.txt`, repeated), of one
//! letter, of spaces, of one digit and of random bytes read lossily as UTF-8, through a
//! SentencePiece BPE model, GPT-2's byte-level BPE with its own and Llama 3's
//! pre-tokenizer regexes, the same vocabulary with the GGUF pre-tokenizers that run as
//! linear-time rewrites (`tiny_aya`'s digit grouping, `bailingmoe`'s possessive pattern;
//! `split.rs`), and GLM-4's tiktoken-style BPE. An input a tokenizer refuses is reported
//! and skipped.
//!
//! The tokenizers are built as the tests build them (`flm_tests::tokenizer`).

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use flm_tests::data;
use flm_tests::tokenizer::{gguf_gpt2_variant, gpt2_variant};
use flm_tokenizer::Tokenizer;
use rand::{Rng, SeedableRng};

fn inputs() -> Vec<(&'static str, String)> {
    const LONG: usize = 10_000_000;
    let story = std::fs::read_to_string(data("text/tinystories_style.txt")).expect("text");
    let mut rng = rand::rngs::StdRng::seed_from_u64(48);
    let random: Vec<u8> = (0..LONG).map(|_| rng.random()).collect();
    let mut text = story.repeat(LONG / story.len() + 1);
    let mut end = LONG;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    vec![
        ("text-10MB", text),
        ("a-10MB", "a".repeat(LONG)),
        ("spaces-10MB", " ".repeat(LONG)),
        ("digits-10MB", "1".repeat(LONG)),
        ("random-10MB", String::from_utf8_lossy(&random).into_owned()),
    ]
}

fn encode(c: &mut Criterion) {
    let tokenizers = [
        (
            "sentencepiece",
            Tokenizer::from_file(&data("tokenizer/tokenizer.model")).expect("model"),
        ),
        ("gpt2", gpt2_variant("gpt2").tok),
        ("llama3-regex", gpt2_variant("llama3").tok),
        ("gguf-tiny_aya", gguf_gpt2_variant("tiny_aya")),
        ("gguf-bailingmoe", gguf_gpt2_variant("bailingmoe")),
        (
            "tiktoken-glm4",
            Tokenizer::from_file(&data("chatglm/tokenizers/glm4_small.tiktoken")).expect("glm4"),
        ),
    ];
    let inputs = inputs();
    let mut group = c.benchmark_group("encode");
    // One encode per sample: a 10 MB input takes up to about a second.
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
