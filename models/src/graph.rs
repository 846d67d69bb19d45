//! One interface for every model graph.
//!
//! A graph is split into a shared, immutable part (configuration, weights, RoPE table),
//! which implements [`SharedGraph`] and sits behind an `Arc`, and per-instance parts (KV
//! cache, activations), which implement [`Graph`]. [`SharedModel`] and [`Model`] hold
//! either behind the trait, so that tools load and run any architecture the same way:
//! [`SharedModel::instance`] makes a [`Model`] with a fresh KV cache, and any number of
//! instances (one per session, on any thread) run with one copy of the weights.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use flm_core::{Data, Executor, KvDtype, Location};

use crate::chatglm::{ChatGlmModel, ChatGlmWeights};
use crate::import::Checkpoint;
use crate::llama::{Ffn, LlamaBatch, LlamaLayer, LlamaModel, LlamaWeights, Logits};
use crate::{Arch, Error, GpuLayers, ModelConfig, Placement, Result};

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

    /// The batched forward pass over a paged KV cache that the serving engine runs, for
    /// up to `rows` tokens per step.
    ///
    /// Errors: [`Error::Config`] for a graph that cannot be batched (ChatGLM-6B, whose
    /// prefix-LM mask needs the whole context in one pass); buffer allocation errors.
    fn batch(self: Arc<Self>, rows: usize) -> Result<LlamaBatch>;

    /// The element type of its instances' KV caches.
    fn kv_dtype(&self) -> KvDtype;

    /// The graph with its instances' KV caches of `kv_dtype`, before any instance is made.
    ///
    /// Errors: [`Error::State`] when instances of it exist.
    fn with_kv_dtype(self: Arc<Self>, kv_dtype: KvDtype) -> Result<SharedModel>;

    /// The Llama graph's shared model, for what only it offers (layer placement across
    /// devices); `None` for other graphs.
    fn as_llama(self: Arc<Self>) -> Option<Arc<LlamaModel>> {
        None
    }
}

/// The shared part of a model of any supported architecture: cheap to clone (an `Arc`),
/// `Send + Sync`.
#[derive(Clone)]
pub struct SharedModel(Arc<dyn SharedGraph>);

impl SharedModel {
    /// Builds the shared model of `ckpt`'s architecture from its weights.
    ///
    /// Errors: a missing tensor or a shape mismatch, an invalid configuration.
    pub fn new(ckpt: &Checkpoint) -> Result<SharedModel> {
        let config = ckpt.config.clone();
        Ok(match ckpt.config.arch {
            Arch::Llama => LlamaModel::new(config, LlamaWeights::load(ckpt)?)?.into(),
            Arch::ChatGlm { .. } => SharedModel(Arc::new(ChatGlmModel::new(
                config,
                ChatGlmWeights::load(ckpt)?,
            )?)),
        })
    }

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

    /// The batched forward pass (see [`SharedGraph::batch`]).
    ///
    /// Errors: as [`SharedGraph::batch`].
    pub fn batch(&self, rows: usize) -> Result<LlamaBatch> {
        Arc::clone(&self.0).batch(rows)
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

    /// The Llama graph's shared model, if this is one.
    pub fn llama(&self) -> Option<Arc<LlamaModel>> {
        Arc::clone(&self.0).as_llama()
    }

    /// The model with its layers in the memories of the placement `plan` makes from the
    /// model's [`LlamaModel::memory_bytes`] (see [`LlamaModel::place`]), before any
    /// instance is made.
    ///
    /// Errors: [`Error::Config`] for ChatGLM-6B's graph, whose layers run in host memory
    /// only; [`Error::State`] when instances of the model exist; those of `plan` and of
    /// [`LlamaModel::place`].
    pub fn place(
        self,
        exec: &Executor,
        plan: impl FnOnce(&LlamaModel) -> Result<Placement>,
    ) -> Result<SharedModel> {
        let Some(model) = self.llama() else {
            return Err(Error::Config(
                "ChatGLM-6B's graph runs in host memory only; leave out --gpu-layers".into(),
            ));
        };
        drop(self);
        let model = Arc::try_unwrap(model).map_err(|_| {
            Error::State("a model is placed before any instance of it is made".into())
        })?;
        let placement = plan(&model)?;
        Ok(model.place(exec, placement)?.into())
    }

    /// The model with its first layers in the GPU memory `gpu` as `layers` says, the rest
    /// in host memory (llama.cpp's `--n-gpu-layers`): [`GpuLayers::Auto`] fits as many as
    /// the executor's free memory there holds after their KV caches ([`Placement::fit`]
    /// over [`LlamaModel::memory_bytes`]). With `experts_on_host` a mixture's routed
    /// experts stay in host memory ([`Placement::with_experts_on`]) and do not count.
    ///
    /// Errors: [`Error::Config`] when `gpu` does not tell its free memory (auto); those of
    /// [`SharedModel::place`].
    pub fn place_gpu_layers(
        self,
        exec: &Executor,
        gpu: Location,
        layers: GpuLayers,
        experts_on_host: bool,
    ) -> Result<SharedModel> {
        self.place(exec, |m| {
            let n_layers = m.config().n_layers;
            let placement = match layers {
                GpuLayers::Count(n) => Placement::first_layers(n_layers, gpu, n),
                GpuLayers::Auto => {
                    let free = exec.free_memory(gpu).ok_or_else(|| {
                        Error::Config(format!(
                            "--gpu-layers auto: {gpu} does not tell its free memory"
                        ))
                    })?;
                    let (mut layers, input, head) = m.memory_bytes();
                    if experts_on_host {
                        for (bytes, lw) in layers.iter_mut().zip(&m.weights().layers) {
                            *bytes = bytes.saturating_sub(routed_bytes(lw));
                        }
                    }
                    Placement::fit(gpu, free, &layers, input, head)
                }
            };
            Ok(if experts_on_host {
                placement.with_experts_on(Location::Host)
            } else {
                placement
            })
        })
    }
}

/// Bytes of a layer's router and experts, the shared one included (0 for a dense
/// feed-forward).
fn routed_bytes(lw: &LlamaLayer) -> u64 {
    match &lw.ffn {
        Ffn::Moe {
            router,
            experts,
            shared,
        } => experts
            .iter()
            .chain(shared.iter().map(|s| &s.ffn))
            .flat_map(|e| [&e.gate, &e.up, &e.down])
            .chain([router])
            .chain(shared.iter().map(|s| &s.gate))
            .map(|d| d.size_bytes() as u64)
            .sum(),
        Ffn::Dense { .. } => 0,
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
    /// Builds the model of `ckpt`'s architecture from its weights.
    ///
    /// Errors: a missing tensor or a shape mismatch, an invalid configuration.
    pub fn new(ckpt: &Checkpoint) -> Result<Model> {
        SharedModel::new(ckpt)?.instance()
    }

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
