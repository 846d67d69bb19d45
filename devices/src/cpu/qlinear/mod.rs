//! Linear layers with int8 and int4 weights: integer dot products against activations
//! quantised to int8 on the fly, as FastLLM and ggml compute them.
//!
//! Each input row is quantised once per call, in blocks of [`BLOCK`] values with scale
//! `a = max|x| / 127` and codes `q_x = x · (1/a)` rounded to nearest (ggml's
//! `quantize_row_q8_0`, with ties to even), into an [`Acts`]. An output is then
//! `s · Σ_b a_b Σ q_w q_x` (int8, per-channel scale `s`) or
//! `Σ_b d_g a_b Σ q_w q_x + Σ_g m_g Σ_{b ∈ g} a_b Σ q_x` (int4, group scale `d_g`, minimum
//! `m_g`), every inner sum an exact integer (weight layouts in [`flm_core::quant`]).
//!
//! With [`ActivationBits::Int16`] each row is followed by its residual `x − a·q_x`,
//! quantised the same way, and an output is the sum of the two rows' outputs: the integer
//! kernels run unchanged over twice the rows, and the activations keep about 15 bits
//! instead of 7 (the weights are read once for both rows).
//!
//! Kernels, all computing that formula:
//! - [`panels`]: int8 and int4 weights in panels of 16 rows ([`flm_core::panels`]), summed
//!   in one order at every level, so that every level computes the same bits: the portable
//!   twin and the AVX2, AVX-VNNI and AVX-512 VNNI kernels there, the NEON ones (`sdot`
//!   where the CPU has the dot-product extension, `smull` where it has not) in `neon`;
//! - `amx`: Intel AMX tile multiplies of 16 weight rows × 16 input rows per block, for
//!   prefill of at least [`AMX_MIN_ROWS`] input rows, in the same order; below that
//!   (decode), the AVX-512 panel kernels;
//! - `kquant` (with `kquant_x86`, `kquant_neon`): ggml's K-quants, see there;
//! - `runs`: ggml's Q5_0, Q8_0, IQ4_NL, IQ4_XS and MXFP4 blocks, runs of 32 int8 codes (4-bit
//!   ones through a table) under one scale each, see there.
//!
//! Batch invariance (Thinking Machines Lab, "Defeating Nondeterminism in LLM Inference",
//! 2025): at one instruction-set level, an output `y[i, j]` has the same bits whatever the
//! other input rows of the call, the position of row `i` among them, the tile that computes
//! it and the thread split. Each input row is quantised on its own; the integer sums are
//! exact; and every kernel accumulates the scaled sums of one output in an order fixed by
//! `k`, whatever the tile shape. `devices/tests/batch_invariance.rs` checks it. Every dtype
//! goes further: its kernels sum in one order at every level, so that every level computes
//! the same bits (`devices/tests/isa_twins.rs`, `tests/level_determinism.rs`).

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
mod int4;
mod kquant;
#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
mod kquant_neon;
#[cfg(target_arch = "x86_64")]
mod kquant_x86;
#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
mod neon;
mod panels;
mod runs;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::cell::Cell;

use flm_core::ggml::GgmlType;
use flm_core::quant::{self, BLOCK};
use flm_core::{DataType, Format, Result};
use rayon::prelude::*;

use super::schedule::{guided, MAX_PARTS};
use super::{scratch, shape_err, transpose, Isa, PARALLEL_MIN_WORK};

/// One 64-byte cache line of a [`Lines`] buffer.
#[repr(C, align(64))]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Line([u8; 64]);

/// A buffer of `len` values of `T` that starts on a cache line.
///
/// The AVX-512 kernels load activation codes and scales 64 bytes at a time, at multiples of 64
/// bytes from a row's start. From a heap `Vec` (16 bytes past a line in TinyLlama's decode)
/// each such load straddled two cache lines, which slowed int4 decode by a few %
/// (docs/benchmarks.md, "Kernel choices").
#[derive(Default)]
struct Lines<T> {
    lines: Vec<Line>,
    len: usize,
    _values: std::marker::PhantomData<T>,
}

