//! The small ops on the CPU device against their formulas: `Op::Embedding` (f32, f16 and
//! bf16 tables), `Op::SiluMul` (SwiGLU, Shazeer 2020), `Op::Add`, `Op::GatedAdd` and
//! `Op::Argmax`.
//!
//! The other op families have their own files: `ops_linear_norm.rs` (Linear, RmsNorm),
//! `ops_rope.rs` (Rope) and `ops_attention.rs` (Attention, KV store).

#[macro_use]
mod common;

use common::*;
use flm_core::{Data, DataType, Error, Op, TokenIds};
use rand::rngs::StdRng;

fn zeros(shape: &[usize]) -> Data {
    Data::zeros(DataType::F32, shape).unwrap()
}

/// `output[i, :] = table[tokens[i], :]`: an exact copy of the (rounded) table row, first
/// and last ids and repeats included.
fn embedding_copies_rows(dtype: DataType) {
    let mut rng = rng(0x70);
    for (vocab, dim) in [(1, 1), (37, 33), (301, 1023)] {
        let (table, values) = random_weight(&mut rng, &[vocab, dim], dtype);
        let last = vocab as u32 - 1;
        for tokens in [vec![0], vec![last], vec![0, last, last / 2, last / 2, 0]] {
            let mut out = nan_output(&[tokens.len(), dim]);
            run(Op::Embedding {
                table: &table,
                tokens: TokenIds::Host(&tokens),
                output: &mut out,
            })
            .unwrap();
            let want: Vec<f32> = tokens
                .iter()
                .flat_map(|&t| &values[t as usize * dim..][..dim])
                .copied()
                .collect();
            assert_eq!(
                out.as_f32().unwrap(),
                &want[..],
                "{dtype} {vocab}x{dim} {tokens:?}"
            );
            // The same ids held in a tensor.
            let mut from_tensor = nan_output(&[tokens.len(), dim]);
            run(Op::Embedding {
                table: &table,
                tokens: TokenIds::Tensor(&id_tensor(&tokens)),
                output: &mut from_tensor,
            })
            .unwrap();
            assert_eq!(from_tensor.as_f32().unwrap(), &want[..]);
        }
    }
}

weight_dtype_tests!(embedding_copies_rows);
quant_dtype_tests!(embedding_copies_rows_q);

/// Quantised tables: the rows come back exactly as `Data::to_f32_vec` dequantises them.
fn embedding_copies_rows_q(dtype: DataType) {
    embedding_copies_rows(dtype)
}

/// An i32 tensor of the ids `tokens`.
fn id_tensor(tokens: &[u32]) -> Data {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    Data::from_bytes(DataType::I32, &[tokens.len()], &bytes).unwrap()
}

#[test]
fn embedding_token_out_of_range() {
    let table = zeros(&[10, 4]);
    for (tokens, bad) in [(vec![10], 10), (vec![0, 3, u32::MAX, 11], u32::MAX)] {
        // Checked by the contract in host memory, by the device in a tensor.
        let ids = id_tensor(&tokens);
        for ids in [TokenIds::Host(&tokens), TokenIds::Tensor(&ids)] {
            let err = run(Op::Embedding {
                table: &table,
                tokens: ids,
                output: &mut zeros(&[tokens.len(), 4]),
            })
            .unwrap_err();
            assert!(
                matches!(err, Error::TokenOutOfRange { id, vocab_size: 10 } if id == bad),
                "{tokens:?}: {err}"
            );
        }
    }
    let err = run(Op::Embedding {
        table: &table,
        tokens: TokenIds::Tensor(&zeros(&[2])),
        output: &mut zeros(&[2, 4]),
    })
    .unwrap_err();
    assert!(matches!(err, Error::DType { .. }), "{err}");
}

#[test]
fn embedding_shape_errors() {
    let table = zeros(&[10, 4]);
    for (out, n_tokens) in [([2, 4], 3), ([3, 5], 3), ([1, 4], 0)] {
        let tokens = vec![1; n_tokens];
        assert_shape_err(
            Op::Embedding {
                table: &table,
                tokens: TokenIds::Host(&tokens),
                output: &mut zeros(&out),
            },
            format!("{out:?} {n_tokens}"),
        );
    }
}

