//! Causal multi-head attention with grouped-query heads over the KV cache.
//!
//! For each query row and head: scores `q·k_t·scale` for the cached positions it sees (the
//! causal prefix, or its last `sliding_window` rows), soft-capped (Gemma 2) and biased
//! (ALiBi) where asked, softmax with the maximum subtracted, then `Σ_t p_t·v_t`, all in f32
//! (llama2.c `forward`).
//!
//! The SIMD kernel takes the query heads of one KV head together (a GQA group, or part of
//! one when a parallel decode would otherwise have fewer tasks than threads), so that each
//! key and value row is read from memory once for all of them:
//! 1. scores for blocks of 8 positions, one accumulator per position, reduced together by
//!    [`Simd::store_sums8`]; the block's key rows stay in L1 while each head reads them;
//! 2. per head, the maximum and the exponentials with the polynomial [`simd::exp_simd`],
//!    over whole vectors of scores (padded with −∞);
//! 3. the weighted sum over blocks of value rows that stay in L1 (16 KiB) for every head,
//!    with several accumulators per output vector so that the additions overlap; the
//!    division by the sum comes last.
//!
//! Scores live in a thread-local buffer, so a warm call allocates nothing. Soft-capping
//! uses [`simd::tanh`], so every level (see `simd`) computes the same bits.
//!
//! Attention sinks (gpt-oss, [`AttentionOperands::sinks`]) join the softmax after the
//! scores: the maximum is `max(sink, max_t s_t)` and the sink's term `e^(sink − M)`, from
//! the scalar [`simd::exp`] (one lane of [`simd::exp_simd`]), is added to the lanes' sum
//! last, so every level and every batch gives the same bits; without sinks nothing of
//! this runs.
//!
//! The cache holds f32 or f16 keys and values ([`flm_core::KvDtype`]): the kernels are
//! generic over the element ([`Elem`]), and an f16 row is widened exactly as it is loaded
//! (F16C's `vcvtph2ps` on x86, `fcvtl` on NEON, `half` at the portable level), so an f16 cache gives
//! the result of an f32 cache holding the same (rounded) values.
//!
//! Both read the cache through a list of row offsets built per (row, KV head): the rows
//! `t` of a contiguous cache, or the pool rows a block table maps positions to in a paged
//! one ([`super::paged_attention`]). The arithmetic is the same either way, so a paged
//! call gives bit for bit the result of a contiguous call over the same keys and values.
//!
//! Batch invariance (Thinking Machines Lab, "Defeating Nondeterminism in LLM Inference",
//! 2025): at one instruction-set level, the output of a query row has the same bits
//! whatever `n`, its place among the rows of the call and the split over threads. Each
//! (row, head) is computed on its own, over the cache rows its position sees: the blocks of
//! 8 keys count from its first visible row, and the softmax and the blocks of value rows
//! run over its own scores only, so every sum has an order fixed by the position, the
//! mask and `head_dim`. Splitting a GQA group over tasks only changes which heads share
//! their key reads. `devices/tests/batch_invariance.rs` checks it.

use std::cell::Cell;

use flm_core::{AttentionOperands, AttentionParams, Data, DataType, Error, Result};
use rayon::prelude::*;

use super::scratch;
use super::simd::{self, Elem, Kernel, Simd};
use super::{Isa, PARALLEL_MIN_WORK};

thread_local! {
    /// The scores (then probabilities) of the current head.
    static SCORES: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// The offsets in the caches of the rows the current row attends to.
    static OFFSETS: Cell<Offsets> = Cell::new(Offsets::default());
}

/// The offsets of the cache rows one query row attends to, in each cache.
#[derive(Default)]
struct Offsets {
    keys: Vec<usize>,
    /// Filled only where a value head is narrower than a key head (else the keys' apply).
    values: Vec<usize>,
    /// Filled only with a decoupled RoPE part.
    rope: Vec<usize>,
}

