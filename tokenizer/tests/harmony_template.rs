//! gpt-oss's harmony chat template (llama.cpp's copy, `openai-gpt-oss-120b.jinja`) rendered
//! by flm as transformers' `apply_chat_template` renders it: system, developer and
//! multi-turn conversations, assistant turns with `thinking` or OpenAI's
//! `reasoning_content`, tool calls and tool replies, `reasoning_effort`, `model_identity`
//! and `builtin_tools` as keyword arguments, and the template's own exceptions; the texts
//! and their ids (Hugging Face `tokenizers` on o200k_harmony) of
//! `tests/data/templates/gpt-oss-references.json`, written by
//! `tools/templates/render_gpt_oss.py` with `strftime_now` pinned to 2025-08-05.

use flm_tests::tokenizer::xz;
use flm_tests::{data, ids, json};
use flm_tokenizer::{Message, TemplateArgs, Tokenizer};

/// o200k_harmony carrying gpt-oss's template, its clock fixed at `now` (Unix seconds).
fn gpt_oss(now: i64) -> Tokenizer {
    let tok = Tokenizer::from_bytes(&xz("tokenizer/o200k-harmony/tokenizer.json.xz")).unwrap();
    let template = std::fs::read_to_string(data("templates/openai-gpt-oss-120b.jinja")).unwrap();
    let mut tok = tok.with_chat_template(Some(template), "test").unwrap();
    tok.set_template_time(Some(now));
    tok
}

#[test]
fn harmony_template_renders_as_transformers() {
    let refs = json("templates/gpt-oss-references.json");
    let tok = gpt_oss(refs["now_unix_utc"].as_i64().unwrap());
    let cases = refs["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 12);
    let (mut rendered, mut refused) = (0, 0);
    for (i, case) in cases.iter().enumerate() {
        let messages = case["messages"].as_array().unwrap();
        let tools = Some(&case["tools"]).filter(|t| !t.is_null());
        let gen = case["add_generation_prompt"].as_bool().unwrap();
        let args: TemplateArgs = case["kwargs"].as_object().unwrap().clone();
        let got = tok.encode_chat_with_tools(messages, tools, gen, &args);
        match (case["text"].as_str(), case["error"].as_str()) {
            (Some(want), _) => {
                let got = got.unwrap_or_else(|e| panic!("case {i}: {e}"));
                assert_eq!(got.text, want, "case {i}");
                assert_eq!(got.ids, ids(&case["ids"]), "case {i}: ids");
                rendered += 1;
            }
            (None, Some(why)) => {
                let err = got.unwrap_err().to_string();
                assert!(err.contains(why), "case {i}: {err}");
                refused += 1;
            }
            (None, None) => panic!("case {i}: neither text nor error"),
        }
    }
    assert_eq!((rendered, refused), (10, 2));
}

/// `reasoning_effort` given as a template argument (`flm chat --template-arg
/// reasoning_effort=high`, the server's `chat_template_kwargs`) through the plain message
/// API, and the date of `strftime_now`.
#[test]
fn reasoning_effort_and_date_reach_the_system_message() {
    // 2026-01-02 03:04:05 UTC.
    let tok = gpt_oss(1_767_323_045);
    let messages = [Message::new("user", "Hi")];
    let mut args = TemplateArgs::new();
    let default = tok.encode_chat_with_args(&messages, true, &args).unwrap();
    assert!(default
        .text
        .contains("Current date: 2026-01-02\n\nReasoning: medium\n\n"));
    for effort in ["low", "high"] {
        args.insert("reasoning_effort".into(), effort.into());
        let prompt = tok.encode_chat_with_args(&messages, true, &args).unwrap();
        assert_eq!(
            prompt.text,
            default
                .text
                .replace("Reasoning: medium", &format!("Reasoning: {effort}"))
        );
        assert!(prompt
            .text
            .ends_with("<|start|>user<|message|>Hi<|end|><|start|>assistant"));
    }
}
