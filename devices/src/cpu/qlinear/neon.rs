//! aarch64 int4 micro-kernels and the int8 panel kernel ([`panel_i8`]), with and without
//! the dot-product extension.
//!
//! Each int4 kernel computes a tile of `R` weight rows × `T` input rows over [`Acts`] in
//! natural order, loading and unpacking each weight vector once for the `T` inputs. Per
//! block of 32 values it forms the exact int32 dot product of the codes in 4 lanes,
//! converts it to f32 and accumulates it scaled by the block's scales (lane sums at the
//! end), as the x86 kernels do:
//! - with FEAT_DotProd ([`Isa::NeonDot`]): `sdot`, 4 signed byte products per lane, for
//!   int8 codes and for the int4 codes `0..15` alike (ggml's `ggml_vec_dot_q4_0_q8_0` on
//!   ARMv8.2);
//! - without it ([`Isa::Neon`], Cortex-A72): `smull`/`smull2` to 16-bit products, summed
//!   pairwise into 32-bit lanes. Every int8 product fits in i16 (`|−127·−127| < 2¹⁴`), and
//!   so does a sum of two; four int4 products summed in i16 lanes before widening fit as
//!   well (`4·15·128 < 2¹⁵`).
//!
//! `sdot` is written as inline assembly (the `vdotq_s32` intrinsic is not stable Rust yet)
//! inside `#[target_feature(enable = "dotprod")]` functions that are entered only at
//! [`Isa::NeonDot`]: a CPU without the extension never executes it.

// Tiles index several register arrays by row and input in one loop body.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;
use std::arch::asm;

use flm_core::quant::{int4_mins, BLOCK};

use super::{Acts, QuantWeight};
use crate::cpu::simd::neon::f16x4_to_f32;
use crate::cpu::Isa;

/// Weight rows per full tile.
const TILE_ROWS: usize = 4;
/// Input rows per full tile.
const TILE_INPUTS: usize = 2;
/// Blocks per int4 step: one vector of 4 scales `d_g · a_b`.
const CHUNK_BLOCKS: usize = 4;

/// See [`super::rows`]. `isa` is [`Isa::Neon`] or [`Isa::NeonDot`], and the caller
/// guarantees that the CPU supports it.
pub(super) fn rows(isa: Isa, w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
    let n = acts.n;
    let m = yt.len() / n;
    let mut j = 0;
    while j < m {
        let r = if m - j >= TILE_ROWS { TILE_ROWS } else { 1 };
        let mut i = 0;
        while i < n {
            let t = (n - i).min(TILE_INPUTS);
            let mut out = [[0.0f32; TILE_INPUTS]; TILE_ROWS];
            let tile = Tile {
                w,
                j: j0 + j,
                acts,
                i,
            };
            tile.run(isa, r, t, &mut out);
            for (dr, row) in out.iter().take(r).enumerate() {
                yt[(j + dr) * n + i..][..t].copy_from_slice(&row[..t]);
            }
            i += t;
        }
        j += r;
    }
}

