//! Linear layers with int8 and int4 weights: integer dot products against activations
//! quantised to int8 on the fly, as FastLLM and ggml compute them.
//!
//! Each input row is quantised once per call, in blocks of [`BLOCK`] values with scale
//! `a = max|x| / 127` and codes `q_x = round(x / a)` (ggml's `quantize_row_q8_0`), into an
//! [`Acts`] laid out for the kernel family that will read it. An output is then
//! `s · Σ_b a_b Σ q_w q_x` (int8, per-channel scale `s`) or
//! `Σ_b d_g a_b Σ q_w q_x + Σ_g m_g Σ_{b ∈ g} a_b Σ q_x` (int4, group scale `d_g`, minimum
//! `m_g`), every inner sum an exact integer (weight layouts in [`flm_core::quant`]).
//!
//! Kernels, one module per instruction set, all computing that formula:
//! - [`scalar`]: portable loops, the twin every other kernel is tested against;
//! - `x86`: AVX2 (`vpmaddubsw`), AVX-VNNI and AVX-512 VNNI (`vpdpbusd`) micro-kernels that
//!   compute a tile of up to 4 weight rows × 4 input rows, so that prefill reuses each
//!   loaded weight vector for 4 tokens.

mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::cell::RefCell;

use flm_core::quant::{self, BLOCK};
use flm_core::{DataType, Result};
use rayon::prelude::*;

use super::{shape_err, Isa, PARALLEL_MIN_WORK};

/// Input rows quantised to int8 blocks, in the order a kernel family reads them.
///
/// Codes of each row are stored in chunks of `2·split` values: first the low 16 codes of
/// each block of the chunk, then the high 16, so that the low and high nibbles of
/// `split` bytes of int4 codes line up with them. `split == 16` is the natural order. Rows
/// are padded with zero blocks to whole multiples of the kernel's vector.
#[derive(Default)]
pub(crate) struct Acts {
    /// Input rows.
    pub n: usize,
    /// Blocks per row: the weights' padded columns / 32, rounded up to whole chunks.
    pub blocks: usize,
    /// `n × blocks × 32` codes.
    pub qs: Vec<i8>,
    /// `n × blocks` block scales `a` (0 for padding).
    pub d: Vec<f32>,
    /// Weight groups per row (int4: padded columns / group; int8: 1).
    pub groups: usize,
    /// `n × groups`: `Σ_{b ∈ g} a_b Σ q_x`, the factor of the int4 minimum `m_g` and of the
    /// offset of unsigned int8 codes.
    pub gsum: Vec<f32>,
}

impl Acts {
    /// Quantises `x` (`n` rows of `k`) for weights with `kp` padded columns and groups of
    /// `group` columns, in `layout`.
    fn quantize(&mut self, x: &[f32], n: usize, k: usize, kp: usize, group: usize, layout: Layout) {
        let Layout { split, pad_blocks } = layout;
        let chunk_blocks = 2 * split / BLOCK;
        let blocks = (kp / BLOCK).div_ceil(pad_blocks) * pad_blocks;
        let groups = kp / group;
        self.n = n;
        self.blocks = blocks;
        self.groups = groups;
        self.qs.clear();
        self.qs.resize(n * blocks * BLOCK, 0);
        self.d.clear();
        self.d.resize(n * blocks, 0.0);
        self.gsum.clear();
        self.gsum.resize(n * groups, 0.0);
        let per_group = group / BLOCK;
        for i in 0..n {
            let xr = &x[i * k..(i + 1) * k];
            let qs = &mut self.qs[i * blocks * BLOCK..(i + 1) * blocks * BLOCK];
            let ds = &mut self.d[i * blocks..(i + 1) * blocks];
            let gs = &mut self.gsum[i * groups..(i + 1) * groups];
            for (b, values) in xr.chunks(BLOCK).enumerate() {
                let amax = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                let (c, j) = (b / chunk_blocks, b % chunk_blocks);
                let base = c * 2 * split + j * 16;
                let mut sum = 0i32;
                for (t, &v) in values.iter().enumerate() {
                    let q = (v * inv).round() as i8;
                    sum += i32::from(q);
                    let at = if t < 16 {
                        base + t
                    } else {
                        base + split + t - 16
                    };
                    qs[at] = q;
                }
                ds[b] = d;
                gs[b / per_group] += d * sum as f32;
            }
        }
    }

    /// Codes of row `i`.
    pub fn row_qs(&self, i: usize) -> &[i8] {
        &self.qs[i * self.blocks * BLOCK..(i + 1) * self.blocks * BLOCK]
    }

    /// Block scales of row `i`.
    pub fn row_d(&self, i: usize) -> &[f32] {
        &self.d[i * self.blocks..(i + 1) * self.blocks]
    }

