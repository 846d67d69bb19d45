//! The JSON bodies of OpenAI's API that `flm serve` speaks (the subset a local model can
//! honour), as serde types.
//!
//! Source: the OpenAI API reference (`POST /v1/chat/completions`, `POST /v1/completions`,
//! `GET /v1/models`) and the `openai` Python client's models of these objects. Unknown
//! request fields are ignored, as OpenAI-compatible servers (vLLM, llama.cpp) do; known
//! fields with values `flm` cannot honour (a `logit_bias`, `echo` with `logprobs`,
//! `best_of` > 1, a `suffix`) and a `user` that is not a string are refused by
//! [`super::params`].

use serde::{Deserialize, Serialize};

/// A `stop` field: one string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop sequence.
    One(String),
    /// Up to four stop sequences.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and no choices) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling fields shared by chat and completion requests.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Sampling {
    /// The model name; optional here, and if given it must be the served model's.
    pub model: Option<String>,
    /// Softmax temperature in `[0, 2]`; 0 is greedy. Default 1.
    pub temperature: Option<f32>,
    /// Nucleus sampling mass in `(0, 1]`. Default 1.
    pub top_p: Option<f32>,
    /// Extension (vLLM, llama.cpp): keep only the K most likely tokens; 0 disables.
    pub top_k: Option<usize>,
    /// Most tokens to generate.
    pub max_tokens: Option<usize>,
    /// The newer name of `max_tokens` in chat requests.
    pub max_completion_tokens: Option<usize>,
    /// Text that ends the reply (not included in it).
    pub stop: Option<Stop>,
    /// Seed of the sampler: the same seed and request give the same text.
    pub seed: Option<i64>,
    /// Subtracted once from the logit of every token already generated, in `[-2, 2]`.
    pub presence_penalty: Option<f32>,
    /// Subtracted from each logit times the token's count so far, in `[-2, 2]`.
    pub frequency_penalty: Option<f32>,
    /// Number of choices, in `[1, 128]`; default 1.
    pub n: Option<usize>,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Options of the stream.
    pub stream_options: Option<StreamOptions>,
    /// Log-probabilities: `true` (chat, with `top_logprobs`) or the number of
    /// alternatives (completions).
    pub logprobs: Option<serde_json::Value>,
    /// Alternatives per token in a chat's `logprobs`, in `[0, 20]`.
    pub top_logprobs: Option<serde_json::Value>,
    /// Token biases are not supported: must be absent, null or `{}`.
    pub logit_bias: Option<serde_json::Value>,
    /// An identifier of the end user, unused; a string if given.
    pub user: Option<serde_json::Value>,
    /// `{"type": "text" | "json_object" | "json_schema", ...}` ([`super::schema`]).
    pub response_format: Option<serde_json::Value>,
}

/// One message of a chat request.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool` (or a role the model's template knows).
    pub role: String,
    /// A string, or a list of `{"type": "text", "text": ...}` parts; null or absent for an
    /// assistant message that only calls tools.
    pub content: Option<Content>,
    /// An assistant message's calls, as the reply gave them.
    pub tool_calls: Option<serde_json::Value>,
    /// A `tool` message: the call it answers.
    pub tool_call_id: Option<String>,
}

/// The `content` of a message.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts; only `text` parts are supported.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// The part's type: only `text` is supported.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The conversation, rendered with the model's chat template.
    pub messages: Vec<ChatMessage>,
    /// Functions the model may call ([`super::tools`]).
    pub tools: Option<serde_json::Value>,
    /// `none`, `auto`, `required` or `{"type": "function", "function": {"name": ...}}`.
    pub tool_choice: Option<serde_json::Value>,
    /// Keyword arguments of the chat template (vLLM's and SGLang's `chat_template_kwargs`),
    /// such as `{"enable_thinking": false}` for Qwen3: a JSON object, or null.
    pub chat_template_kwargs: Option<serde_json::Value>,
    /// Sampling and streaming.
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// The `prompt` of a completion request.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// A text, encoded with BOS.
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
    /// A batch of texts; only a batch of one is supported.
    Texts(Vec<String>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// What to continue.
    pub prompt: Prompt,
    /// Start the reply's text with the prompt's (not with `logprobs`).
    #[serde(default)]
    pub echo: bool,
    /// Text after the completion (insertion) is not supported: must be absent, null or "".
    pub suffix: Option<serde_json::Value>,
    /// Candidates to choose the best one from; only 1 is supported (absent or null too).
    pub best_of: Option<serde_json::Value>,
    /// Sampling and streaming.
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Usage {
    /// Tokens of the prompt (as rendered and encoded).
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

impl Usage {
    /// The usage of `prompt` and `completion` tokens.
    pub fn new(prompt: usize, completion: usize) -> Usage {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
        }
    }
}

/// The assistant's message in a chat response (and a chat chunk's `delta`).
#[derive(Debug, Clone, Serialize)]
pub struct Delta {
    /// `assistant` in the first chunk and in a whole response.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// The text (for a reasoning model whose reasoning is told apart, gpt-oss, the final
    /// answer only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The model's reasoning, told apart from the answer (gpt-oss's analysis channel), as
    /// OpenAI's and vLLM's `reasoning_content`; absent for other models.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The tools called (OpenAI's `tool_calls`; in a chunk, each with its `index`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
}

/// One choice of a chat response or chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    /// Which of the `n` choices.
    pub index: usize,
    /// `message` in a response, `delta` in a chunk.
    #[serde(flatten)]
    pub body: ChatBody,
    /// The tokens' log-probabilities (`{"content": [...]}`), null unless asked for.
    pub logprobs: Option<serde_json::Value>,
    /// `stop` or `length`; null in every chunk but the last.
    pub finish_reason: Option<&'static str>,
}

/// The message of a chat choice.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatBody {
    /// A whole response.
    Message(Delta),
    /// A chunk.
    Delta(Delta),
}

/// One choice of a completion response or chunk.
#[derive(Debug, Clone, Serialize)]
pub struct TextChoice {
    /// Which of the `n` choices.
    pub index: usize,
    /// The text (of this chunk, when streamed).
    pub text: String,
    /// The tokens' log-probabilities (`tokens`, `token_logprobs`, `top_logprobs`,
    /// `text_offset`), null unless asked for.
    pub logprobs: Option<serde_json::Value>,
    /// `stop` or `length`; null in every chunk but the last.
    pub finish_reason: Option<&'static str>,
}

/// A response or a streamed chunk: `chat.completion`, `chat.completion.chunk` or
/// `text_completion`.
#[derive(Debug, Clone, Serialize)]
pub struct Completion<C> {
    /// `chatcmpl-…` or `cmpl-…`, the same in every chunk of a stream.
    pub id: String,
    /// The object type.
    pub object: &'static str,
    /// Unix time in seconds of the request.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// The choices (none in a stream's usage chunk).
    pub choices: Vec<C>,
    /// Token counts: in a whole response, and in a stream's usage chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// One model of `GET /v1/models`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    /// The name requests use.
    pub id: String,
    /// `model`.
    pub object: &'static str,
    /// Unix time in seconds when the server started.
    pub created: u64,
    /// `flm`.
    pub owned_by: &'static str,
    /// Positions of the model's context, prompt and reply together (vLLM's field).
    pub max_model_len: usize,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    /// `list`.
    pub object: &'static str,
    /// The served model.
    pub data: Vec<ModelCard>,
}