/// [`super::quantize_block`] with NEON: the same bits (`fcvtns` rounds to nearest, ties to
/// even, like the portable magic-number rounding; `fmaxnm` ignores NaN as its `>` does).
#[inline(always)]
pub(super) fn quantize_block(values: &[f32], lo: &mut [i8], hi: &mut [i8]) -> (f32, i32) {
    let mut v = [0.0f32; BLOCK];
    let n = values.len().min(BLOCK);
    v[..n].copy_from_slice(&values[..n]);
    assert!(lo.len() >= 16 && hi.len() >= 16);
    // SAFETY: NEON, which every aarch64 target has; loads 32 values from the local array and
    // stores 16 codes into each of `lo` and `hi` (asserted).
    unsafe {
        let x: [float32x4_t; 8] = std::array::from_fn(|c| vld1q_f32(v.as_ptr().add(4 * c)));
        let inf = vdupq_n_f32(f32::INFINITY);
        let finite = x[1..].iter().fold(vcltq_f32(vabsq_f32(x[0]), inf), |f, x| {
            vandq_u32(f, vcltq_f32(vabsq_f32(*x), inf))
        });
        if vminvq_u32(finite) == 0 {
            return super::non_finite_block(lo, hi);
        }
        let mut m = vabsq_f32(x[0]);
        for x in &x[1..] {
            m = vmaxnmq_f32(m, vabsq_f32(*x));
        }
        let d = vmaxnmvq_f32(m) / 127.0;
        let inv = vdupq_n_f32(if d > 0.0 { 1.0 / d } else { 0.0 });
        let q: [int32x4_t; 8] = std::array::from_fn(|c| vcvtnq_s32_f32(vmulq_f32(x[c], inv)));
        let narrow = |a: usize| {
            let h0 = vcombine_s16(vmovn_s32(q[a]), vmovn_s32(q[a + 1]));
            let h1 = vcombine_s16(vmovn_s32(q[a + 2]), vmovn_s32(q[a + 3]));
            vcombine_s8(vmovn_s16(h0), vmovn_s16(h1))
        };
        vst1q_s8(lo.as_mut_ptr(), narrow(0));
        vst1q_s8(hi.as_mut_ptr(), narrow(4));
        let s = q[1..].iter().fold(q[0], |s, q| vaddq_s32(s, *q));
        (d, vaddvq_s32(s))
    }
}

/// `acc + Σ` of the 4 byte products of each lane: `sdot`.
///
/// # Safety
/// The CPU must have FEAT_DotProd.
#[target_feature(enable = "dotprod")]
#[inline]
pub(super) unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: the caller guarantees dotprod; registers only.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    acc
}

/// The exact int32 dot product of the 32 int4 codes `0..15` `w` (low nibbles against
/// `a[0]`, high against `a[1]`) and the activation codes `a`, in 4 lanes; `DOT` selects
/// `sdot`, and without it the four 16-bit products of a lane are summed before widening.
#[inline(always)]
fn dot_u4<const DOT: bool>(w: [int8x16_t; 2], a: [int8x16_t; 2]) -> int32x4_t {
    // SAFETY: NEON (every aarch64 target); `sdot` only when `DOT`, which only the
    // `#[target_feature(enable = "dotprod")]` kernels entered at `Isa::NeonDot` pass.
    unsafe {
        if DOT {
            return sdot(sdot(vdupq_n_s32(0), w[0], a[0]), w[1], a[1]);
        }
        let p = vmull_s8(vget_low_s8(w[0]), vget_low_s8(a[0]));
        let p = vmlal_high_s8(p, w[0], a[0]);
        let p = vmlal_s8(p, vget_low_s8(w[1]), vget_low_s8(a[1]));
        vpaddlq_s16(vmlal_high_s8(p, w[1], a[1]))
    }
}

/// The f16 number `i` of the little-endian array `bytes`, as bits.
#[inline(always)]
fn f16_bits(bytes: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])
}