impl<T: bytemuck::Pod> Lines<T> {
    /// Resizes the buffer to `len` zeros.
    fn reset(&mut self, len: usize) {
        self.lines.clear();
        self.lines
            .resize((len * size_of::<T>()).div_ceil(64), Line([0; 64]));
        self.len = len;
    }

    fn as_slice(&self) -> &[T] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }

    fn as_mut_slice(&mut self) -> &mut [T] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }
}

/// Input rows quantised to int8 blocks of 32 codes, in their natural order.
#[derive(Default)]
pub(crate) struct Acts {
    /// Input rows.
    pub n: usize,
    /// Blocks per row: the weights' padded columns / 32.
    pub blocks: usize,
    /// `n × blocks × 32` codes.
    qs: Lines<i8>,
    /// `n × blocks` block scales `a`.
    d: Lines<f32>,
    /// Weight groups per row (int4: padded columns / group; int8: 1).
    pub groups: usize,
    /// `n × groups`: `Σ_{b ∈ g} a_b Σ q_x`, the factor of the int4 minimum `m_g` and of the
    /// offset of unsigned int8 codes.
    gsum: Lines<f32>,
    /// `n × blocks`: `Σ q_x` of each block, exact.
    bsum: Lines<i32>,
    /// `n × blocks × 8`: `−128 · Σ q_x` of each 4 codes, the bias that `vpdpbusd` starts
    /// from for weight codes stored `+ 128` (x86's panels of `runs`; empty for other
    /// dtypes).
    #[cfg(target_arch = "x86_64")]
    step_bias: Lines<i32>,
    /// The same inputs as AMX tiles ([`Isa::Amx`] only).
    #[cfg(target_arch = "x86_64")]
    pub tiles: amx::TileActs,
}

impl Acts {
    /// Quantises `x` (`n` rows of `k`) for `dtype` weights with `kp` padded columns and
    /// groups of `group` columns, with code compiled for `isa` (the same arithmetic at every
    /// level, so the result does not depend on it).
    #[allow(clippy::too_many_arguments)]
    fn quantize(
        &mut self,
        isa: Isa,
        dtype: DataType,
        x: &[f32],
        n: usize,
        k: usize,
        kp: usize,
        group: usize,
    ) {
        // Only the AMX tiles of int8 and int4 weights (panels of other types run `vpdpbusd`)
        // depend on the dtype.
        #[cfg(not(target_arch = "x86_64"))]
        let _ = dtype;
        let blocks = kp / BLOCK;
        let groups = kp / group;
        self.n = n;
        self.blocks = blocks;
        self.groups = groups;
        self.qs.reset(n * blocks * BLOCK);
        self.d.reset(n * blocks);
        self.gsum.reset(n * groups);
        self.bsum.reset(n * blocks);
        let rows = QuantRows {
            x,
            k,
            per_group: group / BLOCK,
        };
        match isa {
            // SAFETY: `CpuDevice::with_isa` only accepts levels this CPU supports.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Amx => unsafe { rows.run_avx512(self) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::AvxVnni => unsafe { rows.run_avx2(self) },
            #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
            Isa::Neon | Isa::NeonDot => rows.run_with(self, neon::quantize_block),
            _ => rows.run(self),
        }
        #[cfg(target_arch = "x86_64")]
        {
            let tiled = matches!(dtype.format(), Some(Format::Int8 | Format::Int4 { .. }));
            if runs::reads_step_biases(isa) && flm_core::panels::has_panels(dtype) && !tiled {
                let (qs, bias) = (self.qs.as_slice(), &mut self.step_bias);
                bias.reset(qs.len() / 4);
                for (b, x) in bias.as_mut_slice().iter_mut().zip(qs.chunks_exact(4)) {
                    *b = -128 * x.iter().map(|&q| i32::from(q)).sum::<i32>();
                }
            }
            if isa == Isa::Amx && n >= AMX_MIN_ROWS && tiled {
                let mut tiles = std::mem::take(&mut self.tiles);
                tiles.pack(self);
                self.tiles = tiles;
            }
        }
    }

