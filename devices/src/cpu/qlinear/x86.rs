//! x86-64 int8 and int4 kernels of the AVX2 and AVX-VNNI levels, and the activation
//! quantisation of the x86 levels.
//!
//! The kernels sum in the order every level sums (see [`super`]): a panel of 8 weight rows
//! is one f32 vector, a weight row per lane, and for each input row, block by block, the
//! exact integer sums `C_b = Σ q_w q_x` of the 8 rows are formed and taken in with
//! `acc = fma(C_b, a_b·d_g, acc)`, then the int4 minimums `acc = fma(m_g, gsum_g, acc)`, or
//! the int8 scale `y = s·acc`: the formula of the portable twin ([`super::scalar`]) and of
//! the AMX tiles, so the same bits.
//!
//! Per weight row, a block's 32 products are summed 4 to a lane (`vpdpbusd` with AVX-VNNI,
//! `vpmaddubsw` then `vpmaddwd` with AVX2); the 8 rows' vectors of lane sums are then
//! reduced together by horizontal adds into one vector of `C_b` (exact integer adds, about
//! one instruction per row and block). The operands:
//! - int4: the codes `0..15` are the unsigned operand, the activations the signed one
//!   (`15·127·2` fits the i16 of `vpmaddubsw`);
//! - int8: `|q_w|` against `sign(q_x, q_w)`, as ggml's `mul_sum_i8_pairs` (a pair is at most
//!   `2·128·127 < 2¹⁵`).

use std::arch::x86_64::*;
use std::cell::Cell;

use flm_core::quant::{Int4Row, BLOCK};
use flm_core::DataType;

use super::{Acts, QuantWeight};
use crate::cpu::{scratch, Isa};

/// Weight rows per panel: the lanes of an f32 vector.
const ROWS: usize = 8;

/// Per-thread buffers: the group scales and minimums of a panel's int4 rows.
#[derive(Default)]
struct Scratch {
    /// `groups × 8`, group `g` of row `dr` at `g·8 + dr` (a vector holds one group of the
    /// panel's rows); zeros for rows past the panel's last.
    dg: Vec<f32>,
    mg: Vec<f32>,
}

thread_local! {
    static SCRATCH: Cell<Scratch> = Cell::new(Scratch::default());
}

/// See [`super::rows`], for int8 and int4 weights and [`Acts`] in natural order. The caller
/// guarantees that the CPU supports `isa` ([`Isa::Avx2`] or [`Isa::AvxVnni`]).
pub(super) fn rows(isa: Isa, w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
    let n = acts.n;
    scratch::with(&SCRATCH, |s| {
        for (p, out) in yt.chunks_mut(ROWS * n).enumerate() {
            let (j, r) = (j0 + p * ROWS, out.len() / n);
            if w.dtype != DataType::I8 {
                group_scales(w, j, r, acts.groups, s);
            }
            let panel = Panel { w, acts, j, r };
            // SAFETY: the caller guarantees AVX2, FMA and F16C, and AVX-VNNI at that level.
            unsafe {
                match (isa, w.dtype) {
                    (Isa::AvxVnni, DataType::I8) => panel.i8_vnni(out),
                    (_, DataType::I8) => panel.i8_avx2(out),
                    (Isa::AvxVnni, _) => panel.i4_vnni(out, s),
                    _ => panel.i4_avx2(out, s),
                }
            }
        }
    })
}

/// The group scales `d_g` and minimums `m_g` (as [`Int4Row`] reads them) of the int4 rows
/// `j..j + r` into `s`, group-major.
fn group_scales(w: &QuantWeight<'_>, j: usize, r: usize, groups: usize, s: &mut Scratch) {
    for v in [&mut s.dg, &mut s.mg] {
        v.clear();
        v.resize(groups * ROWS, 0.0);
    }
    for dr in 0..r {
        let row = Int4Row::split(w.dtype, w.row(j + dr));
        for g in 0..groups {
            s.dg[g * ROWS + dr] = row.scale(g);
            s.mg[g * ROWS + dr] = row.min(g);
        }
    }
}

/// Weight rows `j..j + r` (`r ≤ 8`) of `w` against every input row of `acts`.
struct Panel<'a> {
    w: &'a QuantWeight<'a>,
    acts: &'a Acts,
    j: usize,
    r: usize,
}

