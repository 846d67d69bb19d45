//! Linear layers with weights in runs of 32 values that are each a scale times 32 int8
//! codes, used as GGUF files store them: ggml's Q8_0 (the codes as stored), Q5_0 (5-bit
//! codes `q − 16`), IQ4_NL and IQ4_XS (4-bit indices into ggml's 16 non-linear levels) and
//! MXFP4 (4-bit E2M1 codes, as integers doubled, under a power-of-two scale). Each run's 32
//! codes are dotted against the int8 activation block of the same 32 columns in exact
//! integers, then scaled by `s · a` (ggml's `ggml_vec_dot_q8_0_q8_0`,
//! `ggml_vec_dot_q5_0_q8_0`, `ggml_vec_dot_iq4_nl_q8_0`, `ggml_vec_dot_iq4_xs_q8_K` and
//! `ggml_vec_dot_mxfp4_q8_0`, which look the 4-bit codes up in the same tables).
//!
//! **One order at every level.** An output keeps 8 f32 lanes. For run `b` (weight scale
//! `s_b`, activation scale `a_b`), lane `l` takes the exact integer
//! `c_{b,l} = Σ_{t<4} q_w[4l+t]·q_x[4l+t]` as `acc_l = fma(c_{b,l}, s_b·a_b, acc_l)`; after
//! the last run the lanes are summed by [`super::lane_sum8`]'s tree. That is what AVX2's
//! `vpmaddubsw` + `vpmaddwd`, VNNI's `vpdpbusd` and NEON's `sdot` (or `smull` and pairwise
//! adds) give lane by lane, so the portable twin here, AVX2, the VNNI levels (AVX-VNNI,
//! AVX-512 VNNI, AMX: `vpdpbusd` sums the same 4 products without the 16-bit step) and NEON
//! compute the same bits. On x86 the weight codes are made unsigned by `vpsignb`, as ggml
//! does (a pair of products is at most `2 · 128 · 127 < 2¹⁵`); a 4-bit code becomes its
//! level by `vpshufb` (`tbl` on NEON) from the 16-byte table; a 5-bit code is its nibble
//! with `0xf0` (−16) where its fifth bit is clear. Each run is decoded once for
//! up to [`TILE_INPUTS`] input rows; on x86 a tile also spans several weight rows (4 for
//! decode), so that the chains of independent outputs interleave. Each output depends on
//! its own rows only, in the same order whatever the tile (batch invariance).
//!
//! **Panels on x86-64.** There Q8_0, IQ4_NL, IQ4_XS and MXFP4 are packed at load into
//! panels of 16 rows ([`flm_core::panels::RunPanel`]), as llama.cpp repacks IQ4_NL into
//! interleaved rows (`ggml-cpu/repack.cpp`): the rows lie in the lanes of a vector, so one
//! `vpdpbusd` gives lane `l` of 16 (or 8) rows at once and each run's scales are one
//! vector (`x86_panels`), in the order above. The portable twin reads a panel row by row;
//! Q5_0 and the NEON kernels read rows.

use std::cell::Cell;

use flm_core::blocks::{
    blocks, e8m0_half, Block, BlockIQ4NL, BlockIQ4XS, BlockMXFP4, BlockQ5_0, BlockQ8_0, IQ4_LEVELS,
    MXFP4_LEVELS,
};
use flm_core::ggml::GgmlType;
use flm_core::panels::{has_panels, RunPanel};
use flm_core::quant::BLOCK;

use super::{lane_sum8, Acts, QuantWeight, RowKernel};
use crate::cpu::simd::fma;
use crate::cpu::{scratch, Isa};

/// Input rows that share one decoding of a weight run.
const TILE_INPUTS: usize = 4;

/// The 32 int8 codes of a run, as its block stores them.
#[derive(Clone, Copy)]
pub(super) enum Codes<'a> {
    /// The codes themselves (Q8_0).
    Bytes(&'a [i8; 32]),
    /// 16 bytes of 4-bit indices (value `i` in the low nibble of byte `i`, `i + 16` in the
    /// high one) into a table of 16 levels.
    Nibbles(&'a [u8; 16], &'static [i8; 16]),
    /// Q5_0's 5-bit codes less 16: their low 4 bits as 16 bytes of nibbles (in the order
    /// of [`Codes::Nibbles`]), bit 4 of value `i` in bit `i` of the u32.
    FiveBits(&'a [u8; 16], u32),
}

impl Codes<'_> {
    /// The 32 codes (the portable twin's decoding).
    #[inline(always)]
    fn get(self) -> [i8; 32] {
        match self {
            Codes::Bytes(q) => *q,
            Codes::Nibbles(qs, table) => std::array::from_fn(|t| {
                let byte = qs[t % 16];
                table[usize::from(if t < 16 { byte & 0x0f } else { byte >> 4 })]
            }),
            Codes::FiveBits(qs, qh) => std::array::from_fn(|t| {
                let byte = qs[t % 16];
                let low = if t < 16 { byte & 0x0f } else { byte >> 4 };
                let high = ((qh >> t) & 1) as u8;
                (low | (high << 4)) as i8 - 16
            }),
        }
    }
}

/// The scale of a run as its block stores it.
#[derive(Clone, Copy)]
pub(super) enum Scale {
    /// An f32 (MXFP4's power of two).
    F32(f32),
    /// An f16 (little-endian bits) times a small integer (1, or IQ4_XS's `sc − 32`): the
    /// product is exact in f32.
    F16(u16, i8),
}

impl Scale {
    /// The value (the portable conversion of the f16; every level converts exactly).
    #[inline(always)]
    fn get(self) -> f32 {
        match self {
            Scale::F32(s) => s,
            Scale::F16(bits, k) => half::f16::from_bits(bits).to_f32() * f32::from(k),
        }
    }
}

/// How a panel kernel reads the scales of a type's runs from the headers of a panel
/// ([`flm_core::panels::RunPanel`]).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum PanelScale {
    /// An f16 at the header's start: the 16 rows' scales are 16 adjacent f16.
    F16,
    /// MXFP4's E8M0 byte: 16 adjacent bytes.
    E8M0,
    /// IQ4_XS's header of 8 bytes, read row by row ([`BlockIQ4XS`]'s [`Runs::run`]).
    Iq4Xs,
}

