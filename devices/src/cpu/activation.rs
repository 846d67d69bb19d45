//! Activation functions.

use flm_core::{Data, Result};

use super::shape_err;

/// SwiGLU gate: `out = silu(gate) * up`, `silu(x) = x / (1 + e^-x)` (llama2.c `forward`).
pub(crate) fn silu_mul(gate: &Data, up: &Data, output: &mut Data) -> Result<()> {
    if gate.shape() != up.shape() || gate.shape() != output.shape() {
        return Err(shape_err(
            "SiluMul",
            format!(
                "gate {:?}, up {:?}, output {:?}",
                gate.shape(),
                up.shape(),
                output.shape()
            ),
        ));
    }
    let (g, u) = (gate.as_f32()?, up.as_f32()?);
    for ((o, &g), &u) in output.as_f32_mut()?.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
    Ok(())
}
