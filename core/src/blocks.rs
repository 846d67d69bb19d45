//! ggml's quantisation blocks as typed structs: the block structs of llama.cpp's
//! `ggml/src/ggml-common.h`, field for field, each `#[repr(C)]` and checked against
//! ggml's `type_size` at compile time wherever it is viewed (as candle's `k_quants.rs` checks
//! its blocks).
//!
//! Every field is a byte array, so a block has alignment 1 and no padding: a slice of
//! whole blocks anywhere in a file or buffer is viewed as blocks in place ([`blocks`]),
//! however it is aligned. f16 fields are little-endian binary16 ([`F16Le`]).
//!
//! [`Block::dequantize`] decodes a block as gguf-py's reference dequantisers do
//! (`gguf/quants.py`, `dequantize_blocks` of each class), with the same f32 operations in
//! the same order, so that every value agrees bit for bit (golden data in
//! `tests/data/gguf/quants`, made by gguf-py). [`Quantize`] is implemented by the formats
//! flm writes itself: Q5_0, Q8_0, MXFP4, IQ4_NL and IQ4_XS byte for byte as ggml writes
//! them (golden data in `tests/data/gguf/quants` and `tests/data/gguf/iq4`, made by gguf-py
//! and by ggml's C), the K-quants (and Q5_0 with importance) with flm's fits
//! ([`quantize_weighted`]); [`quantize_row`] and
//! [`dequantize_row`] apply a format to a row of any length, the last block padded with
//! zeros.

use bytemuck::{Pod, Zeroable};
use half::f16;

use crate::ggml::{GgmlType, QK_K};
use crate::quant::importance_weights;

/// A little-endian IEEE binary16 as two bytes (alignment 1).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct F16Le(pub [u8; 2]);

impl F16Le {
    /// The value, exactly.
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        f16::from_le_bytes(self.0).to_f32()
    }

    /// `v`, stored.
    pub fn new(v: f16) -> F16Le {
        F16Le(v.to_le_bytes())
    }
}

/// A ggml quantisation block: [`Block::VALUES`] values in `size_of::<Self>()` bytes.
pub trait Block: Pod {
    /// The ggml type whose block this is.
    const TYPE: GgmlType;
    /// Values per block.
    const VALUES: usize = Self::TYPE.block_len();

    /// Decodes the block's values into `out` (`VALUES` values), as gguf-py does.
    fn dequantize(&self, out: &mut [f32]);
}

/// A block format flm quantises f32 values to.
pub trait Quantize: Block {
    /// Codes `values` (`VALUES` values) into `self`, which starts zeroed.
    fn quantize(&mut self, values: &[f32]);

    /// Codes `values` into `self` (which starts zeroed) minimising their squared error
    /// weighted by `importance` (one non-negative weight per value, see
    /// [`crate::quant::quantize_row_weighted`]). By default importance is ignored, as
    /// ggml does for Q8_0.
    fn quantize_weighted(&mut self, values: &[f32], importance: &[f32]) {
        let _ = importance;
        self.quantize(values)
    }
}

/// The whole blocks of type `B` at the start of `bytes` (a partial block at the end is
/// not part of the view).
#[inline(always)]
pub fn blocks<B: Block>(bytes: &[u8]) -> &[B] {
    const { layout_checks::<B>() };
    let whole = bytes.len() / size_of::<B>() * size_of::<B>();
    bytemuck::cast_slice(&bytes[..whole])
}

/// The whole blocks of type `B` at the start of `bytes`, mutable.
pub fn blocks_mut<B: Block>(bytes: &mut [u8]) -> &mut [B] {
    const { layout_checks::<B>() };
    let whole = bytes.len() / size_of::<B>() * size_of::<B>();
    bytemuck::cast_slice_mut(&mut bytes[..whole])
}

/// The block of type `B` that `bytes` starts with.
///
/// # Panics
/// If `bytes` is shorter than one block.
#[inline(always)]
pub fn block<B: Block>(bytes: &[u8]) -> &B {
    const { layout_checks::<B>() };
    bytemuck::from_bytes(&bytes[..size_of::<B>()])
}

/// Compile-time checks of a block type, made where it is viewed: its struct is ggml's
/// `type_size` bytes, and it holds no more values than a super-block (the scratch of the
/// row functions).
const fn layout_checks<B: Block>() {
    assert!(size_of::<B>() == B::TYPE.block_bytes());
    assert!(B::VALUES <= QK_K);
}

/// Decodes a row of `dst.len()` values from `src` (`dst.len().div_ceil(VALUES)` blocks of
/// `B`): the values of its last block past `dst.len()` are dropped.
///
/// # Panics
/// If `src` holds fewer blocks.
pub fn dequantize_row<B: Block>(src: &[u8], dst: &mut [f32]) {
    let src = blocks::<B>(src);
    assert!(
        src.len() * B::VALUES >= dst.len(),
        "too few {} blocks",
        B::TYPE.name()
    );
    let mut last = [0.0f32; QK_K];
    for (b, out) in src.iter().zip(dst.chunks_mut(B::VALUES)) {
        if out.len() == B::VALUES {
            b.dequantize(out);
        } else {
            b.dequantize(&mut last[..B::VALUES]);
            let n = out.len();
            out.copy_from_slice(&last[..n]);
        }
    }
}

/// Codes a row of `src.len()` values into `dst` (`src.len().div_ceil(VALUES)` blocks of
/// `B`, at least one), the last block padded with zeros.
pub fn quantize_row<B: Quantize>(src: &[f32], dst: &mut [u8]) {
    quantize_row_weighted::<B>(src, None, dst)
}

/// As [`quantize_row`], with [`Quantize::quantize_weighted`] where `importance` (one weight
/// per value of `src`) is given; padding values have importance 0.
///
/// # Panics
/// If `importance` is not of `src.len()` values.
pub fn quantize_row_weighted<B: Quantize>(src: &[f32], importance: Option<&[f32]>, dst: &mut [u8]) {
    if let Some(imp) = importance {
        assert_eq!(imp.len(), src.len(), "one importance per value");
    }
    let mut x = [0.0f32; QK_K];
    let mut w = [0.0f32; QK_K];
    let (x, w) = (&mut x[..B::VALUES], &mut w[..B::VALUES]);
    for (i, block) in blocks_mut::<B>(dst).iter_mut().enumerate() {
        let from = (i * B::VALUES).min(src.len());
        let to = (from + B::VALUES).min(src.len());
        x.fill(0.0);
        x[..to - from].copy_from_slice(&src[from..to]);
        *block = B::zeroed();
        match importance {
            Some(imp) => {
                w.fill(0.0);
                w[..to - from].copy_from_slice(&imp[from..to]);
                block.quantize_weighted(x, w);
            }
            None => block.quantize(x),
        }
    }
}

