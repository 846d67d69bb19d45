//! Byte-level BPE from a Hugging Face `tokenizer.json`: GPT-2's vocabulary and merges (from
//! llama.cpp's `ggml-vocab-gpt-2.gguf`) built into a tokenizer by the `tokenizers` package,
//! with added tokens, against the ids `tokenizers` gives for llama.cpp's 46 test strings and
//! eleven more, with GPT-2's pre-tokenizer and with the `Split` regexes of Llama 3, Qwen2
//! (with its NFC normalizer) and Mistral-Nemo swapped in, and the pre-tokenizer Sequences
//! of SmolLM, DeepSeek-LLM and more (`tests/data/tokenizer/gpt2/make_gpt2_cases.py`).

use flm_tests::tokenizer::{gpt2_variant, llama_cpp_cases_of, stream, Gpt2Variant};
use flm_tests::{ids, json};
use flm_tokenizer::Tokenizer;

fn check(name: &str) {
    let Gpt2Variant { tok, cases, .. } = gpt2_variant(name);
    assert_eq!(cases.len(), 57);
    for (i, (text, expected, decoded)) in cases.iter().enumerate() {
        assert_eq!(
            &tok.encode(text, false).unwrap(),
            expected,
            "{name} case {i}: {text:?}"
        );
        assert_eq!(
            &tok.decode(expected).unwrap(),
            decoded,
            "{name} case {i} decodes"
        );
    }
}

#[test]
fn gpt2_tokenizer_json_matches_tokenizers() {
    check("gpt2");
    // The first 46 are llama.cpp's cases, whose ids llama.cpp recorded independently.
    let tok = gpt2_variant("gpt2").tok;
    for (text, expected) in llama_cpp_cases_of("gpt-2") {
        assert_eq!(tok.encode(&text, false).unwrap(), expected, "{text:?}");
    }
    assert_eq!((tok.bos_id(), tok.eos_id()), (None, Some(50256)));
    assert_eq!(tok.vocab_size(), 50260);
}

#[test]
fn llama3_regex_matches_tokenizers() {
    check("llama3");
}

#[test]
fn qwen2_regex_and_nfc_match_tokenizers() {
    check("qwen2");
}

#[test]
fn tekken_regex_matches_tokenizers() {
    check("tekken");
}

/// `tokenizer.json` pre-tokenizers that are Sequences of several members, read from the
/// file itself: SmolLM's `Digits` then `ByteLevel` with GPT-2's regex, and the `Split`
/// sequences of DeepSeek-LLM (with `\s+$`), Qwen3.5, Jais-2, EXAONE-MoE, Spark 2.5,
/// MiniCPM 5 and ufakzeka.
#[test]
fn pre_tokenizer_sequences_match_tokenizers() {
    for name in [
        "smollm",
        "deepseek-llm",
        "qwen35",
        "jais-2",
        "exaone-moe",
        "spark2_5",
        "minicpm5",
        "ufakzeka",
    ] {
        check(name);
    }
}

#[test]
fn added_tokens_round_trip_through_the_flm_spec() {
    let Gpt2Variant { tok, cases, .. } = gpt2_variant("llama3");
    let json = serde_json::to_string(&tok.spec()).unwrap();
    let back = Tokenizer::from_spec(serde_json::from_str(&json).unwrap()).unwrap();
    assert_eq!(back.spec(), tok.spec());
    for (text, expected, decoded) in cases {
        assert_eq!(back.encode(&text, false).unwrap(), expected, "{text:?}");
        assert_eq!(back.decode(&expected).unwrap(), decoded);
    }
}

#[test]
fn invalid_utf8_decodes_as_tokenizers_does() {
    // `tokenizers`' ByteLevel decoder: one U+FFFD per maximal invalid subsequence; the
    // stream holds back incomplete characters and ends with the same text.
    let tok = gpt2_variant("gpt2").tok;
    let cases = json("tokenizer/gpt2/gpt2_cases.json");
    for case in cases["decode_cases"].as_array().unwrap() {
        let (ids, text) = (ids(&case["ids"]), case["text"].as_str().unwrap());
        assert_eq!(tok.decode(&ids).unwrap(), text, "{ids:?}");
        assert_eq!(stream(&tok, &ids, true).concat(), text, "{ids:?} streamed");
    }
}

#[test]
fn tokenizer_config_names_bos_and_eos() {
    // Qwen2-style: no BOS, EOS a special token; Llama 3-style objects with "content".
    let tok = gpt2_variant("gpt2").tok;
    let config = br#"{"bos_token": null, "eos_token": "<|im_start|>", "add_bos_token": false}"#;
    let tok = tok.with_hf_config(config, None).unwrap();
    assert_eq!(
        (tok.bos_id(), tok.eos_id(), tok.add_bos()),
        (None, Some(50257), false)
    );
    let config = br#"{"bos_token": {"content": "<|endoftext|>"}, "add_bos_token": true}"#;
    let tok = tok.with_hf_config(config, None).unwrap();
    assert_eq!(
        (tok.bos_id(), tok.eos_id(), tok.add_bos()),
        (Some(50256), Some(50257), true)
    );
    assert_eq!(tok.encode("Hello", true).unwrap(), [50256, 15496]);
    let err = tok
        .with_hf_config(br#"{"eos_token": "Hello"}"#, None)
        .unwrap_err();
    assert!(err.to_string().contains("is not a special token"), "{err}");
}

/// A byte-level token's bytes are its raw bytes, possibly part of a character (control
/// tokens have none): joined, they decode to the decoded text.
#[test]
fn token_bytes_of_a_byte_level_vocabulary_join_to_the_text() {
    let Gpt2Variant { tok, cases, .. } = gpt2_variant("gpt2");
    for (text, ids, decoded) in cases {
        let bytes: Vec<u8> = ids
            .iter()
            .filter_map(|&id| tok.token_bytes(id))
            .flatten()
            .collect();
        assert_eq!(String::from_utf8_lossy(&bytes), decoded, "{text:?}");
    }
}
