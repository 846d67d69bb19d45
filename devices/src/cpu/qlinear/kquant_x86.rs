//! AVX2 K-quant kernels (see `kquant`): a super-block's 8 runs of codes are unpacked once
//! into 8 vectors of 32 unsigned bytes and dotted against up to [`TILE_INPUTS`] input rows
//! with `vpmaddubsw` (codes × int8 activations, pairwise into i16: at most
//! `2 · 63 · 127 < 2¹⁵`) and `vpmaddwd` (pairs into i32, by 1, or by Q6_K's per-16 scales);
//! the 8 runs' sums then fill one vector, converted and accumulated scaled by `f · a` in one
//! f32 vector per input row (lane sums at the end).

use std::arch::x86_64::*;

use flm_core::blocks::{block, BlockQ4K, BlockQ5K, BlockQ6K};
use flm_core::kquant::{self, RUN, RUNS};
use flm_core::DataType;

use super::x86::hsum256;
use super::{Acts, QuantWeight};

/// Input rows that share one unpacking of a super-block.
const TILE_INPUTS: usize = 4;

/// See `kquant::rows`.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn rows(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
    let n = acts.n;
    for (dj, ys) in yt.chunks_exact_mut(n).enumerate() {
        let row = w.row(j0 + dj);
        for (t, out) in ys.chunks_mut(TILE_INPUTS).enumerate() {
            // SAFETY: AVX2 and FMA, as this function's caller guarantees.
            unsafe {
                match w.dtype {
                    DataType::Q6K => tile::<true>(w.dtype, row, acts, t * TILE_INPUTS, out),
                    dtype => tile::<false>(dtype, row, acts, t * TILE_INPUTS, out),
                }
            }
        }
    }
}

/// Loads 32 bytes from `s[..32]`.
#[inline(always)]
unsafe fn load32<T>(s: &[T]) -> __m256i {
    assert!(size_of_val(s) >= 32);
    // SAFETY: AVX (the caller's); `s` holds at least 32 bytes (asserted).
    unsafe { _mm256_loadu_si256(s.as_ptr() as *const __m256i) }
}

/// Loads 8 f32 (or i32) values from `s[..8]`.
#[inline(always)]
unsafe fn load8<T>(s: &[T]) -> __m256i {
    let s = &s[..8];
    assert_eq!(size_of_val(s), 32);
    // SAFETY: AVX (the caller's); `s` holds 32 bytes (sliced and asserted).
    unsafe { _mm256_loadu_si256(s.as_ptr() as *const __m256i) }
}

/// The sums of the 8 lanes of each of `p[0..8]`, as the 8 lanes of one vector (lane `r` is
/// `Σ p[r]`): two rounds of `vphaddd`, then the two halves added.
#[inline(always)]
unsafe fn lane_sums(p: &[__m256i; RUNS]) -> __m256i {
    // SAFETY: AVX2 (the caller's); registers only.
    unsafe {
        let ab = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        let cd = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
        let lo = _mm256_permute2x128_si256(ab, cd, 0x20);
        let hi = _mm256_permute2x128_si256(ab, cd, 0x31);
        _mm256_add_epi32(lo, hi)
    }
}

