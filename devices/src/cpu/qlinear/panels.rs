//! Int8 Linears over weights in panels ([`flm_core::panels`]): every level sums each output
//! in one order, so that every level computes the same bits.
//!
//! For an output `y[i, j]` (input row `i`, weight row `j` with scale `s_j`) every kernel
//! forms, block `b` after block `b` of 32 columns, the exact integer `C_b = Σ q_w q_x` and
//! `acc = fma(C_b, a_b, acc)` from `acc = 0`, then `y = s_j · acc`: the order of the AMX
//! tile kernels and of the portable twin [`scalar`]. In a panel the 16 rows lie in the
//! lanes of a vector, so the SIMD kernels get `C_b` of 16 rows from 8 integer dot-product
//! steps of 4 columns each, with no horizontal sum; integer sums are exact, so the steps
//! may be split over several accumulators.

use flm_core::panels::{PANEL_ROWS, STEP};
use flm_core::quant::BLOCK;

use super::{Acts, QuantWeight};

/// Steps of one block.
const STEPS: usize = BLOCK / STEP;

impl<'a> QuantWeight<'a> {
    /// The panel that holds row `j` (a multiple of [`PANEL_ROWS`]) and its rows.
    pub fn panel(&self, j: usize) -> (&'a [u8], usize) {
        let m = self.bytes.len() / self.row_bytes;
        let r = (m - j).min(PANEL_ROWS);
        (&self.bytes[j * self.row_bytes..(j + r) * self.row_bytes], r)
    }
}

/// The scale of row `dr` of a panel of `r` rows.
fn scale(panel: &[u8], dr: usize) -> f32 {
    f32::from_le_bytes([
        panel[4 * dr],
        panel[4 * dr + 1],
        panel[4 * dr + 2],
        panel[4 * dr + 3],
    ])
}

/// The portable twin: `yt[(dj)·n + i]` for the rows of the panel at `j` and every input
/// row (natural order). Each block of the panel is first copied out as 16 rows of 32
/// codes, so that each `C_b` is a dot product of two runs of 32 bytes, which the compiler
/// vectorises (SSE2's `pmaddwd` at the portable x86 level).
pub(super) fn scalar(w: &QuantWeight<'_>, acts: &Acts, j: usize, yt: &mut [f32]) {
    let (panel, r) = w.panel(j);
    let n = acts.n;
    let codes = &panel[4 * r..];
    let mut acc = vec![0.0f32; n * r];
    // Row `dr`'s 32 codes of the block, 4 to a word.
    let mut words = [[[0u8; STEP]; STEPS]; PANEL_ROWS];
    for b in 0..acts.blocks {
        let block = &codes[b * STEPS * STEP * r..(b + 1) * STEPS * STEP * r];
        for (s, step) in block.chunks_exact(STEP * r).enumerate() {
            for (row, w) in words.iter_mut().zip(step.chunks_exact(STEP)) {
                row[s] = w.try_into().expect("4 codes");
            }
        }
        let rows: &[[u8; BLOCK]; PANEL_ROWS] = bytemuck::cast_ref(&words);
        for (i, acc) in acc.chunks_exact_mut(r).enumerate() {
            let x: &[i8; BLOCK] = acts.row_qs(i)[b * BLOCK..][..BLOCK]
                .try_into()
                .expect("a block of 32 codes");
            let a = acts.row_d(i)[b];
            for (acc, row) in acc.iter_mut().zip(rows) {
                let c: i32 = row
                    .iter()
                    .zip(x)
                    .map(|(&w, &x)| i32::from(w as i8) * i32::from(x))
                    .sum();
                *acc = (c as f32).mul_add(a, *acc);
            }
        }
    }
    for (i, acc) in acc.chunks_exact(r).enumerate() {
        for (dr, acc) in acc.iter().enumerate() {
            yt[dr * n + i] = scale(panel, dr) * acc;
        }
    }
}

