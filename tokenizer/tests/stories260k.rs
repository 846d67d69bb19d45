//! stories260K's 512-token tokenizer in its three forms (SentencePiece `tok512.model`,
//! llama2.c `tok512.bin`, HF `tokenizer.json`) against `stories260K_reference.json`
//! (sentencepiece 0.2.3 encodings, and the text llama2.c prints for the greedy run).

use flm_tests::tokenizer::{load, stream};
use flm_tests::{ids, json};

const FILES: [&str; 3] = [
    "stories260K/tok512.model",
    "stories260K/tok512.bin",
    "hf-stories260K/tokenizer.json",
];

fn reference() -> serde_json::Value {
    json("stories260K/stories260K_reference.json")
}

#[test]
fn encode_cases() {
    let cases = reference()["tok512_encode_cases"].clone();
    let cases = cases.as_object().unwrap();
    assert_eq!(cases.len(), 5);
    for file in FILES {
        let tok = load(file);
        for (text, expected) in cases {
            assert_eq!(
                tok.encode(text, false).unwrap(),
                ids(expected),
                "{file}: {text:?}"
            );
        }
    }
}

#[test]
fn encode_prompt_with_bos() {
    let r = reference();
    let prompt = r["greedy_prompt"]["prompt"].as_str().unwrap();
    for file in FILES {
        let tok = load(file);
        let input = ids(&r["greedy_prompt"]["input_ids"]);
        assert_eq!(tok.encode(prompt, true).unwrap(), input, "{file}");
    }
}

#[test]
fn greedy_outputs_decode_to_the_reference_text() {
    let r = reference();
    let from_bos = &r["greedy_from_bos"];
    let out = ids(&from_bos["output_ids"]);
    let text = from_bos["output_text"].as_str().unwrap();
    let prompt = &r["greedy_prompt"];
    let mut prompted = ids(&prompt["input_ids"])[1..].to_vec();
    prompted.extend(ids(&prompt["output_ids"]));
    let prompted_text = prompt["output_text"].as_str().unwrap();
    for file in FILES {
        let tok = load(file);
        assert_eq!(tok.decode(&out).unwrap(), text, "{file}");
        assert_eq!(stream(&tok, &out, true).concat(), text, "{file} streamed");
        assert_eq!(tok.decode(&prompted).unwrap(), prompted_text, "{file}");
        assert_eq!(
            stream(&tok, &prompted, true).concat(),
            prompted_text,
            "{file} streamed"
        );
    }
}

#[test]
fn round_trip() {
    let cases = reference()["tok512_encode_cases"].clone();
    for file in FILES {
        let tok = load(file);
        for text in cases.as_object().unwrap().keys() {
            let ids = tok.encode(text, false).unwrap();
            assert_eq!(&tok.decode(&ids).unwrap(), text, "{file}");
        }
    }
}

#[test]
fn same_vocabulary_in_all_three_files() {
    let toks: Vec<_> = FILES.iter().map(|f| load(f)).collect();
    for tok in &toks {
        assert_eq!(tok.vocab_size(), 512);
        assert_eq!(tok.bos_id(), Some(1));
        assert_eq!(tok.eos_id(), Some(2));
    }
    for id in 0..512 {
        assert_eq!(toks[0].piece(id), toks[1].piece(id), "id {id}");
        assert_eq!(toks[0].piece(id), toks[2].piece(id), "id {id}");
    }
}

#[test]
fn model_removes_extra_whitespace() {
    // tok512.model has remove_extra_whitespaces=true (SentencePiece collapses runs and
    // trims); llama2.c's .bin and the HF tokenizer.json do not (SOURCES.md caveat).
    let model = load(FILES[0]);
    let plain = model.encode("Once upon a time", false).unwrap();
    assert_eq!(
        model.encode("  Once   upon a time  ", false).unwrap(),
        plain
    );
    assert_eq!(model.encode("   ", false).unwrap(), Vec::<u32>::new());
    let bin = load(FILES[1]);
    assert_ne!(bin.encode("  Once   upon a time  ", false).unwrap(), plain);
}

/// A token's bytes, joined, are the text decoded mid-text; BOS has none; a byte piece is
/// its byte (so a character of several byte pieces is spelled by their bytes).
#[test]
fn token_bytes_join_to_the_text_decoded_mid_text() {
    let out = ids(&reference()["greedy_from_bos"]["output_ids"]);
    for file in FILES {
        let tok = load(file);
        let bytes: Vec<u8> = out
            .iter()
            .flat_map(|&id| tok.token_bytes(id).unwrap())
            .collect();
        let text = stream(&tok, &out, false).concat();
        assert_eq!(String::from_utf8(bytes).unwrap(), text, "{file}");
        assert_eq!(tok.token_bytes(tok.bos_id().unwrap()), None, "{file}");
        let ff = tok.encode("ÿ", false).unwrap();
        let spelled: Vec<u8> = ff
            .iter()
            .flat_map(|&id| tok.token_bytes(id).unwrap())
            .collect();
        assert_eq!(spelled, " ÿ".as_bytes(), "{file}: {ff:?}");
        assert_eq!(tok.token_bytes(tok.vocab_size() as u32), None);
    }
}
