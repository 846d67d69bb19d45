//! Attention over a paged KV cache for a batch of sequences ([`flm_core::Op::PagedAttention`]):
//! the checks of a batch and its block tables, then the kernels of [`super::attention`],
//! which read each row's keys and values through its sequence's block table.

use flm_core::{Data, Error, PagedSeq, Result};

use super::attention::{self, Heads, Mask, Row, Rows};
use super::{shape_err, Isa};

/// See [`flm_core::Op::PagedAttention`]: `q`, `output` f32 `[Σ n_rows, n_heads·head_dim]`,
/// the pools f32 `[n_blocks·block_size, n_kv_heads·head_dim]`.
///
/// Errors: [`Error::Shape`] when the shapes or head counts disagree, the sequences' rows do
/// not add up to `q`'s, the pool is not whole blocks or the window is 0;
/// [`Error::ContextOverflow`] when a block table is too short for its sequence's positions;
/// [`Error::OutOfBounds`] for a block id outside the pool.
#[allow(clippy::too_many_arguments)]
pub(crate) fn paged_attention(
    isa: Isa,
    q: &Data,
    (cache_k, cache_v): (&Data, &Data),
    block_size: usize,
    seqs: &[PagedSeq<'_>],
    heads: Heads,
    mask: Mask,
    output: &mut Data,
) -> Result<()> {
    const OP: &str = "PagedAttention";
    attention::check_shapes(OP, q, cache_k, cache_v, heads, output)?;
    let pool_rows = cache_k.rows();
    if block_size == 0 || !pool_rows.is_multiple_of(block_size) {
        return Err(shape_err(
            OP,
            format!("a pool of {pool_rows} rows in blocks of {block_size}"),
        ));
    }
    let n_blocks = pool_rows / block_size;
    let total: usize = seqs.iter().map(|s| s.n_rows).sum();
    if total != q.rows() {
        return Err(shape_err(
            OP,
            format!("the sequences have {total} rows, q {:?}", q.shape()),
        ));
    }
    let mut rows = Vec::with_capacity(total);
    for s in seqs {
        let end = s.start_pos.saturating_add(s.n_rows);
        let capacity = s.blocks.len().saturating_mul(block_size);
        if end > capacity {
            return Err(Error::ContextOverflow {
                needed: end,
                max: capacity,
            });
        }
        if let Some(&b) = s.blocks.iter().find(|&&b| b as usize >= n_blocks) {
            return Err(Error::OutOfBounds(format!(
                "KV block {b} of a pool of {n_blocks} blocks"
            )));
        }
        rows.extend((s.start_pos..end).map(|pos| Row {
            pos,
            blocks: s.blocks,
        }));
    }
    let window = attention::window(OP, mask)?;
    let rows = Rows::Paged {
        rows: &rows,
        block_size,
    };
    attention::run(isa, q, cache_k, cache_v, rows, heads, mask, window, output)
}
