//! `Op::Rope` (Su et al. 2021, RoFormer) on the CPU device against the formula evaluated in
//! f64: pair `(a, b)` of a head at position `p` is rotated by `θ = p·theta^(-2j/rotary_dim)`,
//! `a' = a·cosθ − b·sinθ`, `b' = a·sinθ + b·cosθ`, with pairs `(2j, 2j+1)` (AdjacentPairs)
//! or `(j, j + rotary_dim/2)` (RotateHalf); dimensions past `rotary_dim` are unchanged.

mod common;

use common::*;
use flm_core::{Data, DataType, Error, Op, RopeStyle, RopeTable};

struct Case {
    style: RopeStyle,
    n: usize,
    n_heads: usize,
    head_dim: usize,
    rotary_dim: usize,
    theta: f32,
    start_pos: usize,
}

/// The expected rows and, per element, the tolerance. The table holds cos/sin of an angle
/// computed in f32 (as llama2.c and Hugging Face do): `powf` (< 1 ulp), the reciprocal and
/// the product by `p` put up to about `2·EPS·θ` on the angle, and cos, sin and the rotation a
/// few `EPS` more, so the tolerance is `|(a, b)|·EPS·(3θ + 4)`; untouched dimensions must be
/// exact.
fn reference(c: &Case, x: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let mut want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let mut tol = vec![0.0; x.len()];
    let half = c.rotary_dim / 2;
    for i in 0..c.n {
        let pos = (c.start_pos + i) as f64;
        for h in 0..c.n_heads {
            let base = (i * c.n_heads + h) * c.head_dim;
            for j in 0..half {
                let angle = pos * (c.theta as f64).powf(-2.0 * j as f64 / c.rotary_dim as f64);
                let (ia, ib) = match c.style {
                    RopeStyle::AdjacentPairs => (base + 2 * j, base + 2 * j + 1),
                    RopeStyle::RotateHalf => (base + j, base + j + half),
                };
                let (a, b) = (x[ia] as f64, x[ib] as f64);
                want[ia] = a * angle.cos() - b * angle.sin();
                want[ib] = a * angle.sin() + b * angle.cos();
                let t = a.hypot(b) * EPS * (3.0 * angle + 4.0);
                (tol[ia], tol[ib]) = (t, t);
            }
        }
    }
    (want, tol)
}

fn check(c: Case, seed: u64) {
    let table = RopeTable::new(c.style, c.head_dim, c.rotary_dim, c.theta, 512).unwrap();
    let (mut x_data, x) = random_f32(&mut rng(seed), &[c.n, c.n_heads * c.head_dim], 1.0);
    run(Op::Rope {
        x: &mut x_data,
        table: &table,
        n_heads: c.n_heads,
        start_pos: c.start_pos,
    })
    .unwrap();
    let (want, tol) = reference(&c, &x);
    let what = format!(
        "Rope {:?} n={} heads={} head_dim={} rotary={} theta={} start={}",
        c.style, c.n, c.n_heads, c.head_dim, c.rotary_dim, c.theta, c.start_pos
    );
    assert_close(&what, x_data.as_f32().unwrap(), &want, |i| tol[i]);
}

/// Both styles; full and partial rotary dimensions (ChatGLM rotates half of each head);
/// decode and prefill rows, from position 0 and from later positions.
#[test]
fn rope_matches_formula() {
    let mut seed = 0x20;
    for style in [RopeStyle::AdjacentPairs, RopeStyle::RotateHalf] {
        for (head_dim, rotary_dim) in [(2, 2), (8, 8), (10, 6), (6, 2), (64, 32), (128, 128)] {
            for (n, start_pos) in [(1, 0), (1, 37), (5, 0), (7, 100), (3, 509)] {
                for (n_heads, theta) in [(1, 10000.0), (3, 500000.0)] {
                    seed += 1;
                    let c = Case {
                        style,
                        n,
                        n_heads,
                        head_dim,
                        rotary_dim,
                        theta,
                        start_pos,
                    };
                    check(c, seed);
                }
            }
        }
    }
}

/// The two styles pair different dimensions, so on the same input they must disagree (a
/// guard against a table whose style is ignored).
#[test]
fn rope_styles_differ() {
    let (x, _) = random_f32(&mut rng(0x2f), &[1, 8], 1.0);
    let out = |style| {
        let table = RopeTable::new(style, 8, 8, 10000.0, 16).unwrap();
        let mut y = x.clone();
        run(Op::Rope {
            x: &mut y,
            table: &table,
            n_heads: 1,
            start_pos: 3,
        })
        .unwrap();
        y.to_f32_vec().unwrap()
    };
    assert_ne!(out(RopeStyle::AdjacentPairs), out(RopeStyle::RotateHalf));
}

fn rope_err(cols: usize, n_heads: usize, n: usize, start_pos: usize) -> Error {
    let table = RopeTable::new(RopeStyle::RotateHalf, 8, 8, 10000.0, 16).unwrap();
    let mut x = Data::zeros(DataType::F32, &[n, cols]).unwrap();
    run(Op::Rope {
        x: &mut x,
        table: &table,
        n_heads,
        start_pos,
    })
    .unwrap_err()
}

#[test]
fn rope_shape_errors() {
    for (cols, n_heads) in [(16, 3), (15, 2), (8, 2)] {
        let err = rope_err(cols, n_heads, 1, 0);
        assert!(
            matches!(err, Error::Shape { .. }),
            "{cols} cols, {n_heads} heads: {err}"
        );
    }
}

/// Positions past the table are a context overflow, including absurd start positions
/// (which must not overflow `start_pos + n`).
#[test]
fn rope_past_the_table_is_context_overflow() {
    for (n, start_pos) in [
        (1, 16),
        (4, 13),
        (17, 0),
        (1, usize::MAX),
        (2, usize::MAX - 1),
    ] {
        let err = rope_err(16, 2, n, start_pos);
        assert!(
            matches!(err, Error::ContextOverflow { max: 16, .. }),
            "n={n} start={start_pos}: {err}"
        );
    }
    // Exactly filling the table is fine.
    let table = RopeTable::new(RopeStyle::RotateHalf, 8, 8, 10000.0, 16).unwrap();
    let mut x = Data::zeros(DataType::F32, &[4, 16]).unwrap();
    run(Op::Rope {
        x: &mut x,
        table: &table,
        n_heads: 2,
        start_pos: 12,
    })
    .unwrap();
}
