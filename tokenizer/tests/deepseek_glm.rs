//! The tokenizers and chat templates DeepSeek-V2, DeepSeek-V3, DeepSeek-R1 and DeepSeek-V3.1
//! ship, and those of the GLM-4.5 family (GLM-4.5V's `tokenizer.json`, `tokenizer_config.json`
//! and `chat_template.jinja`, and GLM-4.6's template): the real files
//! (`tests/data/tokenizer/deepseek-glm`, provenance in its SOURCES.md), loaded as a Hugging
//! Face model directory is loaded
//! (`Tokenizer::from_file_with_hf_config`), against what Hugging Face `tokenizers` and
//! `transformers` give (`references.json`, written by `make_refs.py` there): the ids and
//! decoding of 69 texts (llama.cpp's 46 test strings, its pre-tokenizer hash text, code,
//! digit runs, CJK, Japanese, Korean, emoji, whitespace and newline runs, spelled special
//! tokens), the special tokens, and the rendered chat prompts (with DeepSeek-V3.1's
//! `thinking` and GLM's `enable_thinking`, tool calls and tool results) and their ids.
//! The same vocabularies as llama.cpp's converter writes them into GGUF files, with the
//! `tokenizer.ggml.pre` it names them by (`deepseek-llm`, `deepseek-v3`, `glm4`), give the
//! same ids.
//!
//! Under an emulator (`.ci/run`'s aarch64 runs) these tests return at once: decompressing
//! and loading the four vocabularies (33 MB of JSON) would take minutes there, and the
//! tokenizer has no code of its own per architecture (as `long_inputs.rs` is skipped).

use std::path::PathBuf;
use std::sync::OnceLock;

use flm_tests::tokenizer::{
    deepseek_glm_hf_dir, deepseek_glm_tokenizer_json, gguf_of_tokenizer_json, stream,
};
use flm_tests::{emulated, ids, json};
use flm_tokenizer::{TemplateArgs, Tokenizer};
use serde_json::Value;

/// The models whose tokenizers the references hold.
const MODELS: [&str; 4] = ["deepseek-v2", "deepseek-v3", "deepseek-r1", "glm-4.5v"];

fn refs() -> &'static Value {
    static REFS: OnceLock<Value> = OnceLock::new();
    REFS.get_or_init(|| json("tokenizer/deepseek-glm/references.json"))
}

/// The Hugging Face directory of model (or template) `name`, made in this test binary's
/// scratch directory; the path of its `tokenizer.json`.
fn hf_dir(name: &str) -> PathBuf {
    deepseek_glm_hf_dir(
        name,
        &PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("deepseek-glm"),
    )
}

/// The tokenizer of `name` as the model loader reads its directory, loaded once.
fn tok(name: &str) -> &'static Tokenizer {
    static TOKS: [OnceLock<Tokenizer>; 6] = [const { OnceLock::new() }; 6];
    let names = [MODELS.as_slice(), &["deepseek-v3.1", "glm-4.6"]].concat();
    let i = names.iter().position(|n| *n == name).unwrap();
    TOKS[i].get_or_init(|| {
        let path = hf_dir(name);
        Tokenizer::from_file_with_hf_config(&path).unwrap_or_else(|e| panic!("{name}: {e}"))
    })
}

