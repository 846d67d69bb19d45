//! Portable int4 kernels: plain integer loops over [`Acts`] in natural order, the twins the
//! SIMD kernels are tested against (int8's is in `panels`).

use flm_core::quant::{Int4Row, BLOCK};
use flm_core::DataType;

use super::{Acts, QuantWeight};

/// `Σ_b d_g a_b Σ q_w q_x + Σ_g m_g gsum_g` for a row of the int4 `dtype`.
fn dot_i4(dtype: DataType, row: &[u8], qs: &[i8], d: &[f32], gsum: &[f32]) -> f32 {
    let g = dtype.group_size().unwrap_or(BLOCK);
    let row = Int4Row::split(dtype, row);
    let mut acc = 0.0f32;
    for (b, (c, x)) in row
        .codes
        .chunks_exact(BLOCK / 2)
        .zip(qs.chunks_exact(BLOCK))
        .enumerate()
    {
        let mut s = 0i32;
        for (i, &byte) in c.iter().enumerate() {
            s += i32::from(byte & 0x0f) * i32::from(x[i])
                + i32::from(byte >> 4) * i32::from(x[i + BLOCK / 2]);
        }
        acc += row.scale(b * BLOCK / g) * d[b] * s as f32;
    }
    for (gi, &gs) in gsum.iter().enumerate() {
        acc += row.min(gi) * gs;
    }
    acc
}

/// See [`super::rows`]; `acts` must be in natural order.
pub(super) fn rows(w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
    let n = acts.n;
    for (dj, ys) in yt.chunks_exact_mut(n).enumerate() {
        let row = w.row(j0 + dj);
        for (i, y) in ys.iter_mut().enumerate() {
            let (qs, d) = (acts.row_qs(i), acts.row_d(i));
            *y = dot_i4(w.dtype, row, qs, d, acts.row_gsum(i));
        }
    }
}