/// A ggml block of [`Runs::RUNS`] runs of 32 values, each a scale times 32 int8 codes.
pub(super) trait Runs: Block {
    /// Runs per block.
    const RUNS: usize = Self::VALUES / 32;
    /// The 16 levels of 4-bit codes; `None`: a code per byte.
    #[cfg(target_arch = "x86_64")]
    const TABLE: Option<&'static [i8; 16]> = None;
    /// How the panel kernels read the scales.
    #[cfg(target_arch = "x86_64")]
    const SCALE: PanelScale = PanelScale::F16;

    /// The scale and the codes of run `r`: value `t` of the run is `scale · codes[t]`,
    /// exactly as [`Block::dequantize`] decodes it.
    fn run(&self, r: usize) -> (Scale, Codes<'_>);
}

impl Runs for BlockQ8_0 {
    #[inline(always)]
    fn run(&self, _: usize) -> (Scale, Codes<'_>) {
        (
            Scale::F16(u16::from_le_bytes(self.d.0), 1),
            Codes::Bytes(&self.qs),
        )
    }
}

impl Runs for BlockQ5_0 {
    #[inline(always)]
    fn run(&self, _: usize) -> (Scale, Codes<'_>) {
        (
            Scale::F16(u16::from_le_bytes(self.d.0), 1),
            Codes::FiveBits(&self.qs, u32::from_le_bytes(self.qh)),
        )
    }
}

impl Runs for BlockIQ4NL {
    #[cfg(target_arch = "x86_64")]
    const TABLE: Option<&'static [i8; 16]> = Some(&IQ4_LEVELS);
    #[inline(always)]
    fn run(&self, _: usize) -> (Scale, Codes<'_>) {
        let d = u16::from_le_bytes(self.d.0);
        (Scale::F16(d, 1), Codes::Nibbles(&self.qs, &IQ4_LEVELS))
    }
}

impl Runs for BlockMXFP4 {
    #[cfg(target_arch = "x86_64")]
    const TABLE: Option<&'static [i8; 16]> = Some(&MXFP4_LEVELS);
    #[cfg(target_arch = "x86_64")]
    const SCALE: PanelScale = PanelScale::E8M0;
    #[inline(always)]
    fn run(&self, _: usize) -> (Scale, Codes<'_>) {
        (
            Scale::F32(e8m0_half(self.e)),
            Codes::Nibbles(&self.qs, &MXFP4_LEVELS),
        )
    }
}

impl Runs for BlockIQ4XS {
    #[cfg(target_arch = "x86_64")]
    const TABLE: Option<&'static [i8; 16]> = Some(&IQ4_LEVELS);
    #[cfg(target_arch = "x86_64")]
    const SCALE: PanelScale = PanelScale::Iq4Xs;
    #[inline(always)]
    fn run(&self, r: usize) -> (Scale, Codes<'_>) {
        let scale = iq4xs_scale(self.d.0, self.scales_h, self.scales_l, r);
        let qs = self.qs[16 * r..16 * r + 16].try_into().expect("16 bytes");
        (scale, Codes::Nibbles(qs, &IQ4_LEVELS))
    }
}

/// The scale of run `r` of an IQ4_XS block from its header: `d · (sc_r − 32)`, an f16 times
/// a 6-bit integer, exact in f32, as gguf-py computes it.
#[inline(always)]
fn iq4xs_scale(d: [u8; 2], scales_h: [u8; 2], scales_l: [u8; 4], r: usize) -> Scale {
    let low = (scales_l[r / 2] >> (4 * (r % 2))) & 0x0f;
    let high = ((u16::from_le_bytes(scales_h) >> (2 * r)) & 0x03) as u8;
    Scale::F16(u16::from_le_bytes(d), ((low | (high << 4)) as i8) - 32)
}

/// The row kernel of a format of runs, `None` for the other ggml types.
pub(super) fn kernel(ty: GgmlType) -> Option<RowKernel> {
    Some(match ty {
        GgmlType::Q8_0 => rows::<BlockQ8_0>,
        GgmlType::Q5_0 => rows::<BlockQ5_0>,
        GgmlType::IQ4NL => rows::<BlockIQ4NL>,
        GgmlType::IQ4XS => rows::<BlockIQ4XS>,
        GgmlType::MXFP4 => rows::<BlockMXFP4>,
        _ => return None,
    })
}

/// See [`super::RowKernel`], for weights of blocks `B` and [`Acts`] in natural order, in
/// panels where this build reads `B` so ([`flm_core::panels::has_panels`]), in rows
/// otherwise.
fn rows<B: Runs>(isa: Isa, w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
    if has_panels(w.dtype) {
        return panel_rows::<B>(isa, w, acts, j0, yt);
    }
    match isa {
        // SAFETY (each arm): `CpuDevice::with_isa` only accepts levels this CPU supports;
        // every x86 level above the portable one has AVX2, FMA and F16C, the VNNI ones
        // `vpdpbusd`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::rows_avx2::<B>(w, acts, j0, yt) },
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni => unsafe { x86::rows_avxvnni::<B>(w, acts, j0, yt) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Amx => unsafe { x86::rows_avx512::<B>(w, acts, j0, yt) },
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        Isa::Neon | Isa::NeonDot => {
            super::neon::rows_with::<neon::RunsKernel<B>>(isa, w, acts, j0, yt)
        }
        _ => portable::<B>(w, acts, j0, yt),
    }
}

/// See [`rows`], for weights in panels (`j0` a multiple of
/// [`flm_core::panels::PANEL_ROWS`]): the full panels to the x86 panel kernels, a last panel
/// of fewer rows (and every panel at the portable level) to the portable twin, row by row.
fn panel_rows<B: Runs>(isa: Isa, w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
    let n = acts.n;
    let done = match (isa, RunPanel::new(w.dtype)) {
        // SAFETY: `CpuDevice::with_isa` only accepts levels this CPU supports; every x86
        // level above the portable one has AVX2, FMA and F16C, the VNNI ones `vpdpbusd`.
        #[cfg(target_arch = "x86_64")]
        (Isa::Avx2 | Isa::AvxVnni | Isa::Avx512 | Isa::Amx, Some(layout)) => {
            let rows = flm_core::panels::PANEL_ROWS;
            let full = yt.len() / n / rows * rows;
            let (head, _) = yt.split_at_mut(full * n);
            unsafe { x86_panels::panels::<B>(isa, layout, w, acts, j0, head) };
            full
        }
        _ => 0,
    };
    let (m, cols) = (w.bytes.len() / w.row_bytes, w.kp);
    scratch::with(&ROW, |row| {
        row.resize(w.row_bytes, 0);
        for (dj, ys) in yt.chunks_exact_mut(n).enumerate().skip(done) {
            flm_core::panels::row(w.dtype, w.bytes, m, cols, j0 + dj, row)
                .expect("linear checked the weight's shape");
            portable_row::<B>(row, acts, ys);
        }
    })
}

thread_local! {
    /// The row-major bytes of one row of a panel, for the portable twin (see `scratch`).
    static ROW: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// The portable twin, in the order of the module docs.
fn portable<B: Runs>(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
    for (dj, ys) in yt.chunks_exact_mut(acts.n).enumerate() {
        portable_row::<B>(w.row(j0 + dj), acts, ys);
    }
}

/// [`portable`] for one weight row (its row-major bytes) × every input row, into `ys`.
fn portable_row<B: Runs>(row: &[u8], acts: &Acts, ys: &mut [f32]) {
    for (t, out) in ys.chunks_mut(TILE_INPUTS).enumerate() {
        let i0 = t * TILE_INPUTS;
        let mut acc = [[0.0f32; 8]; TILE_INPUTS];
        for (i, block) in blocks::<B>(row).iter().enumerate() {
            for r in 0..B::RUNS {
                let b = i * B::RUNS + r;
                let (d, codes) = block.run(r);
                let (d, codes) = (d.get(), codes.get());
                for (k, acc) in acc[..out.len()].iter_mut().enumerate() {
                    let x = &acts.row_qs(i0 + k)[b * BLOCK..(b + 1) * BLOCK];
                    let s = d * acts.row_d(i0 + k)[b];
                    let c: [f32; 8] = std::array::from_fn(|l| {
                        let lane =
                            (4 * l..4 * l + 4).map(|t| i32::from(codes[t]) * i32::from(x[t]));
                        lane.sum::<i32>() as f32
                    });
                    // Apart from the integer sums, so that the lanes' fused
                    // multiply-adds vectorise.
                    for (acc, c) in acc.iter_mut().zip(c) {
                        *acc = fma(c, s, *acc);
                    }
                }
            }
        }
        for (y, acc) in out.iter_mut().zip(acc) {
            *y = lane_sum8(acc);
        }
    }
}

#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
mod neon {
    use std::arch::aarch64::*;
    use std::marker::PhantomData;

    use super::super::neon::{dot4, DotKernel};
    use super::{blocks, Acts, Codes, QuantWeight, Runs, BLOCK, TILE_INPUTS};

    /// The kernel of both NEON levels for blocks `B` (see [`super::rows`]), run by
    /// [`rows_with`](super::super::neon::rows_with).
    pub(in super::super) struct RunsKernel<B>(PhantomData<B>);

    /// The 32 codes of a run as two vectors of 16 (values 0..16, 16..32).
    #[inline(always)]
    fn load(codes: Codes<'_>) -> [int8x16_t; 2] {
        // SAFETY: NEON (every aarch64 target); each load reads 16 bytes of a 32- or
        // 16-byte array.
        unsafe {
            match codes {
                Codes::Bytes(q) => [vld1q_s8(q.as_ptr()), vld1q_s8(q.as_ptr().add(16))],
                Codes::Nibbles(qs, table) => {
                    let q = vld1q_u8(qs.as_ptr());
                    let table = vld1q_s8(table.as_ptr());
                    let lo = vandq_u8(q, vdupq_n_u8(0x0f));
                    let hi = vshrq_n_u8::<4>(q);
                    [vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi)]
                }
                Codes::FiveBits(qs, qh) => {
                    let q = vld1q_u8(qs.as_ptr());
                    let lo = vandq_u8(q, vdupq_n_u8(0x0f));
                    let hi = vshrq_n_u8::<4>(q);
                    // `set(which)`: byte t of `qh`'s byte `which[t]`, tested (`vtst`) against
                    // `1 << (t % 8)`, marks the values whose fifth bit is set.
                    const FIRST: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
                    const SECOND: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
                    const BITS: [u8; 16] =
                        [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
                    let bytes = vreinterpretq_u8_u32(vdupq_n_u32(qh));
                    let bits = vld1q_u8(BITS.as_ptr());
                    let set = |which: &[u8; 16]| {
                        vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(which.as_ptr())), bits)
                    };
                    let minus16 = vdupq_n_u8(0xf0);
                    [
                        vreinterpretq_s8_u8(vorrq_u8(lo, vbicq_u8(minus16, set(&FIRST)))),
                        vreinterpretq_s8_u8(vorrq_u8(hi, vbicq_u8(minus16, set(&SECOND)))),
                    ]
                }
            }
        }
    }

    impl<B: Runs> DotKernel for RunsKernel<B> {
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
                        for (i, block) in blocks::<B>(row).iter().enumerate() {
                            for r in 0..B::RUNS {
                                let b = i * B::RUNS + r;
                                let (d, codes) = block.run(r);
                                let d = d.get();
                                let [w0, w1] = load(codes);
                                for (k, acc) in acc[..out.len()].iter_mut().enumerate() {
                                    let x = &acts.row_qs(i0 + k)[b * BLOCK..(b + 1) * BLOCK];
                                    let x0 = vld1q_s8(x.as_ptr());
                                    let x1 = vld1q_s8(x.as_ptr().add(16));
                                    let s = vdupq_n_f32(d * acts.row_d(i0 + k)[b]);
                                    let c0 = vcvtq_f32_s32(dot4::<DOT>(zero, w0, x0));
                                    let c1 = vcvtq_f32_s32(dot4::<DOT>(zero, w1, x1));
                                    acc[0] = vfmaq_f32(acc[0], c0, s);
                                    acc[1] = vfmaq_f32(acc[1], c1, s);
                                }
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
mod x86 {
    use std::arch::x86_64::*;

    use super::super::x86::hsum256;
    use super::{blocks, Acts, Codes, QuantWeight, Runs, Scale, BLOCK, TILE_INPUTS};

    /// Bytes a decode tile's weight rows are prefetched ahead of its loads, non-temporally:
    /// the int panels' distance, also the fastest here (docs/benchmarks.md, gpt-oss-20b).
    const AHEAD: usize = 8192;

    /// The 32 codes of a run in one vector.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline(always)]
    unsafe fn load(codes: Codes<'_>) -> __m256i {
        // SAFETY (whole body): AVX2 (the caller's); the loads read the 32 or 16 bytes of
        // the arrays.
        unsafe {
            match codes {
                Codes::Bytes(q) => _mm256_loadu_si256(q.as_ptr() as *const __m256i),
                Codes::Nibbles(qs, table) => {
                    let q = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
                    let mask = _mm_set1_epi8(0x0f);
                    let lo = _mm_and_si128(q, mask);
                    let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), mask);
                    let table = _mm_loadu_si128(table.as_ptr() as *const __m128i);
                    let table = _mm256_broadcastsi128_si256(table);
                    _mm256_shuffle_epi8(table, _mm256_set_m128i(hi, lo))
                }
                Codes::FiveBits(qs, qh) => {
                    let q = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
                    let mask = _mm_set1_epi8(0x0f);
                    let lo = _mm_and_si128(q, mask);
                    let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), mask);
                    // Byte t of `spread` is byte t / 8 of `qh` (`vpshufb` indexes within
                    // each 128-bit lane, and each lane holds `qh` in its first 4 bytes);
                    // against `1 << (t % 8)` it marks the values whose fifth bit is set.
                    let spread = _mm256_shuffle_epi8(
                        _mm256_set1_epi32(qh as i32),
                        _mm256_set_epi64x(
                            0x0303_0303_0303_0303,
                            0x0202_0202_0202_0202,
                            0x0101_0101_0101_0101,
                            0,
                        ),
                    );
                    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
                    let minus16 = _mm256_set1_epi8(0xf0u8 as i8);
                    _mm256_or_si256(_mm256_set_m128i(hi, lo), _mm256_andnot_si256(set, minus16))
                }
            }
        }
    }

    /// The exact sums of 4 neighbouring products of `unsigned · x` into 8 i32 lanes.
    trait Dot4 {
        /// # Safety
        /// The CPU must have the instructions of the implementation.
        unsafe fn dot4(unsigned: __m256i, x: __m256i) -> __m256i;
    }

    /// `vpmaddubsw` into pairs (no pair saturates, see the module docs), then `vpmaddwd`.
    struct Avx2;
    /// AVX-VNNI's `vpdpbusd`.
    struct AvxVnni;
    /// AVX-512 VNNI's `vpdpbusd` on 256-bit vectors.
    struct Avx512Vnni;

    impl Dot4 for Avx2 {
        #[inline(always)]
        unsafe fn dot4(unsigned: __m256i, x: __m256i) -> __m256i {
            // SAFETY: AVX2 (the caller's); registers only.
            unsafe {
                let pairs = _mm256_maddubs_epi16(unsigned, x);
                _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
            }
        }
    }

    impl Dot4 for AvxVnni {
        #[inline(always)]
        unsafe fn dot4(unsigned: __m256i, x: __m256i) -> __m256i {
            // SAFETY: AVX-VNNI (the caller's); registers only.
            unsafe { _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), unsigned, x) }
        }
    }

    impl Dot4 for Avx512Vnni {
        #[inline(always)]
        unsafe fn dot4(unsigned: __m256i, x: __m256i) -> __m256i {
            // SAFETY: AVX-512 VNNI and VL (the caller's); registers only.
            unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), unsigned, x) }
        }
    }

    /// The value of a run's scale: an f16 converted by F16C (exactly, as the portable
    /// conversion), times its integer.
    ///
    /// # Safety
    /// The CPU must have F16C.
    #[inline(always)]
    unsafe fn scale(s: Scale) -> f32 {
        match s {
            Scale::F32(v) => v,
            // SAFETY: F16C (the caller's); registers only.
            Scale::F16(bits, k) => unsafe {
                _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits)))) * f32::from(k)
            },
        }
    }

    /// See [`super::rows`]: tiles of `R` weight rows × up to `T` input rows, one f32
    /// vector per output holding the 8 lanes of the module docs. Several rows at once
    /// give the fused multiply-adds of independent outputs to interleave: an output's own
    /// chain is sequential over its runs, by the order of the module docs.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA, F16C and the instructions of `D`.
    #[inline(always)]
    unsafe fn tile<B: Runs, D: Dot4, const R: usize, const T: usize>(
        w: &QuantWeight<'_>,
        acts: &Acts,
        (j, i0, t): (usize, usize, usize),
        out: &mut [[f32; T]; R],
    ) {
        // SAFETY (whole body): the caller's instructions; every load reads a slice of 32
        // bytes.
        unsafe {
            let rows: [&[B]; R] = std::array::from_fn(|r| blocks::<B>(w.row(j + r)));
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            for i in 0..rows[0].len() {
                for run in 0..B::RUNS {
                    let b = i * B::RUNS + run;
                    // A loop, not `array::from_fn`: its closure would not inline into
                    // this function's target features.
                    let mut xs = [(_mm256_setzero_si256(), 0.0f32); T];
                    for (k, x) in xs.iter_mut().enumerate() {
                        let k = (i0 + k).min(i0 + t - 1);
                        let q = &acts.row_qs(k)[b * BLOCK..(b + 1) * BLOCK];
                        *x = (
                            _mm256_loadu_si256(q.as_ptr() as *const __m256i),
                            acts.row_d(k)[b],
                        );
                    }
                    for (row, acc) in rows.iter().zip(acc.iter_mut()) {
                        if T == 1 && run == 0 {
                            // Decode streams each row once: fetch ahead of the loads.
                            let ahead = std::ptr::from_ref(&row[i]).wrapping_byte_add(AHEAD);
                            _mm_prefetch::<_MM_HINT_NTA>(ahead.cast::<i8>());
                        }
                        let (d, codes) = row[i].run(run);
                        let d = scale(d);
                        let wq = load(codes);
                        let unsigned = _mm256_sign_epi8(wq, wq);
                        // All T lanes (a short tile repeats its last row) so that the
                        // loop unrolls into registers.
                        for (acc, &(xq, a)) in acc.iter_mut().zip(&xs) {
                            let sums = D::dot4(unsigned, _mm256_sign_epi8(xq, wq));
                            let s = _mm256_set1_ps(d * a);
                            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), s, *acc);
                        }
                    }
                }
            }
            for (out, acc) in out.iter_mut().zip(acc) {
                for (y, acc) in out.iter_mut().zip(acc) {
                    *y = hsum256(acc);
                }
            }
        }
    }

    /// See [`super::rows`]: decode (one input row) in tiles of 4 weight rows, two input
    /// rows in tiles of 2, more in tiles of one weight row × 4 input rows.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA, F16C and the instructions of `D`.
    #[inline(always)]
    unsafe fn rows_with<B: Runs, D: Dot4>(
        w: &QuantWeight<'_>,
        acts: &Acts,
        j0: usize,
        yt: &mut [f32],
    ) {
        let n = acts.n;
        let m = yt.len() / n;
        // SAFETY (whole body): the caller's instructions.
        unsafe {
            let mut j = 0;
            match n {
                1 => {
                    while j + 4 <= m {
                        let mut out = [[0.0f32; 1]; 4];
                        tile::<B, D, 4, 1>(w, acts, (j0 + j, 0, 1), &mut out);
                        for (y, o) in yt[j..j + 4].iter_mut().zip(out) {
                            *y = o[0];
                        }
                        j += 4;
                    }
                }
                2 => {
                    while j + 2 <= m {
                        let mut out = [[0.0f32; 2]; 2];
                        tile::<B, D, 2, 2>(w, acts, (j0 + j, 0, 2), &mut out);
                        yt[2 * j..2 * j + 4].copy_from_slice(out.as_flattened());
                        j += 2;
                    }
                }
                _ => {
                    while j + 2 <= m {
                        for i0 in (0..n).step_by(TILE_INPUTS) {
                            let t = (n - i0).min(TILE_INPUTS);
                            let mut out = [[0.0f32; TILE_INPUTS]; 2];
                            tile::<B, D, 2, TILE_INPUTS>(w, acts, (j0 + j, i0, t), &mut out);
                            for (r, out) in out.iter().enumerate() {
                                let y = (j + r) * n + i0;
                                yt[y..y + t].copy_from_slice(&out[..t]);
                            }
                        }
                        j += 2;
                    }
                }
            }
            for j in j..m {
                for i0 in (0..n).step_by(TILE_INPUTS) {
                    let t = (n - i0).min(TILE_INPUTS);
                    let mut out = [[0.0f32; TILE_INPUTS]; 1];
                    tile::<B, D, 1, TILE_INPUTS>(w, acts, (j0 + j, i0, t), &mut out);
                    yt[j * n + i0..j * n + i0 + t].copy_from_slice(&out[0][..t]);
                }
            }
        }
    }

    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows_avx2<B: Runs>(
        w: &QuantWeight<'_>,
        acts: &Acts,
        j0: usize,
        yt: &mut [f32],
    ) {
        // SAFETY: this function's features.
        unsafe { rows_with::<B, Avx2>(w, acts, j0, yt) }
    }

    /// # Safety
    /// The CPU must have AVX-VNNI, AVX2, FMA and F16C.
    #[target_feature(enable = "avxvnni,avx2,fma,f16c")]
    pub(super) unsafe fn rows_avxvnni<B: Runs>(
        w: &QuantWeight<'_>,
        acts: &Acts,
        j0: usize,
        yt: &mut [f32],
    ) {
        // SAFETY: this function's features.
        unsafe { rows_with::<B, AvxVnni>(w, acts, j0, yt) }
    }

    /// # Safety
    /// The CPU must have AVX-512 F, VL and VNNI, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn rows_avx512<B: Runs>(
        w: &QuantWeight<'_>,
        acts: &Acts,
        j0: usize,
        yt: &mut [f32],
    ) {
        // SAFETY: this function's features.
        unsafe { rows_with::<B, Avx512Vnni>(w, acts, j0, yt) }
    }
}

