//! GGUF byte-level BPE (`tokenizer.ggml.model = "gpt2"`): llama.cpp's vocabulary-only
//! `ggml-vocab-gpt-2.gguf` against the ids of its 46 test strings, which llama.cpp made
//! with Hugging Face `tokenizers` (tests/data/SOURCES.md).

use flm_models::import;
use flm_tests::tokenizer::llama_cpp_cases_of;
use flm_tests::{data, json};
use flm_tokenizer::Tokenizer;

use super::GPT2;

fn gpt2() -> Tokenizer {
    import::load_gguf_tokenizer(&data(GPT2)).unwrap()
}

#[test]
fn gpt2_vocab_file_encodes_all_46_cases() {
    let tok = gpt2();
    let special = (tok.vocab_size(), tok.bos_id(), tok.eos_id(), tok.add_bos());
    assert_eq!(special, (50257, Some(50256), Some(50256), false));
    for (i, (text, expected)) in llama_cpp_cases_of("gpt-2").into_iter().enumerate() {
        let got = tok.encode(&text, false).unwrap();
        assert_eq!(got, expected, "case {i}: {text:?}");
        // Byte-level BPE loses nothing: the ids decode back to the text, also streamed.
        assert_eq!(tok.decode(&got).unwrap(), text, "case {i} decodes back");
        let mut stream = tok.stream_decoder(true);
        let mut streamed: String = got.iter().map(|&id| stream.push(id).unwrap()).collect();
        streamed.push_str(&stream.finish());
        assert_eq!(streamed, text, "case {i} streamed");
    }
}

#[test]
fn gpt2_special_token_in_text_and_decoding() {
    let tok = gpt2();
    // `tokenizers` recognises added tokens in the text (gpt2_cases.json, case 46:
    // [15496, 50256, 995]); the special token decodes to nothing, as flm's control tokens do.
    let ids = tok.encode("Hello<|endoftext|> world", false).unwrap();
    assert_eq!(ids, [15496, 50256, 995]);
    assert_eq!(tok.decode(&ids).unwrap(), "Hello world");
    // A character split over tokens ("🦙" is 4 bytes, 3 tokens) is held back until complete.
    let ids = tok.encode("🦙", false).unwrap();
    assert!(ids.len() > 1);
    let mut stream = tok.stream_decoder(true);
    let parts: Vec<String> = ids.iter().map(|&id| stream.push(id).unwrap()).collect();
    assert!(
        parts[..ids.len() - 1].iter().all(String::is_empty),
        "{parts:?}"
    );
    assert_eq!(parts[ids.len() - 1], "🦙");
}

#[test]
fn gpt2_round_trips_through_the_flm_spec() {
    let tok = gpt2();
    let json = serde_json::to_string(&tok.spec()).unwrap();
    let back = Tokenizer::from_spec(serde_json::from_str(&json).unwrap()).unwrap();
    assert_eq!(back.spec(), tok.spec());
    for (text, expected) in llama_cpp_cases_of("gpt-2") {
        assert_eq!(back.encode(&text, false).unwrap(), expected, "{text:?}");
        assert_eq!(back.decode(&expected).unwrap(), text);
    }
}

/// The GGUF file with `tokenizer.ggml.pre` set to `pre`.
fn with_pre(pre: &str) -> Tokenizer {
    let mut bytes = std::fs::read(data(GPT2)).unwrap();
    // The key, the value type (string, 8), then the value "gpt-2".
    let key = b"tokenizer.ggml.pre";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4;
    let old = [&5u64.to_le_bytes()[..], b"gpt-2"].concat();
    assert_eq!(bytes[at..at + old.len()], old);
    let new = [&(pre.len() as u64).to_le_bytes()[..], pre.as_bytes()].concat();
    bytes.splice(at..at + old.len(), new);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &bytes).unwrap();
    import::load_gguf_tokenizer(file.path()).unwrap_or_else(|e| panic!("{pre}: {e}"))
}

#[test]
fn gguf_pre_tokenizer_names_select_each_familys_regex() {
    // The ids `tokenizers` gives with each family's Split regex on this vocabulary
    // (tests/data/tokenizer/gpt2/make_gpt2_cases.py); the 46 llama.cpp strings have no
    // added tokens, so they read the same from the GGUF file.
    let cases = json("tokenizer/gpt2/gpt2_cases.json");
    for (pre, variant) in [
        ("llama-bpe", "llama3"),
        ("qwen2", "qwen2"),
        ("tekken", "tekken"),
        ("smollm", "smollm"),
        ("deepseek-llm", "deepseek-llm"),
        ("qwen35", "qwen35"),
        ("jais-2", "jais-2"),
        ("exaone-moe", "exaone-moe"),
        ("spark2_5", "spark2_5"),
        ("minicpm5", "minicpm5"),
        ("ufakzeka", "ufakzeka"),
    ] {
        let tok = with_pre(pre);
        for i in 0..46 {
            let text = cases["texts"][i].as_str().unwrap();
            let want: Vec<u32> =
                serde_json::from_value(cases["variants"][variant]["ids"][i].clone()).unwrap();
            assert_eq!(
                tok.encode(text, false).unwrap(),
                want,
                "{pre} case {i}: {text:?}"
            );
        }
    }
}