/// Keeps in `block` the better of its weighted fit and `fallback` (the fit without
/// importance) by the importance-weighted squared error `Σ importance · (x − x̂)²`, the
/// measure the imatrix stands for: llama.cpp's block weights steer the search, and this
/// choice makes sure importance never makes a block worse by that measure (and that a
/// block whose importance is all zero keeps the plain fit).
fn keep_better<B: Block>(block: &mut B, fallback: B, values: &[f32], importance: &[f32]) {
    let error = |b: &B| -> f32 {
        let mut out = [0.0f32; QK_K];
        b.dequantize(&mut out[..B::VALUES]);
        values
            .iter()
            .zip(importance)
            .zip(&out)
            .map(|((&x, &imp), &y)| imp * (y - x) * (y - x))
            .sum()
    };
    let better = error(block) < error(&fallback);
    if !better {
        *block = fallback;
    }
}

/// The plain fit of `values` as a block of its own (the fallback of [`keep_better`]).
fn plain_fit<B: Quantize>(values: &[f32]) -> B {
    let mut b = B::zeroed();
    b.quantize(values);
    b
}

/// ggml's `kvalues_iq4nl`: the 16 levels of IQ4_NL and IQ4_XS.
pub const IQ4_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// 32 values from 16 bytes of nibbles (value `i` low nibble of byte `i`, `i + 16` high).
fn nibbles32(qs: &[u8; 16], out: &mut [f32], value: impl Fn(u8) -> f32) {
    for (i, &q) in qs.iter().enumerate() {
        out[i] = value(q & 0x0f);
        out[i + 16] = value(q >> 4);
    }
}

/// Q5_0/Q5_1 codes: nibbles as [`nibbles32`], bit 4 of value `i` in bit `i` of `qh`.
fn five_bits(qh: [u8; 4], qs: &[u8; 16], out: &mut [f32], value: impl Fn(u8) -> f32) {
    let qh = u32::from_le_bytes(qh);
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

/// `block_q4_0`: `d · (q − 8)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// The f16 scale `d`.
    pub d: F16Le,
    /// 4-bit codes: value `i` in the low nibble of byte `i`, `i + 16` in its high one.
    pub qs: [u8; 16],
}

/// `block_q4_1`: `d · q + m`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// The f16 scale `d`.
    pub d: F16Le,
    /// The f16 minimum `m`.
    pub m: F16Le,
    /// 4-bit codes: value `i` in the low nibble of byte `i`, `i + 16` in its high one.
    pub qs: [u8; 16],
}

/// `block_q5_0`: `d · (q − 16)`, bit 4 of value `i` in bit `i` of `qh`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// The f16 scale `d`.
    pub d: F16Le,
    /// Bit 4 of value `i` in bit `i` (little-endian u32).
    pub qh: [u8; 4],
    /// 4-bit codes: value `i` in the low nibble of byte `i`, `i + 16` in its high one.
    pub qs: [u8; 16],
}

/// `block_q5_1`: `d · q + m`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// The f16 scale `d`.
    pub d: F16Le,
    /// The f16 minimum `m`.
    pub m: F16Le,
    /// Bit 4 of value `i` in bit `i` (little-endian u32).
    pub qh: [u8; 4],
    /// 4-bit codes: value `i` in the low nibble of byte `i`, `i + 16` in its high one.
    pub qs: [u8; 16],
}

/// `block_q8_0`: `q · d`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// The f16 scale `d`.
    pub d: F16Le,
    /// The 32 int8 codes.
    pub qs: [i8; 32],
}

/// `block_q2_K`: per 16 values a 4-bit scale (low nibble) and minimum (high nibble).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BlockQ2K {
    /// Per 16 values: the scale in the low nibble, the minimum in the high one.
    pub scales: [u8; 16],
    /// 2-bit codes: halves of 128 values, runs of 32 at bit shifts 0, 2, 4, 6.
    pub qs: [u8; 64],
    /// The f16 scale `d`.
    pub d: F16Le,
    /// The f16 scale of the minimums.
    pub dmin: F16Le,
}

/// `block_q3_K`: 2-bit codes, a high-bit mask (the offset 4 where clear) and 6-bit scales
/// per 16 values.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BlockQ3K {
    /// Bit `e / 32` of byte `e % 32` clear: the code of value `e` is offset by −4.
    pub hmask: [u8; 32],
    /// 2-bit codes: halves of 128 values, runs of 32 at bit shifts 0, 2, 4, 6.
    pub qs: [u8; 64],
    /// 6-bit scales (Q3_K: per 16 values, offset 32) or scales and minimums (Q4_K, Q5_K: per 32).
    pub scales: [u8; 12],
    /// The f16 scale `d`.
    pub d: F16Le,
}

/// The head Q4_K and Q5_K share: the super-block's scale `d` and minimum scale `dmin`, and
/// 6-bit scales `sc_j` and minimums `m_j` of its eight runs of 32, packed in 12 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct KScales {
    /// The f16 scale `d`.
    pub d: F16Le,
    /// The f16 scale of the minimums.
    pub dmin: F16Le,
    /// 6-bit scales (Q3_K: per 16 values, offset 32) or scales and minimums (Q4_K, Q5_K: per 32).
    pub scales: [u8; 12],
}

impl KScales {
    /// The 6-bit `(sc_j, m_j)` of run `j` (of 8): ggml's `get_scale_min_k4`.
    #[inline(always)]
    pub fn get(&self, j: usize) -> (u8, u8) {
        let s = &self.scales;
        if j < 4 {
            (s[j] & 0x3f, s[j + 4] & 0x3f)
        } else {
            let sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30);
            let m = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
            (sc, m)
        }
    }

    /// `(d · sc_j, dmin · m_j)` of run `j`: `ŵ = (d·sc_j)·q − dmin·m_j`.
    #[inline(always)]
    pub fn run(&self, j: usize) -> (f32, f32) {
        let (sc, m) = self.get(j);
        (self.d.to_f32() * sc as f32, self.dmin.to_f32() * m as f32)
    }

    /// Packs the 6-bit `sc` and `m` of the eight runs as [`KScales::get`] reads them: runs
    /// 0..4 in bytes 0..8, runs 4..8 split into low nibbles (bytes 8..12) and top 2 bits
    /// (bits 6, 7 of bytes 0..8).
    fn pack(&mut self, sc: &[u8; 8], m: &[u8; 8]) {
        let s = &mut self.scales;
        for j in 0..4 {
            s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            s[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
            s[j + 8] = (sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4);
        }
    }
}

/// `block_q4_K`: eight runs of 32 4-bit codes, run `j` in the low (`j` even) or high
/// nibbles of bytes `32 · (j / 2)..` of `qs`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BlockQ4K {
    /// `d`, `dmin` and the runs' 6-bit scales and minimums.
    pub head: KScales,
    /// 4-bit codes (of Q5_K: their low 4 bits), two values to a byte.
    pub qs: [u8; 128],
}

/// `block_q5_K`: as [`BlockQ4K`] with bit 4 of value `l` of run `j` in bit `j` of
/// `qh[l]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BlockQ5K {
    /// `d`, `dmin` and the runs' 6-bit scales and minimums.
    pub head: KScales,
    /// Bit 4 of value `l` of run `j` in bit `j` of byte `l`.
    pub qh: [u8; 32],
    /// 4-bit codes (of Q5_K: their low 4 bits), two values to a byte.
    pub qs: [u8; 128],
}