/// The x86 kernels of the types of runs in panels ([`flm_core::panels::RunPanel`]): the rows
/// of a panel lie in the lanes of a vector (16 in a zmm; 8 in a ymm, in two passes over the
/// panel), so that one integer dot-product step gives lane `l` of the module docs' order
/// for every row at once, with no horizontal sum: the same bits as the portable twin.
/// `vpdpbusd` multiplies unsigned by signed bytes: the VNNI levels look the codes up `+128`
/// (Q8_0's by flipping their sign bit) and subtract `128 · Σ q_x` of the lane's 4
/// activation codes, exactly; AVX2 multiplies `|q_w|` by `q_x` with the sign of `q_w`
/// (ggml's `mul_sum_i8_pairs`; a pair is at most `2 · 128 · 127 < 2¹⁵`).
#[cfg(target_arch = "x86_64")]
pub(super) use x86_panels::reads_step_biases;

#[cfg(target_arch = "x86_64")]
mod x86_panels {
    use flm_core::panels::{RunPanel, PANEL_ROWS, STEP};
    use std::arch::x86_64::*;

    use super::{Acts, PanelScale, QuantWeight, Runs, BLOCK};
    use crate::cpu::Isa;

    /// Bytes a decode stream is prefetched ahead of its loads, non-temporally (the int
    /// panels' distance).
    const AHEAD: usize = 8192;

