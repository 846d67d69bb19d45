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

mod embeddings;
mod error;
#[cfg(test)]
mod fuzz;
mod generation;
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

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use flm_core::Vocabulary;
use flm_models::engine::{Engine, EngineConfig};
use flm_models::session;
use flm_tokenizer::Tokenizer;

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
}

/// What every handler shares.
pub struct State {
    engine: Engine,
    tokenizer: Arc<Tokenizer>,
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
}

/// An error of [`Engine::submit`] as an answer: 503 for a request the engine cannot queue
/// now (its queue is full, or it has stopped), 400 for one it can never run (a prompt too
/// long for the context or the KV pool, a bad token or sampling parameter).
fn engine_error(e: flm_models::Error) -> ApiError {
    use flm_models::Error;
    match e {
        Error::QueueFull { .. } | Error::EngineStopped => ApiError::unavailable(e.to_string()),
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
    set_threads(args.model.threads)?;
    let path = &args.model.model;
    let chosen = args.model.device.executor()?;
    let (model, tokenizer) =
        session::load_model(path, args.model.tokenizer.as_deref(), args.model.context)
            .with_context(|| format!("cannot load the model {}", path.display()))?;
    let model = chosen.place(model)?;
    // Embeddings run op by op from host memory: a model placed on a GPU serves none.
    let placed = model.llama().is_some_and(|m| !m.placement().is_host());
    let embedder = if placed {
        None
    } else {
        let pooling = args
            .pooling
            .or_else(|| Pooling::from_model_dir(path))
            .unwrap_or(Pooling::Last);
        let exec = args.model.device.executor()?.exec;
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
        tokenizer: Arc::new(tokenizer),
        metrics: Metrics::new(),
        embedder,
        model_name: args.model_name.unwrap_or_else(|| default_name(path)),
        context,
        started: routes::unix_now(),
        next_id: AtomicU64::new(0),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve(state, &args.host, args.port))
}

async fn serve(state: Arc<State>, host: &str, port: u16) -> Result<()> {
    let listener = tokio::net::TcpListener::bind((host, port))
        .await
        .with_context(|| format!("cannot listen on {host}:{port}"))?;
    let address: SocketAddr = listener.local_addr()?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "flm serve: listening on http://{address}")?;
    out.flush()?;
    drop(out);
    axum::serve(listener, routes::router(state))
        .with_graceful_shutdown(shutdown())
        .await
        .context("the server failed")
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
