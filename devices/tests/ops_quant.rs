//! `Op::Linear` and `Op::Embedding` on the CPU device with quantised weights (int8 per row,
//! int4 and int4-sym in groups of 32, 64 and 128, ggml's K-quants; layouts in
//! `flm_core::quant`), where Linear dots the integer weight codes against the input rows
//! quantised to int8 blocks of 32.
//!
//! Two references: the same scheme written here from the doc (dequantised weights, inputs
//! quantised per block in the test), which the kernel must match up to f32 accumulation
//! error; and the unquantised f32 product, which it must match within the documented
//! quantisation error bounds. With 16-bit activations (`ActivationBits::Int16`), the
//! dequantised weights' product with the unquantised inputs, within the residual's bound.

#[macro_use]
mod common;

use common::*;
use flm_core::quant::{padded_cols, BLOCK};
use flm_core::{Data, DataType, Executor, Int4Form, Op};
use flm_devices::cpu::PARALLEL_MIN_WORK;
use flm_devices::{ActivationBits, CpuDevice};

/// The input rows `[n, k]` quantised as the doc says: per block of 32 (zero-padded to
/// `padded_cols`), `a = max|x| / 127`, `q = round(x / a)`, `x̂ = a·q`. Returns `x̂` without
/// the padding (whose values are 0) and each value's block scale `a`.
fn quantise_inputs(dtype: DataType, x: &[f32], k: usize) -> (Vec<f64>, Vec<f64>) {
    let kp = padded_cols(dtype, k);
    let (mut xq, mut scale) = (Vec::new(), Vec::new());
    for row in x.chunks_exact(k) {
        let mut padded = row.to_vec();
        padded.resize(kp, 0.0);
        for block in padded.chunks_exact(BLOCK) {
            let a = block.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
            for &v in block {
                let q = if a > 0.0 { (v / a).round() } else { 0.0 };
                xq.push(a as f64 * q as f64);
                scale.push(a as f64);
            }
        }
        xq.truncate(xq.len() - (kp - k));
        scale.truncate(scale.len() - (kp - k));
    }
    (xq, scale)
}

/// Runs `Op::Linear` on f32 `x [n, k]`, `weight [m, k]` and an optional f32 bias.
fn run_linear(x: &[f32], weight: &Data, bias: Option<&[f32]>, n: usize) -> Vec<f32> {
    run_linear_with(ActivationBits::Int8, x, weight, bias, n)
}

/// [`run_linear`] on a CPU device whose activations are `bits`.
fn run_linear_with(
    bits: ActivationBits,
    x: &[f32],
    weight: &Data,
    bias: Option<&[f32]>,
    n: usize,
) -> Vec<f32> {
    let (m, k) = (weight.rows(), weight.cols());
    let bias = bias.map(|b| f32_data(&[m], b));
    let mut out = nan_output(&[n, m]);
    let cpu = CpuDevice::new().unwrap().with_activation_bits(bits);
    Executor::with_profiling(vec![Box::new(cpu)], false)
        .run(Op::Linear {
            input: &f32_data(&[n, k], x),
            weight,
            bias: bias.as_ref(),
            output: &mut out,
        })
        .unwrap();
    out.as_f32().unwrap().to_vec()
}

/// `Σ ŵ·x̂ + b` in f64 against the kernel, allowing f32 accumulation error only.
fn check_scheme(dtype: DataType, (n, k, m): (usize, usize, usize), bias: bool, seed: u64) {
    let mut rng = rng(seed);
    let (_, x) = random_f32(&mut rng, &[n, k], 1.0);
    let (w_data, w_hat) = random_weight(&mut rng, &[m, k], dtype);
    let b = bias.then(|| uniform(&mut rng, m, 1.0));
    let got = run_linear(&x, &w_data, b.as_deref(), n);
    let (xq, _) = quantise_inputs(dtype, &x, k);
    let (mut want, mut tol) = (vec![0.0; n * m], vec![0.0; n * m]);
    for i in 0..n {
        for j in 0..m {
            let (mut sum, mut mag) = (0.0f64, 0.0f64);
            for c in 0..k {
                let p = w_hat[j * k + c] as f64 * xq[i * k + c];
                sum += p;
                mag += p.abs();
            }
            let bj = b.as_ref().map_or(0.0, |b| b[j] as f64);
            want[i * m + j] = sum + bj;
            tol[i * m + j] = 1e-5 * mag + 1e-6 + EPS * bj.abs();
        }
    }
    let what = format!("Linear {dtype} n={n} k={k} m={m} bias={bias} (vs quantised scheme)");
    assert_close(&what, &got, &want, |i| tol[i]);
}