/// The outputs `out` (input rows `i0..i0 + out.len()`) of one weight row `row` of `dtype`;
/// `SIX` for Q6_K. Per super-block and input row, the 8 runs' exact integer sums are
/// gathered into one vector, scaled by `f_r · a_b` lane by lane and accumulated; the
/// Q4_K/Q5_K minimums likewise by `g_r · a_b · Σ q_x`.
#[inline(always)]
unsafe fn tile<const SIX: bool>(
    dtype: DataType,
    row: &[u8],
    acts: &Acts,
    i0: usize,
    out: &mut [f32],
) {
    // SAFETY (whole body): AVX2 and FMA, as the caller guarantees; every load goes through
    // `load32` or `load8` on a slice of the size they read.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let offset = _mm256_set1_epi8(32);
        let mut acc = [_mm256_setzero_ps(); TILE_INPUTS];
        let mut mins = [_mm256_setzero_ps(); TILE_INPUTS];
        let mut codes = [_mm256_setzero_si256(); RUNS];
        let mut weights = [ones; RUNS];
        let mut p = [_mm256_setzero_si256(); RUNS];
        let (mut sc_u8, mut m_u8) = ([0u8; RUNS], [0u8; RUNS]);
        for (s, bytes) in row.chunks_exact(kquant::block_bytes(dtype)).enumerate() {
            if SIX {
                unpack_q6(bytes, &mut codes);
                for (r, wv) in weights.iter_mut().enumerate() {
                    let (sa, sb) = kquant::q6_scales(bytes, r);
                    *wv = _mm256_set_m128i(_mm_set1_epi16(sb as i16), _mm_set1_epi16(sa as i16));
                }
            } else {
                unpack_q45(dtype, bytes, &mut codes);
            }
            let (fv, gv) = if SIX {
                (
                    _mm256_set1_ps(kquant::run_scales(dtype, bytes, 0).0),
                    _mm256_setzero_ps(),
                )
            } else {
                // Q4_K and Q5_K start with the same head.
                let head = &block::<BlockQ4K>(bytes).head;
                for r in 0..RUNS {
                    (sc_u8[r], m_u8[r]) = head.get(r);
                }
                let widen = |v: &[u8; RUNS]| {
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                        v.as_ptr() as *const __m128i
                    )))
                };
                let (dd, dm) = (head.d.to_f32(), head.dmin.to_f32());
                (
                    _mm256_mul_ps(_mm256_set1_ps(dd), widen(&sc_u8)),
                    _mm256_mul_ps(_mm256_set1_ps(dm), widen(&m_u8)),
                )
            };
            let b0 = s * RUNS;
            for (u, (acc, mins)) in acc.iter_mut().zip(&mut mins).take(out.len()).enumerate() {
                let i = i0 + u;
                let qs = &acts.row_qs(i)[b0 * RUN..(b0 + RUNS) * RUN];
                for (r, p) in p.iter_mut().enumerate() {
                    let x = load32(&qs[r * RUN..]);
                    let mut q = _mm256_maddubs_epi16(codes[r], x);
                    if SIX {
                        q = _mm256_sub_epi16(q, _mm256_maddubs_epi16(offset, x));
                    }
                    *p = _mm256_madd_epi16(q, weights[r]);
                }
                let a = _mm256_castsi256_ps(load8(&acts.row_d(i)[b0..]));
                let isums = _mm256_cvtepi32_ps(lane_sums(&p));
                *acc = _mm256_fmadd_ps(isums, _mm256_mul_ps(fv, a), *acc);
                if !SIX {
                    let bsum = _mm256_cvtepi32_ps(load8(&acts.row_bsum(i)[b0..]));
                    *mins = _mm256_fmadd_ps(bsum, _mm256_mul_ps(gv, a), *mins);
                }
            }
        }
        for (o, (acc, mins)) in out.iter_mut().zip(acc.iter().zip(&mins)) {
            *o = hsum256(*acc) - hsum256(*mins);
        }
    }
}

/// The 8 runs of codes of a Q4_K or Q5_K super-block: the low and high nibbles of each 32
/// bytes of `qs` are runs `2p` and `2p + 1`; Q5_K adds bit `r` of each byte of `qh` as bit 4
/// of run `r`.
#[inline(always)]
unsafe fn unpack_q45(dtype: DataType, bytes: &[u8], codes: &mut [__m256i; RUNS]) {
    // SAFETY (whole body): AVX2, as the caller guarantees; loads through `load32`.
    unsafe {
        let nib = _mm256_set1_epi8(0x0f);
        let five = dtype == DataType::Q5K;
        let qs = if five {
            &block::<BlockQ5K>(bytes).qs
        } else {
            &block::<BlockQ4K>(bytes).qs
        };
        for p in 0..RUNS / 2 {
            let v = load32(&qs[p * 32..]);
            codes[2 * p] = _mm256_and_si256(v, nib);
            codes[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
        }
        if five {
            let qh = load32(&block::<BlockQ5K>(bytes).qh);
            let bit = _mm256_set1_epi8(1);
            for (r, c) in codes.iter_mut().enumerate() {
                // 16-bit shifts move bits across the bytes of a pair; the mask keeps bit r
                // of each byte only.
                let shifted = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(r as i32));
                let high = _mm256_slli_epi16(_mm256_and_si256(shifted, bit), 4);
                *c = _mm256_or_si256(*c, high);
            }
        }
    }
}

/// The 8 runs of codes of a Q6_K super-block (see `kquant::run_codes`): per half of 128
/// values, the low and high nibbles of two 32-byte rows of `ql` with 2 bits each of 32
/// bytes of `qh`.
#[inline(always)]
unsafe fn unpack_q6(bytes: &[u8], codes: &mut [__m256i; RUNS]) {
    // SAFETY (whole body): AVX2, as the caller guarantees; loads through `load32`.
    unsafe {
        let nib = _mm256_set1_epi8(0x0f);
        let two = _mm256_set1_epi8(3);
        let b = block::<BlockQ6K>(bytes);
        for half in 0..2 {
            let ql = [load32(&b.ql[half * 64..]), load32(&b.ql[half * 64 + 32..])];
            let qh = load32(&b.qh[half * 32..]);
            let highs = [
                qh,
                _mm256_srli_epi16(qh, 2),
                _mm256_srli_epi16(qh, 4),
                _mm256_srli_epi16(qh, 6),
            ];
            for (t, h) in highs.into_iter().enumerate() {
                let low = if t < 2 {
                    ql[t % 2]
                } else {
                    _mm256_srli_epi16(ql[t % 2], 4)
                };
                let high = _mm256_slli_epi16(_mm256_and_si256(h, two), 4);
                codes[half * 4 + t] = _mm256_or_si256(_mm256_and_si256(low, nib), high);
            }
        }
    }
}
