//! The ops of the ChatGLM-6B graph on the CPU device against their formulas in f64:
//! `Op::Gelu` (tanh approximation, Hendrycks & Gimpel 2016), `Op::Scale`, `Op::Rope2d`
//! (GLM's two-dimensional RoPE, Du et al. 2022) and `Op::LayerNorm` (Ba et al. 2016), odd
//! sizes included, and their shape errors. The SIMD kernels (GELU, LayerNorm) are checked
//! at every instruction-set level this CPU has, their portable twins included.

mod common;

use common::*;
use flm_core::{
    AttentionOperands, AttentionParams, Data, DataType, Error, Executor, Op, RopeStyle, RopeTable,
};
use flm_devices::{CpuDevice, Isa};

/// An executor whose CPU kernels use `isa`, for each level this CPU supports.
fn executors() -> Vec<(Isa, Executor)> {
    Isa::supported()
        .into_iter()
        .map(|isa| {
            let cpu = CpuDevice::with_isa(isa).expect("a supported level");
            (isa, Executor::with_profiling(vec![Box::new(cpu)], false))
        })
        .collect()
}

/// GELU within a few units of rounding of `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`: the
/// exponential is within 2 EPS relative, and the sum `1 + tanh` loses nothing for `x > 0`;
/// for `x < 0` it cancels, so the bound is relative to `|x|` rather than to the result.
#[test]
fn gelu_matches_formula() {
    for (isa, exec) in executors() {
        for len in [1, 7, 8, 17, 33, 1000] {
            let (_, mut x) = random_f32(&mut rng(len as u64), &[1, len], 6.0);
            // Far tails: tanh saturates to ±1 and the exponential underflows.
            let tails = [-60.0, 60.0, -0.0, 1e-30];
            let k = tails.len().min(len);
            x[..k].copy_from_slice(&tails[..k]);
            let mut x_data = f32_data(&[1, len], &x);
            exec.run(Op::Gelu { x: &mut x_data }).unwrap();
            let want: Vec<f64> = x
                .iter()
                .map(|&v| {
                    let v = v as f64;
                    let u = (2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v);
                    0.5 * v * (1.0 + u.tanh())
                })
                .collect();
            let what = format!("Gelu at {isa}, len {len}");
            assert_close(&what, x_data.as_f32().unwrap(), &want, |i| {
                8.0 * EPS * (x[i] as f64).abs()
            });
        }
    }
}

#[test]
fn scale_multiplies_every_value() {
    let (mut x_data, x) = random_f32(&mut rng(5), &[3, 17], 2.0);
    run(Op::Scale {
        x: &mut x_data,
        alpha: 7.483_315,
    })
    .unwrap();
    let want: Vec<f64> = x.iter().map(|&v| v as f64 * 7.483_315f32 as f64).collect();
    assert_close("Scale", x_data.as_f32().unwrap(), &want, |i| {
        EPS * want[i].abs()
    });
}

/// Each head is two halves of `half` dimensions; the first rotates (rotate-half pairs
/// `(j, j + half/2)`) by `positions[i]·f_j`, the second by `block_positions[i]·f_j`, with
/// `f_j = 10000^(−2j/half)`. Tolerance as in `ops_rope.rs`.
#[test]
fn rope_2d_matches_formula() {
    let (n, n_heads, half) = (3, 5, 6);
    let table = RopeTable::new(RopeStyle::RotateHalf, half, half, 10000.0, 64).unwrap();
    let (mut x_data, x) = random_f32(&mut rng(9), &[n, n_heads * 2 * half], 1.0);
    let positions = [0u32, 1, 1];
    let block_positions = [0u32, 0, 40];
    run(Op::Rope2d {
        x: &mut x_data,
        table: &table,
        n_heads,
        positions: &positions,
        block_positions: &block_positions,
    })
    .unwrap();
    let mut want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let mut tol = vec![0.0; x.len()];
    for i in 0..n {
        for part in 0..2 * n_heads {
            let pos = if part % 2 == 0 {
                positions[i]
            } else {
                block_positions[i]
            } as f64;
            let base = (i * 2 * n_heads + part) * half;
            for j in 0..half / 2 {
                let angle = pos * 10000f64.powf(-2.0 * j as f64 / half as f64);
                let (ia, ib) = (base + j, base + j + half / 2);
                let (a, b) = (x[ia] as f64, x[ib] as f64);
                want[ia] = a * angle.cos() - b * angle.sin();
                want[ib] = a * angle.sin() + b * angle.cos();
                let t = a.hypot(b) * EPS * (3.0 * angle + 4.0);
                (tol[ia], tol[ib]) = (t, t);
            }
        }
    }
    assert_close("Rope2d", x_data.as_f32().unwrap(), &want, |i| tol[i]);
}

