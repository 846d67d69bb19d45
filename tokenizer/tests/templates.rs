//! Real chat templates (Qwen3's, with its `<think>` handling, and Gemma 2's; copies of
//! llama.cpp's `models/templates`) rendered by flm as transformers' `apply_chat_template`
//! renders them: the texts and exception messages of `tests/data/templates/references.json`,
//! written by `tools/templates/render_references.py` with transformers.

mod common;

use common::{data, json, load};
use flm_tokenizer::{Message, Tokenizer};

/// The Llama 2 tokenizer (`<s>`, `</s>`, as the references were rendered with) carrying
/// `template`.
fn with_template(template: &str) -> Tokenizer {
    let mut spec = load("tokenizer/tokenizer.model").spec();
    spec.chat_template = Some(template.to_string());
    Tokenizer::from_spec(spec).unwrap()
}

#[test]
fn qwen3_and_gemma2_templates_render_as_transformers() {
    let refs = json("templates/references.json");
    let cases = refs["cases"].as_array().unwrap();
    assert!(cases.len() >= 9);
    for (i, case) in cases.iter().enumerate() {
        let file = case["template"].as_str().unwrap();
        let template = std::fs::read_to_string(data(&format!("templates/{file}"))).unwrap();
        let tok = with_template(&template);
        let messages: Vec<Message> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let gen = case["add_generation_prompt"].as_bool().unwrap();
        let got = tok.encode_chat(&messages, gen);
        match (case["text"].as_str(), case["error"].as_str()) {
            (Some(want), _) => {
                let got = got.unwrap_or_else(|e| panic!("case {i} ({file}): {e}"));
                assert_eq!(got.text, want, "case {i} ({file})");
            }
            (None, Some(why)) => {
                let err = got.unwrap_err().to_string();
                assert!(err.contains(why), "case {i} ({file}): {err}");
            }
            (None, None) => panic!("case {i}: neither text nor error"),
        }
    }
}
