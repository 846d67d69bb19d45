//! Embedding lookup.

use flm_core::{quant, Data, Result};

use super::weights::{widen, WeightRows};
use super::Isa;

/// `output[i, :] = table[tokens[i], :]` (see [`flm_core::Op::Embedding`]): a copy for f32
/// tables, widened ([`widen`]) for f16/bf16 ones, dequantised for quantised ones.
pub(crate) fn embedding(isa: Isa, table: &Data, tokens: &[u32], output: &mut Data) -> Result<()> {
    let dim = table.cols();
    let rows = WeightRows::new(table)?;
    let out = output.as_f32_mut()?;
    for (dst, &t) in out.chunks_exact_mut(dim).zip(tokens) {
        let r = t as usize;
        match &rows {
            WeightRows::F32(w) => dst.copy_from_slice(&w[r * dim..][..dim]),
            WeightRows::F16(w) => widen(isa, &w[r * dim..][..dim], dst),
            WeightRows::BF16(w) => widen(isa, &w[r * dim..][..dim], dst),
            WeightRows::Quant {
                dtype,
                bytes,
                row_bytes,
            } => quant::dequantize_row(*dtype, &bytes[r * row_bytes..][..*row_bytes], dst),
        }
    }
    Ok(())
}
