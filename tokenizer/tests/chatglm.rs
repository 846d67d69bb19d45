//! ChatGLM2/3 and GLM-4 tokenizers and chat prompts against independent golden ids:
//! chatglm.cpp's `Pipeline.ChatGLM2` / `Pipeline.ChatGLM3` tests
//! (`chatglm/tokenizers/chatglm2_chatglm3_tokenizer_cases.json`) and OpenAI's `tiktoken`
//! on a hand-made ranks file (`glm4_small_cases.json`, `make_glm4_cases.py`).

use flm_tests::tokenizer::load;
use flm_tests::{data, ids, json};
use flm_tokenizer::{ChatFormat, Message, PieceType, Tokenizer, TokenizerKind, TokenizerSpec};

const CASES: &str = "chatglm/tokenizers/chatglm2_chatglm3_tokenizer_cases.json";
const MODEL: &str = "chatglm/tokenizers/chatglm2_tokenizer.model";

fn chatglm(format: ChatFormat) -> Tokenizer {
    load(MODEL).into_chatglm(format).unwrap()
}

fn round_trip(tok: &Tokenizer) -> Tokenizer {
    let text = serde_json::to_string(&tok.spec()).unwrap();
    let spec: TokenizerSpec = serde_json::from_str(&text).unwrap();
    Tokenizer::from_spec(spec).unwrap()
}

fn messages(v: &serde_json::Value) -> Vec<Message> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn special_ids_follow_the_vocabulary() {
    let cases = json(CASES);
    let glm3 = chatglm(ChatFormat::ChatGlm3);
    let glm2 = chatglm(ChatFormat::ChatGlm2);
    assert_eq!(glm2.vocab_size(), 64789 + 5);
    assert_eq!(glm3.vocab_size(), 64789 + 9);
    for (name, id) in cases["special_ids"].as_object().unwrap() {
        let id = id.as_u64().unwrap() as u32;
        assert_eq!(glm3.special_id(name), Some(id), "{name}");
        assert_eq!(round_trip(&glm3).special_id(name), Some(id), "{name}");
        if id < 64794 {
            assert_eq!(glm2.special_id(name), Some(id), "{name}");
        }
        // Special tokens decode to nothing, as control pieces do.
        assert_eq!(glm3.decode(&[id]).unwrap(), "");
    }
    // The appended tokenizer is what its description rebuilds.
    assert_eq!(round_trip(&glm3).spec(), glm3.spec());
    assert_eq!(glm2.prefix(), [64790, 64792]);
    assert_eq!((glm3.bos_id(), glm3.eos_id()), (Some(1), Some(2)));
    assert_eq!(glm3.chat_stop_ids(), [2, 64795, 64797]);
    assert_eq!(glm2.chat_stop_ids(), [2]);
}

#[test]
fn chatglm2_encode_cases() {
    let cases = json(CASES);
    for tok in [chatglm(ChatFormat::ChatGlm2), chatglm(ChatFormat::ChatGlm3)] {
        let back = round_trip(&tok);
        for case in cases["chatglm2_encode"]["cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let expected = ids(&case["ids"]);
            assert_eq!(tok.encode(text, true).unwrap(), expected, "{text:?}");
            assert_eq!(back.encode(text, true).unwrap(), expected, "{text:?}");
            assert_eq!(tok.decode(&expected).unwrap(), text);
        }
    }
}

#[test]
fn chatglm2_round_prompts() {
    // The second and third encode cases are ChatGLM2's prompts for one and two rounds.
    let cases = json(CASES);
    let cases = cases["chatglm2_encode"]["cases"].as_array().unwrap();
    let tok = round_trip(&chatglm(ChatFormat::ChatGlm2));
    let first = [Message::new("user", "你好")];
    let prompt = tok.encode_chat(&first, true).unwrap();
    assert_eq!(prompt.ids, ids(&cases[1]["ids"]));
    assert_eq!(
        prompt.text,
        format!("[gMASK]sop{}", cases[1]["text"].as_str().unwrap())
    );
    let second = [
        Message::new("user", "你好"),
        Message::new(
            "assistant",
            "你好👋！我是人工智能助手 ChatGLM2-6B，很高兴见到你，欢迎问我任何问题。",
        ),
        Message::new("user", "晚上睡不着应该怎么办"),
    ];
    assert_eq!(
        tok.encode_chat(&second, true).unwrap().ids,
        ids(&cases[2]["ids"])
    );
    assert_chat_refused(&tok, "system", "alternate");
}

/// Encoding the chat of one message "x" from `role` fails with an error containing `why`.
fn assert_chat_refused(tok: &Tokenizer, role: &str, why: &str) {
    let err = tok
        .encode_chat(&[Message::new(role, "x")], true)
        .unwrap_err();
    assert!(err.to_string().contains(why), "{err}");
}

