//! One interface for every model graph.
//!
//! A graph is split into a shared, immutable part (configuration, weights, RoPE table),
//! which implements [`SharedGraph`] and sits behind an `Arc`, and per-instance parts (KV
//! cache, activations), which implement [`Graph`]. [`SharedModel`] and [`Model`] hold
//! either behind the trait, so that tools load and run any architecture the same way:
//! [`SharedModel::instance`] makes a [`Model`] with a fresh KV cache, and any number of
//! instances (one per session, on any thread) run with one copy of the weights.

use std::any::Any;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use flm_core::{Data, Executor, KvDtype, Location, PagedKvCache};

use crate::{Error, ModelConfig, Placement, Result};

/// Which logits a forward pass computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (generation).
    Last,
    /// Every token's (teacher forcing, perplexity).
    All,
}

/// What a forward pass returns: logits, or the hidden states after the final norm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// Logits through the classifier.
    Logits(Logits),
    /// Every token's final-normed hidden state (`last_hidden_state` of transformers).
    Hidden,
}

/// Which hidden states feed the rows of a multi-token-prediction call
/// ([`Graph::mtp_forward`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MtpInput {
    /// The model's own after its final norm, at the call's positions, as its passes
    /// computed them (kept since [`Graph::keep_mtp_hidden`]).
    Model,
    /// The output of the previous call's last row, before its norm (vLLM's chaining of one
    /// prediction layer for more than one draft token); the call has one row.
    Previous,
}

/// One instance of a model graph: its KV cache and activations over shared weights.
pub trait Graph: Send {
    /// The configuration.
    fn config(&self) -> &ModelConfig;

    /// The shared part of this instance, to make more instances of it.
    fn shared(&self) -> SharedModel;

    /// Whether a sequence in the KV cache can be continued by a later call at a position
    /// after 0 with new tokens (a cached prefix reused for a new prompt). False for
    /// ChatGLM-6B, whose bidirectional context must be run in one pass from position 0.
    fn continues_prefix(&self) -> bool {
        true
    }

    /// Runs `tokens` at positions `start_pos..start_pos + tokens.len()`, reading keys and
    /// values of positions `< start_pos` from the KV cache (written by earlier calls) and
    /// storing the new ones. Returns, borrowed from buffers the instance reuses (so that
    /// decoding allocates nothing per token):
    /// - [`Head::Logits`]`(`[`Logits::Last`]`)`: the last token's logits, `[vocab_size]`;
    /// - [`Head::Logits`]`(`[`Logits::All`]`)`: every token's, `[tokens.len() · vocab_size]`;
    /// - [`Head::Hidden`]: every token's hidden state after the final norm,
    ///   `[tokens.len() · dim]` (transformers' `last_hidden_state`); all row-major f32.
    ///
    /// Errors: a token id outside the vocabulary, no tokens, or `start_pos + tokens.len()`
    /// beyond the context length (nothing is computed in those cases); the graph's own
    /// sequence rules; device errors.
    fn run(
        &mut self,
        exec: &Executor,
        tokens: &[u32],
        start_pos: usize,
        head: Head,
    ) -> Result<&[f32]>;

    /// The memory [`Graph::forward_resident`] leaves the logits in: a device's when the
    /// graph's last layer runs there, else host memory (the default).
    fn logits_location(&self) -> Location {
        Location::Host
    }

    /// [`Graph::run`] to the last token's logits, f32 `[1, vocab_size]`, left in the memory
    /// of [`Graph::logits_location`] (no copy to the host), for sampling where they are
    /// ([`flm_core::DeviceSampler`]).
    ///
    /// Errors: as [`Graph::run`]; [`Error::Config`] for a graph
    /// without device placement (the default).
    fn forward_resident(
        &mut self,
        exec: &Executor,
        tokens: &[u32],
        start_pos: usize,
    ) -> Result<&Data> {
        let _ = (exec, tokens, start_pos);
        Err(Error::Config(
            "this graph's logits are computed in host memory only".into(),
        ))
    }

    /// The multi-token-prediction layers this graph runs ([`crate::MtpLayer`]); 0, the
    /// default, for a graph without.
    fn mtp_layers(&self) -> usize {
        0
    }

    /// From now on, keeps the final-normed hidden state of every position its passes run,
    /// for [`Graph::mtp_forward`], and allocates the prediction layers' KV cache.
    ///
    /// Errors: [`Error::Config`] for a graph without prediction layers (the default) or
    /// one placed on a device.
    fn keep_mtp_hidden(&mut self) -> Result<()> {
        Err(Error::Config(
            "this model has no multi-token-prediction layers".into(),
        ))
    }

