//! x86-64 implementations of [`Simd`]: 256-bit AVX2 (+FMA, F16C) and 512-bit AVX-512
//! (F, BW, VL), and the `#[target_feature]` runners that compile a [`Kernel`] for each: with
//! 16-lane vectors, pairs of AVX2 vectors ([`Wide`]) and AVX-512 vectors, whose lane sums
//! follow the halving tree of [`Simd::sum`].
//!
//! Soundness: [`Avx2`] and [`Avx512`] have a private field, so only [`avx2`] and [`avx512`]
//! create them, and those are `unsafe` to call unless the CPU has the features (callers
//! check the [`crate::cpu::Isa`] level, which `CpuDevice::with_isa` verified). Every
//! method, and every private helper (called only from the methods of its level or a higher
//! one), therefore runs on a CPU with the level's features, which is what each `unsafe`
//! block below relies on; pointers come from slices whose lengths are checked (full
//! vectors) or that bound the lanes a masked access touches (`_part` forms).

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::wide::Wide;
use super::{Kernel, Simd};

/// Runs `k` with AVX2 vectors.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C ([`crate::cpu::Isa::Avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn avx2<K: Kernel>(k: K) -> K::Output {
    k.run(Wide::<Avx2, 2>(Avx2(())))
}

/// Runs `k` with AVX-512 vectors.
///
/// # Safety
/// The CPU must support AVX-512 F, BW and VL, AVX2, FMA and F16C
/// ([`crate::cpu::Isa::Avx512`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn avx512<K: Kernel>(k: K) -> K::Output {
    k.run(Avx512(()))
}

/// AVX2 vectors: 8 f32 lanes, 16 registers (kernels see them in pairs, see [`avx2`]).
#[derive(Clone, Copy)]
pub(crate) struct Avx2(());

/// The AVX-512 level: 16 f32 lanes, 32 registers.
#[derive(Clone, Copy)]
pub(crate) struct Avx512(());

/// `MASKS[8 - n..][..8]` enables the first `n` of 8 lanes (`_mm256_maskload_ps`).
static MASKS: [i32; 16] = [-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0];

#[inline(always)]
fn mask8(n: usize) -> __m256i {
    let n = n.min(8);
    // SAFETY: AVX; reads entries `8 - n..16 - n` of the 16 of `MASKS`.
    unsafe { _mm256_loadu_si256(MASKS[8 - n..].as_ptr() as *const __m256i) }
}

#[inline(always)]
fn mask4(n: usize) -> __m128i {
    let n = n.min(4);
    // SAFETY: SSE2; reads entries `8 - n..12 - n` of the 16 of `MASKS`.
    unsafe { _mm_loadu_si128(MASKS[8 - n..].as_ptr() as *const __m128i) }
}

/// Lane mask of the first `min(n, 16)` lanes.
#[inline(always)]
fn kmask16(n: usize) -> __mmask16 {
    ((1u32 << n.min(16)) - 1) as __mmask16
}

#[inline(always)]
fn hsum128(s: __m128) -> f32 {
    // SAFETY: the level's features (module docs); no memory access.
    unsafe {
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// The lane sums of eight vectors, in order, each by the halving tree: the lower plus the
/// upper 128-bit half, then lanes 0, 1 plus lanes 2, 3, then lane 0 plus lane 1.
#[inline(always)]
fn sums8_256(v: [__m256; 8]) -> __m256 {
    /// `[a.lo + a.hi, b.lo + b.hi]`.
    #[inline(always)]
    fn halves(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe {
            _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(a, b),
                _mm256_permute2f128_ps::<0x31>(a, b),
            )
        }
    }
    /// Per 128-bit half: `[a0 + a2, a1 + a3, b0 + b2, b1 + b3]`.
    #[inline(always)]
    fn quarters(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe {
            _mm256_add_ps(
                _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
                _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
            )
        }
    }
    // SAFETY: the level's features (module docs); no memory access.
    unsafe {
        let u0 = quarters(halves(v[0], v[1]), halves(v[2], v[3]));
        let u1 = quarters(halves(v[4], v[5]), halves(v[6], v[7]));
        // [S0, S2, S4, S6 | S1, S3, S5, S7].
        let w = _mm256_hadd_ps(u0, u1);
        _mm256_permutevar8x32_ps(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }
}

/// The lane sums of eight 512-bit vectors, in order, with 16 shuffles: halves of pairs,
/// then quarters of pairs of pairs, then within the 128-bit lanes.
#[inline(always)]
fn sums8_512(v: [__m512; 8]) -> __m256 {
    /// `[x.q0 + x.q2, x.q1 + x.q3, y.q0 + y.q2, y.q1 + y.q3]` (`q`: 128-bit quarters).
    #[inline(always)]
    fn half(x: __m512, y: __m512) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe {
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
                _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
            )
        }
    }
    /// Of two [`half`] results of four vectors: quarter `q` holds 4 partial sums of vector `q`.
    #[inline(always)]
    fn quarter(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe {
            _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
            )
        }
    }
    // SAFETY: the level's features (module docs); no memory access.
    unsafe {
        let t0 = quarter(half(v[0], v[1]), half(v[2], v[3]));
        let t1 = quarter(half(v[4], v[5]), half(v[6], v[7]));
        // Per quarter q: [a0 + a2, b0 + b2, a1 + a3, b1 + b3] (a of t0, b of t1), then
        // [S(v_q), S(v_{q+4}), ..].
        let x = _mm512_add_ps(_mm512_unpacklo_ps(t0, t1), _mm512_unpackhi_ps(t0, t1));
        let y = _mm512_add_ps(x, _mm512_permute_ps::<0b01_00_11_10>(x));
        let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
        _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, y))
    }
}

