//! Causal multi-head attention with grouped-query heads over the KV cache.

use std::cell::RefCell;

use flm_core::{Data, Error, Result};
use rayon::prelude::*;

use super::weights::dot;
use super::{shape_err, PARALLEL_MIN_WORK};

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `output = softmax(q·Kᵀ·scale)·V` per head, causal, GQA (see [`flm_core::Op::Attention`]),
/// as llama2.c `forward`: scores and softmax in f32 with the maximum subtracted.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    q: &Data,
    cache_k: &Data,
    cache_v: &Data,
    start_pos: usize,
    n_heads: usize,
    n_kv_heads: usize,
    scale: f32,
    output: &mut Data,
) -> Result<()> {
    let n = q.rows();
    if n_heads == 0
        || n_kv_heads == 0
        || !n_heads.is_multiple_of(n_kv_heads)
        || !q.cols().is_multiple_of(n_heads)
    {
        return Err(shape_err(
            "Attention",
            format!(
                "{n_heads} query heads, {n_kv_heads} KV heads, q {:?}",
                q.shape()
            ),
        ));
    }
    let head_dim = q.cols() / n_heads;
    let kv_dim = n_kv_heads * head_dim;
    if head_dim == 0
        || cache_k.cols() != kv_dim
        || cache_v.shape() != cache_k.shape()
        || output.shape() != q.shape()
    {
        return Err(shape_err(
            "Attention",
            format!(
                "q {:?}, caches {:?} and {:?}, output {:?}, {n_heads} heads, {n_kv_heads} KV heads",
                q.shape(),
                cache_k.shape(),
                cache_v.shape(),
                output.shape()
            ),
        ));
    }
    // Saturating: an absurd `start_pos` is a context overflow, not an arithmetic panic.
    if start_pos.saturating_add(n) > cache_k.rows() {
        return Err(Error::ContextOverflow {
            needed: start_pos.saturating_add(n),
            max: cache_k.rows(),
        });
    }
    let group = n_heads / n_kv_heads;
    let (q, keys, values) = (q.as_f32()?, cache_k.as_f32()?, cache_v.as_f32()?);
    // One task per (row, head): writes `head_dim` outputs.
    let head = |task: usize, out: &mut [f32]| {
        let (i, h) = (task / n_heads, task % n_heads);
        let len = start_pos + i + 1;
        let qh = &q[(i * n_heads + h) * head_dim..][..head_dim];
        let kv_off = (h / group) * head_dim;
        SCORES.with_borrow_mut(|scores| {
            scores.clear();
            scores.extend(
                (0..len).map(|t| dot(qh, &keys[t * kv_dim + kv_off..][..head_dim]) * scale),
            );
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            out.fill(0.0);
            for (t, s) in scores.iter().enumerate() {
                let p = s / sum;
                for (o, v) in out
                    .iter_mut()
                    .zip(&values[t * kv_dim + kv_off..][..head_dim])
                {
                    *o += p * v;
                }
            }
        });
    };
    let out = output.as_f32_mut()?;
    let work = n * n_heads * (start_pos + n) * head_dim * 2;
    if work >= PARALLEL_MIN_WORK {
        out.par_chunks_mut(head_dim)
            .enumerate()
            .for_each(|(t, o)| head(t, o));
    } else {
        for (t, o) in out.chunks_mut(head_dim).enumerate() {
            head(t, o);
        }
    }
    Ok(())
}
