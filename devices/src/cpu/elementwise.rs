//! Element-wise and copy ops: residual add, row copies, argmax.

use flm_core::{Data, Result};

use super::simd::{self, Kernel, Simd};
use super::Isa;

/// `x += y` element-wise, over f32 tensors of one shape.
pub(crate) fn add(isa: Isa, x: &mut Data, y: &Data) -> Result<()> {
    let k = Add {
        y: y.as_f32()?,
        x: x.as_f32_mut()?,
    };
    simd::run(isa, k);
    Ok(())
}

/// The operands of [`add`], as f32 slices of one length.
struct Add<'a> {
    x: &'a mut [f32],
    y: &'a [f32],
}

impl Kernel for Add<'_> {
    type Output = ();

    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let (n, l) = (self.x.len(), S::LANES);
        let (x, y) = (self.x, &self.y[..n]);
        let mut c = 0;
        while c + l <= n {
            let v = s.add(s.load(&x[c..]), s.load(&y[c..]));
            s.store(&mut x[c..], v);
            c += l;
        }
        if c < n {
            let v = s.add(s.load_part(&x[c..]), s.load_part(&y[c..]));
            s.store_part(&mut x[c..], v);
        }
    }
}

/// `x[i, :] += σ(gate[i]) · y[i, :]` (see [`flm_core::Op::GatedAdd`]): one gate per row,
/// so the rows' adds are a few multiply-adds each and need no SIMD kernel of their own.
pub(crate) fn gated_add(x: &mut Data, y: &Data, gate: &Data) -> Result<()> {
    let cols = x.cols();
    let (y, gate) = (y.as_f32()?, gate.as_f32()?);
    if cols == 0 {
        return Ok(());
    }
    for ((xr, yr), &g) in x
        .as_f32_mut()?
        .chunks_exact_mut(cols)
        .zip(y.chunks_exact(cols))
        .zip(gate)
    {
        let w = 1.0 / (1.0 + simd::exp(-g));
        for (a, b) in xr.iter_mut().zip(yr) {
            *a += w * b;
        }
    }
    Ok(())
}

/// `dst[rows[r], :] = src[r, :]` (see [`flm_core::Op::ScatterRows`]), rounded to f16 for an
/// f16 `dst`.
pub(crate) fn scatter_rows(src: &Data, rows: &[u32], dst: &mut Data) -> Result<()> {
    let cols = src.cols();
    for (row, &r) in src.as_f32()?.chunks_exact(cols).zip(rows) {
        dst.write_f32(r as usize * cols, row)?;
    }
    Ok(())
}

/// `dst[dst_row + r, :] = src[src_row + r, :]` for `r < n_rows`: one `memcpy`, or one
/// conversion into an f16 `dst` ([`Data::write_f32`]).
pub(crate) fn copy_rows(
    (src, src_row): (&Data, usize),
    (dst, dst_row): (&mut Data, usize),
    n_rows: usize,
) -> Result<()> {
    let cols = src.cols();
    let src = &src.as_f32()?[src_row * cols..(src_row + n_rows) * cols];
    dst.write_f32(dst_row * cols, src)
}

/// `output[i] = argmax(input[i, :])` as [`flm_core::argmax`]: the first index of the
/// largest value, NaN never chosen, 0 when no value exceeds −∞.
pub(crate) fn argmax_rows(isa: Isa, input: &Data, output: &mut [u32]) -> Result<()> {
    let cols = input.cols();
    for (o, row) in output.iter_mut().zip(input.as_f32()?.chunks_exact(cols)) {
        *o = simd::run(isa, Argmax(row));
    }
    Ok(())
}

/// Two passes over the row: the maximum (NaN ignored), then the first lane equal to it.
struct Argmax<'a>(&'a [f32]);

impl Kernel for Argmax<'_> {
    type Output = u32;

    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> u32 {
        let (row, l) = (self.0, S::LANES);
        let full = row.len() / l * l;
        // `max(v, acc)` keeps `acc` where `v` is NaN.
        let mut acc = s.splat(f32::NEG_INFINITY);
        let mut c = 0;
        while c < full {
            acc = s.max(s.load(&row[c..]), acc);
            c += l;
        }
        let mut best = s.max_lane(acc);
        for &v in &row[full..] {
            if v > best {
                best = v;
            }
        }
        if best == f32::NEG_INFINITY {
            return 0;
        }
        let mut c = 0;
        while c < full {
            if let Some(i) = s.first_eq(s.load(&row[c..]), best) {
                return (c + i) as u32;
            }
            c += l;
        }
        row[full..]
            .iter()
            .position(|&v| v == best)
            .map_or(0, |i| (full + i) as u32)
    }
}

/// `x *= alpha` element-wise, over an f32 tensor. Portable code only: one pass over a
/// residual row (ChatGLM-6B's scaled residual), beside the projections.
pub(crate) fn scale(x: &mut Data, alpha: f32) -> Result<()> {
    for v in x.as_f32_mut()? {
        *v *= alpha;
    }
    Ok(())
}
