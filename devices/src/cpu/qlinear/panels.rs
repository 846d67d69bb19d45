//! Int8 and int4 Linears over weights in panels ([`flm_core::panels`]): every level sums
//! each output in one order, so that every level computes the same bits.
//!
//! For an output `y[i, j]` (input row `i`, weight row `j`) every kernel forms, block `b`
//! after block `b` of 32 columns, the exact integer `C_b = Σ q_w q_x` and, from `acc = 0`:
//! - int8 (row scale `s_j`): `acc = fma(C_b, a_b, acc)`, then `y = s_j · acc`;
//! - int4 (group `g` of `b`, scale `d_g`, minimum `m_g` as [`flm_core::quant::Int4Row`]
//!   forms it): `acc = fma(C_b, d_g · a_b, acc)`, then for each group in order
//!   `acc = fma(m_g, gsum_g, acc)` ([`Acts::row_gsum`]), and `y = acc`.
//!
//! That is the order of the AMX tile kernels and of the portable twin [`scalar`]. In a
//! panel the 16 rows lie in the lanes of a vector, so the SIMD kernels get `C_b` of 16 rows
//! from integer dot-product steps of 4 codes per lane, with no horizontal sum; integer
//! sums are exact, so the steps may be split over several accumulators.

use flm_core::panels::{PANEL_ROWS, STEP};
use flm_core::quant::BLOCK;

use std::cell::Cell;

use super::int4::Int4Params;
use super::{Acts, QuantWeight};
use crate::cpu::scratch;
use crate::cpu::simd::fma;

/// Int4 steps of one block: 8 codes per row each.
const STEPS4: usize = BLOCK / (2 * STEP);

impl<'a> QuantWeight<'a> {
    /// The panel that holds row `j` (a multiple of [`PANEL_ROWS`]) and its rows.
    pub fn panel(&self, j: usize) -> (&'a [u8], usize) {
        let m = self.bytes.len() / self.row_bytes;
        let r = (m - j).min(PANEL_ROWS);
        (&self.bytes[j * self.row_bytes..(j + r) * self.row_bytes], r)
    }
}

/// The portable twin: `yt[(dj)·n + i]` for the rows of the panel at `j` and every input
/// row (natural order). Each block of the panel is first copied out as `r` rows of 32
/// codes, so that each `C_b` is a dot product of two runs of 32 bytes, which the compiler
/// vectorises (SSE2's `pmaddwd` at the portable x86 level).
pub(super) fn scalar(w: &QuantWeight<'_>, acts: &Acts, j: usize, yt: &mut [f32]) {
    let (panel, r) = w.panel(j);
    let n = acts.n;
    scratch::with(&ACC, |acc| {
        acc.clear();
        acc.resize(n * r, 0.0);
        scalar_into(panel, r, w, acts, acc, yt)
    })
}