/// `output = softmax(q·Kᵀ·scale + bias)·V` per head, GQA (see [`flm_core::Op::Attention`]):
/// `q` f32 `[n, n_heads·head_dim]`, `output` f32 `[n, n_heads·v_head_dim]`, caches f32 or
/// f16 `[max_pos, n_kv_heads·head_dim]` and `[max_pos, n_kv_heads·v_head_dim]`, with a
/// decoupled RoPE part of the scores where the operands have one;
/// query head `h` reads KV head `h / (n_heads / n_kv_heads)`, and row `i` (position
/// `start_pos + i`) the cache rows `0..max(start_pos + i + 1, params.bidirectional)`, or with a
/// sliding window `w` the rows `start_pos + i + 1 − w..start_pos + i + 1`.
pub(crate) fn attention(isa: Isa, operands: AttentionOperands<'_>, start_pos: usize) -> Result<()> {
    run(isa, operands, QueryRows::Contiguous { start_pos })
}

/// Runs the kernels over the rows of `q` (checked by the caller: shapes, one entry of
/// `rows` per row of `q`, every row's cache rows inside the caches, a valid window).
///
/// Errors: [`Error::DType`] for a cache neither f32 nor f16 (refused by the contract).
pub(crate) fn run(isa: Isa, o: AttentionOperands<'_>, rows: QueryRows<'_>) -> Result<()> {
    let n_heads = o.params.n_heads;
    let dims = Dims {
        head: o.q.cols() / n_heads,
        value: o.output.cols() / n_heads,
        rope: o.rope.map_or(0, |r| r.q.cols() / n_heads),
    };
    let q = (o.q.as_f32()?, o.rope.map(|r| r.q.as_f32()).transpose()?);
    let sinks = o.sinks.map(Data::as_f32).transpose()?;
    let out = o.output.as_f32_mut()?;
    let rope_cache = o.rope.map(|r| r.cache);
    match o.cache_k.dtype() {
        DataType::F32 => {
            let rope = rope_cache.map(Data::as_f32).transpose()?;
            let kv = (o.cache_k.as_f32()?, o.cache_v.as_f32()?, rope);
            run_typed(isa, q, kv, dims, rows, (o.params, sinks), out);
        }
        DataType::F16 => {
            let rope = rope_cache.map(Data::as_f16).transpose()?;
            let kv = (o.cache_k.as_f16()?, o.cache_v.as_f16()?, rope);
            run_typed(isa, q, kv, dims, rows, (o.params, sinks), out);
        }
        other => {
            return Err(Error::DType {
                op: "Attention",
                msg: format!("a KV cache of {other}"),
            })
        }
    }
    Ok(())
}

/// The widths of one head: its query and key, its value, and its decoupled RoPE part (0
/// without one).
#[derive(Debug, Clone, Copy)]
struct Dims {
    head: usize,
    value: usize,
    rope: usize,
}

