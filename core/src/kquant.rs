//! ggml's K-quant weight types Q4_K, Q5_K and Q6_K kept as flm dtypes ([`DataType::Q4K`],
//! [`DataType::Q5K`], [`DataType::Q6K`]): a row of `cols` values is
//! `ceil(cols / 256)` of ggml's super-blocks (`block_q4_K`, `block_q5_K`, `block_q6_K` of
//! llama.cpp's `ggml-common.h`, byte for byte, layouts in [`crate::ggml`]), the last one
//! padded with zeros. A GGUF tensor of these types is therefore used in place.
//!
//! Kernels read a super-block as 8 runs of 32 values, each dotted against one int8
//! activation block of [`crate::quant::BLOCK`] values (scale `a`, codes `q_x`, sum
//! `Σ q_x`):
//! - Q4_K/Q5_K, run `j`: `ŵ = (d·sc_j)·q − dmin·m_j` with codes `q ∈ [0, 15]` / `[0, 31]`,
//!   so `Σ ŵ·x ≈ (d·sc_j)·a·Σ q·q_x − (dmin·m_j)·a·Σ q_x`;
//! - Q6_K, run `r`: `ŵ = (d·sc)·(q − 32)` with `q ∈ [0, 63]` and one i8 scale per 16
//!   values (`sc_{2r}`, `sc_{2r+1}`), so `Σ ŵ·x ≈ d·a·(sc_{2r}·Σ_{lo} (q−32)·q_x +
//!   sc_{2r+1}·Σ_{hi} (q−32)·q_x)`, the bracket an exact integer.
//!
//! This is ggml's `ggml_vec_dot_q4_K_q8_K` (and q5_K, q6_K) with one difference: ggml
//! quantises the activations with one scale per 256 values (`block_q8_K`), flm with one
//! per 32 (the blocks every other flm kernel reads), which is finer, so its rounding error
//! is no larger.
//!
//! [`crate::blocks::quantize`] makes these blocks from f32 values with the min/max fit (per 32 values
//! for Q4_K/Q5_K, per 16 for Q6_K, the sub-block scales then quantised against the
//! super-block's f16 scale), not llama.cpp's weighted search (`make_qkx2_quants`): it
//! serves `Data::to_dtype` and the tests; real K-quant weights come from GGUF files. With
//! an importance matrix, [`crate::blocks::quantize_weighted`] runs llama.cpp's imatrix
//! searches instead (`quantize_row_q4_K_impl`, `quantize_row_q5_K_impl`,
//! `quantize_row_q6_K_impl`), for `Data::to_dtype_weighted`.

use crate::blocks::{block, BlockQ4K, BlockQ5K, BlockQ6K};
use crate::ggml::{GgmlType, QK_K};
use crate::DataType;

/// Values per run: the sub-block of a super-block one activation block covers.
pub const RUN: usize = 32;

/// Runs per super-block.
pub const RUNS: usize = QK_K / RUN;

/// The ggml type of a K-quant `dtype`.
///
/// # Panics
/// If `dtype` is not a K-quant type.
fn ggml_type(dtype: DataType) -> GgmlType {
    dtype
        .ggml_type()
        .unwrap_or_else(|| panic!("{dtype} is not a K-quant type"))
}

/// Bytes of one super-block of the K-quant `dtype`.
pub fn block_bytes(dtype: DataType) -> usize {
    ggml_type(dtype).block_bytes()
}

/// The scales of run `r` (0..8) of a super-block `block` of `dtype`: for Q4_K/Q5_K
/// `(d·sc_r, dmin·m_r)`; for Q6_K `(d, 0)` (its per-16 scales are [`q6_scales`]).
#[inline(always)]
pub fn run_scales(dtype: DataType, bytes: &[u8], r: usize) -> (f32, f32) {
    if dtype == DataType::Q6K {
        return (block::<BlockQ6K>(bytes).d.to_f32(), 0.0);
    }
    // Q4_K and Q5_K start with the same head.
    block::<BlockQ4K>(bytes).head.run(r)
}

