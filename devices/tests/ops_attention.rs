//! `Op::Attention` (causal scaled dot-product attention, Vaswani et al. 2017, with
//! grouped-query heads, Ainslie et al. 2023) and the KV store (`Op::CopyRows`) on the CPU
//! device against a naive f64 formula.

mod common;

use common::*;
use flm_core::{AttentionOperands, AttentionParams, Data, DataType, Error, Op};
use flm_devices::cpu::PARALLEL_MIN_WORK;

/// The multiply-adds of a case, as the CPU device weighs them against `PARALLEL_MIN_WORK`.
fn work(c: &AttentionCase) -> usize {
    c.n * c.heads.0 * (c.start_pos + c.n) * c.head_dim * 2
}

/// Query head `h` reads KV head `h / (n_heads / n_kv_heads)`; row `i` (position
/// `p = start_pos + i`) attends to cache rows `0..=p`, or with a window `w` to the rows
/// `t > p − w` of them:
/// `out = Σ_t softmax_t(s_t)·v_t`, `s_t = scale·q·k_t`, or with a soft cap `cap` the
/// capped `cap·tanh(s_t / cap)`, in f64.
///
/// Tolerance per element: each f32 score is off by about `DOT_REL·scale·Σ|q·k|` (see
/// [`DOT_REL`]), which moves the output by at most twice that times `max|v|`; the f32
/// weighted sum of `len` values adds about `u·√len·max|v|`.
fn reference(
    c: &AttentionCase,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    scale: f64,
) -> (Vec<f64>, Vec<f64>) {
    let (hd, kv_dim) = (c.head_dim, c.kv_dim());
    let (n_heads, n_kv_heads) = c.heads;
    let group = n_heads / n_kv_heads;
    let mut want = vec![0.0; c.n * c.q_dim()];
    let mut tol = vec![0.0; want.len()];
    for i in 0..c.n {
        let len = c.start_pos + i + 1;
        let first = c.mask.window.map_or(0, |w| len.saturating_sub(w));
        for h in 0..n_heads {
            let qh = &q[(i * n_heads + h) * hd..][..hd];
            let kv_off = (h / group) * hd;
            let (mut scores, mut max_mag) = (Vec::with_capacity(len), 0.0f64);
            for t in first..len {
                let kt = &k[t * kv_dim + kv_off..][..hd];
                let dot: f64 = qh.iter().zip(kt).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = qh
                    .iter()
                    .zip(kt)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                let s = dot * scale;
                scores.push(match c.mask.softcap {
                    Some(cap) => cap as f64 * (s / cap as f64).tanh(),
                    None => s,
                });
                max_mag = max_mag.max(mag * scale);
            }
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            let mut vmax = 0.0f64;
            let out = &mut want[(i * n_heads + h) * hd..][..hd];
            for (t, w) in (first..).zip(&weights) {
                let vt = &v[t * kv_dim + kv_off..][..hd];
                for (o, &x) in out.iter_mut().zip(vt) {
                    *o += w / total * x as f64;
                    vmax = vmax.max((x as f64).abs());
                }
            }
            let t = vmax * (2.0 * (DOT_REL * max_mag + 4.0 * EPS) + EPS * (len as f64).sqrt());
            tol[(i * n_heads + h) * hd..][..hd].fill(t);
        }
    }
    (want, tol)
}

/// Runs case `c` on random operands from `rng(seed)`, the queries times `q_scale` (large
/// values make the softmax peaked), against [`reference`].
fn check(c: AttentionCase, q_scale: f32, seed: u64) {
    assert_eq!(c.heads.0 % c.heads.1, 0);
    assert!(
        !c.mask.alibi && c.mask.bidirectional == 0,
        "the reference is causal without ALiBi"
    );
    let mut rng = rng(seed);
    let kv_dim = c.kv_dim();
    // Three spare rows past `start_pos + n`, and the rows before the first row's window,
    // hold NaN: they must never be read.
    let max_seq = c.start_pos + c.n + 3;
    let filled = (c.start_pos + c.n) * kv_dim;
    let unseen = c
        .mask
        .window
        .map_or(0, |w| (c.start_pos + 1).saturating_sub(w))
        * kv_dim;
    let cache = |rng: &mut rand::rngs::StdRng| {
        let mut values = uniform(rng, max_seq * kv_dim, 1.0);
        values[filled..].fill(f32::NAN);
        values[..unseen].fill(f32::NAN);
        (f32_data(&[max_seq, kv_dim], &values), values)
    };
    let (k_data, k) = cache(&mut rng);
    let (v_data, v) = cache(&mut rng);
    let (q_data, q) = random_f32(&mut rng, &[c.n, c.q_dim()], q_scale);
    let params = c.params();
    let mut out = nan_output(&[c.n, c.q_dim()]);
    run(Op::Attention {
        operands: AttentionOperands {
            q: &q_data,
            cache_k: &k_data,
            cache_v: &v_data,
            rope: None,
            params,
            sinks: None,
            output: &mut out,
        },
        start_pos: c.start_pos,
    })
    .unwrap();
    let (want, tol) = reference(&c, &q, &k, &v, params.scale as f64);
    assert_close(
        &format!("Attention {c:?}"),
        out.as_f32().unwrap(),
        &want,
        |i| tol[i],
    );
}