impl Panel<'_> {
    /// The panel's 8 rows: rows past `r` repeat row `j` (valid memory; their lanes are not
    /// stored).
    #[inline(always)]
    fn rows(&self) -> [&[u8]; ROWS] {
        std::array::from_fn(|dr| self.w.row(self.j + if dr < self.r { dr } else { 0 }))
    }

    /// Stores lane `dr < r` of `y` as the output of row `dr` for input row `i`.
    #[inline(always)]
    unsafe fn store(&self, y: __m256, i: usize, out: &mut [f32]) {
        let mut lanes = [0.0f32; ROWS];
        _mm256_storeu_ps(lanes.as_mut_ptr(), y);
        let n = self.acts.n;
        for (dr, y) in lanes.iter().enumerate().take(self.r) {
            out[dr * n + i] = *y;
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn i8_avx2(&self, out: &mut [f32]) {
        self.i8::<false>(out)
    }

    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    unsafe fn i8_vnni(&self, out: &mut [f32]) {
        self.i8::<true>(out)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn i4_avx2(&self, out: &mut [f32], s: &Scratch) {
        self.i4::<false>(out, s)
    }

    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    unsafe fn i4_vnni(&self, out: &mut [f32], s: &Scratch) {
        self.i4::<true>(out, s)
    }

    /// int8 rows: `y = s_j · acc`, `acc` the chain of blocks.
    #[inline(always)]
    unsafe fn i8<const VNNI: bool>(&self, out: &mut [f32]) {
        let rows = self.rows();
        let scale: [f32; ROWS] = std::array::from_fn(|dr| {
            let row = rows[dr];
            f32::from_le_bytes([row[0], row[1], row[2], row[3]])
        });
        let scale = _mm256_loadu_ps(scale.as_ptr());
        let blocks = self.w.kp / BLOCK;
        for i in 0..self.acts.n {
            let (qs, d) = (self.acts.row_qs(i).as_ptr(), self.acts.row_d(i));
            let mut acc = _mm256_setzero_ps();
            for (b, &a) in d.iter().enumerate().take(blocks) {
                let x = _mm256_loadu_si256(qs.add(b * BLOCK) as *const __m256i);
                let sums: [__m256i; ROWS] = std::array::from_fn(|dr| {
                    let p = rows[dr].as_ptr().add(4 + b * BLOCK);
                    let wv = _mm256_loadu_si256(p as *const __m256i);
                    let (u, s) = (_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(x, wv));
                    dot_u8_i8::<VNNI>(_mm256_setzero_si256(), u, s)
                });
                let c = _mm256_cvtepi32_ps(block_sums(sums));
                acc = _mm256_fmadd_ps(c, _mm256_set1_ps(a), acc);
            }
            self.store(_mm256_mul_ps(acc, scale), i, out);
        }
    }

    /// int4 rows: the chain of blocks scaled by `a_b·d_g`, then of the minimums.
    #[inline(always)]
    unsafe fn i4<const VNNI: bool>(&self, out: &mut [f32], s: &Scratch) {
        let rows = self.rows();
        let acts = self.acts;
        let (blocks, groups) = (self.w.kp / BLOCK, acts.groups);
        let per_group = blocks / groups;
        let low = _mm_set1_epi8(0x0f);
        for i in 0..acts.n {
            let (qs, d) = (acts.row_qs(i).as_ptr(), acts.row_d(i));
            let mut acc = _mm256_setzero_ps();
            for (b, &a) in d.iter().enumerate().take(blocks) {
                let x = _mm256_loadu_si256(qs.add(b * BLOCK) as *const __m256i);
                let sums: [__m256i; ROWS] = std::array::from_fn(|dr| {
                    let p = rows[dr].as_ptr().add(b * BLOCK / 2);
                    let v = _mm_loadu_si128(p as *const __m128i);
                    // Codes 0..16 of the block (low nibbles), then 16..32 (high nibbles).
                    let codes = _mm256_set_m128i(
                        _mm_and_si128(_mm_srli_epi16(v, 4), low),
                        _mm_and_si128(v, low),
                    );
                    dot_u8_i8::<VNNI>(_mm256_setzero_si256(), codes, x)
                });
                let c = _mm256_cvtepi32_ps(block_sums(sums));
                let dg = _mm256_loadu_ps(s.dg.as_ptr().add(b / per_group * ROWS));
                acc = _mm256_fmadd_ps(c, _mm256_mul_ps(_mm256_set1_ps(a), dg), acc);
            }
            for (g, &gs) in acts.row_gsum(i).iter().enumerate().take(groups) {
                let m = _mm256_loadu_ps(s.mg.as_ptr().add(g * ROWS));
                acc = _mm256_fmadd_ps(m, _mm256_set1_ps(gs), acc);
            }
            self.store(acc, i, out);
        }
    }
}

/// Of 8 vectors of 8 int32 lanes, the sum of each vector's lanes, in its lane: horizontal
/// adds, then the two 128-bit halves added (exact).
#[inline(always)]
unsafe fn block_sums(v: [__m256i; ROWS]) -> __m256i {
    let h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    // h0: [Σ lanes 0..4 of v0..v3 | Σ lanes 4..8 of v0..v3], h1 the same of v4..v7.
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(h0, h1),
        _mm256_permute2x128_si256::<0x31>(h0, h1),
    )
}

/// `acc + Σ u·s` over each lane's 4 byte pairs (`vpdpbusd`), or its AVX2 equivalent
/// (`vpmaddubsw` then `vpmaddwd` with ones), valid while `u · s` pair sums fit in i16.
#[inline(always)]
unsafe fn dot_u8_i8<const VNNI: bool>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_avx_epi32(acc, u, s)
    } else {
        let ones = _mm256_set1_epi16(1);
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones))
    }
}

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
