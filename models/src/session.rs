//! Generation sessions: the one generation loop behind `flm run`, `flm chat`, the C ABI
//! and servers.
//!
//! A [`Session`] pairs a model instance ([`Model`] of any architecture: weights shared
//! through a [`SharedModel`], its own KV cache) with the tokenizer, and generates as
//! llama2.c `run.c` `generate` does: the prompt is prefilled in one forward pass, then
//! each decode step samples a token from the last logits ([`flm_core::Sampler`]), stops at
//! an end-of-sequence or stop token, after `max_tokens`, when the context is full or when
//! the caller asks, and otherwise feeds the token back. The text is streamed through
//! [`flm_tokenizer::StreamDecoder`], so a UTF-8 character split over byte-fallback tokens
//! is handed out whole.
//!
//! The session remembers which tokens have their keys and values in its KV cache. A new
//! prompt is prefilled only after its longest common prefix with them (at least its last
//! token is run, for the logits), so a multi-turn chat whose prompt repeats the
//! conversation so far costs only the new turn — llama.cpp's `cache_prompt`, chatglm.cpp's
//! `n_past`. ChatGLM-6B cannot continue after a prefix ([`crate::Graph::continues_prefix`]): its
//! bidirectional context must be complete in one pass, so every prompt restarts at
//! position 0.
//!
//! When the model's logits are computed on a device ([`crate::Graph::logits_location`]:
//! its last layer runs there) and no draft model is set, they stay there: each step samples
//! on the device ([`DeviceSampler`], the ids [`Sampler`] picks) and only the sampled id
//! comes back to the host.
//!
//! With a draft model ([`Session::set_draft`]), each decode step is a round of speculative
//! decoding ([`crate::speculative`]) that yields one or more tokens; they pass through the
//! same stop conditions, one by one, as the tokens of plain decoding.
//!
//! Sessions over one [`SharedModel`] are independent: create one per thread.
//! [`load_model`] reads a checkpoint and its tokenizer for them.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flm_core::{DeviceSampler, Executor, Location, Sampler, SamplerConfig};
use flm_tokenizer::Tokenizer;

use crate::llama::Logits;
use crate::speculative::{check_same_vocabulary, common_prefix, Draft, DraftStats};
use crate::{import, Model, SharedModel};
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
/// the file `tokenizer` if given ([`import::load_tokenizer_file`]: a tokenizer file, with
/// the `tokenizer_config.json` beside it if any, or a GGUF file), else the one inside or beside the checkpoint. The
/// model's context is capped at `context` positions (default [`DEFAULT_CONTEXT`]), which
/// bounds the KV cache of each session. Each line of [`import::Checkpoint::load_notes`]
/// (a GGUF weight type converted at load, GPTQ/AWQ tensors dequantised, and the cost) is
/// printed on stderr.
///
/// Errors: [`Error::Io`] for a file that cannot be read (a missing file included),
/// [`Error::Format`] for a malformed checkpoint (whatever part of flm finds the problem)
/// or tokenizer, [`Error::Config`] for an
/// invalid configuration or a tokenizer that does not belong to the model,
/// [`Error::InvalidInput`] for a context of 0.
pub fn load_model(
    path: &Path,
    tokenizer: Option<&Path>,
    context: Option<usize>,
) -> Result<(SharedModel, Tokenizer)> {
    let (ckpt, tokenizer) = load_checkpoint(path, tokenizer, context)?;
    let model = SharedModel::new(&ckpt).map_err(|e| e.in_file(path))?;
    Ok((model, tokenizer))
}

