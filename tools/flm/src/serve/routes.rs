//! The HTTP routes of `flm serve`.
//!
//! | route                       | answer                                                |
//! |-----------------------------|-------------------------------------------------------|
//! | `GET /`                     | the chat page ([`super::page`])                       |
//! | `GET /health`               | `{"status": "ok"}` once the model is loaded           |
//! | `GET /v1/models`            | the served model                                      |
//! | `GET /metrics`              | Prometheus text ([`super::metrics`])                  |
//! | `POST /v1/chat/completions` | a chat reply, whole or streamed                       |
//! | `POST /v1/completions`      | a text continuation, whole or streamed                |
//! | `POST /v1/embeddings`       | pooled hidden states ([`super::embeddings`])          |
//!
//! Every other path answers 404, every bad request 400 and a body over the limit 413, all
//! with an OpenAI-style JSON error.
//!
//! The `POST` routes go through [`admit`] first: it reserves the body's memory in the
//! server's budget ([`super::memory`]) and gives the request its deadline
//! (`--request-timeout`), past which the request's handler is dropped (which cancels its
//! sequences in the engine) and a 504 answers; a stream that started ends with that error
//! as its last event. The CPU-heavy steps of a request (rendering the chat template,
//! tokenizing, compiling a schema) run on tokio's blocking threads, so that a slow or
//! looping one holds neither the runtime's workers (`/health` keeps answering) nor the
//! engine. Rendering a chat template reserves [`memory::RENDER_BYTES`] in the memory
//! budget while it runs (the render's own limits bound what it builds), and the request's
//! generation then takes its own reservation out of that one. Compiling a schema
//! or a regex has a budget: its limits of size
//! ([`flm_core::Grammar::new`]), [`flm_core::MAX_COMPILE_TIME`], and a reservation of
//! [`flm_core::MAX_COMPILE_BYTES`] in the memory budget while it runs; one over a limit, or
//! whose language the model's tokens cannot write, is a 400 about `response_format`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Extension, Request, State as Shared};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use super::embeddings::EmbeddingRequest;
use super::error::ApiError;
use super::generation::{submit, Job};
use super::log::RequestLog;
use super::memory::{self, Held};
use super::openai::{ChatRequest, CompletionRequest, ModelCard, ModelList, Sampling};
use super::respond::{self, Api, Header};
use super::text::Harmony;
use super::{page, params, prompt, schema, tools, State};
use flm_core::{Constraint, Grammar, MAX_COMPILE_BYTES, MAX_COMPILE_TIME};
use flm_tokenizer::HarmonyCall;

/// The largest request body, in bytes (axum's default limit, made explicit because the
/// memory budget counts it).
pub const BODY_LIMIT: u64 = 2 << 20;

/// The body reservation (twice the declared length) from which the memory is given back to
/// the system when the request's handler ends ([`memory::trim`]).
const TRIM_BODY: u64 = 512 << 10;

/// When a request must be answered, set by [`admit`].
#[derive(Debug, Clone, Copy)]
pub struct Deadline(pub tokio::time::Instant);

/// The router of every route, sharing `state`.
pub fn router(state: Arc<State>) -> Router {
    let posts = Router::new()
        .route("/v1/chat/completions", post(generation::<ChatRequest>))
        .route("/v1/completions", post(generation::<CompletionRequest>))
        .route("/v1/embeddings", post(embeddings))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), admit));
    Router::new()
        .route("/", get(|| async { Html(page::HTML) }))
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics))
        .merge(posts)
        .layer(DefaultBodyLimit::max(BODY_LIMIT as usize))
        .fallback(|| async {
            let mut e = ApiError::invalid(None, "no such route");
            e.status = StatusCode::NOT_FOUND;
            e
        })
        .with_state(state)
}

/// The router of the connections over `--max-connections` (`max`): `/health` answers as
/// usual, every other route 503.
pub fn overflow(max: usize) -> Router {
    Router::new()
        .route("/health", get(health))
        .fallback(move || async move {
            ApiError::unavailable(format!(
                "the server has its most open connections ({max}, --max-connections): retry later"
            ))
        })
}

/// The metrics label of a `POST` route.
fn endpoint(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" => Api::Chat.label(),
        "/v1/completions" => Api::Text.label(),
        _ => "embeddings",
    }
}