    /// Group sums of row `i`.
    pub fn row_gsum(&self, i: usize) -> &[f32] {
        &self.gsum[i * self.groups..(i + 1) * self.groups]
    }
}

/// A quantised weight matrix `[m, k]` (layouts in [`flm_core::quant`]).
#[derive(Clone, Copy)]
pub(crate) struct QuantWeight<'a> {
    pub dtype: DataType,
    pub bytes: &'a [u8],
    pub row_bytes: usize,
    /// Columns padded to the dtype's unit.
    pub kp: usize,
}

impl<'a> QuantWeight<'a> {
    /// Row `j`.
    pub fn row(&self, j: usize) -> &'a [u8] {
        &self.bytes[j * self.row_bytes..(j + 1) * self.row_bytes]
    }
}

thread_local! {
    /// Quantised inputs and the transposed prefill output, reused across calls so that
    /// decode allocates nothing once warm.
    static SCRATCH: RefCell<(Acts, Vec<f32>)> = RefCell::new((Acts::default(), Vec::new()));
}

/// Output features per parallel task.
const ROWS_PER_TASK: usize = 16;

/// The order and padding of the [`Acts`] a kernel family reads.
#[derive(Clone, Copy)]
struct Layout {
    /// Chunk half-width in values (16: natural order).
    split: usize,
    /// Rows are padded to a multiple of this many blocks.
    pad_blocks: usize,
}

impl Layout {
    fn of(isa: Isa, dtype: DataType) -> Layout {
        let (split, pad_blocks) = match (isa, dtype) {
            (Isa::Scalar, _) => (16, 1),
            (Isa::Avx2 | Isa::AvxVnni, DataType::I8) => (16, 1),
            (Isa::Avx2 | Isa::AvxVnni, _) => (32, 2),
            (Isa::Avx512, DataType::I8) => (16, 2),
            (Isa::Avx512, _) => (64, 4),
        };
        Layout { split, pad_blocks }
    }
}

/// Computes `yt[(j − j0)·n + i] = Σ ŵ_j · x_i` for the rows `j0..j0 + yt.len() / n` of `w`.
fn rows(isa: Isa, w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni | Isa::Avx512 => x86::rows(isa, w, acts, j0, yt),
        _ => scalar::rows(w, acts, j0, yt),
    }
}

/// `out[n, m] = x[n, k] · ŵ[m, k]ᵀ + bias[m]` for quantised `w` (see
/// [`flm_core::Op::Linear`]).
pub(crate) fn linear(
    isa: Isa,
    w: &QuantWeight<'_>,
    x: &[f32],
    n: usize,
    k: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<()> {
    let m = out.len() / n;
    let group = w.dtype.group_size().unwrap_or(w.kp);
    if w.kp != quant::padded_cols(w.dtype, k) || w.bytes.len() < m * w.row_bytes {
        return Err(shape_err(
            "Linear",
            format!(
                "{} weight of {} bytes for [{m}, {k}]",
                w.dtype,
                w.bytes.len()
            ),
        ));
    }
    SCRATCH.with_borrow_mut(|(acts, yt)| {
        acts.quantize(x, n, k, w.kp, group, Layout::of(isa, w.dtype));
        let acts = &*acts;
        let parallel = n * m * k >= PARALLEL_MIN_WORK;
        let target: &mut [f32] = if n == 1 {
            out
        } else {
            yt.clear();
            yt.resize(m * n, 0.0);
            yt
        };
        if parallel {
            target
                .par_chunks_mut(ROWS_PER_TASK * n)
                .enumerate()
                .for_each(|(t, part)| rows(isa, w, acts, t * ROWS_PER_TASK, part));
        } else {
            rows(isa, w, acts, 0, target);
        }
        if n > 1 {
            for (j, ys) in yt.chunks_exact(n).enumerate() {
                for (i, y) in ys.iter().enumerate() {
                    out[i * m + j] = *y;
                }
            }
        }
        if let Some(b) = bias {
            for row in out.chunks_exact_mut(m) {
                for (y, b) in row.iter_mut().zip(b) {
                    *y += b;
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_order_puts_low_halves_first() {
        let x: Vec<f32> = (0..128).map(|i| i as f32 - 60.0).collect();
        let mut natural = Acts::default();
        let layout = |split, pad_blocks| Layout { split, pad_blocks };
        natural.quantize(&x, 1, 128, 128, 128, layout(16, 1));
        let mut split = Acts::default();
        split.quantize(&x, 1, 128, 128, 128, layout(64, 4));
        for b in 0..4 {
            for t in 0..16 {
                assert_eq!(split.qs[b * 16 + t], natural.qs[b * 32 + t]);
                assert_eq!(split.qs[64 + b * 16 + t], natural.qs[b * 32 + 16 + t]);
            }
        }
        assert_eq!(split.d, natural.d);
        assert_eq!(split.gsum, natural.gsum);
    }
}
