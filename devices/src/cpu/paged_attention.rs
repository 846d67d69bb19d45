//! Attention over a paged KV cache for a batch of sequences ([`flm_core::Op::PagedAttention`]):
//! the kernels of [`super::attention`], which read each row's keys and values through its
//! sequence's block table.

use flm_core::{AttentionParams, Data, PagedSeq, Result};

use super::attention::{self, QueryRow, QueryRows};
use super::Isa;

/// See [`flm_core::Op::PagedAttention`]: `q`, `output` f32 `[Σ n_rows, n_heads·head_dim]`,
/// the pools f32 or f16 `[n_blocks·block_size, n_kv_heads·head_dim]`, block tables that cover
/// their sequences' positions inside the pool (checked by [`flm_core::Op::validate`]).
pub(crate) fn paged_attention(
    isa: Isa,
    q: &Data,
    (cache_k, cache_v): (&Data, &Data),
    block_size: usize,
    seqs: &[PagedSeq<'_>],
    params: AttentionParams,
    output: &mut Data,
) -> Result<()> {
    let total = q.rows();
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
    attention::run(isa, q, cache_k, cache_v, rows, params, output)
}
