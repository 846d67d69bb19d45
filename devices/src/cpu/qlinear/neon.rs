//! aarch64 panel kernels ([`flm_core::panels`]) for int8 and int4, with and without the
//! dot-product extension, in the one order of [`super::panels`]; and the NEON activation
//! quantiser.
//!
//! A step's 64 bytes are 4 vectors of 4 rows × 4 codes, so one dot product leaves each
//! row's 4-product sum in its own lane:
//! - with FEAT_DotProd ([`Isa::NeonDot`]): `sdot`, 4 signed byte products per lane, for
//!   int8 codes and the int4 codes `0..15` alike (ggml's `ggml_vec_dot_q4_0_q8_0` on
//!   ARMv8.2);
//! - without it ([`Isa::Neon`], Cortex-A72): `smull`/`smull2` to 16-bit products, `addp`
//!   of neighbouring pairs and `sadalp` into the 32-bit lanes. Every product fits in i16
//!   (`|127·127| < 2¹⁴`), and so does a sum of two.
//!
//! `sdot` is written as inline assembly (the `vdotq_s32` intrinsic is not stable Rust yet)
//! inside `#[target_feature(enable = "dotprod")]` functions that are entered only at
//! [`Isa::NeonDot`]: a CPU without the extension never executes it.

// Tiles index several register arrays by input and quad of rows in one loop body.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;
use std::arch::asm;

use flm_core::panels::{PANEL_ROWS, STEP};
use flm_core::quant::BLOCK;

use super::int4::Int4Params;
use super::{Acts, QuantWeight};
use crate::cpu::simd::neon::f16x4_to_f32;
use crate::cpu::Isa;

/// Input rows per tile.
const TILE_INPUTS: usize = 2;

/// A row kernel (a [`super::RowKernel`]) written once for both NEON levels: `DOT` says whether
/// it may use `sdot`.
pub(super) trait DotKernel {
    fn each_tile<const DOT: bool>(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]);
}

/// Runs `K` with `sdot` at [`Isa::NeonDot`] and without it at [`Isa::Neon`]; the caller
/// guarantees that the CPU supports `isa`.
pub(super) fn rows_with<K: DotKernel>(
    isa: Isa,
    w: &QuantWeight<'_>,
    acts: &Acts,
    j0: usize,
    yt: &mut [f32],
) {
    if isa == Isa::NeonDot {
        // SAFETY: the caller guarantees FEAT_DotProd at this level.
        unsafe { rows_dot::<K>(w, acts, j0, yt) }
    } else {
        K::each_tile::<false>(w, acts, j0, yt)
    }
}

/// `K` compiled with the dot-product extension (its `each_tile` is inlined here).
#[target_feature(enable = "dotprod")]
unsafe fn rows_dot<K: DotKernel>(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
    K::each_tile::<true>(w, acts, j0, yt)
}

/// Vectors of 4 rows in a panel.
const QUADS: usize = PANEL_ROWS / 4;

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

/// `acc + Σ` of the 4 byte products of each lane of `w` and `x`: `sdot`, or `smull`,
/// `addp` and `sadalp` without it (`DOT` false).
#[inline(always)]
pub(super) fn dot4<const DOT: bool>(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    // SAFETY: NEON (every aarch64 target); `sdot` only when `DOT`, which only the
    // `#[target_feature(enable = "dotprod")]` kernels entered at `Isa::NeonDot` pass.
    unsafe {
        if DOT {
            sdot(acc, w, x)
        } else {
            let lo = vmull_s8(vget_low_s8(w), vget_low_s8(x));
            let hi = vmull_high_s8(w, x);
            vpadalq_s16(acc, vpaddq_s16(lo, hi))
        }
    }
}

/// 4 activation codes at `p`, repeated in the 4 lanes.
#[inline(always)]
fn broadcast4(p: &[i8]) -> int8x16_t {
    let word = i32::from_le_bytes([p[0] as u8, p[1] as u8, p[2] as u8, p[3] as u8]);
    // SAFETY: NEON; registers only.
    unsafe { vreinterpretq_s8_s32(vdupq_n_s32(word)) }
}

/// The panel of 16 rows at `j` × every input row, into `yt[(dj)·n + i]`, in the order of
/// [`super::panels`]. `isa` is [`Isa::Neon`] or [`Isa::NeonDot`], and the caller
/// guarantees that the CPU supports it.
pub(super) fn panel(isa: Isa, w: &QuantWeight<'_>, acts: &Acts, j: usize, yt: &mut [f32]) {
    let mut i = 0;
    while i < acts.n {
        let t = (acts.n - i).min(TILE_INPUTS);
        match (isa, t) {
            // SAFETY: `Isa::NeonDot` is only accepted on CPUs with dotprod.
            (Isa::NeonDot, 1) => unsafe { panel_dot::<1>(w, acts, j, i, yt) },
            // SAFETY: as above.
            (Isa::NeonDot, _) => unsafe { panel_dot::<2>(w, acts, j, i, yt) },
            (_, 1) => panel_body::<1, false>(w, acts, j, i, yt),
            _ => panel_body::<2, false>(w, acts, j, i, yt),
        }
        i += t;
    }
}

#[target_feature(enable = "dotprod")]
unsafe fn panel_dot<const T: usize>(
    w: &QuantWeight<'_>,
    acts: &Acts,
    j: usize,
    i: usize,
    yt: &mut [f32],
) {
    panel_body::<T, true>(w, acts, j, i, yt)
}

