//! Weight quantisation: the byte layouts of the int8 and int4 dtypes, and the int8
//! activation blocks they are dotted against (the pairing FastLLM and ggml use: integer
//! dot products between quantised weights and activations quantised on the fly).
//!
//! A quantised matrix `[rows, cols]` is stored row after row; each row is padded with
//! zeros to a multiple of [`BLOCK`] (int8) or of the group size (int4).
//!
//! **int8, per output channel** ([`DataType::I8`]). Row: an f32 scale `s`, then
//! `cols_padded` int8 values `q`. `s = max|w| / 127`, `q = round(w / s)` in `[-127, 127]`,
//! `ŵ = s · q`. Error bound: `|w − ŵ| ≤ s / 2 = max|w| / 254` per row.
//!
//! **int4, group-wise, asymmetric** ([`DataType::I4G32`], `I4G64`, `I4G128`). Row: one block
//! per group of `G` values: an f16 scale `d`, an f16 minimum `m`, then `G / 2` bytes of
//! 4-bit codes `q` in `[0, 15]`; `ŵ = d · q + m`, with `m = min(w)` and
//! `d = (max(w) − m) / 15` rounded to f16 before the codes are chosen. Within each run of 32
//! values of a block, byte `i` holds value `i` in its low nibble and value `i + 16` in its
//! high nibble (ggml's order, which SIMD kernels unpack with one mask and one shift). Error
//! bound: `|w − ŵ| ≤ d / 2 + ε`, where `ε ≤ 2⁻¹¹ (|m| + 15 d)` covers the f16 rounding of
//! `d` and `m`: about `(max − min) / 30` per group.
//!
//! **Activations** ([`ActBlock`]): blocks of 32 values, `a = max|x| / 127`,
//! `q = round(x / a)`, plus `Σq` for the int4 minimum term, so that
//! `Σ ŵ·x ≈ Σ_blocks a · (d · Σ q_w q_x + m · Σ q_x)` (int4) or `s · Σ_blocks a · Σ q_w q_x`
//! (int8), with every inner sum an exact integer.

use half::f16;

use crate::DataType;

/// Values per activation block, and the unit rows are padded to.
pub const BLOCK: usize = 32;

/// One block of 32 activations quantised to int8.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActBlock {
    /// Scale: `x ≈ d · q`.
    pub d: f32,
    /// `Σ q`, for the zero-point term of asymmetric weights.
    pub sum: i32,
    /// The codes.
    pub qs: [i8; BLOCK],
}

/// `cols` rounded up to the padding unit of `dtype`.
pub fn padded_cols(dtype: DataType, cols: usize) -> usize {
    let unit = dtype.group_size().unwrap_or(BLOCK);
    cols.div_ceil(unit) * unit
}

/// Bytes of one row of `cols` values of a quantised `dtype`; `None` for float types or on
/// overflow.
pub fn row_bytes(dtype: DataType, cols: usize) -> Option<usize> {
    let padded = padded_cols(dtype, cols);
    match dtype {
        DataType::I8 => padded.checked_add(4),
        _ => {
            let g = dtype.group_size()?;
            (padded / g).checked_mul(4 + g / 2)
        }
    }
}

fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Quantises one row of `src` (its `cols` values) into `dst` (`row_bytes(dtype, cols)`
/// bytes). Float dtypes are not handled here.
pub fn quantize_row(dtype: DataType, src: &[f32], dst: &mut [u8]) {
    match dtype.group_size() {
        None => {
            let scale = absmax(src) / 127.0;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            dst[..4].copy_from_slice(&scale.to_le_bytes());
            let (q, pad) = dst[4..].split_at_mut(src.len());
            for (q, &w) in q.iter_mut().zip(src) {
                *q = (w * inv).round().clamp(-127.0, 127.0) as i8 as u8;
            }
            pad.fill(0);
        }
        Some(g) => {
            for (block, values) in dst.chunks_exact_mut(4 + g / 2).zip(chunks_padded(src, g)) {
                let real = values.len();
                let min = values.iter().copied().fold(f32::INFINITY, f32::min);
                let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = f16::from_f32((max - min) / 15.0);
                let m = f16::from_f32(min);
                let inv = if d.to_f32() > 0.0 {
                    1.0 / d.to_f32()
                } else {
                    0.0
                };
                block[..2].copy_from_slice(&d.to_le_bytes());
                block[2..4].copy_from_slice(&m.to_le_bytes());
                let codes = &mut block[4..];
                codes.fill(0);
                for (i, &w) in values.iter().enumerate().take(real) {
                    let q = ((w - m.to_f32()) * inv).round().clamp(0.0, 15.0) as u8;
                    let (byte, shift) = nibble(i);
                    codes[byte] |= q << shift;
                }
            }
        }
    }
}

/// Splits `src` into chunks of `g` (the last may be shorter); one chunk for an empty row.
fn chunks_padded(src: &[f32], g: usize) -> impl Iterator<Item = &[f32]> {
    let n = src.len().div_ceil(g).max(1);
    (0..n).map(move |i| &src[(i * g).min(src.len())..((i + 1) * g).min(src.len())])
}

/// Byte and bit shift of value `i` of an int4 block.
#[inline]
pub fn nibble(i: usize) -> (usize, u32) {
    let (run, j) = (i / BLOCK, i % BLOCK);
    (run * BLOCK / 2 + j % 16, if j < 16 { 0 } else { 4 })
}

/// Dequantises one row (`row_bytes(dtype, dst.len())` bytes of `src`) into `dst`.
pub fn dequantize_row(dtype: DataType, src: &[u8], dst: &mut [f32]) {
    match dtype.group_size() {
        None => {
            let scale = f32::from_le_bytes([src[0], src[1], src[2], src[3]]);
            for (d, &q) in dst.iter_mut().zip(&src[4..]) {
                *d = scale * q as i8 as f32;
            }
        }
        Some(g) => {
            for (block, out) in src.chunks_exact(4 + g / 2).zip(dst.chunks_mut(g)) {
                let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                let m = f16::from_le_bytes([block[2], block[3]]).to_f32();
                for (i, o) in out.iter_mut().enumerate() {
                    let (byte, shift) = nibble(i);
                    *o = d * ((block[4 + byte] >> shift) & 0x0f) as f32 + m;
                }
            }
        }
    }
}

/// Quantises activations `x` into blocks of 32 (the last padded with zeros), replacing the
/// contents of `out`.
pub fn quantize_activations(x: &[f32], out: &mut Vec<ActBlock>) {
    out.clear();
    out.extend(x.chunks(BLOCK).map(|chunk| {
        let d = absmax(chunk) / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; BLOCK];
        for (q, &v) in qs.iter_mut().zip(chunk) {
            *q = (v * inv).round() as i8;
        }
        let sum = qs.iter().map(|&q| q as i32).sum();
        ActBlock { d, sum, qs }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    #[test]
    fn round_trips_stay_within_the_documented_bounds() {
        for cols in [1, 31, 32, 33, 100, 172, 256] {
            let w = values(cols, 7);
            let (lo, hi) = w
                .iter()
                .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
            let amax = lo.abs().max(hi.abs());
            for dtype in [
                DataType::I8,
                DataType::I4G32,
                DataType::I4G64,
                DataType::I4G128,
            ] {
                let mut bytes = vec![0u8; row_bytes(dtype, cols).unwrap()];
                quantize_row(dtype, &w, &mut bytes);
                let mut back = vec![0.0; cols];
                dequantize_row(dtype, &bytes, &mut back);
                let bound = match dtype {
                    // s/2 plus one rounding of the f32 product.
                    DataType::I8 => amax / 254.0 * 1.0001,
                    // d/2 plus the f16 rounding of d and m (loose: the whole row's range).
                    _ => (hi - lo) / 30.0 + (amax + (hi - lo)) * 2f32.powi(-10),
                };
                for (a, b) in w.iter().zip(&back) {
                    assert!((a - b).abs() <= bound, "{dtype} cols {cols}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn nibble_order_is_ggml_like() {
        assert_eq!(nibble(0), (0, 0));
        assert_eq!(nibble(15), (15, 0));
        assert_eq!(nibble(16), (0, 4));
        assert_eq!(nibble(33), (17, 0));
        assert_eq!(nibble(63), (31, 4));
    }

    #[test]
    fn activations_quantise_per_block_with_sums() {
        let x = values(40, 3);
        let mut blocks = Vec::new();
        quantize_activations(&x, &mut blocks);
        assert_eq!(blocks.len(), 2);
        for (b, chunk) in blocks.iter().zip(x.chunks(32)) {
            assert_eq!(b.sum, b.qs.iter().map(|&q| q as i32).sum::<i32>());
            for (q, v) in b.qs.iter().zip(chunk) {
                assert!((*q as f32 * b.d - v).abs() <= b.d / 2.0 * 1.0001);
            }
        }
        assert!(blocks[1].qs[8..].iter().all(|&q| q == 0));
    }
}