thread_local! {
    /// The accumulators of [`scalar`], reused across calls (see `scratch`).
    static ACC: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// [`scalar`] with its `n × r` accumulators `acc`, zeros.
fn scalar_into(
    panel: &[u8],
    r: usize,
    w: &QuantWeight<'_>,
    acts: &Acts,
    acc: &mut [f32],
    yt: &mut [f32],
) {
    let n = acts.n;
    let params = Int4Params::new(w.dtype, w.kp, r);
    let mut rows = [[0i8; BLOCK]; PANEL_ROWS];
    for b in 0..acts.blocks {
        if let Some(p) = params {
            for s in 0..STEPS4 {
                let step = &panel[p.layout.step(STEPS4 * b + s)..][..STEP * r];
                for (row, w) in rows.iter_mut().zip(step.chunks_exact(STEP)) {
                    for (q, &byte) in w.iter().enumerate() {
                        row[2 * STEP * s + q] = (byte & 0x0f) as i8;
                        row[2 * STEP * s + STEP + q] = (byte >> 4) as i8;
                    }
                }
            }
        } else {
            let block = &panel[4 * r + b * BLOCK * r..][..BLOCK * r];
            for (s, step) in block.chunks_exact(STEP * r).enumerate() {
                for (row, w) in rows.iter_mut().zip(step.chunks_exact(STEP)) {
                    for (dst, &q) in row[STEP * s..STEP * s + STEP].iter_mut().zip(w) {
                        *dst = q as i8;
                    }
                }
            }
        }
        let g = params.map_or(0, |p| b / p.per_group);
        // int8: `1 · a` is `a` exactly.
        let mut d = [1.0f32; PANEL_ROWS];
        if let Some(p) = params {
            for (dr, d) in d[..r].iter_mut().enumerate() {
                *d = p.scale_and_min(panel, g, dr).0;
            }
        }
        for (i, acc) in acc.chunks_exact_mut(r).enumerate() {
            let x: &[i8; BLOCK] = acts.row_qs(i)[b * BLOCK..][..BLOCK]
                .try_into()
                .expect("a block of 32 codes");
            let a = acts.row_d(i)[b];
            let mut c = [0.0f32; PANEL_ROWS];
            for (c, row) in c.iter_mut().zip(&rows[..r]) {
                let sum: i32 = row
                    .iter()
                    .zip(x)
                    .map(|(&w, &x)| i32::from(w) * i32::from(x))
                    .sum();
                *c = sum as f32;
            }
            // Apart from the integer sums, so that the rows' fused multiply-adds vectorise.
            for ((acc, c), d) in acc.iter_mut().zip(c).zip(d) {
                *acc = fma(c, d * a, *acc);
            }
        }
    }
    for (i, acc) in acc.chunks_exact(r).enumerate() {
        for (dr, &acc) in acc.iter().enumerate() {
            yt[dr * n + i] = match params {
                None => {
                    let s = &panel[4 * dr..4 * dr + 4];
                    f32::from_le_bytes([s[0], s[1], s[2], s[3]]) * acc
                }
                Some(p) => {
                    let mut acc = acc;
                    for (g, &gsum) in acts.row_gsum(i).iter().enumerate() {
                        acc = fma(p.scale_and_min(panel, g, dr).1, gsum, acc);
                    }
                    acc
                }
            };
        }
    }
}

/// See [`super::RowKernel`] for int8 and int4 weights in panels (`j0` a multiple of
/// [`PANEL_ROWS`]). The full panels of the task go to one kernel call, so that dispatch
/// and set-up are paid once per task rather than once per panel; a last panel of fewer
/// rows to the portable twin.
pub(super) fn rows(isa: super::Isa, w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
    let n = acts.n;
    let full = yt.len() / n / PANEL_ROWS;
    let (head, tail) = yt.split_at_mut(full * PANEL_ROWS * n);
    match isa {
        #[cfg(target_arch = "x86_64")]
        super::Isa::Avx2 | super::Isa::AvxVnni | super::Isa::Avx512 | super::Isa::Amx => {
            // SAFETY: `CpuDevice::with_isa` only accepts levels this CPU supports.
            unsafe { x86::panels(isa, w, acts, j0, head) }
        }
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        super::Isa::Neon | super::Isa::NeonDot => {
            for (p, out) in head.chunks_exact_mut(PANEL_ROWS * n).enumerate() {
                super::neon::panel(isa, w, acts, j0 + p * PANEL_ROWS, out)
            }
        }
        _ => {
            for (p, out) in head.chunks_exact_mut(PANEL_ROWS * n).enumerate() {
                scalar(w, acts, j0 + p * PANEL_ROWS, out)
            }
        }
    }
    if !tail.is_empty() {
        scalar(w, acts, j0 + full * PANEL_ROWS, tail);
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    //! AVX2, AVX-VNNI and AVX-512 VNNI panel kernels: a panel's 16 rows are one zmm or two
    //! ymm of int32 lanes. VNNI's `vpdpbusd` multiplies unsigned by signed bytes: int4
    //! codes `0..15` are unsigned already; int8 codes are made unsigned by flipping their
    //! sign bit (`q + 128`), and `128 · Σ q_x` of the block ([`Acts::row_bsum`]) is
    //! subtracted from `C_b`, exactly. AVX2 multiplies int4 codes by `q_x` with
    //! `vpmaddubsw` (`2·15·127` fits its i16) and `|q_w|` by `q_x` with the sign of `q_w`
    //! for int8 (as ggml's `mul_sum_i8_pairs`).

    use std::arch::x86_64::*;

    use super::{Acts, Int4Params, QuantWeight, BLOCK, PANEL_ROWS, STEP, STEPS4};
    use crate::cpu::Isa;

    /// Bytes a decode stream is prefetched ahead of its loads, non-temporally (the row-major
    /// kernels' best distance; 2 KiB into every cache level measured no faster).
    const AHEAD: usize = 8192;

    /// Int8 steps of one block: 4 codes per row each.
    const STEPS: usize = BLOCK / STEP;

    /// Bytes of one step of a panel: 16 rows × 4 bytes.
    const STEP_BYTES: usize = STEP * PANEL_ROWS;

    /// One level's vectors of 16 lanes.
    trait Lanes: Copy {
        /// 16 int32 lanes.
        type I: Copy;
        /// 16 f32 lanes.
        type F: Copy;
        /// 64 bytes of weights.
        type W: Copy;
        /// Subtracted from an int8 `C_b`, times the block's `Σ q_x`.
        const OFFSET: i32;
        unsafe fn zero_i() -> Self::I;
        unsafe fn zero_f() -> Self::F;
        /// A step of int8 codes, as [`Lanes::dot_i8`] reads them.
        unsafe fn load_i8(p: *const u8) -> Self::W;
        /// `acc + Σ` of 4 int8 products per lane, `x` holding 4 activation codes.
        unsafe fn dot_i8(acc: Self::I, w: Self::W, x: i32) -> Self::I;
        /// Whether [`Lanes::load_u4`] leaves the high nibbles in place (`16 · code`), which
        /// `vpdpbusd` sums without saturating: one instruction fewer per step, and the
        /// high codes' sum is then divided by 16, exactly.
        const HIGH_IN_PLACE: bool;
        /// A step of int4 codes as their low and high nibbles (see
        /// [`Lanes::HIGH_IN_PLACE`]).
        unsafe fn load_u4(p: *const u8) -> (Self::W, Self::W);
        /// `c / 16` of sums of high nibbles in place, exact.
        unsafe fn shr4(c: Self::I) -> Self::I;
        /// `acc + Σ` of 4 products of unsigned codes by activation codes per lane.
        unsafe fn dot_u8(acc: Self::I, w: Self::W, x: i32) -> Self::I;
        unsafe fn add(a: Self::I, b: Self::I) -> Self::I;
        /// `fma(C_b, a, acc)` with `C_b = c − OFFSET · bsum` (int8).
        unsafe fn fma_i8(acc: Self::F, c: Self::I, bsum: i32, a: f32) -> Self::F;
        /// `fma(c, s, acc)`.
        unsafe fn fma_c(acc: Self::F, c: Self::I, s: Self::F) -> Self::F;
        /// `fma(m, s, acc)`.
        unsafe fn fma_s(acc: Self::F, m: Self::F, s: f32) -> Self::F;
        /// 16 f16 numbers at `p` as f32.
        unsafe fn half(p: *const u8) -> Self::F;
        unsafe fn mul(v: Self::F, s: f32) -> Self::F;
        unsafe fn mulv(a: Self::F, b: Self::F) -> Self::F;
        unsafe fn store(v: Self::F, out: &mut [f32; PANEL_ROWS]);
    }

    #[derive(Clone, Copy)]
    struct Avx512;

    impl Lanes for Avx512 {
        type I = __m512i;
        type F = __m512;
        type W = __m512i;
        const OFFSET: i32 = 128;
        #[inline(always)]
        unsafe fn zero_i() -> __m512i {
            _mm512_setzero_si512()
        }
        #[inline(always)]
        unsafe fn zero_f() -> __m512 {
            _mm512_setzero_ps()
        }
        #[inline(always)]
        unsafe fn load_i8(p: *const u8) -> __m512i {
            _mm512_xor_si512(_mm512_loadu_si512(p as *const _), _mm512_set1_epi8(-128))
        }
        #[inline(always)]
        unsafe fn dot_i8(acc: __m512i, w: __m512i, x: i32) -> __m512i {
            _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(x))
        }
        const HIGH_IN_PLACE: bool = true;
        #[inline(always)]
        unsafe fn load_u4(p: *const u8) -> (__m512i, __m512i) {
            let v = _mm512_loadu_si512(p as *const _);
            (
                _mm512_and_si512(v, _mm512_set1_epi8(0x0f)),
                _mm512_and_si512(v, _mm512_set1_epi8(0xf0u8 as i8)),
            )
        }
        #[inline(always)]
        unsafe fn shr4(c: __m512i) -> __m512i {
            _mm512_srai_epi32::<4>(c)
        }
        #[inline(always)]
        unsafe fn dot_u8(acc: __m512i, w: __m512i, x: i32) -> __m512i {
            _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(x))
        }
        #[inline(always)]
        unsafe fn add(a: __m512i, b: __m512i) -> __m512i {
            _mm512_add_epi32(a, b)
        }
        #[inline(always)]
        unsafe fn fma_i8(acc: __m512, c: __m512i, bsum: i32, a: f32) -> __m512 {
            let c = _mm512_sub_epi32(c, _mm512_set1_epi32(Self::OFFSET * bsum));
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), _mm512_set1_ps(a), acc)
        }
        #[inline(always)]
        unsafe fn fma_c(acc: __m512, c: __m512i, s: __m512) -> __m512 {
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), s, acc)
        }
        #[inline(always)]
        unsafe fn fma_s(acc: __m512, m: __m512, s: f32) -> __m512 {
            _mm512_fmadd_ps(m, _mm512_set1_ps(s), acc)
        }
        #[inline(always)]
        unsafe fn half(p: *const u8) -> __m512 {
            _mm512_cvtph_ps(_mm256_loadu_si256(p as *const _))
        }
        #[inline(always)]
        unsafe fn mul(v: __m512, s: f32) -> __m512 {
            _mm512_mul_ps(v, _mm512_set1_ps(s))
        }
        #[inline(always)]
        unsafe fn mulv(a: __m512, b: __m512) -> __m512 {
            _mm512_mul_ps(a, b)
        }
        #[inline(always)]
        unsafe fn store(v: __m512, out: &mut [f32; PANEL_ROWS]) {
            _mm512_storeu_ps(out.as_mut_ptr(), v)
        }
    }

    /// AVX2 with VNNI (`VNNI == true`, AVX-VNNI) or without.
    #[derive(Clone, Copy)]
    struct Avx2<const VNNI: bool>;

    /// `f` on both halves.
    #[inline(always)]
    fn both<T, U>(a: [T; 2], f: impl Fn(T) -> U) -> [U; 2] {
        let [a0, a1] = a;
        [f(a0), f(a1)]
    }

    /// `f` on both halves of two pairs.
    #[inline(always)]
    fn zip2<T, U, V>(a: [T; 2], b: [U; 2], f: impl Fn(T, U) -> V) -> [V; 2] {
        let ([a0, a1], [b0, b1]) = (a, b);
        [f(a0, b0), f(a1, b1)]
    }

    impl<const VNNI: bool> Lanes for Avx2<VNNI> {
        type I = [__m256i; 2];
        type F = [__m256; 2];
        type W = [__m256i; 2];
        const OFFSET: i32 = if VNNI { 128 } else { 0 };
        #[inline(always)]
        unsafe fn zero_i() -> [__m256i; 2] {
            [_mm256_setzero_si256(); 2]
        }
        #[inline(always)]
        unsafe fn zero_f() -> [__m256; 2] {
            [_mm256_setzero_ps(); 2]
        }
        #[inline(always)]
        unsafe fn load_i8(p: *const u8) -> [__m256i; 2] {
            let w = [
                _mm256_loadu_si256(p as *const _),
                _mm256_loadu_si256(p.add(32) as *const _),
            ];
            if VNNI {
                both(w, |w| _mm256_xor_si256(w, _mm256_set1_epi8(-128)))
            } else {
                w
            }
        }
        #[inline(always)]
        unsafe fn dot_i8(acc: [__m256i; 2], w: [__m256i; 2], x: i32) -> [__m256i; 2] {
            if VNNI {
                return Self::dot_u8(acc, w, x);
            }
            let x = _mm256_set1_epi32(x);
            zip2(acc, w, |acc, w| {
                let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
                _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
            })
        }
        const HIGH_IN_PLACE: bool = VNNI;
        #[inline(always)]
        unsafe fn load_u4(p: *const u8) -> ([__m256i; 2], [__m256i; 2]) {
            let v = [
                _mm256_loadu_si256(p as *const _),
                _mm256_loadu_si256(p.add(32) as *const _),
            ];
            let low = _mm256_set1_epi8(0x0f);
            let high = if VNNI {
                both(v, |v| _mm256_and_si256(v, _mm256_set1_epi8(0xf0u8 as i8)))
            } else {
                // `vpmaddubsw` would saturate on `16 · code`.
                both(v, |v| _mm256_and_si256(_mm256_srli_epi16::<4>(v), low))
            };
            (both(v, |v| _mm256_and_si256(v, low)), high)
        }
        #[inline(always)]
        unsafe fn shr4(c: [__m256i; 2]) -> [__m256i; 2] {
            both(c, |c| _mm256_srai_epi32::<4>(c))
        }
        #[inline(always)]
        unsafe fn dot_u8(acc: [__m256i; 2], w: [__m256i; 2], x: i32) -> [__m256i; 2] {
            let x = _mm256_set1_epi32(x);
            zip2(acc, w, |acc, w| {
                if VNNI {
                    _mm256_dpbusd_avx_epi32(acc, w, x)
                } else {
                    let pairs = _mm256_maddubs_epi16(w, x);
                    _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
                }
            })
        }
        #[inline(always)]
        unsafe fn add(a: [__m256i; 2], b: [__m256i; 2]) -> [__m256i; 2] {
            zip2(a, b, |a, b| _mm256_add_epi32(a, b))
        }
        #[inline(always)]
        unsafe fn fma_i8(acc: [__m256; 2], c: [__m256i; 2], bsum: i32, a: f32) -> [__m256; 2] {
            let off = _mm256_set1_epi32(Self::OFFSET * bsum);
            Self::fma_c(
                acc,
                both(c, |c| _mm256_sub_epi32(c, off)),
                [_mm256_set1_ps(a); 2],
            )
        }
        #[inline(always)]
        unsafe fn fma_c(acc: [__m256; 2], c: [__m256i; 2], s: [__m256; 2]) -> [__m256; 2] {
            let [c0, c1] = both(c, |c| _mm256_cvtepi32_ps(c));
            [
                _mm256_fmadd_ps(c0, s[0], acc[0]),
                _mm256_fmadd_ps(c1, s[1], acc[1]),
            ]
        }
        #[inline(always)]
        unsafe fn fma_s(acc: [__m256; 2], m: [__m256; 2], s: f32) -> [__m256; 2] {
            let s = _mm256_set1_ps(s);
            zip2(acc, m, |acc, m| _mm256_fmadd_ps(m, s, acc))
        }
        #[inline(always)]
        unsafe fn half(p: *const u8) -> [__m256; 2] {
            [
                _mm256_cvtph_ps(_mm_loadu_si128(p as *const _)),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const _)),
            ]
        }
        #[inline(always)]
        unsafe fn mul(v: [__m256; 2], s: f32) -> [__m256; 2] {
            let s = _mm256_set1_ps(s);
            both(v, |v| _mm256_mul_ps(v, s))
        }
        #[inline(always)]
        unsafe fn mulv(a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
            zip2(a, b, |a, b| _mm256_mul_ps(a, b))
        }
        #[inline(always)]
        unsafe fn store(v: [__m256; 2], out: &mut [f32; PANEL_ROWS]) {
            _mm256_storeu_ps(out.as_mut_ptr(), v[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), v[1]);
        }
    }

    /// The full panels from row `j0` on × every input row, into `yt[(dj)·n + i]`.
    ///
    /// # Safety
    /// The CPU must support `isa`; `yt` must hold whole panels of 16 rows and `acts` be
    /// in natural order.
    pub(in crate::cpu::qlinear) unsafe fn panels(
        isa: Isa,
        w: &QuantWeight<'_>,
        acts: &Acts,
        j0: usize,
        yt: &mut [f32],
    ) {
        match isa {
            Isa::Avx512 | Isa::Amx => panels_avx512(w, acts, j0, yt),
            Isa::AvxVnni => panels_avxvnni(w, acts, j0, yt),
            _ => panels_avx2(w, acts, j0, yt),
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn panels_avx512(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
        each_panel::<Avx512>(w, acts, j0, yt)
    }

    #[target_feature(enable = "avxvnni,avx2,fma,f16c")]
    unsafe fn panels_avxvnni(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
        each_panel::<Avx2<true>>(w, acts, j0, yt)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn panels_avx2(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
        each_panel::<Avx2<false>>(w, acts, j0, yt)
    }

    #[inline(always)]
    unsafe fn each_panel<L: Lanes>(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
        let int4 = Int4Params::new(w.dtype, w.kp, PANEL_ROWS);
        for (p, out) in yt.chunks_exact_mut(PANEL_ROWS * acts.n).enumerate() {
            let (panel, _) = w.panel(j0 + p * PANEL_ROWS);
            inputs::<L>(panel, int4, acts, out)
        }
    }

    /// Every input row in tiles of up to 4 (one row: decode, its steps over 4 chains).
    #[inline(always)]
    unsafe fn inputs<L: Lanes>(
        panel: &[u8],
        int4: Option<Int4Params>,
        acts: &Acts,
        yt: &mut [f32],
    ) {
        let n = acts.n;
        let mut i = 0;
        while i < n {
            let t = (n - i).min(4);
            match (int4, t) {
                (None, 1) if n == 1 => tile_i8::<L, 1, 4>(panel, acts, i, yt),
                (None, 1) => tile_i8::<L, 1, 2>(panel, acts, i, yt),
                (None, 2) => tile_i8::<L, 2, 2>(panel, acts, i, yt),
                (None, 3) => tile_i8::<L, 3, 1>(panel, acts, i, yt),
                (None, _) => tile_i8::<L, 4, 1>(panel, acts, i, yt),
                (Some(p), 1) => tile_i4::<L, 1>(panel, p, acts, i, yt),
                (Some(p), 2) => tile_i4::<L, 2>(panel, p, acts, i, yt),
                (Some(p), 3) => tile_i4::<L, 3>(panel, p, acts, i, yt),
                (Some(p), _) => tile_i4::<L, 4>(panel, p, acts, i, yt),
            }
            i += t;
        }
    }

    /// Prefetches, in decode, the line [`AHEAD`] bytes past `step`: the panels are read as
    /// one stream, on into the next panel.
    #[inline(always)]
    unsafe fn prefetch<const T: usize>(step: *const u8) {
        if T == 1 {
            _mm_prefetch::<_MM_HINT_NTA>(step.wrapping_add(AHEAD) as *const i8);
        }
    }

    /// The sum of the `C` chains of each input.
    #[inline(always)]
    unsafe fn sums<L: Lanes, const T: usize, const C: usize>(c: &[[L::I; C]; T]) -> [L::I; T] {
        std::array::from_fn(|t| {
            let mut sum = c[t][0];
            for part in &c[t][1..] {
                sum = L::add(sum, *part);
            }
            sum
        })
    }

    /// Writes lane `dr` of `acc[t]` to `yt[dr·n + i + t]`, times `scale(dr)`.
    #[inline(always)]
    unsafe fn store<L: Lanes, const T: usize>(
        acc: &[L::F; T],
        n: usize,
        i: usize,
        yt: &mut [f32],
        scale: impl Fn(usize) -> f32,
    ) {
        for (t, acc) in acc.iter().enumerate() {
            let mut out = [0.0f32; PANEL_ROWS];
            L::store(*acc, &mut out);
            for (dr, v) in out.iter().enumerate() {
                yt[dr * n + i + t] = scale(dr) * v;
            }
        }
    }

    /// An int8 panel × input rows `i..i + T`, each output's steps summed over `C` chains.
    #[inline(always)]
    unsafe fn tile_i8<L: Lanes, const T: usize, const C: usize>(
        panel: &[u8],
        acts: &Acts,
        i: usize,
        yt: &mut [f32],
    ) {
        let qs: [*const i8; T] = std::array::from_fn(|t| acts.row_qs(i + t).as_ptr());
        let d: [&[f32]; T] = std::array::from_fn(|t| acts.row_d(i + t));
        let bsum: [&[i32]; T] = std::array::from_fn(|t| acts.row_bsum(i + t));
        let codes = panel.as_ptr().add(4 * PANEL_ROWS);
        let mut acc = [L::zero_f(); T];
        for b in 0..acts.blocks {
            let block = codes.add(b * STEPS * STEP_BYTES);
            let mut c = [[L::zero_i(); C]; T];
            for s in 0..STEPS {
                let step = block.add(s * STEP_BYTES);
                prefetch::<T>(step);
                let wv = L::load_i8(step);
                for t in 0..T {
                    let x = (qs[t].add(b * BLOCK + s * STEP) as *const i32).read_unaligned();
                    c[t][s % C] = L::dot_i8(c[t][s % C], wv, x);
                }
            }
            let sum = sums::<L, T, C>(&c);
            for t in 0..T {
                let (bs, a) = (*bsum[t].get_unchecked(b), *d[t].get_unchecked(b));
                acc[t] = L::fma_i8(acc[t], sum[t], bs, a);
            }
        }
        store::<L, T>(&acc, acts.n, i, yt, |dr| {
            let s = &panel[4 * dr..4 * dr + 4];
            f32::from_le_bytes([s[0], s[1], s[2], s[3]])
        })
    }

    /// An int4 panel × input rows `i..i + T`.
    #[inline(always)]
    unsafe fn tile_i4<L: Lanes, const T: usize>(
        panel: &[u8],
        p: Int4Params,
        acts: &Acts,
        i: usize,
        yt: &mut [f32],
    ) {
        let qs: [*const i8; T] = std::array::from_fn(|t| acts.row_qs(i + t).as_ptr());
        let d: [&[f32]; T] = std::array::from_fn(|t| acts.row_d(i + t));
        let (base, layout) = (panel.as_ptr(), p.layout);
        let mut acc = [L::zero_f(); T];
        let mut dg = L::zero_f();
        for b in 0..acts.blocks {
            if b % p.per_group == 0 {
                dg = L::half(base.add(layout.scales(b / p.per_group)));
            }
            // The block's 4 steps are adjacent within its group.
            let block = base.add(layout.step(STEPS4 * b));
            // The low and the high codes' sums apart (two chains per input).
            let mut c = [[L::zero_i(); 2]; T];
            for s in 0..STEPS4 {
                let step = block.add(s * STEP_BYTES);
                prefetch::<T>(step);
                let (lo, hi) = L::load_u4(step);
                for t in 0..T {
                    let x = qs[t].add(b * BLOCK + 2 * STEP * s) as *const i32;
                    let (xlo, xhi) = (x.read_unaligned(), x.add(1).read_unaligned());
                    c[t][0] = L::dot_u8(c[t][0], lo, xlo);
                    c[t][1] = L::dot_u8(c[t][1], hi, xhi);
                }
            }
            for t in 0..T {
                let high = if L::HIGH_IN_PLACE {
                    L::shr4(c[t][1])
                } else {
                    c[t][1]
                };
                let sum = L::add(c[t][0], high);
                acc[t] = L::fma_c(acc[t], sum, L::mul(dg, *d[t].get_unchecked(b)));
            }
        }
        let gsum: [&[f32]; T] = std::array::from_fn(|t| acts.row_gsum(i + t));
        for g in 0..p.groups {
            let mut m = L::mul(L::half(base.add(layout.mins(g))), p.factor);
            if p.times_scale {
                m = L::mulv(m, L::half(base.add(layout.scales(g))));
            }
            for t in 0..T {
                acc[t] = L::fma_s(acc[t], m, *gsum[t].get_unchecked(g));
            }
        }
        store::<L, T>(&acc, acts.n, i, yt, |_| 1.0)
    }
}