/// [`panel`] for the input rows `i..i + T`.
#[inline(always)]
fn panel_body<const T: usize, const DOT: bool>(
    w: &QuantWeight<'_>,
    acts: &Acts,
    j: usize,
    i: usize,
    yt: &mut [f32],
) {
    let (panel, _) = w.panel(j);
    let n = acts.n;
    let qs: [&[i8]; T] = std::array::from_fn(|t| acts.row_qs(i + t));
    let ds: [&[f32]; T] = std::array::from_fn(|t| acts.row_d(i + t));
    let int4 = Int4Params::new(w.dtype, w.kp, PANEL_ROWS);
    // SAFETY: NEON (every aarch64 target); loads stay within `panel` (sliced).
    unsafe {
        let load = |at: usize| -> [int8x16_t; QUADS] {
            let step = panel[at..at + STEP * PANEL_ROWS].as_ptr() as *const i8;
            std::array::from_fn(|q| vld1q_s8(step.add(16 * q)))
        };
        let mut acc = [[vdupq_n_f32(0.0); QUADS]; T];
        let mut dg = [vdupq_n_f32(0.0); QUADS];
        for b in 0..acts.blocks {
            let mut c = [[vdupq_n_s32(0); QUADS]; T];
            match int4 {
                None => {
                    for s in 0..BLOCK / STEP {
                        let wv = load(4 * PANEL_ROWS + (BLOCK / STEP * b + s) * 64);
                        for t in 0..T {
                            let x = broadcast4(&qs[t][BLOCK * b + STEP * s..]);
                            for q in 0..QUADS {
                                c[t][q] = dot4::<DOT>(c[t][q], wv[q], x);
                            }
                        }
                    }
                    for t in 0..T {
                        for q in 0..QUADS {
                            let p = vcvtq_f32_s32(c[t][q]);
                            acc[t][q] = vfmaq_n_f32(acc[t][q], p, ds[t][b]);
                        }
                    }
                }
                Some(p) => {
                    let g = b / (p.layout.group / BLOCK);
                    if b % (p.layout.group / BLOCK) == 0 {
                        dg = half16(&panel[p.layout.scales(g)..]);
                    }
                    let low = vdupq_n_u8(0x0f);
                    for s in 0..BLOCK / (2 * STEP) {
                        let wv = load(p.layout.step(BLOCK / (2 * STEP) * b + s));
                        let lo: [int8x16_t; QUADS] = std::array::from_fn(|q| {
                            vreinterpretq_s8_u8(vandq_u8(vreinterpretq_u8_s8(wv[q]), low))
                        });
                        let hi: [int8x16_t; QUADS] = std::array::from_fn(|q| {
                            vreinterpretq_s8_u8(vshrq_n_u8::<4>(vreinterpretq_u8_s8(wv[q])))
                        });
                        for t in 0..T {
                            let at = BLOCK * b + 2 * STEP * s;
                            let (xlo, xhi) =
                                (broadcast4(&qs[t][at..]), broadcast4(&qs[t][at + STEP..]));
                            for q in 0..QUADS {
                                c[t][q] = dot4::<DOT>(dot4::<DOT>(c[t][q], lo[q], xlo), hi[q], xhi);
                            }
                        }
                    }
                    for t in 0..T {
                        for q in 0..QUADS {
                            let s = vmulq_n_f32(dg[q], ds[t][b]);
                            acc[t][q] = vfmaq_f32(acc[t][q], vcvtq_f32_s32(c[t][q]), s);
                        }
                    }
                }
            }
        }
        if let Some(p) = int4 {
            for g in 0..p.groups {
                let mins = half16(&panel[p.layout.mins(g)..]);
                let scales = half16(&panel[p.layout.scales(g)..]);
                for q in 0..QUADS {
                    let mut mq = vmulq_n_f32(mins[q], p.factor);
                    if p.times_scale {
                        mq = vmulq_f32(mq, scales[q]);
                    }
                    for t in 0..T {
                        let gs = acts.row_gsum(i + t)[g];
                        acc[t][q] = vfmaq_n_f32(acc[t][q], mq, gs);
                    }
                }
            }
        }
        for t in 0..T {
            let mut out = [0.0f32; PANEL_ROWS];
            for q in 0..QUADS {
                vst1q_f32(out[4 * q..].as_mut_ptr(), acc[t][q]);
            }
            for (dr, v) in out.iter().enumerate() {
                yt[dr * n + i + t] = match int4 {
                    None => {
                        let s = &panel[4 * dr..4 * dr + 4];
                        f32::from_le_bytes([s[0], s[1], s[2], s[3]]) * v
                    }
                    Some(_) => *v,
                };
            }
        }
    }
}

/// 16 f16 numbers at `bytes` as 4 vectors of f32.
#[inline(always)]
fn half16(bytes: &[u8]) -> [float32x4_t; QUADS] {
    let bytes = &bytes[..2 * PANEL_ROWS];
    // SAFETY: NEON; the 4 loads of 8 bytes stay within `bytes` (sliced above).
    std::array::from_fn(|q| unsafe {
        f16x4_to_f32(vld1_u16(bytes[8 * q..].as_ptr() as *const u16))
    })
}
