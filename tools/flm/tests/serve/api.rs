//! The routes, the OpenAI objects and the 400 errors.

use serde_json::{json, Value};

use crate::chat_model::chat_model;
use crate::server::{data, reference, Server};

/// Checks an OpenAI-style error: status, type and the field at fault.
fn assert_error(answer: (u16, Value), status: u16, param: Option<&str>) {
    let (got, body) = answer;
    assert_eq!(got, status, "{body}");
    let error = &body["error"];
    assert!(!error["message"].as_str().unwrap().is_empty(), "{body}");
    assert!(error["type"].is_string(), "{body}");
    assert!(error.get("code").is_some(), "{body}");
    assert_eq!(error["param"].as_str(), param, "{body}");
}

#[test]
fn health_models_metrics_and_page() {
    let server = Server::start(&["--model-name", "tiny"]);
    assert_eq!(server.get("/health"), (200, r#"{"status":"ok"}"#.into()));
    let (status, models) = server.get("/v1/models");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(models["data"][0]["object"], "model");
    // stories260K's llama2.c header: a context of 512.
    assert_eq!(models["data"][0]["max_model_len"], 512);
    let (status, page) = server.get("/");
    assert_eq!(status, 200);
    assert!(page.contains("/v1/chat/completions") && page.contains("tokens/s"));
    let (status, metrics) = server.get("/metrics");
    assert_eq!(status, 200);
    for name in [
        "flm_queue_length 0",
        "flm_request_memory_reserved_bytes 0",
        "flm_running_sequences 0",
        "flm_kv_blocks_free ",
        "flm_kv_blocks_total ",
        "flm_generated_tokens_total 0",
        "flm_time_to_first_token_seconds_count 0",
        "flm_inter_token_latency_seconds_count 0",
    ] {
        assert!(metrics.contains(name), "{name} missing from\n{metrics}");
    }
    assert!(server.metric("flm_kv_blocks_total") > 0.0);
    assert_eq!(
        server.metric("flm_kv_blocks_free"),
        server.metric("flm_kv_blocks_total")
    );
    let (status, _) = server.get("/v2/nothing");
    assert_eq!(status, 404);
}

/// Greedy from BOS is llama2.c's `run -t 0 -n 200` output, whole and streamed.
#[test]
fn greedy_completion_matches_llama2c() {
    let server = Server::start(&[]);
    let expected = reference();
    let request = json!({"prompt": "", "temperature": 0, "max_tokens": 200});
    let (status, body) = server.post("/v1/completions", &request);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["choices"][0]["text"], expected.text.as_str());
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 1, "completion_tokens": 200, "total_tokens": 201})
    );
    let mut streamed = request.clone();
    streamed["stream"] = true.into();
    streamed["stream_options"] = json!({"include_usage": true});
    let chunks = server.stream("/v1/completions", &streamed);
    let (usage, chunks) = chunks.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 200);
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, expected.text);
    let (last, pieces) = chunks.split_last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert!(pieces
        .iter()
        .all(|c| c["choices"][0]["finish_reason"].is_null()));
    assert!(chunks.iter().all(|c| c["id"] == chunks[0]["id"]));
    assert!(server.metric("flm_time_to_first_token_seconds_count") >= 2.0);
    assert!(server.metric("flm_generated_tokens_total") >= 400.0);
}

/// A stop string ends the text before it, also when it spans several tokens; the ids of
/// a token prompt are used as they are.
#[test]
fn stop_strings_and_token_prompts() {
    let server = Server::start(&[]);
    let expected = reference();
    let stop = "little girl";
    let before = &expected.text[..expected.text.find(stop).unwrap()];
    let request = json!({"prompt": [1], "temperature": 0, "max_tokens": 100,
        "stop": ["nowhere in the text", stop]});
    let (status, body) = server.post("/v1/completions", &request);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], before);
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let mut streamed = request.clone();
    streamed["stream"] = true.into();
    let chunks = server.stream("/v1/completions", &streamed);
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, before);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
}

