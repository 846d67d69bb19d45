//! Normalisation layers.

use flm_core::{Data, Result};

use super::shape_err;
use super::weights::{dot, Rows};

/// RMSNorm (Zhang & Sennrich 2019) as in llama2.c `rmsnorm` and HF `LlamaRMSNorm`:
/// `out = x / sqrt(mean(x²) + eps) * weight`, per row, accumulated in f32.
pub(crate) fn rms_norm(input: &Data, weight: &Data, eps: f32, output: &mut Data) -> Result<()> {
    let dim = input.cols();
    if dim == 0 || weight.numel() != dim || output.shape() != input.shape() {
        return Err(shape_err(
            "RmsNorm",
            format!(
                "input {:?}, weight {:?}, output {:?}",
                input.shape(),
                weight.shape(),
                output.shape()
            ),
        ));
    }
    let mut buf = Vec::new();
    let rows = Rows::new(weight)?;
    let w = rows.row(0, dim, &mut buf);
    let x = input.as_f32()?;
    let out = output.as_f32_mut()?;
    for (src, dst) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let scale = 1.0 / (dot(src, src) / dim as f32 + eps).sqrt();
        for ((d, s), g) in dst.iter_mut().zip(src).zip(w) {
            *d = s * scale * g;
        }
    }
    Ok(())
}