/// `block_q6_K`: 6-bit codes (low nibbles in `ql`, 2 high bits in `qh`), an i8 scale per
/// 16 values, `ŵ = (d·sc)·(q − 32)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BlockQ6K {
    /// The low 4 bits of the codes.
    pub ql: [u8; 128],
    /// The high 2 bits of the codes.
    pub qh: [u8; 64],
    /// An i8 scale per 16 values.
    pub scales: [i8; 16],
    /// The f16 scale `d`.
    pub d: F16Le,
}

/// `block_iq4_nl`: `d · K[q]` with ggml's non-linear levels `K`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BlockIQ4NL {
    /// The f16 scale `d`.
    pub d: F16Le,
    /// 4-bit codes: value `i` in the low nibble of byte `i`, `i + 16` in its high one.
    pub qs: [u8; 16],
}

/// `block_iq4_xs`: `(d·(sc − 32)) · K[q]`, a 6-bit scale per 32 values (low nibbles in
/// `scales_l`, 2 high bits in the little-endian u16 `scales_h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BlockIQ4XS {
    /// The f16 scale `d`.
    pub d: F16Le,
    /// The high 2 bits of the 6-bit run scales (little-endian u16).
    pub scales_h: [u8; 2],
    /// The low 4 bits of the 6-bit run scales.
    pub scales_l: [u8; 4],
    /// 4-bit codes (of Q5_K: their low 4 bits), two values to a byte.
    pub qs: [u8; 128],
}

/// `block_mxfp4`: `2^(e − 128) · E[q]`, `E` the E2M1 values doubled.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
pub struct BlockMXFP4 {
    /// The E8M0 exponent: the block's scale is `2^(e − 127)`.
    pub e: u8,
    /// 4-bit E2M1 codes: value `i` in the low nibble of byte `i`, `i + 16` in its high one.
    pub qs: [u8; 16],
}

/// ggml's `kvalues_mxfp4`: the 16 E2M1 values (sign, 2-bit exponent, 1-bit mantissa),
/// doubled to integers.
pub const MXFP4_LEVELS: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml's `ggml_e8m0_to_fp32_half`: `2^(e − 128)`, the scale of [`MXFP4_LEVELS`] (half the
/// E8M0 value, subnormal for `e < 2`), exactly.
#[inline(always)]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

impl Block for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        nibbles32(&self.qs, out, |q| d * (q as f32 - 8.0))
    }
}

impl Block for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        nibbles32(&self.qs, out, |q| d * q as f32 + m)
    }
}

impl Block for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        five_bits(self.qh, &self.qs, out, |q| d * (q as f32 - 16.0))
    }
}

impl BlockQ5_0 {
    /// Stores the f16 scale `d` and the 5-bit codes `q[i]` (value `i` in the low nibble of
    /// byte `i % 16`, high for `i ≥ 16`; bit 4 in bit `i` of `qh`).
    fn store(&mut self, d: f16, q: &[u8; 32]) {
        self.d = F16Le::new(d);
        let mut qh = 0u32;
        for (i, &c) in q.iter().enumerate() {
            self.qs[i % 16] |= (c & 0x0f) << (4 * (i / 16));
            qh |= u32::from(c >> 4) << i;
        }
        self.qh = qh.to_le_bytes();
    }

    /// The codes of `values` for the stored scale `d`: each value's nearest level.
    fn nearest_codes(values: &[f32], d: f32) -> [u8; 32] {
        std::array::from_fn(|i| (level(values[i], d, -16.0, 15.0) + 16.0) as u8)
    }

    /// Squared error of `values` coded with scale `d`, weighted by `w`.
    fn error(values: &[f32], w: &[f32], d: f32) -> f32 {
        let q = Self::nearest_codes(values, d);
        values
            .iter()
            .zip(w)
            .zip(q)
            .map(|((&x, &wt), q)| {
                let e = x - d * (f32::from(q) - 16.0);
                wt * e * e
            })
            .sum()
    }
}

impl Quantize for BlockQ5_0 {
    /// ggml's `quantize_row_q5_0_ref`: `d = x* / −16` (`x*` the value of largest
    /// magnitude, the first of equals), codes `min(31, trunc(x / d + 16.5))` from the f32
    /// inverse, the scale stored as f16. Byte for byte gguf-py's (`core/tests/ggml.rs`).
    fn quantize(&mut self, values: &[f32]) {
        let extreme = signed_extreme(values);
        let d = extreme / -16.0;
        let id = inverse(d);
        let q = std::array::from_fn(|i| ((values[i] * id + 16.5) as i8).min(31) as u8);
        self.store(f16::from_f32(d), &q);
    }

    /// A search like llama.cpp's `quantize_row_q5_0_impl` (`make_qx_quants` with 16 levels
    /// each side), finer and scored as stored: for each candidate inverse scale
    /// `−(16 + 0.05 k) / x*`, `k ∈ [−30, 30]` (`x*` the value of largest magnitude), the
    /// codes are fixed and the scale refitted by least squares weighted by `importance`;
    /// each candidate's f16 scale, with the codes nearest for it, is scored by
    /// `Σ importance · (x − x̂)²`, and the block keeps the plain fit where that is better.
    /// Unlike the K-quants' fits, the weights are the importance alone, without llama.cpp's
    /// `sqrt(σ² + x²)` factor: on SmolLM2 that lowers the mean KLD of a Q4_K_M-style file
    /// (docs/benchmarks.md, "Importance matrices").
    fn quantize_weighted(&mut self, values: &[f32], importance: &[f32]) {
        const STEPS: i32 = 30;
        let fallback = plain_fit::<Self>(values);
        let extreme = signed_extreme(values);
        if extreme.abs() >= GROUP_MAX_EPS {
            let mut best = (f32::INFINITY, f16::ZERO);
            for k in -STEPS..=STEPS {
                let iscale = -(16.0 + 0.05 * k as f32) / extreme;
                let (mut slx, mut sl2) = (0.0f32, 0.0f32);
                let codes = codes_of(values, iscale, -16.0, 15.0);
                for (l, (&v, &wt)) in codes.zip(values.iter().zip(importance)) {
                    slx += wt * v * l;
                    sl2 += wt * l * l;
                }
                if sl2 > 0.0 {
                    let d = f16::from_f32(slx / sl2);
                    let err = Self::error(values, importance, d.to_f32());
                    if err < best.0 {
                        best = (err, d);
                    }
                }
            }
            let d = best.1;
            self.store(d, &Self::nearest_codes(values, d.to_f32()));
        }
        keep_better(self, fallback, values, importance);
    }
}

impl Block for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        five_bits(self.qh, &self.qs, out, |q| d * q as f32 + m)
    }
}

impl Block for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }
}

impl Quantize for BlockQ8_0 {
    /// ggml's `quantize_row_q8_0_ref`: `d = max|w| / 127`, codes from the f32 scale, the
    /// scale stored as f16.
    fn quantize(&mut self, values: &[f32]) {
        let d = values.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        self.d = F16Le::new(f16::from_f32(d));
        for (q, &w) in self.qs.iter_mut().zip(values) {
            *q = (w * inv).round() as i8;
        }
    }
}

