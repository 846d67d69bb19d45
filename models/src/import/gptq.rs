//! The GPTQ packed layout of AutoGPTQ and GPTQModel (`QuantLinear.pack`,
//! `dequantize_weight`), for `b`-bit codes (`b` = 4 or 8) and `p = 32 / b` codes per int32
//! word:
//!
//! - `qweight [in / p, out]` int32: the code of input channel `c`, output channel `o` is bits
//!   `b·(c mod p)` to `b·(c mod p) + b` of word `[c / p, o]` (packed along the input);
//! - `qzeros [groups, out / p]` int32: the zero point of group `g`, output channel `o`, in
//!   bits `b·(o mod p)` of word `[g, o / p]` (packed along the output). The `gptq` (v1)
//!   checkpoint format stores each word minus `0x11111111` (`0x01010101` at 8 bits),
//!   subtracted as one 32-bit integer so that a zero point of 0 borrows from its neighbour;
//!   reading adds it back the same way (GPTQModel's `convert_gptq_v1_to_v2_format_module`).
//!   `gptq_v2` stores the zero points as they are.
//! - `scales [groups, out]` f16 and `g_idx [in]` int32 (the group of each input channel;
//!   absent in old checkpoints without act-order, where it is `c / group_size`).
//!
//! The weight is `w[o, c] = scales[g, o] · (q[c, o] − zeros[g, o])` with `g = g_idx[c]`.

use super::packed::{matrix, Geometry};

/// The shape of a GPTQ linear from its stored tensors' shapes: `in` from `g_idx` when
/// present, else the rows of `qweight` times the codes per word.
///
/// Errors: a message naming the shapes that disagree.
pub(super) fn geometry(
    bits: u32,
    qweight: &[usize],
    qzeros: &[usize],
    scales: &[usize],
    g_idx: Option<usize>,
) -> Result<Geometry, String> {
    let per_word = (32 / bits) as usize;
    let [rows, out] = matrix("qweight", qweight)?;
    let [groups, zero_cols] = matrix("qzeros", qzeros)?;
    let [scale_groups, scale_out] = matrix("scales", scales)?;
    let inputs = g_idx.unwrap_or(rows * per_word);
    if rows != inputs.div_ceil(per_word)
        || scale_out != out
        || scale_groups != groups
        || zero_cols != out.div_ceil(per_word)
        || groups == 0
    {
        return Err(format!(
            "qweight {qweight:?}, qzeros {qzeros:?}, scales {scales:?} and g_idx of {inputs} \
             channels disagree for {bits}-bit GPTQ"
        ));
    }
    Ok(Geometry {
        inputs,
        outputs: out,
        groups,
    })
}

/// The codes of output channel `o` (one per input channel, into `out`) from `qweight`
/// (int32 words, row-major `[in / p, out]`).
pub(super) fn row_codes(bits: u32, words: &[u32], g: &Geometry, o: usize, out: &mut [u8]) {
    let (per_word, mask) = ((32 / bits) as usize, (1u32 << bits) - 1);
    for (c, code) in out.iter_mut().enumerate() {
        let word = words[(c / per_word) * g.outputs + o];
        *code = ((word >> (bits as usize * (c % per_word))) & mask) as u8;
    }
}

/// The zero points `[groups][out]` of `qzeros` (int32 words, row-major
/// `[groups, out / p]`), with the v1 format's offset undone when `v1`.
pub(super) fn zeros(bits: u32, words: &[u32], g: &Geometry, v1: bool) -> Vec<u8> {
    let (per_word, mask) = ((32 / bits) as usize, (1u32 << bits) - 1);
    let offset = if !v1 {
        0
    } else if bits == 8 {
        0x0101_0101
    } else {
        0x1111_1111
    };
    let cols = g.outputs.div_ceil(per_word);
    (0..g.groups * g.outputs)
        .map(|i| {
            let (group, o) = (i / g.outputs, i % g.outputs);
            let word = words[group * cols + o / per_word].wrapping_add(offset);
            ((word >> (bits as usize * (o % per_word))) & mask) as u8
        })
        .collect()
}