    /// The lanes of one pass over a panel: [`PanelLanes::ROWS`] of its rows.
    trait PanelLanes {
        /// Rows in a vector.
        const ROWS: usize;
        /// Whether weight codes are stored `+ 128` (for `vpdpbusd`), their sums then starting
        /// from the activations' step bias ([`Acts::row_step_bias`]).
        const BIASED: bool;
        /// `ROWS × 4` codes.
        type W: Copy;
        /// `ROWS` int32 lanes.
        type I: Copy;
        /// `ROWS` f32 lanes.
        type F: Copy;
        unsafe fn zero() -> Self::F;
        unsafe fn zero_i() -> Self::I;
        /// The `ROWS × 4` int8 codes at `p`, as [`PanelLanes::dot`] takes them.
        unsafe fn codes(p: *const u8) -> Self::W;
        /// The 16 levels of 4-bit codes, as [`PanelLanes::dot`] takes them.
        unsafe fn table(levels: &[i8; 16]) -> Self::W;
        /// The `ROWS × 4` bytes of nibbles at `p`, their low and their high nibbles looked
        /// up in `table`.
        unsafe fn lookup(p: *const u8, table: Self::W) -> (Self::W, Self::W);
        /// The exact sum of 4 products per lane: the lane's codes by the 4 codes of `x`,
        /// whose step bias is `bias`.
        unsafe fn dot(w: Self::W, x: i32, bias: i32) -> Self::I;
        /// `fma(c, s, acc)`.
        unsafe fn fma(acc: Self::F, c: Self::I, s: Self::F) -> Self::F;
        /// `ROWS` f16 at `p`, exactly.
        unsafe fn half(p: *const u8) -> Self::F;
        /// `ROWS` E8M0 bytes at `p` as [`flm_core::blocks::e8m0_half`] decodes them.
        unsafe fn e8m0(p: *const u8) -> Self::F;
        /// `ROWS` u16 at `p`, widened.
        unsafe fn u16s(p: *const u8) -> Self::I;
        /// `ROWS` u32 at `p`.
        unsafe fn u32s(p: *const u8) -> Self::I;
        /// IQ4_XS's scale of run `run` (see [`super::iq4xs_scale`]) of `ROWS` rows from
        /// their `d`, `scales_h` and `scales_l`: `d · (sc − 32)`, exact.
        unsafe fn iq4xs(d: Self::F, scales_h: Self::I, scales_l: Self::I, run: usize) -> Self::F;
        unsafe fn mul(v: Self::F, s: f32) -> Self::F;
        unsafe fn add(a: Self::F, b: Self::F) -> Self::F;
        unsafe fn store(v: Self::F, p: *mut f32);
    }

