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
//! [`quantize_row`] makes these blocks from f32 values with the min/max fit (per 32 values
//! for Q4_K/Q5_K, per 16 for Q6_K, the sub-block scales then quantised against the
//! super-block's f16 scale), not llama.cpp's weighted search (`make_qkx2_quants`): it
//! serves `Data::to_dtype` and the tests; real K-quant weights come from GGUF files.

use half::f16;

use crate::ggml::{self, GgmlType, QK_K};
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

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The scales of run `r` (0..8) of a super-block `block` of `dtype`: for Q4_K/Q5_K
/// `(d·sc_r, dmin·m_r)`; for Q6_K `(d, 0)` (its per-16 scales are [`q6_scales`]).
#[inline(always)]
pub fn run_scales(dtype: DataType, block: &[u8], r: usize) -> (f32, f32) {
    if dtype == DataType::Q6K {
        return (f16_at(block, 208), 0.0);
    }
    let (sc, m) = ggml::scale_min_k4(&block[4..16], r);
    (f16_at(block, 0) * sc as f32, f16_at(block, 2) * m as f32)
}

/// The two i8 scales of run `r` of a Q6_K super-block: of its first and last 16 values.
#[inline(always)]
pub fn q6_scales(block: &[u8], r: usize) -> (i32, i32) {
    (
        i32::from(block[192 + 2 * r] as i8),
        i32::from(block[193 + 2 * r] as i8),
    )
}

/// The 32 unsigned codes of run `r` of a super-block of `dtype` (`[0, 15]` Q4_K,
/// `[0, 31]` Q5_K, `[0, 63]` Q6_K, the Q6_K offset 32 not subtracted).
#[inline(always)]
pub fn run_codes(dtype: DataType, block: &[u8], r: usize, out: &mut [u8; RUN]) {
    match dtype {
        DataType::Q6K => {
            // Halves of 128 values; run t of a half: low nibbles (t < 2) or high ones of 32
            // bytes of `ql`, and bits 2t, 2t + 1 of 32 bytes of `qh`.
            let (half, t) = (r / 4, r % 4);
            let ql = &block[half * 64 + (t % 2) * 32..][..32];
            let qh = &block[128 + half * 32..][..32];
            for (l, o) in out.iter_mut().enumerate() {
                *o = ((ql[l] >> (4 * (t / 2))) & 0x0f) | (((qh[l] >> (2 * t)) & 3) << 4);
            }
        }
        _ => {
            let qs = match dtype {
                DataType::Q5K => &block[48..176],
                _ => &block[16..144],
            };
            let qs = &qs[(r / 2) * 32..][..32];
            for (l, o) in out.iter_mut().enumerate() {
                *o = (qs[l] >> (4 * (r % 2))) & 0x0f;
            }
            if dtype == DataType::Q5K {
                let qh = &block[16..48];
                for (l, o) in out.iter_mut().enumerate() {
                    *o |= ((qh[l] >> r) & 1) << 4;
                }
            }
        }
    }
}

/// Dequantises one row of `dtype` (`src`, whole super-blocks) into `dst` (`cols` values):
/// ggml's decoding, bit for bit as gguf-py's ([`ggml::dequantize`]).
pub fn dequantize_row(dtype: DataType, src: &[u8], dst: &mut [f32]) {
    let ty = ggml_type(dtype);
    let whole = dst.len() / QK_K * QK_K;
    let (head, tail) = dst.split_at_mut(whole);
    ggml::dequantize(ty, &src[..whole / QK_K * ty.block_bytes()], head);
    if !tail.is_empty() {
        let mut last = [0.0f32; QK_K];
        ggml::dequantize(ty, &src[whole / QK_K * ty.block_bytes()..], &mut last);
        tail.copy_from_slice(&last[..tail.len()]);
    }
}

/// Quantises one row (`src`, `cols` values, zero-padded to whole super-blocks) into `dst`
/// (whole super-blocks of `dtype`) with the min/max fit of the module docs.
pub fn quantize_row(dtype: DataType, src: &[f32], dst: &mut [u8]) {
    let bb = block_bytes(dtype);
    for (s, block) in dst.chunks_exact_mut(bb).enumerate() {
        let mut x = [0.0f32; QK_K];
        let from = (s * QK_K).min(src.len());
        let values = &src[from..((s + 1) * QK_K).min(src.len())];
        x[..values.len()].copy_from_slice(values);
        block.fill(0);
        match dtype {
            DataType::Q6K => quantize_q6_k(&x, block),
            _ => quantize_q45_k(dtype == DataType::Q5K, &x, block),
        }
    }
}