/// Odd sizes (partial blocks and groups), decode and prefill, with and without bias.
fn linear_matches_quantised_scheme(dtype: DataType) {
    let mut seed = 0x51;
    for k in [1, 7, 31, 32, 33, 63, 65, 172, 257, 1000] {
        for m in [1, 3, 17] {
            for n in [1, 5] {
                for bias in [false, true] {
                    seed += 1;
                    check_scheme(dtype, (n, k, m), bias, seed);
                }
            }
        }
    }
}

/// Sizes above the parallel threshold, with row counts that are not multiples of a task.
fn linear_parallel_matches_quantised_scheme(dtype: DataType) {
    for (s, &(n, k, m)) in [(1, 4096, 67), (5, 1000, 33), (3, 257, 171)]
        .iter()
        .enumerate()
    {
        assert!(n * k * m >= PARALLEL_MIN_WORK);
        check_scheme(dtype, (n, k, m), s % 2 == 0, 0x61 + s as u64);
    }
}

/// The documented per-value weight error bound of each group of a row: int8, one group of
/// the whole row with `|w − ŵ| ≤ max|w| / 254`; int4, groups of `G` where the min/max fit
/// has `|w − ŵ| ≤ d/2 + ε`, `d = (max − min)/15`, `ε = 2⁻¹¹(|min| + 15d)`; int4-sym, where
/// the `max|w| / 8` fit has `|w − ŵ| ≤ |d| (1 + 2⁻⁸)`, `|d| = max|w| / 8` (a step where
/// values beyond `7|d|` on the other side of the extreme are clamped, half a step elsewhere);
/// int4-zp, where GPTQ's fit has `|w − ŵ| ≤ d (1 + 2⁻⁷)`, `d = (max − min)/15` over the
/// range widened to hold 0 (a step where rounding the zero point moves the grid by half a
/// step and an extreme value is clamped, half a step elsewhere).
fn weight_bound(dtype: DataType, group: &[f32]) -> f64 {
    let lo = group.iter().copied().fold(f32::INFINITY, f32::min) as f64;
    let hi = group.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    match dtype.group_size() {
        None => lo.abs().max(hi.abs()) / 254.0,
        Some(_) if dtype.is_int4_symmetric() => lo.abs().max(hi.abs()) / 8.0 * (1.0 + 1.0 / 256.0),
        Some(_) if dtype.int4_form() == Some(Int4Form::ZeroPoint) => {
            (hi.max(0.0) - lo.min(0.0)) / 15.0 * (1.0 + 1.0 / 128.0)
        }
        Some(_) => {
            let d = (hi - lo) / 15.0;
            d / 2.0 + (lo.abs() + 15.0 * d) / 2048.0
        }
    }
}

