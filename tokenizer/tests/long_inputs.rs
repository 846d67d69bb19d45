//! Texts of 10 MB (a run of about 1,000,000 identical characters once made the
//! backtracking regex engine give up): one character repeated, spaces, and random bytes
//! read lossily as UTF-8, through every kind of tokenizer in the test data: SentencePiece
//! BPE (`.model`), Hugging Face BPE with a Metaspace (Gemma style), byte-level BPE with
//! GPT-2's merges and each pre-tokenizer of `tokenizer/gpt2/gpt2_cases.json` (whose short
//! cases `tokenizers` checked) or of a GGUF `tokenizer.ggml.pre`, and tiktoken-style
//! byte-level BPE (GLM-4).
//!
//! A run of one character must tokenise as the merges build it: as many copies of the
//! longest token they make of the run as fit, with the same ids at both ends as a shorter
//! run of the same length modulo that token's. Random text must decode back to itself.

use std::sync::OnceLock;

use flm_tests::data;
use flm_tests::tokenizer::{gguf_gpt2_variant, gpt2_variant, load};
use flm_tokenizer::Tokenizer;
use rand::{Rng, SeedableRng};
use unicode_normalization::UnicodeNormalization;

/// 10 MB.
const LONG: usize = 10_000_000;
/// Beyond the old engine's limit (between 999,023 and 1,000,000 characters), for the
/// pre-tokenizers whose run is shorter, to keep the debug build's test time down.
const SHORTER: usize = 1_500_000;

/// `len` random bytes read as UTF-8, invalid sequences replaced (the same text for every
/// tokenizer).
fn random_text(len: usize) -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    let text = TEXT.get_or_init(|| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(48);
        let bytes: Vec<u8> = (0..LONG).map(|_| rng.random()).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    });
    let mut end = len.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The index, length and id of the longest run of one id in `ids`.
fn longest_run(ids: &[u32]) -> (usize, usize, u32) {
    let mut best = (0, 0, 0);
    let mut start = 0;
    for i in 1..=ids.len() {
        if i == ids.len() || ids[i] != ids[start] {
            if i - start > best.1 {
                best = (start, i - start, ids[start]);
            }
            start = i;
        }
    }
    best
}

/// `c` repeated `n` times: almost all of it must be one token `t` repeated, and taking
/// all but two copies of `t`'s text out of the run must take exactly those copies of `t`
/// out of the ids (the head and tail the merges leave stay the same).
fn check_run(tok: &Tokenizer, what: &str, c: char, n: usize) {
    let text = c.to_string().repeat(n);
    let ids = tok.encode(&text, false).unwrap();
    let (at, count, t) = longest_run(&ids);
    let piece = String::from_utf8_lossy(tok.piece(t).unwrap()).into_owned();
    let len = piece.chars().count();
    assert!(
        count * len + 1000 > n,
        "{what}: {c:?} x {n}: {count} x {piece:?} cover too little"
    );
    assert!(count > 2, "{what}");
    let short = c.to_string().repeat(n - (count - 2) * len);
    let expected: Vec<u32> = ids[..at]
        .iter()
        .chain([&t, &t])
        .chain(&ids[at + count..])
        .copied()
        .collect();
    assert_eq!(
        tok.encode(&short, false).unwrap(),
        expected,
        "{what}: {c:?} x {n}"
    );
}

/// Random text decodes back to itself, in normalisation form C if the tokenizer's
/// normaliser is `nfc`.
fn check_random(tok: &Tokenizer, what: &str, len: usize, nfc: bool) {
    let text = random_text(len);
    let ids = tok.encode(text, false).unwrap();
    assert!(ids.len() > len / 8, "{what}");
    let decoded = tok.decode(&ids).unwrap();
    let ok = if nfc {
        decoded.chars().eq(text.nfc())
    } else {
        decoded == text
    };
    assert!(ok, "{what}: random text");
}

fn check_all(tok: &Tokenizer, what: &str, len: usize, nfc: bool) {
    check_run(tok, what, 'a', len);
    check_run(tok, what, ' ', len);
    check_random(tok, what, len, nfc);
}

#[test]
fn megabytes_through_sentencepiece_bpe() {
    check_all(
        &load("tokenizer/tokenizer.model"),
        "tokenizer.model",
        LONG,
        false,
    );
}

#[test]
fn megabytes_through_hugging_face_bpe_with_metaspace() {
    check_all(
        &load("tokenizer/gemma-style/gemma.json"),
        "gemma.json",
        LONG,
        false,
    );
}

#[test]
fn megabytes_through_tiktoken_style_byte_level_bpe() {
    let path = data("chatglm/tokenizers/glm4_small.tiktoken");
    check_all(
        &Tokenizer::from_file(&path).unwrap(),
        "glm4_small",
        LONG,
        false,
    );
}

#[test]
fn megabytes_through_byte_level_bpe_with_gpt2_and_llama3_regexes() {
    for variant in ["gpt2", "llama3"] {
        let v = gpt2_variant(variant);
        check_all(&v.tok, variant, LONG, v.nfc);
    }
}

#[test]
fn megabytes_through_byte_level_bpe_with_qwen2_and_tekken_regexes() {
    for variant in ["qwen2", "tekken"] {
        let v = gpt2_variant(variant);
        check_all(&v.tok, variant, LONG, v.nfc);
    }
}

#[test]
fn megabytes_through_byte_level_bpe_with_every_other_pre_tokenizer() {
    // Pre-tokenizers of GGUF files with several regexes or with other look-aheads than
    // Llama 3's, and the two run as linear-time equivalents (`split.rs`).
    for pre in [
        "smollm",
        "deepseek-llm",
        "deepseek-v3",
        "qwen35",
        "jais-2",
        "exaone-moe",
    ]
    .into_iter()
    .chain(["bailingmoe", "granite-embed-multi-97m"])
    {
        check_all(&gguf_gpt2_variant(pre), pre, SHORTER, false);
    }
}

/// Cohere's digit grouping `\d{1,3}(?=(?:\d{3})*\b)` before GPT-4o's regex (`tiny_aya`;
/// `cohere2moe` maps to the same two), at the full length, and on a run of digits, which
/// the grouping cuts in threes.
#[test]
fn megabytes_through_byte_level_bpe_with_digit_grouping() {
    let tok = gguf_gpt2_variant("tiny_aya");
    check_all(&tok, "tiny_aya", LONG, false);
    check_run(&tok, "tiny_aya", '1', LONG);
}