/// `Σ_i f16(m[i]) · g[i]` over `g.len()` values (`m`, and `d` when given, hold at least
/// `2·g.len()` bytes), each term also times `f16(d[i])` when `d` is given (the zero points
/// times the scales of an int4-zp row, see `Int4Row`): whole runs of 4 load their f16
/// values with one load, the rest through a local array.
#[inline(always)]
fn dot_f16_f32(m: &[u8], d: Option<&[u8]>, g: &[f32]) -> f32 {
    let m = &m[..2 * g.len()];
    let d = d.map(|d| &d[..2 * g.len()]);
    let whole = g.len() / 4;
    // The f16 values `4c..4c + 4` of `bytes` (those past `g.len()` zero), as f32 lanes.
    let load = |bytes: &[u8], c: usize| {
        if c < whole {
            // SAFETY: NEON; reads `bytes[8c..8c + 8]`, inside the `2·g.len()` bytes.
            unsafe { f16x4_to_f32(vreinterpret_u16_u8(vld1_u8(bytes.as_ptr().add(8 * c)))) }
        } else {
            let mut bits = [0u16; 4];
            for (e, b) in bits.iter_mut().enumerate().take(g.len() - 4 * c) {
                *b = f16_bits(bytes, 4 * c + e);
            }
            // SAFETY: NEON; loads a local array of 4.
            unsafe { f16x4_to_f32(vld1_u16(bits.as_ptr())) }
        }
    };
    // SAFETY: NEON; the loads read `g[4c..4c + 4]` for `c < whole`, and local arrays of 4.
    unsafe {
        let mut acc = vdupq_n_f32(0.0);
        for c in 0..g.len().div_ceil(4) {
            let mut mv = load(m, c);
            if let Some(d) = d {
                mv = vmulq_f32(mv, load(d, c));
            }
            let gv = if c < whole {
                vld1q_f32(g.as_ptr().add(4 * c))
            } else {
                let mut vals = [0.0f32; 4];
                vals[..g.len() - 4 * c].copy_from_slice(&g[4 * c..]);
                vld1q_f32(vals.as_ptr())
            };
            acc = vfmaq_f32(acc, mv, gv);
        }
        vaddvq_f32(acc)
    }
}

/// The f32 scales `d_g` of the 4 blocks from block `b0` (a multiple of 4), one per lane,
/// from the f16 scales of a row with groups of `G` values at `scales`: 4 consecutive
/// scales (`G` = 32), 2 each over two lanes (64) or 1 over all four (128).
///
/// # Safety
/// The row's scales of blocks `b0..b0 + 4` are readable: `scales + 2 · (b0 · 32 / G)` and
/// the `2 · 128 / G` bytes after it.
#[inline(always)]
unsafe fn chunk_scales<const G: usize>(scales: *const u8, b0: usize) -> float32x4_t {
    // SAFETY: the caller guarantees the bytes read; NEON otherwise.
    unsafe {
        let p = scales.add(2 * (b0 * BLOCK / G));
        let bits = match G {
            32 => vreinterpret_u16_u8(vld1_u8(p)),
            64 => {
                let two =
                    vreinterpret_u16_u32(vdup_n_u32(std::ptr::read_unaligned(p as *const u32)));
                vzip1_u16(two, two)
            }
            _ => vdup_n_u16(std::ptr::read_unaligned(p as *const u16)),
        };
        f16x4_to_f32(bits)
    }
}

/// One tile: weight rows from `j`, input rows from `i`.
struct Tile<'a> {
    w: &'a QuantWeight<'a>,
    j: usize,
    acts: &'a Acts,
    i: usize,
}

macro_rules! by_tile {
    ($self:ident, $kernel:ident, $r:expr, $t:expr, $out:ident) => {
        match ($r, $t) {
            (1, 1) => $self.$kernel::<1, 1>($out),
            (1, _) => $self.$kernel::<1, 2>($out),
            (_, 1) => $self.$kernel::<4, 1>($out),
            (_, _) => $self.$kernel::<4, 2>($out),
        }
    };
}

type Out = [[f32; TILE_INPUTS]; TILE_ROWS];

