//! gpt-oss's tokenizer from GGUF metadata: a vocabulary-only GGUF of o200k_harmony's first
//! 16384 ranks and its 21 special tokens, written by `gguf-py` with
//! `tokenizer.ggml.pre = "gpt-4o"` (`tests/data/tokenizer/o200k-harmony`, SOURCES.md
//! there), against the ids Hugging Face `tokenizers` and `tiktoken` give on the same cut and
//! those of llama.cpp's `llama-tokenize` on the file.

use flm_models::import;
use flm_tests::{data, ids, json};

#[test]
fn o200k_harmony_gguf_matches_tokenizers_and_llama_cpp() {
    let tok = import::load_gguf_tokenizer(&data("tokenizer/o200k-harmony/o200k-harmony-16k.gguf"))
        .unwrap();
    assert_eq!(tok.vocab_size(), 16384 + 21);
    assert_eq!(
        (tok.bos_id(), tok.eos_id(), tok.add_bos()),
        (Some(16384), Some(16388), false)
    );
    let h = tok.harmony_tokens().unwrap();
    assert_eq!(
        (h.start, h.end, h.message, h.channel),
        (16392, 16393, 16394, 16391)
    );
    let refs = json("tokenizer/o200k-harmony/cases.json");
    let cases = refs["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 58);
    let mut differ = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let text = case["text"].as_str().unwrap();
        let (expected, llama_cpp) = (ids(&case["cut"]["ids"]), ids(&case["cut"]["llama_cpp"]));
        let got = tok.encode_with_specials(text).unwrap();
        assert_eq!(got, expected, "case {i}: {text:?}");
        if got != llama_cpp {
            differ.push(i);
        }
        let decoded = case["cut"]["decoded_skip_special"].as_str().unwrap();
        assert_eq!(tok.decode(&got).unwrap(), decoded, "case {i} decodes");
    }
    // llama.cpp runs its rewrite of the regex (letters as "not a-z" / "not A-Z" look-aheads,
    // without `\p{M}`), which cuts Devanagari's combining marks off their letters; flm runs
    // tokenizer.json's original, as `tokenizers` and tiktoken do. Everywhere else they agree.
    assert_eq!(differ, [52]);
    assert!(cases[52]["text"].as_str().unwrap().contains("नमस्ते"));
}
