//! Linear layers with ggml's Q8_0 weights ([`flm_core::DataType::Q8_0`], blocks as GGUF files store
//! them, [`flm_core::quant`]): each block of 32 int8 weight codes dotted against the int8
//! activation block of the same 32 columns in exact integers, then scaled by `d · a`
//! (ggml's `ggml_vec_dot_q8_0_q8_0`).
//!
//! One weight row at a time, each block loaded once for up to [`TILE_INPUTS`] input rows:
//! the portable loops here (the twin every other level is tested against); AVX2 at every
//! x86 level (`vpsignb` makes the weight codes unsigned for `vpmaddubsw`, as ggml does; a
//! pair of products is at most `2 · 128 · 127 < 2¹⁵`); NEON with `sdot`, or `smull` and
//! `sadalp`. Each output is a sum over its row's blocks in order, whatever the other input
//! rows or the thread split (batch invariance).

use flm_core::quant::{BLOCK, Q8_0_BLOCK_BYTES};
use half::f16;

use super::{Acts, QuantWeight};
use crate::cpu::Isa;

/// Input rows that share one load of a weight block.
const TILE_INPUTS: usize = 4;

/// See [`super::rows`], for a Q8_0 `w` and [`Acts`] in natural order.
pub(super) fn rows(isa: Isa, w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
    match isa {
        // SAFETY: `CpuDevice::with_isa` only accepts levels this CPU supports, and every
        // x86 level above the portable one has AVX2.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni | Isa::Avx512 | Isa::Amx => unsafe { avx2::rows(w, acts, j0, yt) },
        // SAFETY: as above: this CPU has FEAT_DotProd at this level.
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        Isa::NeonDot => unsafe { neon::rows_dot(w, acts, j0, yt) },
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        Isa::Neon => each_tile(w, acts, j0, yt, neon::dot32::<false>),
        _ => each_tile(w, acts, j0, yt, dot32),
    }
}

/// Calls `tile` for each weight row of `yt` and each tile of up to [`TILE_INPUTS`] input
/// rows, with `dot32(weight codes, activation codes)` the exact dot product of a block.
#[inline(always)]
fn each_tile(
    w: &QuantWeight<'_>,
    acts: &Acts,
    j0: usize,
    yt: &mut [f32],
    dot32: impl Fn(&[u8], &[i8]) -> i32,
) {
    let n = acts.n;
    for (dj, ys) in yt.chunks_exact_mut(n).enumerate() {
        let row = w.row(j0 + dj);
        for (t, out) in ys.chunks_mut(TILE_INPUTS).enumerate() {
            let i0 = t * TILE_INPUTS;
            let mut acc = [0.0f32; TILE_INPUTS];
            for (b, block) in row.chunks_exact(Q8_0_BLOCK_BYTES).enumerate() {
                let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                for (k, acc) in acc[..out.len()].iter_mut().enumerate() {
                    let x = &acts.row_qs(i0 + k)[b * BLOCK..(b + 1) * BLOCK];
                    *acc += d * acts.row_d(i0 + k)[b] * dot32(&block[2..], x) as f32;
                }
            }
            out.copy_from_slice(&acc[..out.len()]);
        }
    }
}

/// The exact dot product of 32 weight codes (int8 as bytes) and 32 activation codes.
fn dot32(w: &[u8], x: &[i8]) -> i32 {
    w[..BLOCK]
        .iter()
        .zip(&x[..BLOCK])
        .map(|(&w, &x)| i32::from(w as i8) * i32::from(x))
        .sum()
}

#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
mod neon {
    use std::arch::aarch64::*;

    use super::super::kquant_neon::dot16;
    use super::{each_tile, Acts, QuantWeight, BLOCK};

    #[target_feature(enable = "dotprod")]
    pub(super) unsafe fn rows_dot(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
        each_tile(w, acts, j0, yt, dot32::<true>)
    }

    /// [`super::dot32`] in two halves of 16 (`DOT`: with `sdot`).
    #[inline(always)]
    pub(super) fn dot32<const DOT: bool>(w: &[u8], x: &[i8]) -> i32 {
        let (w, x) = (&w[..BLOCK], &x[..BLOCK]);
        // SAFETY: NEON (every aarch64 target); both slices hold 32 bytes (sliced above).
        unsafe {
            let (w0, w1) = (
                vld1q_s8(w.as_ptr() as *const i8),
                vld1q_s8(w.as_ptr().add(16) as *const i8),
            );
            let (x0, x1) = (vld1q_s8(x.as_ptr()), vld1q_s8(x.as_ptr().add(16)));
            dot16::<DOT>(w0, x0) + dot16::<DOT>(w1, x1)
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::super::x86::hsum256;
    use super::{Acts, QuantWeight, BLOCK, Q8_0_BLOCK_BYTES, TILE_INPUTS};

    /// See [`super::rows`]: per input row one f32 vector accumulates each block's eight
    /// lane sums scaled by `d · a`, summed across lanes at the end.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn rows(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
        let n = acts.n;
        let ones = _mm256_set1_epi16(1);
        for (dj, ys) in yt.chunks_exact_mut(n).enumerate() {
            let row = w.row(j0 + dj);
            for (t, out) in ys.chunks_mut(TILE_INPUTS).enumerate() {
                let i0 = t * TILE_INPUTS;
                let mut acc = [_mm256_setzero_ps(); TILE_INPUTS];
                for (b, block) in row.chunks_exact(Q8_0_BLOCK_BYTES).enumerate() {
                    let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                    let codes = &block[2..2 + BLOCK];
                    // SAFETY: `codes` holds 32 bytes (sliced above).
                    let wq = unsafe { _mm256_loadu_si256(codes.as_ptr() as *const __m256i) };
                    let unsigned = _mm256_sign_epi8(wq, wq);
                    for (k, acc) in acc[..out.len()].iter_mut().enumerate() {
                        let x = &acts.row_qs(i0 + k)[b * BLOCK..(b + 1) * BLOCK];
                        // SAFETY: `x` holds 32 bytes (sliced above).
                        let xq = unsafe { _mm256_loadu_si256(x.as_ptr() as *const __m256i) };
                        let pairs = _mm256_maddubs_epi16(unsigned, _mm256_sign_epi8(xq, wq));
                        let sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                        let scale = _mm256_set1_ps(d * acts.row_d(i0 + k)[b]);
                        *acc = _mm256_fmadd_ps(sums, scale, *acc);
                    }
                }
                for (y, acc) in out.iter_mut().zip(acc) {
                    // SAFETY: AVX (this function's).
                    *y = unsafe { hsum256(acc) };
                }
            }
        }
    }
}
