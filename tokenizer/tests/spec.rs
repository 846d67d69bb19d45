//! `Tokenizer::spec` / `Tokenizer::from_spec`: every shipped tokenizer survives a JSON
//! round trip of its description with identical encodings and decodings, and bad
//! descriptions are refused with clear errors, never a panic.

use flm_tests::tokenizer::{llama2_c_cases, llama_cpp_cases, load, stream, Rng};
use flm_tests::{ids, json};
use flm_tokenizer::{Error, PieceType, Tokenizer, TokenizerKind, TokenizerSpec};

const FILES: [&str; 5] = [
    "tokenizer/tokenizer.model",
    "tokenizer/tokenizer.bin",
    "stories260K/tok512.model",
    "stories260K/tok512.bin",
    "hf-stories260K/tokenizer.json",
];

fn round_trip(tok: &Tokenizer) -> Tokenizer {
    let text = serde_json::to_string(&tok.spec()).unwrap();
    let spec: TokenizerSpec = serde_json::from_str(&text).unwrap();
    Tokenizer::from_spec(spec).unwrap()
}

/// Every golden text of the tokenizer tests, with the ids expected for `file` where the
/// golden data is about that file.
fn golden(file: &str) -> Vec<(String, Option<Vec<u32>>)> {
    let llama = file.starts_with("tokenizer/");
    let mut cases: Vec<(String, Option<Vec<u32>>)> = llama_cpp_cases()
        .into_iter()
        .map(|(t, i)| (t, llama.then_some(i)))
        .collect();
    for (t, i) in llama2_c_cases() {
        cases.push((t, llama.then(|| i[1..].to_vec())));
    }
    let r = json("stories260K/stories260K_reference.json");
    let tok512 = file.starts_with("stories260K/");
    for (t, i) in r["tok512_encode_cases"].as_object().unwrap() {
        cases.push((t.clone(), tok512.then(|| ids(i))));
    }
    let prompt = r["greedy_prompt"]["prompt"].as_str().unwrap().to_string();
    cases.push((prompt, None));
    cases
}

#[test]
fn json_round_trip_keeps_every_encoding_and_decoding() {
    for file in FILES {
        let tok = load(file);
        let back = round_trip(&tok);
        assert_eq!(back.spec(), tok.spec(), "{file}: the spec round-trips");
        assert_eq!(back.vocab_size(), tok.vocab_size());
        assert_eq!((back.bos_id(), back.eos_id()), (tok.bos_id(), tok.eos_id()));
        for (text, expected) in golden(file) {
            let got = back.encode(&text, false).unwrap();
            assert_eq!(got, tok.encode(&text, false).unwrap(), "{file}: {text:?}");
            if let Some(expected) = expected {
                assert_eq!(got, expected, "{file}: {text:?} against the golden ids");
            }
            assert_eq!(
                back.encode(&text, true).unwrap(),
                tok.encode(&text, true).unwrap()
            );
            assert_eq!(back.decode(&got).unwrap(), tok.decode(&got).unwrap());
            assert_eq!(stream(&back, &got, true), stream(&tok, &got, true));
        }
        for id in 0..tok.vocab_size() as u32 {
            assert_eq!(back.piece(id), tok.piece(id), "{file}: piece {id}");
            assert_eq!(back.decode(&[id]).unwrap(), tok.decode(&[id]).unwrap());
        }
    }
}

#[test]
fn random_texts_agree_after_the_round_trip() {
    const PARTS: &[&str] = &[
        "a", "the", " ", "  ", "\n", "\t", "é", "中文", "🦙", "\u{2581}", "<s>", "</s>", "<unk>",
        "<0x41>", "Once", " upon", "\u{3000}",
    ];
    let mut rng = Rng::new(11);
    for file in FILES {
        let tok = load(file);
        let back = round_trip(&tok);
        for _ in 0..300 {
            let text: String = (0..rng.below(20))
                .map(|_| PARTS[rng.below(PARTS.len())])
                .collect();
            assert_eq!(
                back.encode(&text, false).unwrap(),
                tok.encode(&text, false).unwrap(),
                "{file}: {text:?}"
            );
            let some: Vec<u32> = (0..8).map(|_| rng.below(tok.vocab_size()) as u32).collect();
            assert_eq!(back.decode(&some).unwrap(), tok.decode(&some).unwrap());
        }
    }
}

#[test]
fn json_shape() {
    let tok = load("stories260K/tok512.bin");
    let v = serde_json::to_value(tok.spec()).unwrap();
    assert_eq!(v["kind"]["type"], "sentence_piece_bpe");
    assert_eq!(v["pieces"][1], "<s>");
    assert_eq!(v["types"][1], 3, "control");
    assert_eq!(v["types"][3], 6, "byte");
    assert_eq!(v["bos_id"], 1);
    let hf = serde_json::to_value(load("hf-stories260K/tokenizer.json").spec()).unwrap();
    assert_eq!(hf["kind"]["type"], "hf_bpe");
    assert!(!hf["kind"]["merges"].as_array().unwrap().is_empty());
}

