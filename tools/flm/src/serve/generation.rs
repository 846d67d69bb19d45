//! One request's trip through the engine: submitting it, and turning the engine's token
//! events into text for the client.
//!
//! The engine calls a request's event callback on its scheduler thread; the callback
//! forwards each event into a channel read by the request's handler. When the handler is
//! gone (the client disconnected, or a stop sequence ended the reply) the channel is
//! closed, the callback's send fails and it returns [`ControlFlow::Break`], which cancels
//! the sequence in the engine at once and frees its KV blocks. Dropping a [`Submitted`]
//! also sets the request's cancel flag, which the engine reads before every step: a request
//! still waiting in its queue, or prefilling a long prompt, leaves it without producing a
//! token first.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use flm_core::{Constraint, TokenLogprobs};
use flm_models::engine::{Event, FinishReason, Request};
use flm_tokenizer::{HarmonyCall, Tokenizer};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::error::ApiError;
use super::log::RequestLog;
use super::openai::Usage;
use super::params::Params;
use super::text::{Detokenizer, Harmony, Shown};
use super::State;

/// A checked request, ready for the engine (one per choice).
#[derive(Debug, Clone)]
pub struct Job {
    /// The prompt ids from position 0 (prefix tokens included).
    pub prompt: Vec<u32>,
    /// Only the prefix tokens precede the reply (see `Tokenizer::stream_decoder`).
    pub at_start: bool,
    /// Sampling and stop settings.
    pub params: Params,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Token ids that end the reply (EOS, chat stop tokens).
    pub stop_tokens: Vec<u32>,
    /// When the request arrived (for the time to first token).
    pub arrived: Instant,
    /// The structured output's constraint, if any.
    pub constraint: Option<Constraint>,
    /// The request's log line, shared by its choices.
    pub log: Arc<RequestLog>,
    /// Split the reply into reasoning, content and tool calls by gpt-oss's harmony
    /// channels (a chat request to a model whose vocabulary has them); `None`: plain text.
    pub harmony: Option<Harmony>,
}

/// One generated token's log-probability and its most likely alternatives', each token
/// as its text alone (a byte piece that is not a whole character shows as U+FFFD).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its natural log-probability.
    pub logprob: f32,
    /// The most likely tokens' texts and log-probabilities, most likely first.
    pub top: Vec<(String, f32)>,
}

impl TokenLogprob {
    fn new(tokenizer: &Tokenizer, id: u32, l: &TokenLogprobs) -> TokenLogprob {
        let text = |id: u32| {
            let mut decoder = tokenizer.stream_decoder(false);
            let mut text = decoder.push(id).unwrap_or_default();
            text.push_str(&decoder.finish());
            text
        };
        TokenLogprob {
            token: text(id),
            logprob: l.logprob,
            top: l.top.iter().map(|&(t, lp)| (text(t), lp)).collect(),
        }
    }
}

/// Text to show, and the log-probabilities (if asked for) of the tokens generated since
/// the previous piece: those tokens produced this text, or text still held back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Piece {
    /// The visible text (for gpt-oss, the final answer's); empty when only
    /// log-probabilities or reasoning are due.
    pub text: String,
    /// Reasoning text (gpt-oss's analysis channel), OpenAI's `reasoning_content`; always
    /// empty for other models.
    pub reasoning: String,
    /// One per token.
    pub logprobs: Vec<TokenLogprob>,
}

/// How a reply ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// OpenAI's `finish_reason`: `stop` (an end token or a stop sequence) or `length`.
    pub finish_reason: &'static str,
    /// Token counts.
    pub usage: Usage,
    /// The tool calls of a harmony reply (gpt-oss), in order; empty for other models.
    pub calls: Vec<HarmonyCall>,
}

/// The end of [`drive`]: the reply is complete, the client left first, or it failed.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The reply ended.
    Done(Done),
    /// `emit` refused text: nobody is listening any more.
    ClientGone,
    /// The engine failed, or shut down first.
    Failed(ApiError),
}

/// A submitted job: the engine's events for it, and what reading them needs.
pub struct Submitted {
    prompt_tokens: usize,
    at_start: bool,
    stop: Vec<String>,
    harmony: Option<Harmony>,
    arrived: Instant,
    log: Arc<RequestLog>,
    events: UnboundedReceiver<Event>,
    _cancel: CancelOnDrop,
}

