//! Linear layers: `y = x · Wᵀ + b`.
//!
//! Float weights (f32, f16, bf16): the SIMD kernels compute tiles of `R` weight rows × `T`
//! input rows, loading (and widening) each weight vector once for the `T` inputs and each
//! input vector once for the `R` rows, with one accumulator per output and panel of 512
//! columns, reduced eight (or four) at a time at the end of the panel ([`Simd::sums8`]).
//! Decode (`n == 1`) is a matrix × vector product bound by reading the weights once: the
//! threads claim long runs of rows by guided self-scheduling, and a tile of 4 rows takes one
//! row of each quarter of its run, so that each thread reads 4 long sequential streams,
//! each prefetched [`DECODE_AHEAD`] bytes ahead (the layout of the int kernels' decode, see
//! `qlinear`). Prefill uses 4 × 4 tiles with
//! AVX-512 (16 accumulators of 32 registers), 4 × 2 where 16 vectors fit (the portable
//! level) and 2 × 2 with AVX2 and NEON (4 accumulators of 2 or 4 registers each), over
//! panels of 512 columns × 16 weight rows that every tile of input rows passes over while
//! the panel is in L1; a task holds a block of weight rows in L2. (Packing the panels
//! contiguously, widened once, measured slower here: the packing pass costs more than the
//! cache conflicts it avoids.)
//!
//! Batch invariance (Thinking Machines Lab, "Defeating Nondeterminism in LLM Inference",
//! 2025): at one instruction-set level, output `y[i, j]` has the same bits whatever the
//! other input rows of the call, the position of row `i` among them, the tile that
//! computes it and the thread split. Its summation order depends on `k` only: per panel of
//! 512 columns, one vector accumulator over the columns in order, its lanes summed by one
//! tree ([`Simd::sums4`] and [`Simd::sums8`] add alike), then bias plus the panel sums in
//! order; decode walks the same panels as prefill. Continuous batching and speculative
//! decoding rely on it (`devices/tests/batch_invariance.rs`). Since every level has vectors
//! of the same lanes and sums them by one tree (see `simd`), every level computes the same
//! bits.
//!
//! Work is split over blocks of weight rows (output features) when it exceeds
//! [`PARALLEL_MIN_WORK`]; a parallel prefill writes the transposed output into a
//! thread-local buffer (see `scratch`) and transposes it into place. Smaller calls run on the calling thread
//! straight into the output, without allocating.
//!
//! Quantised weights (int8, int4) go to the integer kernels of `qlinear`, which give the
//! same guarantee.

use std::borrow::Cow;
use std::cell::Cell;
use std::ops::Range;

use flm_core::{panels, quant, Data, Layout, LinearPart, Result};
use rayon::prelude::*;

use super::qlinear::{self, LinearLevel, QuantWeight};
use super::simd::{self, Elem, Kernel, Simd};
use super::weights::WeightRows;
use super::{schedule, scratch};
use super::{shape_err, transpose, Isa, PARALLEL_MIN_WORK};

/// Weight rows a decode tile reads at once, each from its own stream (see [`Block::run`]).
const DECODE_STREAMS: usize = 4;

/// Bytes a decode stream is prefetched ahead of its loads: 4 long prefetched streams read
/// float weights faster than 2, 8 or 16 streams or adjacent rows (docs/benchmarks.md,
/// "Kernel choices").
const DECODE_AHEAD: usize = 2048;

/// Decode chunks are whole multiples of this many rows (4 tiles of [`DECODE_STREAMS`] rows),
/// as long as the int kernels' (one AMX panel).
const DECODE_CHUNK_ROWS: usize = 4 * DECODE_STREAMS;

/// Output features per parallel task in prefill: 64 f32 rows of 2048 are 512 KiB.
const PREFILL_ROWS: usize = 64;

/// Columns × weight rows of a prefill panel: 512 × 16 f32 are 32 KiB, which stay in L1
/// while the tiles of input rows (4 × 512 f32, 8 KiB) pass over them.
const PANEL_COLS: usize = 512;
/// See [`PANEL_COLS`].
const PANEL_ROWS: usize = 16;