/// The texts of the references, with (ids, decoded, decoded with the special tokens) per
/// text for `model`.
fn cases(model: &str) -> Vec<(String, Vec<u32>, String, String)> {
    let r = refs();
    let m = &r["models"][model];
    let texts = r["texts"].as_array().unwrap();
    assert_eq!(texts.len(), 69);
    (0..texts.len())
        .map(|i| {
            (
                texts[i].as_str().unwrap().to_owned(),
                ids(&m["ids"][i]),
                m["decoded"][i].as_str().unwrap().to_owned(),
                m["decoded_with_specials"][i].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn check_ids(model: &str, tok: &Tokenizer) {
    for (i, (text, expected, decoded, _)) in cases(model).iter().enumerate() {
        assert_eq!(
            &tok.encode(text, false).unwrap(),
            expected,
            "{model} text {i}: {text:?}"
        );
        assert_eq!(
            &tok.decode(expected).unwrap(),
            decoded,
            "{model} text {i} decodes"
        );
    }
}

#[test]
fn deepseek_v2_ids_match_tokenizers() {
    if emulated() {
        return;
    }
    check_ids("deepseek-v2", tok("deepseek-v2"));
}

#[test]
fn deepseek_v3_ids_match_tokenizers() {
    if emulated() {
        return;
    }
    check_ids("deepseek-v3", tok("deepseek-v3"));
}

#[test]
fn deepseek_r1_ids_match_tokenizers() {
    if emulated() {
        return;
    }
    check_ids("deepseek-r1", tok("deepseek-r1"));
}

#[test]
fn glm_4_5v_ids_match_tokenizers() {
    if emulated() {
        return;
    }
    check_ids("glm-4.5v", tok("glm-4.5v"));
}

/// Decoding one id at a time gives the whole decoding, and the text of every id, special
/// tokens spelled out, joins to what `tokenizers` decodes without skipping them.
#[test]
fn streamed_decoding_and_token_bytes_join_to_the_text() {
    if emulated() {
        return;
    }
    for model in MODELS {
        let tok = tok(model);
        for (text, ids, decoded, with_specials) in cases(model) {
            assert_eq!(
                stream(tok, &ids, true).concat(),
                decoded,
                "{model}: {text:?}"
            );
            let bytes: Vec<u8> = ids
                .iter()
                .flat_map(|&id| tok.piece(id).unwrap().to_vec())
                .collect();
            assert_eq!(
                String::from_utf8_lossy(&bytes),
                with_specials,
                "{model}: {text:?}"
            );
        }
        assert_eq!(
            tok.vocab_size() as u64,
            refs()["models"][model]["vocab_size"].as_u64().unwrap(),
            "{model}"
        );
    }
}

/// Plain text round-trips through encode and decode.
#[test]
fn plain_text_round_trips() {
    if emulated() {
        return;
    }
    let texts = refs()["texts"].as_array().unwrap();
    for model in MODELS {
        let tok = tok(model);
        for t in texts.iter().map(|t| t.as_str().unwrap()) {
            if !t.contains('<') && !t.contains("[gMASK]") {
                let ids = tok.encode(t, false).unwrap();
                assert_eq!(tok.decode(&ids).unwrap(), t, "{model}");
            }
        }
    }
}

#[test]
fn special_tokens_are_recognised() {
    if emulated() {
        return;
    }
    let one = |tok: &Tokenizer, text: &str| tok.encode(text, false).unwrap();
    for (model, bos, eos) in [("deepseek-v2", 100000, 100001), ("deepseek-v3", 0, 1)] {
        let tok = tok(model);
        assert_eq!(
            (tok.bos_id(), tok.eos_id()),
            (Some(bos), Some(eos)),
            "{model}"
        );
        assert!(tok.add_bos(), "{model}");
        assert_eq!(one(tok, "<｜begin▁of▁sentence｜>"), [bos]);
        assert_eq!(one(tok, "<｜end▁of▁sentence｜>"), [eos]);
        assert_eq!(tok.encode("hi", true).unwrap()[0], bos);
        assert_eq!(tok.chat_stop_ids(), [eos]);
        // Control tokens decode to nothing.
        assert_eq!(tok.decode(&[bos, eos]).unwrap(), "");
    }
    // V3's chat and tool tokens; R1's <think> and </think> (ids 128798 and 128799, V3's
    // placeholders) are added tokens that are not special: they decode as text.
    let v3 = tok("deepseek-v3");
    assert_eq!(one(v3, "<｜User｜><｜Assistant｜>"), [128803, 128804]);
    assert_eq!(one(v3, "<｜tool▁calls▁begin｜>"), [128806]);
    let r1 = tok("deepseek-r1");
    assert_eq!(one(r1, "<think>\n</think>"), [128798, 201, 128799]);
    assert_eq!(
        r1.decode(&[128798, 201, 128799]).unwrap(),
        "<think>\n</think>"
    );
    assert_ne!(one(v3, "<think>"), [128798]);

    let glm = tok("glm-4.5v");
    assert_eq!((glm.bos_id(), glm.eos_id()), (None, Some(151329)));
    assert_eq!(glm.vocab_size(), 151365);
    for (text, id) in [
        ("<|endoftext|>", 151329),
        ("[gMASK]", 151331),
        ("<sop>", 151333),
        ("<|system|>", 151335),
        ("<|user|>", 151336),
        ("<|assistant|>", 151337),
        ("<|observation|>", 151338),
        ("<think>", 151350),
        ("</think>", 151351),
        ("<tool_call>", 151352),
        ("/nothink", 151360),
    ] {
        assert_eq!(one(glm, text), [id], "{text}");
    }
    // <think> is not special: decoded as text; <|user|> is: decoded as nothing.
    assert_eq!(glm.decode(&[151350, 151336]).unwrap(), "<think>");
}

/// The chat prompts of the references: rendered by flm from the template the model
/// directory carries, the text byte for byte and the ids as `tokenizers` encodes that text.
#[test]
fn chat_templates_render_as_transformers() {
    if emulated() {
        return;
    }
    let chats = refs()["chats"].as_array().unwrap();
    assert_eq!(chats.len(), 27);
    let (mut with_args, mut with_tools) = (0, 0);
    for (i, case) in chats.iter().enumerate() {
        let name = case["template"].as_str().unwrap();
        let tok = tok(name);
        assert!(tok.chat_template().is_some(), "{name} has a template");
        let messages = case["messages"].as_array().unwrap();
        let args: TemplateArgs = case["kwargs"].as_object().unwrap().clone();
        let tools = Some(&case["tools"]).filter(|t| !t.is_null());
        with_args += usize::from(!args.is_empty());
        with_tools += usize::from(tools.is_some());
        let gen = case["add_generation_prompt"].as_bool().unwrap();
        let got = tok
            .encode_chat_with_tools(messages, tools, gen, &args)
            .unwrap_or_else(|e| panic!("case {i} ({name}): {e}"));
        assert_eq!(
            got.text,
            case["text"].as_str().unwrap(),
            "case {i} ({name})"
        );
        if let Some(expected) = case.get("ids") {
            assert_eq!(got.ids, ids(expected), "case {i} ({name}) ids");
        }
    }
    assert!(
        with_args >= 7 && with_tools >= 2,
        "{with_args} {with_tools}"
    );
}

/// GLM-4.5's (and GLM-4.5V's) template lives in `chat_template.jinja`, not in
/// `tokenizer_config.json`: the loader reads it there, and it takes the place of a config's
/// template, as transformers does.
#[test]
fn chat_template_jinja_beside_the_config_is_read() {
    if emulated() {
        return;
    }
    let glm = tok("glm-4.5v");
    let file = std::fs::read_to_string(hf_dir("glm-4.5v").with_file_name("chat_template.jinja"));
    assert_eq!(glm.chat_template(), Some(file.unwrap().as_str()));
    let glm46 = tok("glm-4.6");
    assert_ne!(glm46.chat_template(), glm.chat_template());
    // A config with a template of its own, beside a chat_template.jinja.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("deepseek-glm-precedence");
    let path = deepseek_glm_hf_dir("glm-4.6", &dir);
    let mut config: Value = serde_json::from_slice(
        &std::fs::read(path.with_file_name("tokenizer_config.json")).unwrap(),
    )
    .unwrap();
    config["chat_template"] = "{{ 'from the config' }}".into();
    std::fs::write(
        path.with_file_name("tokenizer_config.json"),
        serde_json::to_vec(&config).unwrap(),
    )
    .unwrap();
    let tok = Tokenizer::from_file_with_hf_config(&path).unwrap();
    assert_eq!(tok.chat_template(), glm46.chat_template());
    std::fs::remove_file(path.with_file_name("chat_template.jinja")).unwrap();
    let tok = Tokenizer::from_file_with_hf_config(&path).unwrap();
    assert_eq!(tok.chat_template(), Some("{{ 'from the config' }}"));
}

/// The vocabularies as GGUF files hold them, with the pre-tokenizer names llama.cpp's
/// converter gives them (`convert_hf_to_gguf.py` `get_vocab_base_pre`: DeepSeek-LLM's and
/// DeepSeek-V2's tokenizer hash is `deepseek-llm`, DeepSeek-V3's `deepseek-v3`, GLM-4's and
/// GLM-4.5's `glm4`), encode as `tokenizers` does. DeepSeek-V2's file isolates single digits
/// (`Digits`), where llama.cpp cuts runs of digits (`\p{N}+`): its merges join no digits, so
/// the ids agree.
#[test]
fn gguf_pre_tokenizers_match_tokenizers() {
    if emulated() {
        return;
    }
    for (model, pre) in [
        ("deepseek-v2", "deepseek-llm"),
        ("deepseek-v3", "deepseek-v3"),
        ("deepseek-r1", "deepseek-v3"),
        ("glm-4.5v", "glm4"),
    ] {
        let tok = gguf_of_tokenizer_json(&deepseek_glm_tokenizer_json(model), pre);
        for (i, (text, expected, decoded, _)) in cases(model).iter().enumerate() {
            assert_eq!(
                &tok.encode(text, false).unwrap(),
                expected,
                "{model} as GGUF {pre}, text {i}: {text:?}"
            );
            assert_eq!(&tok.decode(expected).unwrap(), decoded, "{model} {pre} {i}");
        }
    }
}

/// The tokenizers survive the flm description (what .flm files store) unchanged.
#[test]
fn tokenizers_round_trip_through_the_flm_spec() {
    if emulated() {
        return;
    }
    for model in ["deepseek-v2", "deepseek-v3"] {
        let tok = tok(model);
        let back = Tokenizer::from_spec(tok.spec()).unwrap();
        assert_eq!(back.spec(), tok.spec());
        assert_eq!(back.chat_template(), tok.chat_template());
        for (text, expected, _, _) in cases(model).iter().take(50) {
            assert_eq!(
                &back.encode(text, false).unwrap(),
                expected,
                "{model}: {text:?}"
            );
        }
    }
}
