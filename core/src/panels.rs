//! The panel layout of quantised Linear weights on the CPU: 16 output rows interleaved 4
//! codes at a time, so that one vector of the CPU kernels holds the same 4 input columns of
//! 16 rows, and an integer dot-product instruction (`vpdpbusd`, `sdot`) leaves in each lane
//! one row's exact sum of a block, with no horizontal reduction. This is the B-operand
//! layout of Intel AMX (`tdpbusd`: `B[k/4][4j + k%4]`) and of oneDNN's VNNI-blocked weights.
//!
//! It lets every instruction-set level sum each output in one order, block by block
//! ([`crate::quant`]'s formula with `acc = fma(C_b, a_b, acc)`), at the speed of the
//! row-major kernels or better: with rows in the lanes, the block sums need no shuffles.
//!
//! **int8** ([`DataType::I8`]), a matrix `[m, k]` with `kp` padded columns and
//! `row_bytes = 4 + kp` ([`quant::row_bytes`]): panels of [`PANEL_ROWS`] rows (the last
//! has `r = m mod 16` rows if that is not 0). Panel `p` holds rows `16p..16p + r` and starts
//! where row `16p` starts in the row-major layout, at byte `16p · row_bytes`: first the `r`
//! f32 scales, then for each step `s < kp / 4` the `r × 4` codes `q[16p + i][4s..4s + 4]`,
//! row after row.
//!
//! **int4** (every form and group size `G`; [`quant::Int4Row`]): panel `p` (same rows and
//! start) holds its `kp / G` groups one after the other ([`Int4Panel`]), so that a kernel
//! reads one stream. A group holds its codes, for each of its `G / 8` steps the `r × 4`
//! bytes of 8 codes per row, byte `q` holding code `8s + q` (of the row) in its low nibble
//! and code `8s + 4 + q` in its high one; then the `r` f16 scales; then, except for the
//! symmetric form (whose minimums are its scales), the `r` f16 minimums or zero points.
//!
//! **ggml's blocks of runs** ([`RunPanel`]: Q8_0, IQ4_NL, IQ4_XS and MXFP4, whose blocks
//! are a header of scales and then codes of one byte or one nibble per value): panel `p`
//! (same rows and start) holds its `kp / V` blocks of `V` values one after the other, each
//! as the `r` rows' headers, field by field (each field of the `r` rows, row after row:
//! IQ4_XS's `d`, then its `scales_h`, then its `scales_l`), and then, for each 4 bytes of
//! the blocks' codes (a step), the `r × 4` bytes of that step of every row. A step of Q8_0
//! is 4 codes of a row; a step of the 4-bit types is 8 (its low nibbles are 4 values, its
//! high nibbles the 4 values 16 further on, as the blocks store them).
//!
//! A panel has the bytes of its rows, so a tensor keeps its size ([`DataType::byte_len`]).
//! A tensor of more dimensions (`[experts, m, k]`) is a sequence of such matrices.

use crate::{quant, DataType, Error, Result};

/// How the rows of a [`crate::Data`] lie in its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// Row after row, as [`crate::quant`] describes them and files store them.
    #[default]
    Rows,
    /// In panels of [`PANEL_ROWS`] rows (see the module docs): CPU-only, made from rows by
    /// [`crate::Data::to_panels`].
    Panels,
}

/// Where the parts of an int4 panel of `r` rows lie (see the module docs), in bytes from
/// the panel's start.
#[derive(Debug, Clone, Copy)]
pub struct Int4Panel {
    /// Rows of the panel.
    pub r: usize,
    /// Values per group `G`.
    pub group: usize,
    /// Bytes of one group of the `r` rows.
    pub group_bytes: usize,
    /// Whether the minimums are the scales (the symmetric form).
    pub symmetric: bool,
}

impl Int4Panel {
    /// The layout of a panel of `r` rows of the int4 `dtype`; `None` for other dtypes.
    pub fn new(dtype: DataType, r: usize) -> Option<Int4Panel> {
        dtype.int4_form()?;
        let group = dtype.group_size()?;
        let symmetric = dtype.is_int4_symmetric();
        let params = if symmetric { 2 } else { 4 };
        Some(Int4Panel {
            r,
            group,
            group_bytes: r * (group / 2 + params),
            symmetric,
        })
    }