    /// Runs prediction layer `layer` over positions `start_pos..start_pos + tokens.len()`:
    /// row `i` reads `tokens[i]`, the token at position `start_pos + i + 1`, and the hidden
    /// state `input` names, and stores its keys and values in the layer's own KV cache.
    /// Returns the last row's logits, `[vocab_size]` f32, which draft the token at position
    /// `start_pos + tokens.len() + 1`. A call reads the kept hidden states it uses up;
    /// leading positions whose states an earlier call read are skipped (their cache rows
    /// keep what that call stored).
    ///
    /// Errors: [`Error::Config`] for a graph without prediction layers (the default);
    /// [`Error::State`] before [`Graph::keep_mtp_hidden`], or when the model's hidden
    /// states of those positions were not kept (or [`MtpInput::Previous`] with more than
    /// one row or no previous call); [`Error::InvalidInput`] for a `layer` out of range; a
    /// token out of the vocabulary, no tokens or positions beyond the context, as
    /// [`Graph::run`].
    fn mtp_forward(
        &mut self,
        exec: &Executor,
        layer: usize,
        tokens: &[u32],
        start_pos: usize,
        input: MtpInput,
    ) -> Result<&[f32]> {
        let _ = (exec, layer, tokens, start_pos, input);
        Err(Error::Config(
            "this model has no multi-token-prediction layers".into(),
        ))
    }

    /// [`Graph::run`] to logits.
    ///
    /// Errors: as [`Graph::run`].
    fn forward(
        &mut self,
        exec: &Executor,
        tokens: &[u32],
        start_pos: usize,
        logits: Logits,
    ) -> Result<&[f32]> {
        self.run(exec, tokens, start_pos, Head::Logits(logits))
    }

    /// [`Graph::run`] to the hidden states after the final norm, `[tokens.len() · dim]`.
    ///
    /// Errors: as [`Graph::run`].
    fn hidden_states(
        &mut self,
        exec: &Executor,
        tokens: &[u32],
        start_pos: usize,
    ) -> Result<&[f32]> {
        self.run(exec, tokens, start_pos, Head::Hidden)
    }
}

/// One sequence of a batched forward pass.
#[derive(Debug, Clone, Copy)]
pub struct BatchSeq<'a> {
    /// Its tokens of this step, at positions `start_pos..start_pos + tokens.len()`.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`: keys and values of positions `< start_pos` are in its
    /// blocks already.
    pub start_pos: usize,
    /// Its block table: the pool block of cache positions `k·block_size..(k+1)·block_size`
    /// (the p-tuning prefix, if any, first: cache position = `pre_seq_len` + position).
    pub blocks: &'a [u32],
}

/// A graph's batched forward pass over a paged KV cache: the step the serving engine runs
/// (continuous batching: Yu et al. 2022, Orca; vLLM). Each row is computed as
/// [`Graph::forward`] computes it, so that with batch-invariant kernels a sequence's logits
/// do not depend on the others of its step.
pub trait BatchedForward: Send {
    /// The configuration.
    fn config(&self) -> &ModelConfig;

    /// A pool of `n_blocks` KV blocks of `block_size` positions for every layer, each
    /// layer's in the memory it runs in.
    ///
    /// Errors: the allocation errors.
    fn kv_pool(&self, exec: &Executor, n_blocks: usize, block_size: usize) -> Result<PagedKvCache>;

    /// Writes the p-tuning prefix's keys and values (if the model has one) into the first
    /// `pre_seq_len` positions of the block table `blocks` of `kv`.
    ///
    /// Errors: a block table too short for the prefix; device errors.
    fn write_prefix(
        &mut self,
        exec: &Executor,
        kv: &mut PagedKvCache,
        blocks: &[u32],
    ) -> Result<()>;

    /// Runs one step of every sequence of `seqs`: stores the keys and values of their
    /// tokens in their blocks of `kv` and returns the logits of each sequence's last token,
    /// `[seqs.len() · vocab_size]` row-major, borrowed from a buffer reused by the next call.
    ///
    /// Errors (nothing is computed): no sequences, a sequence without tokens, a token id
    /// outside the vocabulary, positions beyond the context length, a block table too short
    /// for a sequence's positions or a block outside the pool; device errors.
    fn forward(
        &mut self,
        exec: &Executor,
        kv: &mut PagedKvCache,
        seqs: &[BatchSeq<'_>],
    ) -> Result<&[f32]>;
}

/// The bytes each part of a graph needs in the memory it is placed in, for
/// [`Placement::fit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryNeeds {
    /// Per layer: its weights and its KV cache for the whole context.
    pub layers: Vec<u64>,
    /// Per layer: the part of `layers` that its routed experts (router, experts, shared
    /// expert) take; 0 for a dense layer ([`Placement::with_experts_on`]).
    pub routed: Vec<u64>,
    /// The input side: the embedding table and one set of activations.
    pub input: u64,
    /// The head: the final norm and an untied classifier.
    pub head: u64,
}

