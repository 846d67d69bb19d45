//! aarch64 K-quant kernels (see `kquant`): a super-block's 8 runs of codes are unpacked
//! once into 16 vectors of 16 bytes and dotted against up to [`TILE_INPUTS`] input rows,
//! 16 values at a time (Q6_K has one scale per 16): with `sdot` at [`Isa::NeonDot`](crate::cpu::Isa::NeonDot), else
//! `smull`/`smull2` and `sadalp` (every product fits i16: `|(q − 32) · x| ≤ 32 · 128`).
//! The integer sum of a run is scaled by `f · a` and accumulated in its lane, in the order
//! of `kquant`.

use std::arch::aarch64::*;

use flm_core::blocks::{block, BlockQ4K, BlockQ5K, BlockQ6K};
use flm_core::kquant::{self, RUN, RUNS};
use flm_core::DataType;

use super::neon::{sdot, DotKernel};
use super::{lane_sum8, Acts, QuantWeight};
use crate::cpu::simd::fma;

/// Input rows that share one unpacking of a super-block.
const TILE_INPUTS: usize = 4;

/// A run of 32 codes as two vectors of 16.
type Run = [int8x16_t; 2];

/// The K-quant kernel of both NEON levels (see `kquant::rows`), run by
/// [`super::neon::rows_with`].
pub(super) struct KQuant;

impl DotKernel for KQuant {
    #[inline(always)]
    fn each_tile<const DOT: bool>(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
        let n = acts.n;
        for (dj, ys) in yt.chunks_exact_mut(n).enumerate() {
            let row = w.row(j0 + dj);
            for (t, out) in ys.chunks_mut(TILE_INPUTS).enumerate() {
                match w.dtype {
                    DataType::Q6K => tile::<true, DOT>(w.dtype, row, acts, t * TILE_INPUTS, out),
                    dtype => tile::<false, DOT>(dtype, row, acts, t * TILE_INPUTS, out),
                }
            }
        }
    }
}

/// The exact dot product of 16 codes `w` and 16 activation codes `a`; `DOT` selects
/// `sdot`, which only the `#[target_feature(enable = "dotprod")]` path passes.
#[inline(always)]
fn dot16<const DOT: bool>(w: int8x16_t, a: int8x16_t) -> i32 {
    // SAFETY: NEON (every aarch64 target); `sdot` only when `DOT` (see above).
    unsafe {
        if DOT {
            vaddvq_s32(sdot(vdupq_n_s32(0), w, a))
        } else {
            let p = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(a)));
            vaddvq_s32(vpadalq_s16(p, vmull_high_s8(w, a)))
        }
    }
}

/// Two vectors of 16 bytes from `s[..32]`.
#[inline(always)]
fn load32(s: &[u8]) -> [uint8x16_t; 2] {
    let s = &s[..32];
    // SAFETY: NEON; `s` holds 32 bytes (sliced above).
    unsafe { [vld1q_u8(s.as_ptr()), vld1q_u8(s.as_ptr().add(16))] }
}

/// The outputs `out` (input rows `i0..i0 + out.len()`) of one weight row `row` of `dtype`;
/// `SIX` for Q6_K.
#[inline(always)]
fn tile<const SIX: bool, const DOT: bool>(
    dtype: DataType,
    row: &[u8],
    acts: &Acts,
    i0: usize,
    out: &mut [f32],
) {
    let mut acc = [[0.0f32; RUNS]; TILE_INPUTS];
    let mut mins = [[0.0f32; RUNS]; TILE_INPUTS];
    let mut codes: [Run; RUNS] = zero_runs();
    for (s, block) in row.chunks_exact(kquant::block_bytes(dtype)).enumerate() {
        if SIX {
            unpack_q6(block, &mut codes);
        } else {
            unpack_q45(dtype, block, &mut codes);
        }
        for (r, run) in codes.iter().enumerate() {
            let (f, g) = kquant::run_scales(dtype, block, r);
            let (sa, sb) = if SIX {
                kquant::q6_scales(block, r)
            } else {
                (1, 1)
            };
            for (u, (acc, mins)) in acc.iter_mut().zip(&mut mins).take(out.len()).enumerate() {
                let i = i0 + u;
                let b = s * RUNS + r;
                let x = &acts.row_qs(i)[b * RUN..(b + 1) * RUN];
                // SAFETY: NEON; `x` holds 32 codes (sliced above).
                let (xl, xh) = unsafe { (vld1q_s8(x.as_ptr()), vld1q_s8(x.as_ptr().add(16))) };
                let isum = sa * dot16::<DOT>(run[0], xl) + sb * dot16::<DOT>(run[1], xh);
                let a = acts.row_d(i)[b];
                acc[r] = fma(isum as f32, f * a, acc[r]);
                if !SIX {
                    mins[r] = fma(acts.row_bsum(i)[b] as f32, g * a, mins[r]);
                }
            }
        }
    }
    for (o, (acc, mins)) in out.iter_mut().zip(acc.into_iter().zip(mins)) {
        *o = lane_sum8(acc) - lane_sum8(mins);
    }
}

