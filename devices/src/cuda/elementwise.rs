//! The element-wise ops of [`super::CudaDevice`] (`kernels/elementwise.cu`): SwiGLU and
//! GeGLU, residual add, GELU, scale and soft-capping, and row copies between tensors on
//! the GPU.

use cudarc::driver::PushKernelArg;
use flm_core::{Data, DataType, Result};

use super::device::{dev_err, grid, CudaDevice};
use super::kernels::Kernel;

/// Threads of the one-thread-per-element kernels.
const ELEM_THREADS: u32 = 256;

fn elem_grid(n: usize) -> Result<cudarc::driver::LaunchConfig> {
    grid((n.div_ceil(ELEM_THREADS as usize), 1, 1), ELEM_THREADS, 0)
}

/// The gated activations.
pub(super) enum Gate {
    /// [`flm_core::Op::SiluMul`].
    Silu,
    /// [`flm_core::Op::GeluMul`].
    Gelu,
}

/// [`flm_core::Op::SiluMul`] or [`flm_core::Op::GeluMul`].
pub(super) fn gate_mul(
    dev: &CudaDevice,
    gate_act: Gate,
    gate: &Data,
    up: &Data,
    output: &mut Data,
) -> Result<()> {
    let n = gate.numel();
    if n == 0 {
        return Ok(());
    }
    let (g, u) = (dev.input(gate)?, dev.input(up)?);
    let mut y = dev.output(output)?;
    let n_i = n as i64;
    let kernel = match gate_act {
        Gate::Silu => Kernel::SiluMul,
        Gate::Gelu => Kernel::GeluMul,
    };
    let f = dev.function(kernel)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(g.slice()).arg(u.slice()).arg(y.slice()).arg(&n_i);
    // SAFETY: three buffers of n floats, as `silu_mul` and `gelu_mul(const float*, const
    // float*, float*, long)` read and write them.
    unsafe { b.launch(elem_grid(n)?) }.map_err(dev_err)?;
    y.finish(dev)
}

/// [`flm_core::Op::Add`].
pub(super) fn add(dev: &CudaDevice, x: &mut Data, y: &Data) -> Result<()> {
    let n = x.numel();
    if n == 0 {
        return Ok(());
    }
    let yd = dev.input(y)?;
    let mut xd = dev.in_out(x)?;
    let n_i = n as i64;
    let f = dev.function(Kernel::Add)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(xd.slice()).arg(yd.slice()).arg(&n_i);
    // SAFETY: two buffers of n floats, as `add(float*, const float*, long)` uses them.
    unsafe { b.launch(elem_grid(n)?) }.map_err(dev_err)?;
    xd.finish(dev)
}

/// [`flm_core::Op::CopyRows`] between tensors on this GPU (keys and values into a KV
/// cache that lives here): one device-to-device copy of `n_rows` f32 rows into an f32
/// `dst`, or `f32_to_f16_rows` (round to nearest even, as the CPU's `half`) into an f16 one.
///
/// Errors: [`flm_core::Error::Device`] when the copy or the launch fails.
pub(super) fn copy_rows(
    dev: &CudaDevice,
    src: &Data,
    (src_row, n_rows): (usize, usize),
    dst: &mut Data,
    dst_row: usize,
) -> Result<()> {
    let cols = src.cols();
    let n = n_rows * cols;
    if n == 0 {
        return Ok(());
    }
    let to_f16 = dst.dtype() == DataType::F16;
    let elem = if to_f16 { 2 } else { 4 };
    let from = src_row * cols * 4;
    let to = dst_row * cols * elem;
    let s = dev.input(src)?;
    let mut d = dev.in_out(dst)?;
    let view = s.slice().slice(from..from + n * 4);
    let mut target = d.slice().slice_mut(to..to + n * elem);
    if to_f16 {
        let n_i = n as i64;
        let f = dev.function(Kernel::F32ToF16Rows)?;
        let mut b = dev.stream.launch_builder(f);
        b.arg(&view).arg(&mut target).arg(&n_i);
        // SAFETY: the views hold n floats and n 16-bit values, as
        // `f32_to_f16_rows(const float*, f16_bits*, long)` uses them.
        unsafe { b.launch(elem_grid(n)?) }.map_err(dev_err)?;
    } else {
        dev.stream
            .memcpy_dtod(&view, &mut target)
            .map_err(dev_err)?;
    }
    d.finish(dev)
}

/// The in-place element-wise ops.
pub(super) enum Unary {
    /// [`flm_core::Op::Gelu`].
    Gelu,
    /// [`flm_core::Op::Scale`].
    Scale(f32),
    /// [`flm_core::Op::SoftCap`].
    SoftCap(f32),
}

/// [`flm_core::Op::Gelu`], [`flm_core::Op::Scale`] or [`flm_core::Op::SoftCap`], in place.
pub(super) fn unary(dev: &CudaDevice, x: &mut Data, op: Unary) -> Result<()> {
    let n = x.numel();
    if n == 0 {
        return Ok(());
    }
    let mut xd = dev.in_out(x)?;
    let n_i = n as i64;
    match op {
        Unary::Gelu => {
            let f = dev.function(Kernel::Gelu)?;
            let mut b = dev.stream.launch_builder(f);
            b.arg(xd.slice()).arg(&n_i);
            // SAFETY: n floats, as `gelu(float*, long)` uses them.
            unsafe { b.launch(elem_grid(n)?) }.map_err(dev_err)?;
        }
        Unary::Scale(factor) | Unary::SoftCap(factor) => {
            let kernel = match op {
                Unary::SoftCap(_) => Kernel::SoftCap,
                _ => Kernel::Scale,
            };
            let f = dev.function(kernel)?;
            let mut b = dev.stream.launch_builder(f);
            b.arg(xd.slice()).arg(&factor).arg(&n_i);
            // SAFETY: n floats, as `scale` and `soft_cap(float*, float, long)` use them.
            unsafe { b.launch(elem_grid(n)?) }.map_err(dev_err)?;
        }
    }
    xd.finish(dev)
}