/// A shared graph as `Any`, for a tool that needs one graph's own parts (the benchmark's
/// weights and instances of the Llama graph); every `'static` graph has it.
pub trait AsAny {
    /// The graph as `Any`, to downcast.
    fn as_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

impl<T: Any + Send + Sync> AsAny for T {
    fn as_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

/// The shared part of a model graph: configuration and weights, `Send + Sync`.
pub trait SharedGraph: AsAny + Send + Sync {
    /// The configuration.
    fn config(&self) -> &ModelConfig;

    /// A new instance, with its own KV cache (empty but for the p-tuning prefix) and
    /// activations, sharing the weights.
    ///
    /// Errors: a buffer whose size overflows.
    fn instance(self: Arc<Self>) -> Result<Model>;

    /// The element type of its instances' KV caches.
    fn kv_dtype(&self) -> KvDtype;

    /// The graph with its instances' KV caches of `kv_dtype`, before any instance is made.
    ///
    /// Errors: [`Error::State`] when instances of it exist.
    fn with_kv_dtype(self: Arc<Self>, kv_dtype: KvDtype) -> Result<SharedModel>;

    /// The batched forward pass for up to `rows` tokens a step.
    ///
    /// Errors: [`Error::Config`] for a graph that cannot be batched; buffer allocation
    /// errors.
    fn batch(self: Arc<Self>, rows: usize) -> Result<Box<dyn BatchedForward>>;

    /// What each part needs in the memory it is placed in.
    ///
    /// Errors: [`Error::Config`], saying why, for a graph that runs in host memory only.
    fn memory_needs(&self) -> Result<MemoryNeeds>;

    /// Where each layer runs; `None` (the default) for a graph that runs in host memory
    /// only.
    fn placement(&self) -> Option<&Placement> {
        None
    }

    /// The graph with its parts moved by `exec` to the memories of `placement`, before any
    /// instance is made.
    ///
    /// Errors: [`Error::Config`] for a graph that runs in host memory only or a placement
    /// of another number of layers; [`Error::State`] when instances of it exist; the
    /// allocation and copy errors.
    fn place(self: Arc<Self>, exec: &Executor, placement: Placement) -> Result<SharedModel>;
}

/// The shared part of a model of any supported architecture: cheap to clone (an `Arc`),
/// `Send + Sync`.
#[derive(Clone)]
pub struct SharedModel(pub(crate) Arc<dyn SharedGraph>);

impl SharedModel {
    /// Wraps a shared graph.
    pub fn from_graph(graph: Arc<dyn SharedGraph>) -> SharedModel {
        SharedModel(graph)
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        self.0.config()
    }

    /// A new instance (see [`SharedGraph::instance`]).
    ///
    /// Errors: as [`SharedGraph::instance`].
    pub fn instance(&self) -> Result<Model> {
        Arc::clone(&self.0).instance()
    }

    /// The element type of its instances' KV caches (see [`SharedGraph::kv_dtype`]).
    pub fn kv_dtype(&self) -> KvDtype {
        self.0.kv_dtype()
    }

    /// The model with its instances' KV caches of `kv_dtype` (`--kv-dtype`), before any
    /// instance is made.
    ///
    /// Errors: as [`SharedGraph::with_kv_dtype`].
    pub fn with_kv_dtype(self, kv_dtype: KvDtype) -> Result<SharedModel> {
        self.0.with_kv_dtype(kv_dtype)
    }
}

/// The graph behind `shared`, when no other reference to it exists.
///
/// Errors: [`Error::State`] when instances of it exist.
pub(crate) fn unshared<G>(shared: Arc<G>) -> Result<G> {
    Arc::try_unwrap(shared).map_err(|_| {
        Error::State("the KV cache dtype is set before any instance of the model is made".into())
    })
}

impl<G: SharedGraph + 'static> From<G> for SharedModel {
    fn from(graph: G) -> SharedModel {
        SharedModel(Arc::new(graph))
    }
}

/// A model of any supported architecture, ready to run: one instance, with its KV cache.
/// It dereferences to its [`Graph`].
pub struct Model(Box<dyn Graph>);

impl Model {
    /// Wraps an instance of a graph.
    pub fn from_graph(graph: impl Graph + 'static) -> Model {
        Model(Box::new(graph))
    }
}

impl Deref for Model {
    type Target = dyn Graph;

    fn deref(&self) -> &(dyn Graph + 'static) {
        &*self.0
    }
}

impl DerefMut for Model {
    fn deref_mut(&mut self) -> &mut (dyn Graph + 'static) {
        &mut *self.0
    }
}