#[test]
fn chatglm3_chat_template_cases() {
    let cases = json(CASES);
    let tok = chatglm(ChatFormat::ChatGlm3);
    for t in [round_trip(&tok), tok] {
        for case in cases["chatglm3_chat_template"]["cases"].as_array().unwrap() {
            let prompt = t.encode_chat(&messages(&case["messages"]), true).unwrap();
            assert_eq!(prompt.ids, ids(&case["ids"]));
        }
        assert_chat_refused(&t, "robot", "robot");
    }
    // A description claiming ChatGLM3's format without its role tokens.
    let mut spec = chatglm(ChatFormat::ChatGlm2).spec();
    spec.chat_format = Some(ChatFormat::ChatGlm3);
    let tok = Tokenizer::from_spec(spec).unwrap();
    assert_chat_refused(&tok, "user", "no <|user|> token");
}

#[test]
fn chatglm3_replies_are_kept_as_generated() {
    // The ids between the first <|assistant|> and the next <|user|> of the two-round case
    // are the reply as the model generates it: metadata line, then content.
    let cases = json(CASES);
    let case = &cases["chatglm3_chat_template"]["cases"][1];
    let ids = ids(&case["ids"]);
    let tok = chatglm(ChatFormat::ChatGlm3);
    let start = ids.iter().position(|&id| id == 64796).unwrap() + 1;
    let end = start + ids[start..].iter().position(|&id| id == 64795).unwrap();
    let text = tok.decode(&ids[start..end]).unwrap();
    let content = case["messages"][1]["content"].as_str().unwrap();
    assert_eq!(text, format!("\n {content}"));
    assert_eq!(tok.chat_reply_content(&text), content);
    assert_eq!(tok.chat_reply_content("tool_name\n{}"), "tool_name\n{}");
    let glm2 = chatglm(ChatFormat::ChatGlm2);
    assert_eq!(glm2.chat_reply_content(&text), text);
}

/// The same ids through a Jinja template of the shape of chatglm3-6b's
/// `tokenizer_config.json` one (the role tokens written as text and recognised as special
/// tokens, " " standing for SentencePiece's dummy prefix).
#[test]
fn chatglm3_through_a_jinja_template() {
    let cases = json(CASES);
    let mut spec = chatglm(ChatFormat::ChatGlm3).spec();
    spec.chat_format = None;
    spec.chat_template = Some(
        "{% for message in messages %}{% if loop.first %}[gMASK]sop<|{{ message['role'] }}|>\n \
         {{ message['content'] }}{% else %}<|{{ message['role'] }}|>\n \
         {{ message['content'] }}{% endif %}{% endfor %}\
         {% if add_generation_prompt %}<|assistant|>{% endif %}"
            .into(),
    );
    let tok = Tokenizer::from_spec(spec).unwrap();
    for case in cases["chatglm3_chat_template"]["cases"].as_array().unwrap() {
        let prompt = tok.encode_chat(&messages(&case["messages"]), true).unwrap();
        assert_eq!(prompt.ids, ids(&case["ids"]), "{:?}", prompt.text);
    }
}

fn glm4() -> Tokenizer {
    load("chatglm/tokenizers/glm4_small.tiktoken")
}

#[test]
fn glm4_byte_level_bpe_matches_tiktoken() {
    let golden = json("chatglm/tokenizers/glm4_small_cases.json");
    let tok = glm4();
    let back = round_trip(&tok);
    for case in golden["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let expected = ids(&case["ids"]);
        assert_eq!(tok.encode(text, false).unwrap(), expected, "{text:?}");
        assert_eq!(back.encode(text, false).unwrap(), expected, "{text:?}");
        assert_eq!(tok.decode(&expected).unwrap(), text);
        // Streamed one id at a time, characters split over tokens come out whole.
        let mut stream = tok.stream_decoder(true);
        let mut streamed: String = expected
            .iter()
            .map(|&id| stream.push(id).unwrap())
            .collect();
        streamed += &stream.finish();
        assert_eq!(streamed, text);
    }
    for case in golden["with_specials"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(tok.encode_with_specials(text).unwrap(), ids(&case["ids"]));
    }
    for (name, id) in golden["special_ids"].as_object().unwrap() {
        assert_eq!(tok.special_id(name), Some(id.as_u64().unwrap() as u32));
    }
}