impl Block for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2K;

    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        for (e, o) in out.iter_mut().enumerate() {
            let s = self.scales[e / 16];
            let dl = d * (s & 0x0f) as f32;
            let ml = dmin * (s >> 4) as f32;
            *o = dl * two_bits(&self.qs, e) as f32 - ml;
        }
    }
}

impl Block for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3K;

    fn dequantize(&self, out: &mut [f32]) {
        let (sc, d) = (&self.scales, self.d.to_f32());
        for (e, o) in out.iter_mut().enumerate() {
            let i = e / 16;
            let low = (sc[i % 8] >> (4 * (i / 8))) & 0x0f;
            let high = (sc[8 + i % 4] >> (2 * (i / 4))) & 0x03;
            let dl = d * (((low | (high << 4)) as i8) - 32) as f32;
            // The offset 4 applies where the mask bit is clear.
            let h = ((self.hmask[e % 32] >> (e / 32)) & 1) ^ 1;
            *o = dl * (two_bits(&self.qs, e) as i8 - ((h << 2) as i8)) as f32;
        }
    }
}

/// Q4_K and Q5_K values: run `j` from `(d·sc_j)·q − dmin·m_j`, `code(j, l)` the code of
/// value `l` of run `j`.
fn dequantize_q45_k(head: &KScales, out: &mut [f32], code: impl Fn(usize, usize) -> u8) {
    for (j, run) in out.chunks_exact_mut(32).enumerate() {
        let (dl, ml) = head.run(j);
        for (l, o) in run.iter_mut().enumerate() {
            *o = dl * code(j, l) as f32 - ml;
        }
    }
}

/// The value of largest magnitude in `x`, the first of equals (0 for none): the `max` that
/// ggml's quantisers scale by, its sign kept.
pub(crate) fn signed_extreme(x: &[f32]) -> f32 {
    x.iter()
        .copied()
        .fold(0.0f32, |e, v| if v.abs() > e.abs() { v } else { e })
}

/// `x / d` rounded to nearest and clamped to `[lo, hi]`, 0 where `d` is 0.
fn level(x: f32, d: f32, lo: f32, hi: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        (x / d).round().clamp(lo, hi)
    }
}

/// The min/max fit of Q4_K and Q5_K (codes in `[0, top]`): per run the scale
/// `(max − min) / top` and minimum `−min`, both quantised to 6 bits against the f16
/// super-block scales; `code(j, l, q)` stores code `q` of value `l` of run `j`.
fn quantize_q45_k(head: &mut KScales, x: &[f32], top: f32, code: impl FnMut(usize, usize, u8)) {
    let mut scale = [0.0f32; 8];
    let mut neg_min = [0.0f32; 8];
    for (j, run) in x.chunks_exact(32).enumerate() {
        let lo = run.iter().copied().fold(0.0f32, f32::min);
        let hi = run.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        scale[j] = (hi - lo) / top;
        neg_min[j] = -lo;
    }
    let d = f16::from_f32(scale.iter().copied().fold(0.0, f32::max) / 63.0);
    let dmin = f16::from_f32(neg_min.iter().copied().fold(0.0, f32::max) / 63.0);
    let (df, dminf) = (d.to_f32(), dmin.to_f32());
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        sc[j] = level(scale[j], df, 0.0, 63.0) as u8;
        m[j] = level(neg_min[j], dminf, 0.0, 63.0) as u8;
    }
    store_q45_k(head, x, top, (d, dmin), (&sc, &m), code);
}

/// Stores the super-block scales `(d, dmin)` and the runs' 6-bit `(sc, m)` of a Q4_K or
/// Q5_K block, and the codes of `x` they give (`code` as in [`quantize_q45_k`]).
fn store_q45_k(
    head: &mut KScales,
    x: &[f32],
    top: f32,
    (d, dmin): (f16, f16),
    (sc, m): (&[u8; 8], &[u8; 8]),
    mut code: impl FnMut(usize, usize, u8),
) {
    head.d = F16Le::new(d);
    head.dmin = F16Le::new(dmin);
    head.pack(sc, m);
    let (d, dmin) = (d.to_f32(), dmin.to_f32());
    for (j, run) in x.chunks_exact(32).enumerate() {
        let (dl, ml) = (d * sc[j] as f32, dmin * m[j] as f32);
        for (l, &v) in run.iter().enumerate() {
            code(j, l, level(v + ml, dl, 0.0, top) as u8);
        }
    }
}

/// The weighted fit of Q4_K and Q5_K, llama.cpp's `quantize_row_q4_K_impl` and
/// `quantize_row_q5_K_impl`: each run's scale and minimum from [`fit_run`] with the weights
/// `w`, then the eight scales and the eight minimums each quantised to 6 bits against an
/// f16 super-block scale by [`fit_sub_scales`], weighted by the runs' total weights.
fn quantize_q45_k_weighted(
    head: &mut KScales,
    x: &[f32],
    w: &[f32],
    top: f32,
    code: impl FnMut(usize, usize, u8),
) {
    let mut scale = [0.0f32; 8];
    let mut neg_min = [0.0f32; 8];
    let mut run_weight = [0.0f32; 8];
    for (j, (run, rw)) in x.chunks_exact(32).zip(w.chunks_exact(32)).enumerate() {
        run_weight[j] = rw.iter().sum();
        (scale[j], neg_min[j]) = fit_run(run, rw, top);
    }
    let (d, sc) = fit_sub_scales(&scale, &run_weight);
    let (dmin, m) = fit_sub_scales(&neg_min, &run_weight);
    let (d, dmin) = (f16::from_f32(d), f16::from_f32(dmin));
    store_q45_k(head, x, top, (d, dmin), (&sc, &m), code);
}

/// Below this magnitude a group is all zeros (ggml's `GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;

/// Codes `round(x · iscale)` clamped to `[lo, hi]`.
fn codes_of(x: &[f32], iscale: f32, lo: f32, hi: f32) -> impl Iterator<Item = f32> + '_ {
    x.iter().map(move |&v| (v * iscale).round().clamp(lo, hi))
}