    /// Step `s` (codes `8s..8s + 8` of each row).
    pub fn step(&self, s: usize) -> usize {
        let per_group = self.group / 8;
        s / per_group * self.group_bytes + s % per_group * STEP * self.r
    }

    /// The `r` f16 scales of group `g`.
    pub fn scales(&self, g: usize) -> usize {
        g * self.group_bytes + self.r * self.group / 2
    }

    /// The `r` f16 stored minimums (or zero points) of group `g`: the scales where
    /// [`Int4Panel::symmetric`].
    pub fn mins(&self, g: usize) -> usize {
        self.scales(g) + if self.symmetric { 0 } else { 2 * self.r }
    }
}

/// Output rows per panel: the f32 lanes of an AVX-512 vector.
pub const PANEL_ROWS: usize = 16;

/// Codes per row and step of a panel: the bytes one lane of `vpdpbusd` or `sdot` sums.
pub const STEP: usize = 4;

/// Where the parts of ggml's block of runs lie in a row (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunPanel {
    /// The fields of a block's header (its scales, at the block's start), in bytes, in
    /// their order.
    pub fields: &'static [usize],
    /// Bytes of a block.
    pub block: usize,
    /// Values of a block.
    pub values: usize,
}

impl RunPanel {
    /// The layout of `dtype`'s blocks, for the ggml types of runs of 32 that the x86 kernels
    /// read in panels; `None` for other dtypes.
    pub fn new(dtype: DataType) -> Option<RunPanel> {
        let ty = dtype.ggml_type()?;
        let fields: &[usize] = match dtype {
            DataType::Q8_0 | DataType::IQ4NL => &[2],
            DataType::MXFP4 => &[1],
            DataType::IQ4XS => &[2, 2, 4],
            _ => return None,
        };
        Some(RunPanel {
            fields,
            block: ty.block_bytes(),
            values: ty.block_len(),
        })
    }

    /// Bytes of a row's header in a block, before field `f` (`f = fields.len()`: the whole
    /// header).
    pub fn field_start(&self, f: usize) -> usize {
        self.fields[..f].iter().sum()
    }

    /// Bytes of a block's header.
    pub fn header(&self) -> usize {
        self.field_start(self.fields.len())
    }

    /// Steps of a block's codes.
    pub fn steps(&self) -> usize {
        (self.block - self.header()) / STEP
    }
}

/// Whether `dtype` has a panel layout ([`pack`] and [`row`] take it): int8, int4 and the
/// types of [`RunPanel`].
fn packable(dtype: DataType) -> bool {
    dtype == DataType::I8 || dtype.int4_form().is_some() || RunPanel::new(dtype).is_some()
}

/// Whether the CPU kernels of this build read `dtype` in panels, so that the loaders pack
/// it: int8 and int4; on x86-64 also the ggml types of [`RunPanel`], whose kernels take the
/// 16 rows of a panel in the lanes of a vector (aarch64's NEON kernels read those in rows).
pub fn has_panels(dtype: DataType) -> bool {
    dtype == DataType::I8
        || dtype.int4_form().is_some()
        || (cfg!(target_arch = "x86_64") && RunPanel::new(dtype).is_some())
}

/// The byte range of one matrix's panel `p` and its row count, for `m` rows of
/// `row_bytes`.
fn panel_span(m: usize, row_bytes: usize, p: usize) -> (usize, usize) {
    let r = (m - p * PANEL_ROWS).min(PANEL_ROWS);
    (p * PANEL_ROWS * row_bytes, r)
}

fn unsupported(dtype: DataType) -> Error {
    Error::DType {
        op: "panels",
        msg: format!("{dtype} has no panel layout"),
    }
}

