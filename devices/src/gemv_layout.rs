//! The GPU layout of a Linear weight for the decode GEMV kernels (`kernels/gemv.cu` of the
//! CUDA device): the weight's .flm bytes ([`flm_core::quant`]) repacked once, on the host,
//! when the weight is first uploaded, so that every lane of a warp reads its weights with
//! 16-byte loads and a warp reads 512 contiguous bytes at a time (the coalesced 128-bit
//! loads of the weight-only GEMV kernels of FasterTransformer/TensorRT-LLM and llama.cpp's
//! `mul_mat_vec_q`). Plain Rust, so it is tested on any machine against
//! [`flm_core::Data::to_f32_vec`]'s dequantisation.
//!
//! An `m × k` weight of each dtype becomes:
//!
//! - **f16, bf16**: `m` rows of `ld = k` rounded up to a multiple of 8 values, zero-padded
//!   (a row then starts 16-byte aligned); the .flm bytes themselves when `k % 8 == 0`.
//! - **int8** ([`DataType::I8`]): the codes `[m, kp]` (`kp` = `k` padded to 32, so each
//!   row is 16-byte aligned), then the `m` f32 scales.
//! - **int4** (every group size and form): the codes `[m, kp / 2]` in the .flm nibble order
//!   (a run of 32 values in 16 bytes, value `i` in the low and `i + 16` in the high nibble of
//!   byte `i`), then per row its `kp / G` group parameters: the f16 scale `d` alone
//!   (`int4-sym`), or `d` then the stored f16 minimum (`int4`) or zero point (`int4-zp`) as
//!   one 4-byte pair, so a lane reads a run's codes and its group's parameters in one load
//!   each.
//!
//! Every layout has the size of the .flm bytes except f16/bf16 with `k % 8 != 0`.

use flm_core::{quant, DataType, Error, Int4Form, Result};
use half::{bf16, f16};

/// Where the parts of a packed `m × k` weight lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvLayout {
    /// The weight's dtype.
    pub dtype: DataType,
    /// Output features (rows).
    pub rows: usize,
    /// Input features (columns).
    pub cols: usize,
    /// Values per packed row: `cols` rounded up to 8 (f16/bf16), to 32 (int8) or to the
    /// group size (int4); the activations the kernels read are padded to it too.
    pub ld: usize,
    /// Byte offset of the scales (int8) or group parameters (int4), after the codes; the
    /// total size for f16/bf16.
    pub params_offset: usize,
    /// Total bytes.
    pub bytes: usize,
}

/// Whether the GEMV kernels have a packed layout for `dtype`: f16, bf16, int8 and int4 (not
/// f32, ggml's Q8_0 or the K-quants).
pub fn has_layout(dtype: DataType) -> bool {
    matches!(dtype, DataType::F16 | DataType::BF16 | DataType::I8) || dtype.group_size().is_some()
}

impl GemvLayout {
    /// The layout of an `rows × cols` weight of `dtype`.
    ///
    /// Errors: [`Error::DType`] for a dtype without one ([`has_layout`]), [`Error::Shape`]
    /// when the sizes overflow.
    pub fn new(dtype: DataType, rows: usize, cols: usize) -> Result<GemvLayout> {
        let overflow = || Error::Shape {
            op: "GEMV layout",
            msg: format!("{dtype} [{rows}, {cols}] overflows"),
        };
        if !has_layout(dtype) {
            return Err(Error::DType {
                op: "GEMV layout",
                msg: format!("no GPU GEMV layout for {dtype} weights"),
            });
        }
        let ld = match dtype {
            DataType::F16 | DataType::BF16 => cols.div_ceil(8).checked_mul(8),
            // Saturates at usize::MAX, which the products below then reject.
            _ => Some(quant::padded_cols(dtype, cols)),
        }
        .ok_or_else(overflow)?;
        let (code_bytes, param_bytes) = match dtype.group_size() {
            None if dtype == DataType::I8 => (rows.checked_mul(ld), rows.checked_mul(4)),
            None => (rows.checked_mul(ld).and_then(|v| v.checked_mul(2)), Some(0)),
            Some(g) => (
                rows.checked_mul(ld / 2),
                rows.checked_mul(ld / g * group_param_bytes(dtype)),
            ),
        };
        let (code_bytes, param_bytes) = (
            code_bytes.ok_or_else(overflow)?,
            param_bytes.ok_or_else(overflow)?,
        );
        Ok(GemvLayout {
            dtype,
            rows,
            cols,
            ld,
            params_offset: code_bytes,
            bytes: code_bytes.checked_add(param_bytes).ok_or_else(overflow)?,
        })
    }

    /// Whether the packed bytes are the .flm bytes unchanged (f16/bf16 with `cols % 8 ==
    /// 0`), so a weight already in GPU memory is read where it is.
    pub fn is_identity(&self) -> bool {
        matches!(self.dtype, DataType::F16 | DataType::BF16) && self.ld == self.cols
    }

