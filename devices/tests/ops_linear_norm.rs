//! `Op::Linear` (as `torch.nn.Linear`) and `Op::RmsNorm` (Zhang & Sennrich 2019) on the CPU
//! device against naive f64 formulas, for f32, f16 and bf16 weights.

#[macro_use]
mod common;

use common::*;
use flm_core::{Data, DataType, Error, Op};
use flm_devices::cpu::PARALLEL_MIN_WORK;
use rand::rngs::StdRng;

/// `y[i, j] = Σ_c x[i, c]·w[j, c] + b[j]` in f64, with the tolerance `DOT_REL·Σ|x·w|` (see
/// [`DOT_REL`]) plus one f32 rounding of the bias add.
fn linear_reference(
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    (n, k, m): (usize, usize, usize),
) -> (Vec<f64>, Vec<f64>) {
    let (mut want, mut tol) = (vec![0.0; n * m], vec![0.0; n * m]);
    for i in 0..n {
        for j in 0..m {
            let (mut sum, mut mag) = (0.0f64, 0.0f64);
            for c in 0..k {
                let p = x[i * k + c] as f64 * w[j * k + c] as f64;
                sum += p;
                mag += p.abs();
            }
            let bj = b.map_or(0.0, |b| b[j] as f64);
            want[i * m + j] = sum + bj;
            tol[i * m + j] = DOT_REL * mag + EPS * (sum.abs() + bj.abs());
        }
    }
    (want, tol)
}

fn check_linear(rng: &mut StdRng, dtype: DataType, (n, k, m): (usize, usize, usize), bias: bool) {
    let (x_data, x) = random_f32(rng, &[n, k], 1.0);
    let (w_data, w) = random_weight(rng, &[m, k], dtype);
    // The bias is stored like the other weights of the layer.
    let b = bias.then(|| random_weight(rng, &[m], dtype));
    let mut out = nan_output(&[n, m]);
    run(Op::Linear {
        input: &x_data,
        weight: &w_data,
        bias: b.as_ref().map(|(d, _)| d),
        output: &mut out,
    })
    .unwrap();
    let (want, tol) = linear_reference(&x, &w, b.as_ref().map(|(_, v)| &v[..]), (n, k, m));
    let what = format!("Linear {dtype} n={n} k={k} m={m} bias={bias}");
    assert_close(&what, out.as_f32().unwrap(), &want, |i| tol[i]);
}

/// Odd sizes, decode (`n == 1`) and prefill (`n > 1`), with and without bias, all below the
/// parallel threshold.
fn linear_matches_formula(dtype: DataType) {
    let mut rng = rng(0x11);
    for &(n, k, m) in &[
        (1, 1, 1),
        (1, 7, 5),
        (2, 1, 3),
        (3, 33, 17),
        (1, 65, 33),
        (4, 65, 31),
        (8, 1023, 9),
        (1, 1023, 15),
    ] {
        assert!(n * k * m < PARALLEL_MIN_WORK);
        for bias in [false, true] {
            check_linear(&mut rng, dtype, (n, k, m), bias);
        }
    }
}

/// Sizes above `PARALLEL_MIN_WORK`, with output counts that are not multiples of the block
/// of rows each task handles.
fn linear_parallel_matches_formula(dtype: DataType) {
    let mut rng = rng(0x12);
    for &(n, k, m) in &[(1, 1023, 257), (1, 4096, 33), (5, 513, 67), (16, 1023, 17)] {
        assert!(n * k * m >= PARALLEL_MIN_WORK);
        check_linear(&mut rng, dtype, (n, k, m), n % 2 == 1);
    }
}

/// `out = x / sqrt(mean(x²) + eps) * g` per row in f64. The f32 sum of squares has a
/// relative error around `u·√dim`; the scale and the two products add a few roundings.
fn check_rms_norm(rng: &mut StdRng, dtype: DataType, n: usize, dim: usize, x_scale: f32) {
    let eps = 1e-5f32;
    let (x_data, x) = random_f32(rng, &[n, dim], x_scale);
    let (g_data, g) = random_weight(rng, &[dim], dtype);
    let mut out = nan_output(&[n, dim]);
    run(Op::RmsNorm {
        input: &x_data,
        weight: &g_data,
        eps,
        output: &mut out,
    })
    .unwrap();
    let mut want = vec![0.0; n * dim];
    for i in 0..n {
        let row = &x[i * dim..(i + 1) * dim];
        let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
        let scale = 1.0 / (ms + eps as f64).sqrt();
        for c in 0..dim {
            want[i * dim + c] = row[c] as f64 * scale * g[c] as f64;
        }
    }
    let rel = 1e-6 * (dim as f64).sqrt() + 4.0 * EPS;
    let what = format!("RmsNorm {dtype} n={n} dim={dim} x_scale={x_scale}");
    assert_close(&what, out.as_f32().unwrap(), &want, |i| rel * want[i].abs());
}