impl Tile<'_> {
    /// Runs the tile of `r` (1 or 4) weight rows × `t` (1 or 2) input rows, writing
    /// `out[..r][..t]`. The caller guarantees that the CPU supports `isa`.
    fn run(&self, isa: Isa, r: usize, t: usize, out: &mut Out) {
        match isa {
            // SAFETY: `Isa::NeonDot` is only accepted on CPUs with dotprod.
            Isa::NeonDot => unsafe { by_tile!(self, i4_dot, r, t, out) },
            _ => by_tile!(self, i4_plain, r, t, out),
        }
    }

    fn rows<const R: usize>(&self) -> [&[u8]; R] {
        std::array::from_fn(|r| self.w.row(self.j + r))
    }

    #[target_feature(enable = "dotprod")]
    unsafe fn i4_dot<const R: usize, const T: usize>(&self, out: &mut Out) {
        self.i4_groups::<R, T, true>(out)
    }

    fn i4_plain<const R: usize, const T: usize>(&self, out: &mut Out) {
        self.i4_groups::<R, T, false>(out)
    }

    /// [`Tile::i4_body`] for the weights' group size.
    #[inline(always)]
    fn i4_groups<const R: usize, const T: usize, const DOT: bool>(&self, out: &mut Out) {
        match self.w.dtype.group_size() {
            Some(32) => self.i4_body::<R, T, DOT, 32>(out),
            Some(64) => self.i4_body::<R, T, DOT, 64>(out),
            _ => self.i4_body::<R, T, DOT, 128>(out),
        }
    }

    /// int4: [`CHUNK_BLOCKS`] blocks per step, `Σ_b d_g a_b · dot_b + Σ_g m_g gsum_g`, groups
    /// of `G` values.
    ///
    /// Whole chunks read their codes and their scales straight from the row: the 4 block
    /// scales of a chunk are one load and one `fcvtl` (`G` = 32: 4 consecutive f16; 64 and
    /// 128: 2 or 1, spread over the lanes), where gathering them one f16 at a time took
    /// about as many instructions as the dot products. The last, partial chunk reads its
    /// codes and scales from zero-padded copies ([`Acts`] is padded to whole chunks with
    /// zero codes and scales).
    #[inline(always)]
    fn i4_body<const R: usize, const T: usize, const DOT: bool, const G: usize>(
        &self,
        out: &mut Out,
    ) {
        let kp = self.w.kp;
        let nb = kp / BLOCK;
        let chunks = nb.div_ceil(CHUNK_BLOCKS);
        let rows = self.rows::<R>();
        let qs: [&[i8]; T] = std::array::from_fn(|t| self.acts.row_qs(self.i + t));
        let ds: [&[f32]; T] = std::array::from_fn(|t| self.acts.row_d(self.i + t));
        // The unchecked reads below stay inside these bounds: codes `kp / 2` and scales
        // `2 · kp / G` bytes per row; codes and scales of every input row's whole chunks.
        for row in rows {
            assert!(row.len() >= kp / 2 + 2 * (kp / G));
        }
        for t in 0..T {
            assert!(qs[t].len() >= chunks * CHUNK_BLOCKS * BLOCK);
            assert!(ds[t].len() >= chunks * CHUNK_BLOCKS);
        }
        // SAFETY: NEON (every aarch64 target); registers only.
        let zero = unsafe { vdupq_n_f32(0.0) };
        let mut acc = [[zero; T]; R];
        let full = nb / CHUNK_BLOCKS;
        for c in 0..full {
            let b0 = CHUNK_BLOCKS * c;
            // SAFETY: chunk `c` is whole: its codes and scales lie inside each row (asserted).
            unsafe {
                let codes = std::array::from_fn(|r| rows[r].as_ptr().add(b0 * BLOCK / 2));
                let dw =
                    std::array::from_fn(|r| chunk_scales::<G>(rows[r].as_ptr().add(kp / 2), b0));
                self.i4_chunk::<R, T, DOT>(codes, dw, &qs, &ds, b0, &mut acc);
            }
        }
        if full < chunks {
            let b0 = CHUNK_BLOCKS * full;
            let mut tail = [[0u8; CHUNK_BLOCKS * BLOCK / 2]; R];
            let mut dw = [zero; R];
            for r in 0..R {
                let codes = &rows[r][b0 * BLOCK / 2..kp / 2];
                tail[r][..codes.len()].copy_from_slice(codes);
                let scales = &rows[r][kp / 2..];
                let bits: [u16; CHUNK_BLOCKS] = std::array::from_fn(|e| {
                    let b = b0 + e;
                    if b < nb {
                        f16_bits(scales, b * BLOCK / G)
                    } else {
                        0
                    }
                });
                // SAFETY: NEON; loads 4 values from a local array of 4.
                dw[r] = f16x4_to_f32(unsafe { vld1_u16(bits.as_ptr()) });
            }
            let codes = std::array::from_fn(|r| tail[r].as_ptr());
            // SAFETY: `tail` holds a whole chunk of codes; the inputs are padded to whole
            // chunks (asserted).
            unsafe { self.i4_chunk::<R, T, DOT>(codes, dw, &qs, &ds, b0, &mut acc) };
        }
        let mins = int4_mins(self.w.dtype, kp);
        for r in 0..R {
            let ms = &rows[r][mins.offset..];
            let scales = mins.times_scale.then(|| &rows[r][kp / 2..]);
            for t in 0..T {
                let gsum = self.acts.row_gsum(self.i + t);
                // SAFETY: NEON; registers only.
                let sum = unsafe { vaddvq_f32(acc[r][t]) };
                out[r][t] = sum + mins.factor * dot_f16_f32(ms, scales, gsum);
            }
        }
    }

    /// Adds the chunk of [`CHUNK_BLOCKS`] blocks from block `b0` to `acc`: the codes of row
    /// `r` at `codes[r]` (64 bytes), its 4 block scales `dw[r]` (f32).
    ///
    /// # Safety
    /// Each `codes[r]` points to 64 readable bytes; each `qs[t]` and `ds[t]` holds the
    /// whole chunk.
    #[inline(always)]
    unsafe fn i4_chunk<const R: usize, const T: usize, const DOT: bool>(
        &self,
        codes: [*const u8; R],
        dw: [float32x4_t; R],
        qs: &[&[i8]; T],
        ds: &[&[f32]; T],
        b0: usize,
        acc: &mut [[float32x4_t; T]; R],
    ) {
        // SAFETY: NEON (every aarch64 target); the reads are inside the ranges the caller
        // guarantees.
        unsafe {
            let low = vdupq_n_u8(0x0f);
            let mut sc = [[vdupq_n_f32(0.0); T]; R];
            for t in 0..T {
                let da = vld1q_f32(ds[t].as_ptr().add(b0));
                for r in 0..R {
                    sc[r][t] = vmulq_f32(dw[r], da);
                }
            }
            macro_rules! block {
                ($e:literal) => {{
                    let w: [[int8x16_t; 2]; R] = std::array::from_fn(|r| {
                        let v = vld1q_u8(codes[r].add(16 * $e));
                        [
                            vreinterpretq_s8_u8(vandq_u8(v, low)),
                            vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)),
                        ]
                    });
                    for t in 0..T {
                        let a = qs[t].as_ptr().add(BLOCK * (b0 + $e));
                        let a = [vld1q_s8(a), vld1q_s8(a.add(16))];
                        for r in 0..R {
                            let p = vcvtq_f32_s32(dot_u4::<DOT>(w[r], a));
                            acc[r][t] = vfmaq_laneq_f32::<$e>(acc[r][t], p, sc[r][t]);
                        }
                    }
                }};
            }
            block!(0);
            block!(1);
            block!(2);
            block!(3);
        }
    }
}

