//! The prompt of a request as token ids.
//!
//! Chat `messages` are rendered as `flm chat` renders a conversation: with the model's own
//! format ([`Tokenizer::encode_chat`]: ChatGLM's built-in formats or the Jinja
//! `chat_template` of the model's files, given the request's `chat_template_kwargs`) and the
//! generation prompt appended. A model with
//! no template at all (stories260K's llama2.c files) is refused with a 400, as `flm chat`
//! refuses it; `/v1/completions` works for every model. A completion `prompt` text is
//! encoded after the prefix tokens (BOS) if the tokenizer has any, as `flm run` does; a list of ids is used as given.

use flm_tokenizer::{Message, TemplateArgs, Tokenizer};

use super::error::ApiError;
use super::openai::{ChatMessage, Content, Prompt};
use super::tools::Tools;

/// A prompt ready for the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ids {
    /// From position 0.
    pub ids: Vec<u32>,
    /// The reply is decoded as the start of a text: its first piece's dummy-prefix space
    /// is dropped (a chat reply, or a completion of nothing but the prefix tokens).
    pub at_start: bool,
}

impl Ids {
    fn new(tokenizer: &Tokenizer, ids: Vec<u32>) -> Ids {
        let at_start = ids == tokenizer.prefix();
        Ids { ids, at_start }
    }
}

fn text_of(message: &ChatMessage) -> Result<String, ApiError> {
    match &message.content {
        None => Ok(String::new()),
        Some(Content::Text(text)) => Ok(text.clone()),
        Some(Content::Parts(parts)) => parts
            .iter()
            .map(|part| match (part.kind.as_str(), &part.text) {
                ("text", Some(text)) => Ok(text.as_str()),
                _ => Err(ApiError::invalid(
                    Some("messages"),
                    format!(
                        "only text content parts are supported, got a `{}` part",
                        part.kind
                    ),
                )),
            })
            .collect(),
    }
}

/// The keyword arguments of the chat template from a request's `chat_template_kwargs`:
/// none when absent or null.
///
/// Errors (400, `chat_template_kwargs`): a value that is not a JSON object, or one that
/// sets `messages`, `tools` or `add_generation_prompt`.
pub fn template_args(kwargs: Option<&serde_json::Value>) -> Result<TemplateArgs, ApiError> {
    let invalid = |message: String| ApiError::invalid(Some("chat_template_kwargs"), message);
    let args = match kwargs {
        None | Some(serde_json::Value::Null) => TemplateArgs::new(),
        Some(serde_json::Value::Object(args)) => args.clone(),
        Some(other) => {
            return Err(invalid(format!(
                "chat_template_kwargs must be a JSON object of template variables, got {other}"
            )))
        }
    };
    flm_tokenizer::check_template_args(&args).map_err(|e| invalid(e.to_string()))?;
    Ok(args)
}