    /// Codes of row `i`.
    pub fn row_qs(&self, i: usize) -> &[i8] {
        &self.qs.as_slice()[i * self.blocks * BLOCK..(i + 1) * self.blocks * BLOCK]
    }

    /// Block scales of row `i`.
    pub fn row_d(&self, i: usize) -> &[f32] {
        &self.d.as_slice()[i * self.blocks..(i + 1) * self.blocks]
    }

    /// Group sums of row `i`.
    pub fn row_gsum(&self, i: usize) -> &[f32] {
        &self.gsum.as_slice()[i * self.groups..(i + 1) * self.groups]
    }

    /// Block sums of row `i` (read by the AMX level's int8 decode kernel and the K-quant
    /// kernels).
    pub fn row_bsum(&self, i: usize) -> &[i32] {
        &self.bsum.as_slice()[i * self.blocks..(i + 1) * self.blocks]
    }

    /// The biases of row `i`'s steps of 4 codes (`−128 · Σ q_x`; filled for the dtypes of
    /// x86's run panels at the VNNI levels only).
    #[cfg(target_arch = "x86_64")]
    pub fn row_step_bias(&self, i: usize) -> &[i32] {
        let steps = self.blocks * BLOCK / 4;
        &self.step_bias.as_slice()[i * steps..(i + 1) * steps]
    }
}

/// The sum of 8 f32 lanes in the tree of the K-quant and `runs` kernels at every level (x86's
/// `hsum256`): lane `l` plus lane `l + 4`, then `l + 2`, then `l + 1`.
#[inline(always)]
fn lane_sum8(v: [f32; 8]) -> f32 {
    let s: [f32; 4] = std::array::from_fn(|l| v[l] + v[l + 4]);
    (s[0] + s[2]) + (s[1] + s[3])
}

/// The input of [`Acts::quantize`].
struct QuantRows<'a> {
    x: &'a [f32],
    k: usize,
    per_group: usize,
}

/// `x` rounded to the nearest integer (ties to even), for `|x| < 2²²`: adding `1.5·2²³`
/// leaves the integer in the low mantissa bits. Bit operations only, so it vectorises
/// where `round` and a saturating `as i32` would not.
#[inline(always)]
fn round_to_i32(x: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32
}

/// Quantises up to 32 values into the 16 low and 16 high codes of a block (zeros past
/// `values.len()`); returns the scale `a = max|x| / 127` and `Σ q`. The SIMD versions in
/// `x86` compute the same bits (`cvtps2dq` also rounds to nearest, ties to even). A block
/// holding a NaN or an infinity gives [`non_finite_block`].
#[inline(always)]
fn quantize_block(values: &[f32], lo: &mut [i8], hi: &mut [i8]) -> (f32, i32) {
    let mut v = [0.0f32; BLOCK];
    v[..values.len()].copy_from_slice(values);
    if !v.iter().all(|x| x.is_finite()) {
        return non_finite_block(lo, hi);
    }
    let mut lanes = [0.0f32; 8];
    for c in v.chunks_exact(8) {
        for (m, x) in lanes.iter_mut().zip(c) {
            let a = x.abs();
            *m = if a > *m { a } else { *m };
        }
    }
    let amax = lanes.iter().fold(0.0f32, |m, &x| if x > m { x } else { m });
    let d = amax / 127.0;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i32; BLOCK];
    for (q, x) in q.iter_mut().zip(&v) {
        *q = round_to_i32(x * inv);
    }
    for (o, q) in lo.iter_mut().zip(&q[..16]) {
        *o = *q as i8;
    }
    for (o, q) in hi.iter_mut().zip(&q[16..]) {
        *o = *q as i8;
    }
    (d, q.iter().sum())
}

