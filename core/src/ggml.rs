//! ggml's weight types (llama.cpp `ggml/src/ggml-common.h` block structs, typed in
//! [`crate::blocks`]; `ggml.h` `ggml_type` numbers), decoded ([`crate::blocks::dequantize`])
//! as gguf-py's reference dequantisers decode them
//! (`gguf/quants.py`, `dequantize_blocks` of each class), with the same f32 operations in
//! the same order, so that every value agrees bit for bit (the golden test data in
//! `tests/data/gguf/quants` is made by gguf-py: `tools/gguf/make_quant_tests.py`).
//!
//! A tensor of a block type is a sequence of blocks along its rows (`ne[0]`, a multiple of
//! the block length); each block holds [`GgmlType::block_len`] values in
//! [`GgmlType::block_bytes`] bytes. f16 fields are little-endian binary16, converted to f32
//! exactly. Per block (`q` a code, `d`/`dmin` f16 super-scales, `sc`/`m` sub-block scales
//! and minimums):
//!
//! | type | values, bytes | layout | value |
//! |---|---|---|---|
//! | Q4_0 | 32, 18 | `d`, 16 B nibbles | `d · (q − 8)` |
//! | Q4_1 | 32, 20 | `d`, `m`, 16 B nibbles | `d · q + m` |
//! | Q5_0 | 32, 22 | `d`, u32 high bits, 16 B nibbles | `d · (q − 16)` |
//! | Q5_1 | 32, 24 | `d`, `m`, u32 high bits, 16 B nibbles | `d · q + m` |
//! | Q8_0 | 32, 34 | `d`, 32 × i8 | `q · d` |
//! | Q2_K | 256, 84 | 16 B scales (low nibble `sc`, high `m`), 64 B 2-bit codes, `d`, `dmin` | `(d·sc) · q − dmin·m` |
//! | Q3_K | 256, 110 | 32 B high-bit mask, 64 B 2-bit codes, 12 B 6-bit scales, `d` | `(d·(sc − 32)) · q`, `q ∈ [−4, 3]` |
//! | Q4_K | 256, 144 | `d`, `dmin`, 12 B 6-bit `sc`/`m`, 128 B nibbles | `(d·sc) · q − dmin·m` |
//! | Q5_K | 256, 176 | `d`, `dmin`, 12 B `sc`/`m`, 32 B high bits, 128 B nibbles | `(d·sc) · q − dmin·m` |
//! | Q6_K | 256, 210 | 128 B low nibbles, 64 B 2-bit highs, 16 × i8 `sc`, `d` | `(d·sc) · (q − 32)` |
//! | IQ4_NL | 32, 18 | `d`, 16 B nibbles | `d · K[q]` |
//! | IQ4_XS | 256, 136 | `d`, u16 high scale bits, 4 B low scale nibbles, 128 B nibbles | `(d·(sc − 32)) · K[q]` |
//! | MXFP4 | 32, 17 | E8M0 exponent `e`, 16 B nibbles | `2^(e − 128) · E[q]` |
//!
//! `K` is ggml's non-linear 4-bit codebook `kvalues_iq4nl`; `E` is `kvalues_mxfp4`, the
//! E2M1 values doubled (so that they are integers, hence `e − 128`: OCP Microscaling
//! Formats v1.0, with `2^(e − 127)` the shared scale). Within a 32-value run of
//! nibbles, byte `i` holds value `i` in its low nibble and value `i + 16` in its high one
//! (the order flm's int4 rows use too: [`crate::quant::nibble`]).
//!
//! Q4_0 and Q4_1 at 32 values per block are flm's [`DataType::I4SymG32`] and
//! [`DataType::I4G32`] with the scales moved out of the blocks:
//! [`crate::quant::repack_ggml_row`] converts without changing any value.

use crate::DataType;