/// Multi-head (groups of 1), grouped-query and multi-query heads; odd head sizes; decode
/// and prefill rows from position 0 and from later positions; all on one thread.
#[test]
fn attention_matches_formula() {
    let cases = [
        AttentionCase::new(1, 0, (4, 4), 8), // one position: the output is v row 0
        AttentionCase::new(1, 37, (8, 2), 16), // decode, groups of 4
        AttentionCase::new(5, 0, (4, 1), 7), // prefill from 0, multi-query
        AttentionCase::new(6, 11, (6, 3), 5), // prefill after a first chunk, groups of 2
        AttentionCase::new(3, 4, (2, 2), 1), // head_dim 1
        AttentionCase::new(9, 20, (3, 1), 33),
    ];
    for (s, c) in cases.into_iter().enumerate() {
        assert!(work(&c) < PARALLEL_MIN_WORK, "{c:?}");
        check(c, 1.0, 0x30 + s as u64);
    }
}

/// Decode and prefill sizes above `PARALLEL_MIN_WORK`.
#[test]
fn attention_parallel_matches_formula() {
    let cases = [
        AttentionCase::new(1, 300, (8, 2), 64),
        AttentionCase::new(17, 40, (4, 2), 32),
        AttentionCase::new(2, 70, (32, 8), 65),
    ];
    for (s, c) in cases.into_iter().enumerate() {
        assert!(work(&c) >= PARALLEL_MIN_WORK, "{c:?}");
        check(c, 1.0, 0x40 + s as u64);
    }
}

/// Sliding windows (Mistral) shorter than, equal to and longer than the causal prefix, in
/// decode and in prefill chunks, window 1 (each row sees itself only), on one thread and in
/// parallel.
#[test]
fn attention_sliding_window_matches_formula() {
    let windowed = |c: AttentionCase, w| AttentionCase {
        mask: Mask {
            window: Some(w),
            ..c.mask
        },
        ..c
    };
    let cases = [
        windowed(AttentionCase::new(1, 37, (8, 2), 16), 8),
        windowed(AttentionCase::new(1, 7, (8, 2), 16), 8),
        windowed(AttentionCase::new(1, 3, (4, 4), 8), 8),
        windowed(AttentionCase::new(9, 20, (3, 1), 33), 4),
        windowed(AttentionCase::new(24, 0, (4, 2), 16), 8),
        windowed(AttentionCase::new(5, 2, (4, 2), 7), 1),
        windowed(AttentionCase::new(1, 300, (8, 2), 64), 100),
        windowed(AttentionCase::new(17, 40, (4, 2), 32), 20),
    ];
    for (s, c) in cases.into_iter().enumerate() {
        check(c, 1.0, 0x70 + s as u64);
    }
}

/// Soft-capped scores (Gemma 2's `attn_logit_softcapping`), with peaked queries so that the
/// cap bites, in decode and prefill, with a window, on one thread and in parallel.
#[test]
fn attention_soft_cap_matches_formula() {
    let capped = |c: AttentionCase, cap, window| AttentionCase {
        mask: Mask {
            softcap: Some(cap),
            window,
            ..c.mask
        },
        ..c
    };
    let cases = [
        capped(AttentionCase::new(1, 37, (8, 2), 16), 2.0, None),
        capped(AttentionCase::new(9, 20, (3, 1), 33), 0.5, Some(6)),
        capped(AttentionCase::new(17, 40, (4, 2), 32), 5.0, None),
    ];
    for (s, c) in cases.into_iter().enumerate() {
        check(c, 8.0, 0x90 + s as u64);
    }
}

/// Scores in the hundreds: exp overflows unless the row maximum is subtracted first.
#[test]
fn attention_large_scores_stay_finite() {
    for (s, q_scale) in [(0, 40.0), (1, 400.0)] {
        check(AttentionCase::new(4, 9, (4, 2), 16), q_scale, 0x50 + s);
    }
}

struct Shapes {
    q: [usize; 2],
    cache_k: [usize; 2],
    cache_v: [usize; 2],
    out: [usize; 2],
    heads: (usize, usize),
    start_pos: usize,
    bidirectional: usize,
    window: Option<usize>,
}

fn attention_err(s: Shapes) -> Error {
    let z = |shape: [usize; 2]| Data::zeros(DataType::F32, &shape).unwrap();
    run(Op::Attention {
        operands: AttentionOperands {
            q: &z(s.q),
            cache_k: &z(s.cache_k),
            cache_v: &z(s.cache_v),
            rope: None,
            params: AttentionParams {
                n_heads: s.heads.0,
                n_kv_heads: s.heads.1,
                scale: 0.25,
                alibi: false,
                softcap: None,
                bidirectional: s.bidirectional,
                sliding_window: s.window,
            },
            sinks: None,
            output: &mut z(s.out),
        },
        start_pos: s.start_pos,
    })
    .unwrap_err()
}