/// Scale `d ≥ 0` and negated minimum `−m ≥ 0` of a run coded `ŵ = d · q + m`,
/// `q ∈ [0, top]`, minimising `Σ w (x − ŵ)²` (llama.cpp's `make_qkx3_quants` with its
/// grid: `rmin = −0.9`, `rdelta = 0.05`, 36 steps): the min/max fit with the minimum
/// clamped to at most 0, then for each candidate inverse scale `(top + r) / (max − min)`
/// the codes are fixed and `(d, m)` refitted by weighted least squares (with `m = 0` where
/// the fit would make it positive), keeping the best.
fn fit_run(x: &[f32], w: &[f32], top: f32) -> (f32, f32) {
    let lo = x.iter().copied().fold(0.0f32, f32::min);
    let hi = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if hi <= lo {
        return (0.0, -lo);
    }
    let (sw, sx) = w
        .iter()
        .zip(x)
        .fold((0.0f32, 0.0f32), |(a, b), (&wt, &v)| (a + wt, b + wt * v));
    // The codes of inverse scale `iscale`, counted from `lo`.
    let codes = |iscale: f32| {
        x.iter()
            .map(move |&v| ((v - lo) * iscale).round().clamp(0.0, top))
    };
    let error = |d: f32, m: f32, iscale: f32| -> f32 {
        codes(iscale)
            .zip(x.iter().zip(w))
            .map(|(q, (&v, &wt))| {
                let e = d * q + m - v;
                wt * e * e
            })
            .sum()
    };
    let mut best = ((hi - lo) / top, lo);
    let mut best_err = error(best.0, best.1, top / (hi - lo));
    for step in 0..=36 {
        let iscale = (top - 0.9 + 0.05 * step as f32) / (hi - lo);
        let (mut sl, mut sl2, mut sxl) = (0.0f32, 0.0f32, 0.0f32);
        for ((q, &v), &wt) in codes(iscale).zip(x).zip(w) {
            sl += wt * q;
            sl2 += wt * q * q;
            sxl += wt * q * v;
        }
        let det = sw * sl2 - sl * sl;
        if det <= 0.0 {
            continue;
        }
        let (mut d, mut m) = ((sw * sxl - sx * sl) / det, (sl2 * sx - sl * sxl) / det);
        if m > 0.0 {
            (d, m) = (sxl / sl2, 0.0);
        }
        let err = error(d, m, iscale);
        if d > 0.0 && err < best_err {
            (best, best_err) = ((d, m), err);
        }
    }
    (best.0, -best.1)
}

/// The f16-stored scale `d` and 6-bit levels `l_j` of non-negative sub-block scales `x_j`
/// (`x_j ≈ d · l_j`), minimising `Σ w_j (x_j − d l_j)²` (llama.cpp's `make_qp_quants` with
/// `nmax = 63`): the best inverse scale of `(63 + 0.1 k) / max x` for `k ∈ [−4, 4]`, then
/// rounds of coordinate descent on the levels while the least-squares fit improves.
fn fit_sub_scales(x: &[f32; 8], w: &[f32; 8]) -> (f32, [u8; 8]) {
    const NMAX: f32 = 63.0;
    let max = x.iter().copied().fold(0.0f32, f32::max);
    let mut levels = [0u8; 8];
    if max < GROUP_MAX_EPS {
        return (0.0, levels);
    }
    let mse = |iscale: f32| -> f32 {
        codes_of(x, iscale, f32::NEG_INFINITY, NMAX)
            .zip(x.iter().zip(w))
            .map(|(l, (&v, &wt))| {
                let e = v - l / iscale;
                wt * e * e
            })
            .sum()
    };
    let mut iscale = NMAX / max;
    let mut best = mse(iscale);
    for k in [-4, -3, -2, -1, 1, 2, 3, 4] {
        let candidate = (NMAX + 0.1 * k as f32) / max;
        let err = mse(candidate);
        if err < best {
            (iscale, best) = (candidate, err);
        }
    }
    let (mut slx, mut sl2) = (0.0f32, 0.0f32);
    for ((lv, l), (&v, &wt)) in levels
        .iter_mut()
        .zip(codes_of(x, iscale, 0.0, NMAX))
        .zip(x.iter().zip(w))
    {
        *lv = l as u8;
        slx += wt * v * l;
        sl2 += wt * l * l;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (lv, (&v, &wt)) in levels.iter_mut().zip(x.iter().zip(w)) {
            let l = f32::from(*lv);
            let (rest_lx, rest_l2) = (slx - wt * v * l, sl2 - wt * l * l);
            if rest_lx <= 0.0 || rest_l2 <= 0.0 {
                continue;
            }
            let new = (v * rest_l2 / rest_lx).round().min(NMAX);
            if new == l {
                continue;
            }
            let (new_lx, new_l2) = (rest_lx + wt * v * new, rest_l2 + wt * new * new);
            // The fit's error is Σ w x² − slx² / sl2: keep the level if that ratio grows.
            if new_lx * new_lx * sl2 > slx * slx * new_l2 {
                (*lv, slx, sl2, changed) = (new as u8, new_lx, new_l2, true);
            }
        }
        if !changed {
            break;
        }
    }
    (if sl2 > 0.0 { slx / sl2 } else { 0.0 }, levels)
}

/// Scale of a group coded `ŵ = d · l`, `l ∈ [−nmax, nmax − 1]`, minimising
/// `Σ w (x − ŵ)²` (llama.cpp's `make_qx_quants` with weights): for each candidate inverse
/// scale `−(nmax + 0.1 k) / x*`, `k ∈ [−9, 9]` (`x*` the value of largest magnitude), the
/// weighted least-squares scale of its codes, keeping the one of least error.
fn fit_symmetric(x: &[f32], w: &[f32], nmax: f32) -> f32 {
    let extreme = signed_extreme(x);
    if extreme.abs() < GROUP_MAX_EPS {
        return 0.0;
    }
    let (mut scale, mut best) = (0.0f32, 0.0f32);
    for k in -9..=9 {
        let iscale = -(nmax + 0.1 * k as f32) / extreme;
        let (mut slx, mut sl2) = (0.0f32, 0.0f32);
        for (l, (&v, &wt)) in codes_of(x, iscale, -nmax, nmax - 1.0).zip(x.iter().zip(w)) {
            slx += wt * v * l;
            sl2 += wt * l * l;
        }
        // The least-squares error is Σ w x² − slx² / sl2: the largest ratio wins.
        if sl2 > 0.0 && slx * slx > best * sl2 {
            scale = slx / sl2;
            best = scale * slx;
        }
    }
    scale
}

impl BlockQ4K {
    /// The 4-bit code of value `l` of run `j`.
    #[inline(always)]
    pub fn code(&self, j: usize, l: usize) -> u8 {
        (self.qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0x0f
    }
}

/// Stores 4-bit code `q` of value `l` of run `j` in the `qs` of Q4_K (and Q5_K).
fn put_nibble(qs: &mut [u8; 128], j: usize, l: usize, q: u8) {
    qs[(j / 2) * 32 + l] |= (q & 0x0f) << (4 * (j % 2));
}

impl Block for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4K;

    fn dequantize(&self, out: &mut [f32]) {
        dequantize_q45_k(&self.head, out, |j, l| self.code(j, l))
    }
}

impl Quantize for BlockQ4K {
    fn quantize(&mut self, values: &[f32]) {
        let qs = &mut self.qs;
        quantize_q45_k(&mut self.head, values, 15.0, |j, l, q| {
            put_nibble(qs, j, l, q)
        })
    }

    /// llama.cpp's `quantize_row_q4_K_impl` (`quantize_q45_k_weighted`), with the
    /// weights `importance · sqrt(σ² + x²)` over the super-block.
    fn quantize_weighted(&mut self, values: &[f32], importance: &[f32]) {
        let w = importance_weights(values, importance);
        let fallback = plain_fit::<Self>(values);
        let qs = &mut self.qs;
        quantize_q45_k_weighted(&mut self.head, values, &w, 15.0, |j, l, q| {
            put_nibble(qs, j, l, q)
        });
        keep_better(self, fallback, values, importance);
    }
}

