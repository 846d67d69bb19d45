//! flm-devices: the devices that run [`flm_core::Op`]s.
//!
//! - [`cpu::CpuDevice`]: every op, f32 activations with f32/f16/bf16 weights, threaded with
//!   rayon. One module per op family; each kernel here is the portable version, written so
//!   that LLVM vectorises its inner loops, and is the twin that ISA-specific kernels are
//!   tested against.

pub mod cpu;

pub use cpu::{CpuDevice, Isa};
