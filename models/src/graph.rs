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

use flm_core::{Data, Executor, KvDtype, Location};

use crate::{Error, ModelConfig, Result};

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

/// The shared part of a model graph: configuration and weights, `Send + Sync`.
pub trait SharedGraph: Send + Sync {
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

    /// The graph as `Any`, for what only one graph offers (the Llama graph's batching and
    /// placement across devices, in `graphs`).
    fn as_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
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
