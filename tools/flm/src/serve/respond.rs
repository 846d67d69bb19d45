//! Answering a completion request: one JSON object, or server-sent events in OpenAI's
//! streaming format.
//!
//! A stream is a sequence of `data: {chunk}` events, the chunks being
//! `chat.completion.chunk` objects (the first with `delta.role`, then `delta.content`
//! pieces, the last with an empty delta and `finish_reason`) or `text_completion` objects
//! (`text` pieces, then `finish_reason`), optionally a usage chunk with no choices
//! (`stream_options.include_usage`), and `data: [DONE]` (OpenAI API reference, "Streaming").
//! An error after the stream has started is sent as `data: {"error": {...}}`, as OpenAI
//! does, and the stream ends.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use tokio::sync::mpsc::unbounded_channel;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::error::ApiError;
use super::generation::{drive, Done, Outcome, Submitted};
use super::openai::{ChatBody, ChatChoice, Completion, Delta, TextChoice, Usage};
use super::State;

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
}

impl Header {
    fn object<C: Serialize>(
        &self,
        object: &'static str,
        choices: Vec<C>,
        usage: Option<Usage>,
    ) -> serde_json::Value {
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

    /// A streamed chunk: `text` (for chat, `role` adds `delta.role`) and `finish`.
    fn chunk(&self, role: bool, text: Option<String>, finish: Option<&'static str>) -> String {
        let value = match self.api {
            Api::Chat => self.object(
                "chat.completion.chunk",
                vec![ChatChoice {
                    index: 0,
                    body: ChatBody::Delta(Delta {
                        role: role.then_some("assistant"),
                        content: text,
                    }),
                    logprobs: None,
                    finish_reason: finish,
                }],
                None,
            ),
            Api::Text => self.object(
                "text_completion",
                vec![TextChoice {
                    index: 0,
                    text: text.unwrap_or_default(),
                    logprobs: None,
                    finish_reason: finish,
                }],
                None,
            ),
        };
        value.to_string()
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

    /// The whole response.
    fn whole(&self, text: String, done: Done) -> serde_json::Value {
        let finish = Some(done.finish_reason);
        match self.api {
            Api::Chat => self.object(
                "chat.completion",
                vec![ChatChoice {
                    index: 0,
                    body: ChatBody::Message(Delta {
                        role: Some("assistant"),
                        content: Some(text),
                    }),
                    logprobs: None,
                    finish_reason: finish,
                }],
                Some(done.usage),
            ),
            Api::Text => self.object(
                "text_completion",
                vec![TextChoice {
                    index: 0,
                    text,
                    logprobs: None,
                    finish_reason: finish,
                }],
                Some(done.usage),
            ),
        }
    }
}

/// Generates the whole reply, then answers one JSON object.
///
/// Errors: 500 when the engine fails, 503 when it shuts down first. (A client that goes
/// away drops this future with its connection, which cancels the request.)
pub async fn whole(
    state: &State,
    header: Header,
    submitted: Submitted,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    match drive(state, submitted, |piece| {
        text.push_str(&piece);
        true
    })
    .await
    {
        Outcome::Done(done) => Ok(Json(header.whole(text, done)).into_response()),
        // `emit` above never refuses text.
        Outcome::ClientGone => Err(ApiError::internal("the reply was dropped")),
        Outcome::Failed(e) => Err(e),
    }
}

/// Answers with a stream of server-sent events, generated by a task of its own that ends
/// (and cancels the request in the engine) when the client disconnects.
pub fn stream(
    state: Arc<State>,
    header: Header,
    submitted: Submitted,
    include_usage: bool,
) -> Response {
    let (tx, rx) = unbounded_channel::<Result<Event, Infallible>>();
    let send = move |data: String| tx.send(Ok(Event::default().data(data))).is_ok();
    tokio::spawn(async move {
        if header.api == Api::Chat && !send(header.chunk(true, Some(String::new()), None)) {
            return;
        }
        let outcome = drive(&state, submitted, |piece| {
            send(header.chunk(false, Some(piece), None))
        })
        .await;
        match outcome {
            Outcome::Done(done) => {
                let _ = send(header.chunk(false, None, Some(done.finish_reason)))
                    && (!include_usage || send(header.usage_chunk(done.usage)))
                    && send("[DONE]".into());
            }
            Outcome::ClientGone => {}
            Outcome::Failed(e) => {
                let _ = send(e.body().to_string()) && send("[DONE]".into());
            }
        }
    });
    Sse::new(UnboundedReceiverStream::new(rx)).into_response()
}
