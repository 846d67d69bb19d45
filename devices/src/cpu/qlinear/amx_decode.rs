//! The int4 decode kernels of the AMX level (fewer than [`super::AMX_MIN_ROWS`] input rows):
//! AVX-512 VNNI (`vpdpbusd`) dot products summed in the order of the AMX tile kernels, so
//! that a row computed alone has the bits it has in a prefill of many rows (batch
//! invariance, see [`super`]). Int8 weights lie in panels and decode in `panels`.
//!
//! The AMX kernels give each output `y[i, j]`, per block `b` of 32 values in order,
//! `acc = fma(C_b, a_b·d_g, acc)` with `C_b = Σ q_w q_x` exact, then the int4 minimums
//! `acc = fma(m_g, gsum_g, acc)` in order. Here, for 16 weight rows and one input row, each
//! chunk of 128 values gives 16 vectors of `vpdpbusd` sums (4 lanes per block); pairwise
//! merges of neighbouring lanes across those vectors (exact integer adds) leave one vector
//! of `C_b` per block with the 16 weight rows in its lanes, which then takes the same `fma`
//! as the AMX kernels' token lanes. The codes `0..15` are unsigned, against inputs in the
//! split order of the AVX-512 kernels (low 16 codes of 4 blocks, then their high 16).
//! The merges cost about two shuffles per `vpdpbusd`, which matrix × vector products, bound
//! by reading the weights, have to spare; the AMX tiles, whose loads and stores through
//! memory make one-row products slow, are kept for prefill.

use std::arch::x86_64::*;

use flm_core::quant::BLOCK;
use flm_core::DataType;

use super::{Acts, QuantWeight};

/// Weight rows per panel: the lanes of an f32 vector.
const ROWS: usize = 16;

/// `vpermt2d` indices of the even lanes of two vectors, then of the odd lanes.
// SAFETY (both): `__m512i` is 64 bytes of plain integers, as is `[i32; 16]`.
const EVEN: __m512i =
    unsafe { std::mem::transmute([0i32, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30]) };
/// See [`EVEN`].
const ODD: __m512i =
    unsafe { std::mem::transmute([1i32, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31]) };

/// `[a0 + a1, a2 + a3, .., a14 + a15, b0 + b1, .., b14 + b15]`.
#[inline(always)]
unsafe fn merge(a: __m512i, b: __m512i) -> __m512i {
    _mm512_add_epi32(
        _mm512_permutex2var_epi32(a, EVEN, b),
        _mm512_permutex2var_epi32(a, ODD, b),
    )
}

/// The int4 minimums `m_g` of a panel's rows for [`panel_i4`], group-major (`g·16 + dr`).
#[derive(Clone, Copy)]
pub(super) enum Minimums<'a> {
    /// As widened from the rows.
    Stored(&'a [f32]),
    /// `factor · d_g` (a symmetric row's), from the scales as they are used: the same
    /// products as widening them first.
    OfScales(f32),
}

/// `y[(dj)·n + i]` for the int4 weight rows `j..j + r` (`r ≤ 16`) and every input row, with
/// `acts` in the AVX-512 int4 order and the rows' group scales `dg` (group-major,
/// `g·16 + dr`) and minimums `mins`.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL and VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
pub(super) unsafe fn panel_i4(
    w: &QuantWeight<'_>,
    acts: &Acts,
    j: usize,
    r: usize,
    yt: &mut [f32],
    dg: &[f32],
    mins: Minimums<'_>,
) {
    let (n, kp) = (acts.n, w.kp);
    let (blocks, groups) = (kp / BLOCK, acts.groups);
    let per_group = blocks / groups;
    debug_assert!(w.dtype != DataType::I8 && dg.len() >= groups * ROWS);
    let rows: [&[u8]; ROWS] = std::array::from_fn(|dr| w.row(j + if dr < r { dr } else { 0 }));
    let low = _mm512_set1_epi8(0x0f);
    let ahead = ROWS * w.row_bytes;
    for i in 0..n {
        let (qs, d) = (acts.row_qs(i), acts.row_d(i));
        let mut acc = _mm512_setzero_ps();
        for c in 0..kp.div_ceil(128) {
            let rest = (kp - 128 * c).min(128);
            let mask: __mmask64 = if rest == 128 {
                !0
            } else {
                (1 << (rest / 2)) - 1
            };
            let alo = _mm512_loadu_si512(qs.as_ptr().add(128 * c) as *const _);
            let ahi = _mm512_loadu_si512(qs.as_ptr().add(128 * c + 64) as *const _);
            let sums: [__m512i; ROWS] = std::array::from_fn(|dr| {
                let p = rows[dr].as_ptr().add(64 * c) as *const i8;
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead));
                let v = _mm512_maskz_loadu_epi8(mask, p);
                let lo = _mm512_and_si512(v, low);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                _mm512_dpbusd_epi32(
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, alo),
                    hi,
                    ahi,
                )
            });
            let cb = block_sums4(sums);
            for (h, cb) in cb.into_iter().enumerate().take(rest / BLOCK) {
                let b = 4 * c + h;
                let s = _mm512_mul_ps(
                    _mm512_set1_ps(d[b]),
                    _mm512_loadu_ps(dg.as_ptr().add(b / per_group * ROWS)),
                );
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(cb), s, acc);
            }
        }
        for (g, &s) in acts.row_gsum(i).iter().enumerate() {
            let m = match mins {
                Minimums::Stored(mg) => _mm512_loadu_ps(mg.as_ptr().add(g * ROWS)),
                Minimums::OfScales(factor) => _mm512_mul_ps(
                    _mm512_set1_ps(factor),
                    _mm512_loadu_ps(dg.as_ptr().add(g * ROWS)),
                ),
            };
            acc = _mm512_fmadd_ps(m, _mm512_set1_ps(s), acc);
        }
        let mut y = [0.0f32; ROWS];
        _mm512_storeu_ps(y.as_mut_ptr(), acc);
        for (dr, y) in y.iter().enumerate().take(r) {
            yt[dr * n + i] = *y;
        }
    }
}

/// Of 16 vectors of 16 int32 lanes (vector `dr`: lanes `4b..4b + 4` block `b` of row `dr`,
/// `b < 4`), the sums of each row's 4 blocks, as four vectors with the rows in their lanes.
#[inline(always)]
unsafe fn block_sums4(v: [__m512i; ROWS]) -> [__m512i; 4] {
    let l1: [__m512i; 8] = std::array::from_fn(|p| merge(v[2 * p], v[2 * p + 1]));
    // Lane `4k + b` of `l2[q]`: block `b` of row `4q + k`.
    let l2: [__m512i; 4] = std::array::from_fn(|q| merge(l1[2 * q], l1[2 * q + 1]));
    // Blocks 0 and 2, then 1 and 3, of rows 0..8 and of rows 8..16.
    let e0 = _mm512_permutex2var_epi32(l2[0], EVEN, l2[1]);
    let e1 = _mm512_permutex2var_epi32(l2[2], EVEN, l2[3]);
    let o0 = _mm512_permutex2var_epi32(l2[0], ODD, l2[1]);
    let o1 = _mm512_permutex2var_epi32(l2[2], ODD, l2[3]);
    [
        _mm512_permutex2var_epi32(e0, EVEN, e1),
        _mm512_permutex2var_epi32(o0, EVEN, o1),
        _mm512_permutex2var_epi32(e0, ODD, e1),
        _mm512_permutex2var_epi32(o0, ODD, o1),
    ]
}
