//! The limits that keep one client from holding the server: header and body read timeouts,
//! the connection cap, the request deadline, the memory budget, prompt rendering off the
//! async runtime, SIGTERM during a generation or a render, and request numbers that cannot
//! wrap.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::chat_model::chat_model;
use crate::server::{read_answer, Server};
use flm_tests::emulated;

/// How soon flm serve must exit after SIGTERM: its grace for open connections (3 s) and
/// for blocking work (1 s), with room for a loaded machine, or an emulator's slowness.
fn sigterm_bound() -> Duration {
    Duration::from_secs(if emulated() { 20 } else { 8 })
}

/// Polls `condition` for up to a minute.
fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < Duration::from_secs(60), "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A connection to `server` whose reads give up after a minute.
fn connect(server: &Server) -> TcpStream {
    let socket = TcpStream::connect(server.address()).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    socket
}

/// Sends a POST of the JSON `body` to `path` over a connection of its own, without reading
/// the answer.
fn send_post(server: &Server, path: &str, body: &Value) -> TcpStream {
    let mut socket = connect(server);
    let body = body.to_string();
    write!(
        socket,
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        server.address(),
        body.len()
    )
    .unwrap();
    socket
}

/// GET `/health` over a new connection whose reads give up after 10 s: the answer, or
/// `None` when the server closed the connection without one (a refusal).
fn health(server: &Server) -> Option<(u16, Value)> {
    let mut socket = TcpStream::connect(server.address()).ok()?;
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        socket,
        "GET /health HTTP/1.1\r\nHost: {}\r\n\r\n",
        server.address()
    )
    .ok()?;
    read_answer(&mut socket)
}

/// Whether the server has closed `socket`: it reads the end (or a reset) within 100 ms.
fn closed(socket: &mut TcpStream) -> bool {
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut byte = [0u8; 1];
    match socket.read(&mut byte) {
        Ok(n) => n == 0,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn trickled_headers_are_cut_off_at_the_header_timeout() {
    let server = Server::start(&["--header-timeout", "1"]);
    let mut socket = connect(&server);
    socket.write_all(b"GET /health HTTP/1.1\r\nX-Slow").unwrap();
    // A byte of the header's name every 100 ms or so, for a minute at most.
    let start = Instant::now();
    let mut sent = 0;
    while !closed(&mut socket) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the connection is still open after {sent} trickled bytes"
        );
        if socket.write_all(b"x").is_err() {
            break;
        }
        sent += 1;
    }
    assert!(
        sent >= 5,
        "closed after {sent} bytes, before the timeout ran out"
    );
    assert_eq!(health(&server).map(|a| a.0), Some(200));
}

