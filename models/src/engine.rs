//! The serving engine: continuous batching over a paged KV cache, as in TGI and vLLM
//! (Yu et al. 2022, Orca; Kwon et al. 2023, vLLM).
//!
//! An [`Engine`] owns a scheduler thread, which owns the model's batch runner
//! ([`crate::llama::LlamaBatch`]), the [`Executor`] and the KV block pool ([`flm_core::PagedKvCache`], sized by
//! [`EngineConfig::max_batch_total_tokens`]). Requests are queued by [`Engine::submit`] from
//! any thread. Each step the scheduler:
//! 1. gives every decoding sequence a slot for its next token, taking a new block when its
//!    last one is full; when the pool has none left it preempts the most recently admitted
//!    sequence (its blocks are freed and it is queued again, first in line, to be recomputed
//!    from its prompt and the tokens it generated so far, as vLLM's recompute preemption);
//! 2. admits waiting requests in FIFO order while the prefill budget
//!    ([`EngineConfig::max_batch_prefill_tokens`]) lasts and the pool has the blocks of
//!    their whole prompt; a prompt longer than the budget is prefilled in chunks over
//!    several steps;
//! 3. runs one batched forward pass over every running sequence's tokens of the step (a
//!    decode token or a prompt chunk), so each weight is read once for the whole batch;
//! 4. samples one token for each sequence whose prompt is complete, with the request's own
//!    seeded [`flm_core::Sampler`], and hands it to the request's callback; a sequence that
//!    ends (a stop token, `max_tokens`, the context full, or cancelled by its callback)
//!    gives its blocks back at once.
//!
//! The full KV blocks of every sequence stay in a prefix cache after it ends, keyed by their
//! tokens and those before them; a prompt whose leading full blocks are cached (a shared
//! system prompt, an earlier turn of a chat) takes their KV blocks, reference-counted, and
//! computes only the rest. Cached blocks no sequence uses are evicted least recently used
//! first when the pool runs short (vLLM's automatic prefix caching; see `prefix.rs`).
//!
//! A model placed on a device (`--gpu-layers`) is served there: each layer's pools and
//! activations live in its memory, and a step copies the logits to the host, where the
//! requests' samplers run.
//!
//! When the pool is full, requests wait; nothing fails for lack of memory. Token ids only:
//! tokenizing and detokenizing are the caller's. Greedy requests produce, token for token,
//! what [`crate::session::Session`] produces for them alone, since every row of a batch is
//! computed as a lone sequence is (see [`crate::llama::LlamaBatch`]).
//!
//! Graphs: every family that runs on the Llama graph (Llama 1–3, Mistral, Qwen2, ChatGLM2/3,
//! GLM-4, Baichuan with ALiBi, InternLM, p-tuning prefixes). ChatGLM-6B, whose prefix-LM mask
//! needs its whole context in one pass, is refused by [`Engine::new`] with
//! [`Error::Config`].

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use flm_core::{Constraint, Error as CoreError, Executor, Sampler, SamplerConfig, TokenLogprobs};

use crate::{Error, ModelConfig, Result, SharedModel};

mod prefix;
mod scheduler;

use scheduler::{Pending, Scheduler};

/// The budgets of an [`Engine`] (TGI's launcher options of the same names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Positions per KV block (vLLM's `block_size`); 16 by default.
    pub block_size: usize,
    /// Positions the KV pool holds over all running sequences, prompt and generated tokens
    /// together; the pool has `max_batch_total_tokens / block_size` blocks.
    pub max_batch_total_tokens: usize,
    /// Prompt tokens prefilled per step over all sequences; longer prompts are prefilled in
    /// chunks.
    pub max_batch_prefill_tokens: usize,
    /// Tokens per step, decode and prefill together (vLLM's `max_num_batched_tokens`), or
    /// `None` for no bound besides the prefill budget: prompt chunks get what the decoding
    /// sequences leave of it (at least one token, so that prompts always progress). A small
    /// value bounds the time per output token of the decoding sequences while a long
    /// prompt arrives, at the cost of that prompt's time to first token.
    pub max_batch_tokens: Option<usize>,
    /// Requests waiting for admission beyond which [`Engine::submit`] returns
    /// [`Error::QueueFull`].
    pub max_waiting: usize,
}

impl Default for EngineConfig {
    /// Blocks of 16 positions, 4096 positions in the pool, 2048 prefill tokens per step,
    /// no bound on the tokens of a step besides, 256 waiting requests.
    fn default() -> Self {
        EngineConfig {
            block_size: 16,
            max_batch_total_tokens: 4096,
            max_batch_prefill_tokens: 2048,
            max_batch_tokens: None,
            max_waiting: 256,
        }
    }
}

