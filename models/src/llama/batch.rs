//! The batched forward pass over a paged KV cache: several sequences in one pass, as
//! continuous batching needs (Yu et al. 2022, Orca's iteration-level scheduling; vLLM).
//!
//! Each sequence brings its own tokens (one when decoding, a chunk of its prompt when
//! prefilling), its position and its block table in a [`PagedKvCache`]. Their rows are
//! stacked into one `[Σ tokens, dim]` matrix, so that the embedding, the norms, every
//! [`Op::Linear`] (each weight read once per step for the whole batch), SwiGLU and the
//! residuals run once over all of them; RoPE takes each row's own position
//! ([`Op::RopeRows`]), keys and values are scattered into each sequence's blocks
//! ([`Op::ScatterRows`]), and attention reads each row's keys and values through its
//! sequence's block table ([`Op::PagedAttention`]). Each row is computed as
//! [`crate::Graph::forward`] computes it: with batch-invariant kernels the logits are the
//! same bits.
//!
//! A model placed on devices ([`crate::Placement`]) runs here as [`crate::Graph::forward`]
//! runs it: each layer's pools ([`LlamaBatch::kv_pool`]) and activations in its memory, the
//! residual stream copied at each boundary, and the logits copied to the host once per
//! step. The step's row metadata (token ids, positions, slots, block tables) go with the
//! ops in host memory.

use std::sync::Arc;

use flm_core::{Data, Error as CoreError, Executor, Op, PagedKvCache, PagedSeq};

use super::{
    finish, host_output, placed_states, run_layers, Activations, Head, Logits, SharedLlama,
};
use crate::graph::{BatchSeq, BatchedForward};
use crate::{Error, ModelConfig, Result};

/// Runs batches of sequences through a shared [`SharedLlama`] (see the module docs). Its
/// activations grow to the largest batch seen.
pub struct LlamaBatch {
    model: Arc<SharedLlama>,
    /// The activations of each memory of the model's placement, in its order; allocated
    /// by the first forward pass.
    states: Vec<Activations>,
    rows: usize,
    /// The logits copied to the host, when the last layer is on a device.
    host_out: Option<Data>,
    tokens: Vec<u32>,
    positions: Vec<u32>,
    slots: Vec<u32>,
    last_rows: Vec<usize>,
    /// The p-tuning prefix of each layer: keys and values `[pre_seq_len, kv_dim]`, moved to
    /// the layer's memory when first written.
    prefix: Vec<(Data, Data)>,
}

impl LlamaBatch {
    /// A batch runner of `model`, with activations for `rows` rows to start with.
    ///
    /// Errors: a p-tuning prefix that cannot be read.
    pub fn new(model: Arc<SharedLlama>, rows: usize) -> Result<LlamaBatch> {
        let c = &model.config;
        let rows = rows.max(1);
        let mut prefix = Vec::new();
        if let Some(p) = &model.weights.prefix_kv {
            let kv_dim = c.kv_dim();
            let values = p.to_f32_vec()?;
            for l in 0..c.n_layers {
                let (mut k, mut v) = (Vec::new(), Vec::new());
                for row in values.chunks_exact(c.n_layers * 2 * kv_dim) {
                    let pair = &row[l * 2 * kv_dim..][..2 * kv_dim];
                    k.extend_from_slice(&pair[..kv_dim]);
                    v.extend_from_slice(&pair[kv_dim..]);
                }
                let shape = [c.pre_seq_len, kv_dim];
                prefix.push((Data::from_f32(&shape, &k)?, Data::from_f32(&shape, &v)?));
            }
        }
        Ok(LlamaBatch {
            model,
            states: Vec::new(),
            rows,
            host_out: None,
            tokens: Vec::new(),
            positions: Vec::new(),
            slots: Vec::new(),
            last_rows: Vec::new(),
            prefix,
        })
    }
}

impl BatchedForward for LlamaBatch {
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn kv_pool(&self, exec: &Executor, n_blocks: usize, block_size: usize) -> Result<PagedKvCache> {
        let c = &self.model.config;
        let layers = self.model.placement.layers();
        Ok(PagedKvCache::placed(
            exec,
            layers,
            n_blocks,
            block_size,
            c.kv_widths(),
            self.model.kv_dtype,
        )?)
    }

