//! gpt-oss's tool calls through HTTP: a random gpt-oss at tiny shapes with the real
//! o200k_harmony tokenizer and gpt-oss's own chat template (tests/data/templates). Its
//! weights are random, so only the mechanics are checked: a call forced to one function is
//! opened by the prompt in harmony's form and comes back as OpenAI's `tool_calls`, whole
//! and streamed; `required` among several tools parses; a call and its result go back
//! through the template.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::common::flm_command;
use crate::server::{data, Server};

/// A random gpt-oss `.flm` in `dir`: tests/data/hf-families/gpt_oss's architecture at
/// narrower widths and o200k_harmony's 201088 ids, with gpt-oss's tokenizer files.
fn gpt_oss_model(dir: &Path) -> PathBuf {
    let read = |rel: &str| std::fs::read(data(rel)).unwrap();
    let mut config: Value =
        serde_json::from_slice(&read("hf-families/gpt_oss/config.json")).unwrap();
    for (key, value) in [
        ("vocab_size", json!(201088)),
        ("hidden_size", json!(16)),
        ("head_dim", json!(4)),
        ("intermediate_size", json!(16)),
        ("num_local_experts", json!(4)),
        ("num_hidden_layers", json!(2)),
        (
            "layer_types",
            json!(["sliding_attention", "full_attention"]),
        ),
        ("bos_token_id", json!(199998)),
        ("eos_token_id", json!(200002)),
        // The tools' descriptions make a prompt of some 150 tokens.
        ("max_position_embeddings", json!(1024)),
    ] {
        config[key] = value;
    }
    config["rope_parameters"]["original_max_position_embeddings"] = json!(256);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let tokenizer = flm_tests::tokenizer::xz("tokenizer/o200k-harmony/tokenizer.json.xz");
    std::fs::write(dir.join("tokenizer.json"), tokenizer).unwrap();
    let mut tokenizer_config: Value =
        serde_json::from_slice(&read("tokenizer/o200k-harmony/tokenizer_config.json")).unwrap();
    tokenizer_config["chat_template"] =
        String::from_utf8(read("templates/openai-gpt-oss-120b.jinja"))
            .unwrap()
            .into();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        tokenizer_config.to_string(),
    )
    .unwrap();
    let model = dir.join("gpt-oss.flm");
    let out = flm_command()
        .args(["convert", "--random", "--dtype", "int8", "--input"])
        .arg(dir.join("config.json"))
        .arg("--tokenizer")
        .arg(dir.join("tokenizer.json"))
        .arg("--output")
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    model
}

fn tool(name: &str, parameter: &str, max_length: usize) -> Value {
    json!({"type": "function", "function": {"name": name, "description": format!("The {parameter}."),
        "parameters": {"type": "object", "properties": {parameter: {"type": "string", "maxLength": max_length}},
            "required": [parameter]}}})
}

/// The arguments of `call` (an OpenAI `tool_calls` entry), which must be a JSON object
/// with `parameter` as a string of at most `max_length` characters.
fn arguments(call: &Value, parameter: &str, max_length: usize) -> Value {
    let text = call["function"]["arguments"].as_str().unwrap();
    let arguments: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    let value = arguments[parameter]
        .as_str()
        .unwrap_or_else(|| panic!("{arguments}"));
    assert!(value.chars().count() <= max_length, "{arguments}");
    arguments
}

#[test]
fn gpt_oss_tool_calls_come_back_as_tool_calls() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_model(&gpt_oss_model(dir.path()), &["--quiet"]);
    let tools = json!([tool("get_weather", "city", 10), tool("get_time", "zone", 6)]);
    let user = json!({"role": "user", "content": "What time is it in Oslo?"});
    let request = |choice: Value, stream: bool| {
        json!({"messages": [user.clone()], "tools": tools.clone(), "tool_choice": choice,
               "max_tokens": 40, "temperature": 0, "stream": stream})
    };
    let named = json!({"type": "function", "function": {"name": "get_time"}});

    // A named call: the prompt opens it, the reply is its arguments.
    let (status, reply) = server.post("/v1/chat/completions", &request(named.clone(), false));
    assert_eq!(status, 200, "{reply}");
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{reply}");
    let message = &choice["message"];
    assert!(message.get("content").is_none(), "{reply}");
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{reply}");
    assert_eq!(
        (&calls[0]["type"], &calls[0]["function"]["name"]),
        (&json!("function"), &json!("get_time"))
    );
    let zone = arguments(&calls[0], "zone", 6);

    // Cut by `max_tokens` inside the arguments: `length`, the call as far as it went.
    let mut short = request(named.clone(), false);
    short["max_tokens"] = json!(2);
    let (status, cut) = server.post("/v1/chat/completions", &short);
    assert_eq!(status, 200, "{cut}");
    assert_eq!(cut["choices"][0]["finish_reason"], "length", "{cut}");
    let partial = cut["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .unwrap();
    assert!(
        calls[0]["function"]["arguments"]
            .as_str()
            .unwrap()
            .starts_with(partial),
        "{cut}"
    );

    // Streamed: no text, the call in the last delta, with its index; the same call.
    let chunks = server.stream("/v1/chat/completions", &request(named, true));
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "");
    let streamed: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"].get("tool_calls"))
        .collect();
    assert_eq!(streamed.len(), 1, "{chunks:?}");
    assert_eq!(streamed[0][0]["index"], 0);
    assert_eq!(streamed[0][0]["function"]["name"], "get_time");
    assert_eq!(arguments(&streamed[0][0], "zone", 6), zone);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");

    // `required` with one tool is that tool's call, opened the same way.
    let only_weather = json!({"messages": [user.clone()], "tools": [tool("get_weather", "city", 10)],
        "tool_choice": "required", "max_tokens": 40, "temperature": 0});
    let (status, reply) = server.post("/v1/chat/completions", &only_weather);
    assert_eq!(status, 200, "{reply}");
    let call = &reply["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather", "{reply}");
    arguments(call, "city", 10);

    // `required` among several: written as JSON text, parsed into a call of either.
    let (status, reply) = server.post("/v1/chat/completions", &request(json!("required"), false));
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply["choices"][0]["finish_reason"], "tool_calls",
        "{reply}"
    );
    let call = &reply["choices"][0]["message"]["tool_calls"][0];
    match call["function"]["name"].as_str() {
        Some("get_weather") => arguments(call, "city", 10),
        Some("get_time") => arguments(call, "zone", 6),
        other => panic!("{other:?}: {reply}"),
    };

    // The call and its result go back through gpt-oss's template.
    let history = json!({"messages": [user, message.clone(),
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "12:00"}],
        "tools": tools, "tool_choice": "none", "max_tokens": 4, "temperature": 0});
    let (status, answer) = server.post("/v1/chat/completions", &history);
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer["choices"][0]["message"].get("tool_calls").is_none(),
        "{answer}"
    );
    let prompt_tokens = |r: &Value| r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens(&answer) > prompt_tokens(&reply), "{answer}");
}