#[inline(always)]
fn to_array8(v: __m256) -> [f32; 8] {
    let mut out = [0.0f32; 8];
    // SAFETY: AVX (module docs); `out` holds the 8 values.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
    out
}

#[inline(always)]
fn store_scaled8(v: __m256, scale: f32, d: &mut [f32]) {
    assert!(d.len() >= 8);
    // SAFETY: the level's features (module docs); `d` holds the vector (asserted).
    unsafe { _mm256_storeu_ps(d.as_mut_ptr(), _mm256_mul_ps(v, _mm256_set1_ps(scale))) }
}

impl Simd for Avx2 {
    const LANES: usize = 8;
    const REGS: usize = 16;
    type V = __m256;

    #[inline(always)]
    fn zero(self) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    fn load(self, s: &[f32]) -> __m256 {
        assert!(s.len() >= 8);
        // SAFETY: the level's features (module docs); `s` holds the vector (asserted).
        unsafe { _mm256_loadu_ps(s.as_ptr()) }
    }
    #[inline(always)]
    fn load_part(self, s: &[f32]) -> __m256 {
        // SAFETY: the level's features (module docs); the mask enables only lanes in `s`.
        unsafe { _mm256_maskload_ps(s.as_ptr(), mask8(s.len())) }
    }
    #[inline(always)]
    fn store(self, d: &mut [f32], v: __m256) {
        assert!(d.len() >= 8);
        // SAFETY: the level's features (module docs); `d` holds the vector (asserted).
        unsafe { _mm256_storeu_ps(d.as_mut_ptr(), v) }
    }
    #[inline(always)]
    fn store_part(self, d: &mut [f32], v: __m256) {
        // SAFETY: the level's features (module docs); the mask enables only lanes in `d`.
        unsafe { _mm256_maskstore_ps(d.as_mut_ptr(), mask8(d.len()), v) }
    }
    #[inline(always)]
    fn load_f16(self, s: &[f16]) -> __m256 {
        assert!(s.len() >= 8);
        // SAFETY: the level's features (module docs); `s` holds the vector (asserted).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr() as *const __m128i)) }
    }
    #[inline(always)]
    fn load_f16_part(self, s: &[f16]) -> __m256 {
        let n = s.len().min(8);
        let mut b = [f16::ZERO; 8];
        b[..n].copy_from_slice(&s[..n]);
        self.load_f16(&b)
    }
    #[inline(always)]
    fn load_bf16(self, s: &[bf16]) -> __m256 {
        assert!(s.len() >= 8);
        // SAFETY: the level's features (module docs); `s` holds the vector (asserted).
        unsafe {
            let h = _mm_loadu_si128(s.as_ptr() as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        }
    }
    #[inline(always)]
    fn load_bf16_part(self, s: &[bf16]) -> __m256 {
        let n = s.len().min(8);
        let mut b = [bf16::ZERO; 8];
        b[..n].copy_from_slice(&s[..n]);
        self.load_bf16(&b)
    }

    #[inline(always)]
    fn add(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    fn fma(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn fnma(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm256_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn max(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    fn abs(self, a: __m256) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), a) }
    }
    #[inline(always)]
    fn select_neg(self, x: __m256, a: __m256, b: __m256) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm256_blendv_ps(b, a, x) }
    }
    #[inline(always)]
    fn zero_below(self, x: __m256, lim: f32, v: __m256) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm256_and_ps(_mm256_cmp_ps::<_CMP_NLT_UQ>(x, _mm256_set1_ps(lim)), v) }
    }
    #[inline(always)]
    fn round(self, a: __m256) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
    }
    #[inline(always)]
    fn exp2i(self, n: __m256) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe {
            let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e))
        }
    }

    #[inline(always)]
    fn sum(self, v: __m256) -> f32 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe {
            hsum128(_mm_add_ps(
                _mm256_castps256_ps128(v),
                _mm256_extractf128_ps(v, 1),
            ))
        }
    }
    #[inline(always)]
    fn max_lane(self, v: __m256) -> f32 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe {
            let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
        }
    }
    /// The first half of [`Simd::sums8`] of the four vectors twice: the same tree.
    #[inline(always)]
    fn sums4(self, v: [__m256; 4]) -> [f32; 4] {
        let s = to_array8(sums8_256([v[0], v[1], v[2], v[3], v[0], v[1], v[2], v[3]]));
        [s[0], s[1], s[2], s[3]]
    }
    #[inline(always)]
    fn sums8(self, v: [__m256; 8]) -> [f32; 8] {
        to_array8(sums8_256(v))
    }
    #[inline(always)]
    fn store_sums8(self, v: [__m256; 8], scale: f32, d: &mut [f32]) {
        store_scaled8(sums8_256(v), scale, d)
    }
    #[inline(always)]
    fn first_eq(self, v: __m256, x: f32) -> Option<usize> {
        // SAFETY: the level's features (module docs); no memory access.
        let m = unsafe { _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(v, _mm256_set1_ps(x))) };
        (m != 0).then(|| m.trailing_zeros() as usize)
    }

    #[inline(always)]
    fn load_dup(self, s: &[f32]) -> __m256 {
        assert!(s.len() >= 4);
        // SAFETY: the level's features (module docs); `s` holds the vector (asserted).
        unsafe { dup_256(_mm_loadu_ps(s.as_ptr())) }
    }
    #[inline(always)]
    fn load_dup_part(self, s: &[f32]) -> __m256 {
        // SAFETY: the level's features (module docs); the mask enables only lanes in `s`.
        unsafe { dup_256(_mm_maskload_ps(s.as_ptr(), mask4(s.len()))) }
    }
    #[inline(always)]
    fn swap_pairs(self, v: __m256) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm256_permute_ps::<0b10_11_00_01>(v) }
    }
    #[inline(always)]
    fn fmaddsub(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm256_fmaddsub_ps(a, b, c) }
    }
}

