//! RoPE on [`super::CudaDevice`]: [`flm_core::Op::Rope`], `RopeRows` and `Rope2d` through
//! the one `rope` kernel (see `kernels/rope.cu`).

use cudarc::driver::PushKernelArg;
use flm_core::{Data, Error, Result, RopeStyle, RopeTable};

use super::device::{dev_err, grid, int, CudaDevice};
use super::kernels::Kernel;

/// Rotates `x` `[n, n_heads · span]`, `span = table.head_dim() · parts.len()`: part `k`
/// `(positions, offset)` is the `table.head_dim()` values at `offset` in each head, row `i`
/// rotated at `positions[i]`. The cos/sin rows of those positions are gathered on the host
/// from the table (so the angles are the CPU's bit for bit) and the kernel reads them as a
/// table of `n` positions.
///
/// The shapes and positions passed [`flm_core::Op::validate`]; the table look-up still
/// fails with [`Error::ContextOverflow`] rather than panic.
pub(super) fn rope(
    dev: &CudaDevice,
    x: &mut Data,
    table: &RopeTable,
    n_heads: usize,
    parts: &[(&[u32], usize)],
) -> Result<()> {
    let head_dim = table.head_dim();
    let span = head_dim * parts.len();
    let n = x.rows();
    if n == 0 {
        return Ok(());
    }
    let half = table.rotary_dim() / 2;
    let mut xd = dev.in_out(x)?;
    let style = int(match table.style() {
        RopeStyle::AdjacentPairs => 0,
        RopeStyle::RotateHalf => 1,
    })?;
    let rows: Vec<u32> = (0..n as u32).collect();
    let rows_d = dev.upload(&rows)?;
    let bad = dev.zeros::<i32>(1)?;
    let (n_heads_i, span_i, rot_i, n_u) = (
        int(n_heads)?,
        int(span)?,
        int(table.rotary_dim())?,
        n as u32,
    );
    for &(positions, offset) in parts {
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for &p in positions {
            let (c, s) = table.at(p as usize).ok_or(Error::ContextOverflow {
                needed: p as usize + 1,
                max: table.max_pos(),
            })?;
            cos.extend_from_slice(c);
            sin.extend_from_slice(s);
        }
        let (cos_d, sin_d) = (dev.upload(&cos)?, dev.upload(&sin)?);
        let offset_i = int(offset)?;
        let f = dev.function(Kernel::Rope)?;
        let mut b = dev.stream.launch_builder(f);
        b.arg(xd.slice())
            .arg(&cos_d)
            .arg(&sin_d)
            .arg(&rows_d)
            .arg(&n_heads_i)
            .arg(&span_i);
        b.arg(&offset_i).arg(&rot_i).arg(&style).arg(&n_u).arg(&bad);
        // SAFETY: arguments as `rope(float*, const float*, const float*, const unsigned*,
        // int, int, int, int, int, unsigned, int*)`; x holds n × n_heads × span floats, the
        // gathered tables n × rotary_dim / 2 each, and every row index is < n.
        unsafe { b.launch(grid((n, 1, 1), 128, 0)?) }.map_err(dev_err)?;
    }
    // The host checked every position; the flag guards the kernel's own reads.
    dev.check_flag(&bad, || {
        Error::Device("the rope kernel met a position past its table".into())
    })?;
    xd.finish(dev)
}
