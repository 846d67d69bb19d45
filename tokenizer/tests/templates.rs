//! Real chat templates (Qwen3's, with its `<think>` handling and its `enable_thinking`
//! switch, and Gemma 2's; copies of llama.cpp's `models/templates`) rendered by flm as
//! transformers' `apply_chat_template` renders them, keyword arguments included: the texts and exception messages of `tests/data/templates/references.json`,
//! written by `tools/templates/render_references.py` with transformers.

use flm_tests::tokenizer::load;
use flm_tests::{data, json};
use flm_tokenizer::{Message, TemplateArgs, Tokenizer};

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
    assert!(cases.len() >= 13);
    let mut with_args = 0;
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
        let args: TemplateArgs = case["kwargs"].as_object().unwrap().clone();
        with_args += usize::from(!args.is_empty());
        let got = tok.encode_chat_with_args(&messages, gen, &args);
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
    assert!(
        with_args >= 4,
        "the references hold {with_args} cases with kwargs"
    );
}

/// `enable_thinking=false` changes Qwen3's prompt (so the comparison above has teeth).
#[test]
fn qwen3_thinking_switch_changes_the_prompt() {
    let template = std::fs::read_to_string(data("templates/Qwen-Qwen3-0.6B.jinja")).unwrap();
    let tok = with_template(&template);
    let messages = [Message::new("user", "Hello")];
    let mut args = TemplateArgs::new();
    args.insert("enable_thinking".into(), false.into());
    let off = tok.encode_chat_with_args(&messages, true, &args).unwrap();
    let default = tok.encode_chat(&messages, true).unwrap();
    assert_eq!(off.text, format!("{}<think>\n\n</think>\n\n", default.text));
    assert!(off.ids.len() > default.ids.len());
}