/// [`run`] over caches of elements `E`: the keys, the values and the rotated keys of a
/// decoupled RoPE part, with the queries `q` and those of the RoPE part, and the sink of
/// each query head if any.
fn run_typed<E: Elem>(
    isa: Isa,
    (q, q_rope): (&[f32], Option<&[f32]>),
    (keys, values, rope_keys): (&[E], &[E], Option<&[E]>),
    dims: Dims,
    rows: QueryRows<'_>,
    (params, sinks): (AttentionParams, Option<&[f32]>),
    out: &mut [f32],
) {
    let AttentionParams {
        n_heads,
        n_kv_heads,
        scale,
        ..
    } = params;
    let slopes = if params.alibi {
        flm_core::alibi_slopes(n_heads)
    } else {
        Vec::new()
    };
    let head_dim = dims.head;
    let a = Attn {
        q,
        keys,
        values,
        rope: q_rope.zip(rope_keys).map(|(q, keys)| RopePart {
            q,
            keys,
            dim: dims.rope,
        }),
        rows,
        n_heads,
        group: n_heads / n_kv_heads,
        task_heads: n_heads / n_kv_heads,
        head_dim,
        v_dim: dims.value,
        n_kv_heads,
        scale,
        slopes: &slopes,
        sinks,
        bidirectional: params.bidirectional,
        window: params.sliding_window.unwrap_or(usize::MAX),
        softcap: params.softcap,
    };
    let n = q.len() / (n_heads * head_dim);
    let seen: usize = (0..n).map(|i| a.rows(i).1 - a.rows(i).0).sum();
    let work = n_heads * seen * (head_dim + dims.value + dims.rope);
    if work >= PARALLEL_MIN_WORK {
        // One task per (row, KV head): the query heads of a group share its K/V reads. With
        // fewer tasks than twice the threads (decode with few KV heads), groups are split.
        let mut a = a;
        let threads = rayon::current_num_threads();
        while a.task_heads.is_multiple_of(2) && n * n_heads / a.task_heads < 2 * threads {
            a.task_heads /= 2;
        }
        let task_heads = a.task_heads;
        out.par_chunks_mut(task_heads * a.v_dim)
            .enumerate()
            .for_each(|(t, o)| run_heads(isa, &a, t * task_heads, o));
    } else {
        run_heads(isa, &a, 0, out);
    }
}

/// Where the query rows sit in the cache.
#[derive(Debug, Clone, Copy)]
pub(crate) enum QueryRows<'a> {
    /// Row `i` at position `start_pos + i`; position `t` is cache row `t`.
    Contiguous { start_pos: usize },
    /// A paged cache of blocks of `block_size` positions, one [`QueryRow`] per query row.
    Paged {
        rows: &'a [QueryRow<'a>],
        block_size: usize,
    },
}

/// Where one query row of a paged cache sits: its position, and the block table of its
/// sequence (position `t` is pool row `blocks[t / block_size]·block_size + t % block_size`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueryRow<'a> {
    pub pos: usize,
    pub blocks: &'a [u32],
}

/// The decoupled RoPE part of one call: the queries' part `[n, n_heads·dim]` and the
/// rotated keys `[rows, n_kv_heads·dim]`.
struct RopePart<'a, E> {
    q: &'a [f32],
    keys: &'a [E],
    dim: usize,
}

/// The operands of one call, over a cache of elements `E`.
struct Attn<'a, E> {
    q: &'a [f32],
    keys: &'a [E],
    values: &'a [E],
    rope: Option<RopePart<'a, E>>,
    rows: QueryRows<'a>,
    n_heads: usize,
    group: usize,
    /// Query heads per SIMD task: the group or a divisor of it.
    task_heads: usize,
    head_dim: usize,
    /// The width of a value head, at most `head_dim`.
    v_dim: usize,
    n_kv_heads: usize,
    scale: f32,
    /// ALiBi slope of each query head; empty without ALiBi.
    slopes: &'a [f32],
    /// The sink logit of each query head, if any.
    sinks: Option<&'a [f32]>,
    /// Cache rows every query row sees.
    bidirectional: usize,
    /// Positions each row sees at most; `usize::MAX` without a sliding window.
    window: usize,
    /// Soft-capping of the scaled scores.
    softcap: Option<f32>,
}