    /// Repacks `src`, the weight's .flm bytes (`rows` rows of
    /// [`quant::row_bytes`] bytes, or `rows × cols` 16-bit values), into this layout.
    ///
    /// Errors: [`Error::Shape`] when `src` has not the weight's size.
    pub fn pack(&self, src: &[u8]) -> Result<Vec<u8>> {
        let row_bytes = self.flm_row_bytes();
        if Some(src.len()) != row_bytes.checked_mul(self.rows) {
            return Err(Error::Shape {
                op: "GEMV layout",
                msg: format!(
                    "{} bytes for a {} weight [{}, {}]",
                    src.len(),
                    self.dtype,
                    self.rows,
                    self.cols
                ),
            });
        }
        let mut out = vec![0u8; self.bytes];
        if row_bytes == 0 {
            return Ok(out);
        }
        let (codes, params) = out.split_at_mut(self.params_offset);
        match self.dtype.group_size() {
            None if self.dtype == DataType::I8 => {
                for ((row, c), p) in src
                    .chunks_exact(row_bytes)
                    .zip(codes.chunks_exact_mut(self.ld))
                    .zip(params.chunks_exact_mut(4))
                {
                    p.copy_from_slice(&row[..4]);
                    c.copy_from_slice(&row[4..]);
                }
            }
            None => {
                for (row, c) in src
                    .chunks_exact(row_bytes)
                    .zip(codes.chunks_exact_mut(2 * self.ld))
                {
                    c[..row.len()].copy_from_slice(row);
                }
            }
            Some(g) => {
                let per_row = self.ld / g * group_param_bytes(self.dtype);
                for ((row, c), p) in src
                    .chunks_exact(row_bytes)
                    .zip(codes.chunks_exact_mut(self.ld / 2))
                    .zip(params.chunks_exact_mut(per_row))
                {
                    let parts = quant::Int4Row::split(self.dtype, row);
                    c.copy_from_slice(parts.codes);
                    if self.dtype.int4_form() == Some(Int4Form::Symmetric) {
                        p.copy_from_slice(parts.scales);
                    } else {
                        for ((pair, d), m) in p
                            .chunks_exact_mut(4)
                            .zip(parts.scales.chunks_exact(2))
                            .zip(parts.mins.chunks_exact(2))
                        {
                            pair[..2].copy_from_slice(d);
                            pair[2..].copy_from_slice(m);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// The `rows × cols` weights of `packed` (bytes in this layout), walking the layout as
    /// the kernels do: `d · q + m` per int4 value with `m` formed from the group's pair as
    /// [`quant::Int4Row::min`] forms it, `s · q` per int8 value. The reference of the
    /// packing tests.
    ///
    /// Errors: [`Error::Shape`] when `packed` has not [`GemvLayout::bytes`] bytes.
    pub fn dequantize(&self, packed: &[u8]) -> Result<Vec<f32>> {
        if packed.len() != self.bytes {
            return Err(Error::Shape {
                op: "GEMV layout",
                msg: format!("{} packed bytes, expected {}", packed.len(), self.bytes),
            });
        }
        let (codes, params) = packed.split_at(self.params_offset);
        let half = |b: &[u8], i: usize| f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32();
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for r in 0..self.rows {
            for i in 0..self.cols {
                let v = match (self.dtype, self.dtype.group_size()) {
                    (DataType::F16, _) => half(codes, r * self.ld + i),
                    (DataType::BF16, _) => {
                        let at = 2 * (r * self.ld + i);
                        bf16::from_le_bytes([codes[at], codes[at + 1]]).to_f32()
                    }
                    (DataType::I8, _) => {
                        let s = &params[4 * r..4 * r + 4];
                        f32::from_le_bytes([s[0], s[1], s[2], s[3]])
                            * f32::from(codes[r * self.ld + i] as i8)
                    }
                    (_, Some(g)) => {
                        let (byte, shift) = quant::nibble(i);
                        let q = (codes[r * self.ld / 2 + byte] >> shift) & 0x0f;
                        let (d, m) = self.group_params(params, r, i / g);
                        d * f32::from(q) + m
                    }
                    _ => unreachable!("GemvLayout::new admits no other dtype"),
                };
                out.push(v);
            }
        }
        Ok(out)
    }

    /// `(d, m)` of group `gi` of row `r` of an int4 layout's parameters.
    fn group_params(&self, params: &[u8], r: usize, gi: usize) -> (f32, f32) {
        let g = self.dtype.group_size().unwrap_or(quant::BLOCK);
        let at = (r * (self.ld / g) + gi) * group_param_bytes(self.dtype);
        let half = |i: usize| f16::from_le_bytes([params[i], params[i + 1]]).to_f32();
        let d = half(at);
        let m = match self.dtype.int4_form() {
            Some(Int4Form::Symmetric) => -8.0 * d,
            Some(Int4Form::ZeroPoint) => -(half(at + 2) * d),
            _ => half(at + 2),
        };
        (d, m)
    }

    /// Bytes of one .flm row of the weight.
    fn flm_row_bytes(&self) -> usize {
        match self.dtype {
            DataType::F16 | DataType::BF16 => 2 * self.cols,
            // GemvLayout::new checked that the padded sizes do not overflow.
            dtype => quant::row_bytes(dtype, self.cols).unwrap_or(usize::MAX),
        }
    }
}

/// Bytes of one int4 group's parameters in the packed layout: the f16 scale, and the f16
/// minimum or zero point unless symmetric.
fn group_param_bytes(dtype: DataType) -> usize {
    if dtype.int4_form() == Some(Int4Form::Symmetric) {
        2
    } else {
        4
    }
}