/// The block of an input that holds a NaN or an infinity: zero codes and a NaN scale, so
/// that every output it enters is NaN at every level, as in f32 arithmetic, and the
/// integer sums stay within their bounds (codes rounded from a NaN would be arbitrary
/// integers, whose sum overflows).
#[inline(always)]
fn non_finite_block(lo: &mut [i8], hi: &mut [i8]) -> (f32, i32) {
    lo[..16].fill(0);
    hi[..16].fill(0);
    (f32::NAN, 0)
}

impl QuantRows<'_> {
    /// Fills `acts` with `block` quantising each block of 32 values.
    #[inline(always)]
    fn run_with(
        &self,
        acts: &mut Acts,
        block: impl Fn(&[f32], &mut [i8], &mut [i8]) -> (f32, i32),
    ) {
        let (blocks, groups) = (acts.blocks, acts.groups);
        // Int4 group sizes are powers of two; int8 has one group per row.
        let group_shift = if groups == 1 {
            usize::BITS - 1
        } else {
            self.per_group.trailing_zeros()
        };
        for i in 0..acts.n {
            let xr = &self.x[i * self.k..(i + 1) * self.k];
            let qs = &mut acts.qs.as_mut_slice()[i * blocks * BLOCK..(i + 1) * blocks * BLOCK];
            let ds = &mut acts.d.as_mut_slice()[i * blocks..(i + 1) * blocks];
            let gs = &mut acts.gsum.as_mut_slice()[i * groups..(i + 1) * groups];
            let bs = &mut acts.bsum.as_mut_slice()[i * blocks..(i + 1) * blocks];
            for (b, values) in xr.chunks(BLOCK).enumerate() {
                let (lo, hi) = qs[b * BLOCK..(b + 1) * BLOCK].split_at_mut(BLOCK / 2);
                let (d, sum) = block(values, lo, hi);
                ds[b] = d;
                bs[b] = sum;
                gs[b >> group_shift] += d * sum as f32;
            }
        }
    }

    fn run(&self, acts: &mut Acts) {
        self.run_with(acts, quantize_block)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run_avx2(&self, acts: &mut Acts) {
        // SAFETY: the caller guarantees AVX2.
        self.run_with(acts, |v, lo, hi| unsafe {
            x86::quantize_block_avx2(v, lo, hi)
        })
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn run_avx512(&self, acts: &mut Acts) {
        // SAFETY: the caller guarantees AVX-512.
        self.run_with(acts, |v, lo, hi| unsafe {
            x86::quantize_block_avx512(v, lo, hi)
        })
    }
}

/// A quantised weight matrix `[m, k]` (layouts in [`flm_core::quant`]; int8 in panels,
/// [`flm_core::panels`]).
#[derive(Clone, Copy)]
pub(crate) struct QuantWeight<'a> {
    pub dtype: DataType,
    pub bytes: &'a [u8],
    pub row_bytes: usize,
    /// Columns padded to the dtype's unit.
    pub kp: usize,
}

impl<'a> QuantWeight<'a> {
    /// No weight: fills arrays of weights past their last one.
    pub const EMPTY: QuantWeight<'static> = QuantWeight {
        dtype: DataType::I8,
        bytes: &[],
        row_bytes: 0,
        kp: 0,
    };

    /// Row `j`.
    pub fn row(&self, j: usize) -> &'a [u8] {
        &self.bytes[j * self.row_bytes..(j + 1) * self.row_bytes]
    }
}

