//! RoPE on [`super::CudaDevice`]: [`flm_core::Op::Rope`], `RopeRows` and `Rope2d` through
//! the one `rope` kernel (see `kernels/rope.cu`).

use cudarc::driver::PushKernelArg;
use flm_core::{Data, Error, Result, RopeStyle, RopeTable};

use super::device::CudaDevice;
use super::graph::{Bound, StepWords};
use super::kernels::Kernel;
use super::launch::{dev_err, grid, int};

/// Rotates `x` `[n, n_heads · span]`, `span = table.head_dim() · parts.len()`: part `k`
/// `(positions, offset)` is the `table.head_dim()` values at `offset` in each head, row `i`
/// rotated at `positions[i]`. The kernel reads the cos/sin rows of those positions from a
/// copy of the whole table in GPU memory (uploaded once, so the angles are the CPU's bit for
/// bit) and the positions from device memory: the step's buffer in a captured step, where
/// an op that follows the step (`follows_step`) must have the step's positions.
///
/// The shapes and positions passed [`flm_core::Op::validate`]; a position past the table
/// still fails with [`Error::ContextOverflow`] rather than panic.
pub(super) fn rope(
    dev: &CudaDevice,
    x: &mut Data,
    table: &RopeTable,
    n_heads: usize,
    parts: &[(&[u32], usize)],
    follows_step: bool,
) -> Result<()> {
    let head_dim = table.head_dim();
    let span = head_dim * parts.len();
    let n = x.rows();
    if n == 0 {
        return Ok(());
    }
    let step = dev.step_words("RoPE", follows_step, |tokens, start, _| {
        tokens.len() == n
            && parts.iter().all(|(positions, _)| {
                (positions.iter().enumerate()).all(|(i, &p)| p as usize == start + i)
            })
    })?;
    let max_pos = table.max_pos();
    for &(positions, _) in parts {
        if let Some(&p) = positions.iter().find(|&&p| p as usize >= max_pos) {
            return Err(Error::ContextOverflow {
                needed: p as usize + 1,
                max: max_pos,
            });
        }
    }
    dev.bound(Bound::Positions(max_pos))?;
    let rows = dev.rope_rows(table)?;
    let mut xd = dev.in_out(x)?;
    let style = int(match table.style() {
        RopeStyle::AdjacentPairs => 0,
        RopeStyle::RotateHalf => 1,
    })?;
    let bad = dev.zeros::<i32>(1)?;
    let (n_heads_i, span_i, rot_i, max_u) = (
        int(n_heads)?,
        int(span)?,
        int(table.rotary_dim())?,
        u32::try_from(max_pos).unwrap_or(u32::MAX),
    );
    for &(positions, offset) in parts {
        let positions = dev.step_or_upload(step.as_ref(), StepWords::positions, positions)?;
        let positions = positions.view();
        let offset_i = int(offset)?;
        let f = dev.function(Kernel::Rope)?;
        let mut b = dev.stream.launch_builder(f);
        b.arg(xd.slice())
            .arg(&rows.cos)
            .arg(&rows.sin)
            .arg(&positions)
            .arg(&n_heads_i)
            .arg(&span_i);
        b.arg(&offset_i)
            .arg(&rot_i)
            .arg(&style)
            .arg(&max_u)
            .arg(&bad);
        // SAFETY: arguments as `rope(float*, const float*, const float*, const unsigned*,
        // int, int, int, int, int, unsigned, int*)`; x holds n × n_heads × span floats, the
        // tables max_pos × rotary_dim / 2 each, positions n values, and the kernel reads no
        // table row at a position >= max_pos.
        unsafe { b.launch(grid((n, 1, 1), 128, 0)?) }.map_err(dev_err)?;
    }
    // The host checked every position; the flag guards the kernel's own reads.
    dev.check_flag(&bad, || {
        Error::Device("the rope kernel met a position past its table".into())
    })?;
    xd.finish(dev)
}