/// A valid layout: 2 rows, 4 heads of 8 over 2 KV heads, a cache of 10 positions.
const OK: Shapes = Shapes {
    q: [2, 32],
    cache_k: [10, 16],
    cache_v: [10, 16],
    out: [2, 32],
    heads: (4, 2),
    start_pos: 3,
    bidirectional: 0,
    window: None,
};

#[test]
fn attention_shape_errors() {
    let cases = [
        Shapes {
            heads: (4, 3),
            ..OK
        }, // KV heads do not divide query heads
        Shapes {
            heads: (4, 0),
            ..OK
        }, // no KV heads
        Shapes {
            heads: (0, 0),
            ..OK
        }, // no heads
        Shapes {
            heads: (5, 1),
            ..OK
        }, // heads do not divide q's width
        Shapes {
            cache_k: [10, 8],
            cache_v: [10, 8],
            ..OK
        }, // cache width != kv_dim
        Shapes {
            cache_v: [9, 16],
            ..OK
        }, // V cache differs from K cache
        Shapes { out: [2, 16], ..OK }, // output width
        Shapes { out: [1, 32], ..OK }, // output rows
        Shapes {
            window: Some(0),
            ..OK
        }, // an empty sliding window
        Shapes {
            window: Some(4),
            bidirectional: 2,
            ..OK
        }, // a sliding window with a prefix-LM mask
    ];
    for (i, s) in cases.into_iter().enumerate() {
        let err = attention_err(s);
        assert!(matches!(err, Error::Shape { .. }), "case {i}: {err}");
    }
}

/// `start_pos + n` past the cache is a context overflow, also for absurd `start_pos`.
#[test]
fn attention_past_the_cache_is_context_overflow() {
    for start_pos in [9, 20, usize::MAX, usize::MAX - 1] {
        let err = attention_err(Shapes { start_pos, ..OK });
        assert!(
            matches!(err, Error::ContextOverflow { max: 10, .. }),
            "start {start_pos}: {err}"
        );
    }
    let err = attention_err(Shapes { start_pos: 9, ..OK });
    assert!(
        matches!(
            err,
            Error::ContextOverflow {
                needed: 11,
                max: 10
            }
        ),
        "{err}"
    );
}

/// Storing a prefill chunk's keys at `start_pos` writes exactly those rows, bit for bit;
/// then picking the last row of the chunk (the other use of `CopyRows`).
#[test]
fn kv_store_copies_rows_exactly() {
    let mut rng = rng(0x60);
    let (max_seq, kv_dim) = (16, 33);
    for (n, start_pos) in [(1, 0), (1, 15), (5, 3), (16, 0)] {
        let (mut cache, before) = random_f32(&mut rng, &[max_seq, kv_dim], 1.0);
        let (k_data, k) = random_f32(&mut rng, &[n, kv_dim], 1.0);
        run(Op::CopyRows {
            src: (&k_data, 0),
            dst: (&mut cache, start_pos),
            n_rows: n,
        })
        .unwrap();
        let mut want = before;
        want[start_pos * kv_dim..(start_pos + n) * kv_dim].copy_from_slice(&k);
        assert_eq!(
            cache.as_f32().unwrap(),
            &want[..],
            "n={n} start={start_pos}"
        );

        let mut last = nan_output(&[1, kv_dim]);
        run(Op::CopyRows {
            src: (&k_data, n - 1),
            dst: (&mut last, 0),
            n_rows: 1,
        })
        .unwrap();
        assert_eq!(last.as_f32().unwrap(), &k[(n - 1) * kv_dim..]);
    }
}

/// Rows outside either tensor are out of bounds (the op is a generic row copy, so it
/// reports `OutOfBounds`, not `ContextOverflow`), also for absurd row indices; different
/// widths are a shape error.
#[test]
fn kv_store_errors() {
    let z = |shape: &[usize]| Data::zeros(DataType::F32, shape).unwrap();
    let copy = |src: [usize; 2], src_row, n_rows, dst: [usize; 2], dst_row| {
        run(Op::CopyRows {
            src: (&z(&src), src_row),
            dst: (&mut z(&dst), dst_row),
            n_rows,
        })
        .unwrap_err()
    };
    for (src_row, n_rows, dst_row) in [
        (0, 2, 15),
        (0, 17, 0),
        (3, 2, 0),
        (0, 1, usize::MAX),
        (usize::MAX, 1, 0),
        (0, usize::MAX, 0),
    ] {
        let err = copy([4, 8], src_row, n_rows, [16, 8], dst_row);
        assert!(
            matches!(err, Error::OutOfBounds(_)),
            "{src_row} {n_rows} {dst_row}: {err}"
        );
    }
    let err = copy([4, 8], 0, 1, [16, 9], 0);
    assert!(matches!(err, Error::Shape { .. }), "{err}");
}