/// Checks that `len` bytes hold whole matrices of `m` rows of `row_bytes`, and returns
/// `row_bytes`.
fn matrix_bytes(dtype: DataType, len: usize, m: usize, cols: usize) -> Result<usize> {
    if !packable(dtype) {
        return Err(unsupported(dtype));
    }
    let row_bytes = quant::row_bytes(dtype, cols).unwrap_or(0);
    let matrix = m * row_bytes;
    if matrix == 0 || !len.is_multiple_of(matrix) {
        return Err(Error::Shape {
            op: "panels",
            msg: format!("{len} bytes are no whole {dtype} matrices of [{m}, {cols}]"),
        });
    }
    Ok(row_bytes)
}

/// Repacks `rows` (row-major matrices of `m` rows of `cols` values of `dtype`, one after
/// the other) into `out` in the panel layout.
///
/// Errors: [`Error::DType`] for a dtype without panels; [`Error::Shape`] if the lengths are
/// not whole matrices or differ.
pub fn pack(dtype: DataType, rows: &[u8], m: usize, cols: usize, out: &mut [u8]) -> Result<()> {
    let row_bytes = matrix_bytes(dtype, rows.len(), m, cols)?;
    if out.len() != rows.len() {
        return Err(Error::Shape {
            op: "panels::pack",
            msg: format!("{} bytes into {}", rows.len(), out.len()),
        });
    }
    for (src, dst) in rows
        .chunks_exact(m * row_bytes)
        .zip(out.chunks_exact_mut(m * row_bytes))
    {
        for p in 0..m.div_ceil(PANEL_ROWS) {
            let (at, r) = panel_span(m, row_bytes, p);
            let (src, dst) = (
                &src[at..at + r * row_bytes],
                &mut dst[at..at + r * row_bytes],
            );
            for (i, row) in src.chunks_exact(row_bytes).enumerate() {
                for_each_move(dtype, cols, r, i, |from, to, len| {
                    copy(&mut dst[to..to + len], &row[from..from + len])
                });
                if let Some(layout) = Int4Panel::new(dtype, r) {
                    for s in 0..quant::padded_cols(dtype, cols) / 8 {
                        let codes: [u8; 8] = std::array::from_fn(|c| int4_code(row, 8 * s + c));
                        for q in 0..STEP {
                            dst[layout.step(s) + STEP * i + q] = codes[q] | codes[q + STEP] << 4;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// `dst.copy_from_slice(src)`, with a step's 4 bytes as one move: most moves are steps, and
/// a copy of a length known only at run time is a call (it made packing gpt-oss-20b's
/// experts take 14 s).
#[inline(always)]
fn copy(dst: &mut [u8], src: &[u8]) {
    match (
        <&mut [u8; STEP]>::try_from(&mut *dst),
        <&[u8; STEP]>::try_from(src),
    ) {
        (Ok(d), Ok(s)) => *d = *s,
        _ => dst.copy_from_slice(src),
    }
}

/// Code `c` (`0..15`) of the row-major int4 row `row`.
fn int4_code(row: &[u8], c: usize) -> u8 {
    let (byte, shift) = quant::nibble(c);
    row[byte] >> shift & 0x0f
}

/// Calls `f(offset in the row, offset in the panel, length)` for each byte run that row `i`
/// of a panel of `r` rows keeps as it is between its row-major bytes and the panel: int8's
/// scale and codes, int4's scales and minimums (int4 codes are reordered apart), the
/// headers and steps of ggml's blocks of runs.
fn for_each_move(
    dtype: DataType,
    cols: usize,
    r: usize,
    i: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    let kp = quant::padded_cols(dtype, cols);
    if let Some(l) = RunPanel::new(dtype) {
        // Once per call: each is a sum over the header's fields.
        let (header, steps) = (l.header(), l.steps());
        for b in 0..kp / l.values {
            let (row, panel) = (b * l.block, b * r * l.block);
            for (k, &len) in l.fields.iter().enumerate() {
                let at = l.field_start(k);
                f(row + at, panel + r * at + i * len, len);
            }
            for s in 0..steps {
                f(
                    row + header + STEP * s,
                    panel + r * header + s * STEP * r + STEP * i,
                    STEP,
                );
            }
        }
        return;
    }
    let int4 = Int4Panel::new(dtype, r);
    let groups = int4.map_or(0, |l| kp / l.group);
    let runs = match int4 {
        // The scale, then each step's codes.
        None => 1 + kp / STEP,
        Some(l) => groups * if l.symmetric { 1 } else { 2 },
    };
    for v in 0..runs {
        match (int4, v) {
            (None, 0) => f(0, 4 * i, 4),
            (None, v) => {
                let s = v - 1;
                f(4 + STEP * s, 4 * r + s * STEP * r + STEP * i, STEP)
            }
            (Some(l), v) => {
                let g = v % groups;
                let at = if v < groups { l.scales(g) } else { l.mins(g) };
                f(kp / 2 + 2 * v, at + 2 * i, 2)
            }
        }
    }
}

/// Dequantises row `j` of the panel-laid matrices `panels` (see [`row`]) into `out`
/// (`cols` values), through a copy of its row-major bytes.
///
/// Errors: those of [`row`].
pub fn dequantize_row(
    dtype: DataType,
    panels: &[u8],
    m: usize,
    cols: usize,
    j: usize,
    out: &mut [f32],
) -> Result<()> {
    let mut bytes = vec![0u8; quant::row_bytes(dtype, cols).unwrap_or(0)];
    row(dtype, panels, m, cols, j, &mut bytes)?;
    quant::dequantize_row(dtype, &bytes, out);
    Ok(())
}

/// Copies row `j` of the panel-laid matrices `panels` (as [`pack`] wrote them; `j` counts
/// rows across the matrices) into `out` as its row-major bytes.
///
/// Errors: those of [`pack`]; [`Error::OutOfBounds`] if `j` is past the last row or `out`
/// is not one row long.
pub fn row(
    dtype: DataType,
    panels: &[u8],
    m: usize,
    cols: usize,
    j: usize,
    out: &mut [u8],
) -> Result<()> {
    let row_bytes = matrix_bytes(dtype, panels.len(), m, cols)?;
    if j >= panels.len() / row_bytes || out.len() != row_bytes {
        return Err(Error::OutOfBounds(format!(
            "row {j} of {} bytes from {} {dtype} rows",
            out.len(),
            panels.len() / row_bytes
        )));
    }
    let matrix = &panels[j / m * m * row_bytes..][..m * row_bytes];
    let j = j % m;
    let (at, r) = panel_span(m, row_bytes, j / PANEL_ROWS);
    let (panel, i) = (&matrix[at..at + r * row_bytes], j % PANEL_ROWS);
    for_each_move(dtype, cols, r, i, |from, to, len| {
        copy(&mut out[from..from + len], &panel[to..to + len])
    });
    if let Some(layout) = Int4Panel::new(dtype, r) {
        let kp = quant::padded_cols(dtype, cols);
        out[..kp / 2].fill(0);
        for c in 0..kp {
            let byte = panel[layout.step(c / 8) + STEP * i + c % STEP];
            let code = if c % 8 < STEP { byte & 0x0f } else { byte >> 4 };
            let (at, shift) = quant::nibble(c);
            out[at] |= code << shift;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_come_back_from_panels_of_every_size() {
        use DataType::*;
        let dtypes = [
            I8, I4G32, I4G64, I4G128, I4SymG32, I4SymG128, I4ZpG32, I4ZpG64, Q8_0, IQ4NL, IQ4XS,
            MXFP4,
        ];
        for dtype in dtypes {
            let unit = RunPanel::new(dtype).map_or(1, |l| l.values);
            for (m, cols) in [(1, 5usize), (16, 32), (17, 40), (35, 64), (48, 300)] {
                let cols = cols.next_multiple_of(unit);
                let values: Vec<f32> = (0..2 * m * cols)
                    .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
                    .collect();
                let mut rows = vec![0u8; dtype.byte_len(&[2, m, cols]).unwrap()];
                let row_bytes = quant::row_bytes(dtype, cols).unwrap();
                for (v, dst) in values
                    .chunks_exact(cols)
                    .zip(rows.chunks_exact_mut(row_bytes))
                {
                    quant::quantize_row(dtype, v, dst);
                }
                let mut panels = vec![0u8; rows.len()];
                pack(dtype, &rows, m, cols, &mut panels).unwrap();
                if dtype == I8 {
                    // An int8 panel of one row is that row.
                    assert_eq!(panels == rows, m == 1, "[{m}, {cols}]");
                }
                let mut out = vec![0u8; row_bytes];
                for (j, want) in rows.chunks_exact(row_bytes).enumerate() {
                    row(dtype, &panels, m, cols, j, &mut out).unwrap();
                    assert_eq!(out, want, "{dtype} row {j} of [2, {m}, {cols}]");
                }
                assert!(row(dtype, &panels, m, cols, 2 * m, &mut out).is_err());
            }
        }
    }

    #[test]
    fn an_int4_panel_puts_8_codes_of_a_row_in_4_bytes() {
        // One row of 32 codes c % 16.
        let mut bytes = vec![0u8; quant::row_bytes(DataType::I4G32, 32).unwrap()];
        for c in 0..32 {
            let (at, shift) = quant::nibble(c);
            bytes[at] |= ((c % 16) as u8) << shift;
        }
        let mut panel = vec![0u8; bytes.len()];
        pack(DataType::I4G32, &bytes, 1, 32, &mut panel).unwrap();
        // Step 1: codes 8..12 in the low nibbles, 12..16 in the high ones.
        assert_eq!(
            &panel[4..8],
            &[8 | 12 << 4, 9 | 13 << 4, 10 | 14 << 4, 11 | 15 << 4]
        );
    }

    #[test]
    fn a_panel_interleaves_four_codes_of_its_rows() {
        // Rows 0..16 of 32 codes (36 bytes each), code c of row i = i + c.
        let mut rows = vec![0u8; 16 * 36];
        for (i, row) in rows.chunks_exact_mut(36).enumerate() {
            row[..4].copy_from_slice(&(i as f32).to_le_bytes());
            for (c, q) in row[4..].iter_mut().enumerate() {
                *q = (i + c) as u8;
            }
        }
        let mut panels = vec![0u8; rows.len()];
        pack(DataType::I8, &rows, 16, 32, &mut panels).unwrap();
        assert_eq!(&panels[4 * 5..4 * 6], &5.0f32.to_le_bytes());
        // Step 1, row 2: codes 4..8 of row 2.
        assert_eq!(&panels[64 + 64 + 8..64 + 64 + 12], &[6, 7, 8, 9]);
        assert!(pack(DataType::Q5_0, &rows, 16, 32, &mut panels).is_err());
    }

    #[test]
    fn a_run_panel_keeps_headers_then_interleaves_steps() {
        // 2 rows of 2 MXFP4 blocks (17 bytes: an exponent, 16 bytes of nibbles), byte t of
        // block b of row i = 100·i + 20·b + t.
        let mut rows = vec![0u8; 2 * 34];
        for (i, row) in rows.chunks_exact_mut(34).enumerate() {
            for (at, q) in row.iter_mut().enumerate() {
                *q = (100 * i + 20 * (at / 17) + at % 17) as u8;
            }
        }
        let mut panels = vec![0u8; rows.len()];
        pack(DataType::MXFP4, &rows, 2, 64, &mut panels).unwrap();
        // Block 0: the two exponents, then step 0 of rows 0 and 1, step 1...
        assert_eq!(&panels[..2], &[0, 100]);
        assert_eq!(&panels[2..10], &[1, 2, 3, 4, 101, 102, 103, 104]);
        assert_eq!(&panels[10..14], &[5, 6, 7, 8]);
        // Block 1 starts after the 2 × 17 bytes of block 0.
        assert_eq!(&panels[34..36], &[20, 120]);
        let xs = RunPanel::new(DataType::IQ4XS).unwrap();
        assert_eq!(xs.header(), 8);
        assert_eq!(RunPanel::new(DataType::Q8_0).unwrap().steps(), 8);
    }
}
