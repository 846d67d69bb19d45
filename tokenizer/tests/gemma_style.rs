//! Gemma's SentencePiece-derived `tokenizer.json` pipeline (transformers' `GemmaConverter`:
//! a `Replace(" ", "▁")` normaliser, a `Split(" ")` pre-tokenizer, BPE with byte
//! fallback, no prefix space) and the `Split` pre-tokenizer's four delimiter behaviours,
//! against the ids Hugging Face `tokenizers` gives
//! (`tests/data/tokenizer/gemma-style/make_gemma_style.py`).

use flm_tests::{data, ids, json};
use flm_tokenizer::Tokenizer;

#[test]
fn gemma_style_tokenizer_json_matches_tokenizers() {
    let cases = json("tokenizer/gemma-style/cases.json");
    let files = cases["files"].as_object().unwrap();
    assert_eq!(files.len(), 5);
    for (name, cases) in files {
        let path = data(&format!("tokenizer/gemma-style/{name}.json"));
        let tok = Tokenizer::from_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        // As .flm files store it: the description, read back.
        let stored = Tokenizer::from_spec(tok.spec()).unwrap();
        for case in cases.as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let got = tok.encode(text, false).unwrap();
            assert_eq!(got, ids(&case["ids"]), "{name}: {text:?}");
            assert_eq!(
                stored.encode(text, false).unwrap(),
                got,
                "{name} stored: {text:?}"
            );
            if name == "gemma" {
                // Nothing is lost: the pieces spell the text again.
                assert_eq!(tok.decode(&got).unwrap(), text, "{name}: {text:?}");
            }
        }
    }
}
