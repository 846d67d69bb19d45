//! Generation sessions: the one generation loop behind `flm run`, the C ABI and servers.
//!
//! A [`Session`] pairs a model instance ([`Llama`]: weights shared through an `Arc`, its
//! own KV cache) with the tokenizer, and generates as llama2.c `run.c` `generate` does:
//! the prompt (with BOS) is prefilled in one forward pass, then each decode step samples
//! a token from the last logits ([`flm_core::Sampler`]), stops at an end-of-sequence
//! token, after `max_tokens`, when the context is full or when the caller asks, and
//! otherwise feeds the token back. The text is streamed through
//! [`flm_tokenizer::StreamDecoder`], so a UTF-8 character split over byte-fallback tokens
//! is handed out whole. Each call to [`Session::generate`] starts a new sequence at
//! position 0.
//!
//! Sessions over one `Arc<LlamaModel>` are independent: create one per thread.
//! [`load_model`] reads a checkpoint and its tokenizer for them.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flm_core::{Executor, Sampler, SamplerConfig};
use flm_tokenizer::Tokenizer;

use crate::import;
use crate::llama::{Llama, LlamaModel, Logits};
use crate::{Error, Result};

/// Context length (KV cache positions) when none is asked for: enough for chat and long
/// prompts, without allocating the KV cache of a 128k-context model.
pub const DEFAULT_CONTEXT: usize = 4096;

/// Fails unless every token id of `tokenizer` is inside the model's vocabulary.
///
/// Errors: [`Error::Config`] when the tokenizer has more tokens than `model_vocab`.
pub fn check_vocab(tokenizer: &Tokenizer, model_vocab: usize) -> Result<()> {
    if tokenizer.vocab_size() > model_vocab {
        return Err(Error::Config(format!(
            "the tokenizer has {} tokens but the model's vocabulary has {model_vocab}: they do \
             not belong together",
            tokenizer.vocab_size(),
        )));
    }
    Ok(())
}

/// Loads the checkpoint at `path` (any format [`import::load`] reads) and its tokenizer:
/// the file `tokenizer` if given, else the one inside or beside the checkpoint. The
/// model's context is capped at `context` positions (default [`DEFAULT_CONTEXT`]), which
/// bounds the KV cache of each session.
///
/// Errors: [`Error::Io`] for a file that cannot be read (a missing file included),
/// [`Error::Format`] for a malformed checkpoint or tokenizer, [`Error::Config`] for an
/// invalid configuration or a tokenizer that does not belong to the model,
/// [`Error::InvalidInput`] for a context of 0.
pub fn load_model(
    path: &Path,
    tokenizer: Option<&Path>,
    context: Option<usize>,
) -> Result<(LlamaModel, Tokenizer)> {
    let positions = context.unwrap_or(DEFAULT_CONTEXT);
    if positions == 0 {
        return Err(Error::InvalidInput(
            "the context must hold at least 1 position".into(),
        ));
    }
    let mut ckpt = import::load(path)?;
    let tokenizer = match tokenizer {
        Some(file) => Tokenizer::from_file(file)
            .map_err(|e| Error::format(file, format!("cannot load the tokenizer: {e}")))?,
        None => ckpt.take_tokenizer(path)?,
    };
    check_vocab(&tokenizer, ckpt.config.vocab_size)?;
    ckpt.config.max_seq_len = ckpt.config.max_seq_len.min(positions);
    let weights = ckpt.weights()?;
    Ok((LlamaModel::new(ckpt.config, weights)?, tokenizer))
}

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    /// Sampling parameters (temperature 0 is greedy).
    pub sampler: SamplerConfig,
    /// Stop after this many generated tokens.
    pub max_tokens: usize,
    /// Do not stop at end-of-sequence tokens.
    pub ignore_eos: bool,
}

/// One generated token as handed to the caller of [`Session::generate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece<'a> {
    /// The token id; `None` for the final flush of the decoder (incomplete UTF-8 bytes
    /// left at the end, as U+FFFD), which has no token of its own.
    pub id: Option<u32>,
    /// The text this token completes: possibly empty (the first bytes of a character
    /// split over several tokens, a control token), otherwise whole UTF-8 characters.
    pub text: &'a str,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-sequence token (not counted as generated).
    EndOfSequence,
    /// `max_tokens` tokens were generated.
    MaxTokens,
    /// The KV cache holds no more positions.
    ContextFull,
    /// The caller's callback returned [`ControlFlow::Break`].
    Stopped,
}