/// The two i8 scales of run `r` of a Q6_K super-block: of its first and last 16 values.
#[inline(always)]
pub fn q6_scales(bytes: &[u8], r: usize) -> (i32, i32) {
    let scales = &block::<BlockQ6K>(bytes).scales;
    (i32::from(scales[2 * r]), i32::from(scales[2 * r + 1]))
}

/// The 32 unsigned codes of run `r` of a super-block of `dtype` (`[0, 15]` Q4_K,
/// `[0, 31]` Q5_K, `[0, 63]` Q6_K, the Q6_K offset 32 not subtracted).
#[inline(always)]
pub fn run_codes(dtype: DataType, bytes: &[u8], r: usize, out: &mut [u8; RUN]) {
    match dtype {
        DataType::Q6K => block::<BlockQ6K>(bytes).run_codes(r, out),
        DataType::Q5K => {
            let b = block::<BlockQ5K>(bytes);
            for (l, o) in out.iter_mut().enumerate() {
                *o = b.code(r, l);
            }
        }
        _ => {
            let b = block::<BlockQ4K>(bytes);
            for (l, o) in out.iter_mut().enumerate() {
                *o = b.code(r, l);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks;
    use crate::quant::tests::values;

    fn quantize_row(dtype: DataType, src: &[f32], dst: &mut [u8]) {
        blocks::quantize(ggml_type(dtype), src, dst)
    }

    fn dequantize_row(dtype: DataType, src: &[u8], dst: &mut [f32]) {
        blocks::dequantize(ggml_type(dtype), src, dst)
    }

    /// Round trips stay within the fit's bound: half a step of each run plus the
    /// quantisation of the run's scale against `d` (and minimum against `dmin`), at most
    /// half a step of those, each step a 63rd (127th) of the largest.
    #[test]
    fn round_trips_stay_near_the_values() {
        for (dtype, bound) in [
            (DataType::Q4K, 2.0 / 15.0),
            (DataType::Q5K, 2.0 / 31.0),
            (DataType::Q6K, 2.0 / 32.0),
        ] {
            for cols in [1, 100, 256, 300, 512] {
                let w = values(cols, 5);
                let mut bytes = vec![0u8; cols.div_ceil(QK_K) * block_bytes(dtype)];
                quantize_row(dtype, &w, &mut bytes);
                let mut back = vec![0.0; cols];
                dequantize_row(dtype, &bytes, &mut back);
                for (a, b) in w.iter().zip(&back) {
                    assert!((a - b).abs() <= bound, "{dtype} cols {cols}: {a} vs {b}");
                }
            }
        }
    }

    /// `run_codes` and `run_scales` give back what `blocks::dequantize` decodes.
    #[test]
    fn runs_decode_as_ggml_does() {
        for dtype in [DataType::Q4K, DataType::Q5K, DataType::Q6K] {
            let w = values(QK_K, 9);
            let mut block = vec![0u8; block_bytes(dtype)];
            quantize_row(dtype, &w, &mut block);
            let mut want = [0.0f32; QK_K];
            blocks::dequantize(ggml_type(dtype), &block, &mut want);
            let mut codes = [0u8; RUN];
            for r in 0..RUNS {
                run_codes(dtype, &block, r, &mut codes);
                let (dl, ml) = run_scales(dtype, &block, r);
                for (l, &q) in codes.iter().enumerate() {
                    let got = if dtype == DataType::Q6K {
                        let (sa, sb) = q6_scales(&block, r);
                        let sc = if l < 16 { sa } else { sb };
                        dl * sc as f32 * (q as f32 - 32.0)
                    } else {
                        dl * q as f32 - ml
                    };
                    assert_eq!(got, want[r * RUN + l], "{dtype} run {r} value {l}");
                }
            }
        }
    }
}
