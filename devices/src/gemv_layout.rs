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
//! [`GemvLayout::unpack`] is the inverse of [`GemvLayout::pack`]: int8/int4 tensors live in
//! a CUDA device's memory in this layout ([`packed_in_gpu_memory`]) and are read back so.

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
/// f32 or ggml's blocks).
pub fn has_layout(dtype: DataType) -> bool {
    matches!(dtype, DataType::F16 | DataType::BF16 | DataType::I8) || dtype.group_size().is_some()
}

/// Whether a tensor of `dtype` in a CUDA device's memory is kept in its GPU GEMV layout
/// rather than its .flm bytes: int8 and int4, whose layouts have the .flm size (so a buffer
/// of [`DataType::byte_len`] bytes holds either). The device packs them on upload and unpacks
/// them on download ([`flm_core::BaseDevice::upload_tensor`]), and every kernel reads them
/// so; f16/bf16 tensors stay as they are (rows of `cols % 8 != 0` values would grow).
pub fn packed_in_gpu_memory(dtype: DataType) -> bool {
    has_layout(dtype) && !matches!(dtype, DataType::F16 | DataType::BF16)
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

    /// The layout of a tensor of `dtype` and `shape` seen as a matrix, its rows counted as
    /// [`DataType::byte_len`] counts them: `cols` the last dimension (1 for a scalar),
    /// `rows` the product of the others (0 when `cols` is 0).
    ///
    /// Errors: those of [`GemvLayout::new`].
    pub fn for_shape(dtype: DataType, shape: &[usize]) -> Result<GemvLayout> {
        let cols = shape.last().copied().unwrap_or(1);
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::Shape {
                op: "GEMV layout",
                msg: format!("{dtype} shape {shape:?} overflows"),
            })?;
        GemvLayout::new(dtype, numel.checked_div(cols).unwrap_or(0), cols)
    }

    /// The layout a tensor of `dtype` and `shape` has in a CUDA device's memory: its
    /// [`GemvLayout::for_shape`] for int8/int4 ([`packed_in_gpu_memory`]), `None` for a
    /// dtype kept as its .flm bytes.
    ///
    /// Errors: those of [`GemvLayout::new`].
    pub fn in_gpu_memory(dtype: DataType, shape: &[usize]) -> Result<Option<GemvLayout>> {
        packed_in_gpu_memory(dtype)
            .then(|| GemvLayout::for_shape(dtype, shape))
            .transpose()
    }

    /// Repacks `src`, the weight's .flm bytes (`rows` rows of
    /// [`quant::row_bytes`] bytes, or `rows × cols` 16-bit values), into this layout
    /// (padding zero).
    ///
    /// Errors: [`Error::Shape`] when `src` has not the weight's size.
    pub fn pack(&self, src: &[u8]) -> Result<Vec<u8>> {
        self.check_flm_len(src.len())?;
        let mut out = vec![0u8; self.bytes];
        self.for_each_run(|flm, packed, len| {
            out[packed..packed + len].copy_from_slice(&src[flm..flm + len]);
        });
        Ok(out)
    }

    /// Writes into `dst` the weight's .flm bytes held by `packed` (bytes in this layout):
    /// the inverse of [`GemvLayout::pack`], so that a weight kept in GPU memory in this
    /// layout is read back as it was uploaded.
    ///
    /// Errors: [`Error::Shape`] when `packed` has not [`GemvLayout::bytes`] bytes or `dst`
    /// not the weight's .flm size.
    pub fn unpack(&self, packed: &[u8], dst: &mut [u8]) -> Result<()> {
        self.check_packed_len(packed.len())?;
        self.check_flm_len(dst.len())?;
        self.for_each_run(|flm, at, len| {
            dst[flm..flm + len].copy_from_slice(&packed[at..at + len]);
        });
        Ok(())
    }

    /// Calls `copy(flm, packed, len)` for each run of `len` bytes that starts at byte `flm`
    /// of the .flm bytes and at byte `packed` of this layout: together the runs cover every
    /// .flm byte once (f16/bf16 rows, int8 scales and codes, int4 codes, scales and minimums
    /// or zero points), and every packed byte but the f16/bf16 row padding.
    fn for_each_run(&self, mut copy: impl FnMut(usize, usize, usize)) {
        let row_bytes = self.flm_row_bytes();
        for r in 0..self.rows {
            let flm = r * row_bytes;
            match self.dtype.group_size() {
                None if self.dtype == DataType::I8 => {
                    copy(flm, self.params_offset + 4 * r, 4);
                    copy(flm + 4, r * self.ld, self.ld);
                }
                None => copy(flm, 2 * r * self.ld, row_bytes),
                Some(g) => {
                    let (codes, groups) = (self.ld / 2, self.ld / g);
                    copy(flm, r * codes, codes);
                    let params = self.params_offset + r * groups * group_param_bytes(self.dtype);
                    if self.dtype.int4_form() == Some(Int4Form::Symmetric) {
                        copy(flm + codes, params, 2 * groups);
                        continue;
                    }
                    let mins = flm + quant::int4_mins(self.dtype, self.ld).offset;
                    for gi in 0..groups {
                        copy(flm + codes + 2 * gi, params + 4 * gi, 2);
                        copy(mins + 2 * gi, params + 4 * gi + 2, 2);
                    }
                }
            }
        }
    }

    /// An error unless `len` is the size of the weight's .flm bytes.
    fn check_flm_len(&self, len: usize) -> Result<()> {
        if Some(len) == self.flm_row_bytes().checked_mul(self.rows) {
            return Ok(());
        }
        Err(Error::Shape {
            op: "GEMV layout",
            msg: format!(
                "{len} bytes for a {} weight [{}, {}]",
                self.dtype, self.rows, self.cols
            ),
        })
    }

    /// An error unless `len` is [`GemvLayout::bytes`].
    fn check_packed_len(&self, len: usize) -> Result<()> {
        if len == self.bytes {
            return Ok(());
        }
        Err(Error::Shape {
            op: "GEMV layout",
            msg: format!("{len} packed bytes, expected {}", self.bytes),
        })
    }

    /// The `rows × cols` weights of `packed` (bytes in this layout), walking the layout as
    /// the kernels do: `d · q + m` per int4 value with `m` formed from the group's pair as
    /// [`quant::Int4Row::min`] forms it, `s · q` per int8 value. The reference of the
    /// packing tests.
    ///
    /// Errors: [`Error::Shape`] when `packed` has not [`GemvLayout::bytes`] bytes.
    pub fn dequantize(&self, packed: &[u8]) -> Result<Vec<f32>> {
        self.check_packed_len(packed.len())?;
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