impl BlockQ5K {
    /// The 5-bit code of value `l` of run `j`.
    #[inline(always)]
    pub fn code(&self, j: usize, l: usize) -> u8 {
        let low = (self.qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0x0f;
        low | (((self.qh[l] >> j) & 1) << 4)
    }
}

impl Block for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5K;

    fn dequantize(&self, out: &mut [f32]) {
        dequantize_q45_k(&self.head, out, |j, l| self.code(j, l))
    }
}

impl Quantize for BlockQ5K {
    fn quantize(&mut self, values: &[f32]) {
        let (qs, qh) = (&mut self.qs, &mut self.qh);
        quantize_q45_k(&mut self.head, values, 31.0, |j, l, q| {
            put_nibble(qs, j, l, q);
            qh[l] |= (q >> 4) << j;
        })
    }

    /// llama.cpp's `quantize_row_q5_K_impl` (`quantize_q45_k_weighted`), with the
    /// weights `importance · sqrt(σ² + x²)` over the super-block.
    fn quantize_weighted(&mut self, values: &[f32], importance: &[f32]) {
        let w = importance_weights(values, importance);
        let fallback = plain_fit::<Self>(values);
        let (qs, qh) = (&mut self.qs, &mut self.qh);
        quantize_q45_k_weighted(&mut self.head, values, &w, 31.0, |j, l, q| {
            put_nibble(qs, j, l, q);
            qh[l] |= (q >> 4) << j;
        });
        keep_better(self, fallback, values, importance);
    }
}

impl BlockQ6K {
    /// The 32 unsigned 6-bit codes (offset 32 not subtracted) of run `r` (0..8), values
    /// `32r..32r + 32`: in halves of 128 values, run `t` of a half takes the low (`t < 2`)
    /// or high nibbles of 32 bytes of `ql` and bits `2t, 2t + 1` of 32 bytes of `qh`.
    #[inline(always)]
    pub fn run_codes(&self, r: usize, out: &mut [u8; 32]) {
        let (half, t) = (r / 4, r % 4);
        let ql = &self.ql[half * 64 + (t % 2) * 32..][..32];
        let qh = &self.qh[half * 32..][..32];
        for ((o, &lo), &hi) in out.iter_mut().zip(ql).zip(qh) {
            *o = ((lo >> (4 * (t / 2))) & 0x0f) | (((hi >> (2 * t)) & 3) << 4);
        }
    }
}

impl Block for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let mut codes = [0u8; 32];
        for (r, run) in out.chunks_exact_mut(32).enumerate() {
            self.run_codes(r, &mut codes);
            for (l, (o, &q)) in run.iter_mut().zip(&codes).enumerate() {
                let dl = d * self.scales[(32 * r + l) / 16] as f32;
                *o = dl * (q as i8 - 32) as f32;
            }
        }
    }
}

impl Quantize for BlockQ6K {
    /// Per 16 values the scale `w* / −32` of the value `w*` of largest magnitude, quantised
    /// to an i8 against the f16 `d` (a 127th of the largest).
    fn quantize(&mut self, values: &[f32]) {
        let mut scale = [0.0f32; 16];
        for (i, sub) in values.chunks_exact(16).enumerate() {
            let extreme = signed_extreme(sub);
            scale[i] = extreme / -32.0;
        }
        let d = f16::from_f32(scale.iter().fold(0.0f32, |a, s| a.max(s.abs())) / 127.0);
        let df = d.to_f32();
        let sc = scale.map(|s| level(s, df, -128.0, 127.0) as i8);
        self.store(values, d, sc);
    }

    /// llama.cpp's `quantize_row_q6_K_impl`: per 16 values the scale of `fit_symmetric`
    /// weighted by `importance` alone (as llama.cpp, without the `sqrt(σ² + x²)` factor),
    /// then the 16 scales quantised to i8 against the f16 `d` that gives the largest −128.
    fn quantize_weighted(&mut self, values: &[f32], importance: &[f32]) {
        let fallback = plain_fit::<Self>(values);
        let mut scale = [0.0f32; 16];
        for (s, (sub, w)) in scale
            .iter_mut()
            .zip(values.chunks_exact(16).zip(importance.chunks_exact(16)))
        {
            *s = fit_symmetric(sub, w, 32.0);
        }
        let extreme = signed_extreme(&scale);
        if extreme.abs() >= GROUP_MAX_EPS {
            let iscale = -128.0 / extreme;
            let sc = scale.map(|s| (iscale * s).round().clamp(-128.0, 127.0) as i8);
            self.store(values, f16::from_f32(1.0 / iscale), sc);
        }
        keep_better(self, fallback, values, importance);
    }
}

impl BlockQ6K {
    /// Stores `d`, the i8 scales `sc` (one per 16 values) and the codes of `values` they
    /// give.
    fn store(&mut self, values: &[f32], d: f16, sc: [i8; 16]) {
        self.d = F16Le::new(d);
        self.scales = sc;
        let d = d.to_f32();
        for (i, sub) in values.chunks_exact(16).enumerate() {
            let dl = d * sc[i] as f32;
            for (l16, &v) in sub.iter().enumerate() {
                let q = (level(v, dl, -32.0, 31.0) + 32.0) as u8;
                let e = i * 16 + l16;
                let (half, t, l) = (e / 128, (e % 128) / 32, e % 32);
                self.ql[half * 64 + (t % 2) * 32 + l] |= (q & 0x0f) << (4 * (t / 2));
                self.qh[half * 32 + l] |= (q >> 4) << (2 * t);
            }
        }
    }
}

impl Block for BlockIQ4NL {
    const TYPE: GgmlType = GgmlType::IQ4NL;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        nibbles32(&self.qs, out, |q| d * IQ4_LEVELS[q as usize] as f32)
    }
}

impl Block for BlockIQ4XS {
    const TYPE: GgmlType = GgmlType::IQ4XS;

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let scales_h = u16::from_le_bytes(self.scales_h);
        for (j, run) in out.chunks_exact_mut(32).enumerate() {
            let low = (self.scales_l[j / 2] >> (4 * (j % 2))) & 0x0f;
            let high = ((scales_h >> (2 * j)) & 0x03) as u8;
            let dl = d * (((low | (high << 4)) as i8) - 32) as f32;
            let qs = self.qs[j * 16..j * 16 + 16].try_into().expect("16 bytes");
            nibbles32(qs, run, |q| dl * IQ4_LEVELS[q as usize] as f32);
        }
    }
}

/// Trials of the IQ4 scale search either side of `−max / K[0]`: the `ntry` that
/// llama.cpp's `quantize_iq4_nl` and `quantize_iq4_xs` pass to `quantize_row_iq4_nl_impl`.
const IQ4_NTRY: i32 = 7;

