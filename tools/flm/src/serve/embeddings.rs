//! `POST /v1/embeddings`: a text's (or token ids') hidden states after the model's final
//! norm (transformers' `last_hidden_state`), pooled into one vector and L2-normalised, as
//! sentence-transformers' `Pooling` and `Normalize` modules and vLLM's embedding pooler
//! make them.
//!
//! The pooling is `--pooling` if given, else what the model directory's sentence-transformers
//! `1_Pooling/config.json` says (`pooling_mode_mean_tokens` or `pooling_mode_lasttoken`),
//! else the last token's state (the choice of decoder embedding models such as
//! Qwen3-Embedding, and vLLM's default for them). Inputs run one after another on an
//! instance of the model of their own (its KV cache allocated at the first request),
//! outside the engine's batch; texts are encoded with BOS as completion prompts are.
//! `encoding_format` `float` gives numbers, `base64` the little-endian f32 bytes (what the
//! `openai` client asks for by default).

use std::path::Path;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use clap::ValueEnum;
use flm_core::Executor;
use flm_models::{Model, SharedModel};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::{memory, State};

/// How a sequence's hidden states become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Pooling {
    /// The mean over the tokens.
    Mean,
    /// The last token's state.
    Last,
}

impl Pooling {
    /// The pooling of the sentence-transformers `1_Pooling/config.json` in `model` (a
    /// directory), if it names mean or last-token pooling.
    pub fn from_model_dir(model: &Path) -> Option<Pooling> {
        let text = std::fs::read_to_string(model.join("1_Pooling/config.json")).ok()?;
        let config: Value = serde_json::from_str(&text).ok()?;
        let on = |key: &str| config[key].as_bool() == Some(true);
        if on("pooling_mode_lasttoken") {
            Some(Pooling::Last)
        } else if on("pooling_mode_mean_tokens") {
            Some(Pooling::Mean)
        } else {
            None
        }
    }

    /// `hidden`, `[tokens · dim]` row-major, pooled and L2-normalised to `[dim]`.
    fn pool(self, hidden: &[f32], dim: usize) -> Vec<f32> {
        let rows = hidden.len() / dim;
        let mut out: Vec<f64> = match self {
            Pooling::Last => hidden[(rows - 1) * dim..]
                .iter()
                .map(|&v| v.into())
                .collect(),
            Pooling::Mean => (0..dim)
                .map(|j| {
                    (0..rows)
                        .map(|r| f64::from(hidden[r * dim + j]))
                        .sum::<f64>()
                        / rows as f64
                })
                .collect(),
        };
        let norm = out.iter().map(|v| v * v).sum::<f64>().sqrt();
        if norm > 0.0 {
            out.iter_mut().for_each(|v| *v /= norm);
        }
        out.into_iter().map(|v| v as f32).collect()
    }
}

/// The model instance that computes embeddings, with its executor.
pub struct Embedder {
    shared: SharedModel,
    exec: Executor,
    pooling: Pooling,
    model: Mutex<Option<Model>>,
}

impl Embedder {
    /// Embeddings of `shared` run by `exec`, pooled by `pooling`.
    pub fn new(shared: SharedModel, exec: Executor, pooling: Pooling) -> Embedder {
        Embedder {
            shared,
            exec,
            pooling,
            model: Mutex::new(None),
        }
    }

