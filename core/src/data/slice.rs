//! Ranges of rows and of columns of a matrix: the shards of a tensor-parallel rank
//! (Megatron-LM's column-parallel and row-parallel Linears).

use std::sync::Arc;

use super::{next_id, row_major_strides, Data, Storage};
use crate::panels::Layout;
use crate::{quant, DataType, Error, Format, Result};

/// The error of a slice that the tensor cannot give.
fn slice_error(msg: String) -> Error {
    Error::Shape {
        op: "Data slice",
        msg,
    }
}

impl Data {
    /// Rows `r0..r1` of the tensor seen as `[rows, cols]` (a vector `[n]` as `n` rows of
    /// one element), shape `[r1 − r0, cols]` (or `[r1 − r0]`): a view of the same mapped
    /// file for a mapped tensor, so that a rank reads only its own rows, else a copy.
    ///
    /// Errors: [`Error::Shape`] for a range outside the rows or a tensor in panels;
    /// [`Error::Placement`] for one in device memory.
    pub fn row_range(&self, r0: usize, r1: usize) -> Result<Data> {
        let (rows, cols) = match self.shape.as_slice() {
            [n] => (*n, 1),
            _ => (self.rows(), self.cols()),
        };
        if r0 > r1 || r1 > rows || self.layout != Layout::Rows || self.input_perm.is_some() {
            return Err(slice_error(format!(
                "rows {r0}..{r1} of {:?} ({:?} layout{})",
                self.shape,
                self.layout,
                if self.input_perm.is_some() {
                    ", permuted inputs"
                } else {
                    ""
                }
            )));
        }
        let shape: Vec<usize> = match self.shape.len() {
            1 => vec![r1 - r0],
            _ => vec![r1 - r0, cols],
        };
        let row_bytes = self.dtype.byte_len(&[1, cols]).unwrap_or(0);
        if let Storage::Mapped { map, offset, .. } = &self.storage {
            return Ok(Data {
                dtype: self.dtype,
                strides: row_major_strides(&shape),
                storage: Storage::Mapped {
                    map: Arc::clone(map),
                    offset: offset + r0 * row_bytes,
                    len: (r1 - r0) * row_bytes,
                },
                shape,
                id: next_id(),
                input_perm: None,
                layout: Layout::Rows,
            });
        }
        let bytes = &self.bytes()?[r0 * row_bytes..r1 * row_bytes];
        Data::from_bytes(self.dtype, &shape, bytes)
    }

    /// Columns `c0..c1` of every row of the matrix `[rows, cols]`, shape `[rows, c1 − c0]`,
    /// a copy (the pages of a mapped tensor are released after it,
    /// `Data::release_mapped_pages`). A quantised row is cut between its blocks (int4 groups, ggml blocks, int8's
    /// runs of [`quant::BLOCK`]) and keeps their bytes, so the values are unchanged; an int8
    /// row keeps its scale.
    ///
    /// Errors: [`Error::Shape`] for a range outside the columns, a bound inside a block
    /// (`c0` and `c1` must be multiples of the block, or `c1` the last column), a tensor of
    /// other than two dimensions, in panels or with permuted inputs (act-order GPTQ);
    /// [`Error::Placement`] for one in device memory.
    pub fn col_range(&self, c0: usize, c1: usize) -> Result<Data> {
        let &[rows, cols] = self.shape.as_slice() else {
            return Err(slice_error(format!(
                "columns of {:?}, which is not a matrix",
                self.shape
            )));
        };
        let unit = match self.dtype.is_quantized() {
            true => quant::padded_cols(self.dtype, 1),
            false => 1,
        };
        if c0 > c1
            || c1 > cols
            || !c0.is_multiple_of(unit)
            || !(c1.is_multiple_of(unit) || c1 == cols)
            || self.layout != Layout::Rows
            || self.input_perm.is_some()
        {
            return Err(slice_error(format!(
                "columns {c0}..{c1} of the {} matrix {:?}: the bounds must be multiples of its \
                 blocks of {unit} (or the last column){}",
                self.dtype,
                self.shape,
                if self.input_perm.is_some() {
                    ", and its inputs not permuted"
                } else {
                    ""
                }
            )));
        }
        let (width, src) = (c1 - c0, self.bytes()?);
        let src_row = self.dtype.byte_len(&[1, cols]).unwrap_or(0);
        let dst_row = self.dtype.byte_len(&[1, width]).unwrap_or(0);
        let mut out = Data::zeros(self.dtype, &[rows, width])?;
        let dst = out.bytes_mut()?;
        for (s, d) in src.chunks_exact(src_row).zip(dst.chunks_exact_mut(dst_row)) {
            cut_row(self.dtype, s, cols, (c0, c1), d);
        }
        // Reading every row's range touched the whole matrix's pages; the copy is kept.
        self.release_mapped_pages();
        Ok(out)
    }
}