/// ggml's `best_index_int8` over [`IQ4_LEVELS`]: the index of the level nearest `x`, the
/// upper of two equally near ones, found by ggml's bisection so that ties and NaN land
/// where ggml's do.
fn nearest_iq4(x: f32) -> u8 {
    let level = |i: usize| f32::from(IQ4_LEVELS[i]);
    if x <= level(0) {
        return 0;
    }
    if x >= level(15) {
        return 15;
    }
    let (mut lo, mut hi) = (0, 15);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < level(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - level(hi - 1) < level(hi) - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// The scale `d` of a run of 32 values coded `d · K[q]` (`K` = [`IQ4_LEVELS`]),
/// minimising `Σ w (x − d·K[q])²` as the per-block loop of llama.cpp's
/// `quantize_row_iq4_nl_impl` with `ntry = 7` finds it: the weighted least-squares scale
/// of the codes of `d = max / 127` (`max` the value of largest magnitude, the first of
/// equals), then of the codes of each inverse scale `(k − 127) / max`, `k ∈ [−7, 7]`,
/// keeping the one of least error. 0 for a run below ggml's `GROUP_MAX_EPS`.
fn fit_iq4_run(x: &[f32], w: &[f32]) -> f32 {
    let (amax, max) = x.iter().fold((0.0f32, 0.0f32), |(a, m), &v| {
        if v.abs() > a {
            (v.abs(), v)
        } else {
            (a, m)
        }
    });
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let k0 = f32::from(IQ4_LEVELS[0]);
    // `(Σ w·q·x, Σ w·q²)` of the codes of inverse scale `id`, summed in ggml's order.
    let sums = |id: f32| {
        x.iter()
            .zip(w)
            .fold((0.0f32, 0.0f32), |(sqx, sq2), (&v, &wt)| {
                let q = f32::from(IQ4_LEVELS[usize::from(nearest_iq4(id * v))]);
                (sqx + wt * q * v, sq2 + wt * q * q)
            })
    };
    let (sumqx, sumq2) = sums(1.0 / (-max / k0));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for k in -IQ4_NTRY..=IQ4_NTRY {
        let (sumqx, sumq2) = sums((k + i32::from(IQ4_LEVELS[0])) as f32 / max);
        // The least-squares error is Σ w x² − sumqx² / sumq2: the largest ratio wins.
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Stores the codes `nearest_iq4(id · x)` of 32 values `x` in `qs` (16 bytes) in
/// [`nibbles32`]'s order.
fn put_iq4_codes(x: &[f32], id: f32, qs: &mut [u8]) {
    let (lo, hi) = x.split_at(16);
    for (q, (&a, &b)) in qs.iter_mut().zip(lo.iter().zip(hi)) {
        *q = nearest_iq4(id * a) | (nearest_iq4(id * b) << 4);
    }
}

/// `1 / d`, 0 where `d` is 0 (ggml's `d ? 1/d : 0`).
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// The weights of llama.cpp's IQ4 fits without an imatrix: `x²`.
fn squares(x: &[f32]) -> Vec<f32> {
    x.iter().map(|v| v * v).collect()
}

impl BlockIQ4NL {
    /// llama.cpp's `quantize_row_iq4_nl_impl` for one block of 32 (`super_block_size =
    /// block_size = 32`, `ntry = 7`) with block weights `w`: the scale of [`fit_iq4_run`]
    /// stored as f16, the codes from its f32 inverse.
    fn fit(&mut self, values: &[f32], w: &[f32]) {
        let d = fit_iq4_run(values, w);
        self.d = F16Le::new(f16::from_f32(d));
        put_iq4_codes(values, inverse(d), &mut self.qs);
    }
}

impl Quantize for BlockIQ4NL {
    /// ggml's `quantize_iq4_nl` without an imatrix, as llama-quantize and
    /// `ggml_quantize_chunk` write IQ4_NL: `BlockIQ4NL::fit` with weights `x²` (not
    /// `quantize_row_iq4_nl_ref`, which skips the trial scales). Byte for byte ggml's
    /// (`core/tests/iq4_quant.rs`).
    fn quantize(&mut self, values: &[f32]) {
        self.fit(values, &squares(values));
    }

    /// ggml's `quantize_iq4_nl` with `quant_weights = importance`: `BlockIQ4NL::fit`
    /// with weights `importance · sqrt(σ² + x²)`, `σ² = 2 Σ x² / 32` over the block.
    /// llama.cpp's own result is kept (not `keep_better`'s choice against the plain
    /// fit), so that the bytes are ggml's.
    fn quantize_weighted(&mut self, values: &[f32], importance: &[f32]) {
        self.fit(values, &importance_weights(values, importance));
    }
}

impl BlockIQ4XS {
    /// llama.cpp's `quantize_row_iq4_nl_impl` for one super-block of 256 (`block_size =
    /// 32`, `ntry = 7`) with block weights `w`: each run's scale from [`fit_iq4_run`], then
    /// `d = −s* / 32` (`s*` the run scale of largest magnitude, the first of equals; so an
    /// all-zero super-block stores `d = −0`), each run's 6-bit level
    /// `clamp(round(s / d), −32, 31)` (ggml's `nearest_int`, ties to even) stored offset by
    /// 32, and the codes from the f32 run scale `d · level`.
    fn fit(&mut self, values: &[f32], w: &[f32]) {
        let mut scales = [0.0f32; 8];
        for (s, (run, rw)) in scales
            .iter_mut()
            .zip(values.chunks_exact(32).zip(w.chunks_exact(32)))
        {
            *s = fit_iq4_run(run, rw);
        }
        let (_, max_scale) = scales.iter().fold((0.0f32, 0.0f32), |(a, m), &s| {
            if s.abs() > a {
                (s.abs(), s)
            } else {
                (a, m)
            }
        });
        let d = -max_scale / 32.0;
        self.d = F16Le::new(f16::from_f32(d));
        let id = inverse(d);
        let mut scales_h = 0u16;
        self.scales_l = [0; 4];
        for (j, (&s, run)) in scales.iter().zip(values.chunks_exact(32)).enumerate() {
            let l = ((id * s).round_ties_even() as i32).clamp(-32, 31);
            put_iq4_codes(
                run,
                inverse(d * l as f32),
                &mut self.qs[16 * j..16 * j + 16],
            );
            let sc = (l + 32) as u8;
            self.scales_l[j / 2] |= (sc & 0x0f) << (4 * (j % 2));
            scales_h |= u16::from(sc >> 4) << (2 * j);
        }
        self.scales_h = scales_h.to_le_bytes();
    }
}

impl Quantize for BlockIQ4XS {
    /// ggml's `quantize_iq4_xs` without an imatrix (also its `quantize_row_iq4_xs_ref`):
    /// `BlockIQ4XS::fit` with weights `x²`. Byte for byte ggml's
    /// (`core/tests/iq4_quant.rs`).
    fn quantize(&mut self, values: &[f32]) {
        self.fit(values, &squares(values));
    }

    /// ggml's `quantize_iq4_xs` with `quant_weights = importance`: `BlockIQ4XS::fit`
    /// with weights `importance · sqrt(σ² + x²)`, `σ² = 2 Σ x² / 256` over the
    /// super-block. llama.cpp's own result is kept (not `keep_better`'s choice against
    /// the plain fit), so that the bytes are ggml's.
    fn quantize_weighted(&mut self, values: &[f32], importance: &[f32]) {
        self.fit(values, &importance_weights(values, importance));
    }
}

impl Block for BlockMXFP4 {
    const TYPE: GgmlType = GgmlType::MXFP4;

    fn dequantize(&self, out: &mut [f32]) {
        let d = e8m0_half(self.e);
        nibbles32(&self.qs, out, |q| d * MXFP4_LEVELS[q as usize] as f32)
    }
}

impl Quantize for BlockMXFP4 {
    /// ggml's `quantize_row_mxfp4_ref` (and gguf-py's `MXFP4.quantize_blocks`): the
    /// exponent `⌊log2 max|w|⌋ − 2 + 127` (0 for an all-zero block; the largest E2M1 value
    /// is 6 = 1.5·2²), then each value's nearest level, the first of equals. Importance is
    /// ignored, as llama.cpp does.
    fn quantize(&mut self, values: &[f32]) {
        let amax = values
            .iter()
            .fold(0.0f32, |m, v| if m < v.abs() { v.abs() } else { m });
        self.e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0) as u8
        } else {
            0
        };
        let d = e8m0_half(self.e);
        let nearest = |x: f32| {
            let err = |i: usize| (MXFP4_LEVELS[i] as f32 * d - x).abs();
            (1..16).fold(0, |best, i| if err(i) < err(best) { i } else { best }) as u8
        };
        for (j, q) in self.qs.iter_mut().enumerate() {
            *q = nearest(values[j]) | (nearest(values[j + 16]) << 4);
        }
    }
}

/// Decodes a row of `dst.len()` values of the ggml type `ty` from `src`
/// (`dst.len().div_ceil(ty.block_len())` blocks; the values of the last block past
/// `dst.len()` are dropped). The math is gguf-py's, operation for operation.
///
/// # Panics
/// If `src` holds fewer blocks: callers size it from [`GgmlType::byte_len`] or
/// [`crate::quant::row_bytes`].
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    match ty {
        GgmlType::Q4_0 => dequantize_row::<BlockQ4_0>(src, dst),
        GgmlType::Q4_1 => dequantize_row::<BlockQ4_1>(src, dst),
        GgmlType::Q5_0 => dequantize_row::<BlockQ5_0>(src, dst),
        GgmlType::Q5_1 => dequantize_row::<BlockQ5_1>(src, dst),
        GgmlType::Q8_0 => dequantize_row::<BlockQ8_0>(src, dst),
        GgmlType::Q2K => dequantize_row::<BlockQ2K>(src, dst),
        GgmlType::Q3K => dequantize_row::<BlockQ3K>(src, dst),
        GgmlType::Q4K => dequantize_row::<BlockQ4K>(src, dst),
        GgmlType::Q5K => dequantize_row::<BlockQ5K>(src, dst),
        GgmlType::Q6K => dequantize_row::<BlockQ6K>(src, dst),
        GgmlType::IQ4NL => dequantize_row::<BlockIQ4NL>(src, dst),
        GgmlType::IQ4XS => dequantize_row::<BlockIQ4XS>(src, dst),
        GgmlType::MXFP4 => dequantize_row::<BlockMXFP4>(src, dst),
    }
}

/// Codes a row of `src.len()` values into blocks of the ggml type `ty` (`dst`, whole
/// blocks, the last padded with zeros): Q5_0 and Q8_0 as ggml's `quantize_row_q5_0_ref` and
/// `quantize_row_q8_0_ref`, MXFP4 as
/// its `quantize_row_mxfp4_ref`, IQ4_NL and IQ4_XS as its `quantize_iq4_nl` and
/// `quantize_iq4_xs` without an imatrix (what llama-quantize writes), the K-quants with the
/// min/max fit of [`crate::kquant`].
///
/// # Panics
/// For a type flm reads but does not write (the [`crate::DataType::ggml_type`] of no
/// dtype).
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    quantize_weighted(ty, src, None, dst)
}