/// Reserves the memory of `request`'s body (twice its declared length, or of the largest
/// body when it declares none) and runs it with its [`Deadline`]; a refusal (413, 429) or a
/// request past its deadline (504) is answered and counted here.
async fn admit(Shared(state): Shared<Arc<State>>, mut request: Request, next: Next) -> Response {
    let label = endpoint(request.uri().path());
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let log = RequestLog::new(request.method().as_str(), request.uri().path());
    request.extensions_mut().insert(Arc::clone(&log));
    // A longer body is refused (413) by the extractor before it is read.
    let bytes = declared.map_or(BODY_LIMIT, |d| d.min(BODY_LIMIT)) * 2;
    let response = match state.memory.reserve("the request body", bytes) {
        Ok(held) => {
            // What a large body parsed into goes back to the system when it is dropped.
            let _held = if bytes >= TRIM_BODY {
                held.trimming()
            } else {
                held
            };
            let deadline = tokio::time::Instant::now() + state.request_timeout;
            request.extensions_mut().insert(Deadline(deadline));
            match tokio::time::timeout_at(deadline, next.run(request)).await {
                Ok(response) => {
                    log.status(response.status().as_u16());
                    return response;
                }
                Err(_) => ApiError::deadline(state.request_timeout).into_response(),
            }
        }
        Err(e) => e.into_response(),
    };
    log.status(response.status().as_u16());
    state.metrics.request(label, response.status().as_u16());
    response
}

/// Runs `work` on a blocking thread of the runtime: the CPU-heavy part of a request.
async fn blocking<T: Send + 'static>(
    state: &Arc<State>,
    work: impl FnOnce(&State) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let state = Arc::clone(state);
    tokio::task::spawn_blocking(move || work(&state))
        .await
        .map_err(|e| ApiError::internal(format!("the request's task failed: {e}")))?
}

/// Unix time in seconds.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

async fn models(Shared(state): Shared<Arc<State>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: state.model_name.clone(),
            object: "model",
            created: state.started,
            owned_by: "flm",
            max_model_len: state.context,
        }],
    })
}

async fn metrics(Shared(state): Shared<Arc<State>>) -> Response {
    let text = state
        .metrics
        .render(&state.engine.stats(), state.memory.reserved_bytes());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// A generation request of the OpenAI API, served by [`generation`].
trait GenerationRequest: serde::de::DeserializeOwned + Send + 'static {
    /// The API of its endpoint.
    const API: Api;

    /// Its prompt and sampling, read on a blocking thread (rendering and tokenizing take
    /// CPU time).
    fn parse(self, state: &State) -> Result<Parsed, ApiError>;
}

impl GenerationRequest for ChatRequest {
    const API: Api = Api::Chat;

    fn parse(self, state: &State) -> Result<Parsed, ApiError> {
        let tools = tools::check(
            self.tools.as_ref(),
            self.tool_choice.as_ref(),
            state.tokenizer.chat_template(),
        )?;
        let args = prompt::template_args(self.chat_template_kwargs.as_ref())?;
        let rendering = state
            .memory
            .reserve_waiting("rendering the chat template", memory::RENDER_BYTES)?;
        let ids = prompt::chat(&state.tokenizer, &self.messages, tools.as_ref(), &args)?;
        Ok(Parsed {
            ids,
            sampling: self.sampling,
            echo: false,
            tools,
            rendering: Some(rendering),
        })
    }
}

impl GenerationRequest for CompletionRequest {
    const API: Api = Api::Text;

    fn parse(self, state: &State) -> Result<Parsed, ApiError> {
        params::check_completion(&self)?;
        Ok(Parsed {
            ids: prompt::completion(&state.tokenizer, &self.prompt)?,
            sampling: self.sampling,
            echo: self.echo,
            tools: None,
            rendering: None,
        })
    }
}