    /// The pooled, normalised vector of each of `inputs`.
    fn embed(&self, inputs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, ApiError> {
        let internal = |e: flm_models::Error| ApiError::internal(e.to_string());
        let mut guard = match self.model.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if guard.is_none() {
            *guard = Some(self.shared.instance().map_err(internal)?);
        }
        let Some(model) = guard.as_mut() else {
            return Err(ApiError::internal("no model instance"));
        };
        let dim = model.config().dim;
        inputs
            .iter()
            .map(|ids| {
                let hidden = model.hidden_states(&self.exec, ids, 0).map_err(internal)?;
                Ok(self.pooling.pool(hidden, dim))
            })
            .collect()
    }
}

/// `input`: one text, texts, token ids, or lists of token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Input {
    /// One text.
    Text(String),
    /// Texts.
    Texts(Vec<String>),
    /// One sequence of token ids.
    Tokens(Vec<u32>),
    /// Sequences of token ids.
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/embeddings`.
#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingRequest {
    /// What to embed.
    pub input: Input,
    /// If given, the served model's name.
    pub model: Option<String>,
    /// `float` (default) or `base64`.
    pub encoding_format: Option<String>,
    /// Not supported unless it equals the model's hidden size.
    pub dimensions: Option<usize>,
}

/// Most inputs in one request (OpenAI's limit).
const MAX_INPUTS: usize = 2048;

/// The token ids of each input, checked.
fn token_ids(state: &State, input: &Input) -> Result<Vec<Vec<u32>>, ApiError> {
    let invalid = |message: String| ApiError::invalid(Some("input"), message);
    let encode = |text: &String| {
        let tokenizer = &state.tokenizer;
        tokenizer
            .encode(text, tokenizer.add_bos() && !tokenizer.prefix().is_empty())
            .map_err(|e| invalid(format!("cannot encode the input: {e}")))
    };
    let inputs = match input {
        Input::Text(text) => vec![encode(text)?],
        Input::Texts(texts) => texts.iter().map(encode).collect::<Result<_, _>>()?,
        Input::Tokens(ids) => vec![ids.clone()],
        Input::TokenLists(lists) => lists.clone(),
    };
    if inputs.is_empty() || inputs.len() > MAX_INPUTS {
        return Err(invalid(format!(
            "input must hold 1 to {MAX_INPUTS} items, got {}",
            inputs.len()
        )));
    }
    let vocab = state.tokenizer.vocab_size();
    for ids in &inputs {
        if ids.is_empty() {
            return Err(invalid("an input holds no tokens".into()));
        }
        if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(invalid(format!(
                "token id {id} is outside the vocabulary of {vocab} tokens"
            )));
        }
        if ids.len() > state.context {
            return Err(invalid(format!(
                "the model's context holds {} tokens, but an input is {} tokens long",
                state.context,
                ids.len()
            ))
            .with_code("context_length_exceeded"));
        }
    }
    Ok(inputs)
}

/// Answers an embeddings request.
///
/// Errors: 404 for another model; 400 for a bad input, an unknown `encoding_format`,
/// `dimensions` other than the model's hidden size, or embeddings unavailable (a model
/// with layers on a GPU); 500 when the forward pass fails.
pub async fn answer(state: Arc<State>, request: EmbeddingRequest) -> Result<Value, ApiError> {
    if let Some(model) = &request.model {
        if *model != state.model_name {
            return Err(ApiError::model_not_found(model));
        }
    }
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                Some("encoding_format"),
                format!("encoding_format must be float or base64, got {other}"),
            ))
        }
    };
    let dim = state.engine.config().dim;
    if request.dimensions.is_some_and(|d| d != dim) {
        return Err(ApiError::invalid(
            Some("dimensions"),
            format!("this model's embeddings have {dim} dimensions"),
        ));
    }
    let unavailable = || ApiError::invalid(None, "embeddings are not available with --gpu-layers");
    if state.embedder.is_none() {
        return Err(unavailable());
    }
    // Tokenizing and the forward passes run off the async runtime's threads.
    let task_state = Arc::clone(&state);
    let input = request.input;
    let (tokens, vectors, _held) = tokio::task::spawn_blocking(move || {
        let inputs = token_ids(&task_state, &input)?;
        let held = task_state
            .memory
            .reserve("the embeddings", memory::embedding_bytes(inputs.len(), dim))?;
        let tokens: usize = inputs.iter().map(Vec::len).sum();
        let vectors = match &task_state.embedder {
            Some(embedder) => embedder.embed(&inputs)?,
            None => return Err(unavailable()),
        };
        Ok((tokens, vectors, held))
    })
    .await
    .map_err(|e| ApiError::internal(format!("the embedding task failed: {e}")))??;
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(json!({
        "object": "list",
        "data": data,
        "model": state.model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }))
}