/// `silu(g)·u = g / (1 + e^-g) · u` in f64. Each f32 step (exp, add, divide, multiply) is
/// accurate to about one rounding, so a relative `8·EPS`; near and past the f32 exp
/// overflow (`g < -88`) the result underflows, hence the absolute `1e-36`.
#[test]
fn silu_mul_matches_formula() {
    let mut rng = rng(0x71);
    for (n, hidden) in [(1, 1), (1, 7), (3, 33), (5, 1023), (1, 11008)] {
        let (gate, g) = random_f32(&mut rng, &[n, hidden], 8.0);
        let (up, u) = random_f32(&mut rng, &[n, hidden], 2.0);
        check_silu_mul(&gate, &g, &up, &u, &[n, hidden]);
    }
    let g = [
        0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0, 88.0, -88.0, -89.0, -100.0, 100.0, -1e30,
    ];
    let u = [1.5; 12];
    check_silu_mul(
        &f32_data(&[2, 6], &g),
        &g,
        &f32_data(&[2, 6], &u),
        &u,
        &[2, 6],
    );
}

fn check_silu_mul(gate: &Data, g: &[f32], up: &Data, u: &[f32], shape: &[usize]) {
    let mut out = nan_output(shape);
    run(Op::SiluMul {
        gate,
        up,
        output: &mut out,
    })
    .unwrap();
    let want: Vec<f64> = g
        .iter()
        .zip(u)
        .map(|(&g, &u)| g as f64 / (1.0 + (-g as f64).exp()) * u as f64)
        .collect();
    let what = format!("SiluMul {shape:?}");
    assert_close(&what, out.as_f32().unwrap(), &want, |i| {
        8.0 * EPS * want[i].abs() + 1e-36
    });
}

#[test]
fn silu_mul_shape_errors() {
    let cases: [([usize; 2], [usize; 2], [usize; 2]); 3] = [
        ([2, 3], [2, 4], [2, 3]),
        ([2, 3], [2, 3], [3, 2]),
        ([2, 3], [3, 2], [2, 3]),
    ];
    for (g, u, o) in cases {
        assert_shape_err(
            Op::SiluMul {
                gate: &zeros(&g),
                up: &zeros(&u),
                output: &mut zeros(&o),
            },
            format!("{g:?} {u:?} {o:?}"),
        );
    }
}

/// Random `x` and `y` of `shape` in `[-4, 4)`, tensors and values: the operands of the
/// residual adds.
fn residual_operands(rng: &mut StdRng, shape: &[usize]) -> ((Data, Vec<f32>), (Data, Vec<f32>)) {
    (random_f32(rng, shape, 4.0), random_f32(rng, shape, 4.0))
}

/// `x += y`: one f32 addition per element, which is the f64 sum rounded once to f32.
#[test]
fn add_matches_formula() {
    let mut rng = rng(0x72);
    for shape in [[1, 1], [1, 7], [3, 1023], [1, 4096]] {
        let ((mut x, xv), (y, yv)) = residual_operands(&mut rng, &shape);
        run(Op::Add { x: &mut x, y: &y }).unwrap();
        let want: Vec<f32> = xv
            .iter()
            .zip(&yv)
            .map(|(&a, &b)| (a as f64 + b as f64) as f32)
            .collect();
        assert_eq!(x.as_f32().unwrap(), &want[..], "{shape:?}");
    }
}

/// Same element count, different shape: still a mismatch; `x` is left untouched.
#[test]
fn add_shape_errors() {
    for (xs, ys) in [([2, 3], [3, 2]), ([2, 3], [2, 4]), ([1, 3], [2, 3])] {
        let mut x = f32_data(&xs, &vec![1.0; xs[0] * xs[1]]);
        assert_shape_err(
            Op::Add {
                x: &mut x,
                y: &zeros(&ys),
            },
            format!("{xs:?} {ys:?}"),
        );
        assert!(x.as_f32().unwrap().iter().all(|&v| v == 1.0));
    }
}

