//! flm-devices: the devices that run [`flm_core::Op`]s.
//!
//! - [`cpu::CpuDevice`]: every op, f32 activations with f32/f16/bf16/int8/int4 weights,
//!   threaded with rayon. One module per op family; each op has SIMD kernels (AVX2,
//!   AVX-512, chosen at run time by [`Isa`]) and a portable twin they are tested against.
//! - `cuda::CudaDevice` (cargo feature `cuda`): NVIDIA GPUs through cudarc, with the CUDA
//!   libraries loaded at run time.
//! - [`gemv_layout`]: the GPU layout its decode GEMV kernels read weights in, repacked
//!   on the host (plain Rust, tested on any machine).
//! - [`mod@select`]: the devices for `--device cpu|cuda|auto`, falling back to the CPU.
//! - [`SimDevice`]: the CPU kernels over a memory of their own, so that placement across
//!   devices is tested on machines without an accelerator.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod gemv_layout;
pub mod select;
pub mod sim;

pub use cpu::{ActivationBits, CpuDevice, Isa};
pub use select::{select, DeviceChoice, Selection};
pub use sim::SimDevice;