/// `/v1/chat/completions` and `/v1/completions`: the request is parsed, [`prepare`] queues
/// it and [`answer`] replies; a body that is not the request's JSON is answered as an
/// error.
async fn generation<R: GenerationRequest>(
    Shared(state): Shared<Arc<State>>,
    Extension(deadline): Extension<Deadline>,
    Extension(log): Extension<Arc<RequestLog>>,
    body: Result<Json<R>, JsonRejection>,
) -> Response {
    let arrived = Instant::now();
    let result = match body {
        Ok(Json(request)) => {
            blocking(&state, move |state| {
                let parsed = request.parse(state)?;
                prepare(state, R::API, arrived, log, parsed)
            })
            .await
        }
        Err(rejection) => Err(rejection.into()),
    };
    answer(state, R::API, deadline, result).await
}

async fn embeddings(
    Shared(state): Shared<Arc<State>>,
    body: Result<Json<EmbeddingRequest>, JsonRejection>,
) -> Response {
    let response = match body {
        Ok(Json(request)) => super::embeddings::answer(Arc::clone(&state), request)
            .await
            .map(|v| Json(v).into_response()),
        Err(rejection) => Err(rejection.into()),
    };
    let response = response.unwrap_or_else(IntoResponse::into_response);
    state
        .metrics
        .request("embeddings", response.status().as_u16());
    response
}

/// A completion request as the two endpoints parse it.
struct Parsed {
    ids: prompt::Ids,
    sampling: Sampling,
    /// Completions: start the text with the prompt's.
    echo: bool,
    /// Chat: the checked tools.
    tools: Option<tools::Tools>,
    /// Chat: the render's reservation, of which the generation's is taken.
    rendering: Option<Held>,
}

/// A checked request, ready for the engine.
struct Prepared {
    job: Job,
    /// The text every choice starts with (`echo`), empty for none.
    echo: String,
    tools: Option<tools::Tools>,
    /// The request's reservation in the memory budget, held until its reply ends.
    held: Held,
}

/// Generates the reply to a prepared request, and counts it in the metrics.
async fn answer(
    state: Arc<State>,
    api: Api,
    deadline: Deadline,
    request: Result<Prepared, ApiError>,
) -> Response {
    let response = match request {
        Ok(prepared) => generate(Arc::clone(&state), api, deadline, prepared).await,
        Err(e) => Err(e),
    };
    let response = response.unwrap_or_else(IntoResponse::into_response);
    state
        .metrics
        .request(api.label(), response.status().as_u16());
    response
}

/// What [`prepare`]'s reservation is called in the budget's messages.
const GENERATION: &str = "the request's generation";

