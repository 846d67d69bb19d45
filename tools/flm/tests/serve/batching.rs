//! Continuous batching through the server: exact greedy results under concurrency, and a
//! bounded load test.

use std::time::Instant;

use serde_json::{json, Value};

use crate::server::{reference, Server};
use flm_tests::emulated;

/// A greedy completion of `prompt` (token ids) for `max_tokens`: its text and the number
/// of tokens generated.
fn complete(server: &Server, prompt: &[u32], max_tokens: usize) -> (String, u64) {
    let request = json!({"prompt": prompt, "temperature": 0, "max_tokens": max_tokens});
    let (status, body): (u16, Value) = server.post("/v1/completions", &request);
    assert_eq!(status, 200, "{body}");
    (
        body["choices"][0]["text"].as_str().unwrap().to_owned(),
        body["usage"]["completion_tokens"].as_u64().unwrap(),
    )
}

/// 32 prompts of 1 to 32 tokens, each a prefix of the greedy sequence from BOS, each asked
/// to continue to step 200 of it. Sent at once they decode together in one batch (of
/// different lengths); each text is the rest of llama2.c's greedy text, and equals the one
/// the same request gets alone.
#[test]
fn concurrent_greedy_requests_equal_each_alone() {
    let server = Server::start(&[]);
    let reference = reference();
    let prompts: Vec<Vec<u32>> = (0..32)
        .map(|k| [&[1][..], &reference.ids[..k]].concat())
        .collect();
    let max_tokens = |prompt: &Vec<u32>| 201 - prompt.len();
    let together: Vec<(String, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(|| complete(&server, p, max_tokens(p))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Under emulation, where a step costs ~50 times a native one, one prompt in 8 (and the
    // longest) is also sent alone; every batched text is still checked against llama2.c's.
    let alone_every = if emulated() { 8 } else { 1 };
    for (k, prompt) in prompts.iter().enumerate() {
        assert_eq!(together[k].1, max_tokens(prompt) as u64);
        assert!(
            reference.text.ends_with(&together[k].0),
            "{}",
            together[k].0
        );
        if k % alone_every == 0 || k == prompts.len() - 1 {
            let alone = complete(&server, prompt, max_tokens(prompt));
            assert_eq!(together[k], alone, "prompt of {} tokens", prompt.len());
        }
    }
    assert_eq!(together[0].0, reference.text);
}

/// Runs `requests` completions of 32 tokens on `clients` threads; returns the seconds taken
/// and the tokens generated. Every request must succeed with all its tokens.
fn load(server: &Server, clients: usize, requests: usize) -> (f64, u64) {
    let reference = reference();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let start = Instant::now();
    let done: Vec<(usize, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|_| {
                s.spawn(|| {
                    let (mut count, mut tokens) = (0, 0);
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= requests {
                            break (count, tokens);
                        }
                        let prompt = [&[1][..], &reference.ids[..i % 48]].concat();
                        let (_, generated) = complete(server, &prompt, 32);
                        assert_eq!(generated, 32);
                        count += 1;
                        tokens += generated;
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let answered: usize = done.iter().map(|d| d.0).sum();
    assert_eq!(answered, requests, "requests lost");
    (seconds, done.iter().map(|d| d.1).sum())
}

/// 64 concurrent clients send a few hundred requests: every one is answered in full, the
/// server's counters agree, and the KV cache is all free at the end. Prints requests/s and
/// aggregate decode tokens/s against one request at a time.
#[test]
fn load_test_loses_no_request() {
    let server = Server::start(&[]);
    let (clients, requests, alone) = if emulated() {
        (64, 64, 4)
    } else {
        (64, 384, 32)
    };
    let (seq_secs, seq_tokens) = load(&server, 1, alone);
    let (secs, tokens) = load(&server, clients, requests);
    eprintln!(
        "load test: {requests} requests from {clients} clients in {secs:.2} s: {:.1} requests/s, \
         {:.0} tokens/s; one at a time: {:.1} requests/s, {:.0} tokens/s",
        requests as f64 / secs,
        tokens as f64 / secs,
        alone as f64 / seq_secs,
        seq_tokens as f64 / seq_secs,
    );
    let status = "flm_requests_total{endpoint=\"completions\",status=\"200\"}";
    assert_eq!(server.metric(status), (requests + alone) as f64);
    assert_eq!(
        server.metric("flm_generated_tokens_total"),
        (tokens + seq_tokens) as f64
    );
    assert_eq!(server.metric("flm_running_sequences"), 0.0);
    assert_eq!(server.metric("flm_queue_length"), 0.0);
    assert_eq!(
        server.metric("flm_kv_blocks_free"),
        server.metric("flm_kv_blocks_total")
    );
}

/// A request after another that shares its first 64 tokens takes their KV blocks from the
/// prefix cache: `/metrics` counts the hit and the 64 tokens saved, and the text is still the
/// continuation of llama2.c's greedy sequence.
#[test]
fn a_later_request_reuses_an_earlier_prefix() {
    let server = Server::start(&[]);
    let reference = reference();
    let hits = "flm_prefix_cache_hits_total";
    let saved = "flm_prefix_cache_tokens_saved_total";
    let first = [&[1][..], &reference.ids[..70]].concat();
    let (text, _) = complete(&server, &first, 8);
    assert!(reference.text.contains(&text), "{text}");
    assert_eq!((server.metric(hits), server.metric(saved)), (0.0, 0.0));
    assert!(server.metric("flm_kv_blocks_cached") >= 4.0);
    let second = [&[1][..], &reference.ids[..100]].concat();
    let (text, _) = complete(&server, &second, 8);
    assert!(reference.text.contains(&text), "{text}");
    assert_eq!(server.metric(hits), 1.0);
    // Blocks of 16: the first 64 positions of the first request's 71 + 8.
    assert_eq!(server.metric(saved), 64.0);
    assert_eq!(
        server.metric("flm_kv_blocks_free"),
        server.metric("flm_kv_blocks_total")
    );
}