/// One generation request, in token ids.
#[derive(Debug, Clone)]
pub struct Request {
    /// The sequence from position 0 (BOS included by the caller).
    pub prompt: Vec<u32>,
    /// Sampling parameters (temperature 0: greedy), the presence and frequency penalties
    /// applied over the generated tokens, the repetition penalty over prompt and output.
    pub sampler: SamplerConfig,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Token ids that end the generation (not delivered), besides the model
    /// configuration's end-of-sequence ids; the caller adds the tokenizer's EOS here.
    pub stop_tokens: Vec<u32>,
    /// `Some(k)`: every [`Event::Token`] carries the token's log-probability and the `k`
    /// most likely tokens' ([`flm_core::log_softmax_top`]); `None`: none.
    pub logprobs: Option<usize>,
    /// Structured output: only tokens that keep the reply within the constraint's
    /// language are sampled, a stop token only once the reply is a whole word of it, and
    /// the request stops by itself when no token can extend it.
    pub constraint: Option<Constraint>,
    /// Set to `true` (from any thread) to cancel the request: the scheduler looks at it
    /// before every step, so a request that is waiting, or prefilling a long prompt, leaves
    /// the engine (and frees its KV blocks) without waiting for its next token, and gets
    /// [`Event::Finished`] with [`FinishReason::Cancelled`]. `None`: cancelled only by its
    /// callback.
    pub cancel: Option<Arc<AtomicBool>>,
}

/// What the engine tells a request's callback.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A generated token, with its log-probabilities if the request asked for them.
    Token(u32, Option<TokenLogprobs>),
    /// The request is done; no event follows.
    Finished(Finish),
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    /// Why.
    pub reason: FinishReason,
    /// Tokens of its prompt.
    pub prompt_tokens: usize,
    /// Tokens delivered as [`Event::Token`].
    pub completion_tokens: usize,
}

/// Why a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop or end-of-sequence token was sampled (and not delivered).
    Stop,
    /// `max_tokens` tokens were generated, or the context (or the whole KV pool) is full.
    Length,
    /// Its [`Request::cancel`] flag was set, or the engine shut down before it ended.
    Cancelled,
    /// A device error ended it.
    Error(String),
    /// No token could continue the reply within its [`Request::constraint`] (the
    /// vocabulary cannot write the rest of its language; a constraint compiled for this
    /// model's vocabulary never gets here).
    Constraint(String),
}

/// A snapshot of the engine's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Requests queued, not running (preempted ones included).
    pub waiting: usize,
    /// Sequences running (prefilling or decoding).
    pub running: usize,
    /// KV blocks free, counting the cached prefix blocks no sequence uses (they are evicted
    /// when needed).
    pub free_blocks: usize,
    /// KV blocks registered in the prefix cache (in use or not).
    pub cached_blocks: usize,
    /// KV blocks in the pool.
    pub total_blocks: usize,
    /// Positions per block.
    pub block_size: usize,
    /// Prompt tokens of the requests admitted so far.
    pub prompt_tokens: u64,
    /// Tokens generated (delivered) so far.
    pub generated_tokens: u64,
    /// Requests that ended (any reason).
    pub finished_requests: u64,
    /// Sequences preempted for lack of KV blocks (and recomputed later).
    pub preemptions: u64,
    /// Requests (or preempted sequences readmitted) that took at least one block from the
    /// prefix cache.
    pub prefix_cache_hits: u64,
    /// Prompt tokens whose keys and values were taken from the prefix cache (blocks of a
    /// running or an earlier sequence with the same prefix) instead of being computed.
    pub prefix_cached_tokens: u64,
}

/// The callback of a request: called on the scheduler thread for every token and once with
/// [`Event::Finished`]; [`ControlFlow::Break`] cancels the request.
pub type OnEvent = Box<dyn FnMut(Event) -> ControlFlow<()> + Send>;

/// The continuous-batching engine (see the module docs). `Send + Sync`: share it behind an
/// `Arc` between the threads that submit requests.
pub struct Engine {
    sender: Option<Sender<Pending>>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<Mutex<EngineStats>>,
    queued: Arc<AtomicUsize>,
    config: ModelConfig,
    engine_config: EngineConfig,
}

