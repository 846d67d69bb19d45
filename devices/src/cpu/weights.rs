//! Row access to weights of any dtype, the f32 dot product and f16/bf16 widening.

use flm_core::{quant, Data, DataType, Error, Layout, Result};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::simd::{self, Elem, Kernel, Simd};
use super::Isa;

/// A weight matrix `[rows, cols]` of any dtype, read row by row as f32.
pub(crate) enum WeightRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    /// Quantised rows of `row_bytes` bytes each, or panels of matrices of `m` rows
    /// ([`flm_core::panels`]).
    Quant {
        dtype: DataType,
        bytes: &'a [u8],
        row_bytes: usize,
        panels: Option<usize>,
    },
}

impl<'a> WeightRows<'a> {
    pub(crate) fn new(data: &'a Data) -> Result<WeightRows<'a>> {
        Ok(match data.dtype() {
            DataType::F32 => WeightRows::F32(data.as_f32()?),
            DataType::F16 => WeightRows::F16(data.as_f16()?),
            DataType::BF16 => WeightRows::BF16(data.as_bf16()?),
            dtype => WeightRows::Quant {
                dtype,
                bytes: data.bytes()?,
                row_bytes: quant::row_bytes(dtype, data.cols()).ok_or_else(|| Error::Shape {
                    op: "weights",
                    msg: format!("{dtype} shape {:?} overflows", data.shape()),
                })?,
                panels: (data.layout() == Layout::Panels)
                    .then(|| data.shape()[data.shape().len() - 2]),
            },
        })
    }

    /// Row `r` (of length `cols`) as f32: borrowed for f32 weights, widened into `buf`
    /// (exactly: f16 and bf16 are subsets of f32) otherwise.
    ///
    /// Errors: those of [`WeightRows::dequantize`].
    pub(crate) fn row<'b>(
        &'b self,
        r: usize,
        cols: usize,
        buf: &'b mut Vec<f32>,
    ) -> Result<&'b [f32]> {
        let range = r * cols..(r + 1) * cols;
        Ok(match self {
            WeightRows::F32(w) => &w[range],
            WeightRows::F16(w) => {
                buf.resize(cols, 0.0);
                w[range].convert_to_f32_slice(buf);
                buf
            }
            WeightRows::BF16(w) => {
                buf.resize(cols, 0.0);
                w[range].convert_to_f32_slice(buf);
                buf
            }
            WeightRows::Quant { .. } => {
                buf.resize(cols, 0.0);
                self.dequantize(r, cols, buf)?;
                buf
            }
        })
    }

    /// Dequantises row `r` (of `cols` values) of quantised weights into `out`; nothing for
    /// float weights.
    ///
    /// Errors: [`Error::OutOfBounds`] for a row past the last of weights in panels.
    pub(crate) fn dequantize(&self, r: usize, cols: usize, out: &mut [f32]) -> Result<()> {
        let WeightRows::Quant {
            dtype,
            bytes,
            row_bytes,
            panels,
        } = *self
        else {
            return Ok(());
        };
        match panels {
            Some(m) => flm_core::panels::dequantize_row(dtype, bytes, m, cols, r, out)?,
            None => quant::dequantize_row(dtype, &bytes[r * row_bytes..][..row_bytes], out),
        }
        Ok(())
    }
}

/// `dst[i] = src[i]` as f32 for `i < dst.len()` (`src.len() >= dst.len()`): exact, since
/// f16 and bf16 are subsets of f32. F16C / AVX-512 `vcvtph2ps` for f16, a shift by 16 for
/// bf16.
pub(crate) fn widen<E: Elem>(isa: Isa, src: &[E], dst: &mut [f32]) {
    struct Widen<'a, E> {
        src: &'a [E],
        dst: &'a mut [f32],
    }
    impl<E: Elem> Kernel for Widen<'_, E> {
        type Output = ();
        #[inline(always)]
        fn run<S: Simd>(self, s: S) {
            simd::widen(s, self.src, self.dst)
        }
    }
    let k = Widen { src, dst };
    simd::run(isa, k)
}
