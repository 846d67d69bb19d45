//! Checking a request's sampling fields against OpenAI's ranges, and turning them into the
//! engine's [`SamplerConfig`].
//!
//! Ranges and defaults are OpenAI's (API reference of `POST /v1/chat/completions`):
//! temperature in `[0, 2]` (default 1), top_p in `(0, 1]` (default 1), presence and
//! frequency penalties in `[-2, 2]` (default 0), at most 4 stop sequences, `n` in
//! `[1, 128]` (default 1). Log-probabilities come as chat asks for them (`logprobs: true`
//! with `top_logprobs` in `[0, 20]`) or as completions do (`logprobs` an integer in
//! `[0, 20]`, vLLM's bound), on either endpoint. A prompt plus `max_tokens` longer than the
//! context is refused with `context_length_exceeded`, as OpenAI and vLLM do, rather than
//! cut short.

use flm_core::SamplerConfig;
use serde_json::Value;

use super::error::ApiError;
use super::openai::{CompletionRequest, Sampling, Stop};

/// Most stop sequences a request may give (OpenAI's limit).
pub const MAX_STOP: usize = 4;

/// Most choices a request may ask for (OpenAI's limit).
pub const MAX_N: usize = 128;

/// Most alternatives per token in `top_logprobs` (vLLM's default `max_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The checked generation settings of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// For the engine's sampler (no repetition penalty: OpenAI has none).
    pub sampler: SamplerConfig,
    /// `max_tokens` (or `max_completion_tokens`) if the request gave it.
    pub max_tokens: Option<usize>,
    /// Text stop sequences, none empty.
    pub stop: Vec<String>,
    /// Answer with server-sent events.
    pub stream: bool,
    /// Send a usage chunk at the end of a stream.
    pub include_usage: bool,
    /// Choices to generate, each with its own seed (the request's, plus its index).
    pub n: usize,
    /// `Some(k)`: report each token's log-probability and the `k` most likely tokens'.
    pub logprobs: Option<usize>,
}

/// Checks the fields of a completion request besides its sampling ([`check`]).
///
/// Errors: 400 for `echo` with `logprobs` (the prompt's log-probabilities are not
/// computed), a non-empty `suffix` or `best_of` other than 1.
pub fn check_completion(request: &CompletionRequest) -> Result<(), ApiError> {
    if request.echo
        && !matches!(
            request.sampling.logprobs,
            None | Some(Value::Null | Value::Bool(false))
        )
    {
        return Err(ApiError::invalid(
            Some("echo"),
            "echo with logprobs is not supported: the prompt's log-probabilities are not \
             computed",
        ));
    }
    if !matches!(&request.suffix, None | Some(Value::Null))
        && request.suffix.as_ref().and_then(Value::as_str) != Some("")
    {
        return Err(ApiError::invalid(
            Some("suffix"),
            "suffix (insertion) is not supported",
        ));
    }
    if !matches!(&request.best_of, None | Some(Value::Null))
        && request.best_of.as_ref().and_then(Value::as_u64) != Some(1)
    {
        return Err(ApiError::invalid(
            Some("best_of"),
            "only best_of = 1 is supported",
        ));
    }
    Ok(())
}

fn in_range(
    value: Option<f32>,
    param: &'static str,
    range: std::ops::RangeInclusive<f32>,
    default: f32,
) -> Result<f32, ApiError> {
    match value {
        None => Ok(default),
        Some(v) if range.contains(&v) => Ok(v),
        Some(v) => Err(ApiError::invalid(
            Some(param),
            format!(
                "{param} must be between {} and {}, got {v}",
                range.start(),
                range.end()
            ),
        )),
    }
}

