//! Importance-weighted quantisation (`quant::quantize_row_weighted`, `Data::to_dtype_weighted`):
//! without importance the bytes are those flm wrote before it existed; with skewed importance
//! the importance-weighted squared error drops for every quantised dtype that uses it (all but
//! Q8_0 and MXFP4, which ignore it as ggml does).

use flm_core::quant::{dequantize_row, quantize_row, quantize_row_weighted, row_bytes};
use flm_core::{Data, DataType, Error};

/// splitmix64: a fixed pseudo-random stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `(0, 1)`.
    fn uniform(&mut self) -> f32 {
        ((self.next() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }

    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
}

/// A row of `n` values: normal, its scale varying along the row, with a few outliers.
fn row(rng: &mut Rng, n: usize) -> Vec<f32> {
    let base = (rng.normal() * 1.5).exp() * 0.05;
    (0..n)
        .map(|i| {
            let local = base * (1.0 + 0.8 * ((i / 64) as f32 * 0.7).sin());
            let outlier = if rng.uniform() < 0.01 { 8.0 } else { 1.0 };
            rng.normal() * local * outlier
        })
        .collect()
}

/// FNV-1a of `bytes`, continuing from `h`.
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn quantized_dtypes() -> impl Iterator<Item = DataType> {
    DataType::VALUES.into_iter().filter(|d| d.is_quantized())
}

/// The hash of every quantised dtype's bytes for a fixed set of rows.
fn hashes(quantize: impl Fn(DataType, &[f32], &mut [u8])) -> Vec<(DataType, u64)> {
    quantized_dtypes()
        .map(|dtype| {
            let mut rng = Rng(42);
            let mut h = 0xcbf2_9ce4_8422_2325;
            for cols in [1, 17, 32, 100, 256, 300, 1000, 2048] {
                for _ in 0..4 {
                    let w = row(&mut rng, cols);
                    let mut dst = vec![0u8; row_bytes(dtype, cols).unwrap()];
                    quantize(dtype, &w, &mut dst);
                    h = fnv(h, &dst);
                }
            }
            for w in [vec![0.0; 300], vec![0.37; 300], vec![-1.5; 64]] {
                let mut dst = vec![0u8; row_bytes(dtype, w.len()).unwrap()];
                quantize(dtype, &w, &mut dst);
                h = fnv(h, &dst);
            }
            (dtype, h)
        })
        .collect()
}

/// [`hashes`] of `quantize_row` as it was before importance existed (commit 66319a6); for
/// IQ4_NL, IQ4_XS, MXFP4 and Q5_0, written since, their bytes as first written (ggml's and
/// gguf-py's, checked in `iq4_quant.rs` and `ggml.rs`).
const GOLDEN: [(DataType, u64); 18] = [
    (DataType::I8, 0x22a4162fe4cd139c),
    (DataType::I4G32, 0x523d3322cd1c02a4),
    (DataType::I4G64, 0xce4e10c94ec7e589),
    (DataType::I4G128, 0xb5d188e6a09e1ec4),
    (DataType::I4SymG32, 0x61690e61e8c1835e),
    (DataType::I4SymG64, 0xd8eee34da21f3563),
    (DataType::I4SymG128, 0x85e6c18bae14e4c7),
    (DataType::Q4K, 0xf0d65cfae76d0fd7),
    (DataType::Q5K, 0xcf9df23212ed4a86),
    (DataType::Q6K, 0x5e93628fd974ea78),
    (DataType::Q8_0, 0xb58a6ed36a0ae8c4),
    (DataType::I4ZpG32, 0x8fd27ebabf8af086),
    (DataType::I4ZpG64, 0x3d537841d70abd81),
    (DataType::I4ZpG128, 0xea92438c0a305f92),
    (DataType::IQ4NL, 0x0519c8550b84da33),
    (DataType::IQ4XS, 0x6674b1311300df54),
    (DataType::MXFP4, 0x57e29358e277960a),
    (DataType::Q5_0, 0x7bce1949d26b732c),
];

#[test]
fn without_importance_the_bytes_are_unchanged() {
    assert_eq!(hashes(quantize_row), GOLDEN);
    let unweighted =
        |d: DataType, s: &[f32], dst: &mut [u8]| quantize_row_weighted(d, s, None, dst);
    assert_eq!(hashes(unweighted), GOLDEN);
}

/// `Σ importance · (x − x̂)²` of `dtype`'s round trip of `w`, quantised with `weights`.
fn weighted_error(dtype: DataType, w: &[f32], importance: &[f32], weights: Option<&[f32]>) -> f64 {
    let mut bytes = vec![0u8; row_bytes(dtype, w.len()).unwrap()];
    quantize_row_weighted(dtype, w, weights, &mut bytes);
    let mut back = vec![0.0; w.len()];
    dequantize_row(dtype, &bytes, &mut back);
    w.iter()
        .zip(&back)
        .zip(importance)
        .map(|((&x, &y), &imp)| f64::from(imp) * f64::from(x - y).powi(2))
        .sum()
}

/// Per quantised dtype, the ratio of the `importance`-weighted squared error quantising with
/// `importance` to that quantising without, summed over `ROWS` rows of `COLS` values.
fn ratios(importance: impl Fn(&mut Rng) -> f32) -> Vec<(DataType, f64)> {
    const ROWS: usize = 24;
    const COLS: usize = 2304;
    let mut rng = Rng(7);
    let imp: Vec<f32> = (0..COLS).map(|_| importance(&mut rng)).collect();
    let rows: Vec<Vec<f32>> = (0..ROWS).map(|_| row(&mut rng, COLS)).collect();
    quantized_dtypes()
        .map(|dtype| {
            let (mut with, mut without) = (0.0, 0.0);
            for w in &rows {
                with += weighted_error(dtype, w, &imp, Some(&imp));
                without += weighted_error(dtype, w, &imp, None);
            }
            println!(
                "{dtype:>14}: weighted / unweighted error {:.4}",
                with / without
            );
            (dtype, with / without)
        })
        .collect()
}

#[test]
fn skewed_importance_lowers_the_weighted_error() {
    // Log-normal importance, as calibration activations' mean squares spread.
    for (dtype, ratio) in ratios(|rng| (1.5 * rng.normal()).exp()) {
        if matches!(dtype, DataType::Q8_0 | DataType::MXFP4) {
            assert_eq!(ratio, 1.0, "{dtype} ignores importance, as ggml does");
        } else {
            assert!(ratio < 1.0, "{dtype}: ratio {ratio}");
        }
    }
}

/// Guaranteed where a group keeps the better of its two fits; IQ4_NL and IQ4_XS keep
/// ggml's weighted fit as it is, which on these rows does better (ratios 0.96, 0.97).
#[test]
fn uniform_importance_is_no_worse() {
    for (dtype, ratio) in ratios(|_| 1.0) {
        assert!(ratio <= 1.0, "{dtype}: ratio {ratio}");
    }
}

#[test]
fn to_dtype_weighted_quantises_rows_with_the_importance() {
    let mut rng = Rng(3);
    let (rows, cols) = (5, 300);
    let values: Vec<f32> = (0..rows).flat_map(|_| row(&mut rng, cols)).collect();
    let imp: Vec<f32> = (0..cols).map(|_| (rng.normal()).exp()).collect();
    let data = Data::from_f32(&[rows, cols], &values).unwrap();
    for dtype in DataType::VALUES {
        let got = data.to_dtype_weighted(dtype, &imp).unwrap();
        assert_eq!((got.dtype(), got.shape()), (dtype, &[rows, cols][..]));
        if !dtype.is_quantized() {
            let want = data.to_dtype(dtype).unwrap();
            assert_eq!(got.bytes().unwrap(), want.bytes().unwrap(), "{dtype}");
            continue;
        }
        let rb = row_bytes(dtype, cols).unwrap();
        for (r, w) in values.chunks(cols).enumerate() {
            let mut want = vec![0u8; rb];
            quantize_row_weighted(dtype, w, Some(&imp), &mut want);
            assert_eq!(
                &got.bytes().unwrap()[r * rb..][..rb],
                &want[..],
                "{dtype} row {r}"
            );
        }
    }
}

#[test]
fn to_dtype_weighted_rejects_bad_importance_and_shapes() {
    let data = Data::from_f32(&[2, 4], &[1.0, -2.0, 0.5, 3.0, 0.0, 1.0, 2.0, -1.0]).unwrap();
    for imp in [
        vec![1.0; 3],
        vec![1.0; 5],
        vec![1.0, -0.5, 1.0, 1.0],
        vec![1.0, f32::NAN, 1.0, 1.0],
        vec![f32::INFINITY, 1.0, 1.0, 1.0],
    ] {
        let err = data.to_dtype_weighted(DataType::I4G32, &imp).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{imp:?}: {err}");
    }
    for shape in [&[8][..], &[2, 2, 2]] {
        let d = Data::from_f32(shape, &[1.0; 8]).unwrap();
        let err = d.to_dtype_weighted(DataType::I8, &[1.0; 2]).unwrap_err();
        assert!(matches!(err, Error::Shape { .. }), "{shape:?}: {err}");
    }
    // Zero importance is valid: such columns simply do not count.
    assert!(data.to_dtype_weighted(DataType::Q4K, &[0.0; 4]).is_ok());
}