impl Engine {
    /// Starts the scheduler thread over `model` run by `exec`, with the KV pool and budgets
    /// of `config`.
    ///
    /// Errors: [`Error::Config`] for a model the engine cannot batch (ChatGLM-6B), a block
    /// size or prefill budget of 0, or a pool of less than one block; a pool too large to
    /// allocate.
    pub fn new(model: SharedModel, exec: Executor, config: EngineConfig) -> Result<Engine> {
        let n_blocks = config.max_batch_total_tokens / config.block_size.max(1);
        if config.block_size == 0
            || n_blocks == 0
            || config.max_batch_prefill_tokens == 0
            || config.max_batch_tokens == Some(0)
        {
            return Err(Error::Config(format!(
                "engine budgets: blocks of {} positions, {} positions in the pool, {} prefill \
                 tokens and {:?} tokens per step: each must allow at least one block and one \
                 token",
                config.block_size,
                config.max_batch_total_tokens,
                config.max_batch_prefill_tokens,
                config.max_batch_tokens
            )));
        }
        // A request's tokens must not depend on the requests batched with it.
        exec.require_batch_invariance();
        let batch = model.batch(config.max_batch_prefill_tokens.min(256))?;
        let c = model.config().clone();
        let kv = batch.kv_pool(&exec, n_blocks, config.block_size)?;
        let stats = Arc::new(Mutex::new(EngineStats {
            free_blocks: n_blocks,
            total_blocks: n_blocks,
            block_size: config.block_size,
            ..EngineStats::default()
        }));
        let queued = Arc::new(AtomicUsize::new(0));
        let (sender, receiver) = mpsc::channel();
        let scheduler = Scheduler::new(
            batch,
            exec,
            kv,
            &config,
            Arc::clone(&stats),
            Arc::clone(&queued),
        );
        let thread = std::thread::Builder::new()
            .name("flm-engine".into())
            .spawn(move || scheduler.run(receiver))
            .map_err(|e| Error::Config(format!("cannot start the engine thread: {e}")))?;
        Ok(Engine {
            sender: Some(sender),
            thread: Some(thread),
            stats,
            queued,
            config: c,
            engine_config: config,
        })
    }

    /// Queues `request`; `on_event` is called on the scheduler thread for every sampled
    /// token and once with [`Event::Finished`]. Returning [`ControlFlow::Break`] cancels the
    /// request at once (its KV blocks are freed before the next step) and it gets no further
    /// events.
    ///
    /// Errors (synchronous; nothing is queued): [`Error::InvalidInput`] for an empty prompt
    /// or a prompt longer than the KV pool; [`flm_core::Error::TokenOutOfRange`] (wrapped)
    /// for a token outside the vocabulary; [`Error::PromptTooLong`] when the prompt leaves no
    /// position of the context to generate into; [`flm_core::Error::InvalidArgument`]
    /// (wrapped) for invalid sampling parameters; [`Error::QueueFull`] when
    /// [`EngineConfig::max_waiting`] requests are waiting already.
    pub fn submit(&self, request: Request, on_event: OnEvent) -> Result<()> {
        let c = &self.config;
        if request.prompt.is_empty() {
            return Err(Error::InvalidInput("the prompt has no tokens".into()));
        }
        let vocab_size = c.vocab_size;
        if let Some(&id) = request.prompt.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(CoreError::TokenOutOfRange { id, vocab_size }.into());
        }
        if request.prompt.len() + 1 > c.max_seq_len {
            return Err(Error::PromptTooLong {
                tokens: request.prompt.len(),
                context: c.max_seq_len,
            });
        }
        let pool = self.engine_config.max_batch_total_tokens / self.engine_config.block_size
            * self.engine_config.block_size;
        if c.pre_seq_len + request.prompt.len() + 1 > pool {
            return Err(Error::InvalidInput(format!(
                "the prompt is {} tokens long but the KV pool holds {pool} positions in all \
                 (max_batch_total_tokens), including one to generate",
                request.prompt.len()
            )));
        }
        let sampler = Sampler::new(request.sampler.clone())?;
        let waiting = self.queued.load(Ordering::SeqCst);
        if waiting >= self.engine_config.max_waiting {
            return Err(Error::QueueFull { waiting });
        }
        let mut stop = request.stop_tokens;
        stop.extend(&c.eos_token_ids);
        let pending = Pending {
            prompt: request.prompt,
            sampler,
            max_tokens: request.max_tokens,
            stop,
            logprobs: request.logprobs,
            constraint: request.constraint,
            cancel: request.cancel,
            on_event,
        };
        let sender = self.sender.as_ref().ok_or(Error::EngineStopped)?;
        self.queued.fetch_add(1, Ordering::SeqCst);
        sender.send(pending).map_err(|_| {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            Error::EngineStopped
        })
    }

    /// The engine's counters now.
    pub fn stats(&self) -> EngineStats {
        match self.stats.lock() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The budgets the engine was started with.
    pub fn engine_config(&self) -> &EngineConfig {
        &self.engine_config
    }
}

impl Drop for Engine {
    /// Stops the scheduler thread and waits for it; requests still queued or running get
    /// [`Event::Finished`] with [`FinishReason::Cancelled`].
    fn drop(&mut self) {
        self.sender = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