/// `[c0, c0, c1, c1, c2, c2, c3, c3]`.
#[inline(always)]
fn dup_256(c: __m128) -> __m256 {
    // SAFETY: the level's features (module docs); no memory access.
    unsafe {
        let idx = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
        _mm256_permutevar8x32_ps(_mm256_castps128_ps256(c), idx)
    }
}

/// The sum of the two 256-bit halves.
#[inline(always)]
fn fold_512(v: __m512) -> __m256 {
    // SAFETY: the level's features (module docs); no memory access.
    unsafe {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        _mm256_add_ps(_mm512_castps512_ps256(v), hi)
    }
}

impl Simd for Avx512 {
    const LANES: usize = 16;
    const REGS: usize = 32;
    type V = __m512;

    #[inline(always)]
    fn zero(self) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    fn load(self, s: &[f32]) -> __m512 {
        assert!(s.len() >= 16);
        // SAFETY: the level's features (module docs); `s` holds the vector (asserted).
        unsafe { _mm512_loadu_ps(s.as_ptr()) }
    }
    #[inline(always)]
    fn load_part(self, s: &[f32]) -> __m512 {
        // SAFETY: the level's features (module docs); the mask enables only lanes in `s`.
        unsafe { _mm512_maskz_loadu_ps(kmask16(s.len()), s.as_ptr()) }
    }
    #[inline(always)]
    fn store(self, d: &mut [f32], v: __m512) {
        assert!(d.len() >= 16);
        // SAFETY: the level's features (module docs); `d` holds the vector (asserted).
        unsafe { _mm512_storeu_ps(d.as_mut_ptr(), v) }
    }
    #[inline(always)]
    fn store_part(self, d: &mut [f32], v: __m512) {
        // SAFETY: the level's features (module docs); the mask enables only lanes in `d`.
        unsafe { _mm512_mask_storeu_ps(d.as_mut_ptr(), kmask16(d.len()), v) }
    }
    #[inline(always)]
    fn load_f16(self, s: &[f16]) -> __m512 {
        assert!(s.len() >= 16);
        // SAFETY: the level's features (module docs); `s` holds the vector (asserted).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr() as *const __m256i)) }
    }
    #[inline(always)]
    fn load_f16_part(self, s: &[f16]) -> __m512 {
        // SAFETY: the level's features (module docs); the mask enables only lanes in `s`.
        unsafe {
            let h = _mm256_maskz_loadu_epi16(kmask16(s.len()), s.as_ptr() as *const i16);
            _mm512_cvtph_ps(h)
        }
    }
    #[inline(always)]
    fn load_bf16(self, s: &[bf16]) -> __m512 {
        assert!(s.len() >= 16);
        // SAFETY: the level's features (module docs); `s` holds the vector (asserted).
        unsafe { widen_bf16_512(_mm256_loadu_si256(s.as_ptr() as *const __m256i)) }
    }
    #[inline(always)]
    fn load_bf16_part(self, s: &[bf16]) -> __m512 {
        // SAFETY: the level's features (module docs); the mask enables only lanes in `s`.
        unsafe {
            let h = _mm256_maskz_loadu_epi16(kmask16(s.len()), s.as_ptr() as *const i16);
            widen_bf16_512(h)
        }
    }