/// Runs of zero codes (overwritten by the unpacking).
#[inline(always)]
fn zero_runs() -> [Run; RUNS] {
    // SAFETY: NEON; registers only.
    unsafe { [[vdupq_n_s8(0); 2]; RUNS] }
}

/// The 8 runs of a Q4_K or Q5_K super-block as signed bytes (codes `0..31` fit): low and
/// high nibbles of each 32 bytes of `qs` are runs `2p` and `2p + 1`; Q5_K adds bit `r` of
/// each byte of `qh` as bit 4 of run `r`.
#[inline(always)]
fn unpack_q45(dtype: DataType, bytes: &[u8], codes: &mut [Run; RUNS]) {
    let five = dtype == DataType::Q5K;
    let (qs, qh) = if five {
        let b = block::<BlockQ5K>(bytes);
        (&b.qs, b.qh)
    } else {
        (&block::<BlockQ4K>(bytes).qs, [0; 32])
    };
    let qh = load32(&qh);
    // SAFETY: NEON; registers only, loads through `load32`.
    unsafe {
        let nib = vdupq_n_u8(0x0f);
        for p in 0..RUNS / 2 {
            let v = load32(&qs[p * 32..]);
            for h in 0..2 {
                let mut lo = vandq_u8(v[h], nib);
                let mut hi = vshrq_n_u8::<4>(v[h]);
                if five {
                    let bit = |r: usize| {
                        let shifted = vshlq_u8(qh[h], vdupq_n_s8(-(r as i8)));
                        vshlq_n_u8::<4>(vandq_u8(shifted, vdupq_n_u8(1)))
                    };
                    lo = vorrq_u8(lo, bit(2 * p));
                    hi = vorrq_u8(hi, bit(2 * p + 1));
                }
                codes[2 * p][h] = vreinterpretq_s8_u8(lo);
                codes[2 * p + 1][h] = vreinterpretq_s8_u8(hi);
            }
        }
    }
}

/// The 8 runs of a Q6_K super-block (see `kquant::run_codes`) less 32, as signed bytes.
#[inline(always)]
fn unpack_q6(bytes: &[u8], codes: &mut [Run; RUNS]) {
    // SAFETY: NEON; registers only, loads through `load32`.
    unsafe {
        let nib = vdupq_n_u8(0x0f);
        let two = vdupq_n_u8(3);
        let offset = vdupq_n_s8(32);
        let b = block::<BlockQ6K>(bytes);
        for half in 0..2 {
            let ql = [load32(&b.ql[half * 64..]), load32(&b.ql[half * 64 + 32..])];
            let qh = load32(&b.qh[half * 32..]);
            for t in 0..4 {
                for h in 0..2 {
                    let l = ql[t % 2][h];
                    let low = if t < 2 {
                        vandq_u8(l, nib)
                    } else {
                        vshrq_n_u8::<4>(l)
                    };
                    let high = vandq_u8(vshlq_u8(qh[h], vdupq_n_s8(-2 * t as i8)), two);
                    let q = vorrq_u8(low, vshlq_n_u8::<4>(high));
                    codes[half * 4 + t][h] = vsubq_s8(vreinterpretq_s8_u8(q), offset);
                }
            }
        }
    }
}
