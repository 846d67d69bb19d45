//! Rotary position embedding, applied in place.

use flm_core::{Data, Error, Result, RopeStyle, RopeTable};

use super::shape_err;

/// Rotates the first `table.rotary_dim()` dimensions of each head of each row of `x`
/// `[n, n_heads * head_dim]`; row `i` is at position `start_pos + i`. For a pair `(a, b)` and
/// angle θ: `a' = a·cosθ − b·sinθ`, `b' = a·sinθ + b·cosθ` (RoFormer eq. 34). Pairs are
/// `(2j, 2j+1)` for [`RopeStyle::AdjacentPairs`] and `(j, j + rotary_dim/2)` for
/// [`RopeStyle::RotateHalf`].
pub(crate) fn rope(
    x: &mut Data,
    table: &RopeTable,
    n_heads: usize,
    start_pos: usize,
) -> Result<()> {
    let head_dim = table.head_dim();
    let n = x.rows();
    if x.cols() != n_heads * head_dim || head_dim == 0 {
        return Err(shape_err(
            "Rope",
            format!("x {:?} for {n_heads} heads of {head_dim}", x.shape()),
        ));
    }
    // Saturating: an absurd `start_pos` is a context overflow, not an arithmetic panic.
    if start_pos.saturating_add(n) > table.max_pos() {
        return Err(Error::ContextOverflow {
            needed: start_pos.saturating_add(n),
            max: table.max_pos(),
        });
    }
    let half = table.rotary_dim() / 2;
    let style = table.style();
    let cols = x.cols();
    for (i, row) in x.as_f32_mut()?.chunks_exact_mut(cols).enumerate() {
        let Some((cos, sin)) = table.at(start_pos + i) else {
            continue;
        };
        for head in row.chunks_exact_mut(head_dim) {
            for j in 0..half {
                let (a, b) = match style {
                    RopeStyle::AdjacentPairs => (2 * j, 2 * j + 1),
                    RopeStyle::RotateHalf => (j, j + half),
                };
                let (va, vb) = (head[a], head[b]);
                head[a] = va * cos[j] - vb * sin[j];
                head[b] = va * sin[j] + vb * cos[j];
            }
        }
    }
    Ok(())
}