#[test]
fn glm4_chat_prompt() {
    let golden = json("chatglm/tokenizers/glm4_small_cases.json");
    let special = |name: &str| golden["special_ids"][name].as_u64().unwrap() as u32;
    let tok = glm4();
    assert_eq!(tok.chat_format(), Some(ChatFormat::Glm4));
    assert_eq!(tok.prefix(), [special("[gMASK]"), special("<sop>")]);
    assert_eq!(tok.eos_id(), Some(special("<|endoftext|>")));
    // chatglm.cpp ChatGLM4Tokenizer: prefix, then <|role|> + encode("\n") + encode(content).
    let prompt = tok
        .encode_chat(&[Message::new("user", "hello")], true)
        .unwrap();
    let mut expected = vec![special("[gMASK]"), special("<sop>"), special("<|user|>")];
    expected.extend(tok.encode("\n", false).unwrap());
    expected.extend(tok.encode("hello", false).unwrap());
    expected.push(special("<|assistant|>"));
    assert_eq!(prompt.ids, expected);
    assert_eq!(prompt.text, "[gMASK]<sop><|user|>\nhello<|assistant|>");
    // The golden ids of the same prompt written out with its special tokens.
    let with_specials = ids(&golden["with_specials"][0]["ids"]);
    assert_eq!(prompt.ids, with_specials);
    assert_eq!(
        tok.chat_stop_ids(),
        [
            special("<|endoftext|>"),
            special("<|user|>"),
            special("<|observation|>")
        ]
    );
}

#[test]
fn glm4_rejects_bad_rank_files() {
    let bad = |text: &str| {
        Tokenizer::from_bytes(text.as_bytes())
            .unwrap_err()
            .to_string()
    };
    assert!(bad("IQ== 0\nIg== 2\n").contains("skip rank 1"));
    assert!(bad("IQ== 0\nIg== 0\n").contains("twice"));
    assert!(bad("IQ== 0\nnot-base64! 1\n").contains("line 2"));
    // Ranks 0..2 exist but most single bytes do not.
    assert!(bad("IQ== 0\nIg== 1\n").contains("single byte"));
    let path = data("chatglm/tokenizers/glm4_small.tiktoken");
    let mut text = std::fs::read_to_string(path).unwrap();
    // A huge rank is refused without allocating a table up to it.
    text.push_str("YWJj 99999999999999999\n");
    let err = Tokenizer::from_bytes(text.as_bytes()).unwrap_err();
    assert!(err.to_string().contains("skip rank 283"), "{err}");
}

#[test]
fn tokenizer_config_json_makes_the_chatglm_tokenizer() {
    let cases = json(CASES);
    let config = br#"{"tokenizer_class": "ChatGLMTokenizer", "remove_space": false}"#;
    // ChatGLM3's tokenization_chatglm.py names its role tokens; ChatGLM2's does not.
    let glm3_py = b"role_special_tokens = [\"<|system|>\", \"<|user|>\", \"<|assistant|>\", \
                    \"<|observation|>\"]";
    let glm3 = load(MODEL).with_hf_config(config, Some(glm3_py)).unwrap();
    assert_eq!(glm3.chat_format(), Some(ChatFormat::ChatGlm3));
    let case = &cases["chatglm3_chat_template"]["cases"][0];
    let prompt = glm3
        .encode_chat(&messages(&case["messages"]), true)
        .unwrap();
    assert_eq!(prompt.ids, ids(&case["ids"]));
    let glm2 = load(MODEL).with_hf_config(config, None).unwrap();
    assert_eq!(glm2.chat_format(), Some(ChatFormat::ChatGlm2));
    assert_eq!(glm2.vocab_size(), 64789 + 5);
    // Other tokenizers only take the template.
    let llama = br#"{"tokenizer_class": "LlamaTokenizer", "chat_template": "{{ bos_token }}"}"#;
    let tok = load("stories260K/tok512.model")
        .with_hf_config(llama, None)
        .unwrap();
    assert_eq!(tok.chat_format(), None);
    let prompt = tok.encode_chat(&[Message::new("user", "x")], true).unwrap();
    assert_eq!((prompt.text.as_str(), prompt.ids), ("<s>", vec![1]));
    assert!(load(MODEL).with_hf_config(b"[]", None).is_err());
}

#[test]
fn bad_descriptions_are_refused() {
    let mut spec = glm4().spec();
    spec.prefix = Some(vec![u32::MAX]);
    let err = Tokenizer::from_spec(spec).unwrap_err().to_string();
    assert!(err.contains("prefix token"), "{err}");
    let mut spec = glm4().spec();
    if let TokenizerKind::ByteLevelBpe(b) = &mut spec.kind {
        b.pattern = "(unclosed".into();
    }
    let err = Tokenizer::from_spec(spec).unwrap_err().to_string();
    assert!(err.contains("pattern"), "{err}");
    let mut spec = glm4().spec();
    spec.types[260] = PieceType::Unused;
    assert!(Tokenizer::from_spec(spec).is_err());
    let mut spec = glm4().spec();
    spec.unk_id = Some(0);
    assert!(Tokenizer::from_spec(spec).is_err());
    // A second [gMASK] cannot be appended.
    let twice = chatglm(ChatFormat::ChatGlm2).into_chatglm(ChatFormat::ChatGlm2);
    assert!(twice
        .unwrap_err()
        .to_string()
        .contains("already has a piece"));
    assert!(glm4().into_chatglm(ChatFormat::ChatGlm3).is_err());
}
