//! flm-devices: the devices that run [`flm_core::Op`]s.
//!
//! - [`cpu::CpuDevice`]: every op, f32 activations with f32/f16/bf16/int8/int4 weights,
//!   threaded with rayon. One module per op family; each op has SIMD kernels (AVX2,
//!   AVX-512, chosen at run time by [`Isa`]) and a portable twin they are tested against.

pub mod cpu;

pub use cpu::{CpuDevice, Isa};