impl<E: Elem> Attn<'_, E> {
    /// The cache positions row `i` of `q` attends to, `first..end`.
    fn rows(&self, i: usize) -> (usize, usize) {
        let pos = match self.rows {
            QueryRows::Contiguous { start_pos, .. } => start_pos + i,
            QueryRows::Paged { rows, .. } => rows[i].pos,
        };
        let end = (pos + 1).max(self.bidirectional);
        (end.saturating_sub(self.window), end)
    }

    /// Fills `offsets` with the offset of KV head `kv_head`'s part of each position row
    /// `i` attends to, in a cache of KV heads `width` wide, and returns the first of those
    /// positions.
    fn offsets(&self, i: usize, kv_head: usize, width: usize, offsets: &mut Vec<usize>) -> usize {
        let (first, end) = self.rows(i);
        let (stride, head) = (self.n_kv_heads * width, kv_head * width);
        offsets.clear();
        match self.rows {
            QueryRows::Contiguous { .. } => {
                offsets.extend((first..end).map(|t| t * stride + head));
            }
            QueryRows::Paged { rows, block_size } => {
                let (blocks, bs) = (rows[i].blocks, block_size);
                offsets.extend(
                    (first..end).map(|t| (blocks[t / bs] as usize * bs + t % bs) * stride + head),
                );
            }
        }
        first
    }

    /// Soft-caps the scores `s` of query head `h` (`s ← cap · tanh(s / cap)`), then adds
    /// the ALiBi bias `m_h · t`, `s[k]` being cache row `t = first + k` (a scalar pass: a
    /// few operations per score, next to a `head_dim`-long dot product for each; the same
    /// in both kernels, so their bits agree).
    fn bias_scores(&self, h: usize, first: usize, s: &mut [f32]) {
        if let Some(cap) = self.softcap {
            for s in s.iter_mut() {
                *s = cap * simd::tanh(*s / cap);
            }
        }
        if let Some(&m) = self.slopes.get(h) {
            for (t, s) in (first..).zip(s.iter_mut()) {
                *s += m * t as f32;
            }
        }
    }
}

/// Query heads `first..` (head `h` of row `i` is `i·n_heads + h`), one per `v_dim` outputs
/// of `out`; `first` and the number of heads are multiples of `a.task_heads`.
fn run_heads<E: Elem>(isa: Isa, a: &Attn<'_, E>, first: usize, out: &mut [f32]) {
    scratch::with(&SCORES, |scores| {
        scratch::with(&OFFSETS, |offsets| {
            let k = HeadRun {
                a,
                first,
                out,
                scores,
                offsets,
            };
            simd::run(isa, k)
        })
    })
}

/// The kernel over a run of query heads, see [`run_heads`].
struct HeadRun<'a, 'b, E> {
    a: &'b Attn<'a, E>,
    first: usize,
    out: &'b mut [f32],
    scores: &'b mut Vec<f32>,
    offsets: &'b mut Offsets,
}

impl<E: Elem> Kernel for HeadRun<'_, '_, E> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let a = self.a;
        let width = a.task_heads * a.v_dim;
        for (dt, out) in self.out.chunks_exact_mut(width).enumerate() {
            let first = self.first + dt * a.task_heads;
            group(s, a, first, self.scores, self.offsets, out);
        }
    }
}

/// Cache positions the score pass of [`group`] prefetches the key and value rows of ahead
/// of its reads: far enough to hide the latency at long contexts; 48 was no better
/// (docs/benchmarks.md, "Kernel choices").
const PREFETCH_ROWS: usize = 16;

