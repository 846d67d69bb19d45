//! gpt-oss's tokenizer, o200k_harmony, from its Hugging Face `tokenizer.json`: OpenAI's
//! o200k_base ranks converted by transformers' `TikTokenConverter` with the 21 harmony
//! special tokens at their real ids (199998-200018), against the ids Hugging Face
//! `tokenizers` and `tiktoken` both give for llama.cpp's 46 test strings and twelve more
//! (`tests/data/tokenizer/o200k-harmony/make_o200k_harmony.py`, SOURCES.md there).

use flm_tests::tokenizer::{stream, xz};
use flm_tests::{data, ids, json};
use flm_tokenizer::Tokenizer;

const DIR: &str = "tokenizer/o200k-harmony";

/// The whole tokenizer with gpt-oss's `tokenizer_config.json` (BOS, EOS).
fn o200k_harmony() -> Tokenizer {
    let tok = Tokenizer::from_bytes(&xz(&format!("{DIR}/tokenizer.json.xz"))).unwrap();
    let config = std::fs::read(data(&format!("{DIR}/tokenizer_config.json"))).unwrap();
    tok.with_hf_config(&config, None).unwrap()
}

#[test]
fn o200k_harmony_matches_tokenizers_and_tiktoken() {
    let tok = o200k_harmony();
    let refs = json(&format!("{DIR}/cases.json"));
    let cases = refs["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 58);
    for (i, case) in cases.iter().enumerate() {
        let text = case["text"].as_str().unwrap();
        let expected = ids(&case["ids"]);
        let got = tok.encode(text, false).unwrap();
        assert_eq!(got, expected, "case {i}: {text:?}");
        // flm's decode skips special tokens, as `skip_special_tokens=True` does.
        let decoded = case["decoded_skip_special"].as_str().unwrap();
        assert_eq!(tok.decode(&got).unwrap(), decoded, "case {i} decodes");
        assert_eq!(
            stream(&tok, &got, true).concat(),
            decoded,
            "case {i} streamed"
        );
    }
}

#[test]
fn harmony_special_tokens_sit_at_their_real_ids() {
    let tok = o200k_harmony();
    let refs = json(&format!("{DIR}/cases.json"));
    let specials = refs["special_ids"].as_object().unwrap();
    assert_eq!(specials.len(), 21);
    for (text, id) in specials {
        let id = id.as_u64().unwrap() as u32;
        assert_eq!(tok.encode(text, false).unwrap(), [id], "{text}");
        assert_eq!(tok.piece(id), Some(text.as_bytes()), "{text}");
    }
    assert_eq!(tok.vocab_size(), 200019);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(199998), Some(200002)));
    assert!(!tok.add_bos());
    // The harmony header of a reply, as the template writes it and the model reads it.
    let ids = tok
        .encode_with_specials("<|start|>assistant<|channel|>final<|message|>Hi<|return|>")
        .unwrap();
    assert_eq!(ids[0], 200006);
    assert_eq!(ids[2], 200005);
    assert_eq!(ids[ids.len() - 1], 200002);
}
