//! ggml's weight types (llama.cpp `ggml/src/ggml-common.h` block structs, `ggml.h`
//! `ggml_type` numbers), decoded as gguf-py's reference dequantisers decode them
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
//!
//! `K` is ggml's non-linear 4-bit codebook `kvalues_iq4nl`. Within a 32-value run of
//! nibbles, byte `i` holds value `i` in its low nibble and value `i + 16` in its high one
//! (the order flm's int4 rows use too: [`crate::quant::nibble`]).
//!
//! Q4_0 and Q4_1 at 32 values per block are flm's [`DataType::I4SymG32`] and
//! [`DataType::I4G32`] with the scales moved out of the blocks:
//! [`crate::quant::repack_ggml_row`] converts without changing any value.

use half::f16;

use crate::DataType;

/// Values per K-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// ggml's `kvalues_iq4nl`: the 16 levels of IQ4_NL and IQ4_XS.
const IQ4_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

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
}

impl GgmlType {
    /// Every type, in `ggml_type` order.
    pub const ALL: [GgmlType; 12] = [
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
            | GgmlType::IQ4NL => 32,
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
    /// [`crate::kquant`]; Q8_0), so that a tensor of it is used in place.
    pub const fn native_dtype(self) -> Option<DataType> {
        match self {
            GgmlType::Q8_0 => Some(DataType::Q8_0),
            GgmlType::Q4K => Some(DataType::Q4K),
            GgmlType::Q5K => Some(DataType::Q5K),
            GgmlType::Q6K => Some(DataType::Q6K),
            _ => None,
        }
    }

    /// Bytes of `n` values (`None` if `n` is not a whole number of blocks or on overflow).
    pub fn byte_len(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_len())
            .then(|| (n / self.block_len()).checked_mul(self.block_bytes()))
            .flatten()
    }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantises whole blocks of `ty`: `src` holds `dst.len() / ty.block_len()` blocks.
/// The math is gguf-py's (see the module docs), operation for operation.
///
/// # Panics
/// If `dst.len()` is not a multiple of the block length or `src` is shorter than its
/// blocks: callers size both from [`GgmlType::byte_len`].
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    assert_eq!(
        dst.len() % ty.block_len(),
        0,
        "whole blocks of {}",
        ty.name()
    );
    let blocks = src.chunks_exact(ty.block_bytes());
    for (b, out) in blocks.zip(dst.chunks_exact_mut(ty.block_len())) {
        match ty {
            GgmlType::Q4_0 => nibbles32(&b[2..18], out, |q| f16_at(b, 0) * (q as f32 - 8.0)),
            GgmlType::Q4_1 => {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                nibbles32(&b[4..20], out, |q| d * q as f32 + m)
            }
            GgmlType::Q5_0 => {
                let d = f16_at(b, 0);
                five_bits(&b[2..6], &b[6..22], out, |q| d * (q as f32 - 16.0))
            }
            GgmlType::Q5_1 => {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                five_bits(&b[4..8], &b[8..24], out, |q| d * q as f32 + m)
            }
            GgmlType::Q8_0 => {
                let d = f16_at(b, 0);
                for (o, &q) in out.iter_mut().zip(&b[2..34]) {
                    *o = q as i8 as f32 * d;
                }
            }
            GgmlType::IQ4NL => {
                let d = f16_at(b, 0);
                nibbles32(&b[2..18], out, |q| d * IQ4_LEVELS[q as usize] as f32)
            }
            GgmlType::Q2K => q2_k(b, out),
            GgmlType::Q3K => q3_k(b, out),
            GgmlType::Q4K | GgmlType::Q5K => q45_k(ty, b, out),
            GgmlType::Q6K => q6_k(b, out),
            GgmlType::IQ4XS => iq4_xs(b, out),
        }
    }
}

/// 32 values from 16 bytes of nibbles (value `i` low nibble of byte `i`, `i + 16` high).
fn nibbles32(qs: &[u8], out: &mut [f32], value: impl Fn(u8) -> f32) {
    for (i, &q) in qs.iter().enumerate() {
        out[i] = value(q & 0x0f);
        out[i + 16] = value(q >> 4);
    }
}

