//! x86-64 helpers of the quantised Linears: activation blocks quantised with AVX2 and
//! AVX-512 (the bits of [`super::quantize_block`]) and the horizontal sum of the K-quant
//! and Q8_0 kernels. The int8 and int4 kernels are in `panels`.

use std::arch::x86_64::*;

/// [`super::quantize_block`] with AVX-512: the same bits.
#[inline(always)]
pub(super) unsafe fn quantize_block_avx512(
    values: &[f32],
    lo: &mut [i8],
    hi: &mut [i8],
) -> (f32, i32) {
    let n = values.len().min(32);
    let m0: __mmask16 = if n >= 16 { 0xffff } else { (1 << n) - 1 };
    let m1: __mmask16 = if n >= 32 {
        0xffff
    } else {
        (1u32 << n.saturating_sub(16)) as u16 - 1
    };
    // Masked-off lanes are neither read nor faulted on.
    let v0 = _mm512_maskz_loadu_ps(m0, values.as_ptr());
    let v1 = _mm512_maskz_loadu_ps(m1, values.as_ptr().wrapping_add(16));
    let inf = _mm512_set1_ps(f32::INFINITY);
    let finite = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_abs_ps(v0), inf)
        & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_abs_ps(v1), inf);
    if finite != 0xffff {
        return super::non_finite_block(lo, hi);
    }
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    let d = amax / 127.0;
    let inv = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
    let q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));
    let q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
    _mm_storeu_si128(lo.as_mut_ptr() as *mut __m128i, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(hi.as_mut_ptr() as *mut __m128i, _mm512_cvtepi32_epi8(q1));
    (d, _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)))
}

/// [`super::quantize_block`] with AVX2: the same bits.
#[inline(always)]
pub(super) unsafe fn quantize_block_avx2(
    values: &[f32],
    lo: &mut [i8],
    hi: &mut [i8],
) -> (f32, i32) {
    let mut padded = [0.0f32; 32];
    let p = if values.len() >= 32 {
        values.as_ptr()
    } else {
        padded[..values.len()].copy_from_slice(values);
        padded.as_ptr()
    };
    let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(p.add(8 * i)));
    let sign = _mm256_set1_ps(-0.0);
    let a = |x: __m256| _mm256_andnot_ps(sign, x);
    let inf = _mm256_set1_ps(f32::INFINITY);
    let finite = v
        .iter()
        .fold(_mm256_castsi256_ps(_mm256_set1_epi32(-1)), |f, &x| {
            _mm256_and_ps(f, _mm256_cmp_ps::<_CMP_LT_OQ>(a(x), inf))
        });
    if _mm256_movemask_ps(finite) != 0xff {
        return super::non_finite_block(lo, hi);
    }
    let m = _mm256_max_ps(
        _mm256_max_ps(a(v[0]), a(v[1])),
        _mm256_max_ps(a(v[2]), a(v[3])),
    );
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    let d = _mm_cvtss_f32(m) / 127.0;
    let inv = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
    let q: [__m256i; 4] = std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv)));
    // Pack to bytes (lane-wise), then restore the order as ggml's quantize_row_q8_0 does.
    let w = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm_storeu_si128(lo.as_mut_ptr() as *mut __m128i, _mm256_castsi256_si128(w));
    _mm_storeu_si128(
        hi.as_mut_ptr() as *mut __m128i,
        _mm256_extracti128_si256(w, 1),
    );
    let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    (d, _mm_cvtsi128_si32(s))
}

/// [`super::lane_sum8`] of the 8 lanes of `v`.
#[inline(always)]
pub(super) unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}
