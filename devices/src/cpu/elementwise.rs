//! Element-wise and copy ops: residual add, row copies, argmax.

use flm_core::{argmax, Data, Error, Result};

use super::shape_err;

/// `x += y` element-wise.
pub(crate) fn add(x: &mut Data, y: &Data) -> Result<()> {
    if x.shape() != y.shape() {
        return Err(shape_err(
            "Add",
            format!("x {:?}, y {:?}", x.shape(), y.shape()),
        ));
    }
    let y = y.as_f32()?;
    for (a, b) in x.as_f32_mut()?.iter_mut().zip(y) {
        *a += b;
    }
    Ok(())
}

/// `dst[dst_row + r, :] = src[src_row + r, :]` for `r < n_rows`.
pub(crate) fn copy_rows(
    src: &Data,
    src_row: usize,
    n_rows: usize,
    dst: &mut Data,
    dst_row: usize,
) -> Result<()> {
    let cols = src.cols();
    if dst.cols() != cols {
        return Err(shape_err(
            "CopyRows",
            format!("src {:?}, dst {:?}", src.shape(), dst.shape()),
        ));
    }
    // Saturating: absurd row indices are out of bounds, not an arithmetic panic.
    let (src_end, dst_end) = (
        src_row.saturating_add(n_rows),
        dst_row.saturating_add(n_rows),
    );
    if src_end > src.rows() || dst_end > dst.rows() {
        return Err(Error::OutOfBounds(format!(
            "copying rows {src_row}..{src_end} of {:?} to rows {dst_row}..{dst_end} of {:?}",
            src.shape(),
            dst.shape()
        )));
    }
    let src = &src.as_f32()?[src_row * cols..(src_row + n_rows) * cols];
    dst.as_f32_mut()?[dst_row * cols..(dst_row + n_rows) * cols].copy_from_slice(src);
    Ok(())
}

/// `output[i] = argmax(input[i, :])`.
pub(crate) fn argmax_rows(input: &Data, output: &mut [u32]) -> Result<()> {
    if output.len() != input.rows() || input.cols() == 0 {
        return Err(shape_err(
            "Argmax",
            format!("input {:?}, {} outputs", input.shape(), output.len()),
        ));
    }
    let cols = input.cols();
    for (o, row) in output.iter_mut().zip(input.as_f32()?.chunks_exact(cols)) {
        *o = argmax(row);
    }
    Ok(())
}