/// The whole scheme against `Σ w·x` on the unquantised f32 values. With `ŵx̂ − wx =
/// w·Δx + Δw·x̂` and `|Δx| ≤ a/2`: the activation term is bounded by `Σ|w|·a/2`. The weight
/// term is bounded per group: for int8 by `β·Σ|x̂|` (`β` the per-value bound); for int4 the
/// refined fits only promise a squared error at most the first fit's, so by
/// Cauchy–Schwarz by `√(len·β²)·‖x̂‖₂`, with `|x̂| ≤ |x| + a/2`.
fn linear_within_quantisation_bounds(dtype: DataType) {
    let mut rng = rng(0x71);
    for &(n, k, m) in &[
        (1, 1, 3),
        (2, 33, 17),
        (1, 172, 9),
        (5, 257, 17),
        (3, 1000, 8),
    ] {
        let x = uniform(&mut rng, n * k, 1.0);
        let w = uniform(&mut rng, m * k, 1.0);
        let w_data = f32_data(&[m, k], &w).to_dtype(dtype).unwrap();
        let got = run_linear(&x, &w_data, None, n);
        let (_, a) = quantise_inputs(dtype, &x, k);
        let g = dtype.group_size().unwrap_or(k);
        let (mut want, mut tol) = (vec![0.0; n * m], vec![0.0; n * m]);
        for i in 0..n {
            let xi = &x[i * k..(i + 1) * k];
            let ai = &a[i * k..(i + 1) * k];
            // Upper bounds on |x̂| per value.
            let xhat: Vec<f64> = xi
                .iter()
                .zip(ai)
                .map(|(&v, &a)| v.abs() as f64 + a / 2.0)
                .collect();
            for j in 0..m {
                let wj = &w[j * k..(j + 1) * k];
                let (mut y, mut bound, mut mag) = (0.0f64, 0.0f64, 0.0f64);
                for c in 0..k {
                    y += wj[c] as f64 * xi[c] as f64;
                    mag += wj[c].abs() as f64 * xhat[c];
                    bound += wj[c].abs() as f64 * ai[c] / 2.0;
                }
                for (wg, xg) in wj.chunks(g).zip(xhat.chunks(g)) {
                    let beta = weight_bound(dtype, wg);
                    bound += match dtype.group_size() {
                        None => beta * xg.iter().sum::<f64>(),
                        Some(_) => {
                            let l2 = xg.iter().map(|v| v * v).sum::<f64>().sqrt();
                            (wg.len() as f64).sqrt() * beta * l2
                        }
                    };
                }
                want[i * m + j] = y;
                // 1e-3 relative slack on the bound for the f32 rounding of scales and
                // codes, plus f32 accumulation error.
                tol[i * m + j] = bound * 1.001 + 1e-5 * mag + 1e-6;
            }
        }
        let what = format!("Linear {dtype} n={n} k={k} m={m} (vs f32, quantisation bound)");
        assert_close(&what, &got, &want, |i| tol[i]);
    }
}

/// All-zero weight rows and all-zero inputs give exactly the bias (or 0).
fn zeros_give_exact_bias(dtype: DataType) {
    let mut rng = rng(0x81);
    for &(n, k, m) in &[(1, 33, 5), (4, 257, 6), (1, 4096, 40)] {
        let mut w = uniform(&mut rng, m * k, 1.0);
        // Rows 0, 2, 4, ... are zero.
        for row in w.chunks_exact_mut(k).step_by(2) {
            row.fill(0.0);
        }
        let w_data = f32_data(&[m, k], &w).to_dtype(dtype).unwrap();
        let x = uniform(&mut rng, n * k, 1.0);
        let b = uniform(&mut rng, m, 1.0);
        for bias in [None, Some(&b[..])] {
            let bj = |j: usize| bias.map_or(0.0, |b| b[j]);
            let got = run_linear(&x, &w_data, bias, n);
            for (i, y) in got.iter().enumerate() {
                if (i % m) % 2 == 0 {
                    assert_eq!(*y, bj(i % m), "{dtype} {n}x{k}x{m}: zero row, element {i}");
                }
            }
            let got = run_linear(&vec![0.0; n * k], &w_data, bias, n);
            for (i, y) in got.iter().enumerate() {
                assert_eq!(
                    *y,
                    bj(i % m),
                    "{dtype} {n}x{k}x{m}: zero input, element {i}"
                );
            }
        }
    }
}

/// A constant row (int4: `max == min`, so `d = 0`; int4-sym: `d = −c/8`, exact; int4-zp:
/// `d = |c|/8`, `q − z = ±8`, exact) and a row
/// with one constant group are
/// dequantised exactly when the constant is an f16, and Linear computes `Σ c·x̂`.
fn constant_rows_are_reproduced(dtype: DataType) {
    let mut rng = rng(0x91);
    for k in [1, 31, 32, 100, 300] {
        for c in [0.375f32, -1.25, 3.0] {
            let mut w = vec![c; 2 * k];
            // Row 1: a constant first group, then random values.
            let g = dtype.group_size().unwrap_or(k).min(k);
            w[k + g..].copy_from_slice(&uniform(&mut rng, k - g, 1.0));
            let w_data = f32_data(&[2, k], &w).to_dtype(dtype).unwrap();
            let w_hat = w_data.to_f32_vec().unwrap();
            let what = format!("{dtype} k={k} c={c}");
            if dtype == DataType::I8 {
                // `s·127` with `s = |c|/127`: within one f32 rounding each way.
                for v in &w_hat[..k] {
                    assert!((v - c).abs() <= 2.0 * f32::EPSILON * c.abs(), "{what}: {v}");
                }
            } else {
                assert_eq!(&w_hat[..k], &w[..k], "{what}: constant row");
                assert_eq!(&w_hat[k..k + g], &w[k..k + g], "{what}: constant group");
            }
            let x = uniform(&mut rng, 3 * k, 1.0);
            let got = run_linear(&x, &w_data, None, 3);
            let (xq, _) = quantise_inputs(dtype, &x, k);
            for i in 0..3 {
                let xi = &xq[i * k..(i + 1) * k];
                let want = c as f64 * xi.iter().sum::<f64>();
                let mag = c.abs() as f64 * xi.iter().map(|v| v.abs()).sum::<f64>();
                let err = (got[i * 2] as f64 - want).abs();
                assert!(
                    err <= 1e-5 * mag + 1e-6,
                    "{what}: row {i}: {} vs {want}",
                    got[i * 2]
                );
            }
        }
    }
}