    /// AVX-512 VNNI: 16 rows in a zmm.
    struct Avx512;

    impl PanelLanes for Avx512 {
        const ROWS: usize = 16;
        const BIASED: bool = true;
        type W = __m512i;
        type I = __m512i;
        type F = __m512;
        #[inline(always)]
        unsafe fn zero() -> __m512 {
            _mm512_setzero_ps()
        }
        #[inline(always)]
        unsafe fn zero_i() -> __m512i {
            _mm512_setzero_si512()
        }
        #[inline(always)]
        unsafe fn codes(p: *const u8) -> __m512i {
            _mm512_xor_si512(_mm512_loadu_si512(p as *const _), _mm512_set1_epi8(-128))
        }
        #[inline(always)]
        unsafe fn table(levels: &[i8; 16]) -> __m512i {
            let t = _mm512_broadcast_i32x4(_mm_loadu_si128(levels.as_ptr() as *const _));
            _mm512_xor_si512(t, _mm512_set1_epi8(-128))
        }
        #[inline(always)]
        unsafe fn lookup(p: *const u8, table: __m512i) -> (__m512i, __m512i) {
            let v = _mm512_loadu_si512(p as *const _);
            let mask = _mm512_set1_epi8(0x0f);
            let lo = _mm512_and_si512(v, mask);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), mask);
            (
                _mm512_shuffle_epi8(table, lo),
                _mm512_shuffle_epi8(table, hi),
            )
        }
        #[inline(always)]
        unsafe fn dot(w: __m512i, x: i32, bias: i32) -> __m512i {
            _mm512_dpbusd_epi32(_mm512_set1_epi32(bias), w, _mm512_set1_epi32(x))
        }
        #[inline(always)]
        unsafe fn fma(acc: __m512, c: __m512i, s: __m512) -> __m512 {
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), s, acc)
        }
        #[inline(always)]
        unsafe fn half(p: *const u8) -> __m512 {
            _mm512_cvtph_ps(_mm256_loadu_si256(p as *const _))
        }
        #[inline(always)]
        unsafe fn e8m0(p: *const u8) -> __m512 {
            let e = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const _));
            let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1)));
            let subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
            let is_normal = _mm512_cmpge_epu32_mask(e, _mm512_set1_epi32(2));
            _mm512_castsi512_ps(_mm512_mask_blend_epi32(is_normal, subnormal, normal))
        }
        #[inline(always)]
        unsafe fn u16s(p: *const u8) -> __m512i {
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const _))
        }
        #[inline(always)]
        unsafe fn u32s(p: *const u8) -> __m512i {
            _mm512_loadu_si512(p as *const _)
        }
        #[inline(always)]
        unsafe fn iq4xs(d: __m512, scales_h: __m512i, scales_l: __m512i, run: usize) -> __m512 {
            let (lo, hi) = (
                _mm_cvtsi32_si128(4 * run as i32),
                _mm_cvtsi32_si128(2 * run as i32),
            );
            let low = _mm512_and_si512(_mm512_srl_epi32(scales_l, lo), _mm512_set1_epi32(0x0f));
            let high = _mm512_and_si512(_mm512_srl_epi32(scales_h, hi), _mm512_set1_epi32(0x03));
            let sc = _mm512_or_si512(low, _mm512_slli_epi32::<4>(high));
            let k = _mm512_cvtepi32_ps(_mm512_sub_epi32(sc, _mm512_set1_epi32(32)));
            _mm512_mul_ps(d, k)
        }
        #[inline(always)]
        unsafe fn mul(v: __m512, s: f32) -> __m512 {
            _mm512_mul_ps(v, _mm512_set1_ps(s))
        }
        #[inline(always)]
        unsafe fn add(a: __m512, b: __m512) -> __m512 {
            _mm512_add_ps(a, b)
        }
        #[inline(always)]
        unsafe fn store(v: __m512, p: *mut f32) {
            _mm512_storeu_ps(p, v)
        }
    }

    /// AVX2, with AVX-VNNI (`VNNI`) or without: 8 rows in a ymm.
    struct Avx2<const VNNI: bool>;

    impl<const VNNI: bool> PanelLanes for Avx2<VNNI> {
        const ROWS: usize = 8;
        const BIASED: bool = VNNI;
        type W = __m256i;
        type I = __m256i;
        type F = __m256;
        #[inline(always)]
        unsafe fn zero() -> __m256 {
            _mm256_setzero_ps()
        }
        #[inline(always)]
        unsafe fn zero_i() -> __m256i {
            _mm256_setzero_si256()
        }
        #[inline(always)]
        unsafe fn codes(p: *const u8) -> __m256i {
            let w = _mm256_loadu_si256(p as *const _);
            if VNNI {
                _mm256_xor_si256(w, _mm256_set1_epi8(-128))
            } else {
                w
            }
        }
        #[inline(always)]
        unsafe fn table(levels: &[i8; 16]) -> __m256i {
            let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(levels.as_ptr() as *const _));
            if VNNI {
                _mm256_xor_si256(t, _mm256_set1_epi8(-128))
            } else {
                t
            }
        }
        #[inline(always)]
        unsafe fn lookup(p: *const u8, table: __m256i) -> (__m256i, __m256i) {
            let v = _mm256_loadu_si256(p as *const _);
            let mask = _mm256_set1_epi8(0x0f);
            let lo = _mm256_and_si256(v, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
            (
                _mm256_shuffle_epi8(table, lo),
                _mm256_shuffle_epi8(table, hi),
            )
        }
        #[inline(always)]
        unsafe fn dot(w: __m256i, x: i32, bias: i32) -> __m256i {
            let x = _mm256_set1_epi32(x);
            if VNNI {
                _mm256_dpbusd_avx_epi32(_mm256_set1_epi32(bias), w, x)
            } else {
                let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
                _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
            }
        }
        #[inline(always)]
        unsafe fn fma(acc: __m256, c: __m256i, s: __m256) -> __m256 {
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), s, acc)
        }
        #[inline(always)]
        unsafe fn half(p: *const u8) -> __m256 {
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const _))
        }
        #[inline(always)]
        unsafe fn e8m0(p: *const u8) -> __m256 {
            let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const _));
            let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
            let subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
            let is_normal = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
            _mm256_castsi256_ps(_mm256_blendv_epi8(subnormal, normal, is_normal))
        }
        #[inline(always)]
        unsafe fn u16s(p: *const u8) -> __m256i {
            _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const _))
        }
        #[inline(always)]
        unsafe fn u32s(p: *const u8) -> __m256i {
            _mm256_loadu_si256(p as *const _)
        }
        #[inline(always)]
        unsafe fn iq4xs(d: __m256, scales_h: __m256i, scales_l: __m256i, run: usize) -> __m256 {
            let (lo, hi) = (
                _mm_cvtsi32_si128(4 * run as i32),
                _mm_cvtsi32_si128(2 * run as i32),
            );
            let low = _mm256_and_si256(_mm256_srl_epi32(scales_l, lo), _mm256_set1_epi32(0x0f));
            let high = _mm256_and_si256(_mm256_srl_epi32(scales_h, hi), _mm256_set1_epi32(0x03));
            let sc = _mm256_or_si256(low, _mm256_slli_epi32::<4>(high));
            let k = _mm256_cvtepi32_ps(_mm256_sub_epi32(sc, _mm256_set1_epi32(32)));
            _mm256_mul_ps(d, k)
        }
        #[inline(always)]
        unsafe fn mul(v: __m256, s: f32) -> __m256 {
            _mm256_mul_ps(v, _mm256_set1_ps(s))
        }
        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            _mm256_add_ps(a, b)
        }
        #[inline(always)]
        unsafe fn store(v: __m256, p: *mut f32) {
            _mm256_storeu_ps(p, v)
        }
    }

    /// See [`super::panel_rows`]: the full panels from row `j0` on × every input row, into
    /// `yt[(dj)·n + i]`.
    ///
    /// # Safety
    /// The CPU must support `isa`; `yt` must hold whole panels and `acts` be in natural
    /// order; `w` must be in panels of `B`'s blocks, laid out as `layout`.
    pub(super) unsafe fn panels<B: Runs>(
        isa: Isa,
        layout: RunPanel,
        w: &QuantWeight<'_>,
        acts: &Acts,
        j0: usize,
        yt: &mut [f32],
    ) {
        let run = (layout, w, acts, j0);
        // SAFETY (each arm): the caller's.
        unsafe {
            match isa {
                Isa::Avx512 | Isa::Amx => avx512::<B>(run, yt),
                Isa::AvxVnni => avxvnni::<B>(run, yt),
                _ => avx2::<B>(run, yt),
            }
        }
    }

    /// Whether [`panels`] at `isa` reads the activations' step biases
    /// ([`Acts::row_step_bias`]): the levels whose lanes are [`PanelLanes::BIASED`].
    pub(in crate::cpu::qlinear) fn reads_step_biases(isa: Isa) -> bool {
        matches!(isa, Isa::Avx512 | Isa::Amx | Isa::AvxVnni)
    }

    /// The arguments of [`panels`] that the levels' kernels share.
    type Run<'a, 'w> = (RunPanel, &'a QuantWeight<'w>, &'a Acts, usize);

    // The kernels below are inlined into these functions, whose target features they need:
    // no closure may come between (a closure's body does not inherit them), as one did for
    // a scratch buffer and made them 30 times slower.

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn avx512<B: Runs>(run: Run<'_, '_>, yt: &mut [f32]) {
        // SAFETY: this function's features.
        unsafe { each_panel::<B, Avx512>(run, yt) }
    }

    #[target_feature(enable = "avxvnni,avx2,fma,f16c")]
    unsafe fn avxvnni<B: Runs>(run: Run<'_, '_>, yt: &mut [f32]) {
        // SAFETY: this function's features.
        unsafe { each_panel::<B, Avx2<true>>(run, yt) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn avx2<B: Runs>(run: Run<'_, '_>, yt: &mut [f32]) {
        // SAFETY: this function's features.
        unsafe { each_panel::<B, Avx2<false>>(run, yt) }
    }

    /// Every panel × every input row, two inputs at once (the 16 accumulators per input fit
    /// AVX-512's registers twice; on AVX2 the spills cost less than decoding the codes for
    /// each input alone).
    #[inline(always)]
    unsafe fn each_panel<B: Runs, L: PanelLanes>(
        (layout, w, acts, j0): Run<'_, '_>,
        yt: &mut [f32],
    ) {
        let n = acts.n;
        for (p, out) in yt.chunks_exact_mut(PANEL_ROWS * n).enumerate() {
            let (panel, _) = w.panel(j0 + p * PANEL_ROWS);
            for h in 0..PANEL_ROWS / L::ROWS {
                let mut i = 0;
                while i < n {
                    // SAFETY: the caller's.
                    unsafe {
                        if n - i >= 2 {
                            tile::<B, L, 2>(panel, layout, h, acts, i, out);
                            i += 2;
                        } else {
                            tile::<B, L, 1>(panel, layout, h, acts, i, out);
                            i += 1;
                        }
                    }
                }
            }
        }
    }

    /// The activations of `T` input rows at block `b`.
    struct ActsAt<'a, const T: usize> {
        qs: [*const u8; T],
        bias: [&'a [i32]; T],
        b: usize,
    }

    impl<const T: usize> ActsAt<'_, T> {
        /// The 4 codes of lane `lane` of input `t`, as one i32.
        #[inline(always)]
        unsafe fn codes(&self, t: usize, lane: usize) -> i32 {
            // SAFETY: the tile's rows hold whole blocks of codes.
            unsafe { (self.qs[t].add(self.b * BLOCK + STEP * lane) as *const i32).read_unaligned() }
        }

        /// `−128 · Σ` of those codes, where `L` stores weight codes `+ 128`.
        #[inline(always)]
        unsafe fn bias<L: PanelLanes>(&self, t: usize, lane: usize) -> i32 {
            if L::BIASED {
                // SAFETY: `bias[t]` has 8 entries a block.
                unsafe { *self.bias[t].get_unchecked(self.b * 8 + lane) }
            } else {
                0
            }
        }
    }

    /// Pass `h` over a panel (its rows `h·ROWS..(h + 1)·ROWS`) × input rows `i..i + T`, into
    /// `yt[dr·n + i + t]`: the 8 lanes of each output in 8 vectors, summed as
    /// [`super::lane_sum8`] does.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<B: Runs, L: PanelLanes, const T: usize>(
        panel: &[u8],
        layout: RunPanel,
        h: usize,
        acts: &Acts,
        i: usize,
        yt: &mut [f32],
    ) {
        // SAFETY (whole body): the caller's instructions; every read lies in the panel
        // (whole blocks of 16 rows) or in the activations' rows.
        unsafe {
            let n = acts.n;
            let mut qs = [std::ptr::null::<u8>(); T];
            let mut d = [&[] as &[f32]; T];
            let mut bias = [&[] as &[i32]; T];
            for t in 0..T {
                qs[t] = acts.row_qs(i + t).as_ptr() as *const u8;
                d[t] = acts.row_d(i + t);
                if L::BIASED {
                    bias[t] = acts.row_step_bias(i + t);
                }
            }
            // (Unused for a code per byte.)
            let table = L::table(B::TABLE.unwrap_or(&[0; 16]));
            let steps = layout.steps() / B::RUNS;
            let step_bytes = STEP * PANEL_ROWS;
            let mut acc = [[L::zero(); 8]; T];
            // IQ4_XS's `scales_h` and `scales_l` (the panel's 16 rows of each field after the
            // earlier fields of all 16), and where the codes start.
            let (scales_h_at, scales_l_at) = if B::SCALE == PanelScale::Iq4Xs {
                (
                    PANEL_ROWS * layout.field_start(1),
                    PANEL_ROWS * layout.field_start(2),
                )
            } else {
                (0, 0)
            };
            let codes_at = PANEL_ROWS * layout.header() + h * L::ROWS * STEP;
            for blk in 0..acts.blocks / B::RUNS {
                let base = panel.as_ptr().add(blk * PANEL_ROWS * layout.block);
                let codes = base.add(codes_at);
                // The pass's rows within each header field (a field holds all 16 rows').
                let rows = h * L::ROWS;
                let first = match B::SCALE {
                    PanelScale::F16 => L::half(base.add(2 * rows)),
                    PanelScale::E8M0 => L::e8m0(base.add(rows)),
                    PanelScale::Iq4Xs => L::half(base.add(2 * rows)),
                };
                let (scales_h, scales_l) = if B::SCALE == PanelScale::Iq4Xs {
                    (
                        L::u16s(base.add(scales_h_at + 2 * rows)),
                        L::u32s(base.add(scales_l_at + 4 * rows)),
                    )
                } else {
                    (L::zero_i(), L::zero_i())
                };
                for run in 0..B::RUNS {
                    let b = blk * B::RUNS + run;
                    let sw = if B::SCALE == PanelScale::Iq4Xs {
                        L::iq4xs(first, scales_h, scales_l, run)
                    } else {
                        first
                    };
                    let mut s = [L::zero(); T];
                    for t in 0..T {
                        s[t] = L::mul(sw, *d[t].get_unchecked(b));
                    }
                    let x = ActsAt { qs, bias, b };
                    for q in 0..steps {
                        let step = codes.add((run * steps + q) * step_bytes);
                        if T == 1 && n == 1 && h == 0 {
                            // Decode streams each panel once: fetch ahead of the loads.
                            _mm_prefetch::<_MM_HINT_NTA>(step.wrapping_add(AHEAD) as *const i8);
                        }
                        if B::TABLE.is_none() {
                            let wv = L::codes(step);
                            for t in 0..T {
                                let c = L::dot(wv, x.codes(t, q), x.bias::<L>(t, q));
                                acc[t][q] = L::fma(acc[t][q], c, s[t]);
                            }
                        } else {
                            let (lo, hi) = L::lookup(step, table);
                            for t in 0..T {
                                let c = L::dot(lo, x.codes(t, q), x.bias::<L>(t, q));
                                acc[t][q] = L::fma(acc[t][q], c, s[t]);
                                let c = L::dot(hi, x.codes(t, q + 4), x.bias::<L>(t, q + 4));
                                acc[t][q + 4] = L::fma(acc[t][q + 4], c, s[t]);
                            }
                        }
                    }
                }
            }
            let mut out = [0.0f32; PANEL_ROWS];
            for (t, a) in acc.iter().enumerate() {
                let s: [L::F; 4] = [
                    L::add(a[0], a[4]),
                    L::add(a[1], a[5]),
                    L::add(a[2], a[6]),
                    L::add(a[3], a[7]),
                ];
                L::store(
                    L::add(L::add(s[0], s[2]), L::add(s[1], s[3])),
                    out.as_mut_ptr(),
                );
                for (dr, &v) in out[..L::ROWS].iter().enumerate() {
                    *yt.get_unchecked_mut((h * L::ROWS + dr) * n + i + t) = v;
                }
            }
        }
    }
}