/// Checks `s` for a server of the model `served`; `seed` is used when the request has none.
///
/// Errors: 404 for a `model` other than `served`; 400 for a value out of range (`n`,
/// `logprobs`, `top_logprobs` included), `top_logprobs` without `logprobs: true`, a
/// non-empty `logit_bias`, a `user` that is not a string, `max_tokens` of 0, an empty or
/// fifth stop sequence.
pub fn check(s: &Sampling, served: &str, seed: u64) -> Result<Params, ApiError> {
    if let Some(model) = &s.model {
        if model != served {
            return Err(ApiError::model_not_found(model));
        }
    }
    let n = s.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(ApiError::invalid(
            Some("n"),
            format!("n must be between 1 and {MAX_N}, got {n}"),
        ));
    }
    let logprobs = logprobs(s)?;
    if !matches!(&s.logit_bias, None | Some(Value::Null))
        && s.logit_bias
            .as_ref()
            .and_then(Value::as_object)
            .is_none_or(|m| !m.is_empty())
    {
        return Err(ApiError::invalid(
            Some("logit_bias"),
            "logit_bias is not supported",
        ));
    }
    if !matches!(&s.user, None | Some(Value::Null | Value::String(_))) {
        return Err(ApiError::invalid(Some("user"), "user must be a string"));
    }
    let top_p = match s.top_p {
        Some(p) if !(p > 0.0 && p <= 1.0) => {
            return Err(ApiError::invalid(
                Some("top_p"),
                format!("top_p must be greater than 0 and at most 1, got {p}"),
            ))
        }
        p => p.unwrap_or(1.0),
    };
    let max_tokens = s.max_completion_tokens.or(s.max_tokens);
    if max_tokens == Some(0) {
        return Err(ApiError::invalid(
            Some("max_tokens"),
            "max_tokens must be at least 1",
        ));
    }
    let stop = match &s.stop {
        None => Vec::new(),
        Some(Stop::One(text)) => vec![text.clone()],
        Some(Stop::Many(list)) => list.clone(),
    };
    if stop.len() > MAX_STOP {
        return Err(ApiError::invalid(
            Some("stop"),
            format!("at most {MAX_STOP} stop sequences, got {}", stop.len()),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            Some("stop"),
            "stop sequences must not be empty",
        ));
    }
    let sampler = SamplerConfig {
        temperature: in_range(s.temperature, "temperature", 0.0..=2.0, 1.0)?,
        top_p,
        top_k: s.top_k.unwrap_or(0),
        presence_penalty: in_range(s.presence_penalty, "presence_penalty", -2.0..=2.0, 0.0)?,
        frequency_penalty: in_range(s.frequency_penalty, "frequency_penalty", -2.0..=2.0, 0.0)?,
        // OpenAI's seed is a signed 64-bit integer: its two's-complement bits seed ChaCha8.
        seed: s.seed.map_or(seed, |v| v as u64),
        ..SamplerConfig::default()
    };
    Ok(Params {
        sampler,
        max_tokens,
        stop,
        stream: s.stream,
        include_usage: s.stream_options.as_ref().is_some_and(|o| o.include_usage),
        n,
        logprobs,
    })
}

/// The number of alternatives of `logprobs` / `top_logprobs`, or `None` when the request
/// asks for no log-probabilities.
fn logprobs(s: &Sampling) -> Result<Option<usize>, ApiError> {
    let top = |param: &'static str, v: &Value| match v.as_u64().map(usize::try_from) {
        Some(Ok(k)) if k <= MAX_TOP_LOGPROBS => Ok(k),
        _ => Err(ApiError::invalid(
            Some(param),
            format!("{param} must be an integer between 0 and {MAX_TOP_LOGPROBS}, got {v}"),
        )),
    };
    let top_logprobs = match &s.top_logprobs {
        None | Some(Value::Null) => None,
        Some(v) => Some(top("top_logprobs", v)?),
    };
    match &s.logprobs {
        None | Some(Value::Null | Value::Bool(false)) if top_logprobs.is_some() => Err(
            ApiError::invalid(Some("top_logprobs"), "top_logprobs needs logprobs: true"),
        ),
        None | Some(Value::Null | Value::Bool(false)) => Ok(None),
        Some(Value::Bool(true)) => Ok(Some(top_logprobs.unwrap_or(0))),
        Some(v) => top("logprobs", v).map(Some),
    }
}

