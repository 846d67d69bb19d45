//! Files that are not tokenizers, cut short, or of an unsupported kind give clear errors.

use flm_tests::tokenizer::{load, Rng};
use flm_tests::{data, json};
use flm_tokenizer::{Error, Tokenizer};

fn read(rel: &str) -> Vec<u8> {
    std::fs::read(data(rel)).unwrap()
}

fn err(bytes: &[u8]) -> Error {
    Tokenizer::from_bytes(bytes).expect_err("should not load")
}

#[test]
fn not_a_tokenizer() {
    let path = data("hf-stories260K/model.safetensors");
    let e = Tokenizer::from_file(&path).unwrap_err();
    assert!(matches!(e, Error::NotATokenizer(_)), "{e}");
    let msg = e.to_string();
    assert!(msg.starts_with("not a tokenizer file: "), "{msg}");
    assert!(msg.contains("model.safetensors"), "{msg}");

    let mut rng = Rng::new(7);
    let random: Vec<u8> = (0..4096).map(|_| rng.next_u64() as u8).collect();
    assert!(matches!(err(&random), Error::NotATokenizer(_)));
    assert!(matches!(err(b""), Error::NotATokenizer(_)));
    assert!(matches!(err(b"hello world\n"), Error::NotATokenizer(_)));
    // JSON, but not a tokenizer.json.
    let config = read("hf-stories260K/config.json");
    assert!(matches!(err(&config), Error::NotATokenizer(_)));
    assert!(matches!(err(b"{\"model\": 3"), Error::Truncated(_)));
    assert!(matches!(err(b"{oops}"), Error::NotATokenizer(_)));
    // The logits file of the reference run.
    let logits = read("stories260K/stories260K_logits_f32le.bin");
    assert!(matches!(err(&logits), Error::NotATokenizer(_)));
}

#[test]
fn missing_file() {
    let e = Tokenizer::from_file(&data("tokenizer/no-such-file.model")).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(e.to_string().contains("no-such-file.model"));
}

#[test]
fn truncated_sentencepiece_model() {
    for rel in ["tokenizer/tokenizer.model", "stories260K/tok512.model"] {
        let bytes = read(rel);
        for len in [2, 10, 100, bytes.len() / 2, bytes.len() - 1] {
            let e = err(&bytes[..len]);
            assert!(matches!(e, Error::Truncated(_)), "{rel} at {len}: {e}");
            assert!(e.to_string().starts_with("truncated SentencePiece model"));
        }
    }
}

#[test]
fn truncated_llama2c_bin() {
    for rel in ["tokenizer/tokenizer.bin", "stories260K/tok512.bin"] {
        let bytes = read(rel);
        // Inside the first entry, and inside the last piece's bytes.
        for len in [6, 13, bytes.len() - 1] {
            let e = err(&bytes[..len]);
            assert!(matches!(e, Error::Truncated(_)), "{rel} at {len}: {e}");
            assert!(e.to_string().contains("llama2.c tokenizer.bin"), "{e}");
        }
    }
}

#[test]
fn truncated_tokenizer_json() {
    let bytes = read("hf-stories260K/tokenizer.json");
    for len in [1, 100, bytes.len() / 2, bytes.len() - 2] {
        let e = err(&bytes[..len]);
        assert!(matches!(e, Error::Truncated(_)), "at {len}: {e}");
    }
}

/// Appends a protobuf length-delimited field (tag < 16, payload < 128 bytes).
fn field(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![tag << 3 | 2, payload.len() as u8];
    out.extend_from_slice(payload);
    out
}

#[test]
fn unsupported_sentencepiece_models() {
    let base = read("stories260K/tok512.model");
    // A later trainer_spec is merged into the first: model_type (field 3) = UNIGRAM.
    let unigram = [base.clone(), field(2, &[3 << 3, 1])].concat();
    let e = err(&unigram);
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("Unigram"), "{e}");
    // normalizer_spec.precompiled_charsmap (field 2) non-empty: an NFKC-style normaliser.
    let nfkc = [base.clone(), field(3, &field(2, b"rules"))].concat();
    let e = err(&nfkc);
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("precompiled"), "{e}");
    // And the base file loads.
    assert!(Tokenizer::from_bytes(&base).is_ok());
}

#[test]
fn unsupported_tokenizer_json() {
    let base: serde_json::Value = json("hf-stories260K/tokenizer.json");
    let unsupported = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v = base.clone();
        edit(&mut v);
        let e = err(&serde_json::to_vec(&v).unwrap());
        assert!(matches!(e, Error::Unsupported(_)), "{e}");
        e.to_string()
    };
    let msg = unsupported(&|v| v["model"]["type"] = "WordPiece".into());
    assert!(msg.contains("WordPiece"), "{msg}");
    let msg = unsupported(&|v| {
        v["pre_tokenizer"] = serde_json::json!({"type": "ByteLevel", "add_prefix_space": true})
    });
    assert!(
        msg.contains("byte-level") && msg.contains("add_prefix_space"),
        "{msg}"
    );
    let msg = unsupported(&|v| v["normalizer"] = serde_json::json!({"type": "NFKC"}));
    assert!(msg.contains("NFKC"), "{msg}");
}

#[test]
fn no_bos_token() {
    let mut v: serde_json::Value = json("hf-stories260K/tokenizer.json");
    v["added_tokens"] = serde_json::json!([]);
    let tok = Tokenizer::from_bytes(&serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!(tok.bos_id(), None);
    assert!(matches!(tok.encode("hi", true), Err(Error::NoBos)));
    assert!(tok.encode("hi", false).is_ok());
}

#[test]
fn id_out_of_range() {
    let tok = load("stories260K/tok512.bin");
    let e = tok.decode(&[512]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "token id 512 out of range for vocabulary of 512"
    );
}
