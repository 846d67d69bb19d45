//! What every kernel launch of the CUDA device uses: its launch configuration, its `int`
//! and optional pointer arguments, and driver errors as flm errors. A leaf module: the
//! kernels' modules and the device read it, and it reads none of them.

use cudarc::driver::{CudaSlice, LaunchArgs, LaunchConfig, PushKernelArg};
use flm_core::{Error, Result};

/// A null device pointer, passed by value for an absent optional operand (a bias, the
/// ALiBi slopes): the kernels test the pointer before reading through it.
const NULL: u64 = 0;

/// Pushes the kernel argument `v`, or a null pointer when it is absent.
pub(super) fn arg_or_null<'a, T>(b: &mut LaunchArgs<'a>, v: Option<&'a CudaSlice<T>>) {
    match v {
        Some(v) => b.arg(v),
        None => b.arg(&NULL),
    };
}

/// A driver, cuBLAS or NVRTC error as an flm error.
pub(super) fn dev_err(e: impl std::fmt::Display) -> Error {
    Error::Device(e.to_string())
}

/// A launch of `grid` blocks of `block` threads with `smem` bytes of dynamic shared memory.
pub(super) fn grid(grid: (usize, usize, usize), block: u32, smem: u32) -> Result<LaunchConfig> {
    let dim = |v: usize| {
        u32::try_from(v.max(1))
            .map_err(|_| Error::InvalidArgument(format!("grid dimension {v} too large")))
    };
    Ok(LaunchConfig {
        grid_dim: (dim(grid.0)?, dim(grid.1)?, dim(grid.2)?),
        block_dim: (block, 1, 1),
        shared_mem_bytes: smem,
    })
}

/// `v` as a kernel's `int` argument.
pub(super) fn int(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::InvalidArgument(format!("{v} exceeds a kernel int")))
}