/// Sets the engine request's cancel flag when dropped, whether the request ended or its
/// handler was dropped (a client gone, a deadline passed).
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Hands `job` to the engine.
///
/// Errors: 400 for a request the engine refuses (a bad prompt or parameter), 503 when its
/// queue is full.
pub fn submit(state: &State, job: Job) -> Result<Submitted, ApiError> {
    let (tx, events) = unbounded_channel();
    let prompt_tokens = job.prompt.len();
    let cancel = Arc::new(AtomicBool::new(false));
    let request = Request {
        prompt: job.prompt,
        sampler: job.params.sampler,
        max_tokens: job.max_tokens,
        stop_tokens: job.stop_tokens,
        logprobs: job.params.logprobs,
        constraint: job.constraint,
        cancel: Some(Arc::clone(&cancel)),
    };
    let on_event = Box::new(move |event| match tx.send(event) {
        Ok(()) => ControlFlow::Continue(()),
        Err(_) => ControlFlow::Break(()),
    });
    state
        .engine
        .submit(request, on_event)
        .map_err(super::engine_error)?;
    state.metrics.prompt(prompt_tokens);
    job.log.prompt(prompt_tokens);
    Ok(Submitted {
        prompt_tokens,
        at_start: job.at_start,
        stop: job.params.stop,
        harmony: job.harmony,
        arrived: job.arrived,
        log: job.log,
        events,
        _cancel: CancelOnDrop(cancel),
    })
}

/// Counts a request as cancelled in the metrics if it is dropped before it is done: its
/// client went away (a stream that cannot be written, or a whole response whose connection
/// closed, which drops the handler's future).
struct Unfinished<'a>(Option<&'a super::metrics::Metrics>);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(metrics) = self.0 {
            metrics.cancelled();
        }
    }
}

/// Reads the events of `submitted` until the reply ends, calling `emit` with each piece of
/// visible text or log-probabilities (never both empty); `emit` returns false when the text can no longer be
/// delivered, which ends the request (the engine cancels it when its next event finds the
/// channel closed; so does dropping this future). Records the latency metrics.
pub async fn drive(
    state: &State,
    submitted: Submitted,
    emit: impl FnMut(Piece) -> bool,
) -> Outcome {
    let mut unfinished = Unfinished(Some(&state.metrics));
    let outcome = events(state, submitted, emit).await;
    if outcome != Outcome::ClientGone {
        unfinished.0 = None;
    }
    outcome
}

async fn events(
    state: &State,
    submitted: Submitted,
    mut emit: impl FnMut(Piece) -> bool,
) -> Outcome {
    let Submitted {
        prompt_tokens,
        at_start,
        stop,
        harmony,
        arrived,
        log,
        mut events,
        _cancel,
    } = submitted;
    let mut text = Detokenizer::new(&state.tokenizer, at_start, stop, harmony);
    let mut last = arrived;
    let mut generated = 0;
    let mut logprobs = Vec::new();
    let mut deliver = |shown: Shown, logprobs: &mut Vec<TokenLogprob>| {
        (shown.content.is_empty() && shown.reasoning.is_empty() && logprobs.is_empty())
            || emit(Piece {
                text: shown.content,
                reasoning: shown.reasoning,
                logprobs: std::mem::take(logprobs),
            })
    };
    let done = |finish_reason, generated, calls| {
        Outcome::Done(Done {
            finish_reason,
            usage: Usage::new(prompt_tokens, generated),
            calls,
        })
    };
    while let Some(event) = events.recv().await {
        match event {
            Event::Token(id, l) => {
                if let Some(l) = l {
                    logprobs.push(TokenLogprob::new(&state.tokenizer, id, &l));
                }
                let now = Instant::now();
                state.metrics.token(generated == 0, now - last);
                log.token();
                last = now;
                generated += 1;
                let shown = match text.push(id) {
                    Ok(step) => step,
                    Err(e) => return Outcome::Failed(ApiError::internal(e.to_string())),
                };
                let stopped = shown.stopped;
                if !deliver(shown, &mut logprobs) {
                    return Outcome::ClientGone;
                }
                if stopped {
                    return done("stop", generated, Vec::new());
                }
            }
            Event::Finished(finish) => {
                let reason = match finish.reason {
                    FinishReason::Stop => "stop",
                    FinishReason::Length => "length",
                    FinishReason::Cancelled => {
                        return Outcome::Failed(ApiError::unavailable(
                            "the engine shut down before the reply ended",
                        ))
                    }
                    FinishReason::Error(e) => return Outcome::Failed(ApiError::internal(e)),
                    FinishReason::Constraint(e) => {
                        return Outcome::Failed(ApiError::invalid(
                            Some("response_format"),
                            format!("the model's tokens cannot write the rest of the reply: {e}"),
                        ))
                    }
                };
                let (shown, calls) = text.finish();
                if !deliver(shown, &mut logprobs) {
                    return Outcome::ClientGone;
                }
                return done(reason, finish.completion_tokens, calls);
            }
        }
    }
    Outcome::Failed(ApiError::internal(
        "the engine dropped the request without finishing it",
    ))
}