#[test]
fn a_body_shorter_than_its_length_is_answered_408_at_the_body_timeout() {
    let server = Server::start(&["--body-timeout", "0.5"]);
    let mut socket = connect(&server);
    write!(
        socket,
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: 1000\r\n\r\n{{\"prompt\": \"",
        server.address()
    )
    .unwrap();
    let (status, answer) = read_answer(&mut socket).expect("an answer");
    assert_eq!(status, 408, "{answer}");
    assert_eq!(answer["error"]["code"], "request_timeout");
    assert!(closed(&mut socket), "the connection stays open");
}

#[test]
fn connections_over_the_cap_are_refused_fast_and_health_still_answers() {
    // Idle served connections stay for a minute: only the cap keeps the others out.
    let server = Server::start(&["--max-connections", "4", "--header-timeout", "60"]);
    // The 4 served, the 64 of the overflow (closed after 2 s idle), 36 beyond.
    let mut idle: Vec<TcpStream> = (0..4 + 64 + 36).map(|_| connect(&server)).collect();
    eventually("the connections beyond the overflow are closed", || {
        idle[68..].iter_mut().all(closed)
    });
    // Each try answers or is refused within 10 s; one gets through once the overflow's idle
    // connections time out.
    eventually("/health answers 200", || {
        health(&server).is_some_and(|(status, body)| {
            assert_eq!((status, &body), (200, &json!({"status": "ok"})));
            true
        })
    });
    // Like /health, a try that finds the overflow still full is closed unanswered.
    let mut refusal = None;
    eventually("a completion is refused with an answer", || {
        let mut socket = send_post(&server, "/v1/completions", &json!({"prompt": "Once"}));
        refusal = read_answer(&mut socket);
        refusal.is_some()
    });
    let (status, answer) = refusal.unwrap();
    assert_eq!(status, 503, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("--max-connections"), "{message}");
    assert!(idle[..4].iter_mut().all(|s| !closed(s)));
    // A served connection that closes makes room for a request.
    idle.truncate(3);
    eventually("a completion is served", || {
        let mut socket = send_post(&server, "/v1/completions", &json!({"prompt": "Once"}));
        read_answer(&mut socket).is_some_and(|a| a.0 == 200)
    });
}

/// A completion of `n` whole-context greedy choices: long enough to be still generating
/// after a fraction of a second.
fn long_completion(n: usize, stream: bool) -> Value {
    json!({"prompt": "", "temperature": 0, "max_tokens": 511, "n": n, "stream": stream})
}

#[test]
fn the_deadline_ends_a_generation_with_504_and_frees_its_sequences() {
    let server = Server::start(&["--request-timeout", "0.3"]);
    let total = server.metric("flm_kv_blocks_total");
    let (status, answer) = server.post("/v1/completions", &long_completion(32, false));
    assert_eq!(status, 504, "{answer}");
    assert_eq!(answer["error"]["code"], "timeout");
    let events = server.stream("/v1/completions", &long_completion(32, true));
    let last = events.last().unwrap();
    assert_eq!(last["error"]["code"], "timeout", "{last}");
    eventually("the KV blocks are all free and no sequence runs", || {
        server.metric("flm_kv_blocks_free") == total
            && server.metric("flm_running_sequences") == 0.0
            && server.metric("flm_queue_length") == 0.0
    });
}

#[test]
fn requests_over_the_memory_budget_get_413_and_429_until_memory_is_freed() {
    let server = Server::start(&["--max-request-memory", "1", "--body-timeout", "60"]);
    let huge = json!({"prompt": "Once", "max_tokens": 500, "n": 128, "logprobs": 20});
    let (status, answer) = server.post("/v1/completions", &huge);
    assert_eq!(status, 413, "{answer}");
    assert_eq!(answer["error"]["code"], "request_too_large");
    // A body that declares 300 kB and does not come holds 600 kB of the MiB while awaited;
    // a request that needs about 736 kB does not fit beside it.
    let mut held = connect(&server);
    write!(
        held,
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: 300000\r\n\r\n",
        server.address()
    )
    .unwrap();
    eventually("the awaited body is reserved", || {
        server.metric("flm_request_memory_reserved_bytes") >= 600_000.0
    });
    let big = json!({"prompt": "Once", "max_tokens": 500, "logprobs": 10});
    let (status, refusal) = server.post("/v1/completions", &big);
    assert_eq!(status, 429, "{refusal}");
    assert_eq!(refusal["error"]["code"], "memory_budget_exhausted");
    let message = refusal["error"]["message"].as_str().unwrap();
    assert!(message.ends_with("retry later"), "{message}");
    drop(held);
    eventually("the memory is given back", || {
        server.metric("flm_request_memory_reserved_bytes") == 0.0
    });
    eventually("the big request is served", || {
        server.post("/v1/completions", &big).0 == 200
    });
}

/// A chat template's render holds what it may build and emit reserved while it runs
/// (72 MiB): under a smaller budget chat requests are refused with a 413 that says so, and
/// completions are still served; with room for one render, a burst of chats is served, each
/// waiting for the render before it, and the reservations are given back.
#[test]
fn a_render_reserves_its_memory_in_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), "{{ messages[0]['content'] }}");
    let chat = json!({"messages": [{"role": "user", "content": "Once"}], "max_tokens": 4});
    let plain = json!({"prompt": "Once", "max_tokens": 4});
    let small = Server::start_model(&model, &["--max-request-memory", "64"]);
    let (status, answer) = small.post("/v1/chat/completions", &chat);
    assert_eq!(status, 413, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("rendering the chat template would hold about 72 MiB"),
        "{message}"
    );
    assert_eq!(small.post("/v1/completions", &plain).0, 200);
    // Room for one render at a time: a burst of chats waits for it, none is refused.
    let roomy = Server::start_model(&model, &["--max-request-memory", "80"]);
    std::thread::scope(|s| {
        let burst: Vec<_> = (0..8)
            .map(|_| s.spawn(|| roomy.post("/v1/chat/completions", &chat)))
            .collect();
        for chat in burst {
            let (status, answer) = chat.join().unwrap();
            assert_eq!(status, 200, "{answer}");
        }
    });
    eventually("the memory is given back", || {
        roomy.metric("flm_request_memory_reserved_bytes") == 0.0
    });
}

