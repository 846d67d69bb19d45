//! Answering a completion request: one JSON object, or server-sent events in OpenAI's
//! streaming format.
//!
//! A stream is a sequence of `data: {chunk}` events, the chunks being
//! `chat.completion.chunk` objects (the first of each choice with `delta.role`, then
//! `delta.content` pieces, and for gpt-oss `delta.reasoning_content` pieces of its analysis
//! channel, the last with an empty delta and `finish_reason`) or
//! `text_completion` objects (`text` pieces, then `finish_reason`), each naming its choice
//! by `index`, optionally a usage chunk with no choices (`stream_options.include_usage`),
//! and `data: [DONE]` (OpenAI API reference, "Streaming"). The `n` choices of a request are
//! generated at once, as sequences of their own in the engine, and their chunks interleave.
//! An error after the stream has started is sent as `data: {"error": {...}}`, as OpenAI
//! does, and the stream ends.
//!
//! Log-probabilities, when asked for, go with the text they produced: in OpenAI's chat
//! shape (`logprobs.content`, a list of `{token, logprob, bytes, top_logprobs}`) or its
//! completion shape (`tokens`, `token_logprobs`, `top_logprobs` as maps, `text_offset` in
//! characters of the choice's text).

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::mpsc::unbounded_channel;
use tokio::task::JoinSet;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::error::ApiError;
use super::generation::{drive, Done, Outcome, Piece, Submitted, TokenLogprob};
use super::memory::Held;
use super::openai::{ChatBody, ChatChoice, Completion, Delta, TextChoice, Usage};
use super::tools::Tools;
use super::State;
use flm_tokenizer::HarmonyCall;

/// Which API a request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Text,
}

impl Api {
    /// The endpoint's label in the metrics.
    pub fn label(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Text => "completions",
        }
    }
}

/// What every object of one response shares.
#[derive(Debug, Clone)]
pub struct Header {
    /// The API.
    pub api: Api,
    /// `chatcmpl-N` or `cmpl-N`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// The text every choice starts with (`echo`: the prompt's), empty for none.
    pub echo: String,
    /// Whether the request asked for log-probabilities.
    pub logprobs: bool,
    /// Chat with tools whose calls are parsed from the reply (not `tool_choice: none`).
    pub tools: Option<Tools>,
    /// A gpt-oss chat: the reply's calls are its harmony messages to `functions.NAME`,
    /// apart from its text, which therefore streams as it comes even with tools.
    pub harmony: bool,
}

/// One choice's part of an object: its index, its text (of a chunk, or all of it), the
/// log-probabilities of the tokens it holds, the character offset of its text in the
/// choice's, and its finish reason.
struct Part<'a> {
    index: usize,
    role: bool,
    text: Option<String>,
    /// Reasoning (gpt-oss's analysis channel): chat only, `None` when there is none.
    reasoning: Option<String>,
    tool_calls: Option<Vec<Value>>,
    logprobs: &'a [TokenLogprob],
    offset: usize,
    finish: Option<&'static str>,
}

impl<'a> Part<'a> {
    /// A streamed part of choice `index`, without the role.
    fn chunk(
        index: usize,
        text: Option<String>,
        logprobs: &'a [TokenLogprob],
        offset: usize,
        finish: Option<&'static str>,
    ) -> Part<'a> {
        Part {
            index,
            role: false,
            text,
            reasoning: None,
            tool_calls: None,
            logprobs,
            offset,
            finish,
        }
    }
}

/// OpenAI's chat `logprobs` object of `tokens`.
fn chat_logprobs(tokens: &[TokenLogprob]) -> Value {
    let entry = |token: &str, logprob: f32| json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()});
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(&t.token, t.logprob);
            e["top_logprobs"] = t.top.iter().map(|(tok, lp)| entry(tok, *lp)).collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// OpenAI's completion `logprobs` object of `tokens`, whose text starts `offset` characters
