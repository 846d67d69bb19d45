//! Embedding lookup.

use flm_core::{quant, Data, Error, Result};

use super::weights::{widen, Rows};
use super::{shape_err, Isa};

/// `output[i, :] = table[tokens[i], :]` (see [`flm_core::Op::Embedding`]): a copy for f32
/// tables, widened ([`widen`]) for f16/bf16 ones, dequantised for quantised ones.
pub(crate) fn embedding(isa: Isa, table: &Data, tokens: &[u32], output: &mut Data) -> Result<()> {
    let (vocab_size, dim) = (table.rows(), table.cols());
    if output.rows() != tokens.len() || output.cols() != dim || dim == 0 {
        return Err(shape_err(
            "Embedding",
            format!(
                "output {:?} for {} tokens of dim {dim}",
                output.shape(),
                tokens.len()
            ),
        ));
    }
    if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab_size) {
        return Err(Error::TokenOutOfRange { id, vocab_size });
    }
    let rows = Rows::new(table)?;
    let out = output.as_f32_mut()?;
    for (dst, &t) in out.chunks_exact_mut(dim).zip(tokens) {
        let r = t as usize;
        match &rows {
            Rows::F32(w) => dst.copy_from_slice(&w[r * dim..][..dim]),
            Rows::F16(w) => widen(isa, &w[r * dim..][..dim], dst),
            Rows::BF16(w) => widen(isa, &w[r * dim..][..dim], dst),
            Rows::Quant {
                dtype,
                bytes,
                row_bytes,
            } => quant::dequantize_row(*dtype, &bytes[r * row_bytes..][..*row_bytes], dst),
        }
    }
    Ok(())
}
