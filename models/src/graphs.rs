//! The graphs flm has, behind [`SharedModel`] and [`Model`]: the one a checkpoint's
//! architecture selects, the serving engine's batched forward pass and the placement of
//! layers across devices (each graph's own, through [`crate::SharedGraph`]). [`crate::graph`]
//! names no concrete graph; this module is the one place that maps architectures to them.

use std::sync::Arc;

use flm_core::{Executor, Location};

use crate::chatglm::{ChatGlmWeights, SharedChatGlm};
use crate::graph::{BatchedForward, MemoryNeeds};
use crate::import::Checkpoint;
use crate::llama::{LlamaWeights, SharedLlama};
use crate::{Arch, Error, GpuLayers, Model, ModelConfig, Placement, Result, SharedModel};

impl SharedModel {
    /// Builds the shared model of `ckpt`'s architecture from its weights.
    ///
    /// Errors: a missing tensor or a shape mismatch, an invalid configuration.
    pub fn new(ckpt: &Checkpoint) -> Result<SharedModel> {
        let config = ckpt.config.clone();
        Ok(match ckpt.config.arch {
            Arch::Llama => SharedLlama::new(config, LlamaWeights::load(ckpt)?)?.into(),
            Arch::ChatGlm { .. } => SharedChatGlm::new(config, ChatGlmWeights::load(ckpt)?)?.into(),
        })
    }

    /// The batched forward pass over a paged KV cache that the serving engine runs, for
    /// up to `rows` tokens per step ([`crate::SharedGraph::batch`]).
    ///
    /// Errors: [`Error::Config`] for a graph that cannot be batched (ChatGLM-6B, whose
    /// prefix-LM mask needs the whole context in one pass); buffer allocation errors.
    pub fn batch(&self, rows: usize) -> Result<Box<dyn BatchedForward>> {
        Arc::clone(&self.0).batch(rows)
    }

    /// The Llama graph's shared model, if this is one.
    pub fn llama(&self) -> Option<Arc<SharedLlama>> {
        Arc::clone(&self.0).as_any().downcast::<SharedLlama>().ok()
    }

    /// The tensor-parallel model's rank 0, if this is one.
    pub fn tensor_parallel(&self) -> Option<Arc<crate::tensor_parallel::TensorParallel>> {
        Arc::clone(&self.0).as_any().downcast().ok()
    }

    /// Where each layer runs; `None` for a graph that runs in host memory only.
    pub fn placement(&self) -> Option<&Placement> {
        self.0.placement()
    }

    /// The model with its layers in the memories of the placement `plan` makes from the
    /// configuration and [`crate::SharedGraph::memory_needs`] (see
    /// [`crate::SharedGraph::place`]), before any instance is made.
    ///
    /// Errors: [`Error::Config`] for a graph whose layers run in host memory only
    /// (ChatGLM-6B's); [`Error::State`] when instances of the model exist; those of `plan`
    /// and of [`crate::SharedGraph::place`].
    pub fn place(
        self,
        exec: &Executor,
        plan: impl FnOnce(&ModelConfig, &MemoryNeeds) -> Result<Placement>,
    ) -> Result<SharedModel> {
        let needs = self.0.memory_needs()?;
        let placement = plan(self.config(), &needs)?;
        self.0.place(exec, placement)
    }

    /// The model with its first layers in the GPU memory `gpu` as `layers` says, the rest
    /// in host memory (llama.cpp's `--n-gpu-layers`): [`GpuLayers::Auto`] fits as many as
    /// the executor's free memory there holds after their KV caches ([`Placement::fit`]
    /// over [`crate::SharedGraph::memory_needs`]). With `experts_on_host` a mixture's routed
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
        self.place(exec, |c, needs| {
            let placement = match layers {
                GpuLayers::Count(n) => Placement::first_layers(c.n_layers, gpu, n),
                GpuLayers::Auto => {
                    let free = exec.free_memory(gpu).ok_or_else(|| {
                        Error::Config(format!(
                            "--gpu-layers auto: {gpu} does not tell its free memory"
                        ))
                    })?;
                    let mut layers = needs.layers.clone();
                    if experts_on_host {
                        for (bytes, routed) in layers.iter_mut().zip(&needs.routed) {
                            *bytes = bytes.saturating_sub(*routed);
                        }
                    }
                    Placement::fit(gpu, free, &layers, needs.input, needs.head)
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

impl Model {
    /// Builds the model of `ckpt`'s architecture from its weights.
    ///
    /// Errors: a missing tensor or a shape mismatch, an invalid configuration.
    pub fn new(ckpt: &Checkpoint) -> Result<Model> {
        SharedModel::new(ckpt)?.instance()
    }
}