/// `x[i, :] += σ(gate[i]) · y[i, :]` against the formula in f64 (within a few f32
/// roundings: the sigmoid and the product are rounded before the add).
#[test]
fn gated_add_matches_formula() {
    let mut rng = rng(0x75);
    for shape in [[1, 1], [1, 7], [3, 1023], [5, 64]] {
        let ((mut x, xv), (y, yv)) = residual_operands(&mut rng, &shape);
        let (gate, gv) = random_f32(&mut rng, &[shape[0], 1], 8.0);
        run(Op::GatedAdd {
            x: &mut x,
            y: &y,
            gate: &gate,
        })
        .unwrap();
        let got = x.as_f32().unwrap();
        for (i, ((&a, &b), &g)) in xv
            .iter()
            .zip(&yv)
            .zip(gv.iter().flat_map(|g| std::iter::repeat_n(g, shape[1])))
            .enumerate()
        {
            let want = a as f64 + b as f64 / (1.0 + (-(g as f64)).exp());
            let bound = 4.0 * f32::EPSILON as f64 * (a.abs() + b.abs()) as f64;
            assert!((got[i] as f64 - want).abs() <= bound, "{shape:?} at {i}");
        }
    }
}

/// A gate of other than one column per row of `x`, or `y` of another shape: a shape error,
/// `x` left untouched.
#[test]
fn gated_add_shape_errors() {
    for (ys, gs) in [([2, 3], [2, 2]), ([2, 3], [3, 1]), ([2, 4], [2, 1])] {
        let mut x = f32_data(&[2, 3], &[1.0; 6]);
        assert_shape_err(
            Op::GatedAdd {
                x: &mut x,
                y: &zeros(&ys),
                gate: &zeros(&gs),
            },
            format!("{ys:?} {gs:?}"),
        );
        assert!(x.as_f32().unwrap().iter().all(|&v| v == 1.0));
    }
}

/// The index of the first largest value of each row.
fn first_argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

fn argmax(shape: [usize; 2], values: &[f32]) -> Vec<u32> {
    let mut out = vec![u32::MAX; shape[0]];
    run(Op::Argmax {
        input: &f32_data(&shape, values),
        output: &mut out,
    })
    .unwrap();
    out
}

#[test]
fn argmax_matches_formula() {
    let mut rng = rng(0x73);
    for shape in [[1, 1], [1, 7], [3, 32003], [2, 151936]] {
        let values = uniform(&mut rng, shape[0] * shape[1], 10.0);
        let want: Vec<u32> = values.chunks(shape[1]).map(first_argmax).collect();
        assert_eq!(argmax(shape, &values), want, "{shape:?}");
    }
}

/// Ties go to the first index; negative rows, -inf and a maximum in the last column.
#[test]
fn argmax_ties_and_edges() {
    let inf = f32::INFINITY;
    let rows: [([f32; 5], u32); 6] = [
        ([1.0, 3.0, 3.0, 2.0, 3.0], 1),
        ([0.5; 5], 0),
        ([-5.0, -2.0, -2.0, -7.0, -3.0], 1),
        ([-inf, -inf, -1e30, -inf, -1e30], 2),
        ([0.0, 1.0, 2.0, 3.0, 4.0], 4),
        ([inf, 1.0, inf, 2.0, 3.0], 0),
    ];
    let values: Vec<f32> = rows.iter().flat_map(|(r, _)| *r).collect();
    let want: Vec<u32> = rows.iter().map(|&(_, i)| i).collect();
    assert_eq!(argmax([6, 5], &values), want);
}

#[test]
fn argmax_shape_errors() {
    for (shape, n_out) in [([2, 5], 1), ([2, 5], 3), ([2, 0], 2)] {
        let mut out = vec![0; n_out];
        assert_shape_err(
            Op::Argmax {
                input: &zeros(&shape),
                output: &mut out,
            },
            format!("{shape:?} {n_out}"),
        );
    }
}