/// [`load_model`]'s checkpoint, its context capped, before a graph is built from it (for a
/// caller that builds its own, such as a tensor-parallel split).
///
/// Errors: as [`load_model`].
pub fn load_checkpoint(
    path: &Path,
    tokenizer: Option<&Path>,
    context: Option<usize>,
) -> Result<(import::Checkpoint, Tokenizer)> {
    let positions = context.unwrap_or(DEFAULT_CONTEXT);
    if positions == 0 {
        return Err(Error::InvalidInput(
            "the context must hold at least 1 position".into(),
        ));
    }
    let mut ckpt = import::load(path).map_err(|e| e.in_file(path))?;
    let tokenizer = match tokenizer {
        Some(file) => import::load_tokenizer_file(file)?,
        None => ckpt.take_tokenizer(path)?,
    };
    check_vocab(&tokenizer, ckpt.config.vocab_size)?;
    for note in ckpt.load_notes() {
        eprintln!("note: {note}");
    }
    ckpt.config.max_seq_len = ckpt.config.max_seq_len.min(positions);
    Ok((ckpt, tokenizer))
}

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    /// Sampling parameters (temperature 0 is greedy).
    pub sampler: SamplerConfig,
    /// Stop after this many generated tokens.
    pub max_tokens: usize,
    /// Do not stop at end-of-sequence tokens (nor at `stop`).
    pub ignore_eos: bool,
    /// Tokens that end the generation besides the model's and the tokenizer's
    /// end-of-sequence tokens, such as a chat format's ([`Tokenizer::chat_stop_ids`]).
    pub stop: Vec<u32>,
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
    /// The model produced an end-of-sequence or stop token (not counted as generated).
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
    /// Tokens of the prompt, BOS (or the tokenizer's prefix) included.
    pub prompt_tokens: usize,
    /// Leading prompt tokens whose keys and values were already in the KV cache, from
    /// the previous call; the prefill ran the other `prompt_tokens - reused_tokens`.
    pub reused_tokens: usize,
    /// Tokens generated (end-of-sequence excluded).
    pub generated: usize,
    /// From the start of the prefill to the first sampled token.
    pub time_to_first_token: Duration,
    /// The prefill forward pass (of the tokens not reused) and the first token's sampling
    /// (a device finishes the pass only when its id is read).
    pub prefill: Duration,
    /// The decode steps after the first token.
    pub decode: Duration,
    /// Tokens those steps sampled: one per step without a draft, those of each round with
    /// one (an end-of-sequence token and the tokens a round drew after it included).
    pub decode_steps: usize,
    /// Why it ended.
    pub stop: StopReason,
    /// With a draft model, its proposed and accepted tokens.
    pub draft: Option<DraftStats>,
}

/// A model instance with its own KV cache, the tokenizer, and the tokens whose keys and
/// values are in the cache; see the module docs.
pub struct Session {
    model: Model,
    tokenizer: Arc<Tokenizer>,
    /// The tokens at positions `0..cached.len()` of the KV cache.
    cached: Vec<u32>,
    draft: Option<Draft>,
}

impl Session {
    /// A session running `model` (an instance with its own KV cache, for example
    /// [`SharedModel::instance`]) with `tokenizer`. The cache is taken as empty.
    ///
    /// Errors: [`Error::Config`] if the tokenizer does not belong to the model.
    pub fn new(model: Model, tokenizer: Arc<Tokenizer>) -> Result<Session> {
        check_vocab(&tokenizer, model.config().vocab_size)?;
        Ok(Session {
            model,
            tokenizer,
            cached: Vec::new(),
            draft: None,
        })
    }