/// Ordinary rows, rows small enough for `eps` to dominate the mean square (it must be added
/// inside the square root), and an all-zero row (which must give zeros, not NaN).
fn rms_norm_matches_formula(dtype: DataType) {
    let mut rng = rng(0x13);
    for &(n, dim) in &[(1, 1), (1, 7), (3, 33), (2, 65), (1, 1023), (5, 4096)] {
        check_rms_norm(&mut rng, dtype, n, dim, 1.0);
        check_rms_norm(&mut rng, dtype, n, dim, 1e-3);
    }
    check_rms_norm(&mut rng, dtype, 2, 17, 0.0);
}

weight_dtype_tests!(
    linear_matches_formula,
    linear_parallel_matches_formula,
    rms_norm_matches_formula,
);

fn zeros(shape: &[usize]) -> Data {
    Data::zeros(DataType::F32, shape).unwrap()
}

fn linear_err(x: [usize; 2], w: [usize; 2], bias_len: Option<usize>, out: [usize; 2]) -> Error {
    let bias = bias_len.map(|len| zeros(&[len]));
    run(Op::Linear {
        input: &zeros(&x),
        weight: &zeros(&w),
        bias: bias.as_ref(),
        output: &mut zeros(&out),
    })
    .unwrap_err()
}

#[test]
fn linear_shape_errors() {
    let cases = [
        ([2, 7], [5, 8], None, [2, 5]),    // weight in != input cols
        ([2, 7], [5, 7], None, [3, 5]),    // output rows != input rows
        ([2, 7], [5, 7], None, [2, 4]),    // output cols != weight rows
        ([2, 7], [5, 7], Some(4), [2, 5]), // bias length != out features
        ([2, 0], [5, 0], None, [2, 5]),    // empty reduction dimension
    ];
    for (x, w, b, out) in cases {
        let err = linear_err(x, w, b, out);
        assert!(
            matches!(err, Error::Shape { .. }),
            "{x:?} {w:?} {b:?} {out:?}: {err}"
        );
    }
}

/// A batch of zero rows is well defined (nothing to compute) and must not panic.
#[test]
fn linear_zero_rows_is_a_no_op() {
    let mut out = zeros(&[0, 5]);
    run(Op::Linear {
        input: &zeros(&[0, 7]),
        weight: &zeros(&[5, 7]),
        bias: None,
        output: &mut out,
    })
    .unwrap();
}

#[test]
fn rms_norm_shape_errors() {
    let cases: [(&[usize], &[usize], &[usize]); 4] = [
        (&[2, 8], &[7], &[2, 8]), // gain length != dim
        (&[2, 8], &[8], &[3, 8]), // output rows differ
        (&[2, 8], &[8], &[8, 2]), // output transposed (same size, other shape)
        (&[2, 0], &[0], &[2, 0]), // empty rows
    ];
    for (x, g, out) in cases {
        assert_shape_err(
            Op::RmsNorm {
                input: &zeros(x),
                weight: &zeros(g),
                eps: 1e-5,
                output: &mut zeros(out),
            },
            format!("{x:?} {g:?} {out:?}"),
        );
    }
}

/// Activations must be f32: other dtypes are refused by the op contract, not misread.
#[test]
fn non_f32_activations_are_refused() {
    let x = zeros(&[1, 4]).to_dtype(DataType::F16).unwrap();
    let err = run(Op::Linear {
        input: &x,
        weight: &zeros(&[3, 4]),
        bias: None,
        output: &mut zeros(&[1, 3]),
    })
    .unwrap_err();
    assert!(matches!(err, Error::DType { op: "Linear", .. }), "{err}");
}