/// Counts and timings of one [`Session::generate`] call.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Tokens of the prompt, BOS included.
    pub prompt_tokens: usize,
    /// Tokens generated (end-of-sequence excluded).
    pub generated: usize,
    /// From the start of the prefill to the first sampled token.
    pub time_to_first_token: Duration,
    /// The prefill forward pass.
    pub prefill: Duration,
    /// The decode steps after the first token.
    pub decode: Duration,
    /// Number of those steps.
    pub decode_steps: usize,
    /// Why it ended.
    pub stop: StopReason,
}

/// A model instance with its own KV cache, and the tokenizer; see the module docs.
pub struct Session {
    model: Llama,
    tokenizer: Arc<Tokenizer>,
}

impl Session {
    /// A session running `model` (an instance with its own KV cache, for example
    /// [`Llama::with_model`] over a shared model) with `tokenizer`.
    ///
    /// Errors: [`Error::Config`] if the tokenizer does not belong to the model.
    pub fn new(model: Llama, tokenizer: Arc<Tokenizer>) -> Result<Session> {
        check_vocab(&tokenizer, model.config().vocab_size)?;
        Ok(Session { model, tokenizer })
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The model instance (for its configuration).
    pub fn model(&self) -> &Llama {
        &self.model
    }

    /// Generates a continuation of `prompt` (the prompt itself is not handed out), calling
    /// `on_piece` for every generated token and once more, with `id: None`, for the
    /// decoder's final flush. `on_piece` returning [`ControlFlow::Break`] stops generation
    /// after that token ([`StopReason::Stopped`]).
    ///
    /// Errors: [`Error::Tokenizer`] if the prompt cannot be encoded; [`Error::InvalidInput`]
    /// for an empty encoding; [`Error::PromptTooLong`] for a prompt that leaves no position
    /// to generate;
    /// [`Error::Core`] for invalid sampling parameters or a device error.
    pub fn generate(
        &mut self,
        exec: &Executor,
        prompt: &str,
        params: &GenerateParams,
        mut on_piece: impl FnMut(Piece<'_>) -> ControlFlow<()>,
    ) -> Result<Generation> {
        let mut sampler = Sampler::new(params.sampler.clone())?;
        let tokenizer = &*self.tokenizer;
        let mut tokens = tokenizer.encode(prompt, true)?;
        if tokens.is_empty() {
            return Err(Error::InvalidInput(
                "the prompt is empty and the tokenizer has no begin-of-sequence token".into(),
            ));
        }
        let context = self.model.config().max_seq_len;
        if tokens.len() >= context {
            return Err(Error::PromptTooLong {
                tokens: tokens.len(),
                context,
            });
        }
        let mut eos = self.model.config().eos_token_ids.clone();
        eos.extend(tokenizer.eos_id());
        let prompt_tokens = tokens.len();
        let only_bos = prompt_tokens == 1 && tokenizer.bos_id() == Some(tokens[0]);
        let mut decoder = tokenizer.stream_decoder(only_bos);

        let start = Instant::now();
        let mut logits = self.model.forward(exec, &tokens, 0, Logits::Last)?;
        let prefill = start.elapsed();
        let mut time_to_first_token = prefill;
        let mut decode = Duration::ZERO;
        let mut decode_steps = 0;
        let mut generated = 0;
        let stop = loop {
            if generated == params.max_tokens {
                break StopReason::MaxTokens;
            }
            let next = sampler.sample(logits, &tokens)?;
            if generated == 0 {
                time_to_first_token = start.elapsed();
            }
            if !params.ignore_eos && eos.contains(&next) {
                break StopReason::EndOfSequence;
            }
            generated += 1;
            tokens.push(next);
            let text = decoder.push(next)?;
            let piece = Piece {
                id: Some(next),
                text: &text,
            };
            if on_piece(piece).is_break() {
                break StopReason::Stopped;
            }
            if generated == params.max_tokens {
                break StopReason::MaxTokens;
            }
            if tokens.len() >= context {
                break StopReason::ContextFull;
            }
            let step = Instant::now();
            logits = self
                .model
                .forward(exec, &[next], tokens.len() - 1, Logits::Last)?;
            decode += step.elapsed();
            decode_steps += 1;
        };
        let rest = decoder.finish();
        let _ = on_piece(Piece {
            id: None,
            text: &rest,
        });
        Ok(Generation {
            prompt_tokens,
            generated,
            time_to_first_token,
            prefill,
            decode,
            decode_steps,
            stop,
        })
    }
}
