//! `flm serve`: an OpenAI-compatible HTTP server (axum on tokio) in front of the
//! continuous-batching [`Engine`], with a chat page at `/`.
//!
//! Requests are parsed and checked on the tokio runtime, rendered to token ids
//! ([`prompt`]), and handed to the engine, whose scheduler thread batches every running
//! sequence into one forward pass per step. Each request's tokens come back through a
//! channel ([`generation`]) and go out as one JSON object or as server-sent events
//! ([`respond`]). Routes: [`routes`]. Once listening, the server prints one line
//! `flm serve: listening on http://ADDRESS` on stdout, so that a script (or a test that
//! asks for port 0) can find it.
//!
//! Connections are served by hyper's HTTP/1.1 server, with a header read timeout
//! (`--header-timeout`, which also closes idle keep-alive connections) and tower-http's
//! request body timeout (`--body-timeout`, between the body's pieces). At most
//! `--max-connections` connections are served; [`OVERFLOW_CONNECTIONS`] more get a short
//! header timeout and a router that answers `/health` and refuses the rest with 503, and
//! any beyond are closed at once, so that a flood of idle connections neither exhausts the
//! process's file descriptors nor makes `/health` time out. Requests have a deadline
//! (`--request-timeout`) and a share of a memory budget (`--max-request-memory`, see
//! [`memory`]). On Ctrl-C or SIGTERM the server stops accepting, lets the open connections
//! finish for [`SHUTDOWN_GRACE`] at most, then exits, cancelling what still runs.

mod embeddings;
mod error;
#[cfg(test)]
mod fuzz;
mod generation;
mod log;
mod memory;
mod metrics;
mod openai;
mod page;
mod params;
mod prompt;
mod respond;
mod routes;
mod schema;
mod text;
mod tools;

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use flm_core::Vocabulary;
use flm_models::engine::{Engine, EngineConfig};
use flm_tokenizer::Tokenizer;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower_http::timeout::RequestBodyTimeout;

use crate::{set_threads, ModelArgs};
use embeddings::{Embedder, Pooling};
use error::ApiError;
use metrics::Metrics;

/// `flm serve` arguments.
#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Tokens (prompt and generated) the running batch may hold at once: this sizes the
    /// paged KV cache (default: the engine's).
    #[arg(long)]
    max_batch_total_tokens: Option<usize>,
    /// Prompt tokens prefilled in one step at most (default: the engine's).
    #[arg(long)]
    max_batch_prefill_tokens: Option<usize>,
    /// Tokens of one step at most, decode and prefill together: long prompts are prefilled
    /// in chunks of what the decoding streams leave, which bounds their time per output
    /// token while a long prompt arrives (default: no bound besides the prefill budget).
    #[arg(long)]
    max_batch_tokens: Option<usize>,
    /// The model's name in the API (default: the model file's or directory's name).
    #[arg(long)]
    model_name: Option<String>,
    /// How /v1/embeddings pools a sequence's hidden states (default: as the model
    /// directory's sentence-transformers 1_Pooling/config.json says, else the last token).
    #[arg(long, value_enum)]
    pooling: Option<Pooling>,
    /// Seconds a request may take, from its arrival to the end of its reply (streamed or
    /// not); past them, its generation is cancelled and it is answered 504 (or its stream
    /// ends with that error).
    #[arg(long, default_value = "600", value_parser = seconds)]
    request_timeout: Duration,
    /// Seconds a client has to send a request's headers (and an idle keep-alive connection
    /// stays open); past them the connection is closed.
    #[arg(long, default_value = "10", value_parser = seconds)]
    header_timeout: Duration,
    /// Seconds a request's body may pause between two of its pieces; past them it is
    /// answered 408.
    #[arg(long, default_value = "10", value_parser = seconds)]
    body_timeout: Duration,
    /// Connections served at once; 64 more are told 503 (only /health answers on them),
    /// and those beyond are closed at once.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=65536))]
    max_connections: u64,
    /// MiB of memory that the requests being served may make flm hold in all (bodies,
    /// prompts, replies, log-probabilities, embeddings, as estimated bounds); a request
    /// over it is answered 413, one that does not fit beside the others 429.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=4 << 20))]
    max_request_memory: u32,
    /// Print no line per request on stderr (only warnings).
    #[arg(long, short = 'q')]
    quiet: bool,
}