#[test]
fn bad_requests_get_openai_errors() {
    let server = Server::start(&["--model-name", "tiny"]);
    let completions = "/v1/completions";
    assert_error(server.post_raw(completions, "{not json"), 400, None);
    assert_error(server.post_raw("/v1/chat/completions", "[]"), 400, None);
    assert_error(
        server.post(completions, &json!({"max_tokens": 3})),
        400,
        None,
    );
    assert_error(
        server.post("/v1/chat/completions", &json!({"prompt": "x"})),
        400,
        None,
    );
    for (field, value) in [
        ("temperature", json!(3)),
        ("temperature", json!(-0.5)),
        ("top_p", json!(0)),
        ("top_p", json!(1.5)),
        ("max_tokens", json!(0)),
        ("presence_penalty", json!(2.5)),
        ("frequency_penalty", json!(-9)),
        ("n", json!(0)),
        ("n", json!(129)),
        ("logprobs", json!(21)),
        ("top_logprobs", json!(2)),
        ("stop", json!(["a", "b", "c", "d", "e"])),
        ("stop", json!("")),
        ("response_format", json!({"type": "xml"})),
        ("logit_bias", json!({"50256": -100})),
        ("user", json!(42)),
        ("suffix", json!(" the end")),
        ("best_of", json!(2)),
    ] {
        let mut request = json!({"prompt": "Once upon a time"});
        request[field] = value;
        assert_error(server.post(completions, &request), 400, Some(field));
    }
    // Their neutral values are accepted.
    let (status, body) = server.post(
        completions,
        &json!({"prompt": "x", "max_tokens": 1, "logit_bias": {}, "user": "u", "suffix": "",
                "best_of": 1, "n": 1, "logprobs": null, "echo": false,
                "response_format": {"type": "text"}}),
    );
    assert_eq!(status, 200, "{body}");
    // A body over the limit (2 MiB): 413.
    let (status, body) = server.post_declared(completions, 50 << 20);
    assert_error((status, body.clone()), 413, None);
    assert_eq!(body["error"]["code"], "request_too_large");
    // A wrong type is a deserialisation error.
    assert_error(
        server.post(completions, &json!({"prompt": "x", "temperature": "hot"})),
        400,
        None,
    );
    assert_error(
        server.post(completions, &json!({"prompt": [1, 99999]})),
        400,
        Some("prompt"),
    );
    assert_error(
        server.post(completions, &json!({"prompt": "x", "model": "other"})),
        404,
        Some("model"),
    );
    // stories260K's llama2.c files have no chat template.
    assert_error(
        server.post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}]}),
        ),
        400,
        Some("messages"),
    );
    // Over-long prompts: longer than the context (512), or with max_tokens past it.
    let long = "Once upon a time ".repeat(200);
    let (status, body) = server.post(completions, &json!({"prompt": long}));
    assert_error((status, body.clone()), 400, Some("prompt"));
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    let (status, body) = server.post(completions, &json!({"prompt": "x", "max_tokens": 600}));
    assert_error((status, body.clone()), 400, Some("prompt"));
    assert_eq!(body["error"]["code"], "context_length_exceeded");
    // The server is still serving.
    let (status, body) = server.post(completions, &json!({"prompt": "x", "max_tokens": 2}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 2);
    assert!(server.metric("flm_requests_total{endpoint=\"completions\",status=\"400\"}") >= 10.0);
}