/// The query heads `first..first + task_heads` of one row (of one KV head) with the vectors
/// of `s`, over the `len` cache positions it sees from `start` on:
/// all their scores first, each block of 8 key rows read from memory once and from L1 for
/// the other heads, then per head the softmax and the weighted sum of the value rows.
#[inline(always)]
fn group<S: Simd, E: Elem>(
    s: S,
    a: &Attn<'_, E>,
    first: usize,
    scores: &mut Vec<f32>,
    offsets: &mut Offsets,
    out: &mut [f32],
) {
    let (hd, vd, l, heads) = (a.head_dim, a.v_dim, S::LANES, a.task_heads);
    let (row, kv_head) = (first / a.n_heads, first % a.n_heads / a.group);
    let start = a.offsets(row, kv_head, hd, &mut offsets.keys);
    let key_rows = &offsets.keys;
    let len = key_rows.len();
    let value_rows = if vd == hd {
        key_rows
    } else {
        a.offsets(row, kv_head, vd, &mut offsets.values);
        &offsets.values
    };
    let rope = a.rope.as_ref().map(|r| {
        a.offsets(row, kv_head, r.dim, &mut offsets.rope);
        (r, &offsets.rope[..], &r.q[first * r.dim..][..heads * r.dim])
    });
    let qs = &a.q[first * hd..][..heads * hd];
    let (keys, values) = (a.keys, a.values);
    // The key and value rows of positions `t0..t1` (clipped to `len`), prefetched ahead of
    // the score pass: in decode they were written one step earlier, and the weights read
    // since have pushed them out to memory.
    let prefetch_rows = |t0: usize, t1: usize| {
        let (t0, t1) = (t0.min(len), t1.min(len));
        for (&k, &v) in key_rows[t0..t1].iter().zip(&value_rows[t0..t1]) {
            for c in (0..hd).step_by(16) {
                simd::prefetch(keys.as_ptr().wrapping_add(k + c));
            }
            for c in (0..vd).step_by(16) {
                simd::prefetch(values.as_ptr().wrapping_add(v + c));
            }
        }
        if let Some((r, rows, _)) = rope {
            for &o in &rows[t0..t1] {
                for c in (0..r.dim).step_by(16) {
                    simd::prefetch(r.keys.as_ptr().wrapping_add(o + c));
                }
            }
        }
    };
    prefetch_rows(0, PREFETCH_ROWS);

    // Scores of head `h` at `h·padded`, padded with −∞ (probability 0) to whole vectors.
    let padded = len.div_ceil(l) * l;
    scores.clear();
    scores.resize(heads * padded + heads, f32::NEG_INFINITY);
    let mut t = 0;
    while t + 8 <= len {
        prefetch_rows(t + PREFETCH_ROWS, t + PREFETCH_ROWS + 8);
        let rows = block8(keys, &key_rows[t..], hd);
        let rope_rows = rope.map(|(r, rows, q)| (block8(r.keys, &rows[t..], r.dim), q, r.dim));
        for (h, qh) in qs.chunks_exact(hd).enumerate() {
            let mut acc = [s.zero(); 8];
            dot8(s, qh, &rows, &mut acc);
            if let Some((rows, q, dim)) = &rope_rows {
                dot8(s, &q[h * dim..][..*dim], rows, &mut acc);
            }
            s.store_sums8(acc, a.scale, &mut scores[h * padded + t..]);
        }
        t += 8;
    }
    while t < len {
        let row = &keys[key_rows[t]..][..hd];
        for (h, qh) in qs.chunks_exact(hd).enumerate() {
            let mut acc = dot_lanes(s, s.zero(), qh, row);
            if let Some((r, rows, q)) = rope {
                acc = dot_lanes(s, acc, &q[h * r.dim..][..r.dim], &r.keys[rows[t]..]);
            }
            scores[h * padded + t] = s.sum(acc) * a.scale;
        }
        t += 1;
    }

    for h in 0..heads {
        a.bias_scores(
            first % a.n_heads + h,
            start,
            &mut scores[h * padded..][..len],
        );
    }

    // Softmax numerators; the inverse sums go after the scores.
    let (scores, invs) = scores.split_at_mut(heads * padded);
    for (h, (scores, inv)) in scores
        .chunks_exact_mut(padded)
        .zip(invs.iter_mut())
        .enumerate()
    {
        let sink = a.sinks.map(|sinks| sinks[first % a.n_heads + h]);
        *inv = softmax(s, scores, sink);
    }

    // `out_h = inv_h · Σ_t p_h[t]·v_t`, over blocks of value rows that stay in L1 (16 KiB)
    // while every head of the group reads them.
    out.fill(0.0);
    let block = (256 / vd.div_ceil(16)).max(8);
    for t0 in (0..len).step_by(block) {
        let t1 = (t0 + block).min(len);
        let rows = &value_rows[t0..t1];
        for (p, out) in scores.chunks_exact(padded).zip(out.chunks_exact_mut(vd)) {
            weighted(s, &p[t0..t1], values, rows, out);
        }
    }
    for (out, &inv) in out.chunks_exact_mut(vd).zip(invs.iter()) {
        scale(s, out, inv);
    }
}

