//! One log line per request, as llama-server and vLLM print them: method, path, status,
//! prompt and generated tokens, time to first token, decode tokens/s and the whole time,
//! written through `tracing` at level INFO to stderr when the request ends (a stream's
//! last event sent, or its client gone). `flm serve --quiet` keeps only warnings.
//!
//! [`RequestLog`] is made by the admission middleware and shared with the request's
//! choices ([`super::generation::Job`]); the line is written when its last holder drops it.

use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What one request did, filled in as it runs; logged when dropped.
#[derive(Debug)]
pub struct RequestLog {
    method: String,
    path: String,
    started: Instant,
    counts: Mutex<Counts>,
}

/// The counts of [`RequestLog`].
#[derive(Debug, Default)]
struct Counts {
    status: Option<u16>,
    prompt_tokens: usize,
    generated: usize,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
}

impl RequestLog {
    /// A request of `method` to `path` that arrived now.
    pub fn new(method: &str, path: &str) -> Arc<RequestLog> {
        Arc::new(RequestLog {
            method: method.to_owned(),
            path: path.to_owned(),
            started: Instant::now(),
            counts: Mutex::default(),
        })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        // A panic elsewhere while holding the lock leaves counts that are still numbers.
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The HTTP status answered (a stream's is its first).
    pub fn status(&self, status: u16) {
        self.counts().status = Some(status);
    }

    /// A choice's prompt of `tokens` went to the engine.
    pub fn prompt(&self, tokens: usize) {
        self.counts().prompt_tokens += tokens;
    }

    /// A choice generated a token now.
    pub fn token(&self) {
        let now = Instant::now();
        let mut counts = self.counts();
        counts.generated += 1;
        counts.first_token.get_or_insert(now);
        counts.last_token = Some(now);
    }

    /// The log line: `POST /v1/completions 200 prompt=9 generated=64 ttft=0.052s
    /// 31.2 tok/s total=2.103s` (time to first token and tokens/s only where tokens came;
    /// tokens/s over the tokens after the first).
    fn line(&self) -> String {
        let counts = self.counts();
        let status = counts.status.map_or("-".to_owned(), |s| s.to_string());
        let mut line = format!("{} {} {status}", self.method, self.path);
        if counts.prompt_tokens > 0 || counts.generated > 0 {
            line += &format!(
                " prompt={} generated={}",
                counts.prompt_tokens, counts.generated
            );
        }
        if let Some(first) = counts.first_token {
            line += &format!(" ttft={:.3}s", (first - self.started).as_secs_f64());
            let decode = counts.last_token.map_or(0.0, |l| (l - first).as_secs_f64());
            if counts.generated > 1 && decode > 0.0 {
                line += &format!(" {:.1} tok/s", (counts.generated - 1) as f64 / decode);
            }
        }
        line + &format!(" total={:.3}s", self.started.elapsed().as_secs_f64())
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        tracing::info!("{}", self.line());
    }
}

/// Sends `tracing`'s events to stderr: INFO and above, or WARN and above when `quiet`.
pub fn init(quiet: bool) {
    let level = if quiet {
        tracing::Level::WARN
    } else {
        tracing::Level::INFO
    };
    // A second call (tests that serve twice in one process) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_has_the_counts_and_rates() {
        let log = RequestLog::new("POST", "/v1/completions");
        assert!(log.line().starts_with("POST /v1/completions - total="));
        log.status(200);
        log.prompt(9);
        log.prompt(9);
        log.token();
        std::thread::sleep(std::time::Duration::from_millis(20));
        log.token();
        log.token();
        let line = log.line();
        assert!(
            line.starts_with("POST /v1/completions 200 prompt=18 generated=3 ttft="),
            "{line}"
        );
        let rate: f64 = line
            .split(" tok/s")
            .next()
            .unwrap()
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(rate > 0.0 && rate < 2.0 / 0.02, "{line}");
        assert!(line.contains(" total="), "{line}");
    }
}
