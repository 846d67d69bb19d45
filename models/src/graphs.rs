//! The graphs flm has, behind [`SharedModel`] and [`Model`]: the one a checkpoint's
//! architecture selects, and what only the Llama graph offers (the serving engine's batched
//! forward pass, layer placement across devices). [`crate::graph`] names no concrete
//! graph; this module is the one place that maps architectures to them.

use std::sync::Arc;

use flm_core::{Executor, Location};

use crate::chatglm::{ChatGlmModel, ChatGlmWeights};
use crate::import::Checkpoint;
use crate::llama::{Ffn, LlamaBatch, LlamaLayer, LlamaModel, LlamaWeights};
use crate::{Arch, Error, GpuLayers, Model, Placement, Result, SharedGraph, SharedModel};

impl SharedModel {
    /// Builds the shared model of `ckpt`'s architecture from its weights.
    ///
    /// Errors: a missing tensor or a shape mismatch, an invalid configuration.
    pub fn new(ckpt: &Checkpoint) -> Result<SharedModel> {
        let config = ckpt.config.clone();
        Ok(match ckpt.config.arch {
            Arch::Llama => LlamaModel::new(config, LlamaWeights::load(ckpt)?)?.into(),
            Arch::ChatGlm { .. } => ChatGlmModel::new(config, ChatGlmWeights::load(ckpt)?)?.into(),
        })
    }

    /// The batched forward pass over a paged KV cache that the serving engine runs, for
    /// up to `rows` tokens per step.
    ///
    /// Errors: [`Error::Config`] for a graph that cannot be batched (ChatGLM-6B, whose
    /// prefix-LM mask needs the whole context in one pass); buffer allocation errors.
    pub fn batch(&self, rows: usize) -> Result<LlamaBatch> {
        let Some(model) = self.llama() else {
            return Err(Error::Config(
                "the serving engine runs the Llama graph; ChatGLM-6B (its prefix-LM mask needs \
                 the whole context in one pass) cannot be batched: use a Session"
                    .into(),
            ));
        };
        LlamaBatch::new(model, rows)
    }

    /// The Llama graph's shared model, if this is one.
    pub fn llama(&self) -> Option<Arc<LlamaModel>> {
        Arc::clone(&self.0).as_any().downcast::<LlamaModel>().ok()
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

impl Model {
    /// Builds the model of `ckpt`'s architecture from its weights.
    ///
    /// Errors: a missing tensor or a shape mismatch, an invalid configuration.
    pub fn new(ckpt: &Checkpoint) -> Result<Model> {
        SharedModel::new(ckpt)?.instance()
    }
}
