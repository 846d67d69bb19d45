//! Linear layers with ggml's Q8_0 weights ([`flm_core::DataType::Q8_0`], blocks as GGUF files store
//! them, [`flm_core::quant`]): each block of 32 int8 weight codes dotted against the int8
//! activation block of the same 32 columns in exact integers, then scaled by `d · a`
//! (ggml's `ggml_vec_dot_q8_0_q8_0`).
//!
//! **One order at every level.** An output keeps 8 f32 lanes. For block `b` (weight scale
//! `d_b`, activation scale `a_b`), lane `l` takes the exact integer
//! `c_{b,l} = Σ_{t<4} q_w[4l+t]·q_x[4l+t]` as `acc_l = fma(c_{b,l}, d_b·a_b, acc_l)`; after
//! the last block the lanes are summed by [`super::lane_sum8`]'s tree. That is what AVX2's
//! `vpmaddubsw` + `vpmaddwd` and NEON's `sdot` (or `smull` and pairwise adds) give lane by
//! lane, so the portable twin here, AVX2 (at every x86 level: `vpsignb` makes the weight
//! codes unsigned for `vpmaddubsw`, as ggml does; a pair of products is at most
//! `2 · 128 · 127 < 2¹⁵`) and NEON compute the same bits. Each block is loaded once for up
//! to [`TILE_INPUTS`] input rows, and each output depends on its own row only (batch
//! invariance).

use flm_core::blocks::{blocks, BlockQ8_0};
use flm_core::quant::BLOCK;

use super::{lane_sum8, Acts, QuantWeight};
use crate::cpu::simd::fma;
use crate::cpu::Isa;

/// Input rows that share one load of a weight block.
const TILE_INPUTS: usize = 4;

/// See [`super::RowKernel`], for a Q8_0 `w` and [`Acts`] in natural order.
pub(super) fn rows(isa: Isa, w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
    match isa {
        // SAFETY: `CpuDevice::with_isa` only accepts levels this CPU supports, and every
        // x86 level above the portable one has AVX2.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni | Isa::Avx512 | Isa::Amx => unsafe { avx2::rows(w, acts, j0, yt) },
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        Isa::Neon | Isa::NeonDot => super::neon::rows_with::<neon::Q8_0>(isa, w, acts, j0, yt),
        _ => portable(w, acts, j0, yt),
    }
}

/// The portable twin, in the order of the module docs.
fn portable(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
    let n = acts.n;
    for (dj, ys) in yt.chunks_exact_mut(n).enumerate() {
        let row = w.row(j0 + dj);
        for (t, out) in ys.chunks_mut(TILE_INPUTS).enumerate() {
            let i0 = t * TILE_INPUTS;
            let mut acc = [[0.0f32; 8]; TILE_INPUTS];
            for (b, block) in blocks::<BlockQ8_0>(row).iter().enumerate() {
                let d = block.d.to_f32();
                let codes = &block.qs;
                for (k, acc) in acc[..out.len()].iter_mut().enumerate() {
                    let x = &acts.row_qs(i0 + k)[b * BLOCK..(b + 1) * BLOCK];
                    let s = d * acts.row_d(i0 + k)[b];
                    let c: [f32; 8] = std::array::from_fn(|l| {
                        let lane =
                            (4 * l..4 * l + 4).map(|t| i32::from(codes[t]) * i32::from(x[t]));
                        lane.sum::<i32>() as f32
                    });
                    // Apart from the integer sums, so that the lanes' fused multiply-adds
                    // vectorise.
                    for (acc, c) in acc.iter_mut().zip(c) {
                        *acc = fma(c, s, *acc);
                    }
                }
            }
            for (y, acc) in out.iter_mut().zip(acc) {
                *y = lane_sum8(acc);
            }
        }
    }
}

#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
mod neon {
    use std::arch::aarch64::*;

    use super::super::neon::{dot4, DotKernel};
    use super::{blocks, Acts, BlockQ8_0, QuantWeight, BLOCK, TILE_INPUTS};
    /// The Q8_0 kernel of both NEON levels (see [`super::rows`]), run by
    /// [`rows_with`](super::super::neon::rows_with).
    pub(in super::super) struct Q8_0;

    impl DotKernel for Q8_0 {
        /// The 8 lanes of the module docs as two vectors of 4: `dot4` gives lane `l` of 16
        /// bytes the sum of its 4 products, `vfmaq_f32` rounds once.
        #[inline(always)]
        fn each_tile<const DOT: bool>(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
            let n = acts.n;
            // SAFETY (whole body): NEON (every aarch64 target); `sdot` only when `DOT`, which
            // only `rows_with` passes at `Isa::NeonDot`; every load reads a slice of 32 bytes.
            unsafe {
                let zero = vdupq_n_s32(0);
                for (dj, ys) in yt.chunks_exact_mut(n).enumerate() {
                    let row = w.row(j0 + dj);
                    for (t, out) in ys.chunks_mut(TILE_INPUTS).enumerate() {
                        let i0 = t * TILE_INPUTS;
                        let mut acc = [[vdupq_n_f32(0.0); 2]; TILE_INPUTS];
                        for (b, block) in blocks::<BlockQ8_0>(row).iter().enumerate() {
                            let d = block.d.to_f32();
                            let codes = &block.qs;
                            let w0 = vld1q_s8(codes.as_ptr() as *const i8);
                            let w1 = vld1q_s8(codes.as_ptr().add(16) as *const i8);
                            for (k, acc) in acc[..out.len()].iter_mut().enumerate() {
                                let x = &acts.row_qs(i0 + k)[b * BLOCK..(b + 1) * BLOCK];
                                let (x0, x1) = (vld1q_s8(x.as_ptr()), vld1q_s8(x.as_ptr().add(16)));
                                let s = vdupq_n_f32(d * acts.row_d(i0 + k)[b]);
                                let c0 = vcvtq_f32_s32(dot4::<DOT>(zero, w0, x0));
                                let c1 = vcvtq_f32_s32(dot4::<DOT>(zero, w1, x1));
                                acc[0] = vfmaq_f32(acc[0], c0, s);
                                acc[1] = vfmaq_f32(acc[1], c1, s);
                            }
                        }
                        for (y, acc) in out.iter_mut().zip(acc) {
                            *y = sum8(acc);
                        }
                    }
                }
            }
        }
    }

    /// [`super::lane_sum8`] of the lanes `v[0]` (0..4) and `v[1]` (4..8).
    #[inline(always)]
    fn sum8(v: [float32x4_t; 2]) -> f32 {
        // SAFETY: NEON; registers only.
        unsafe {
            let s = vaddq_f32(v[0], v[1]);
            let t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
            vget_lane_f32::<0>(t) + vget_lane_f32::<1>(t)
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::x86::hsum256;
    use super::{blocks, Acts, BlockQ8_0, QuantWeight, BLOCK, TILE_INPUTS};

    /// See [`super::rows`]: per input row one f32 vector holds the 8 lanes of the module
    /// docs.
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
                for (b, block) in blocks::<BlockQ8_0>(row).iter().enumerate() {
                    let d = block.d.to_f32();
                    let codes = &block.qs;
                    // SAFETY: `codes` holds 32 bytes.
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