/// A duration given in seconds (a decimal number above 0, at most a day).
fn seconds(text: &str) -> Result<Duration, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !(value > 0.0 && value <= 86_400.0) {
        return Err(format!(
            "{value} s: a timeout is above 0 s and at most a day"
        ));
    }
    Ok(Duration::from_secs_f64(value))
}

/// Connections served beyond `--max-connections` with the overflow router (503 but for
/// `/health`).
pub const OVERFLOW_CONNECTIONS: usize = 64;

/// The header timeout of the overflow connections.
const OVERFLOW_HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the open connections may go on after Ctrl-C or SIGTERM.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// How long the blocking threads (a request's prompt being rendered) may go on after the
/// connections are closed, before the process exits without them.
const BLOCKING_GRACE: Duration = Duration::from_secs(1);

/// The HTTP limits of the server.
struct Limits {
    header_timeout: Duration,
    body_timeout: Duration,
    max_connections: usize,
}

/// What every handler shares.
pub struct State {
    engine: Engine,
    tokenizer: Arc<Tokenizer>,
    /// gpt-oss's harmony tokens, if the vocabulary has them: chat replies are then split
    /// into `reasoning_content` and `content` by their channels.
    harmony: Option<flm_tokenizer::HarmonyTokens>,
    metrics: Metrics,
    /// `None` with `--gpu-layers`, whose placed weights a second executor cannot use.
    embedder: Option<Embedder>,
    /// Each token's bytes, for structured output.
    vocabulary: Arc<Vocabulary>,
    model_name: String,
    /// Positions of the model's context: prompt plus reply.
    context: usize,
    /// Unix seconds when the server started.
    started: u64,
    /// The serial number of the next response id.
    next_id: AtomicU64,
    /// The deadline of a request (`--request-timeout`).
    request_timeout: Duration,
    /// What requests may hold (`--max-request-memory`).
    memory: memory::Budget,
}

/// An error of [`Engine::submit`] as an answer: 503 for a request the engine cannot queue
/// now (its queue is full, or it has stopped), 500 for a model in a state it should never be
/// in (a fault of flm, not of the request), 400 for one it can never run (a prompt too long
/// for the context or the KV pool, a bad token or sampling parameter).
fn engine_error(e: flm_models::Error) -> ApiError {
    use flm_models::Error;
    match e {
        Error::QueueFull { .. } | Error::EngineStopped => ApiError::unavailable(e.to_string()),
        Error::State(_) => ApiError::internal(e.to_string()),
        Error::PromptTooLong { .. } => {
            ApiError::invalid(None, e.to_string()).with_code("context_length_exceeded")
        }
        e => ApiError::invalid(None, e.to_string()),
    }
}

/// The model's name in the API: the file name without its extension, or the directory's.
fn default_name(model: &Path) -> String {
    let name = if model.is_dir() {
        model.file_name()
    } else {
        model.file_stem()
    };
    name.map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
}

/// Every token's bytes in the middle of a text ([`Tokenizer::token_bytes`]).
fn vocabulary(tokenizer: &Tokenizer) -> Vocabulary {
    let tokens: Vec<_> = (0..tokenizer.vocab_size() as u32)
        .map(|id| tokenizer.token_bytes(id))
        .collect();
    Vocabulary::new(&tokens)
}

