//! One entry point for every graph: [`Model`] is what the CLI (and the C ABI and server)
//! load and run, whatever the architecture recorded in the configuration.
//!
//! Each graph is split into a shared, immutable part (configuration, weights, RoPE table)
//! and a per-instance part (KV cache, activations). [`SharedModel`] is the former, behind an
//! `Arc`; [`SharedModel::instance`] makes a [`Model`] with a fresh KV cache, so that any
//! number of instances (one per session, on any thread) run with one copy of the weights.

use std::sync::Arc;

use flm_core::Executor;

use crate::chatglm::{ChatGlm, ChatGlmModel, ChatGlmWeights};
use crate::import::Checkpoint;
use crate::llama::{Llama, LlamaModel, LlamaWeights, Logits};
use crate::{Arch, Error, ModelConfig, Placement, Result};

/// The shared part of a model of any supported architecture: cheap to clone (an `Arc`),
/// `Send + Sync`.
#[derive(Clone)]
pub enum SharedModel {
    /// The Llama graph (Llama, ChatGLM2/3, GLM-4, Baichuan, InternLM).
    Llama(Arc<LlamaModel>),
    /// The ChatGLM-6B graph.
    ChatGlm(Arc<ChatGlmModel>),
}

impl SharedModel {
    /// Builds the shared model of `ckpt`'s architecture from its weights.
    ///
    /// Errors: a missing tensor or a shape mismatch, an invalid configuration.
    pub fn new(ckpt: &Checkpoint) -> Result<SharedModel> {
        let config = ckpt.config.clone();
        Ok(match ckpt.config.arch {
            Arch::Llama => SharedModel::Llama(Arc::new(LlamaModel::new(config, ckpt.weights()?)?)),
            Arch::ChatGlm { .. } => SharedModel::ChatGlm(Arc::new(ChatGlmModel::new(
                config,
                ckpt.chatglm_weights()?,
            )?)),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        match self {
            SharedModel::Llama(m) => m.config(),
            SharedModel::ChatGlm(m) => m.config(),
        }
    }

    /// The model with its layers in the memories of the placement `plan` makes from the
    /// model's [`LlamaModel::memory_bytes`] (see [`LlamaModel::place`]), before any
    /// instance is made.
    ///
    /// Errors: [`Error::Config`] for ChatGLM-6B's graph, whose layers run in host memory
    /// only, or when instances of the model exist; those of `plan` and of
    /// [`LlamaModel::place`].
    pub fn place(
        self,
        exec: &Executor,
        plan: impl FnOnce(&LlamaModel) -> Result<Placement>,
    ) -> Result<SharedModel> {
        let SharedModel::Llama(model) = self else {
            return Err(Error::Config(
                "ChatGLM-6B's graph runs in host memory only; leave out --gpu-layers".into(),
            ));
        };
        let model = Arc::try_unwrap(model).map_err(|_| {
            Error::Config("a model is placed before any instance of it is made".into())
        })?;
        let placement = plan(&model)?;
        Ok(SharedModel::Llama(Arc::new(model.place(exec, placement)?)))
    }

    /// A new instance, with its own KV cache (empty but for the p-tuning prefix) and
    /// activations, sharing the weights (see [`Llama::with_model`], [`ChatGlm::with_model`]).
    ///
    /// Errors: a buffer whose size overflows.
    pub fn instance(&self) -> Result<Model> {
        Ok(match self {
            SharedModel::Llama(m) => Model::Llama(Llama::with_model(Arc::clone(m))?),
            SharedModel::ChatGlm(m) => Model::ChatGlm(ChatGlm::with_model(Arc::clone(m))?),
        })
    }
}

/// A model of any supported architecture, ready to run: one instance, with its KV cache.
// The variants differ by a few hundred bytes of buffer handles; a `Model` is made once per
// session and never moved in a loop, so boxing one would only add an indirection.
#[allow(clippy::large_enum_variant)]
pub enum Model {
    /// The Llama graph (Llama, ChatGLM2/3, GLM-4, Baichuan, InternLM).
    Llama(Llama),
    /// The ChatGLM-6B graph.
    ChatGlm(ChatGlm),
}

/// flm's canonical tensor names and shapes for `c`'s architecture (see
/// [`LlamaWeights::canonical_shapes`] and [`ChatGlmWeights::canonical_shapes`]).
pub fn canonical_shapes(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    match c.arch {
        Arch::Llama => LlamaWeights::canonical_shapes(c),
        Arch::ChatGlm { .. } => ChatGlmWeights::canonical_shapes(c),
    }
}

impl Model {
    /// Builds the model of `ckpt`'s architecture from its weights.
    ///
    /// Errors: a missing tensor or a shape mismatch, an invalid configuration.
    pub fn new(ckpt: &Checkpoint) -> Result<Model> {
        SharedModel::new(ckpt)?.instance()
    }

    /// The shared part of this instance, to make more instances of it.
    pub fn shared(&self) -> SharedModel {
        match self {
            Model::Llama(m) => SharedModel::Llama(Arc::clone(m.model())),
            Model::ChatGlm(m) => SharedModel::ChatGlm(Arc::clone(m.model())),
        }
    }

    /// Whether a sequence in the KV cache can be continued by a later call at a position
    /// after 0 with new tokens (a cached prefix reused for a new prompt). False for
    /// ChatGLM-6B, whose bidirectional context must be run in one pass from position 0.
    pub fn continues_prefix(&self) -> bool {
        matches!(self, Model::Llama(_))
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        match self {
            Model::Llama(m) => m.config(),
            Model::ChatGlm(m) => m.config(),
        }
    }

    /// Runs `tokens` at positions `start_pos..` and returns logits (see
    /// [`Llama::forward`] and [`ChatGlm::forward`]).
    ///
    /// Errors: as the graph's `forward`.
    pub fn forward(
        &mut self,
        exec: &Executor,
        tokens: &[u32],
        start_pos: usize,
        logits: Logits,
    ) -> Result<&[f32]> {
        match self {
            Model::Llama(m) => m.forward(exec, tokens, start_pos, logits),
            Model::ChatGlm(m) => m.forward(exec, tokens, start_pos, logits),
        }
    }

    /// Runs `tokens` at positions `start_pos..` and returns every token's hidden state after
    /// the final norm, `[tokens.len() · dim]` (see [`Llama::hidden_states`]).
    ///
    /// Errors: as the graph's `forward`.
    pub fn hidden_states(
        &mut self,
        exec: &Executor,
        tokens: &[u32],
        start_pos: usize,
    ) -> Result<&[f32]> {
        match self {
            Model::Llama(m) => m.hidden_states(exec, tokens, start_pos),
            Model::ChatGlm(m) => m.hidden_states(exec, tokens, start_pos),
        }
    }
}
