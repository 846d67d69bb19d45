//! The AWQ GEMM packed layout of AutoAWQ (`WQLinear_GEMM.from_linear`; unpacked by its
//! `packing_utils.dequantize_gemm`), 4-bit codes, 8 per int32 word, packed along the output
//! dimension in AWQ's interleaved order:
//!
//! - `qweight [in, out / 8]` int32: bits `4i` to `4i + 4` of word `[c, k]` hold the code of
//!   output channel `8k + ORDER[i]`, `ORDER = (0, 2, 4, 6, 1, 3, 5, 7)`;
//! - `qzeros [groups, out / 8]` int32, packed the same way, the zero points as they are;
//! - `scales [groups, out]` f16; group `g` holds input channels `g·G` to `g·G + G`.
//!
//! The weight is `w[o, c] = scales[g, o] · (q[c, o] − zeros[g, o])` with `g = c / G`.

use super::packed::{matrix, Geometry};

/// Where output channel `8k + j` sits in word `k`: nibble `REVERSE_ORDER[j]` (the inverse
/// of AWQ's packing order, AutoAWQ's `AWQ_REVERSE_ORDER`).
const REVERSE_ORDER: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// The shape of an AWQ linear from its stored tensors' shapes.
///
/// Errors: a message naming the shapes that disagree.
pub(super) fn geometry(
    qweight: &[usize],
    qzeros: &[usize],
    scales: &[usize],
) -> Result<Geometry, String> {
    let [inputs, cols] = matrix("qweight", qweight)?;
    let [groups, zero_cols] = matrix("qzeros", qzeros)?;
    let [scale_groups, outputs] = matrix("scales", scales)?;
    if cols * 8 != outputs || zero_cols != cols || scale_groups != groups || groups == 0 {
        return Err(format!(
            "qweight {qweight:?}, qzeros {qzeros:?} and scales {scales:?} disagree for AWQ"
        ));
    }
    Ok(Geometry {
        inputs,
        outputs,
        groups,
    })
}

/// The 4-bit value of output channel `o` in row `row` of a `[rows, out / 8]` word matrix.
fn nibble(words: &[u32], cols: usize, row: usize, o: usize) -> u8 {
    ((words[row * cols + o / 8] >> (4 * REVERSE_ORDER[o % 8])) & 0x0f) as u8
}

/// The codes of output channel `o` (one per input channel, into `out`) from `qweight`.
pub(super) fn row_codes(words: &[u32], g: &Geometry, o: usize, out: &mut [u8]) {
    for (c, code) in out.iter_mut().enumerate() {
        *code = nibble(words, g.outputs / 8, c, o);
    }
}

/// The zero points `[groups][out]` of `qzeros`.
pub(super) fn zeros(words: &[u32], g: &Geometry) -> Vec<u8> {
    let cols = g.outputs / 8;
    (0..g.groups * g.outputs)
        .map(|i| nibble(words, cols, i / g.outputs, i % g.outputs))
        .collect()
}
