//! ggml's weight types decoded by `flm_core::blocks` against gguf-py's reference
//! dequantisers: the blocks and values of `tests/data/gguf/quants/` were written by
//! `tools/gguf/make_quant_tests.py` with `gguf.quants` (tests/data/gguf/SOURCES.md).
//! Every value must agree bit for bit.

use std::path::PathBuf;

use flm_core::blocks;
use flm_core::ggml::GgmlType;
use flm_core::quant::{self, dequantize_row, row_bytes};

const ROWS: usize = 8;
const COLS: usize = 512;

fn read(name: &str) -> Vec<u8> {
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/data/gguf/quants"
    ))
    .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The blocks of `ty` and gguf-py's values for them, as f32 bit patterns.
fn case(ty: GgmlType) -> (Vec<u8>, Vec<u32>) {
    let blocks = read(&format!("{}.bin", ty.name()));
    let values = read(&format!("{}.f32", ty.name()));
    let bits = values
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect::<Vec<_>>();
    assert_eq!(
        blocks.len(),
        ty.byte_len(ROWS * COLS).unwrap(),
        "{}",
        ty.name()
    );
    assert_eq!(bits.len(), ROWS * COLS);
    (blocks, bits)
}

fn first_difference(ty: GgmlType, got: &[f32], want: &[u32]) -> Option<String> {
    let i = got.iter().zip(want).position(|(g, w)| g.to_bits() != *w)?;
    Some(format!(
        "{}: value {i} (row {}, column {}) is {} ({:#010x}), gguf-py gives {} ({:#010x})",
        ty.name(),
        i / COLS,
        i % COLS,
        got[i],
        got[i].to_bits(),
        f32::from_bits(want[i]),
        want[i]
    ))
}

/// Also from an odd address: blocks are read in place wherever a file puts them.
#[test]
fn every_type_dequantises_as_gguf_py_bit_for_bit() {
    let mut failures = Vec::new();
    for ty in GgmlType::ALL {
        let (blocks, want) = case(ty);
        let mut shifted = vec![0u8; blocks.len() + 1];
        shifted[1..].copy_from_slice(&blocks);
        for src in [&blocks[..], &shifted[1..]] {
            let mut got = vec![f32::NAN; ROWS * COLS];
            blocks::dequantize(ty, src, &mut got);
            failures.extend(first_difference(ty, &got, &want));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn q4_0_and_q4_1_repack_into_flm_int4_without_changing_a_bit() {
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1] {
        let dtype = ty.lossless_dtype().unwrap();
        let (blocks, want) = case(ty);
        let (src_row, dst_row) = (ty.byte_len(COLS).unwrap(), row_bytes(dtype, COLS).unwrap());
        let mut got = vec![f32::NAN; ROWS * COLS];
        for (src, out) in blocks.chunks_exact(src_row).zip(got.chunks_exact_mut(COLS)) {
            let mut row = vec![0xAAu8; dst_row];
            quant::repack_ggml_row(ty, src, &mut row);
            dequantize_row(dtype, &row, out);
        }
        // The same values; Q4_0's zeros may differ in sign only (`repack_ggml_row`'s docs), so
        // they compare as numbers, not bits.
        let want: Vec<f32> = want.iter().map(|&b| f32::from_bits(b)).collect();
        if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
            panic!(
                "{dtype} from {}: value {i} is {}, gguf-py gives {}",
                ty.name(),
                got[i],
                want[i]
            );
        }
        if ty == GgmlType::Q4_1 {
            let bits: Vec<u32> = want.iter().map(|w| w.to_bits()).collect();
            assert_eq!(
                first_difference(ty, &got, &bits),
                None,
                "Q4_1 keeps every bit"
            );
        }
    }
}

/// The K-quants, Q5_0, Q8_0, the IQ4 types and MXFP4 are flm dtypes of the same bytes: their rows
/// dequantise as gguf-py's bit for bit, the rows themselves unchanged.
#[test]
fn native_types_are_flm_dtypes_of_the_same_bytes() {
    let native: Vec<GgmlType> = GgmlType::ALL
        .into_iter()
        .filter(|t| t.native_dtype().is_some())
        .collect();
    let names: Vec<&str> = native.iter().map(|t| t.name()).collect();
    assert_eq!(
        names,
        ["Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"]
    );
    for ty in native {
        let dtype = ty.native_dtype().unwrap();
        assert_eq!(dtype.ggml_type(), Some(ty));
        let (blocks, want) = case(ty);
        let row = row_bytes(dtype, COLS).unwrap();
        assert_eq!(row, ty.byte_len(COLS).unwrap(), "{dtype}");
        let mut got = vec![f32::NAN; ROWS * COLS];
        for (src, out) in blocks.chunks_exact(row).zip(got.chunks_exact_mut(COLS)) {
            dequantize_row(dtype, src, out);
        }
        assert_eq!(first_difference(ty, &got, &want), None);
        // A row shorter than its super-blocks: the leading values of the same decoding.
        let mut short = vec![f32::NAN; COLS - 100];
        dequantize_row(dtype, &blocks[..row], &mut short);
        let bits: Vec<u32> = short.iter().map(|v| v.to_bits()).collect();
        assert_eq!(bits, want[..COLS - 100], "{dtype}: short row");
    }
}

/// flm's MXFP4 and Q5_0 quantisers write the blocks gguf-py's `quantize_blocks` (ggml's
/// `quantize_row_mxfp4_ref` and `quantize_row_q5_0_ref`) wrote from the same weights, byte
/// for byte.
#[test]
fn mxfp4_and_q5_0_quantise_as_gguf_py() {
    let weights: Vec<f32> = read("weights.f32")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    for ty in [GgmlType::MXFP4, GgmlType::Q5_0] {
        let (want, _) = case(ty);
        let mut got = vec![0u8; want.len()];
        let row = want.len() / ROWS;
        for (w, out) in weights.chunks_exact(COLS).zip(got.chunks_exact_mut(row)) {
            blocks::quantize(ty, w, out);
        }
        let first = got.iter().zip(&want).position(|(g, w)| g != w);
        assert_eq!(
            first,
            None,
            "{}: first differing byte of {}",
            ty.name(),
            want.len()
        );
    }
}

#[test]
fn type_numbers_and_sizes_are_ggmls() {
    // ggml.h `ggml_type` and gguf-py's GGML_QUANT_SIZES (values per block, bytes).
    let table: Vec<(u32, &str, usize, usize)> = GgmlType::ALL
        .iter()
        .map(|&t| (t as u32, t.name(), t.block_len(), t.block_bytes()))
        .collect();
    assert_eq!(
        table,
        [
            (2, "Q4_0", 32, 18),
            (3, "Q4_1", 32, 20),
            (6, "Q5_0", 32, 22),
            (7, "Q5_1", 32, 24),
            (8, "Q8_0", 32, 34),
            (10, "Q2_K", 256, 84),
            (11, "Q3_K", 256, 110),
            (12, "Q4_K", 256, 144),
            (13, "Q5_K", 256, 176),
            (14, "Q6_K", 256, 210),
            (20, "IQ4_NL", 32, 18),
            (23, "IQ4_XS", 256, 136),
            (39, "MXFP4", 32, 17),
        ]
    );
    assert_eq!(GgmlType::from_id(1), None);
    assert_eq!(GgmlType::from_id(12), Some(GgmlType::Q4K));
    assert_eq!(GgmlType::Q4K.byte_len(300), None);
}
