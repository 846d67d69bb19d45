//! flm-models: model configurations, model graphs and checkpoint importers.
//!
//! - [`ModelConfig`]: the hyper-parameters of a decoder-only transformer.
//! - [`llama::Llama`]: the Llama graph (RMSNorm, RoPE, GQA, SwiGLU), run through an
//!   [`flm_core::Executor`].
//! - [`import`]: reads llama2.c `.bin` checkpoints and Hugging Face directories, detecting
//!   the format from the bytes, into a config and weights that are zero-copy views of the
//!   mapped files where the layout allows.
//! - [`session`]: loading a model for generation, and [`session::Session`], the
//!   generation loop (prefill, sampling, decode, stop conditions, streamed text).

mod config;
pub mod convert;
mod error;
pub mod eval;
pub mod import;
pub mod llama;
pub mod session;

pub use config::ModelConfig;
pub use error::{Error, Result};
