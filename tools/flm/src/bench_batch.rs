//! `flm bench --batch N`: the aggregate throughput of N sequences decoded together by the
//! batched forward pass over a paged KV cache ([`LlamaBatch`], what the serving engine
//! runs): each step is one forward of N rows, so the weights are read once for N tokens.

use std::time::Instant;

use anyhow::Result;
use flm_core::Executor;
use flm_models::llama::{Llama, LlamaBatch};
use flm_models::Graph;
use flm_models::{BatchSeq, BatchedForward};

/// Positions per KV block.
const BLOCK_SIZE: usize = 16;

/// Prefills `n` sequences (each `prompt` rotated by its index, so that they differ) in one
/// batch, then decodes `gen_tokens` greedy steps of all of them; returns the aggregate
/// prefill and decode tokens/s.
pub fn once(
    exec: &Executor,
    model: &Llama,
    prompt: &[u32],
    n: usize,
    gen_tokens: usize,
) -> Result<(f64, f64)> {
    let c = model.config();
    let positions = c.pre_seq_len + prompt.len() + gen_tokens;
    let per_seq = positions.div_ceil(BLOCK_SIZE);
    let mut batch = LlamaBatch::new(model.model().clone(), n * prompt.len())?;
    let mut kv = batch.kv_pool(exec, n * per_seq, BLOCK_SIZE)?;
    let tables: Vec<Vec<u32>> = (0..n)
        .map(|_| {
            (0..per_seq)
                .filter_map(|_| kv.allocator_mut().alloc())
                .collect()
        })
        .collect();
    for table in &tables {
        batch.write_prefix(exec, &mut kv, table)?;
    }
    let prompts: Vec<Vec<u32>> = (0..n)
        .map(|i| {
            let mut p = prompt.to_vec();
            p.rotate_left(i % prompt.len());
            p
        })
        .collect();
    let start = Instant::now();
    let seqs: Vec<BatchSeq<'_>> = prompts
        .iter()
        .zip(&tables)
        .map(|(p, t)| BatchSeq {
            tokens: p,
            start_pos: 0,
            blocks: t,
        })
        .collect();
    let vocab = c.vocab_size;
    let logits = batch.forward(exec, &mut kv, &seqs)?;
    let mut next: Vec<u32> = logits.chunks_exact(vocab).map(flm_core::argmax).collect();
    let prefill = start.elapsed().as_secs_f64();
    let start = Instant::now();
    for g in 0..gen_tokens {
        let seqs: Vec<BatchSeq<'_>> = next
            .iter()
            .zip(&tables)
            .map(|(t, table)| BatchSeq {
                tokens: std::slice::from_ref(t),
                start_pos: prompt.len() + g,
                blocks: table,
            })
            .collect();
        let logits = batch.forward(exec, &mut kv, &seqs)?;
        next = logits.chunks_exact(vocab).map(flm_core::argmax).collect();
    }
    let decode = start.elapsed().as_secs_f64();
    Ok((
        (n * prompt.len()) as f64 / prefill,
        (n * gen_tokens) as f64 / decode,
    ))
}
