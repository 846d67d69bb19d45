//! The CUDA device (cargo feature `cuda`).
//!
//! cudarc loads `libcuda`, `libnvrtc`, `libcublas` and `libnccl` at run time (its
//! `dynamic-loading` feature), so a binary built with this feature starts on machines
//! without them; cudarc panics when a library it calls into is absent, so [`probe`] checks
//! that the driver library loads and that device 0 answers before anything else touches
//! CUDA, and [`mod@crate::select`] falls back to the CPU with one line saying why.
//!
//! - [`CudaDevice`]: the [`flm_core::BaseDevice`] (which ops it runs and how its
//!   operands move is in its module docs).
//! - [`CudaBuffer`]: GPU memory as a tensor's storage ([`flm_core::DeviceBuffer`]).
//! - `graph`: a decode step captured as a CUDA graph and replayed ([`flm_core::StepGraph`]).
//! - [`kernels`]: our CUDA C sources (`kernels/*.cu`), embedded in the binary.
//! - [`nvrtc`]: compiles them with NVRTC for the GPU's compute capability at start-up.
//! - [`ptx_cache`]: keeps the PTX on disk, keyed by a hash of source, options and
//!   architecture, so later starts skip the compiler.
//! - [`NcclGroup`]: a tensor-parallel [`flm_core::comm::Communicator`] of one GPU per
//!   rank over NCCL (`libnccl`, loaded at run time like the others).

mod attention;
mod dequant;
mod device;
mod dispatch;
mod elementwise;
mod embedding;
mod flash_attn;
mod graph;
mod head_linear;
pub mod kernels;
mod launch;
mod linear;
mod memory;
pub mod nccl;
mod norm;
pub mod nvrtc;
mod operand;
mod paged;
pub mod ptx_cache;
mod rope;
mod sample;

pub use device::CudaDevice;
pub use memory::CudaBuffer;
pub use nccl::NcclGroup;

use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::CudaContext;

/// Threads of the one-block-per-row kernels (norms, embedding rows, argmax and top-k).
const ROW_THREADS: u32 = 256;

/// What the driver says about a GPU.
#[derive(Debug, Clone)]
pub struct GpuInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Marketing name ("NVIDIA H100 80GB HBM3").
    pub name: String,
    /// Compute capability `(major, minor)`: `(9, 0)` for Hopper, `(8, 0)` for A100.
    pub compute_capability: (i32, i32),
    /// Device memory, bytes.
    pub total_memory: usize,
    /// Streaming multiprocessors.
    pub multiprocessors: i32,
    /// Peak memory bandwidth in bytes/s: memory clock × bus width / 8 × 2 (double data
    /// rate), from the device attributes; `None` where the driver does not report them.
    pub peak_bandwidth: Option<f64>,
}

impl GpuInfo {
    /// The NVRTC architecture option of this GPU's compute capability (`compute_90`).
    pub fn arch(&self) -> String {
        let (major, minor) = self.compute_capability;
        format!("compute_{major}{minor}")
    }

    fn read(ctx: &Arc<CudaContext>) -> Result<GpuInfo, String> {
        let err = |e: cudarc::driver::DriverError| e.to_string();
        let clock_khz = ctx
            .attribute(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)
            .ok();
        let bus_bits = ctx
            .attribute(Attr::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)
            .ok();
        let peak_bandwidth = match (clock_khz, bus_bits) {
            (Some(khz), Some(bits)) if khz > 0 && bits > 0 => {
                Some(khz as f64 * 1e3 * bits as f64 / 8.0 * 2.0)
            }
            _ => None,
        };
        Ok(GpuInfo {
            ordinal: ctx.ordinal(),
            name: ctx.name().map_err(err)?,
            compute_capability: ctx.compute_capability().map_err(err)?,
            total_memory: ctx.total_mem().map_err(err)?,
            multiprocessors: ctx
                .attribute(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(err)?,
            peak_bandwidth,
        })
    }
}

/// Opens GPU `ordinal` and reads its [`GpuInfo`].
///
/// Errors: a one-line reason when there is no usable GPU: the driver library
/// (`libcuda.so`) cannot be loaded, the driver finds no device (or fails to initialise),
/// or the ordinal does not exist. Never panics: a panic inside cudarc is caught and
/// reported as a reason too.
pub fn probe(ordinal: usize) -> Result<(Arc<CudaContext>, GpuInfo), String> {
    // SAFETY: this only asks the dynamic loader whether the driver library can be opened
    // (libloading `Library::new` on candidate names); no CUDA symbol is called.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("libcuda.so not found".into());
    }
    let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal))
        .map_err(|_| "the CUDA driver library could not be used".to_string())?
        .map_err(|e| format!("no usable CUDA device {ordinal} ({e})"))?;
    let info = GpuInfo::read(&ctx)?;
    Ok((ctx, info))
}
