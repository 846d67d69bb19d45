//! Robustness: truncated and corrupted files of every format load or fail, never panic;
//! random text and random ids never panic; the Llama 2 and GPT-2 tokenizers round-trip
//! random text.

use flm_tests::data;
use flm_tests::tokenizer::{load, stream, Rng};
use flm_tokenizer::Tokenizer;

const FILES: [&str; 5] = [
    "stories260K/tok512.model",
    "stories260K/tok512.bin",
    "hf-stories260K/tokenizer.json",
    "tokenizer/tokenizer.model",
    "tokenizer/tokenizer.bin",
];

/// Text mixing ASCII, runs of spaces, control characters, multi-byte characters,
/// "▁" itself and special-token look-alikes.
fn random_text(rng: &mut Rng) -> String {
    const PARTS: &[&str] = &[
        "a",
        "e",
        "t",
        "h",
        "the",
        " ",
        "  ",
        "\n",
        "\t",
        "\r",
        "\0",
        ".",
        ",",
        "'",
        "3",
        "é",
        "ß",
        "中文",
        "🦙",
        "😶\u{200d}🌫\u{fe0f}",
        "\u{2581}",
        "\u{fffd}",
        "<s>",
        "</s>",
        "<unk>",
        "<0x41>",
        "Once",
        " upon",
        " a",
        " time",
        "\u{3000}",
        "ǅ",
    ];
    let n = rng.below(30);
    (0..n).map(|_| PARTS[rng.below(PARTS.len())]).collect()
}

/// Encodes and decodes a little with a tokenizer that loaded from damaged bytes.
fn exercise(tok: &Tokenizer, rng: &mut Rng) {
    for _ in 0..3 {
        let text = random_text(rng);
        let _ = tok.encode(&text, true);
        let _ = tok.encode(&text, false);
    }
    let n = tok.vocab_size() as u64 + 2;
    let ids: Vec<u32> = (0..16).map(|_| (rng.next_u64() % n) as u32).collect();
    let _ = tok.decode(&ids);
    let mut stream = tok.stream_decoder(rng.below(2) == 0);
    for &id in &ids {
        let _ = stream.push(id);
    }
    stream.finish();
}

/// The bytes of each file, and whether it is large (over 100 kB: the tests try fewer of
/// its damaged versions).
fn file_bytes() -> impl Iterator<Item = (Vec<u8>, bool)> {
    FILES.into_iter().map(|rel| {
        let bytes = std::fs::read(data(rel)).unwrap();
        let large = bytes.len() > 100_000;
        (bytes, large)
    })
}

/// Exercises the tokenizer of damaged `bytes` if they load.
fn exercise_if_it_loads(bytes: &[u8], rng: &mut Rng) {
    if let Ok(tok) = Tokenizer::from_bytes(bytes) {
        exercise(&tok, rng);
    }
}

#[test]
fn truncations_never_panic() {
    let mut rng = Rng::new(1);
    for (bytes, large) in file_bytes() {
        let step = if large { 4999 } else { 7 };
        let lens = (0..bytes.len().min(300)).chain((300..bytes.len()).step_by(step));
        for len in lens {
            exercise_if_it_loads(&bytes[..len], &mut rng);
        }
    }
}

#[test]
fn corruptions_never_panic() {
    let mut rng = Rng::new(2);
    for (original, large) in file_bytes() {
        let rounds = if large { 60 } else { 600 };
        for _ in 0..rounds {
            let mut bytes = original.clone();
            match rng.below(3) {
                // Overwrite a few random bytes.
                0 => {
                    for _ in 0..1 + rng.below(8) {
                        let i = rng.below(bytes.len());
                        bytes[i] = rng.next_u64() as u8;
                    }
                }
                // Flip one bit.
                1 => {
                    let i = rng.below(bytes.len());
                    bytes[i] ^= 1 << rng.below(8);
                }
                // Splice in a run of random bytes.
                _ => {
                    let i = rng.below(bytes.len());
                    let junk: Vec<u8> = (0..rng.below(64)).map(|_| rng.next_u64() as u8).collect();
                    bytes.splice(i..i, junk);
                }
            }
            exercise_if_it_loads(&bytes, &mut rng);
        }
    }
}

#[test]
fn random_text_and_ids() {
    let mut rng = Rng::new(3);
    for rel in FILES.into_iter().chain(["tokenizer/gpt2/tokenizer.json"]) {
        let tok = load(rel);
        // Files without whitespace collapsing give back exactly what they were given
        // (tok512.model trims spaces; tokenizer.json's Metaspace does not double a
        // leading "▁"); byte-level BPE loses nothing.
        let round_trips = rel.starts_with("tokenizer/") || rel.ends_with(".bin");
        for _ in 0..500 {
            let text = random_text(&mut rng);
            let ids = tok.encode(&text, false).unwrap();
            assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
            let decoded = tok.decode(&ids).unwrap();
            // "▁" in the input decodes as a space, as in SentencePiece.
            if round_trips && !text.contains('\u{2581}') {
                assert_eq!(decoded, text, "{rel}");
            }
            assert_eq!(stream(&tok, &ids, true).concat(), decoded);
            exercise(&tok, &mut rng);
        }
    }
}