/// Loads the model, starts the engine and serves until Ctrl-C or SIGTERM.
///
/// Errors: a model that cannot be loaded, an engine configuration it refuses, an address
/// that cannot be bound.
pub fn run(args: ServeArgs) -> Result<()> {
    log::init(args.quiet);
    memory::tune_allocator();
    set_threads(args.model.threads)?;
    let path = &args.model.model;
    let chosen = args.model.executor()?;
    let Some((model, tokenizer)) = crate::load::shared_model(&args.model, &chosen)? else {
        // A rank of an MPI job other than 0 has served rank 0's engine to its end.
        return Ok(());
    };
    // Embeddings run op by op from host memory: a model placed on a GPU serves none.
    let placed = model.placement().is_some_and(|p| !p.is_host());
    let embedder = if placed {
        None
    } else {
        let pooling = args
            .pooling
            .or_else(|| Pooling::from_model_dir(path))
            .unwrap_or(Pooling::Last);
        let exec = args.model.executor()?.exec;
        Some(Embedder::new(model.clone(), exec, pooling))
    };
    let mut config = EngineConfig::default();
    if let Some(n) = args.max_batch_total_tokens {
        config.max_batch_total_tokens = n;
    }
    if let Some(n) = args.max_batch_prefill_tokens {
        config.max_batch_prefill_tokens = n;
    }
    config.max_batch_tokens = args.max_batch_tokens;
    let engine = Engine::new(model, chosen.exec, config).context("cannot start the engine")?;
    let context = engine.config().max_seq_len;
    let state = Arc::new(State {
        engine,
        vocabulary: Arc::new(vocabulary(&tokenizer)),
        harmony: tokenizer.harmony_tokens(),
        tokenizer: Arc::new(tokenizer),
        metrics: Metrics::new(),
        embedder,
        model_name: args.model_name.unwrap_or_else(|| default_name(path)),
        context,
        started: routes::unix_now(),
        next_id: AtomicU64::new(0),
        request_timeout: args.request_timeout,
        memory: memory::Budget::new(args.max_request_memory),
    });
    let limits = Limits {
        header_timeout: args.header_timeout,
        body_timeout: args.body_timeout,
        max_connections: usize::try_from(args.max_connections)?,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let served = runtime.block_on(serve(state, &limits, &args.host, args.port));
    // Requests still running are dropped with their tasks, which cancels them in the engine;
    // a blocking thread still rendering a prompt is left behind.
    runtime.shutdown_timeout(BLOCKING_GRACE);
    served
}

/// Serves connections until Ctrl-C or SIGTERM, then for [`SHUTDOWN_GRACE`] at most.
async fn serve(state: Arc<State>, limits: &Limits, host: &str, port: u16) -> Result<()> {
    let listener = tokio::net::TcpListener::bind((host, port))
        .await
        .with_context(|| format!("cannot listen on {host}:{port}"))?;
    let address: SocketAddr = listener.local_addr()?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "flm serve: listening on http://{address}")?;
    out.flush()?;
    drop(out);
    let app = RequestBodyTimeout::new(routes::router(state), limits.body_timeout);
    let refuse = routes::overflow(limits.max_connections);
    // Connections, not requests, are capped here, at accept: tower's limit layers
    // (ConcurrencyLimit, load shedding) count requests in flight, while idle keep-alive and
    // half-open connections, which hold file descriptors, have none; the timeouts are
    // hyper's header timeout and tower-http's RequestBodyTimeout.
    let served = Arc::new(Semaphore::new(limits.max_connections));
    let overflow = Arc::new(Semaphore::new(OVERFLOW_CONNECTIONS));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut refusing = http.clone();
    refusing
        .header_read_timeout(OVERFLOW_HEADER_TIMEOUT)
        .keep_alive(false);
    let graceful = GracefulShutdown::new();
    let stop = shutdown();
    tokio::pin!(stop);
    loop {
        let socket = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => socket,
                Err(_) => {
                    // Out of file descriptors, or a connection reset before it was
                    // accepted: let the open connections close some.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let io = TokioIo::new(socket);
        if let Ok(permit) = Arc::clone(&served).try_acquire_owned() {
            let service = TowerToHyperService::new(app.clone());
            spawn_connection(graceful.watch(http.serve_connection(io, service)), permit);
        } else if let Ok(permit) = Arc::clone(&overflow).try_acquire_owned() {
            let service = TowerToHyperService::new(refuse.clone());
            let connection = refusing.serve_connection(io, service);
            spawn_connection(graceful.watch(connection), permit);
        }
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        eprintln!(
            "flm serve: connections still open {} s after the signal: closing them",
            SHUTDOWN_GRACE.as_secs()
        );
    }
    Ok(())
}

/// Serves `connection` on a task of its own, which holds `permit` until it closes.
fn spawn_connection<F>(connection: F, permit: OwnedSemaphorePermit)
where
    F: Future + Send + 'static,
{
    tokio::spawn(async move {
        // A connection's error (a client gone, a header timeout) ends only it.
        let _ = connection.await;
        drop(permit);
    });
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_positive_seconds_up_to_a_day() {
        assert_eq!(seconds("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(seconds("600"), Ok(Duration::from_secs(600)));
        for bad in ["0", "-1", "NaN", "inf", "86401", "ten", ""] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
    }
}
