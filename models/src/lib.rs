//! flm-models: model configurations, model graphs and checkpoint importers.
//!
//! - [`ModelConfig`]: the hyper-parameters of a decoder-only transformer.
//! - [`llama::Llama`]: the Llama graph (RMSNorm, RoPE, GQA, SwiGLU), run through an
//!   [`flm_core::Executor`]; by configuration also ChatGLM2/3, GLM-4, Baichuan, InternLM.
//! - [`chatglm::ChatGlm`]: the ChatGLM-6B graph (LayerNorm, GELU, 2D RoPE, prefix-LM mask).
//! - [`Graph`] and [`SharedGraph`]: what every graph offers (forward pass, hidden states,
//!   batched forward, configuration); [`Model`] and [`SharedModel`] hold the graph of the
//!   configuration's [`Arch`] behind them, for tools to load and run.
//! - [`tensor_names`]: flm's canonical tensor names, and their names in Hugging Face and
//!   GGUF files, in one typed table that importers, graphs and the converter share.
//! - [`engine::Engine`]: continuous batching of many requests over a paged KV cache, for
//!   servers.
//! - [`import`]: reads llama2.c `.bin` checkpoints and Hugging Face directories, detecting
//!   the format from the bytes, into a config and weights that are zero-copy views of the
//!   mapped files where the layout allows.
//! - [`session`]: loading a model for generation, and [`session::Session`], the
//!   generation loop (prefill, sampling, decode, stop conditions, streamed text).
//! - [`speculative`]: speculative decoding with a draft model (Leviathan et al. 2023) or
//!   the model's own multi-token-prediction layers.

pub mod chatglm;
mod config;
pub mod convert;
pub mod engine;
mod error;
pub mod eval;
mod family;
mod graph;
mod graphs;
pub mod imatrix;
pub mod import;
pub mod llama;
mod placement;
pub mod session;
pub mod speculative;
pub mod tensor_names;
pub mod tensor_parallel;

pub use config::{Activation, Arch, MlaConfig, ModelConfig, MoeConfig};
pub use error::{Error, Result};
pub use family::Family;
pub use graph::{
    AsAny, BatchSeq, BatchedForward, Graph, Head, Logits, MemoryNeeds, Model, MtpInput,
    SharedGraph, SharedModel,
};
pub use llama::MtpLayer;
pub use placement::{GpuLayers, Placement};
