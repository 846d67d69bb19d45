//! A client that disconnects mid-stream cancels its request: the sequence leaves the
//! batch and its KV blocks return to the pool, as `/metrics` shows.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::server::Server;

/// Polls `condition` for up to a minute.
fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < Duration::from_secs(60), "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends a completion request for the whole context, greedy from BOS (which runs 200+
/// tokens without an end token, as llama2.c's reference shows), so that it is still
/// generating when the client leaves.
fn send_long_request(server: &Server, stream: bool) -> TcpStream {
    let body =
        json!({"prompt": "", "temperature": 0, "max_tokens": 511, "stream": stream}).to_string();
    let address = server.url.strip_prefix("http://").unwrap();
    let mut socket = TcpStream::connect(address).unwrap();
    write!(
        socket,
        "POST /v1/completions HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    socket
}

#[test]
fn disconnect_mid_stream_frees_the_kv_blocks() {
    let server = Server::start(&[]);
    let total = server.metric("flm_kv_blocks_total");
    let mut reader = BufReader::new(send_long_request(&server, true));
    let mut line = String::new();
    let mut chunks = 0;
    while chunks < 3 {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "the stream ended early"
        );
        if line.starts_with("data: {") {
            chunks += 1;
        }
    }
    drop(reader);
    assert_cancelled(&server, total);
}

/// A client waiting for a whole (not streamed) reply that closes its connection cancels
/// the request too: the server drops the handler, and with it the request's channel.
#[test]
fn disconnect_before_a_whole_reply_cancels_it() {
    let server = Server::start(&[]);
    let total = server.metric("flm_kv_blocks_total");
    let socket = send_long_request(&server, false);
    eventually("the request generates", || {
        server.metric("flm_generated_tokens_total") > 0.0
    });
    drop(socket);
    assert_cancelled(&server, total);
}

/// The server cancelled the one request it had, before its 511 tokens, and freed all of
/// its `total` KV blocks.
fn assert_cancelled(server: &Server, total: f64) {
    eventually("the KV blocks are all free and no sequence runs", || {
        server.metric("flm_kv_blocks_free") == total
            && server.metric("flm_running_sequences") == 0.0
    });
    assert_eq!(server.metric("flm_cancelled_requests_total"), 1.0);
    let generated = server.metric("flm_generated_tokens_total");
    assert!(
        generated < 511.0,
        "{generated} tokens: the request was not cancelled"
    );
}