/// The 8 rows of `width` of `cache` at the first 8 `offsets`.
#[inline(always)]
fn block8<'c, E>(cache: &'c [E], offsets: &[usize], width: usize) -> [&'c [E]; 8] {
    std::array::from_fn(|j| &cache[offsets[j]..][..width])
}

/// `acc[j] += q · rows[j]` lane-wise, over the vectors of `q` (each row `q.len()` long).
#[inline(always)]
fn dot8<S: Simd, E: Elem>(s: S, q: &[f32], rows: &[&[E]; 8], acc: &mut [S::V; 8]) {
    let (hd, l) = (q.len(), S::LANES);
    let mut c = 0;
    while c + l <= hd {
        let qv = s.load(&q[c..]);
        for (acc, row) in acc.iter_mut().zip(rows) {
            *acc = s.fma(qv, E::load(s, &row[c..]), *acc);
        }
        c += l;
    }
    if c < hd {
        let qv = s.load_part(&q[c..]);
        for (acc, row) in acc.iter_mut().zip(rows) {
            *acc = s.fma(qv, E::load_part(s, &row[c..]), *acc);
        }
    }
}

/// `out *= k`.
#[inline(always)]
fn scale<S: Simd>(s: S, out: &mut [f32], k: f32) {
    let (k, mut chunks) = (s.splat(k), out.chunks_exact_mut(S::LANES));
    for v in &mut chunks {
        s.store(v, s.mul(s.load(v), k));
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        s.store_part(rest, s.mul(s.load_part(rest), k));
    }
}

/// `scores[t] = e^(scores[t] − max)` in place (`scores.len()` a multiple of `LANES`); returns
/// `1 / Σ scores`. Two maximum accumulators halve the dependency chain. With a `sink`
/// logit, `max` also covers it and its `e^(sink − max)` is added to the sum last.
#[inline(always)]
fn softmax<S: Simd>(s: S, scores: &mut [f32], sink: Option<f32>) -> f32 {
    let l = S::LANES;
    let (mut m0, mut m1) = (s.splat(f32::NEG_INFINITY), s.splat(f32::NEG_INFINITY));
    let mut pairs = scores.chunks_exact(2 * l);
    for v in &mut pairs {
        m0 = s.max(s.load(v), m0);
        m1 = s.max(s.load(&v[l..]), m1);
    }
    if !pairs.remainder().is_empty() {
        m0 = s.max(s.load(pairs.remainder()), m0);
    }
    let max = s.max_lane(s.max(m0, m1));
    let max = sink.map_or(max, |sink| max.max(sink));
    let mut sum = s.zero();
    for v in scores.chunks_exact_mut(l) {
        let e = simd::exp_simd(s, s.sub(s.load(v), s.splat(max)));
        s.store(v, e);
        sum = s.add(sum, e);
    }
    let sum = s.sum(sum);
    1.0 / sink.map_or(sum, |sink| sum + simd::exp(sink - max))
}

