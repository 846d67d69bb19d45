//! flm's IQ4_NL and IQ4_XS quantisers (`flm_core::blocks::quantize_weighted`) against
//! ggml's own: the blocks of `tests/data/gguf/iq4/` were written by ggml 0.25.3's
//! `ggml_quantize_chunk` (`quantize_iq4_nl`, `quantize_iq4_xs`) from
//! `tests/data/gguf/quants/weights.f32`, without and with the importance of
//! `importance.f32`, by `tools/gguf/make_iq4_tests.c` (tests/data/gguf/SOURCES.md). Every
//! byte must agree.

use std::path::PathBuf;

use flm_core::blocks;
use flm_core::ggml::GgmlType;

const ROWS: usize = 8;
const COLS: usize = 512;
/// The length of the short rows, which are not whole blocks of either type.
const SHORT: usize = 300;

fn read(dir: &str, name: &str) -> Vec<u8> {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/gguf"))
        .join(dir)
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The 8 rows of 512 weights and the 512 per-column importances ggml quantised.
fn inputs() -> (Vec<f32>, Vec<f32>) {
    let weights = floats(&read("quants", "weights.f32"));
    let importance = floats(&read("iq4", "importance.f32"));
    assert_eq!((weights.len(), importance.len()), (ROWS * COLS, COLS));
    (weights, importance)
}

/// ggml's blocks of `ty` from the case `suffix` ("", "-imatrix", "-short", ...).
fn ggml_blocks(ty: GgmlType, suffix: &str) -> Vec<u8> {
    read("iq4", &format!("{}{suffix}.bin", ty.name().to_lowercase()))
}

/// Quantises the first `cols` values of each row with flm, with the first `cols`
/// importances where `weighted`.
fn flm_blocks(ty: GgmlType, cols: usize, weighted: bool) -> Vec<u8> {
    let (weights, importance) = inputs();
    let row = cols.div_ceil(ty.block_len()) * ty.block_bytes();
    let mut out = vec![0xAAu8; ROWS * row];
    for (w, dst) in weights.chunks_exact(COLS).zip(out.chunks_exact_mut(row)) {
        let imp = weighted.then(|| &importance[..cols]);
        blocks::quantize_weighted(ty, &w[..cols], imp, dst);
    }
    out
}

/// `None` where `got` is `want`; else where they first differ (byte, row, block, offset in
/// the block) and the two blocks there.
fn first_difference(ty: GgmlType, got: &[u8], want: &[u8]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} bytes, ggml wrote {}", got.len(), want.len()));
    }
    let i = got.iter().zip(want).position(|(g, w)| g != w)?;
    let (bb, row) = (ty.block_bytes(), want.len() / ROWS);
    let block = i / bb;
    Some(format!(
        "byte {i} (row {}, block {}, offset {}) is {:#04x}, ggml wrote {:#04x}\n flm:  {:02x?}\n ggml: {:02x?}",
        i / row,
        (i % row) / bb,
        i % bb,
        got[i],
        want[i],
        &got[block * bb..][..bb],
        &want[block * bb..][..bb]
    ))
}

fn check(cols: usize, weighted: bool, suffix: &str) {
    let failures: Vec<String> = [GgmlType::IQ4NL, GgmlType::IQ4XS]
        .into_iter()
        .filter_map(|ty| {
            let got = flm_blocks(ty, cols, weighted);
            first_difference(ty, &got, &ggml_blocks(ty, suffix))
                .map(|d| format!("{}{suffix}: {d}", ty.name()))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn iq4_without_importance_is_ggmls_byte_for_byte() {
    check(COLS, false, "");
}

#[test]
fn iq4_with_importance_is_ggmls_byte_for_byte() {
    check(COLS, true, "-imatrix");
}

/// A row that is not whole blocks: its last block padded with zero values of zero
/// importance (`blocks::quantize_row_weighted`), ggml's bytes of the zero-padded row.
#[test]
fn short_rows_are_ggmls_of_the_zero_padded_row() {
    check(SHORT, false, "-short");
    check(SHORT, true, "-short-imatrix");
}

/// The round trip stays near the weights: `|x − x̂|` within a scale step of the block.
#[test]
fn iq4_round_trip_is_close() {
    let (weights, importance) = inputs();
    for ty in [GgmlType::IQ4NL, GgmlType::IQ4XS] {
        for weighted in [false, true] {
            let bytes = flm_blocks(ty, COLS, weighted);
            let mut back = vec![f32::NAN; ROWS * COLS];
            for (src, out) in bytes
                .chunks_exact(bytes.len() / ROWS)
                .zip(back.chunks_exact_mut(COLS))
            {
                blocks::dequantize(ty, src, out);
            }
            for (r, (w, b)) in weights
                .chunks_exact(COLS)
                .zip(back.chunks_exact(COLS))
                .enumerate()
            {
                let amax = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                for (j, (&x, &y)) in w.iter().zip(b).enumerate() {
                    // A column of zero importance may be coded anywhere in its block's range.
                    let bound = if weighted && importance[j] == 0.0 {
                        2.0 * amax
                    } else {
                        0.3 * amax
                    };
                    assert!(
                        (x - y).abs() <= bound,
                        "{} weighted={weighted} row {r} column {j}: {x} coded {y}",
                        ty.name()
                    );
                }
            }
        }
    }
}