    fn write_prefix(
        &mut self,
        exec: &Executor,
        kv: &mut PagedKvCache,
        blocks: &[u32],
    ) -> Result<()> {
        let pre = self.model.config.pre_seq_len;
        if self.prefix.is_empty() || pre == 0 {
            return Ok(());
        }
        self.slots.clear();
        for p in 0..pre {
            self.slots
                .push(kv.slot(blocks, p).ok_or(CoreError::ContextOverflow {
                    needed: pre,
                    max: blocks.len() * kv.block_size(),
                })?);
        }
        for (l, (k, v)) in self.prefix.iter_mut().enumerate() {
            let (pool_k, pool_v) = kv.layer_mut(l);
            // Copied once, the first time: afterwards the prefix is where its pool is.
            for (src, pool) in [(&mut *k, &*pool_k), (&mut *v, &*pool_v)] {
                if src.location() != pool.location() {
                    *src = exec.to_device(src, pool.location(), "load: p-tuning prefix")?;
                }
            }
            exec.run(Op::ScatterRows {
                src: k,
                rows: &self.slots,
                dst: pool_k,
            })?;
            exec.run(Op::ScatterRows {
                src: v,
                rows: &self.slots,
                dst: pool_v,
            })?;
        }
        Ok(())
    }

    fn forward(
        &mut self,
        exec: &Executor,
        kv: &mut PagedKvCache,
        seqs: &[BatchSeq<'_>],
    ) -> Result<&[f32]> {
        let model = Arc::clone(&self.model);
        let c = &model.config;
        if seqs.is_empty() {
            return Err(Error::InvalidInput(
                "a batch needs at least one sequence".into(),
            ));
        }
        self.tokens.clear();
        self.positions.clear();
        self.slots.clear();
        self.last_rows.clear();
        for seq in seqs {
            super::check_forward(c, seq.tokens, seq.start_pos)?;
            self.tokens.extend_from_slice(seq.tokens);
            let end = seq.start_pos + seq.tokens.len();
            // Each sequence's RoPE rows by its own length (LongRoPE, see `RopeTable::offset`).
            let rope_offset = model.rope.offset(end);
            for pos in seq.start_pos..end {
                let row = c.pre_seq_len + pos;
                let slot = kv.slot(seq.blocks, row).ok_or(CoreError::ContextOverflow {
                    needed: row + 1,
                    max: seq.blocks.len() * kv.block_size(),
                })?;
                self.positions.push((pos + rope_offset) as u32);
                self.slots.push(slot);
            }
            self.last_rows.push(self.tokens.len() - 1);
        }
        let n = self.tokens.len();
        if n > self.rows || self.states.is_empty() {
            self.rows = self.rows.max(n);
            self.states = placed_states(exec, &model, self.rows)?;
        }
        let paged: Vec<PagedSeq<'_>> = seqs
            .iter()
            .map(|seq| PagedSeq {
                n_rows: seq.tokens.len(),
                start_pos: c.pre_seq_len + seq.start_pos,
                blocks: seq.blocks,
            })
            .collect();
        for s in &mut self.states {
            s.set_rows(c, n)?;
        }
        let (positions, slots, block_size) = (&self.positions, &self.slots, kv.block_size());
        let s = run_layers(exec, &model, &self.tokens, &mut self.states, |l, s| {
            if !c.alibi {
                for (x, n_heads) in s.rotated(c) {
                    exec.run(Op::RopeRows {
                        x,
                        table: model.rope_of(l),
                        n_heads,
                        positions,
                    })?;
                }
            }
            let params = model.attention_params(l);
            let (first, second) = kv.layer_mut(l);
            let mut io = s.attention_io();
            io.sinks = model.sinks(l);
            for (src, dst) in io.new_rows.into_iter().zip([&mut *first, &mut *second]) {
                exec.run(Op::ScatterRows {
                    src,
                    rows: slots,
                    dst,
                })?;
            }
            exec.run(Op::PagedAttention {
                operands: io.operands((first, second), params),
                block_size,
                seqs: &paged,
            })
        })?;
        let norm = &model.weights.final_norm;
        finish(
            exec,
            &model,
            s,
            Head::Logits(Logits::Last),
            &self.last_rows,
            norm,
        )?;
        host_output(&model, &self.states, &mut self.host_out, exec)
    }
}