/// `chat_template_kwargs` reach the template: a story opening given as a template
/// variable prompts the model as the same text given to /v1/completions does (BOS, then
/// the text); bad kwargs are 400s naming the field.
#[test]
fn chat_template_kwargs_reach_the_template() {
    let dir = tempfile::tempdir().unwrap();
    let template = "{{ bos_token }}{{ opening }}{% for m in messages %}{{ m.content }}{% endfor %}";
    let server = Server::start_model(&chat_model(dir.path(), template), &[]);
    let chat = "/v1/chat/completions";
    let request = |kwargs: Value| {
        json!({"messages": [{"role": "user", "content": " there was"}], "temperature": 0,
               "max_tokens": 8, "chat_template_kwargs": kwargs})
    };
    let (status, with) = server.post(chat, &request(json!({"opening": "Once upon a time"})));
    assert_eq!(status, 200, "{with}");
    let (status, plain) = server.post(
        "/v1/completions",
        &json!({"prompt": "Once upon a time there was", "temperature": 0, "max_tokens": 8}),
    );
    assert_eq!(status, 200, "{plain}");
    assert_eq!(with["usage"], plain["usage"]);
    assert_eq!(
        with["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .trim_start(),
        plain["choices"][0]["text"].as_str().unwrap().trim_start()
    );
    // Without the variable the opening is missing from the prompt; null is no kwargs.
    for kwargs in [json!({}), Value::Null] {
        let (status, without) = server.post(chat, &request(kwargs));
        assert_eq!(status, 200, "{without}");
        let tokens = |v: &Value| v["usage"]["prompt_tokens"].as_u64().unwrap();
        assert!(tokens(&without) < tokens(&with), "{without}");
    }
    for kwargs in [
        json!("enable_thinking=false"),
        json!([["enable_thinking", false]]),
        json!(false),
        json!({"messages": []}),
        json!({"add_generation_prompt": false}),
    ] {
        assert_error(
            server.post(chat, &request(kwargs)),
            400,
            Some("chat_template_kwargs"),
        );
    }
}

/// `--pooling mean`: the mean of transformers' `last_hidden_state` over the tokens,
/// normalised (tests/data/stories260K/embeddings_reference.json); stories260K.bin is the
/// same model as hf-stories260K.
#[test]
fn embeddings_pool_the_mean_with_the_flag() {
    let server = Server::start(&["--pooling", "mean"]);
    let file = std::fs::read(data("stories260K/embeddings_reference.json")).unwrap();
    let reference: Value = serde_json::from_slice(&file).unwrap();
    let request = serde_json::json!({"input": reference["inputs"]});
    let (status, body) = server.post("/v1/embeddings", &request);
    assert_eq!(status, 200, "{body}");
    let want = reference["mean"].as_array().unwrap();
    for (got, want) in body["data"].as_array().unwrap().iter().zip(want) {
        let got = got["embedding"].as_array().unwrap();
        assert_eq!(got.len(), 64);
        for (g, w) in got.iter().zip(want.as_array().unwrap()) {
            let (g, w) = (g.as_f64().unwrap(), w.as_f64().unwrap());
            assert!((g - w).abs() < 1e-4, "{g} vs {w}");
        }
    }
    let (status, body) = server.post("/v1/embeddings", &serde_json::json!({"input": []}));
    assert_eq!(
        (status, body["error"]["param"].as_str()),
        (400, Some("input"))
    );
}

/// Every POST request is logged on stderr when it ends: method, path, status, prompt and
/// generated tokens (all choices), time to first token, tokens/s and the whole time; a
/// stream once its last event is sent; a refusal with its status. `--quiet` logs none.
#[test]
fn requests_are_logged_on_stderr_unless_quiet() {
    let server = Server::start(&[]);
    let plain = json!({"prompt": "Once", "max_tokens": 8, "ignore_eos": true});
    assert_eq!(server.post("/v1/completions", &plain).0, 200);
    let streamed = json!({"prompt": "Once", "max_tokens": 8, "n": 2, "stream": true,
                          "ignore_eos": true});
    server.stream("/v1/completions", &streamed);
    let bad = json!({"prompt": "Once", "max_tokens": -1});
    assert_eq!(server.post("/v1/completions", &bad).0, 400);
    let wanted = [
        "POST /v1/completions 200 prompt=2 generated=8 ttft=",
        "POST /v1/completions 200 prompt=4 generated=16 ttft=",
        "POST /v1/completions 400 total=",
    ];
    // A stream's line comes once the server has dropped it: wait up to 10 s (emulators).
    let mut log = String::new();
    for _ in 0..500 {
        log = server.stderr();
        if log.lines().filter(|l| l.contains(" INFO POST ")).count() == wanted.len() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(" INFO POST ")).collect();
    assert_eq!(lines.len(), wanted.len(), "{log}");
    for (line, want) in lines.iter().zip(wanted) {
        assert!(line.contains(want), "{line:?} lacks {want:?}");
    }
    assert!(lines[0].contains(" tok/s total="), "{}", lines[0]);
    let quiet = Server::start(&["--quiet"]);
    assert_eq!(quiet.post("/v1/completions", &plain).0, 200);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(!quiet.stderr().contains("POST"), "{}", quiet.stderr());
}
