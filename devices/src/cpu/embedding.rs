//! Embedding lookup.

use flm_core::{Data, Error, Result, TokenIds};

use super::weights::{widen, WeightRows};
use super::Isa;

/// `output[i, :] = table[tokens[i], :]` (see [`flm_core::Op::Embedding`]): a copy for f32
/// tables, widened ([`widen`]) for f16/bf16 ones, dequantised for quantised ones.
///
/// Errors: [`Error::TokenOutOfRange`] for an id of a token tensor outside the table (host
/// ids were checked by the op contract).
pub(crate) fn embedding(
    isa: Isa,
    table: &Data,
    tokens: TokenIds<'_>,
    output: &mut Data,
) -> Result<()> {
    let tokens: &[u32] = match tokens {
        TokenIds::Host(ids) => ids,
        TokenIds::Tensor(ids) => bytemuck::cast_slice(ids.bytes()?),
    };
    let vocab_size = table.rows();
    if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab_size) {
        return Err(Error::TokenOutOfRange { id, vocab_size });
    }
    let dim = table.cols();
    let rows = WeightRows::new(table)?;
    let out = output.as_f32_mut()?;
    for (dst, &t) in out.chunks_exact_mut(dim).zip(tokens) {
        let r = t as usize;
        match &rows {
            WeightRows::F32(w) => dst.copy_from_slice(&w[r * dim..][..dim]),
            WeightRows::F16(w) => widen(isa, &w[r * dim..][..dim], dst),
            WeightRows::BF16(w) => widen(isa, &w[r * dim..][..dim], dst),
            WeightRows::Quant { .. } => rows.dequantize(r, dim, dst)?,
        }
    }
    Ok(())
}