/// The precision of the activations that int8, int4 and K-quant weights are dotted
/// against on the CPU (W8A8/W4A8 against W8A16/W4A16).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ActivationBits {
    /// int8 codes in blocks of 32 with an f32 scale each, as ggml dots Q4_0, Q4_1 and Q8_0
    /// against Q8_0/Q8_1 blocks: the fastest.
    #[default]
    Int8,
    /// The int8 codes plus the int8 codes of their rounding residual, per block: about 15
    /// bits of each activation. The integer work doubles (prefill is bound by it); decode
    /// reads the weights once, as with [`ActivationBits::Int8`].
    Int16,
}

impl std::str::FromStr for ActivationBits {
    type Err = String;

    /// `8` or `int8`, `16` or `int16`.
    fn from_str(s: &str) -> std::result::Result<ActivationBits, String> {
        match s {
            "8" | "int8" => Ok(ActivationBits::Int8),
            "16" | "int16" => Ok(ActivationBits::Int16),
            other => Err(format!("{other:?} activation bits: 8 or 16")),
        }
    }
}

impl std::fmt::Display for ActivationBits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ActivationBits::Int8 => "8",
            ActivationBits::Int16 => "16",
        })
    }
}

/// How a Linear runs on the CPU: the kernels' level and the activations' precision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LinearLevel {
    pub isa: Isa,
    pub activations: ActivationBits,
}