/// `x / d` rounded to nearest and clamped to `[lo, hi]`, 0 where `d` is 0.
fn level(x: f32, d: f32, lo: f32, hi: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        (x / d).round().clamp(lo, hi)
    }
}

fn quantize_q45_k(five: bool, x: &[f32; QK_K], block: &mut [u8]) {
    let top = if five { 31.0 } else { 15.0 };
    let mut scale = [0.0f32; RUNS];
    let mut neg_min = [0.0f32; RUNS];
    for (j, run) in x.chunks_exact(RUN).enumerate() {
        let lo = run.iter().copied().fold(0.0f32, f32::min);
        let hi = run.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        scale[j] = (hi - lo) / top;
        neg_min[j] = -lo;
    }
    let d = f16::from_f32(scale.iter().copied().fold(0.0, f32::max) / 63.0);
    let dmin = f16::from_f32(neg_min.iter().copied().fold(0.0, f32::max) / 63.0);
    block[0..2].copy_from_slice(&d.to_le_bytes());
    block[2..4].copy_from_slice(&dmin.to_le_bytes());
    let (d, dmin) = (d.to_f32(), dmin.to_f32());
    let mut sc = [0u8; RUNS];
    let mut m = [0u8; RUNS];
    for j in 0..RUNS {
        sc[j] = level(scale[j], d, 0.0, 63.0) as u8;
        m[j] = level(neg_min[j], dmin, 0.0, 63.0) as u8;
    }
    // The packing `scale_min_k4` reads: 6 bits of runs 0..4 in bytes 0..8, runs 4..8
    // split into low nibbles (bytes 8..12) and top 2 bits (bits 6, 7 of bytes 0..8).
    let scales = &mut block[4..16];
    for j in 0..4 {
        scales[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        scales[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        scales[j + 8] = (sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4);
    }
    let qs_at = if five { 48 } else { 16 };
    for (j, run) in x.chunks_exact(RUN).enumerate() {
        let (dl, ml) = (d * sc[j] as f32, dmin * m[j] as f32);
        for (l, &v) in run.iter().enumerate() {
            let q = level(v + ml, dl, 0.0, top) as u8;
            block[qs_at + (j / 2) * 32 + l] |= (q & 0x0f) << (4 * (j % 2));
            if five {
                block[16 + l] |= (q >> 4) << j;
            }
        }
    }
}

fn quantize_q6_k(x: &[f32; QK_K], block: &mut [u8]) {
    let mut scale = [0.0f32; 16];
    for (i, sub) in x.chunks_exact(16).enumerate() {
        let extreme = sub
            .iter()
            .copied()
            .fold(0.0f32, |e, v| if v.abs() > e.abs() { v } else { e });
        scale[i] = extreme / -32.0;
    }
    let d = f16::from_f32(scale.iter().fold(0.0f32, |a, s| a.max(s.abs())) / 127.0);
    block[208..210].copy_from_slice(&d.to_le_bytes());
    let d = d.to_f32();
    for (i, sub) in x.chunks_exact(16).enumerate() {
        let sc = level(scale[i], d, -128.0, 127.0) as i8;
        block[192 + i] = sc as u8;
        let dl = d * sc as f32;
        for (l16, &v) in sub.iter().enumerate() {
            let q = (level(v, dl, -32.0, 31.0) + 32.0) as u8;
            let e = i * 16 + l16;
            let (half, t, l) = (e / 128, (e % 128) / 32, e % 32);
            block[half * 64 + (t % 2) * 32 + l] |= (q & 0x0f) << (4 * (t / 2));
            block[128 + half * 32 + l] |= (q >> 4) << (2 * t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::values;

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

    /// `run_codes` and `run_scales` give back what `ggml::dequantize` decodes.
    #[test]
    fn runs_decode_as_ggml_does() {
        for dtype in [DataType::Q4K, DataType::Q5K, DataType::Q6K] {
            let w = values(QK_K, 9);
            let mut block = vec![0u8; block_bytes(dtype)];
            quantize_row(dtype, &w, &mut block);
            let mut want = [0.0f32; QK_K];
            ggml::dequantize(ggml_type(dtype), &block, &mut want);
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
