//! `GET /metrics`: the server's counters in the Prometheus text exposition format
//! (version 0.0.4), written by the `prometheus-client` crate.
//!
//! Names follow Prometheus' conventions (`_total` counters, `_seconds` histograms) and
//! those of TGI and vLLM for the same quantities. The engine's state (queue length, running
//! sequences, KV blocks) is read when the page is scraped; latencies are measured by the
//! server as the tokens reach the request's handler: time to first token from the arrival
//! of the request, inter-token latency between consecutive tokens of one request.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use flm_models::engine::EngineStats;

/// The labels of `flm_requests_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `chat` or `completions`.
    pub endpoint: String,
    /// The HTTP status answered (a stream that starts counts as 200).
    pub status: String,
}

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    waiting: Gauge,
    running: Gauge,
    free_blocks: Gauge,
    total_blocks: Gauge,
    cached_blocks: Gauge,
    reserved_memory: Gauge,
    prefix_hits: Counter,
    prefix_tokens: Counter,
    prompt_tokens: Counter,
    generated_tokens: Counter,
    cancelled: Counter,
    ttft: Histogram,
    itl: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every metric, with no samples yet.
    pub fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_prefix("flm"),
            requests: Family::default(),
            waiting: Gauge::default(),
            running: Gauge::default(),
            free_blocks: Gauge::default(),
            total_blocks: Gauge::default(),
            cached_blocks: Gauge::default(),
            reserved_memory: Gauge::default(),
            prefix_hits: Counter::default(),
            prefix_tokens: Counter::default(),
            prompt_tokens: Counter::default(),
            generated_tokens: Counter::default(),
            cancelled: Counter::default(),
            // 1 ms to 33 s.
            ttft: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            // 0.25 ms to 8 s.
            itl: Histogram::new(exponential_buckets(0.00025, 2.0, 16)),
        };
        let registry = &mut m.registry;
        registry.register(
            "requests",
            "Completion requests answered, by endpoint and HTTP status",
            m.requests.clone(),
        );
        registry.register(
            "queue_length",
            "Requests waiting to be scheduled",
            m.waiting.clone(),
        );
        registry.register(
            "running_sequences",
            "Sequences in the running batch",
            m.running.clone(),
        );
        registry.register(
            "kv_blocks_free",
            "Free blocks of the paged KV cache, counting the cached prefix blocks no sequence uses",
            m.free_blocks.clone(),
        );
        registry.register(
            "kv_blocks_total",
            "Blocks of the paged KV cache",
            m.total_blocks.clone(),
        );
        registry.register(
            "kv_blocks_cached",
            "Blocks of the paged KV cache held by the prefix cache (in use or evictable)",
            m.cached_blocks.clone(),
        );
        registry.register(
            "prefix_cache_hits",
            "Requests that took at least one KV block from the prefix cache",
            m.prefix_hits.clone(),
        );
        registry.register(
            "prefix_cache_tokens_saved",
            "Prompt tokens whose keys and values came from the prefix cache instead of being \
             computed",
            m.prefix_tokens.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens of accepted requests",
            m.prompt_tokens.clone(),
        );
        registry.register(
            "generated_tokens",
            "Tokens generated",
            m.generated_tokens.clone(),
        );
        registry.register(
            "request_memory_reserved_bytes",
            "Memory the requests in flight hold of the --max-request-memory budget",
            m.reserved_memory.clone(),
        );
        registry.register(
            "cancelled_requests",
            "Requests cancelled because their client went away",
            m.cancelled.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "Time from the arrival of a request to its first generated token",
            m.ttft.clone(),
        );
        registry.register(
            "inter_token_latency_seconds",
            "Time between consecutive generated tokens of a request",
            m.itl.clone(),
        );
        m
    }

    /// Counts a request to `endpoint` answered with `status`.
    pub fn request(&self, endpoint: &str, status: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.to_owned(),
                status: status.to_string(),
            })
            .inc();
    }

    /// Counts the prompt of an accepted request.
    pub fn prompt(&self, tokens: usize) {
        self.prompt_tokens.inc_by(tokens as u64);
    }

    /// Counts a generated token that came `latency` after the request (the first token) or
    /// after the previous token.
    pub fn token(&self, first: bool, latency: Duration) {
        self.generated_tokens.inc();
        let histogram = if first { &self.ttft } else { &self.itl };
        histogram.observe(latency.as_secs_f64());
    }

    /// Counts a request cancelled by its client's disconnection.
    pub fn cancelled(&self) {
        self.cancelled.inc();
    }

    /// The exposition text, with the engine's gauges set from `stats` and the memory the
    /// requests hold from `reserved_bytes`.
    pub fn render(&self, stats: &EngineStats, reserved_bytes: u64) -> String {
        let set = |gauge: &Gauge, v: usize| gauge.set(i64::try_from(v).unwrap_or(i64::MAX));
        self.reserved_memory
            .set(i64::try_from(reserved_bytes).unwrap_or(i64::MAX));
        set(&self.waiting, stats.waiting);
        set(&self.running, stats.running);
        set(&self.free_blocks, stats.free_blocks);
        set(&self.total_blocks, stats.total_blocks);
        set(&self.cached_blocks, stats.cached_blocks);
        // The engine's counters only grow: bring ours up to them.
        let catch_up = |counter: &Counter, v: u64| {
            counter.inc_by(v.saturating_sub(counter.get()));
        };
        catch_up(&self.prefix_hits, stats.prefix_cache_hits);
        catch_up(&self.prefix_tokens, stats.prefix_cached_tokens);
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}