/// The tok512.bin spec with its piece 300 replaced by non-UTF-8 bytes and a NaN score.
#[test]
fn non_utf8_pieces_and_non_finite_scores_round_trip() {
    let mut spec = load("stories260K/tok512.bin").spec();
    spec.pieces[300] = vec![0xff, b'x', 0xfe];
    spec.scores[300] = f32::NAN;
    spec.scores[301] = f32::NEG_INFINITY;
    spec.chat_template = Some("{{ messages }}".into());
    spec.add_bos = false;
    let text = serde_json::to_string(&spec).unwrap();
    assert!(text.contains("[255,120,254]"), "bytes as an array");
    let back: TokenizerSpec = serde_json::from_str(&text).unwrap();
    assert_eq!(back.pieces[300], spec.pieces[300]);
    assert!(back.scores[300].is_nan());
    assert_eq!(back.scores[301], f32::NEG_INFINITY);
    let tok = Tokenizer::from_spec(back).unwrap();
    assert_eq!(tok.piece(300), Some(&[0xff, b'x', 0xfe][..]));
    assert_eq!(tok.chat_template(), Some("{{ messages }}"));
    assert!(!tok.add_bos());
}

fn refused(spec: TokenizerSpec) -> String {
    match Tokenizer::from_spec(spec) {
        Err(e @ Error::Invalid(_)) => e.to_string(),
        Err(e) => panic!("unexpected error kind: {e}"),
        Ok(_) => panic!("an invalid spec was accepted"),
    }
}

#[test]
fn invalid_specs_are_refused_clearly() {
    let base = load("stories260K/tok512.model").spec();
    let hf = load("hf-stories260K/tokenizer.json").spec();
    let edit = |s: &TokenizerSpec, f: &dyn Fn(&mut TokenizerSpec)| {
        let mut s = s.clone();
        f(&mut s);
        refused(s)
    };
    let msg = edit(&base, &|s| {
        s.scores.pop();
    });
    assert!(msg.contains("512 pieces but 511 scores"), "{msg}");
    let msg = edit(&base, &|s| s.bos_id = Some(512));
    assert!(msg.contains("bos_id 512 is outside"), "{msg}");
    let msg = edit(&base, &|s| s.types[300] = PieceType::Byte);
    assert!(msg.contains("piece 300 has type byte"), "{msg}");
    let msg = edit(&base, &|s| s.unk_id = Some(5));
    assert!(msg.contains("unk_id"), "{msg}");
    let msg = edit(&base, &|s| s.pieces[400] = s.pieces[401].clone());
    assert!(msg.contains("defined twice"), "{msg}");
    let msg = edit(&base, &|s| s.pieces.clear());
    assert!(msg.contains("no pieces"), "{msg}");
    let msg = edit(&hf, &|s| {
        if let TokenizerKind::HfBpe(h) = &mut s.kind {
            h.merges.push([700, 3]);
        }
    });
    assert!(msg.contains("outside the vocabulary"), "{msg}");
    let msg = edit(&hf, &|s| {
        if let TokenizerKind::HfBpe(h) = &mut s.kind {
            h.merges.push([300, 300]);
        }
    });
    assert!(msg.contains("is not in the vocabulary"), "{msg}");
    // A piece type outside 1..=6 is a deserialisation error.
    let mut v = serde_json::to_value(&base).unwrap();
    v["types"][0] = 9.into();
    let e = serde_json::from_value::<TokenizerSpec>(v).unwrap_err();
    assert!(e.to_string().contains("piece type 9"), "{e}");
}

/// Random edits of the JSON of each spec: deserialising and rebuilding give a tokenizer
/// or an error, never a panic.
#[test]
fn corrupted_specs_never_panic() {
    let mut rng = Rng::new(5);
    for file in ["stories260K/tok512.model", "hf-stories260K/tokenizer.json"] {
        let original = serde_json::to_vec(&load(file).spec()).unwrap();
        for _ in 0..300 {
            let mut bytes = original.clone();
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(bytes.len());
                bytes[i] = b"0123456789[]{},\":-ab"[rng.below(20)];
            }
            let Ok(spec) = serde_json::from_slice::<TokenizerSpec>(&bytes) else {
                continue;
            };
            if let Ok(tok) = Tokenizer::from_spec(spec) {
                let ids = tok.encode("Once upon a time, 🦙 <s>", true);
                let _ = ids.and_then(|ids| tok.decode(&ids));
            }
        }
    }
}