thread_local! {
    /// The transposed output `[m, n]` of a parallel prefill (on the calling thread).
    static YT: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// The input gathered by a weight's input permutation ([`linears`]).
    static GATHERED: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// `output[n, m] = input[n, k] · weight[m, k]ᵀ + bias[m]` (see [`flm_core::Op::Linear`]);
/// f32 activations, weights f32, f16, bf16, int8 or int4.
pub(crate) fn linear(
    level: LinearLevel,
    input: &Data,
    weight: &Data,
    bias: Option<&Data>,
    output: &mut Data,
) -> Result<()> {
    linears(level, input, &mut [LinearPart::new(weight, bias, output)])
}

/// Each part's Linear over `input` (see [`flm_core::Op::Linears`]). Consecutive parts with
/// quantised weights of one dtype go to `qlinear` together, which quantises the input
/// once and splits all their rows over the threads at once; others run one at a time.
pub(crate) fn linears(
    level: LinearLevel,
    input: &Data,
    parts: &mut [LinearPart<'_>],
) -> Result<()> {
    let (n, k) = (input.rows(), input.cols());
    if n == 0 {
        return Ok(());
    }
    let input = input.as_f32()?;
    let same = |a: &LinearPart<'_>, b: &LinearPart<'_>| {
        a.weight.dtype() == b.weight.dtype() && same_perm(a.weight, b.weight)
    };
    // Taken for the call, so that a decode step with permuted weights allocates nothing
    // once warm (a nested call on this thread finds it empty and allocates its own).
    let mut gathered = GATHERED.take();
    let result = parts.chunk_by_mut(same).try_for_each(|run| {
        let x = match run[0].weight.input_perm() {
            Some(perm) => {
                gather_cols(input, k, perm.as_i32()?, &mut gathered);
                &gathered[..]
            }
            None => input,
        };
        for group in run.chunks_mut(schedule::MAX_PARTS) {
            if group[0].weight.dtype().is_quantized() {
                quant_group(level, x, n, k, group)?;
            } else {
                for part in group {
                    float_part(level.isa, x, n, k, part)?;
                }
            }
        }
        Ok(())
    });
    GATHERED.set(gathered);
    result
}

/// Whether `a` and `b` take their input in the same order: neither has an input
/// permutation, or both have equal ones (the q, k and v projections of an act-order GPTQ
/// layer share one, their Hessian's).
fn same_perm(a: &Data, b: &Data) -> bool {
    match (a.input_perm(), b.input_perm()) {
        (None, None) => true,
        (Some(p), Some(q)) => std::ptr::eq(p, q) || p.bytes().ok() == q.bytes().ok(),
        _ => false,
    }
}

/// Overwrites `out` with the rows of `x` (`k` columns each) with their columns gathered
/// by `perm`: `out[r, j] = x[r, perm[j]]` ([`Data::input_perm`]; `perm` was checked to be
/// a permutation of `0..k` when it was attached to its weight).
/// Rows are split over the threads from [`PARALLEL_MIN_WORK`] values (prefill).
fn gather_cols(x: &[f32], k: usize, perm: &[i32], out: &mut Vec<f32>) {
    out.resize(x.len(), 0.0);
    let row = |(dst, src): (&mut [f32], &[f32])| {
        for (d, &p) in dst.iter_mut().zip(perm) {
            *d = src[p as usize];
        }
    };
    if x.len() >= PARALLEL_MIN_WORK {
        out.par_chunks_exact_mut(k)
            .zip(x.par_chunks_exact(k))
            .for_each(row);
    } else {
        out.chunks_exact_mut(k).zip(x.chunks_exact(k)).for_each(row);
    }
}

/// A bias as f32 values.
fn bias_f32(bias: Option<&Data>) -> Result<Option<Cow<'_, [f32]>>> {
    bias.map(|b| match b.as_f32() {
        Ok(v) => Ok(Cow::Borrowed(v)),
        Err(_) => b.to_f32_vec().map(Cow::Owned),
    })
    .transpose()
}

/// Up to [`schedule::MAX_PARTS`] parts with quantised weights of one dtype over one input,
/// in one call of [`qlinear::linear`].
fn quant_group(
    level: LinearLevel,
    x: &[f32],
    n: usize,
    k: usize,
    group: &mut [LinearPart<'_>],
) -> Result<()> {
    const P: usize = schedule::MAX_PARTS;
    let Some(first) = group.first() else {
        return Ok(());
    };
    let p = group.len();
    let mut weights = [first.weight; P];
    let mut biases: [Option<&Data>; P] = [None; P];
    let mut outs: [&mut [f32]; P] = Default::default();
    for (((w, b), o), part) in weights
        .iter_mut()
        .zip(&mut biases)
        .zip(&mut outs)
        .zip(group.iter_mut())
    {
        (*w, *b, *o) = (part.weight, part.bias, part.output.as_f32_mut()?);
    }
    quant_parts(
        level,
        (&[x], n, k),
        (&weights[..p], &biases[..p]),
        &mut outs[..p],
    )
}

/// `outs[p] = x_p · weights[p]ᵀ + biases[p]` for up to [`schedule::MAX_PARTS`] quantised
/// weights of one dtype, in one call of [`qlinear::linear`]: `x_p` is `xs[0]` for every
/// part, or `xs[p]` with one input per part (each `[n, k]`, its columns in the order the
/// weights take them). Weights in rows are packed into panels for the call.
///
/// Errors: a float weight among them, and [`qlinear::linear`]'s.
fn quant_parts(
    level: LinearLevel,
    (xs, n, k): (&[&[f32]], usize, usize),
    (weights, biases): (&[&Data], &[Option<&Data>]),
    outs: &mut [&mut [f32]],
) -> Result<()> {
    const P: usize = schedule::MAX_PARTS;
    let mut ws = [QuantWeight::EMPTY; P];
    let mut owned: [Option<Cow<'_, [f32]>>; P] = Default::default();
    // The kernels read int8 and int4 in panels, which the model graphs pack at load; weights
    // in rows are packed here, per call.
    let mut packed: [Option<Data>; P] = Default::default();
    for (p, &w) in packed.iter_mut().zip(weights) {
        if panels::has_panels(w.dtype()) && w.layout() == Layout::Rows {
            *p = Some(w.to_panels()?);
        }
    }
    for ((((w, b), &weight), &bias), p) in ws
        .iter_mut()
        .zip(&mut owned)
        .zip(weights)
        .zip(biases)
        .zip(&packed)
    {
        let WeightRows::Quant {
            dtype,
            bytes,
            row_bytes,
            ..
        } = WeightRows::new(p.as_ref().unwrap_or(weight))?
        else {
            return Err(shape_err(
                "Linear",
                format!("{} weight among quantised ones", weight.dtype()),
            ));
        };
        *w = QuantWeight {
            dtype,
            bytes,
            row_bytes,
            kp: quant::padded_cols(dtype, k),
        };
        *b = bias_f32(bias)?;
    }
    let mut bias_values: [Option<&[f32]>; P] = Default::default();
    for (b, o) in bias_values.iter_mut().zip(&owned) {
        *b = o.as_deref();
    }
    let p = weights.len();
    qlinear::linear(level, xs, n, k, &ws[..p], &bias_values[..p], outs)
}

/// `outputs[p] = x_p · weights[p]ᵀ + biases[p]`, where `x_p` is `inputs[0]` for every part
/// or `inputs[p]` with one input per part, all `[n, k]` (see [`flm_core::Op::Linear`]).
/// When every weight is quantised, of one dtype and without an input permutation, the parts
/// are multiplied [`schedule::MAX_PARTS`] at a time, their rows split over the threads
/// together (a decode step's routed experts, whose projections are too small to keep the
/// threads streaming apiece); otherwise one at a time. Either way each output has the bits
/// of its own [`linear`].
///
/// Errors: counts of inputs, biases and outputs that do not match the weights', inputs of
/// different shapes, and those of [`linear`].
pub(crate) fn linears_each(
    level: LinearLevel,
    inputs: &[&Data],
    (weights, biases): (&[&Data], &[Option<&Data>]),
    outputs: &mut [Data],
) -> Result<()> {
    const P: usize = schedule::MAX_PARTS;
    let (Some(first), Some(weight)) = (inputs.first(), weights.first()) else {
        return Ok(());
    };
    let (n, k) = (first.rows(), first.cols());
    let count = weights.len();
    if !(inputs.len() == 1 || inputs.len() == count)
        || biases.len() != count
        || outputs.len() != count
        || inputs.iter().any(|x| x.shape() != first.shape())
    {
        return Err(shape_err(
            "Linear",
            format!(
                "{} inputs, {} biases and {} outputs for {count} weights",
                inputs.len(),
                biases.len(),
                outputs.len()
            ),
        ));
    }
    let input = |p: usize| inputs[if inputs.len() == 1 { 0 } else { p }];
    let dtype = weight.dtype();
    let together = dtype.is_quantized()
        && weights
            .iter()
            .all(|w| w.dtype() == dtype && w.input_perm().is_none());
    if !together || n == 0 {
        for (p, ((w, b), out)) in weights.iter().zip(biases).zip(outputs).enumerate() {
            linear(level, input(p), w, *b, out)?;
        }
        return Ok(());
    }
    for (c, outputs) in outputs.chunks_mut(P).enumerate() {
        let len = outputs.len();
        let parts = c * P..c * P + len;
        let mut xs: [&[f32]; P] = [&[]; P];
        for (x, p) in xs.iter_mut().zip(parts.clone()) {
            *x = input(p).as_f32()?;
        }
        let xs = if inputs.len() == 1 {
            &xs[..1]
        } else {
            &xs[..len]
        };
        let mut outs: [&mut [f32]; P] = Default::default();
        for (o, out) in outs.iter_mut().zip(outputs.iter_mut()) {
            *o = out.as_f32_mut()?;
        }
        quant_parts(
            level,
            (xs, n, k),
            (&weights[parts.clone()], &biases[parts]),
            &mut outs[..len],
        )?;
    }
    Ok(())
}

/// One part with float weights.
fn float_part(isa: Isa, x: &[f32], n: usize, k: usize, part: &mut LinearPart<'_>) -> Result<()> {
    let bias = bias_f32(part.bias)?;
    let bias = bias.as_deref();
    let out = part.output.as_f32_mut()?;
    match WeightRows::new(part.weight)? {
        WeightRows::F32(w) => float_linear(isa.vector(), &Float { x, w, bias, n, k }, out),
        WeightRows::F16(w) => float_linear(isa.vector(), &Float { x, w, bias, n, k }, out),
        WeightRows::BF16(w) => float_linear(isa.vector(), &Float { x, w, bias, n, k }, out),
        WeightRows::Quant { dtype, .. } => {
            return Err(shape_err(
                "Linear",
                format!("{dtype} weight among float ones"),
            ))
        }
    }
    Ok(())
}

/// The operands of a float Linear: `x` `[n, k]`, `w` `[m, k]`, `bias` `[m]`.
#[derive(Clone, Copy)]
struct Float<'a, E> {
    x: &'a [f32],
    w: &'a [E],
    bias: Option<&'a [f32]>,
    n: usize,
    k: usize,
}

/// A float Linear: on this thread below [`PARALLEL_MIN_WORK`], else split over weight rows.
fn float_linear<E: Elem>(isa: Isa, f: &Float<'_, E>, out: &mut [f32]) {
    let (n, k) = (f.n, f.k);
    let m = f.w.len() / k;
    if n * m * k < PARALLEL_MIN_WORK {
        // On this thread, straight into `out` (`out[i, j]` at `i·m + j`).
        return block(isa, f, 0, m, out, 1, m);
    }
    if n == 1 {
        schedule::guided(&mut [out], 1, DECODE_CHUNK_ROWS, |_, j0, o| {
            block(isa, f, j0, o.len(), o, 1, 0)
        });
        return;
    }
    scratch::with(&YT, |yt| {
        yt.clear();
        yt.resize(m * n, 0.0);
        yt.par_chunks_mut(PREFILL_ROWS * n)
            .enumerate()
            .for_each(|(t, yt)| block(isa, f, t * PREFILL_ROWS, yt.len() / n, yt, n, 1));
        transpose(yt, n, out);
    });
}

/// Weight rows `j0..j0 + rows` against every input row: `out[dj·js + i·is] = y[i, j0 + dj]`.
fn block<E: Elem>(
    isa: Isa,
    f: &Float<'_, E>,
    j0: usize,
    rows: usize,
    out: &mut [f32],
    js: usize,
    is: usize,
) {
    let k = f.k;
    let b = Block {
        f: Float {
            w: &f.w[j0 * k..(j0 + rows) * k],
            bias: f.bias.map(|b| &b[j0..j0 + rows]),
            ..*f
        },
        out,
        js,
        is,
    };
    simd::run(isa, b)
}

/// The Linear of a block of weight rows (`f.w` `[rows, k]`, with their biases), written
/// at the strides `js`, `is`.
struct Block<'a, E> {
    f: Float<'a, E>,
    out: &'a mut [f32],
    js: usize,
    is: usize,
}

impl<E: Elem> Block<'_, E> {
    /// Writes the tile of rows `j + r · stride` (`r < R`) × inputs `i..i + T` over the
    /// columns `cols`: the first block of columns stores its sums plus the bias, later ones
    /// add theirs. Decode tiles prefetch their streams [`DECODE_AHEAD`] bytes ahead.
    #[inline(always)]
    fn tile<S: Simd, const R: usize, const T: usize>(
        &mut self,
        s: S,
        j: usize,
        stride: usize,
        i: usize,
        cols: Range<usize>,
    ) {
        let first = cols.start == 0;
        let (k, k0, kn) = (self.f.k, cols.start, cols.len());
        let xs = std::array::from_fn(|t| &self.f.x[(i + t) * k + k0..][..kn]);
        let ws = std::array::from_fn(|r| &self.f.w[(j + r * stride) * k + k0..][..kn]);
        let ahead = if self.f.n == 1 { DECODE_AHEAD } else { 0 };
        let y = tile::<S, E, R, T>(s, xs, ws, ahead);
        for (r, y) in y.iter().enumerate() {
            let jr = j + r * stride;
            let b = self.f.bias.map_or(0.0, |b| b[jr]);
            for (t, y) in y.iter().enumerate() {
                let o = &mut self.out[jr * self.js + (i + t) * self.is];
                *o = if first { y + b } else { *o + y };
            }
        }
    }

    /// Rows `j..j_end` (`R` at a time, then one at a time) × inputs `i..i + T`, over `cols`.
    #[inline(always)]
    fn rows<S: Simd, const R: usize, const T: usize>(
        &mut self,
        s: S,
        mut j: usize,
        j_end: usize,
        i: usize,
        cols: Range<usize>,
    ) {
        while j + R <= j_end {
            self.tile::<S, R, T>(s, j, 1, i, cols.clone());
            j += R;
        }
        while j < j_end {
            self.tile::<S, 1, T>(s, j, 1, i, cols.clone());
            j += 1;
        }
    }
}