    /// Decodes speculatively from now on, with `draft` proposing tokens that this session's
    /// model verifies ([`crate::speculative`]): a draft model, with its tokenizer
    /// `draft_tokenizer`, or the model's own multi-token-prediction layers ([`Draft::mtp`];
    /// `draft_tokenizer` is `None`), whose hidden states the model keeps from now on.
    ///
    /// Errors: [`Error::Config`] when the draft model does not share the target's
    /// vocabulary and tokenizer ([`check_same_vocabulary`]) or comes without its tokenizer,
    /// when the target is ChatGLM-6B (its passes cannot continue a cached sequence), or for
    /// prediction layers the model lacks or cannot run ([`crate::Graph::keep_mtp_hidden`]).
    /// The cache is taken as empty after a prediction-layer draft is set.
    pub fn set_draft(&mut self, draft: Draft, draft_tokenizer: Option<&Tokenizer>) -> Result<()> {
        if !self.model.continues_prefix() {
            return Err(Error::Config(
                "speculative decoding cannot verify drafts with a ChatGLM-6B target: it \
                 cannot continue a cached sequence"
                    .into(),
            ));
        }
        match (draft.model(), draft_tokenizer) {
            (Some(model), Some(tokenizer)) => {
                check_same_vocabulary(&self.model, &self.tokenizer, model, tokenizer)?
            }
            (Some(_), None) => {
                return Err(Error::Config(
                    "a draft model needs its tokenizer, to check it against the model's".into(),
                ))
            }
            (None, _) => {
                self.model.keep_mtp_hidden()?;
                // The hidden states of what is cached now were not kept.
                self.cached.clear();
            }
        }
        self.draft = Some(draft);
        Ok(())
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The model instance (for its configuration).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Generates a continuation of `prompt`, encoded with BOS (the tokenizer's prefix)
    /// where the tokenizer asks for it ([`Tokenizer::add_bos`]: not SmolLM2's GGUF);
    /// see [`Session::generate_tokens`]. The output is decoded as the start of a text (its
    /// dummy-prefix space dropped) when the prompt encodes to the prefix alone.
    ///
    /// Errors: [`Error::Tokenizer`] if the prompt cannot be encoded; those of
    /// [`Session::generate_tokens`].
    pub fn generate(
        &mut self,
        exec: &Executor,
        prompt: &str,
        params: &GenerateParams,
        on_piece: impl FnMut(Piece<'_>) -> ControlFlow<()>,
    ) -> Result<Generation> {
        let tokens = self.tokenizer.encode(prompt, self.tokenizer.add_bos())?;
        let at_start = tokens == self.tokenizer.prefix();
        self.generate_tokens(exec, tokens, at_start, params, on_piece)
    }

    /// Generates a continuation of the token ids `prompt` (a whole sequence from position
    /// 0; the part of it still in the KV cache from the previous call is not run again).
    /// The prompt itself is not handed out: `on_piece` is called for every generated token
    /// and once more, with `id: None`, for the decoder's final flush; returning
    /// [`ControlFlow::Break`] stops generation after that token ([`StopReason::Stopped`]).
    /// `at_start` decodes the output as the start of a text (drops its dummy-prefix space,
    /// as after a chat format's assistant tag).
    ///
    /// Errors: [`Error::InvalidInput`] for an empty prompt or a ChatGLM-6B prompt without
    /// its `[gMASK]`/`sop` tokens; [`Error::PromptTooLong`] for a prompt that leaves no
    /// position to generate; [`Error::Core`] for invalid sampling parameters, a token
    /// outside the vocabulary or a device error. After an error the KV cache is taken as
    /// empty.
    pub fn generate_tokens(
        &mut self,
        exec: &Executor,
        prompt: Vec<u32>,
        at_start: bool,
        params: &GenerateParams,
        mut on_piece: impl FnMut(Piece<'_>) -> ControlFlow<()>,
    ) -> Result<Generation> {
        let mut sampler = Sampler::new(params.sampler.clone())?;
        if let Some(draft) = &mut self.draft {
            draft.start(&params.sampler)?;
            // The target scores K + 1 draft tokens in one pass; greedy output equals plain
            // greedy decoding only if each row gets the bits it would get alone.
            exec.require_batch_invariance();
        }
        let mut tokens = prompt;
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
        let tokenizer = &*self.tokenizer;
        let mut eos = self.model.config().eos_token_ids.clone();
        eos.extend(tokenizer.eos_id());
        eos.extend(&params.stop);
        let prompt_tokens = tokens.len();
        let reused = if self.model.continues_prefix() {
            common_prefix(&self.cached, &tokens).min(prompt_tokens - 1)
        } else {
            0
        };
        let mut decoder = tokenizer.stream_decoder(at_start);
        // Until the forward passes succeed, the cache holds an unknown sequence.
        self.cached.clear();

        // Logits left on a device are sampled there (speculative rounds need them here).
        let location = self.model.logits_location();
        let mut on_device = match (&self.draft, location) {
            (None, Location::Device { .. }) => Some(DeviceSampler::new(
                exec,
                &params.sampler,
                self.model.config().vocab_size,
                location,
                &tokens,
            )?),
            _ => None,
        };

        let first = Step {
            tokens: &tokens[reused..],
            start_pos: reused,
            history: &tokens,
            output: &[],
        };
        let start = Instant::now();
        // Tokens sampled and not yet handed out: one per step, or a speculative round's.
        let mut batch = Vec::new();
        if params.max_tokens > 0 {
            batch.push(first.next(exec, &mut self.model, &mut sampler, on_device.as_mut())?);
        } else {
            self.model
                .forward(exec, first.tokens, first.start_pos, Logits::Last)?;
        }
        let prefill = start.elapsed();
        let time_to_first_token = prefill;
        let mut in_cache = prompt_tokens;
        let mut decode = Duration::ZERO;
        let mut decode_steps = 0;
        let mut generated = 0;
        let stop = 'decode: loop {
            for &next in &batch {
                if !params.ignore_eos && eos.contains(&next) {
                    break 'decode StopReason::EndOfSequence;
                }
                generated += 1;
                tokens.push(next);
                let text = decoder.push(next)?;
                let piece = Piece {
                    id: Some(next),
                    text: &text,
                };
                if on_piece(piece).is_break() {
                    break 'decode StopReason::Stopped;
                }
                if generated >= params.max_tokens {
                    break 'decode StopReason::MaxTokens;
                }
                if tokens.len() >= context {
                    break 'decode StopReason::ContextFull;
                }
            }
            if generated >= params.max_tokens {
                break StopReason::MaxTokens;
            }
            let step = Instant::now();
            batch.clear();
            match &mut self.draft {
                None => {
                    let step = Step {
                        tokens: &tokens[tokens.len() - 1..],
                        start_pos: tokens.len() - 1,
                        history: &tokens,
                        output: &tokens[prompt_tokens..],
                    };
                    batch.push(step.next(
                        exec,
                        &mut self.model,
                        &mut sampler,
                        on_device.as_mut(),
                    )?);
                }
                Some(draft) => {
                    let max_new = params.max_tokens - generated;
                    let round = draft.round(
                        exec,
                        &mut self.model,
                        &tokens,
                        prompt_tokens,
                        &mut sampler,
                        max_new,
                    )?;
                    batch.extend_from_slice(round);
                }
            }
            // The target's cache holds the sequence and every new token but the last.
            in_cache = tokens.len() + batch.len() - 1;
            decode += step.elapsed();
            decode_steps += batch.len();
        };
        tokens.truncate(in_cache.min(tokens.len()));
        self.cached = tokens;
        let rest = decoder.finish();
        let _ = on_piece(Piece {
            id: None,
            text: &rest,
        });
        Ok(Generation {
            prompt_tokens,
            reused_tokens: reused,
            generated,
            time_to_first_token,
            prefill,
            decode,
            decode_steps,
            stop,
            draft: self.draft.as_ref().map(Draft::stats),
        })
    }
}

/// One forward pass of plain decoding (or the prefill) and the token sampled from it.
struct Step<'a> {
    /// The tokens run, at positions `start_pos..`.
    tokens: &'a [u32],
    start_pos: usize,
    /// The sequence so far (the repetition penalty's history) and its generated part (the
    /// presence and frequency penalties' output).
    history: &'a [u32],
    output: &'a [u32],
}

impl Step<'_> {
    /// Runs the pass and samples: on the logits' device with `on_device` (which holds the
    /// history and output itself), else from host logits with `sampler`.
    fn next(
        &self,
        exec: &Executor,
        model: &mut Model,
        sampler: &mut Sampler,
        on_device: Option<&mut DeviceSampler>,
    ) -> Result<u32> {
        Ok(match on_device {
            Some(device) => {
                let logits = model.forward_resident(exec, self.tokens, self.start_pos)?;
                device.sample(exec, logits)?
            }
            None => {
                let logits = model.forward(exec, self.tokens, self.start_pos, Logits::Last)?;
                sampler.sample_with_output(logits, self.history, self.output)?
            }
        })
    }
}