    #[inline(always)]
    fn add(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    fn fma(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn fnma(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm512_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn max(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    fn abs(self, a: __m512) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm512_abs_ps(a) }
    }
    #[inline(always)]
    fn select_neg(self, x: __m512, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe {
            let neg = _mm512_cmplt_epi32_mask(_mm512_castps_si512(x), _mm512_setzero_si512());
            _mm512_mask_blend_ps(neg, b, a)
        }
    }
    #[inline(always)]
    fn zero_below(self, x: __m512, lim: f32, v: __m512) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe {
            let keep = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, _mm512_set1_ps(lim));
            _mm512_maskz_mov_ps(keep, v)
        }
    }
    #[inline(always)]
    fn round(self, a: __m512) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
    }
    #[inline(always)]
    fn exp2i(self, n: __m512) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe {
            let e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(e))
        }
    }

    #[inline(always)]
    fn sum(self, v: __m512) -> f32 {
        Avx2(()).sum(fold_512(v))
    }
    #[inline(always)]
    fn max_lane(self, v: __m512) -> f32 {
        // The halving tree of `maxps`, as at the other levels (which matters for ±0 only).
        // SAFETY: the level's features (module docs); no memory access.
        let m = unsafe {
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            _mm256_max_ps(_mm512_castps512_ps256(v), hi)
        };
        Avx2(()).max_lane(m)
    }
    /// The first half of [`Simd::sums8`] of the four vectors twice: the same tree.
    #[inline(always)]
    fn sums4(self, v: [__m512; 4]) -> [f32; 4] {
        let s = to_array8(sums8_512([v[0], v[1], v[2], v[3], v[0], v[1], v[2], v[3]]));
        [s[0], s[1], s[2], s[3]]
    }
    #[inline(always)]
    fn sums8(self, v: [__m512; 8]) -> [f32; 8] {
        to_array8(sums8_512(v))
    }
    #[inline(always)]
    fn store_sums8(self, v: [__m512; 8], scale: f32, d: &mut [f32]) {
        store_scaled8(sums8_512(v), scale, d)
    }
    #[inline(always)]
    fn first_eq(self, v: __m512, x: f32) -> Option<usize> {
        // SAFETY: the level's features (module docs); no memory access.
        let m = unsafe { _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(v, _mm512_set1_ps(x)) };
        (m != 0).then(|| m.trailing_zeros() as usize)
    }

    #[inline(always)]
    fn load_dup(self, s: &[f32]) -> __m512 {
        assert!(s.len() >= 8);
        // SAFETY: the level's features (module docs); `s` holds the vector (asserted).
        unsafe { dup_512(_mm256_loadu_ps(s.as_ptr())) }
    }
    #[inline(always)]
    fn load_dup_part(self, s: &[f32]) -> __m512 {
        let m = ((1u32 << s.len().min(8)) - 1) as __mmask8;
        // SAFETY: the level's features (module docs); the mask enables only lanes in `s`.
        unsafe { dup_512(_mm256_maskz_loadu_ps(m, s.as_ptr())) }
    }
    #[inline(always)]
    fn swap_pairs(self, v: __m512) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm512_permute_ps::<0b10_11_00_01>(v) }
    }
    #[inline(always)]
    fn fmaddsub(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: the level's features (module docs); no memory access.
        unsafe { _mm512_fmaddsub_ps(a, b, c) }
    }
}

/// bf16 bits to f32: each value shifted into the high half of a 32-bit lane.
#[inline(always)]
fn widen_bf16_512(h: __m256i) -> __m512 {
    // SAFETY: the level's features (module docs); no memory access.
    unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h))) }
}

/// `[c0, c0, c1, c1, .., c7, c7]`.
#[inline(always)]
fn dup_512(c: __m256) -> __m512 {
    // SAFETY: the level's features (module docs); no memory access.
    unsafe {
        let idx = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        _mm512_permutexvar_ps(idx, _mm512_castps256_ps512(c))
    }
}