/// into the choice's.
fn text_logprobs(tokens: &[TokenLogprob], mut offset: usize) -> Value {
    let mut text_offset = Vec::with_capacity(tokens.len());
    for t in tokens {
        text_offset.push(offset);
        offset += t.token.chars().count();
    }
    let top: Vec<serde_json::Map<String, Value>> = tokens
        .iter()
        .map(|t| {
            t.top
                .iter()
                .map(|(tok, lp)| (tok.clone(), json!(lp)))
                .collect()
        })
        .collect();
    json!({
        "tokens": tokens.iter().map(|t| &t.token).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}

impl Header {
    fn object<C: Serialize>(
        &self,
        object: &'static str,
        choices: Vec<C>,
        usage: Option<Usage>,
    ) -> Value {
        let completion = Completion {
            id: self.id.clone(),
            object,
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        };
        // Plain structs of strings and numbers always serialise.
        serde_json::to_value(completion).unwrap_or_default()
    }

    /// The object of `parts`: a chunk (`whole` false) or a whole response with `usage`.
    fn with_parts(&self, whole: bool, parts: Vec<Part<'_>>, usage: Option<Usage>) -> Value {
        match self.api {
            Api::Chat => {
                let choices = parts
                    .into_iter()
                    .map(|p| {
                        let delta = Delta {
                            role: p.role.then_some("assistant"),
                            content: p.text,
                            reasoning_content: p.reasoning,
                            tool_calls: p.tool_calls,
                        };
                        ChatChoice {
                            index: p.index,
                            body: if whole {
                                ChatBody::Message(delta)
                            } else {
                                ChatBody::Delta(delta)
                            },
                            logprobs: self.logprobs.then(|| chat_logprobs(p.logprobs)),
                            finish_reason: p.finish,
                        }
                    })
                    .collect();
                let object = if whole {
                    "chat.completion"
                } else {
                    "chat.completion.chunk"
                };
                self.object(object, choices, usage)
            }
            Api::Text => {
                let choices = parts
                    .into_iter()
                    .map(|p| TextChoice {
                        index: p.index,
                        text: p.text.unwrap_or_default(),
                        logprobs: self.logprobs.then(|| text_logprobs(p.logprobs, p.offset)),
                        finish_reason: p.finish,
                    })
                    .collect();
                self.object("text_completion", choices, usage)
            }
        }
    }

    /// Choice `index`'s reply `text` as content and tool calls, and its finish reason
    /// (`tool_calls` when it called any, unless it was cut at `length`), when the request
    /// has tools: a harmony reply's calls are `harmony_calls`, other replies' are parsed
    /// from `text`.
    fn calls(
        &self,
        text: &str,
        harmony_calls: &[HarmonyCall],
        index: usize,
        finish: &'static str,
    ) -> (Option<String>, Option<Vec<Value>>, &'static str) {
        match &self.tools {
            None => (Some(text.to_owned()), None, finish),
            Some(tools) => {
                let id = format!("call-{}-{index}", self.id);
                let (content, calls) = if self.harmony {
                    let content = (!text.is_empty()).then(|| text.to_owned());
                    (content, tools.harmony_calls(harmony_calls, &id))
                } else {
                    tools.parse(text, &id)
                };
                match finish {
                    _ if calls.is_empty() => (content, None, finish),
                    // A reply cut by `max_tokens` says so, whatever calls it had begun.
                    "length" => (content, Some(calls), finish),
                    _ => (content, Some(calls), "tool_calls"),
                }
            }
        }
    }

    /// A streamed chunk of one choice.
    fn chunk(&self, part: Part<'_>) -> String {
        self.with_parts(false, vec![part], None).to_string()
    }

    /// The chunk with no choices and the usage.
    fn usage_chunk(&self, usage: Usage) -> String {
        let object = match self.api {
            Api::Chat => "chat.completion.chunk",
            Api::Text => "text_completion",
        };
        self.object::<TextChoice>(object, Vec::new(), Some(usage))
            .to_string()
    }
}

/// The usage of a request whose choices ended with `done`: the prompt once, the generated
/// tokens of every choice.
fn total_usage<'a>(done: impl Iterator<Item = &'a Done>) -> Usage {
    let (mut prompt, mut completion) = (0, 0);
    for d in done {
        prompt = d.usage.prompt_tokens;
        completion += d.usage.completion_tokens;
    }
    Usage::new(prompt, completion)
}

/// Generates every choice's whole reply, then answers one JSON object.
///
/// Errors: 500 when the engine fails, 503 when it shuts down first. (A client that goes
/// away drops this future with its connection, and the choices' tasks with it, which
/// cancels the requests.)
pub async fn whole(
    state: Arc<State>,
    header: Header,
    submitted: Vec<Submitted>,
) -> Result<Response, ApiError> {
    let mut tasks = JoinSet::new();
    for (index, submitted) in submitted.into_iter().enumerate() {
        let state = Arc::clone(&state);
        tasks.spawn(async move {
            let (mut text, mut reasoning, mut logprobs) =
                (String::new(), String::new(), Vec::new());
            let outcome = drive(&state, submitted, |piece| {
                text.push_str(&piece.text);
                reasoning.push_str(&piece.reasoning);
                logprobs.extend(piece.logprobs);
                true
            })
            .await;
            (index, text, reasoning, logprobs, outcome)
        });
    }
    let mut choices = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (index, text, reasoning, logprobs, outcome) =
            joined.map_err(|e| ApiError::internal(format!("a choice's task failed: {e}")))?;
        match outcome {
            Outcome::Done(done) => choices.push((index, text, reasoning, logprobs, done)),
            // `emit` above never refuses text.
            Outcome::ClientGone => return Err(ApiError::internal("the reply was dropped")),
            Outcome::Failed(e) => return Err(e),
        }
    }
    choices.sort_by_key(|c| c.0);
    let usage = total_usage(choices.iter().map(|c| &c.4));
    let echo_chars = header.echo.chars().count();
    let parts = choices
        .iter()
        .map(|(index, text, reasoning, logprobs, done)| {
            let (text, tool_calls, finish) =
                header.calls(text, &done.calls, *index, done.finish_reason);
            Part {
                index: *index,
                role: true,
                // OpenAI's `content` is null beside tool calls.
                text: text.map(|text| format!("{}{text}", header.echo)),
                reasoning: (!reasoning.is_empty()).then(|| reasoning.clone()),
                tool_calls,
                logprobs,
                offset: echo_chars,
                finish: Some(finish),
            }
        })
        .collect();
    Ok(Json(header.with_parts(true, parts, Some(usage))).into_response())
}

