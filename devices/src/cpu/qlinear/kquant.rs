//! Linear layers with K-quant weights ([`DataType::Q4K`], `Q5K`, `Q6K`, ggml's super-blocks
//! as they are): each run of 32 weights dotted against one int8 activation block in exact
//! integers, then scaled (the formulas of [`flm_core::kquant`]).
//!
//! **One order at every level.** An output keeps 8 f32 lanes for its sums and 8 for its
//! minimums, lane `r` for run `r` of every super-block. Run `r` of a super-block (scale
//! `f_r`, minimum `g_r`: [`kquant::run_scales`]), over activation block `b` (scale `a_b`,
//! code sum `bsum_b`), with the exact integer `isum` of its codes (Q6_K: its two halves
//! times their i8 scales) adds `acc_r = fma(isum, f_r·a_b, acc_r)` and, for Q4_K and Q5_K,
//! `min_r = fma(bsum_b, g_r·a_b, min_r)`. The output is `lane_sum8(acc) − lane_sum8(min)`
//! ([`super::lane_sum8`]). The portable loops here (the twin every other level is tested
//! against), AVX2 `vpmaddubsw` in `kquant_x86` (also run at the AVX-VNNI, AVX-512 and AMX
//! levels: the unpacking of the codes, not the multiply, bounds these kernels, and every
//! such CPU has AVX2; the 8 runs fill one vector) and NEON with and without `sdot` in
//! `kquant_neon` follow it, so every level computes the same bits; each output depends on
//! its own row only (batch invariance).

use flm_core::kquant::{self, RUN, RUNS};
use flm_core::DataType;

use super::{lane_sum8, Acts, QuantWeight};
use crate::cpu::simd::fma;
use crate::cpu::Isa;

/// See [`super::RowKernel`], for a K-quant `w` and [`Acts`] in natural order.
pub(super) fn rows(isa: Isa, w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
    match isa {
        // SAFETY: `CpuDevice::with_isa` only accepts levels this CPU supports, and every
        // x86 level above the portable one has AVX2.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni | Isa::Avx512 | Isa::Amx => unsafe {
            super::kquant_x86::rows(w, acts, j0, yt)
        },
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        Isa::Neon | Isa::NeonDot => {
            super::neon::rows_with::<super::kquant_neon::KQuant>(isa, w, acts, j0, yt)
        }
        _ => each_output(w, acts, j0, yt, dot),
    }
}

/// Calls `dot(dtype, weight row, codes, block scales, block sums)` for each output of
/// `yt` (see [`super::RowKernel`]).
#[inline(always)]
pub(super) fn each_output(
    w: &QuantWeight<'_>,
    acts: &Acts,
    j0: usize,
    yt: &mut [f32],
    dot: impl Fn(DataType, &[u8], &[i8], &[f32], &[i32]) -> f32,
) {
    let n = acts.n;
    for (dj, ys) in yt.chunks_exact_mut(n).enumerate() {
        let row = w.row(j0 + dj);
        for (i, y) in ys.iter_mut().enumerate() {
            *y = dot(
                w.dtype,
                row,
                acts.row_qs(i),
                acts.row_d(i),
                acts.row_bsum(i),
            );
        }
    }
}

/// `Σ ŵ·x` of one K-quant row against one activation row (codes `qs`, block scales `d`,
/// block sums `bsum`), in the order of the module docs.
fn dot(dtype: DataType, row: &[u8], qs: &[i8], d: &[f32], bsum: &[i32]) -> f32 {
    let bb = kquant::block_bytes(dtype);
    let (mut acc, mut mins) = ([0.0f32; RUNS], [0.0f32; RUNS]);
    let mut codes = [0u8; RUN];
    for (s, block) in row.chunks_exact(bb).enumerate() {
        for r in 0..RUNS {
            let b = s * RUNS + r;
            let x = &qs[b * RUN..(b + 1) * RUN];
            kquant::run_codes(dtype, block, r, &mut codes);
            let (f, g) = kquant::run_scales(dtype, block, r);
            let half = |range: std::ops::Range<usize>, offset: i32| -> i32 {
                codes[range.clone()]
                    .iter()
                    .zip(&x[range])
                    .map(|(&q, &x)| (i32::from(q) - offset) * i32::from(x))
                    .sum()
            };
            if dtype == DataType::Q6K {
                let (sa, sb) = kquant::q6_scales(block, r);
                let isum = sa * half(0..16, 32) + sb * half(16..32, 32);
                acc[r] = fma(isum as f32, f * d[b], acc[r]);
            } else {
                acc[r] = fma(half(0..RUN, 0) as f32, f * d[b], acc[r]);
                mins[r] = fma(bsum[b] as f32, g * d[b], mins[r]);
            }
        }
    }
    lane_sum8(acc) - lane_sum8(mins)
}