/// Writes columns `c0..c1` of the row `src` (of `cols` values of `dtype`) to `dst`, a row
/// of `c1 − c0` values; `c0` is a multiple of the dtype's block.
fn cut_row(dtype: DataType, src: &[u8], cols: usize, (c0, c1): (usize, usize), dst: &mut [u8]) {
    let Some(format) = dtype.format() else {
        let size = dtype.size_of();
        dst.copy_from_slice(&src[c0 * size..c1 * size]);
        return;
    };
    let (p0, p1) = (c0, c0 + quant::padded_cols(dtype, c1 - c0));
    match format {
        Format::Int8 => {
            dst[..4].copy_from_slice(&src[..4]);
            dst[4..].copy_from_slice(&src[4 + p0..4 + p1]);
        }
        Format::Ggml(ty) => {
            let (unit, bytes) = (ty.block_len(), ty.block_bytes());
            dst.copy_from_slice(&src[p0 / unit * bytes..p1 / unit * bytes]);
        }
        Format::Int4 { group, .. } => {
            let kp = quant::padded_cols(dtype, cols);
            let (g0, g1) = (p0 / group, p1 / group);
            let (codes, scales) = (p0 / 2..p1 / 2, kp / 2 + 2 * g0..kp / 2 + 2 * g1);
            let mut at = 0;
            let mut put = |range: std::ops::Range<usize>| {
                dst[at..at + range.len()].copy_from_slice(&src[range.clone()]);
                at += range.len();
            };
            put(codes);
            put(scales);
            if !dtype.is_int4_symmetric() {
                let mins = quant::int4_mins(dtype, kp).offset;
                put(mins + 2 * g0..mins + 2 * g1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `[rows, cols]` matrix of distinct values.
    fn matrix(rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0)
            .collect()
    }

    #[test]
    fn column_ranges_keep_every_value_of_every_dtype() {
        let (rows, cols) = (3, 512);
        let values = matrix(rows, cols);
        let f32s = Data::from_f32(&[rows, cols], &values).unwrap();
        for dtype in DataType::VALUES {
            let Ok(whole) = f32s.to_dtype(dtype) else {
                continue;
            };
            let unit = quant::padded_cols(dtype, 1);
            let all = whole.to_f32_vec().unwrap();
            for (c0, c1) in [(0, cols / 2), (cols / 2, cols), (0, cols), (unit, 2 * unit)] {
                let part = whole.col_range(c0, c1).unwrap();
                assert_eq!(part.shape(), [rows, c1 - c0]);
                let got = part.to_f32_vec().unwrap();
                for r in 0..rows {
                    let want = &all[r * cols + c0..r * cols + c1];
                    assert_eq!(&got[r * (c1 - c0)..(r + 1) * (c1 - c0)], want, "{dtype}");
                }
            }
        }
    }

    #[test]
    fn a_bound_inside_a_block_is_an_error() {
        let d = Data::from_f32(&[2, 64], &matrix(2, 64)).unwrap();
        let q = d.to_dtype(DataType::I4SymG32).unwrap();
        let e = q.col_range(16, 64).unwrap_err().to_string();
        assert!(e.contains("multiples of its blocks of 32"), "{e}");
        assert!(d.col_range(16, 64).is_ok());
        assert!(d.col_range(0, 65).is_err());
    }

    #[test]
    fn row_ranges_are_the_rows() {
        let values = matrix(6, 64);
        let d = Data::from_f32(&[6, 64], &values).unwrap();
        for dtype in [DataType::F32, DataType::I8, DataType::I4G32, DataType::Q8_0] {
            let q = d.to_dtype(dtype).unwrap();
            let all = q.to_f32_vec().unwrap();
            let part = q.row_range(2, 5).unwrap();
            assert_eq!(part.to_f32_vec().unwrap(), &all[2 * 64..5 * 64], "{dtype}");
        }
        let v = Data::from_f32(&[6], &values[..6]).unwrap();
        assert_eq!(v.row_range(1, 3).unwrap().as_f32().unwrap(), &values[1..3]);
        assert!(d.row_range(4, 7).is_err());
    }
}