impl<E: Elem> Kernel for Block<'_, E> {
    type Output = ();

    /// Decode: tiles of [`DECODE_STREAMS`] rows `j, j + s, j + 2s, …` (`s`: the block's
    /// rows / 4), so that the tiles `j = 0, 1, …` read 4 sequential streams, each tile walking
    /// its rows panel by panel; the rows left over one at a time. Prefill: panels of
    /// [`PANEL_COLS`] columns × [`PANEL_ROWS`] weight rows (32 KiB of f32, kept in L1)
    /// against every tile of input rows in turn, so that both operands of the inner loop
    /// come from L1. Both sum each panel in one accumulator, reduce it with the same tree
    /// and add the panels in order: the bits of an output do not depend on the tile.
    #[inline(always)]
    fn run<S: Simd>(mut self, s: S) {
        let (n, k) = (self.f.n, self.f.k);
        let rows = self.f.w.len() / k;
        if n == 1 {
            let stride = rows / DECODE_STREAMS;
            for j in 0..stride {
                for cols in panels(k) {
                    self.tile::<S, DECODE_STREAMS, 1>(s, j, stride, 0, cols);
                }
            }
            for cols in panels(k) {
                self.rows::<S, 1, 1>(s, DECODE_STREAMS * stride, rows, 0, cols);
            }
            return;
        }
        for cols in panels(k) {
            for j0 in (0..rows).step_by(PANEL_ROWS) {
                let j1 = (j0 + PANEL_ROWS).min(rows);
                let mut i = 0;
                if S::REGS >= 32 {
                    while i + 4 <= n {
                        self.rows::<S, 4, 4>(s, j0, j1, i, cols.clone());
                        i += 4;
                    }
                }
                if S::REGS >= 16 {
                    while i + 2 <= n {
                        self.rows::<S, 4, 2>(s, j0, j1, i, cols.clone());
                        i += 2;
                    }
                }
                while i + 2 <= n {
                    self.rows::<S, 2, 2>(s, j0, j1, i, cols.clone());
                    i += 2;
                }
                if i < n {
                    self.rows::<S, 4, 1>(s, j0, j1, i, cols.clone());
                }
            }
        }
    }
}

