//! One entry point for every graph: [`Model`] is what the CLI (and the C ABI and server)
//! load and run, whatever the architecture recorded in the configuration.

use flm_core::Executor;

use crate::chatglm::{ChatGlm, ChatGlmWeights};
use crate::import::Checkpoint;
use crate::llama::{Llama, LlamaWeights, Logits};
use crate::{Arch, ModelConfig, Result};

/// A model of any supported architecture, ready to run.
pub enum Model {
    /// The Llama graph (Llama, ChatGLM2/3, GLM-4, Baichuan, InternLM).
    Llama(Llama),
    /// The ChatGLM-6B graph.
    ChatGlm(ChatGlm),
}

/// What every graph offers the code that drives it (generation, evaluation): its
/// configuration and a forward pass returning logits.
pub trait CausalLm {
    /// The configuration.
    fn config(&self) -> &ModelConfig;

    /// Runs `tokens` at positions `start_pos..` and returns logits, `[vocab_size]` for
    /// [`Logits::Last`] and `[tokens.len() · vocab_size]` for [`Logits::All`] (see
    /// [`Llama::forward`]).
    ///
    /// Errors: as the graph's `forward`.
    fn forward(
        &mut self,
        exec: &Executor,
        tokens: &[u32],
        start_pos: usize,
        logits: Logits,
    ) -> Result<&[f32]>;
}

macro_rules! causal_lm {
    ($($ty:ty),*) => {$(
        impl CausalLm for $ty {
            fn config(&self) -> &ModelConfig {
                <$ty>::config(self)
            }

            fn forward(
                &mut self,
                exec: &Executor,
                tokens: &[u32],
                start_pos: usize,
                logits: Logits,
            ) -> Result<&[f32]> {
                <$ty>::forward(self, exec, tokens, start_pos, logits)
            }
        }
    )*};
}

causal_lm!(Llama, ChatGlm, Model);

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
        Ok(match ckpt.config.arch {
            Arch::Llama => Model::Llama(Llama::new(ckpt.config.clone(), ckpt.weights()?)?),
            Arch::ChatGlm { .. } => {
                Model::ChatGlm(ChatGlm::new(ckpt.config.clone(), ckpt.chatglm_weights()?)?)
            }
        })
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
