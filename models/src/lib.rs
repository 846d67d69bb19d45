//! flm-models: model configurations, model graphs and checkpoint importers.
//!
//! - [`ModelConfig`]: the hyper-parameters of a decoder-only transformer.
//! - [`llama::Llama`]: the Llama graph (RMSNorm, RoPE, GQA, SwiGLU), run through an
//!   [`flm_core::Executor`]; by configuration also ChatGLM2/3, GLM-4, Baichuan, InternLM.
//! - [`chatglm::ChatGlm`]: the ChatGLM-6B graph (LayerNorm, GELU, 2D RoPE, prefix-LM mask).
//! - [`Model`]: either graph, chosen by the configuration's [`Arch`]; what tools load;
//!   [`SharedModel`] its weights, shared between instances (sessions).
//! - [`engine::Engine`]: continuous batching of many requests over a paged KV cache, for
//!   servers.
//! - [`import`]: reads llama2.c `.bin` checkpoints and Hugging Face directories, detecting
//!   the format from the bytes, into a config and weights that are zero-copy views of the
//!   mapped files where the layout allows.
//! - [`session`]: loading a model for generation, and [`session::Session`], the
//!   generation loop (prefill, sampling, decode, stop conditions, streamed text).
//! - [`speculative`]: speculative decoding with a draft model (Leviathan et al. 2023).

pub mod chatglm;
mod config;
pub mod convert;
pub mod engine;
mod error;
pub mod eval;
pub mod import;
pub mod llama;
mod model;
mod placement;
pub mod session;
pub mod speculative;

pub use config::{Arch, ModelConfig};
pub use error::{Error, Result};
pub use model::{canonical_shapes, Model, SharedModel};
pub use placement::Placement;
