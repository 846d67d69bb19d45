//! flm-core: the types every other crate of flm is built on.
//!
//! - [`Data`]: a tensor (dtype, shape, strides, storage owned or borrowed from an mmap).
//! - [`Op`]: the typed operations a model graph is made of, and their contract
//!   ([`Op::validate`], written once for every device).
//! - [`BaseDevice`] and [`Executor`]: devices in priority order; the first that supports an op
//!   runs it; a per-op profiler printed at exit when `FLM_PROFILE=1`; [`StepGraph`]: a
//!   decode step captured once on a device and replayed.
//! - [`KvCache`], [`RopeTable`] and [`Sampler`]: the run state shared by all model graphs;
//!   [`PagedKvCache`]: the block pool of batched serving.
//!
//! The shape follows FastLLM's Data / Executor / BaseDevice design, with ops as a typed enum
//! rather than string-keyed dispatch (see docs/architecture.md).

mod alibi;
pub mod blocks;
pub mod comm;
mod constraint;
mod contract;
mod data;
mod device;
mod dtype;
mod error;
mod executor;
pub mod flm_file;
pub mod ggml;
pub mod kquant;
mod kv_cache;
mod memory;
mod op;
mod paged_kv;
#[cfg(unix)]
mod pages;
pub mod panels;
mod partial_file;
mod profile;
pub mod quant;
#[cfg(any(test, feature = "testing"))]
pub mod recording;
mod rope;
mod sampling;
mod step_graph;

pub use alibi::alibi_slopes;
pub use constraint::{
    Constraint, Grammar, Pattern, Vocabulary, MAX_COMPILE_BYTES, MAX_COMPILE_TIME,
    MAX_DETERMINIZE_BYTES, MAX_DFA_BYTES, MAX_NFA_BYTES, MAX_PATTERN_SIZE,
};
pub use contract::CheckedOp;
pub use data::Data;
pub use device::BaseDevice;
pub use dtype::{DataType, Format, Int4Form};
pub use error::{Error, Result};
pub use executor::Executor;
pub use kv_cache::{KvCache, KvDtype};
pub use memory::{DeviceBuffer, Location, Route, TransferRecord, Transfers};
pub use op::{
    AttentionOperands, AttentionParams, DecoupledRope, Expert, ExpertActivation, ExpertGroups,
    GroupScore, LinearPart, MoeRouting, Op, OpKind, PagedSeq, RouterScoring, SampleState, TokenIds,
};
pub use paged_kv::{BlockAllocator, PagedKvCache};
pub use panels::Layout;
pub use partial_file::PartialFile;
pub use rope::{yarn_mscale, Llama3Scaling, RopeScaling, RopeStyle, RopeTable, YarnScaling};
pub use sampling::{
    argmax, chacha8_block, chacha8_key, chacha8_word, log_softmax_top, sample_tensors,
    sampler_state, unit_f32, DeviceSampler, Sampler, SamplerConfig, TokenLogprobs,
    SAMPLER_STATE_WORDS,
};
pub use step_graph::{CapturedStep, StepBounds, StepGraph, StepInputs};