thread_local! {
    /// Quantised inputs (one per input of a call), the transposed prefill output and the
    /// rows with their residuals, reused across calls so that decode allocates nothing once
    /// warm (see `scratch`).
    static SCRATCH: Cell<(Vec<Acts>, Vec<f32>, Vec<f32>)> =
        const { Cell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// Writes each row of `x` (rows of `k`) followed by its residual after int8 block
/// quantisation, `x − a·q_x` (the [`quantize_block`] every level computes), into `out`.
fn with_residuals(x: &[f32], k: usize, out: &mut Vec<f32>) {
    out.clear();
    for row in x.chunks_exact(k) {
        out.extend_from_slice(row);
        for values in row.chunks(BLOCK) {
            let (mut lo, mut hi) = ([0i8; 16], [0i8; 16]);
            let (a, _) = quantize_block(values, &mut lo, &mut hi);
            let codes = lo.iter().chain(&hi);
            out.extend(
                values
                    .iter()
                    .zip(codes)
                    .map(|(&v, &q)| v - a * f32::from(q)),
            );
        }
    }
}

/// Output features per parallel task in prefill (one AMX panel); decode chunks are whole
/// multiples of it.
const ROWS_PER_TASK: usize = 16;

/// [`Isa::Amx`] multiplies tiles of 16 input rows from this many on; fewer are multiplied
/// one at a time (see `amx`).
pub(crate) const AMX_MIN_ROWS: usize = 8;

/// A row kernel: computes `yt[(j − j0)·n + i] = Σ ŵ_j · x_i` for the rows
/// `j0..j0 + yt.len() / n` of `w` against the `n` quantised input rows of `acts`, with code
/// compiled for the level `isa`.
type RowKernel = fn(Isa, &QuantWeight<'_>, &Acts, usize, &mut [f32]);

/// The CPU row kernel of each quantised weight format: the one table a new format plugs
/// its kernels into (each dispatches over the ISA levels itself). `None` for a format no
/// dtype holds (ggml's other block types are converted when a file is read).
fn row_kernel(format: Format) -> Option<RowKernel> {
    Some(match format {
        Format::Int8 | Format::Int4 { .. } => panel_rows,
        Format::Ggml(GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K) => kquant::rows,
        Format::Ggml(ty) => return runs::kernel(ty),
    })
}

/// The [`RowKernel`] of the formats in panels: AMX tiles for prefill at that level, the
/// panel kernels otherwise.
fn panel_rows(isa: Isa, w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Amx && acts.n >= AMX_MIN_ROWS {
        return amx::rows(w, &acts.tiles, j0, yt);
    }
    panels::rows(isa, w, acts, j0, yt)
}

/// `outs[p][n, m_p] = x_p[n, k] · ŵ_p[m_p, k]ᵀ + biases[p][m_p]` for the quantised weights
/// `ws[p]`, all of one dtype (see [`flm_core::Op::Linear`] and [`flm_core::Op::Linears`]),
/// where `x_p` is `xs[0]` when `xs` holds one input (every part reads it) or `xs[p]` when
/// it holds one per part (a decode step's routed experts' down projections). Each input is
/// quantised once, to `level.activations`; in decode the rows of all parts are split over
/// the threads at once. `ws`, `biases` and `outs` have one entry per part, 1 to
/// [`MAX_PARTS`] parts.
pub(crate) fn linear(
    level: LinearLevel,
    xs: &[&[f32]],
    n: usize,
    k: usize,
    ws: &[QuantWeight<'_>],
    biases: &[Option<&[f32]>],
    outs: &mut [&mut [f32]],
) -> Result<()> {
    let Some(first) = ws.first().filter(|_| ws.len() <= MAX_PARTS) else {
        return Err(shape_err(
            "Linear",
            format!("{} parts in one call", ws.len()),
        ));
    };
    if !(xs.len() == 1 || xs.len() == ws.len()) || xs.iter().any(|x| x.len() != n * k) {
        return Err(shape_err(
            "Linear",
            format!(
                "{} inputs for {} parts of [{n}, {k}] inputs",
                xs.len(),
                ws.len()
            ),
        ));
    }
    // The quantised input of part `p`.
    let input = |p: usize| if xs.len() == 1 { 0 } else { p };
    let (dtype, kp) = (first.dtype, first.kp);
    let Some(rows) = dtype.format().and_then(row_kernel) else {
        return Err(shape_err(
            "Linear",
            format!("{dtype} weights have no CPU kernel"),
        ));
    };
    let group = dtype.group_size().unwrap_or(kp);
    for (w, out) in ws.iter().zip(outs.iter()) {
        let m = out.len() / n;
        if w.dtype != dtype
            || w.kp != quant::padded_cols(w.dtype, k)
            || w.bytes.len() < m * w.row_bytes
        {
            return Err(shape_err(
                "Linear",
                format!(
                    "{} weight of {} bytes for [{m}, {k}] among {dtype} weights",
                    w.dtype,
                    w.bytes.len()
                ),
            ));
        }
    }
    let total: usize = outs.iter().map(|o| o.len() / n).sum();
    let isa = level.isa;
    let residual = level.activations == ActivationBits::Int16;
    // Kernel rows: with residuals, row 2i is input i and row 2i + 1 its residual.
    let rows_in = if residual { 2 * n } else { n };
    let parallel = rows_in * total * k >= PARALLEL_MIN_WORK;
    scratch::with(&SCRATCH, |(acts, yt, xr)| {
        acts.resize_with(acts.len().max(xs.len()), Acts::default);
        for (x, acts) in xs.iter().zip(acts.iter_mut()) {
            let x = if residual {
                with_residuals(x, k, xr);
                &xr[..]
            } else {
                x
            };
            acts.quantize(isa, dtype, x, rows_in, k, kp, group);
        }
        let acts = &acts[..];
        let run = |targets: &mut [&mut [f32]]| {
            if parallel && rows_in < AMX_MIN_ROWS {
                guided(targets, rows_in, ROWS_PER_TASK, |p, j0, part| {
                    rows(isa, &ws[p], &acts[input(p)], j0, part)
                });
                return;
            }
            for (p, (w, target)) in ws.iter().zip(targets.iter_mut()).enumerate() {
                let acts = &acts[input(p)];
                if parallel {
                    target
                        .par_chunks_mut(ROWS_PER_TASK * rows_in)
                        .enumerate()
                        .for_each(|(t, part)| rows(isa, w, acts, t * ROWS_PER_TASK, part));
                } else {
                    rows(isa, w, acts, 0, target);
                }
            }
        };
        // One kernel row writes into the outputs; more into `yt`, one part after the
        // other, transposed (or summed with their residuals' rows) below.
        if rows_in == 1 {
            run(outs);
        } else {
            yt.clear();
            yt.resize(total * rows_in, 0.0);
            let mut parts: [&mut [f32]; MAX_PARTS] = Default::default();
            let mut rest = &mut yt[..];
            for (part, out) in parts.iter_mut().zip(outs.iter()) {
                let len = out.len() / n * rows_in;
                (*part, rest) = std::mem::take(&mut rest).split_at_mut(len);
            }
            run(&mut parts[..ws.len()]);
        }
        let mut from = 0;
        for (out, bias) in outs.iter_mut().zip(biases) {
            let m = out.len() / n;
            if rows_in > 1 {
                let yt = &yt[from..from + m * rows_in];
                from += m * rows_in;
                if residual {
                    for (i, row) in out.chunks_exact_mut(m).enumerate() {
                        for (j, y) in row.iter_mut().enumerate() {
                            *y = yt[j * rows_in + 2 * i] + yt[j * rows_in + 2 * i + 1];
                        }
                    }
                } else {
                    transpose(yt, n, out);
                }
            }
            if let Some(b) = bias {
                for row in out.chunks_exact_mut(m) {
                    for (y, b) in row.iter_mut().zip(b.iter()) {
                        *y += b;
                    }
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
    fn every_level_quantises_blocks_to_the_same_bits() {
        let mut seed = 1u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        };
        // The block's scale by its bits (a NaN equals itself), its sum and its codes.
        type Block = ((u32, i32), [i8; 16], [i8; 16]);
        type Quantiser<'a> = &'a dyn Fn(&[f32], &mut [i8], &mut [i8]) -> (f32, i32);
        let quantize = |f: Quantiser<'_>, v: &[f32]| {
            let (mut lo, mut hi) = ([0i8; 16], [0i8; 16]);
            let (d, sum) = f(v, &mut lo, &mut hi);
            ((d.to_bits(), sum), lo, hi)
        };
        for len in [1, 5, 15, 16, 17, 31, 32] {
            for scale in [0.0, 1e-3, 1.0, 300.0] {
                let mut v: Vec<f32> = (0..len).map(|_| next() * scale).collect();
                // A NaN or an infinity at the last place, in the low or the high half.
                let poison = [None, Some(f32::NAN), Some(f32::INFINITY)][len % 3];
                if let (Some(p), true) = (poison, scale == 1.0) {
                    v[len - 1] = p;
                }
                let want: Block = quantize(&quantize_block, &v);
                #[cfg(target_arch = "x86_64")]
                for isa in [Isa::Avx2, Isa::Avx512] {
                    if !isa.is_supported() {
                        continue;
                    }
                    let got = quantize(
                        &|v, lo, hi| {
                            // SAFETY: the level is supported.
                            unsafe {
                                match isa {
                                    Isa::Avx512 => x86::quantize_block_avx512(v, lo, hi),
                                    _ => x86::quantize_block_avx2(v, lo, hi),
                                }
                            }
                        },
                        &v,
                    );
                    assert_eq!(got, want, "{isa} len {len} scale {scale}");
                }
                #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
                assert_eq!(
                    quantize(&neon::quantize_block, &v),
                    want,
                    "neon len {len} scale {scale}"
                );
                let ((d, sum), lo, hi) = want;
                let d = f32::from_bits(d);
                let codes = || lo.iter().chain(&hi).map(|&q| i32::from(q));
                assert_eq!(sum, codes().sum::<i32>());
                if v.iter().any(|x| !x.is_finite()) {
                    assert!(d.is_nan() && codes().all(|q| q == 0), "{v:?}");
                    continue;
                }
                for (&x, q) in v.iter().zip(codes()) {
                    assert!(
                        (q as f32 * d - x).abs() <= d / 2.0 * 1.0001,
                        "{x} vs {q}·{d}"
                    );
                }
            }
        }
    }
}