/// Checks a parsed request's parameters against the model, reserves the memory of its
/// generation and compiles its constraint: CPU work, run on a blocking thread.
///
/// Errors: 400 for parameters the model cannot serve; 413 or 429 from the memory budget.
fn prepare(
    state: &State,
    api: Api,
    arrived: Instant,
    log: Arc<RequestLog>,
    parsed: Parsed,
) -> Result<Prepared, ApiError> {
    let Parsed {
        mut ids,
        mut sampling,
        echo,
        tools,
        rendering,
    } = parsed;
    // gpt-oss: a call forced to one function is opened by the prompt (see `tools`).
    let harmony = match (api, state.harmony) {
        (Api::Chat, Some(tokens)) => {
            let open_call = tools
                .as_ref()
                .and_then(tools::Tools::forced)
                .map(|name| format!("functions.{name}"));
            if let Some(recipient) = &open_call {
                let header = state
                    .tokenizer
                    .encode_with_specials(&HarmonyCall::json_header(recipient))
                    .map_err(|e| ApiError::internal(format!("cannot open the call: {e}")))?;
                ids.ids.extend(header);
            }
            Some(Harmony { tokens, open_call })
        }
        _ => None,
    };
    let params = params::check(&sampling, &state.model_name, crate::generate::clock_seed())?;
    let (param, default_max, stop_tokens) = match api {
        // OpenAI: a chat reply may fill the context, a completion stops after 16 tokens.
        Api::Chat => ("messages", None, state.tokenizer.chat_stop_ids()),
        Api::Text => (
            "prompt",
            Some(16),
            state.tokenizer.eos_id().into_iter().collect(),
        ),
    };
    let max_tokens = params::budget(
        param,
        params.max_tokens,
        default_max,
        ids.ids.len(),
        state.context,
    )?;
    let bytes = memory::generation_bytes(params.n, ids.ids.len(), max_tokens, params.logprobs);
    let held = state.memory.reserve_from(rendering, GENERATION, bytes)?;
    let format = schema::response_format(sampling.response_format.take().as_ref())?;
    let call = match (&tools, harmony.as_ref().and_then(|h| h.open_call.as_ref())) {
        // The prompt wrote the call's header: the reply is its arguments.
        (Some(tools), Some(_)) => tools.forced().map(|n| tools.arguments(n)).transpose()?,
        _ => tools
            .as_ref()
            .map(tools::Tools::pattern)
            .transpose()?
            .flatten(),
    };
    if format.is_some() && call.is_some() {
        return Err(ApiError::invalid(
            Some("response_format"),
            "response_format cannot be combined with a tool_choice that forces a call",
        ));
    }
    let constraint = match format.or(call) {
        Some(pattern) => {
            // Already on a blocking thread (see the doc above): compiling may take its
            // budget of time and memory, and what it frees goes back to the system.
            let compiling = state
                .memory
                .reserve("compiling the constraint", MAX_COMPILE_BYTES as u64)?;
            let vocabulary = Arc::clone(&state.vocabulary);
            let grammar = Grammar::new(&pattern, vocabulary, MAX_COMPILE_TIME);
            drop((pattern, compiling));
            memory::trim();
            let grammar = grammar.map_err(|e| {
                ApiError::invalid(
                    Some("response_format"),
                    format!("the schema cannot be enforced: {e}"),
                )
            })?;
            Some(Constraint::new(Arc::new(grammar)))
        }
        None => None,
    };
    let held = match &constraint {
        // The constraint is shared by the choices; its memory goes back when they end.
        Some(c) => {
            let bytes = bytes.saturating_add(c.memory_usage() as u64);
            state
                .memory
                .reserve_from(Some(held), GENERATION, bytes)?
                .trimming()
        }
        None => held,
    };
    let echo = if echo {
        state
            .tokenizer
            .decode(&ids.ids)
            .map_err(|e| ApiError::invalid(Some("prompt"), format!("cannot decode it: {e}")))?
    } else {
        String::new()
    };
    let job = Job {
        prompt: ids.ids,
        at_start: ids.at_start,
        params,
        max_tokens,
        stop_tokens,
        arrived,
        constraint,
        log,
        harmony,
    };
    Ok(Prepared {
        job,
        echo,
        tools,
        held,
    })
}

/// Submits the choices of a prepared request and answers.
///
/// Errors: those of [`submit`].
async fn generate(
    state: Arc<State>,
    api: Api,
    deadline: Deadline,
    prepared: Prepared,
) -> Result<Response, ApiError> {
    let Prepared {
        job,
        echo,
        tools,
        held,
    } = prepared;
    let params = &job.params;
    let (stream, include_usage, n) = (params.stream, params.include_usage, params.n);
    // A gpt-oss reply's calls are its harmony messages, unless forced as text.
    let harmony_calls =
        job.harmony.is_some() && !tools.as_ref().is_some_and(|t| t.required_among_several());
    let logprobs = params.logprobs.is_some();
    // Each choice is a request of its own, with the next seed (seeds are bit patterns: the
    // sum wraps, as OpenAI's signed seeds do in two's complement); a refused one cancels
    // those before it when they are dropped.
    let submitted = (0..n)
        .map(|i| {
            let mut job = job.clone();
            job.params.sampler.seed = job.params.sampler.seed.wrapping_add(i as u64);
            submit(&state, job)
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Only the choices hold the constraint now, so that it is freed before `held` trims.
    drop(job);
    let serial = state.next_id.fetch_add(1, Ordering::Relaxed);
    let header = Header {
        api,
        id: match api {
            Api::Chat => format!("chatcmpl-{}-{serial}", state.started),
            Api::Text => format!("cmpl-{}-{serial}", state.started),
        },
        created: unix_now(),
        model: state.model_name.clone(),
        echo,
        logprobs,
        tools: tools.filter(|t| t.choice != tools::Choice::None),
        harmony: harmony_calls,
    };
    if stream {
        Ok(respond::stream(
            state,
            header,
            submitted,
            include_usage,
            deadline.0,
            held,
        ))
    } else {
        respond::whole(state, header, submitted).await
    }
}