/// With 16-bit activations each input block is its int8 codes plus the int8 codes of the
/// residual `r = x − a·q`, `|r| ≤ a/2`, so `|Δx| ≤ (a/2)/127/2 = a/508`: the output is
/// `Σ ŵ·x` on the dequantised weights within `Σ|ŵ|·a/508`, plus f32 accumulation error.
/// int8 activations exceed that bound somewhere, so the check has teeth.
fn sixteen_bit_activations_match_the_dequantised_product(dtype: DataType) {
    let mut rng = rng(0xa1);
    let mut int8_exceeds = false;
    for &(n, k, m) in &[(1, 33, 17), (5, 257, 9), (1, 4096, 67), (3, 1000, 40)] {
        let (_, x) = random_f32(&mut rng, &[n, k], 1.0);
        let (w_data, w_hat) = random_weight(&mut rng, &[m, k], dtype);
        let (_, a) = quantise_inputs(dtype, &x, k);
        let (mut want, mut tol) = (vec![0.0; n * m], vec![0.0; n * m]);
        for i in 0..n {
            for j in 0..m {
                let (mut y, mut bound, mut mag) = (0.0f64, 0.0f64, 0.0f64);
                for c in 0..k {
                    let w = w_hat[j * k + c] as f64;
                    y += w * x[i * k + c] as f64;
                    mag += (w * x[i * k + c] as f64).abs();
                    bound += w.abs() * a[i * k + c] / 508.0;
                }
                want[i * m + j] = y;
                tol[i * m + j] = bound * 1.01 + 1e-5 * mag + 1e-6;
            }
        }
        let got = run_linear_with(ActivationBits::Int16, &x, &w_data, None, n);
        let what = format!("Linear {dtype} n={n} k={k} m={m}, 16-bit activations");
        assert_close(&what, &got, &want, |i| tol[i]);
        let int8 = run_linear(&x, &w_data, None, n);
        int8_exceeds |= int8
            .iter()
            .zip(&want)
            .enumerate()
            .any(|(i, (&g, &w))| (g as f64 - w).abs() > tol[i]);
    }
    assert!(
        int8_exceeds,
        "{dtype}: int8 activations were within the 16-bit bound"
    );
}

quant_dtype_tests!(
    sixteen_bit_activations_match_the_dequantised_product,
    linear_matches_quantised_scheme,
    linear_parallel_matches_quantised_scheme,
    linear_within_quantisation_bounds,
    zeros_give_exact_bias,
    constant_rows_are_reproduced,
);

/// ggml's K-quants, Q5_0, Q8_0, IQ4_NL, IQ4_XS and MXFP4 (their weights dequantised as gguf-py
/// decodes them):
/// the kernels dot runs of 32 weights against the same int8 input blocks, so the same
/// scheme, in parallel too, and exact zeros.
fn k_quant_linear_matches_quantised_scheme(dtype: DataType) {
    linear_matches_quantised_scheme(dtype);
    linear_parallel_matches_quantised_scheme(dtype);
    zeros_give_exact_bias(dtype);
    sixteen_bit_activations_match_the_dequantised_product(dtype);
}

dtype_tests!([q4_k: Q4K, q5_k: Q5K, q6_k: Q6K, q5_0: Q5_0, q8_0: Q8_0, iq4_nl: IQ4NL,
    iq4_xs: IQ4XS, mxfp4: MXFP4] k_quant_linear_matches_quantised_scheme);
