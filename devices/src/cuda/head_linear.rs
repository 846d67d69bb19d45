//! [`flm_core::Op::HeadLinear`] on [`super::CudaDevice`]: multi-head latent attention's
//! absorbed projections (DeepSeek-V2, §2.1.2), one Linear per head.
//!
//! Each head's columns of the input are copied into a contiguous matrix (`copy_cols` of
//! `kernels/elementwise.cu`), multiplied by the head's weight with the kernels of
//! [`super::linear`] (so each head gets the bits of [`flm_core::Op::Linear`] on this GPU),
//! and the product is copied into the head's columns of the output. The two matrices are
//! allocated once per op and reused by every head.

use cudarc::driver::{CudaSlice, PushKernelArg};
use flm_core::{Data, Result};

use super::device::CudaDevice;
use super::kernels::Kernel;
use super::launch::{dev_err, grid, int};
use super::linear::product;

/// `output[:, h·out..(h + 1)·out] = input[:, h·in..(h + 1)·in] · weights[h]ᵀ` for every
/// head `h` (shapes checked by the contract).
///
/// Errors: those of [`super::linear`]'s kernels.
pub(super) fn head_linear(
    dev: &CudaDevice,
    input: &Data,
    weights: &[Data],
    output: &mut Data,
) -> Result<()> {
    let Some(first) = weights.first() else {
        return Ok(());
    };
    let (n, k, m) = (input.rows(), first.cols(), first.rows());
    if n == 0 || m == 0 {
        return Ok(());
    }
    let (width_in, width_out) = (input.cols(), output.cols());
    let x = dev.input(input)?;
    let mut out = dev.output(output)?;
    let mut x_head = dev.zeros::<u8>(4 * n * k)?;
    let mut y_head = dev.zeros::<u8>(4 * n * m)?;
    for (h, w) in weights.iter().enumerate() {
        copy_cols(
            dev,
            (x.slice(), width_in, h * k),
            (&mut x_head, k, 0),
            (n, k),
        )?;
        product(dev, &x_head, w, None, &mut y_head, n)?;
        copy_cols(
            dev,
            (&y_head, m, 0),
            (out.slice(), width_out, h * m),
            (n, m),
        )?;
    }
    out.finish(dev)
}

/// `dst[r, dst_col0 + c] = src[r, src_col0 + c]` for `r < n`, `c < cols`, each matrix given
/// as (buffer, row length, first column) of f32 values.
fn copy_cols(
    dev: &CudaDevice,
    (src, src_ld, src_col0): (&CudaSlice<u8>, usize, usize),
    (dst, dst_ld, dst_col0): (&mut CudaSlice<u8>, usize, usize),
    (n, cols): (usize, usize),
) -> Result<()> {
    let total = n * cols;
    let (src_ld, src_col0, dst_ld, dst_col0, cols) = (
        int(src_ld)?,
        int(src_col0)?,
        int(dst_ld)?,
        int(dst_col0)?,
        int(cols)?,
    );
    let total_i = total as i64;
    let f = dev.function(Kernel::CopyCols)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(src)
        .arg(&src_ld)
        .arg(&src_col0)
        .arg(dst)
        .arg(&dst_ld)
        .arg(&dst_col0)
        .arg(&cols)
        .arg(&total_i);
    // SAFETY: src holds n rows of src_ld floats and dst n rows of dst_ld floats, with
    // col0 + cols within each row (the callers' shapes, checked by the contract), as
    // `copy_cols(const float*, int, int, float*, int, int, int, long)` reads and writes them.
    unsafe { b.launch(grid((total.div_ceil(256), 1, 1), 256, 0)?) }.map_err(dev_err)?;
    Ok(())
}