/// See [`super::rows`] for int8 weights in panels (`j0` a multiple of [`PANEL_ROWS`]). The
/// full panels of the task go to one kernel call, so that dispatch and set-up are paid once
/// per task rather than once per panel; a last panel of fewer rows to the portable twin.
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
                super::neon::panel_i8(isa, w, acts, j0 + p * PANEL_ROWS, out)
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
    //! ymm of int32 lanes. VNNI's `vpdpbusd` multiplies unsigned by signed bytes: the codes
    //! are made unsigned by flipping their sign bit (`q + 128`), and `128 · Σ q_x` of the
    //! block ([`Acts::row_bsum`]) is subtracted from `C_b`, exactly. AVX2 multiplies
    //! `|q_w|` by `q_x` with the sign of `q_w` (`vpmaddubsw`, as ggml's
    //! `mul_sum_i8_pairs`).

    use std::arch::x86_64::*;

    use super::{scale, Acts, QuantWeight, BLOCK, PANEL_ROWS, STEP, STEPS};
    use crate::cpu::Isa;

    /// Bytes a decode stream is prefetched ahead of its loads, non-temporally (the row-major
    /// kernels' best distance; 2 KiB into every cache level measured no faster).
    const AHEAD: usize = 8192;

    /// One level's vectors of 16 lanes.
    trait Lanes: Copy {
        /// 16 int32 lanes.
        type I: Copy;
        /// 16 f32 lanes.
        type F: Copy;
        /// 64 bytes of weights, as the dot product reads them.
        type W: Copy;
        /// Subtracted from `C_b`, times the block's `Σ q_x`.
        const OFFSET: i32;
        unsafe fn zero_i() -> Self::I;
        unsafe fn zero_f() -> Self::F;
        unsafe fn load(p: *const u8) -> Self::W;
        /// `acc + Σ` of 4 products per lane, `x` holding 4 activation codes.
        unsafe fn dot(acc: Self::I, w: Self::W, x: i32) -> Self::I;
        unsafe fn add(a: Self::I, b: Self::I) -> Self::I;
        /// `fma(C_b, a, acc)` with `C_b = c − OFFSET · bsum`.
        unsafe fn fma(acc: Self::F, c: Self::I, bsum: i32, a: f32) -> Self::F;
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
        unsafe fn load(p: *const u8) -> __m512i {
            _mm512_xor_si512(_mm512_loadu_si512(p as *const _), _mm512_set1_epi8(-128))
        }
        #[inline(always)]
        unsafe fn dot(acc: __m512i, w: __m512i, x: i32) -> __m512i {
            _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(x))
        }
        #[inline(always)]
        unsafe fn add(a: __m512i, b: __m512i) -> __m512i {
            _mm512_add_epi32(a, b)
        }
        #[inline(always)]
        unsafe fn fma(acc: __m512, c: __m512i, bsum: i32, a: f32) -> __m512 {
            let c = _mm512_sub_epi32(c, _mm512_set1_epi32(Self::OFFSET * bsum));
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), _mm512_set1_ps(a), acc)
        }
        #[inline(always)]
        unsafe fn store(v: __m512, out: &mut [f32; PANEL_ROWS]) {
            _mm512_storeu_ps(out.as_mut_ptr(), v)
        }
    }

    /// AVX2 with VNNI (`Vnni == true`, AVX-VNNI) or without.
    #[derive(Clone, Copy)]
    struct Avx2<const VNNI: bool>;

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
        unsafe fn load(p: *const u8) -> [__m256i; 2] {
            let w = [
                _mm256_loadu_si256(p as *const _),
                _mm256_loadu_si256(p.add(32) as *const _),
            ];
            if VNNI {
                let flip = _mm256_set1_epi8(-128);
                [_mm256_xor_si256(w[0], flip), _mm256_xor_si256(w[1], flip)]
            } else {
                w
            }
        }
        #[inline(always)]
        unsafe fn dot(acc: [__m256i; 2], w: [__m256i; 2], x: i32) -> [__m256i; 2] {
            let x = _mm256_set1_epi32(x);
            let one = |acc: __m256i, w: __m256i| {
                if VNNI {
                    _mm256_dpbusd_avx_epi32(acc, w, x)
                } else {
                    let pairs =
                        _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
                    _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
                }
            };
            [one(acc[0], w[0]), one(acc[1], w[1])]
        }
        #[inline(always)]
        unsafe fn add(a: [__m256i; 2], b: [__m256i; 2]) -> [__m256i; 2] {
            [_mm256_add_epi32(a[0], b[0]), _mm256_add_epi32(a[1], b[1])]
        }
        #[inline(always)]
        unsafe fn fma(acc: [__m256; 2], c: [__m256i; 2], bsum: i32, a: f32) -> [__m256; 2] {
            let (off, a) = (_mm256_set1_epi32(Self::OFFSET * bsum), _mm256_set1_ps(a));
            let one =
                |acc, c| _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(c, off)), a, acc);
            [one(acc[0], c[0]), one(acc[1], c[1])]
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

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
    unsafe fn panels_avx512(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
        each_panel::<Avx512>(w, acts, j0, yt)
    }

    #[target_feature(enable = "avxvnni,avx2,fma")]
    unsafe fn panels_avxvnni(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
        each_panel::<Avx2<true>>(w, acts, j0, yt)
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn panels_avx2(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
        each_panel::<Avx2<false>>(w, acts, j0, yt)
    }

    #[inline(always)]
    unsafe fn each_panel<L: Lanes>(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
        for (p, out) in yt.chunks_exact_mut(PANEL_ROWS * acts.n).enumerate() {
            inputs::<L>(w, acts, j0 + p * PANEL_ROWS, out)
        }
    }

    /// Every input row in tiles of up to 4 (one row: decode, its steps over 4 chains).
    #[inline(always)]
    unsafe fn inputs<L: Lanes>(w: &QuantWeight<'_>, acts: &Acts, j: usize, yt: &mut [f32]) {
        let (panel, _) = w.panel(j);
        let n = acts.n;
        if n == 1 {
            return tile::<L, 1, 4>(panel, acts, 0, yt);
        }
        let mut i = 0;
        while i < n {
            match n - i {
                1 => tile::<L, 1, 2>(panel, acts, i, yt),
                2 => tile::<L, 2, 2>(panel, acts, i, yt),
                3 => tile::<L, 3, 1>(panel, acts, i, yt),
                _ => tile::<L, 4, 1>(panel, acts, i, yt),
            }
            i += 4;
        }
    }

    /// The panel × input rows `i..i + T`, each output's steps summed over `C` chains.
    #[inline(always)]
    unsafe fn tile<L: Lanes, const T: usize, const C: usize>(
        panel: &[u8],
        acts: &Acts,
        i: usize,
        yt: &mut [f32],
    ) {
        let n = acts.n;
        let qs: [*const i8; T] = std::array::from_fn(|t| acts.row_qs(i + t).as_ptr());
        let d: [&[f32]; T] = std::array::from_fn(|t| acts.row_d(i + t));
        let bsum: [&[i32]; T] = std::array::from_fn(|t| acts.row_bsum(i + t));
        let codes = panel.as_ptr().add(4 * PANEL_ROWS);
        let mut acc = [L::zero_f(); T];
        for b in 0..acts.blocks {
            let block = codes.add(b * STEPS * STEP * PANEL_ROWS);
            let mut c = [[L::zero_i(); C]; T];
            for s in 0..STEPS {
                let step = block.add(s * STEP * PANEL_ROWS);
                if T == 1 {
                    // Decode reads the panels as one stream, on into the next panel.
                    _mm_prefetch::<_MM_HINT_NTA>(step.wrapping_add(AHEAD) as *const i8);
                }
                let wv = L::load(step);
                for t in 0..T {
                    let x = (qs[t].add(b * BLOCK + s * STEP) as *const i32).read_unaligned();
                    c[t][s % C] = L::dot(c[t][s % C], wv, x);
                }
            }
            for t in 0..T {
                let mut sum = c[t][0];
                for part in &c[t][1..] {
                    sum = L::add(sum, *part);
                }
                acc[t] = L::fma(
                    acc[t],
                    sum,
                    *bsum[t].get_unchecked(b),
                    *d[t].get_unchecked(b),
                );
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            let mut out = [0.0f32; PANEL_ROWS];
            L::store(*acc, &mut out);
            for (dr, v) in out.iter().enumerate() {
                yt[dr * n + i + t] = scale(panel, dr) * v;
            }
        }
    }
}