/// Answers with a stream of server-sent events, generated by a task of its own (with one
/// task per choice) that ends, and cancels the requests in the engine, when the client
/// disconnects or at `deadline` (then with a 504 error event); it holds the request's
/// memory reservation `held` until then.
pub fn stream(
    state: Arc<State>,
    header: Header,
    submitted: Vec<Submitted>,
    include_usage: bool,
    deadline: tokio::time::Instant,
    held: Held,
) -> Response {
    let (tx, rx) = unbounded_channel::<Result<Event, Infallible>>();
    let header = Arc::new(header);
    tokio::spawn(async move {
        let _held = held;
        let mut tasks = JoinSet::new();
        for (index, submitted) in submitted.into_iter().enumerate() {
            let (state, header, tx) = (Arc::clone(&state), Arc::clone(&header), tx.clone());
            tasks.spawn(async move {
                let send = |data: String| tx.send(Ok(Event::default().data(data))).is_ok();
                let first = match header.api {
                    Api::Chat => Part {
                        role: true,
                        ..Part::chunk(index, Some(String::new()), &[], 0, None)
                    },
                    Api::Text => Part::chunk(index, Some(header.echo.clone()), &[], 0, None),
                };
                if (header.api == Api::Chat || !header.echo.is_empty())
                    && !send(header.chunk(first))
                {
                    return Outcome::ClientGone;
                }
                let mut offset = header.echo.chars().count();
                // With tools, the reply is held until its end, where its calls are known
                // (a harmony reply's calls are apart from its text, which need not wait).
                let hold = header.tools.is_some() && !header.harmony;
                let mut held = (String::new(), Vec::new(), String::new());
                let outcome = drive(&state, submitted, |piece: Piece| {
                    if hold {
                        held.0.push_str(&piece.text);
                        held.1.extend(piece.logprobs);
                        held.2.push_str(&piece.reasoning);
                        return true;
                    }
                    // A piece of reasoning alone (gpt-oss) carries no `content`.
                    let reasoning = (!piece.reasoning.is_empty()).then_some(piece.reasoning);
                    let text =
                        (reasoning.is_none() || !piece.text.is_empty()).then_some(piece.text);
                    let mut part = Part::chunk(index, text, &piece.logprobs, offset, None);
                    part.reasoning = reasoning;
                    let chunk = header.chunk(part);
                    offset += piece
                        .logprobs
                        .iter()
                        .map(|t| t.token.chars().count())
                        .sum::<usize>();
                    send(chunk)
                })
                .await;
                if let Outcome::Done(done) = &outcome {
                    let mut finish = done.finish_reason;
                    if header.tools.is_some() {
                        let (text, calls, reason) =
                            header.calls(&held.0, &done.calls, index, finish);
                        finish = reason;
                        // A streamed harmony reply has sent its text: only calls are due.
                        let due = hold || calls.is_some();
                        let mut part = Part::chunk(index, text, &held.1, offset, None);
                        part.reasoning = (!held.2.is_empty()).then(|| std::mem::take(&mut held.2));
                        part.tool_calls = calls.map(|calls| {
                            (0..)
                                .zip(calls)
                                .map(|(i, mut c)| {
                                    c["index"] = i.into();
                                    c
                                })
                                .collect()
                        });
                        if due && !send(header.chunk(part)) {
                            return Outcome::ClientGone;
                        }
                    }
                    let last = Part::chunk(index, None, &[], offset, Some(finish));
                    if !send(header.chunk(last)) {
                        return Outcome::ClientGone;
                    }
                }
                outcome
            });
        }
        let send = |data: String| tx.send(Ok(Event::default().data(data))).is_ok();
        let ended = tokio::time::timeout_at(deadline, choices(&mut tasks))
            .await
            .unwrap_or_else(|_| Err(Some(ApiError::deadline(state.request_timeout))));
        // Choices still running (after the deadline or a failure) must send nothing after
        // the last event: they are aborted, and awaited, first.
        tasks.shutdown().await;
        let _ = match ended {
            Ok(done) => {
                (!include_usage || send(header.usage_chunk(total_usage(done.iter()))))
                    && send("[DONE]".into())
            }
            Err(Some(e)) => send(e.body().to_string()) && send("[DONE]".into()),
            Err(None) => false,
        };
    });
    Sse::new(UnboundedReceiverStream::new(rx)).into_response()
}