/// The prompt of a chat request: the conversation rendered with the model's template and
/// the keyword arguments `args` ([`template_args`]), ending where the assistant's reply
/// starts. The reply is decoded as the start of a text
/// (a SentencePiece dummy-prefix space before its first word dropped), as `flm chat` does.
///
/// With `tools`, or messages that call tools or answer calls, the messages go to the
/// template as JSON objects (`role`, `content`, `tool_calls`, `tool_call_id`; a missing or
/// null content as `""`) with the tool list ([`Tokenizer::encode_chat_with_tools`]).
///
/// Errors (400): no messages, a non-text content part, a model without a chat template
/// (or, for tools, without a Jinja one), a role or conversation the template refuses.
pub fn chat(
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    tools: Option<&Tools>,
    args: &TemplateArgs,
) -> Result<Ids, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            Some("messages"),
            "messages must hold at least one message",
        ));
    }
    if !tokenizer.can_chat() {
        return Err(ApiError::invalid(
            Some("messages"),
            "the model has no chat template (none in its files and no built-in format): use \
             /v1/completions",
        ));
    }
    let failed = |e| ApiError::invalid(Some("messages"), format!("cannot render the chat: {e}"));
    let with_tools = tools.is_some()
        || messages
            .iter()
            .any(|m| m.tool_calls.is_some() || m.role == "tool");
    let prompt = if with_tools {
        let messages = messages
            .iter()
            .map(|m| {
                // No content (beside tool calls) is an empty text: templates look into it,
                // as gpt-oss's does (`"…" in message.content`, an error on null).
                let content = m.content.as_ref().map(|_| text_of(m)).transpose()?;
                let content = content.unwrap_or_default();
                let mut json = serde_json::json!({"role": m.role, "content": content});
                if let Some(calls) = &m.tool_calls {
                    json["tool_calls"] = template_calls(calls);
                }
                if let Some(id) = &m.tool_call_id {
                    json["tool_call_id"] = id.as_str().into();
                }
                Ok(json)
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        tokenizer
            .encode_chat_with_tools(&messages, tools.map(|t| &t.list), true, args)
            .map_err(failed)?
    } else {
        let messages = messages
            .iter()
            .map(|m| Ok(Message::new(m.role.as_str(), text_of(m)?)))
            .collect::<Result<Vec<_>, ApiError>>()?;
        tokenizer
            .encode_chat_with_args(&messages, true, args)
            .map_err(failed)?
    };
    // The reply is a text of its own, decoded as `flm chat` shows it.
    Ok(Ids {
        ids: prompt.ids,
        at_start: true,
    })
}

/// A message's `tool_calls` as templates read them: OpenAI sends each call's `arguments`
/// as a JSON text, templates write them with `tojson` (gpt-oss's, Qwen2.5's), so a text
/// that is a JSON object goes in as that object, as vLLM and llama.cpp pass it; any other
/// stays as sent.
fn template_calls(calls: &serde_json::Value) -> serde_json::Value {
    let mut calls = calls.clone();
    for call in calls.as_array_mut().into_iter().flatten() {
        let Some(arguments) = call.pointer_mut("/function/arguments") else {
            continue;
        };
        if let Some(object) = arguments
            .as_str()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
            .filter(serde_json::Value::is_object)
        {
            *arguments = object;
        }
    }
    calls
}

/// The prompt of a completion request.
///
/// Errors (400): a batch of more than one prompt, an empty list of ids, an id outside the
/// vocabulary, a text the tokenizer cannot encode.
pub fn completion(tokenizer: &Tokenizer, prompt: &Prompt) -> Result<Ids, ApiError> {
    let invalid = |message: String| ApiError::invalid(Some("prompt"), message);
    let text = match prompt {
        Prompt::Text(text) => text,
        Prompt::Texts(texts) if texts.len() == 1 => &texts[0],
        Prompt::Texts(texts) => {
            return Err(invalid(format!(
                "one prompt per request is supported, got {}",
                texts.len()
            )))
        }
        Prompt::Tokens(ids) => {
            let vocab = tokenizer.vocab_size();
            if ids.is_empty() {
                return Err(invalid("the prompt holds no tokens".into()));
            }
            if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(invalid(format!(
                    "token id {id} is outside the vocabulary of {vocab} tokens"
                )));
            }
            return Ok(Ids::new(tokenizer, ids.clone()));
        }
    };
    let ids = tokenizer
        .encode(text, tokenizer.add_bos() && !tokenizer.prefix().is_empty())
        .map_err(|e| invalid(format!("cannot encode the prompt: {e}")))?;
    Ok(Ids::new(tokenizer, ids))
}

#[cfg(test)]
mod tests {
    use super::template_calls;
    use serde_json::json;

    /// Arguments that are a JSON object's text become the object; anything else, of any
    /// shape, stays as sent.
    #[test]
    fn call_arguments_reach_templates_as_objects() {
        let calls = json!([
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
            {"id": "b", "type": "function", "function": {"name": "g", "arguments": "not json"}},
            {"id": "c", "type": "function", "function": {"name": "h", "arguments": "[1]"}},
            "a call that is a text",
            {"id": "d", "function": 3},
        ]);
        let out = template_calls(&calls);
        assert_eq!(out[0]["function"]["arguments"], json!({"x": 1}));
        assert_eq!(out.as_array().unwrap()[1..], calls.as_array().unwrap()[1..]);
        assert_eq!(template_calls(&json!("x")), json!("x"));
    }
}