/// The int8 panel of 16 rows at `j` ([`flm_core::panels`]) × every input row, into
/// `yt[(dj)·n + i]`, in the order of [`super::panels`]: per block `acc = fma(C_b, a_b, acc)`,
/// then `s_j · acc`. A step's 64 bytes are 4 vectors of 4 rows × 4 codes, so `sdot` (or
/// `smull`, `addp` and `sadalp` without it) leaves each row's 4-product sum in its own lane.
/// `isa` is [`Isa::Neon`] or [`Isa::NeonDot`], and the caller guarantees that the CPU
/// supports it.
pub(super) fn panel_i8(isa: Isa, w: &QuantWeight<'_>, acts: &Acts, j: usize, yt: &mut [f32]) {
    let mut i = 0;
    while i < acts.n {
        let t = (acts.n - i).min(TILE_INPUTS);
        match (isa, t) {
            // SAFETY: `Isa::NeonDot` is only accepted on CPUs with dotprod.
            (Isa::NeonDot, 1) => unsafe { panel_i8_dot::<1>(w, acts, j, i, yt) },
            // SAFETY: as above.
            (Isa::NeonDot, _) => unsafe { panel_i8_dot::<2>(w, acts, j, i, yt) },
            (_, 1) => panel_i8_body::<1, false>(w, acts, j, i, yt),
            _ => panel_i8_body::<2, false>(w, acts, j, i, yt),
        }
        i += t;
    }
}

