//! Embedding lookup.

use flm_core::{Data, Error, Result};

use super::shape_err;
use super::weights::Rows;

/// `output[i, :] = table[tokens[i], :]` (see [`flm_core::Op::Embedding`]).
pub(crate) fn embedding(table: &Data, tokens: &[u32], output: &mut Data) -> Result<()> {
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
    let mut buf = Vec::new();
    for (dst, &t) in out.chunks_exact_mut(dim).zip(tokens) {
        dst.copy_from_slice(rows.row(t as usize, dim, &mut buf));
    }
    Ok(())
}
