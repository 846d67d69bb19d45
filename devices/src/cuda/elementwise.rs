//! The element-wise ops of [`super::CudaDevice`] (`kernels/elementwise.cu`): SwiGLU and
//! GeGLU, residual add, GELU, scale and soft-capping, and row copies between tensors on
//! the GPU.

use cudarc::driver::PushKernelArg;
use flm_core::{Data, Error, Result};

use super::device::CudaDevice;
use super::graph::Bound;
use super::kernels::{Kernel, KvType};
use super::launch::{dev_err, grid, int};

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
/// In a captured step, a copy that follows the step (`follows_step`: the step's keys and
/// values) runs `copy_rows_at` of the cache's type, which reads the destination row from
/// the step's buffer; the others (fixed rows) stay copies.
///
/// Errors: [`flm_core::Error::DType`] for a destination neither f32 nor f16;
/// [`flm_core::Error::Device`] when the copy or the launch fails.
pub(super) fn copy_rows(
    dev: &CudaDevice,
    (src, src_row): (&Data, usize),
    (dst, dst_row): (&mut Data, usize),
    (n_rows, follows_step): (usize, bool),
) -> Result<()> {
    let cols = src.cols();
    let n = n_rows * cols;
    if n == 0 {
        return Ok(());
    }
    let kv = KvType::of(dst.dtype()).ok_or_else(|| Error::DType {
        op: "CopyRows",
        msg: format!("a {} destination on cuda", dst.dtype()),
    })?;
    let step = if follows_step {
        dev.step_words("CopyRows", true, |_, _, row| row == dst_row)?
    } else {
        None
    };
    let dst_rows = dst.rows();
    let s = dev.input(src)?;
    let mut d = dev.in_out(dst)?;
    let from = src_row * cols * 4;
    let view = s.slice().slice(from..from + n * 4);
    let to = dst_row * cols * kv.bytes();
    match (step, kv) {
        (None, KvType::F32) => {
            let mut target = d.slice().slice_mut(to..to + n * 4);
            dev.stream
                .memcpy_dtod(&view, &mut target)
                .map_err(dev_err)?;
        }
        (None, KvType::F16) => {
            let mut target = d.slice().slice_mut(to..to + n * 2);
            let n_i = n as i64;
            let f = dev.function(Kernel::F32ToF16Rows)?;
            let mut b = dev.stream.launch_builder(f);
            b.arg(&view).arg(&mut target).arg(&n_i);
            // SAFETY: the views hold n floats and n 16-bit values, as
            // `f32_to_f16_rows(const float*, f16_bits*, long)` uses them.
            unsafe { b.launch(elem_grid(n)?) }.map_err(dev_err)?;
        }
        (Some(step), kv) => {
            dev.bound(Bound::CacheRows(dst_rows))?;
            let (cols_i, n_i) = (int(cols)?, int(n_rows)?);
            let dst_rows_u = u32::try_from(dst_rows).unwrap_or(u32::MAX);
            let row = step.cache_row();
            let f = dev.function(Kernel::CopyRowsAt(kv))?;
            let mut b = dev.stream.launch_builder(f);
            b.arg(&view)
                .arg(d.slice())
                .arg(&row)
                .arg(&cols_i)
                .arg(&n_i)
                .arg(&dst_rows_u);
            // SAFETY: arguments as `copy_rows_at(const float*, float*, const unsigned*, int,
            // int, unsigned)` (`copy_rows_at_f16` with an f16 dst); the view holds n_rows ×
            // cols floats, dst dst_rows × cols elements of `kv`, and the kernel writes only
            // rows below dst_rows.
            unsafe { b.launch(elem_grid(n)?) }.map_err(dev_err)?;
        }
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