#[target_feature(enable = "dotprod")]
unsafe fn panel_i8_dot<const T: usize>(
    w: &QuantWeight<'_>,
    acts: &Acts,
    j: usize,
    i: usize,
    yt: &mut [f32],
) {
    panel_i8_body::<T, true>(w, acts, j, i, yt)
}

/// [`panel_i8`] for the input rows `i..i + T`.
#[inline(always)]
fn panel_i8_body<const T: usize, const DOT: bool>(
    w: &QuantWeight<'_>,
    acts: &Acts,
    j: usize,
    i: usize,
    yt: &mut [f32],
) {
    const QUADS: usize = 4;
    let (panel, _) = w.panel(j);
    let n = acts.n;
    let qs: [&[i8]; T] = std::array::from_fn(|t| acts.row_qs(i + t));
    let ds: [&[f32]; T] = std::array::from_fn(|t| acts.row_d(i + t));
    let codes = &panel[64..];
    // SAFETY: NEON (every aarch64 target); `sdot` only when `DOT`, which only
    // `panel_i8_dot`, entered at `Isa::NeonDot`, passes; loads stay within `codes` (one
    // block of 8 steps of 64 bytes per block of the inputs).
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); QUADS]; T];
        for b in 0..acts.blocks {
            let mut c = [[vdupq_n_s32(0); QUADS]; T];
            for s in 0..8 {
                let step = codes[(8 * b + s) * 64..][..64].as_ptr() as *const i8;
                let wv: [int8x16_t; QUADS] = std::array::from_fn(|q| vld1q_s8(step.add(16 * q)));
                for t in 0..T {
                    let x4 = (qs[t][32 * b + 4 * s..][..4].as_ptr() as *const i32).read_unaligned();
                    let x = vreinterpretq_s8_s32(vdupq_n_s32(x4));
                    for q in 0..QUADS {
                        c[t][q] = if DOT {
                            sdot(c[t][q], wv[q], x)
                        } else {
                            let lo = vmull_s8(vget_low_s8(wv[q]), vget_low_s8(x));
                            let hi = vmull_high_s8(wv[q], x);
                            vpadalq_s16(c[t][q], vpaddq_s16(lo, hi))
                        };
                    }
                }
            }
            for t in 0..T {
                for q in 0..QUADS {
                    acc[t][q] = vfmaq_n_f32(acc[t][q], vcvtq_f32_s32(c[t][q]), ds[t][b]);
                }
            }
        }
        for t in 0..T {
            let mut out = [0.0f32; 16];
            for q in 0..QUADS {
                vst1q_f32(out[4 * q..].as_mut_ptr(), acc[t][q]);
            }
            for (dr, v) in out.iter().enumerate() {
                let s = &panel[4 * dr..4 * dr + 4];
                yt[dr * n + i + t] = f32::from_le_bytes([s[0], s[1], s[2], s[3]]) * v;
            }
        }
    }
}