/// The number of tokens to generate after a prompt of `prompt_len` tokens in a context of
/// `context` positions: `requested`, else `default`, else all that is left of the context.
///
/// Errors: 400 `context_length_exceeded` about `param` (the prompt's field) when the prompt
/// leaves no room, or the prompt and the requested tokens together exceed the context.
pub fn budget(
    param: &'static str,
    requested: Option<usize>,
    default: Option<usize>,
    prompt_len: usize,
    context: usize,
) -> Result<usize, ApiError> {
    let exceeded = |message: String| {
        ApiError::invalid(Some(param), message).with_code("context_length_exceeded")
    };
    if prompt_len >= context {
        return Err(exceeded(format!(
            "the model's context holds {context} tokens, but the prompt is {prompt_len} \
             tokens long"
        )));
    }
    let left = context - prompt_len;
    match requested {
        Some(n) if n > left => Err(exceeded(format!(
            "the model's context holds {context} tokens and the prompt is {prompt_len} tokens \
             long, which leaves {left} to generate, but max_tokens is {n}"
        ))),
        Some(n) => Ok(n),
        None => Ok(default.map_or(left, |d| d.min(left))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(json: serde_json::Value) -> Sampling {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn defaults_are_openai_s() {
        let p = check(&sampling(serde_json::json!({})), "m", 7).unwrap();
        assert_eq!(p.sampler.temperature, 1.0);
        assert_eq!(p.sampler.top_p, 1.0);
        assert_eq!(p.sampler.seed, 7);
        assert_eq!(p.sampler.presence_penalty, 0.0);
        assert!(p.stop.is_empty() && !p.stream && p.max_tokens.is_none());
        assert_eq!((p.n, p.logprobs), (1, None));
    }

    #[test]
    fn logprobs_come_in_the_chat_and_the_completion_shapes() {
        let lp = |json| check(&sampling(json), "m", 0).unwrap().logprobs;
        assert_eq!(lp(serde_json::json!({"logprobs": false})), None);
        assert_eq!(lp(serde_json::json!({"logprobs": true})), Some(0));
        let chat = serde_json::json!({"logprobs": true, "top_logprobs": 3});
        assert_eq!(lp(chat), Some(3));
        assert_eq!(lp(serde_json::json!({"logprobs": 5})), Some(5));
        assert_eq!(lp(serde_json::json!({"logprobs": 0})), Some(0));
        let p = check(&sampling(serde_json::json!({"n": 3})), "m", 0).unwrap();
        assert_eq!(p.n, 3);
    }

    #[test]
    fn fields_map_to_the_sampler() {
        let json = serde_json::json!({"model": "m", "temperature": 0.5, "top_p": 0.9,
            "seed": -1, "presence_penalty": 1.5, "frequency_penalty": -0.5, "stop": "\n",
            "max_completion_tokens": 9, "stream": true,
            "stream_options": {"include_usage": true}});
        let p = check(&sampling(json), "m", 0).unwrap();
        assert_eq!(p.sampler.temperature, 0.5);
        assert_eq!(p.sampler.top_p, 0.9);
        assert_eq!(p.sampler.seed, u64::MAX);
        assert_eq!(p.sampler.presence_penalty, 1.5);
        assert_eq!(p.sampler.frequency_penalty, -0.5);
        assert_eq!(p.stop, ["\n"]);
        assert_eq!(p.max_tokens, Some(9));
        assert!(p.stream && p.include_usage);
    }

    #[test]
    fn bad_values_are_400_naming_the_field() {
        for (json, param) in [
            (serde_json::json!({"temperature": 2.5}), "temperature"),
            (serde_json::json!({"top_p": 0.0}), "top_p"),
            (
                serde_json::json!({"presence_penalty": -3}),
                "presence_penalty",
            ),
            (
                serde_json::json!({"frequency_penalty": 2.1}),
                "frequency_penalty",
            ),
            (serde_json::json!({"max_tokens": 0}), "max_tokens"),
            (serde_json::json!({"n": 0}), "n"),
            (serde_json::json!({"n": 129}), "n"),
            (serde_json::json!({"logprobs": 21}), "logprobs"),
            (serde_json::json!({"logprobs": "yes"}), "logprobs"),
            (
                serde_json::json!({"logprobs": true, "top_logprobs": -1}),
                "top_logprobs",
            ),
            (serde_json::json!({"top_logprobs": 2}), "top_logprobs"),
            (
                serde_json::json!({"stop": ["a", "b", "c", "d", "e"]}),
                "stop",
            ),
            (serde_json::json!({"stop": [""]}), "stop"),
        ] {
            let e = check(&sampling(json.clone()), "m", 0).unwrap_err();
            assert_eq!(e.status, 400, "{json}");
            assert_eq!(e.param, Some(param), "{json}");
        }
        let e = check(&sampling(serde_json::json!({"model": "x"})), "m", 0).unwrap_err();
        assert_eq!((e.status.as_u16(), e.code), (404, Some("model_not_found")));
    }

    #[test]
    fn budget_fits_the_context() {
        assert_eq!(budget("prompt", None, None, 10, 512), Ok(502));
        assert_eq!(budget("prompt", None, Some(16), 10, 512), Ok(16));
        assert_eq!(budget("prompt", None, Some(16), 500, 512), Ok(12));
        assert_eq!(budget("prompt", Some(502), None, 10, 512), Ok(502));
        for (requested, prompt) in [(Some(503), 10), (None, 512), (Some(1), 600)] {
            let e = budget("prompt", requested, None, prompt, 512).unwrap_err();
            assert_eq!(e.code, Some("context_length_exceeded"));
        }
        let e = budget("prompt", Some(usize::MAX), None, 10, 512).unwrap_err();
        assert_eq!(
            e.message,
            format!(
                "the model's context holds 512 tokens and the prompt is 10 tokens long, which \
                 leaves 502 to generate, but max_tokens is {}",
                usize::MAX
            )
        );
    }
}