#[test]
fn rope_2d_errors() {
    let table = RopeTable::new(RopeStyle::RotateHalf, 4, 4, 10000.0, 8).unwrap();
    let mut x = Data::zeros(DataType::F32, &[2, 16]).unwrap();
    let mut rope = |positions: &[u32], block: &[u32]| {
        run(Op::Rope2d {
            x: &mut x,
            table: &table,
            n_heads: 2,
            positions,
            block_positions: block,
        })
        .unwrap_err()
    };
    assert!(matches!(rope(&[0], &[0, 1]), Error::Shape { .. }));
    assert!(matches!(
        rope(&[0, 1], &[0, 8]),
        Error::ContextOverflow { .. }
    ));
}

/// LayerNorm per row with the biased variance, from the mean and variance in f64, and the
/// tolerance of each output: the f32 two-pass statistics over `dim` values are off by about
/// `EPS·√dim` relative, and the normalised value, gain and shift by a few EPS more.
fn layer_norm_reference(x: &[f32], w: &[f32], b: &[f32], dim: usize) -> (Vec<f64>, Vec<f64>) {
    let mut want = vec![0.0; x.len()];
    let mut tol = vec![0.0; x.len()];
    for (row, (xs, ws)) in x.chunks(dim).zip(want.chunks_mut(dim)).enumerate() {
        let mean = xs.iter().map(|&v| v as f64).sum::<f64>() / dim as f64;
        let var = xs.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / dim as f64;
        let inv = 1.0 / (var + 1e-5f32 as f64).sqrt();
        for (c, o) in ws.iter_mut().enumerate() {
            let normed = (xs[c] as f64 - mean) * inv;
            *o = normed * w[c] as f64 + b[c] as f64;
            tol[row * dim + c] =
                4.0 * EPS * (dim as f64).sqrt() * (normed.abs() + 1.0) * (w[c] as f64).abs()
                    + EPS * (b[c] as f64).abs();
        }
    }
    (want, tol)
}

/// LayerNorm at every level against [`layer_norm_reference`], and its shape error.
#[test]
fn layer_norm_matches_formula() {
    for (isa, exec) in executors() {
        for dim in [1, 5, 8, 16, 17, 64, 131] {
            let mut r = rng(dim as u64);
            let (x_data, x) = random_f32(&mut r, &[3, dim], 3.0);
            let (w_data, w) = random_f32(&mut r, &[dim], 1.0);
            let (b_data, b) = random_f32(&mut r, &[dim], 1.0);
            let mut out = nan_output(&[3, dim]);
            exec.run(Op::LayerNorm {
                input: &x_data,
                weight: &w_data,
                bias: &b_data,
                eps: 1e-5,
                output: &mut out,
            })
            .unwrap();
            let (want, tol) = layer_norm_reference(&x, &w, &b, dim);
            let what = format!("LayerNorm at {isa}, dim {dim}");
            assert_close(&what, out.as_f32().unwrap(), &want, |i| tol[i]);
        }
    }
    let z = |shape: &[usize]| Data::zeros(DataType::F32, shape).unwrap();
    assert_shape_err(
        Op::LayerNorm {
            input: &z(&[2, 4]),
            weight: &z(&[4]),
            bias: &z(&[3]),
            eps: 1e-5,
            output: &mut z(&[2, 4]),
        },
        "a bias of 3 for 4 columns",
    );
}

/// A prefix-LM mask wider than the filled cache rows is refused.
#[test]
fn attention_bidirectional_past_the_filled_rows_is_an_error() {
    let z = |shape: &[usize]| Data::zeros(DataType::F32, shape).unwrap();
    assert_shape_err(
        Op::Attention {
            operands: AttentionOperands {
                q: &z(&[2, 8]),
                cache_k: &z(&[16, 8]),
                cache_v: &z(&[16, 8]),
                rope: None,
                params: AttentionParams {
                    n_heads: 2,
                    n_kv_heads: 2,
                    scale: 0.5,
                    alibi: false,
                    bidirectional: 6,
                    sliding_window: None,
                    softcap: None,
                },
                sinks: None,
                output: &mut z(&[2, 8]),
            },
            start_pos: 3,
        },
        "a mask of 6 rows past 3 filled",
    );
}