/// Waits for every choice of a stream: how each ended, or the first failure (`None`: the
/// client left).
async fn choices(tasks: &mut JoinSet<Outcome>) -> Result<Vec<Done>, Option<ApiError>> {
    let mut done = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Outcome::Done(d)) => done.push(d),
            Ok(Outcome::ClientGone) => return Err(None),
            Ok(Outcome::Failed(e)) => return Err(Some(e)),
            Err(e) => {
                let e = ApiError::internal(format!("a choice's task failed: {e}"));
                return Err(Some(e));
            }
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(api: Api) -> Header {
        Header {
            api,
            id: "chatcmpl-1".into(),
            created: 0,
            model: "m".into(),
            echo: String::new(),
            logprobs: false,
            tools: None,
            harmony: false,
        }
    }

    fn part(
        text: Option<&str>,
        reasoning: Option<&str>,
        finish: Option<&'static str>,
    ) -> Part<'static> {
        Part {
            index: 0,
            role: false,
            text: text.map(str::to_owned),
            reasoning: reasoning.map(str::to_owned),
            tool_calls: None,
            logprobs: &[],
            offset: 0,
            finish,
        }
    }

    /// A harmony reply's calls are its call messages, not its text; a reply cut by
    /// `max_tokens` keeps `length` as its finish reason.
    #[test]
    fn harmony_calls_and_their_finish_reason() {
        let tools = json!([{"type": "function", "function": {"name": "get_weather"}}]);
        let h = Header {
            tools: super::super::tools::check(Some(&tools), None, None).unwrap(),
            harmony: true,
            ..header(Api::Chat)
        };
        let call = HarmonyCall {
            recipient: "functions.get_weather".into(),
            channel: "commentary".into(),
            constrain: "json".into(),
            arguments: "{\"city\": \"Oslo\"}".into(),
        };
        let text = "{\"name\": \"get_weather\", \"parameters\": {}}";
        let (content, calls, finish) = h.calls(text, std::slice::from_ref(&call), 0, "stop");
        assert_eq!((content.as_deref(), finish), (Some(text), "tool_calls"));
        let calls = calls.unwrap();
        assert_eq!(calls[0]["function"]["arguments"], "{\"city\": \"Oslo\"}");
        assert_eq!(calls[0]["id"], "call-chatcmpl-1-0-0");
        let (_, calls, finish) = h.calls("", &[call], 0, "length");
        assert_eq!((calls.map(|c| c.len()), finish), (Some(1), "length"));
        let (content, calls, finish) = h.calls("Sunny.", &[], 0, "stop");
        assert_eq!(
            (content.as_deref(), calls, finish),
            (Some("Sunny."), None, "stop")
        );
    }

    /// OpenAI's (and vLLM's) shape: `reasoning_content` beside `content` in a response's
    /// `message` and in a chunk's `delta`; absent when a model has no reasoning.
    #[test]
    fn reasoning_goes_out_as_reasoning_content() {
        let h = header(Api::Chat);
        let whole = h.with_parts(
            true,
            vec![part(Some("Hi!"), Some("Greet."), Some("stop"))],
            None,
        );
        assert_eq!(whole["object"], "chat.completion");
        let message = &whole["choices"][0]["message"];
        assert_eq!(message["content"], "Hi!");
        assert_eq!(message["reasoning_content"], "Greet.");
        let chunk: Value = serde_json::from_str(&h.chunk(part(None, Some("Gre"), None))).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        assert_eq!(delta["reasoning_content"], "Gre");
        assert!(delta.get("content").is_none(), "{chunk}");
        // Other models: exactly the fields of before.
        let plain = h.with_parts(true, vec![part(Some("Hi!"), None, Some("stop"))], None);
        assert_eq!(plain["choices"][0]["message"], json!({"content": "Hi!"}),);
        let chunk: Value = serde_json::from_str(&h.chunk(part(Some("Hi"), None, None))).unwrap();
        assert_eq!(chunk["choices"][0]["delta"], json!({"content": "Hi"}));
    }
}
