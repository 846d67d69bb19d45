//! The prefill product of quantised weights ([`flm_core::Op::Linear`] with more than
//! [`super::kernels::GEMV_MAX_ROWS`] input rows): the weight is dequantised into f16, a
//! chunk of output rows at a time, into a scratch buffer the device owns, and each chunk
//! is one cuBLAS f16 × f16 → f32 GEMM on tensor cores against the activations rounded to
//! f16 (as the f16 weights' prefill rounds them). Every quantised byte is read once per op,
//! not once per input row as the decode kernel of ggml's blocks (`kernels/qgemv.cu`) reads
//! them.
//!
//! The kernel `dequant_f16_rows` (`kernels/dequant.cu`) reads an int8/int4 weight in the
//! GPU GEMV layout ([`crate::gemv_layout`]) that such weights have in GPU memory and that
//! the decode kernels read, so that the weight is uploaded once; a weight of ggml's blocks
//! (K-quants, Q5_0, Q8_0, IQ4_NL, IQ4_XS, MXFP4) in its rows of `quant::row_bytes` bytes, as
//! [`super::CudaDevice::weight`] hands it over.
//! A dequantised value beyond f16's range (±65504) would become infinite; weights are far
//! inside it.

use cudarc::driver::{CudaSlice, LaunchArgs, PushKernelArg};
use flm_core::{quant, DataType, Error, Result};

use super::device::CudaDevice;
use super::kernels::{int4_form_code, GgmlBlocks, Kernel};
use super::launch::{dev_err, grid, int};
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

/// Where the kernels that read a quantised weight value by value (`dequant_value` in
/// `prelude.cuh`: `dequant_f16_rows`, `embedding_quant`) find its values: the arguments
/// `row_bytes, ld, group, form, gq, params` they take in that order.
pub(super) struct QuantRows {
    /// Bytes of a row of ggml blocks (unused for int8/int4).
    row_bytes: i64,
    /// Codes per int8/int4 row of the GPU layout ([`GemvLayout::ld`]).
    ld: i32,
    /// The int4 group size; 0 for int8 and ggml blocks.
    group: i32,
    /// The int4 form ([`int4_form_code`]).
    form: i32,
    /// The ggml block type ([`GgmlBlocks::code`]); 0 for int8/int4.
    gq: i32,
    /// Byte offset of the int8 scales or int4 group parameters ([`GemvLayout::params_offset`]).
    params: i64,
}

impl QuantRows {
    /// The arguments for a weight of `dtype` with rows of `cols` values: an int8/int4 one in
    /// its GPU GEMV `layout`, one of ggml's blocks (`layout` `None`) in its rows as they are.
    ///
    /// Errors: [`Error::DType`] for another dtype, or an int8/int4 one without its layout;
    /// [`Error::InvalidArgument`] for sizes beyond the kernels' integers.
    pub(super) fn new(dtype: DataType, cols: usize, layout: Option<&GemvLayout>) -> Result<Self> {
        let bytes =
            |v: usize| i64::try_from(v).map_err(|_| Error::InvalidArgument(format!("{v} bytes")));
        match layout {
            Some(l) => Ok(QuantRows {
                row_bytes: 0,
                ld: int(l.ld)?,
                group: int(dtype.group_size().unwrap_or(0))?,
                form: int4_form_code(dtype),
                gq: 0,
                params: bytes(l.params_offset)?,
            }),
            None => {
                let blocks = GgmlBlocks::of(dtype).ok_or_else(|| Error::DType {
                    op: "Linear",
                    msg: format!("{dtype} weights have no f16 dequantisation on cuda"),
                })?;
                let row_bytes = quant::row_bytes(dtype, cols).ok_or_else(|| {
                    Error::InvalidArgument(format!("{dtype} rows of {cols} values"))
                })?;
                Ok(QuantRows {
                    row_bytes: bytes(row_bytes)?,
                    ld: int(quant::padded_cols(dtype, cols))?,
                    group: 0,
                    form: 0,
                    gq: blocks.code(),
                    params: 0,
                })
            }
        }
    }

    /// Pushes `row_bytes, ld, group, form, gq, params`.
    pub(super) fn push<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        b.arg(&self.row_bytes)
            .arg(&self.ld)
            .arg(&self.group)
            .arg(&self.form)
            .arg(&self.gq)
            .arg(&self.params);
    }
}

/// `y[n, m] = x[n, k] · ŵ[m, k]ᵀ`, `ŵ` the quantised weight `w` of `dtype` dequantised to
/// f16 chunk by chunk (see the module docs): int8/int4 in their GPU GEMV `layout`, ggml's
/// blocks (`layout` `None`) in their rows; `x` and `y` f32, `x` rounded to f16 first.
///
/// Errors: [`Error::DType`] for a dtype without a dequantisation kernel;
/// [`Error::Device`] when a launch or cuBLAS fails.
pub(super) fn quantized_gemm(
    dev: &CudaDevice,
    x: &CudaSlice<u8>,
    w: &CudaSlice<u8>,
    (dtype, layout): (DataType, Option<&GemvLayout>),
    y: &mut CudaSlice<u8>,
    (n, k, m): (usize, usize, usize),
) -> Result<()> {
    let rows_args = QuantRows::new(dtype, k, layout)?;
    let k_i = int(k)?;
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
            .arg(&row0_i)
            .arg(&chunk_i);
        rows_args.push(&mut b);
        // SAFETY: w holds the m × k weight as `rows_args` describes it (int8/int4 in the GPU
        // GEMV layout of `layout`, ggml blocks in m rows of row_bytes bytes; the kernel reads
        // rows row0..row0 + chunk, below m), the scratch at least chunk × k f16 values, as
        // `dequant_f16_rows(const unsigned char*, f16_bits*, int, int, int, long, int, int,
        // int, int, long)` uses them; the grid-stride loop covers any chunk with at most
        // 4096 blocks.
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
