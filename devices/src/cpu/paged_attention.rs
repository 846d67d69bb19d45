//! Attention over a paged KV cache for a batch of sequences ([`flm_core::Op::PagedAttention`]):
//! the kernels of [`super::attention`], which read each row's keys and values through its
//! sequence's block table.

use flm_core::{AttentionOperands, PagedSeq, Result};

use super::attention::{self, QueryRow, QueryRows};
use super::Isa;

/// See [`flm_core::Op::PagedAttention`]: `q`, `output` f32 `[Σ n_rows, n_heads·head_dim]`,
/// the pools f32 or f16 `[n_blocks·block_size, n_kv_heads·head_dim]`, block tables that cover
/// their sequences' positions inside the pool (checked by [`flm_core::Op::validate`]).
pub(crate) fn paged_attention(
    isa: Isa,
    operands: AttentionOperands<'_>,
    block_size: usize,
    seqs: &[PagedSeq<'_>],
) -> Result<()> {
    let total = operands.q.rows();
    let mut rows = Vec::with_capacity(total);
    for s in seqs {
        let end = s.start_pos + s.n_rows;
        rows.extend((s.start_pos..end).map(|pos| QueryRow {
            pos,
            blocks: s.blocks,
        }));
    }
    let rows = QueryRows::Paged {
        rows: &rows,
        block_size,
    };
    attention::run(isa, operands, rows)
}