/// Q5_0/Q5_1 codes: nibbles as [`nibbles32`], bit 4 of value `i` in bit `i` of `qh`.
fn five_bits(qh: &[u8], qs: &[u8], out: &mut [f32], value: impl Fn(u8) -> f32) {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let high = |i: usize| (((qh >> i) & 1) as u8) << 4;
    for (i, &q) in qs.iter().enumerate() {
        out[i] = value((q & 0x0f) | high(i));
        out[i + 16] = value((q >> 4) | high(i + 16));
    }
}

/// The 2-bit code of value `e` of a 256-value super-block: halves of 128 values, each
/// four 32-value runs at bit shifts 0, 2, 4, 6 of the same 32 bytes (Q2_K, Q3_K, Q6_K).
fn two_bits(qs: &[u8], e: usize) -> u8 {
    let (half, run, l) = (e / 128, (e % 128) / 32, e % 32);
    (qs[half * 32 + l] >> (2 * run)) & 3
}

fn q2_k(b: &[u8], out: &mut [f32]) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (e, o) in out.iter_mut().enumerate() {
        let s = scales[e / 16];
        let dl = d * (s & 0x0f) as f32;
        let ml = dmin * (s >> 4) as f32;
        *o = dl * two_bits(qs, e) as f32 - ml;
    }
}

fn q3_k(b: &[u8], out: &mut [f32]) {
    let (hmask, qs, sc) = (&b[..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    for (e, o) in out.iter_mut().enumerate() {
        let i = e / 16;
        let low = (sc[i % 8] >> (4 * (i / 8))) & 0x0f;
        let high = (sc[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        let dl = d * (((low | (high << 4)) as i8) - 32) as f32;
        // The offset 4 applies where the mask bit is clear.
        let h = ((hmask[e % 32] >> (e / 32)) & 1) ^ 1;
        *o = dl * (two_bits(qs, e) as i8 - ((h << 2) as i8)) as f32;
    }
}

/// The 6-bit scale and minimum of sub-block `j` (of 8) of Q4_K/Q5_K (ggml's
/// `get_scale_min_k4`).
pub fn scale_min_k4(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 0x3f, s[j + 4] & 0x3f)
    } else {
        let sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30);
        let m = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
        (sc, m)
    }
}

fn q45_k(ty: GgmlType, b: &[u8], out: &mut [f32]) {
    let (d, dmin, scales) = (f16_at(b, 0), f16_at(b, 2), &b[4..16]);
    let (qh, qs) = match ty {
        GgmlType::Q5K => (Some(&b[16..48]), &b[48..176]),
        _ => (None, &b[16..144]),
    };
    for (j, run) in out.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(scales, j);
        let (dl, ml) = (d * sc as f32, dmin * m as f32);
        for (l, o) in run.iter_mut().enumerate() {
            let low = (qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0x0f;
            let high = qh.map_or(0, |h| ((h[l] >> j) & 1) << 4);
            *o = dl * (low | high) as f32 - ml;
        }
    }
}

fn q6_k(b: &[u8], out: &mut [f32]) {
    let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for (e, o) in out.iter_mut().enumerate() {
        let (half, j, l) = (e / 128, (e % 128) / 64, e % 64);
        let low = (ql[half * 64 + l] >> (4 * j)) & 0x0f;
        let q = (low | (two_bits(qh, e) << 4)) as i8 - 32;
        let dl = d * scales[e / 16] as i8 as f32;
        *o = dl * q as f32;
    }
}

fn iq4_xs(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let (scales_l, qs) = (&b[4..8], &b[8..136]);
    for (j, run) in out.chunks_exact_mut(32).enumerate() {
        let low = (scales_l[j / 2] >> (4 * (j % 2))) & 0x0f;
        let high = ((scales_h >> (2 * j)) & 0x03) as u8;
        let dl = d * (((low | (high << 4)) as i8) - 32) as f32;
        nibbles32(&qs[j * 16..j * 16 + 16], run, |q| {
            dl * IQ4_LEVELS[q as usize] as f32
        });
    }
}