/// As [`quantize`], each block fitted to minimise its squared error weighted by
/// `importance` where given (one non-negative weight per value of `src`; see
/// [`Quantize::quantize_weighted`] of each block, and
/// [`crate::quant::quantize_row_weighted`] for the math): Q4_K, Q5_K and Q6_K as
/// llama.cpp's `quantize_row_q4_K_impl`, `quantize_row_q5_K_impl` and
/// `quantize_row_q6_K_impl` and Q5_0 with a finer `quantize_row_q5_0_impl` search, each
/// block kept only if it beats the plain fit's importance-weighted error; IQ4_NL and
/// IQ4_XS as ggml's `quantize_iq4_nl` and `quantize_iq4_xs` with `quant_weights = importance`, byte for byte (llama.cpp's result
/// kept, not compared with the plain fit); Q8_0 and MXFP4 ignore importance, as ggml does.
/// `None` gives [`quantize`]'s bytes.
///
/// # Panics
/// As [`quantize`], and if `importance` is not of `src.len()` values.
pub fn quantize_weighted(ty: GgmlType, src: &[f32], importance: Option<&[f32]>, dst: &mut [u8]) {
    match ty {
        GgmlType::Q5_0 => quantize_row_weighted::<BlockQ5_0>(src, importance, dst),
        GgmlType::Q8_0 => quantize_row_weighted::<BlockQ8_0>(src, importance, dst),
        GgmlType::Q4K => quantize_row_weighted::<BlockQ4K>(src, importance, dst),
        GgmlType::Q5K => quantize_row_weighted::<BlockQ5K>(src, importance, dst),
        GgmlType::Q6K => quantize_row_weighted::<BlockQ6K>(src, importance, dst),
        GgmlType::IQ4NL => quantize_row_weighted::<BlockIQ4NL>(src, importance, dst),
        GgmlType::IQ4XS => quantize_row_weighted::<BlockIQ4XS>(src, importance, dst),
        GgmlType::MXFP4 => quantize_row_weighted::<BlockMXFP4>(src, importance, dst),
        _ => panic!("flm does not write {} blocks", ty.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's `best_index_int8`: clamped at the ends, the upper of two equally near levels,
    /// NaN to the last.
    #[test]
    fn nearest_iq4_is_ggmls_best_index_int8() {
        for (i, &k) in IQ4_LEVELS.iter().enumerate() {
            assert_eq!(usize::from(nearest_iq4(f32::from(k))), i);
        }
        assert_eq!(nearest_iq4(-1000.0), 0);
        assert_eq!(nearest_iq4(f32::INFINITY), 15);
        assert_eq!(nearest_iq4(f32::NAN), 15);
        // Halfway between −10 and 1, and between 1 and 13.
        assert_eq!(nearest_iq4(-4.5), 8);
        assert_eq!(nearest_iq4(7.0), 9);
        assert_eq!(nearest_iq4(6.99), 8);
    }
}