/// `out += Σ_t p[t]·values[rows[t]..][..out.len()]`, in blocks of output vectors.
#[inline(always)]
fn weighted<S: Simd, E: Elem>(s: S, p: &[f32], values: &[E], rows: &[usize], out: &mut [f32]) {
    let (l, hd) = (S::LANES, out.len());
    let full = hd.is_multiple_of(l);
    match (hd.div_ceil(l), full) {
        (1, true) => weighted_sum::<S, E, 1, 4, true>(s, p, values, rows, hd, 0, out),
        (1, false) => weighted_sum::<S, E, 1, 4, false>(s, p, values, rows, hd, 0, out),
        (2, true) => weighted_sum::<S, E, 2, 4, true>(s, p, values, rows, hd, 0, out),
        (2, false) => weighted_sum::<S, E, 2, 4, false>(s, p, values, rows, hd, 0, out),
        (_, _) => {
            for c0 in (0..hd).step_by(4 * l) {
                if c0 + 4 * l <= hd {
                    weighted_sum::<S, E, 4, 2, true>(s, p, values, rows, hd, c0, out);
                } else {
                    weighted_sum::<S, E, 4, 2, false>(s, p, values, rows, hd, c0, out);
                }
            }
        }
    }
}

/// `acc` plus the lane-wise products `a[c]·b[c]` summed over the vectors of `a`
/// (`a.len() ≤ b.len()`).
#[inline(always)]
fn dot_lanes<S: Simd, E: Elem>(s: S, mut acc: S::V, a: &[f32], b: &[E]) -> S::V {
    let (n, l) = (a.len(), S::LANES);
    let b = &b[..n];
    let mut c = 0;
    while c + l <= n {
        acc = s.fma(s.load(&a[c..]), E::load(s, &b[c..]), acc);
        c += l;
    }
    if c < n {
        acc = s.fma(s.load_part(&a[c..]), E::load_part(s, &b[c..]), acc);
    }
    acc
}

/// `out[c0..c0 + B·LANES] += Σ_t p[t]·values[rows[t] + c0..]` (clipped to `hd`), with
/// `U` sets of `B` accumulators taking consecutive positions in turn. `FULL`: the `B`
/// vectors lie within `hd`, so no lane needs masking.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn weighted_sum<S: Simd, E: Elem, const B: usize, const U: usize, const FULL: bool>(
    s: S,
    p: &[f32],
    values: &[E],
    rows: &[usize],
    hd: usize,
    c0: usize,
    out: &mut [f32],
) {
    let l = S::LANES;
    // The block's columns: exactly `B` vectors when `FULL`, so that no load is checked.
    let (c1, w) = (c0, if FULL { B * l } else { hd - c0 });
    let mut acc = [[s.zero(); B]; U];
    let len = p.len();
    let mut t = 0;
    while t + U <= len {
        let pu = &p[t..t + U];
        for (u, acc) in acc.iter_mut().enumerate() {
            axpy::<S, E, B, FULL>(s, acc, pu[u], &values[rows[t + u] + c1..][..w]);
        }
        t += U;
    }
    while t < len {
        axpy::<S, E, B, FULL>(s, &mut acc[0], p[t], &values[rows[t] + c1..][..w]);
        t += 1;
    }
    for b in 0..B {
        let c = c0 + b * l;
        if c >= hd {
            break;
        }
        let mut v = acc[0][b];
        for acc in &acc[1..] {
            v = s.add(v, acc[b]);
        }
        if c + l <= hd {
            let sum = s.add(s.load(&out[c..]), v);
            s.store(&mut out[c..], sum);
        } else {
            let o = &mut out[c..hd];
            let sum = s.add(s.load_part(o), v);
            s.store_part(o, sum);
        }
    }
}

/// `acc[b] += p · row[b·LANES..]` (clipped to `row.len()`).
#[inline(always)]
fn axpy<S: Simd, E: Elem, const B: usize, const FULL: bool>(
    s: S,
    acc: &mut [S::V; B],
    p: f32,
    row: &[E],
) {
    let (l, pv) = (S::LANES, s.splat(p));
    for (b, acc) in acc.iter_mut().enumerate() {
        let c = b * l;
        if FULL || c + l <= row.len() {
            *acc = s.fma(pv, E::load(s, &row[c..]), *acc);
        } else if c < row.len() {
            *acc = s.fma(pv, E::load_part(s, &row[c..]), *acc);
        }
    }
}
