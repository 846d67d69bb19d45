//! The prefill product of quantised weights ([`flm_core::Op::Linear`] with more than
//! [`super::kernels::GEMV_MAX_ROWS`] input rows): the weight is dequantised into f16, a
//! chunk of output rows at a time, into a scratch buffer the device owns, and each chunk
//! is one cuBLAS f16 × f16 → f32 GEMM on tensor cores against the activations rounded to
//! f16 (as the f16 weights' prefill rounds them). Every quantised byte is read once per op,
//! not once per input row as the decode kernels of `kernels/qgemv.cu` read them.
//!
//! The kernel `dequant_f16_rows` (`kernels/dequant.cu`) reads the weight in the .flm row
//! layout of [`flm_core::quant`] (ggml's for the K-quants), `quant::row_bytes` bytes per
//! row, as [`super::CudaDevice::weight`] hands it over; or, for an int8/int4 weight the
//! decode kernels read repacked ([`crate::gemv_layout`]), in that layout, so that the
//! weight is uploaded once.
//! A dequantised value beyond f16's range (±65504) would become infinite; weights are far
//! inside it.

use cudarc::driver::{CudaSlice, PushKernelArg};
use flm_core::{quant, DataType, Error, Result};

use super::device::{dev_err, grid, int, CudaDevice};
use super::kernels::{int4_form_code, k_quant_code, Kernel};
use super::linear::{convert, gemm};
use crate::gemv_layout::GemvLayout;

/// The most f16 values the dequantisation scratch holds (16 MiB): a chunk is as many
/// whole output rows as fit, so the scratch stays small beside the weights while each GEMM
/// is still large enough to fill the tensor cores (2048 rows of Llama-2-7B's 4096 inputs).
const SCRATCH_VALUES: usize = 8 << 20;

/// Output rows per dequantised chunk of a weight of `m` rows of `k` values: as many as
/// [`SCRATCH_VALUES`] holds, a multiple of 64 when that is at least 64 (so every chunk's
/// output columns start 256-byte aligned), at least one, at most `m`.
fn chunk_rows(m: usize, k: usize) -> usize {
    let fit = (SCRATCH_VALUES / k.max(1)).max(1);
    let fit = if fit >= 64 { fit / 64 * 64 } else { fit };
    fit.min(m).max(1)
}

/// `y[n, m] = x[n, k] · ŵ[m, k]ᵀ`, `ŵ` the quantised weight `w` of `dtype` dequantised to
/// f16 chunk by chunk (see the module docs), in the .flm layout or the GPU GEMV one
/// `packed`; `x` and `y` f32, `x` rounded to f16 first.
///
/// Errors: [`Error::DType`] for a dtype without a dequantisation kernel (Q8_0);
/// [`Error::Device`] when a launch or cuBLAS fails.
pub(super) fn quantized_gemm(
    dev: &CudaDevice,
    x: &CudaSlice<u8>,
    w: &CudaSlice<u8>,
    (dtype, packed): (DataType, Option<&GemvLayout>),
    y: &mut CudaSlice<u8>,
    (n, k, m): (usize, usize, usize),
) -> Result<()> {
    let kind = if let Some(layout) = packed {
        if layout.dtype == DataType::I8 {
            3
        } else {
            4
        }
    } else if dtype.is_k_quant() {
        2
    } else if dtype == DataType::I8 {
        0
    } else if dtype.group_size().is_some() {
        1
    } else {
        return Err(Error::DType {
            op: "Linear",
            msg: format!("{dtype} weights have no f16 dequantisation on cuda"),
        });
    };
    let (row_bytes, params) = match packed {
        Some(l) if kind == 3 => (l.ld as i64, l.params_offset as i64),
        Some(l) => ((l.ld / 2) as i64, l.params_offset as i64),
        None => (
            quant::row_bytes(dtype, k)
                .ok_or_else(|| Error::InvalidArgument(format!("{dtype} rows of {k} values")))?
                as i64,
            0,
        ),
    };
    let (k_i, padded) = (int(k)?, int(quant::padded_cols(dtype, k))?);
    let group = int(dtype.group_size().unwrap_or(0))?;
    let (form, kq) = (int4_form_code(dtype), k_quant_code(dtype));
    let xh = convert(dev, x, n * k, Kernel::F32ToF16Rows)?;
    let rows = chunk_rows(m, k);
    let mut scratch = dev.f16_scratch(rows * k)?;
    let f = dev.function(Kernel::DequantF16Rows)?;
    for row0 in (0..m).step_by(rows) {
        let chunk = rows.min(m - row0);
        let (row0_i, chunk_i) = (int(row0)?, int(chunk)?);
        let mut b = dev.stream.launch_builder(f);
        b.arg(w)
            .arg(&mut *scratch)
            .arg(&k_i)
            .arg(&row_bytes)
            .arg(&row0_i)
            .arg(&chunk_i)
            .arg(&kind)
            .arg(&padded)
            .arg(&group)
            .arg(&form)
            .arg(&kq)
            .arg(&params);
        // SAFETY: w holds m rows of row_bytes bytes in the .flm layout of `dtype`, or the
        // GPU GEMV layout whose m rows of codes of row_bytes bytes are followed at byte
        // `params` by their scales or group parameters (the kernel reads rows
        // row0..row0 + chunk, below m), the scratch at least chunk × k
        // f16 values, as `dequant_f16_rows` uses them; the grid-stride loop covers any
        // chunk with at most 4096 blocks.
        unsafe { b.launch(grid(((chunk * k).div_ceil(256).min(4096), 1, 1), 256, 0)?) }
            .map_err(dev_err)?;
        gemm(
            dev,
            &xh,
            &*scratch,
            cudarc::cublas::sys::cudaDataType::CUDA_R_16F,
            y,
            (n, k, chunk),
            (row0, m),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_rows_within_the_scratch() {
        for (m, k) in [
            (1, 1),
            (77, 333),
            (4001, 2112),
            (11008, 4096),
            (32000, 4096),
            (3, 1 << 24),
            (5, (8 << 20) + 1),
        ] {
            let rows = chunk_rows(m, k);
            assert!((1..=m).contains(&rows), "m {m} k {k}: {rows} rows");
            // The scratch holds a chunk, or one row where a row alone exceeds it.
            assert!(
                rows * k <= SCRATCH_VALUES.max(k),
                "m {m} k {k}: {rows} rows"
            );
            assert!(
                rows == m || rows < 64 || rows.is_multiple_of(64),
                "m {m} k {k}: {rows} rows"
            );
        }
        assert_eq!(chunk_rows(4001, 2112), 3968);
        assert_eq!(chunk_rows(11008, 4096), 2048);
    }
}