/// The column ranges of the panels of a row of `k`: [`PANEL_COLS`] columns each, the last
/// one shorter.
#[inline(always)]
fn panels(k: usize) -> impl Iterator<Item = Range<usize>> {
    (0..k)
        .step_by(PANEL_COLS)
        .map(move |k0| k0..(k0 + PANEL_COLS).min(k))
}

/// `y[r][t] = Σ_c ws[r][c]·xs[t][c]` for `r < R`, `t < T` (slices of equal length). With
/// `ahead > 0`, each weight load prefetches the line `ahead` bytes past it.
#[inline(always)]
fn tile<S: Simd, E: Elem, const R: usize, const T: usize>(
    s: S,
    xs: [&[f32]; T],
    ws: [&[E]; R],
    ahead: usize,
) -> [[f32; T]; R] {
    let l = S::LANES;
    let k = xs[0].len();
    let mut acc = [[s.zero(); T]; R];
    let mut c = 0;
    while c + l <= k {
        let mut wv = [s.zero(); R];
        for (wv, ws) in wv.iter_mut().zip(&ws) {
            if ahead > 0 {
                simd::prefetch(ws[c..].as_ptr().cast::<u8>().wrapping_add(ahead));
            }
            *wv = E::load(s, &ws[c..]);
        }
        for (t, xs) in xs.iter().enumerate() {
            let xv = s.load(&xs[c..]);
            for (acc, wv) in acc.iter_mut().zip(&wv) {
                acc[t] = s.fma(*wv, xv, acc[t]);
            }
        }
        c += l;
    }
    if c < k {
        let mut wv = [s.zero(); R];
        for (wv, ws) in wv.iter_mut().zip(&ws) {
            *wv = E::load_part(s, &ws[c..]);
        }
        for (t, xs) in xs.iter().enumerate() {
            let xv = s.load_part(&xs[c..]);
            for (acc, wv) in acc.iter_mut().zip(&wv) {
                acc[t] = s.fma(*wv, xv, acc[t]);
            }
        }
    }
    reduce::<S, R, T>(s, &acc)
}

/// The lane sums of `R·T` accumulators, eight then four at a time.
#[inline(always)]
fn reduce<S: Simd, const R: usize, const T: usize>(s: S, acc: &[[S::V; T]; R]) -> [[f32; T]; R] {
    let mut y = [[0.0f32; T]; R];
    let mut e = 0;
    while e + 8 <= R * T {
        let mut v = [s.zero(); 8];
        for (q, v) in v.iter_mut().enumerate() {
            *v = acc[(e + q) / T][(e + q) % T];
        }
        for (q, sum) in s.sums8(v).iter().enumerate() {
            y[(e + q) / T][(e + q) % T] = *sum;
        }
        e += 8;
    }
    while e < R * T {
        let mut v = [s.zero(); 4];
        for (q, v) in v.iter_mut().enumerate() {
            if e + q < R * T {
                *v = acc[(e + q) / T][(e + q) % T];
            }
        }
        for (q, sum) in s.sums4(v).iter().enumerate() {
            if e + q < R * T {
                y[(e + q) / T][(e + q) % T] = *sum;
            }
        }
        e += 4;
    }
    y
}