/// Two nested loops of 300: a template that renders slowly but within the template budget,
/// which refuses endless ones when the model loads (`tokenizer/tests/hostile_templates.rs`).
const SLOW_TEMPLATE: &str = "{% for a in range(300) %}{% for b in range(300) %}\
    {% endfor %}{% endfor %}{{ messages[0]['content'] }}";

#[cfg(unix)]
#[test]
fn slow_renders_hold_neither_health_nor_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), SLOW_TEMPLATE);
    let mut server = Server::start_model(&model, &["--request-timeout", "2"]);
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}]});
    // More renders than the runtime has worker threads (one per core).
    let workers = std::thread::available_parallelism().map_or(4, |n| n.get());
    let mut slow: Vec<TcpStream> = (0..workers + 2)
        .map(|_| send_post(&server, "/v1/chat/completions", &chat))
        .collect();
    assert_eq!(health(&server).map(|a| a.0), Some(200));
    // Each render ends within the budget; its generation may pass the deadline (504).
    for socket in &mut slow {
        let (status, answer) = read_answer(socket).expect("an answer");
        assert!(status == 200 || status == 504, "{status}: {answer}");
    }
    assert_eq!(health(&server).map(|a| a.0), Some(200));
    let _rendering = send_post(&server, "/v1/chat/completions", &chat);
    let (took, exited_0) = server.terminate();
    assert!(exited_0);
    assert!(took < sigterm_bound(), "SIGTERM took {took:?}");
}

#[cfg(unix)]
#[test]
fn sigterm_during_a_long_generation_exits_within_seconds() {
    let mut server = Server::start(&[]);
    let mut socket = send_post(&server, "/v1/completions", &long_completion(32, true));
    let mut first = [0u8; 64];
    assert!(socket.read(&mut first).unwrap() > 0, "no answer");
    let (took, exited_0) = server.terminate();
    assert!(exited_0);
    assert!(took < sigterm_bound(), "SIGTERM took {took:?}");
}

#[test]
fn huge_request_numbers_get_400s_that_show_them_unwrapped() {
    let server = Server::start(&[]);
    let max = u64::MAX;
    for (body, param, says) in [
        (
            json!({"prompt": "Once", "max_tokens": max}),
            "prompt",
            format!("but max_tokens is {max}"),
        ),
        (
            json!({"prompt": "Once", "n": max}),
            "n",
            format!("got {max}"),
        ),
        (
            json!({"prompt": "Once", "logprobs": max}),
            "logprobs",
            format!("got {max}"),
        ),
    ] {
        let (status, answer) = server.post("/v1/completions", &body);
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["param"], param);
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.ends_with(&says), "{message}");
    }
}