/// Values per K-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// A ggml block weight type that flm reads (numbers of `ggml_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 4-bit, symmetric, an f16 scale per 32 values.
    Q4_0 = 2,
    /// 4-bit, an f16 scale and minimum per 32 values.
    Q4_1 = 3,
    /// 5-bit, symmetric, an f16 scale per 32 values.
    Q5_0 = 6,
    /// 5-bit, an f16 scale and minimum per 32 values.
    Q5_1 = 7,
    /// 8-bit, symmetric, an f16 scale per 32 values.
    Q8_0 = 8,
    /// 2-bit K-quant: 4-bit scales and minimums per 16 values.
    Q2K = 10,
    /// 3-bit K-quant: 6-bit scales per 16 values.
    Q3K = 11,
    /// 4-bit K-quant: 6-bit scales and minimums per 32 values.
    Q4K = 12,
    /// 5-bit K-quant: 6-bit scales and minimums per 32 values.
    Q5K = 13,
    /// 6-bit K-quant: 8-bit scales per 16 values.
    Q6K = 14,
    /// 4-bit non-linear codebook, an f16 scale per 32 values.
    IQ4NL = 20,
    /// 4-bit non-linear codebook, 6-bit scales per 32 values in super-blocks of 256.
    IQ4XS = 23,
    /// OCP Microscaling FP4: 32 E2M1 values sharing one E8M0 power-of-two scale.
    MXFP4 = 39,
}

impl GgmlType {
    /// Every type, in `ggml_type` order.
    pub const ALL: [GgmlType; 13] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::IQ4NL,
        GgmlType::IQ4XS,
        GgmlType::MXFP4,
    ];

    /// The type of `ggml_type` number `id`, if flm reads it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| *t as u32 == id)
    }

    /// ggml's name (`ggml_type_name`).
    pub const fn name(self) -> &'static str {
        match self {
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2K => "Q2_K",
            GgmlType::Q3K => "Q3_K",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::IQ4NL => "IQ4_NL",
            GgmlType::IQ4XS => "IQ4_XS",
            GgmlType::MXFP4 => "MXFP4",
        }
    }

    /// Values per block.
    pub const fn block_len(self) -> usize {
        match self {
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::IQ4NL
            | GgmlType::MXFP4 => 32,
            _ => QK_K,
        }
    }

    /// Bytes per block (ggml's `type_size`).
    pub const fn block_bytes(self) -> usize {
        match self {
            GgmlType::Q4_0 | GgmlType::IQ4NL => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q2K => 84,
            GgmlType::Q3K => 110,
            GgmlType::Q4K => 144,
            GgmlType::Q5K => 176,
            GgmlType::Q6K => 210,
            GgmlType::IQ4XS => 136,
            GgmlType::MXFP4 => 17,
        }
    }

    /// Bits per weight (block bytes · 8 / block length).
    pub fn bits_per_weight(self) -> f32 {
        (self.block_bytes() * 8) as f32 / self.block_len() as f32
    }

    /// The flm dtype that holds this type's values exactly in the same bytes, repacked
    /// ([`crate::quant::repack_ggml_row`]): Q4_0 is [`DataType::I4SymG32`], Q4_1
    /// [`DataType::I4G32`].
    pub const fn lossless_dtype(self) -> Option<DataType> {
        match self {
            GgmlType::Q4_0 => Some(DataType::I4SymG32),
            GgmlType::Q4_1 => Some(DataType::I4G32),
            _ => None,
        }
    }

    /// The flm dtype that holds this type's blocks byte for byte (Q4_K, Q5_K, Q6_K: see
    /// [`crate::kquant`]; Q8_0), so that a tensor of it is used in place: the dtype whose
    /// [`DataType::format`] is this type.
    pub fn native_dtype(self) -> Option<DataType> {
        DataType::VALUES
            .into_iter()
            .find(|d| d.ggml_type() == Some(self))
    }

    /// Bytes of `n` values (`None` if `n` is not a whole number of blocks or on overflow).
    pub fn byte_len(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_len())
            .then(|| (n / self.block_len()).checked_mul(self.block_bytes()))
            .flatten()
    }
}
