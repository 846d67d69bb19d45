//! Every SIMD level this CPU supports against the portable twin ([`Isa::Scalar`]) on the
//! same random operands, odd sizes included: tiles of weight rows and input rows that do not
//! divide the sizes, partial blocks and groups, and sizes above the parallel threshold.
//! `FLM_CPU_ISA` narrows the check to the level it names ([`Isa::to_check`]): the emulated
//! aarch64 CPUs of `.ci/aarch64` each check their own best level.
//!
//! The formula tests of the other files run with the level `FLM_CPU_ISA` selects (the best
//! one by default); `.ci/run` also runs them with each lower level forced.

#[macro_use]
mod common;

use common::*;
use flm_core::{
    panels, AttentionOperands, Data, DataType, Executor, Op, RopeStyle, RopeTable, TokenIds,
};
use flm_devices::{CpuDevice, Isa};

/// An executor holding only the CPU device at `isa`.
fn executor_at(isa: Isa) -> Executor {
    let device = CpuDevice::with_isa(isa).expect("a supported level");
    Executor::with_profiling(vec![Box::new(device)], false)
}

/// Runs `Op::Linear` at `isa`.
fn linear_at(isa: Isa, x: &Data, weight: &Data, bias: Option<&Data>) -> Vec<f32> {
    let mut out = nan_output(&[x.rows(), weight.rows()]);
    executor_at(isa)
        .run(Op::Linear {
            input: x,
            weight,
            bias,
            output: &mut out,
        })
        .expect("linear");
    out.as_f32().expect("f32").to_vec()
}

/// Each level's Linear against the scalar one, to the bit: every quantised dtype sums in one
/// order at every level (int8 and int4 in panels, packed per call or at load; the K-quants,
/// Q5_0, Q8_0, the IQ4 types and MXFP4 in 8 lanes).
fn linear_matches_scalar(dtype: DataType) {
    let sizes = [
        (1, 1, 1),
        (1, 33, 5),
        (2, 64, 4),
        (3, 95, 9),
        (4, 128, 8),
        (5, 160, 7),
        (7, 257, 13),
        (9, 300, 6),
        (1, 2048, 67),
        (6, 1000, 45),
        (37, 64, 512),
        (37, 172, 64),
        (8, 33, 17),
        (16, 96, 16),
        (17, 2048, 35),
        // Rows longer than one segment of an int4 decode tile's integer sums (16 chunks
        // of 128 columns for 4 input rows, 20 for 3, 32 for 2, 64 for 1), ending in a
        // partial quad of chunks and a partial chunk.
        (4, 4100, 9),
        (3, 2600, 6),
        (2, 4200, 5),
        (1, 8300, 5),
        // Prefill (AVX-512 int4: unpacked tiles) over rows of more than 2048 columns, the
        // last chunk partial.
        (7, 4500, 9),
    ];
    assert_linear_levels_same(0x15a, dtype, sizes);
}

/// Linear with a bias at each SIMD level against the scalar one, to the bit, on random
/// operands of each `(n, k, m)` of `shapes` and `dtype` weights (int8 and int4 weights
/// also in panels), from `rng(seed)`.
fn assert_linear_levels_same(
    seed: u64,
    dtype: DataType,
    shapes: impl IntoIterator<Item = (usize, usize, usize)>,
) {
    let mut rng = rng(seed);
    for (n, k, m) in shapes {
        let (x, _) = random_f32(&mut rng, &[n, k], 1.0);
        let (w, _) = random_weight(&mut rng, &[m, k], dtype);
        let (b, _) = random_f32(&mut rng, &[m], 1.0);
        let want = linear_at(Isa::Scalar, &x, &w, Some(&b));
        for isa in simd_levels() {
            let got = linear_at(isa, &x, &w, Some(&b));
            let what = format!("Linear {dtype} at {isa}, n={n} k={k} m={m}");
            assert_same_bits(&what, &got, &want);
            if panels::has_panels(dtype) {
                let packed = w.to_panels().expect("panels");
                assert_same_bits(&what, &linear_at(isa, &x, &packed, Some(&b)), &want);
            }
        }
    }
}

dtype_tests!([
    int8: I8,
    int4_g32: I4G32,
    int4_g64: I4G64,
    int4_g128: I4G128,
    int4_sym_g32: I4SymG32,
    int4_sym_g64: I4SymG64,
    int4_sym_g128: I4SymG128,
    int4_zp_g32: I4ZpG32,
    int4_zp_g64: I4ZpG64,
    int4_zp_g128: I4ZpG128,
    q4_k: Q4K,
    q5_k: Q5K,
    q6_k: Q6K,
    q8_0: Q8_0,
    q5_0: Q5_0,
    iq4_nl: IQ4NL,
    iq4_xs: IQ4XS,
    mxfp4: MXFP4
] linear_matches_scalar);

/// An input row holding a NaN or an infinity makes that row's outputs NaN at every level,
/// as f32 arithmetic would (its block is quantised to a NaN scale), and leaves the other
/// rows' outputs as they are alone: for decode, for prefill and for the AMX tiles' rows.
fn non_finite_inputs_give_nan_rows(dtype: DataType) {
    let mut rng = rng(0x7a7);
    let (k, m) = (300, 37);
    let (w, _) = random_weight(&mut rng, &[m, k], dtype);
    for n in [1, 5, 17] {
        let (clean, _) = random_f32(&mut rng, &[n, k], 1.0);
        let mut values = clean.as_f32().unwrap().to_vec();
        let poisoned = [0, n / 2, n - 1];
        values[5] = f32::NAN;
        values[(n / 2) * k + 40] = f32::INFINITY;
        values[(n - 1) * k + k - 1] = f32::NEG_INFINITY;
        let x = Data::from_f32(&[n, k], &values).unwrap();
        for isa in levels() {
            let want = linear_at(isa, &clean, &w, None);
            let got = linear_at(isa, &x, &w, None);
            for i in 0..n {
                let (row, alone) = (&got[i * m..(i + 1) * m], &want[i * m..(i + 1) * m]);
                if poisoned.contains(&i) {
                    assert!(
                        row.iter().all(|y| y.is_nan()),
                        "{dtype} at {isa}, n={n}: {row:?}"
                    );
                } else {
                    let bits = |r: &[f32]| r.iter().map(|y| y.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(row), bits(alone), "{dtype} at {isa}, n={n}, row {i}");
                }
            }
        }
    }
}

dtype_tests!([
    int8: I8,
    int4_g32: I4G32,
    int4_sym_g64: I4SymG64,
    int4_zp_g128: I4ZpG128,
    q4_k: Q4K,
    q5_k: Q5K,
    q6_k: Q6K,
    q8_0: Q8_0,
    q5_0: Q5_0,
    iq4_xs: IQ4XS,
    mxfp4: MXFP4
] non_finite_inputs_give_nan_rows);

/// The levels to check: every level this CPU has, or the one `FLM_CPU_ISA` names.
fn levels() -> Vec<Isa> {
    Isa::to_check().expect("FLM_CPU_ISA names a level this CPU has")
}

/// [`levels`] without the portable one they are compared with.
fn simd_levels() -> Vec<Isa> {
    levels().into_iter().filter(|&i| i != Isa::Scalar).collect()
}

/// Asserts that `at(isa)` is at every SIMD level what it is at the scalar one; `what` names
/// the case.
fn assert_levels_eq<T: PartialEq + std::fmt::Debug>(what: &str, at: impl Fn(Isa) -> T) {
    let want = at(Isa::Scalar);
    for isa in simd_levels() {
        assert_eq!(at(isa), want, "{what}, at {isa}");
    }
}

/// Vector lengths below, at and just past the 8 lanes of AVX2 and the 16 of AVX-512 and
/// their multiples, so that every kernel runs its full vectors and its masked tails.
const LENS: [usize; 13] = [1, 7, 8, 9, 15, 16, 17, 33, 63, 64, 65, 100, 257];

/// Runs `op` on the CPU device at `isa`.
fn run_at(isa: Isa, op: Op<'_>) {
    executor_at(isa).run(op).expect("op");
}

/// Float-weight Linear at each level against the scalar one, bit for bit (every level has
/// vectors of the same lanes and sums them alike), for decode and prefill rows, every length
/// of [`LENS`] as `k`, rows longer than one 512-column panel, and shapes above
/// `PARALLEL_MIN_WORK` (decode split over rows of the weight, prefill over blocks of rows
/// with the transposed output).
fn float_linear_matches_scalar(dtype: DataType) {
    let mut shapes = Vec::new();
    for k in LENS {
        for (n, m) in [(1, 9), (1, 24), (2, 17), (5, 8), (7, 3)] {
            shapes.push((n, k, m));
        }
    }
    // Prefill over several 512-column panels, with partial last panels and row blocks.
    shapes.extend([(3, 1100, 5), (6, 600, 37)]);
    shapes.extend([
        (1, 2048, 67),
        (1, 257, 600),
        (4, 2048, 40),
        (9, 300, 65),
        (37, 172, 64),
    ]);
    assert_linear_levels_same(0x15b, dtype, shapes);
}

dtype_tests!([f32: F32, f16: F16, bf16: BF16] float_linear_matches_scalar);

/// RMSNorm at each level against the scalar one, bit for bit.
fn rms_norm_matches_scalar(dtype: DataType) {
    let mut rng = rng(0x16c);
    for dim in LENS.into_iter().chain([4096]) {
        for n in [1, 3] {
            let (x, _) = random_f32(&mut rng, &[n, dim], 1.0);
            let (g, _) = random_weight(&mut rng, &[dim], dtype);
            let norm = |isa| {
                let mut out = nan_output(&[n, dim]);
                run_at(
                    isa,
                    Op::RmsNorm {
                        input: &x,
                        weight: &g,
                        eps: 1e-5,
                        output: &mut out,
                    },
                );
                out.to_f32_vec().unwrap()
            };
            let want = norm(Isa::Scalar);
            for isa in simd_levels() {
                let what = format!("RmsNorm {dtype} at {isa}, n={n} dim={dim}");
                assert_same_bits(&what, &norm(isa), &want);
            }
        }
    }
}

dtype_tests!([f32: F32, f16: F16, bf16: BF16] rms_norm_matches_scalar);

/// Embedding rows of f32, f16 and bf16 tables: widening is exact, so the levels agree bit
/// for bit.
fn embedding_matches_scalar(dtype: DataType) {
    let mut rng = rng(0x17d);
    for dim in LENS {
        let (table, _) = random_weight(&mut rng, &[11, dim], dtype);
        let tokens = [3, 0, 10, 3, 7];
        let embed = |isa| {
            let mut out = nan_output(&[tokens.len(), dim]);
            run_at(
                isa,
                Op::Embedding {
                    table: &table,
                    tokens: TokenIds::Host(&tokens),
                    output: &mut out,
                },
            );
            out.to_f32_vec().unwrap()
        };
        assert_levels_eq(&format!("Embedding {dtype}, dim={dim}"), embed);
    }
}

dtype_tests!([f32: F32, f16: F16, bf16: BF16] embedding_matches_scalar);

/// RoPE at each level against the scalar one, bit for bit: both styles, head sizes of 8,
/// 16, 64 and 128 lanes and odd ones (tails), partial rotary dimensions, decode and prefill
/// rows; dimensions past `rotary_dim` stay unchanged.
#[test]
fn rope_matches_scalar() {
    let mut seed = 0x18e;
    let dims = [
        (2, 2),
        (8, 8),
        (10, 6),
        (16, 16),
        (34, 34),
        (40, 40),
        (64, 32),
        (64, 64),
        (128, 128),
    ];
    for style in [RopeStyle::AdjacentPairs, RopeStyle::RotateHalf] {
        for (head_dim, rotary_dim) in dims {
            let table = RopeTable::new(style, head_dim, rotary_dim, 10000.0, 512).unwrap();
            for (n, start_pos, n_heads) in [(1, 0, 1), (1, 37, 8), (5, 100, 3), (3, 509, 2)] {
                seed += 1;
                let (x, xv) = random_f32(&mut rng(seed), &[n, n_heads * head_dim], 1.0);
                let rotate = |isa| {
                    let mut y = x.clone();
                    run_at(
                        isa,
                        Op::Rope {
                            x: &mut y,
                            table: &table,
                            n_heads,
                            start_pos,
                        },
                    );
                    y.to_f32_vec().unwrap()
                };
                let want = rotate(Isa::Scalar);
                let rest = (0..n * n_heads * head_dim).filter(|c| c % head_dim >= rotary_dim);
                for c in rest {
                    assert_eq!(want[c].to_bits(), xv[c].to_bits(), "past rotary_dim: {c}");
                }
                for isa in simd_levels() {
                    let what = format!(
                        "Rope {style:?} at {isa}, head_dim={head_dim} rotary={rotary_dim} \
                         n={n} start={start_pos} heads={n_heads}"
                    );
                    assert_same_bits(&what, &rotate(isa), &want);
                }
            }
        }
    }
}

/// Attention at each level against the scalar one, bit for bit: head sizes of 8, 16, 64
/// and 128 and odd ones, multi-head, grouped-query and multi-query heads, decode and prefill
/// rows, and shapes above `PARALLEL_MIN_WORK`; masks, biases, soft caps, f16 caches and
/// attention sinks.
#[test]
fn attention_matches_scalar() {
    let case = AttentionCase::new;
    let mut cases = Vec::new();
    for head_dim in [8, 16, 64, 128, 1, 5, 33, 65] {
        cases.extend([
            case(1, 0, (4, 4), head_dim),
            case(1, 37, (8, 4), head_dim),
            case(1, 100, (4, 1), head_dim),
            case(5, 0, (6, 3), head_dim),
            case(7, 13, (2, 2), head_dim),
        ]);
    }
    cases.extend([
        case(1, 300, (8, 2), 64),
        case(1, 1000, (8, 4), 8),
        case(17, 40, (4, 2), 32),
        case(2, 70, (32, 8), 65),
        case(9, 100, (32, 4), 128),
    ]);
    let mut seed = 0x19f;
    for c in cases {
        seed += 1;
        let hd = c.head_dim;
        let rows = c.start_pos + c.n;
        let mut rng = rng(seed);
        let (k, _) = random_f32(&mut rng, &[rows, c.kv_dim()], 1.0);
        let (v, _) = random_f32(&mut rng, &[rows, c.kv_dim()], 1.0);
        let (q, _) = random_f32(&mut rng, &[c.n, c.q_dim()], 1.0);
        // The f16 cache of `--kv-dtype f16`: the same values rounded.
        let (k16, v16) = (to_f16(&k), to_f16(&v));
        // Attention sinks (gpt-oss): logits around the scores', one far above them and one
        // of −∞ (no sink).
        let mut sink_values = uniform(&mut rng, c.heads.0, 3.0);
        sink_values[0] = f32::NEG_INFINITY;
        if c.heads.0 > 1 {
            sink_values[1] = 40.0;
        }
        let sinks = f32_data(&[c.heads.0], &sink_values);
        // Causal, then ALiBi with every filled row visible (the prefix-LM mask at its widest),
        // then ALiBi in a sliding window of 7 positions (ALiBi's `t` stays the cache row),
        // then soft-capped scores (Gemma 2), whose tanh does not widen the error; then
        // causal and windowed over the f16 cache; then each with sinks.
        for (alibi, bidirectional, window, softcap, f16_cache, with_sinks) in [
            (false, 0, None, None, false, false),
            (true, rows, None, None, false, false),
            (true, 0, Some(7), None, false, false),
            (false, 0, Some(9), Some(0.9), false, false),
            (false, 0, None, None, true, false),
            (true, 0, Some(7), None, true, false),
            (false, 0, None, None, false, true),
            (true, 0, Some(7), None, false, true),
            (false, 0, Some(9), Some(0.9), false, true),
            (false, 0, None, None, true, true),
        ] {
            let (k, v) = if f16_cache { (&k16, &v16) } else { (&k, &v) };
            let masked = AttentionCase {
                mask: Mask {
                    window,
                    bidirectional,
                    alibi,
                    softcap,
                },
                ..c
            };
            let attend = |isa| {
                let mut out = nan_output(&[c.n, c.q_dim()]);
                run_at(
                    isa,
                    Op::Attention {
                        operands: AttentionOperands {
                            q: &q,
                            cache_k: k,
                            cache_v: v,
                            rope: None,
                            params: masked.params(),
                            sinks: with_sinks.then_some(&sinks),
                            output: &mut out,
                        },
                        start_pos: c.start_pos,
                    },
                );
                out.to_f32_vec().unwrap()
            };
            let want = attend(Isa::Scalar);
            for isa in simd_levels() {
                let what = format!(
                    "Attention at {isa}, n={} start={} heads={:?} head_dim={hd} alibi={alibi} \
                     bidirectional={bidirectional} window={window:?} softcap={softcap:?} \
                     f16 cache={f16_cache} sinks={with_sinks}",
                    c.n, c.start_pos, c.heads
                );
                assert_same_bits(&what, &attend(isa), &want);
            }
        }
    }
}

/// SiLU·up at each level against the scalar one, bit for bit, including the overflow and
/// underflow edges of `exp`.
#[test]
fn silu_mul_matches_scalar() {
    let mut rng = rng(0x1a0);
    let edges = [
        0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0, 87.0, -87.0, 88.0, -88.0, -89.0, -100.0, 100.0,
        -1e30, 1e30, -87.3, -87.4,
    ];
    let mut inputs: Vec<(Vec<f32>, Vec<f32>)> = LENS
        .into_iter()
        .chain([1 << 17 | 3])
        .map(|len| (uniform(&mut rng, len, 8.0), uniform(&mut rng, len, 2.0)))
        .collect();
    inputs.push((edges.to_vec(), vec![1.5; edges.len()]));
    for (g, u) in inputs {
        let len = g.len();
        let (gate, up) = (f32_data(&[1, len], &g), f32_data(&[1, len], &u));
        let silu = |isa| {
            let mut out = nan_output(&[1, len]);
            run_at(
                isa,
                Op::SiluMul {
                    gate: &gate,
                    up: &up,
                    output: &mut out,
                },
            );
            out.to_f32_vec().unwrap()
        };
        let want = silu(Isa::Scalar);
        for isa in simd_levels() {
            assert_same_bits(&format!("SiluMul at {isa}, len={len}"), &silu(isa), &want);
        }
    }
}

/// GELU·up (GeGLU) and soft-capping at each level against the scalar one, bit for bit, and
/// the scalar one against the f64 formulas (`0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))·u` and
/// `cap·tanh(x / cap)`). `tanh` comes from the polynomial `exp` as `(1 − e)/(1 + e)`, whose
/// error is absolute (about `4·EPS`) near 0, so the bounds are absolute plus relative.
#[test]
fn gelu_mul_and_soft_cap_match_scalar_and_f64() {
    let mut rng = rng(0x1a1);
    let mut inputs: Vec<(Vec<f32>, Vec<f32>)> = LENS
        .into_iter()
        .chain([1 << 17 | 3])
        .map(|len| (uniform(&mut rng, len, 8.0), uniform(&mut rng, len, 2.0)))
        .collect();
    let edges = [
        0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0, 60.0, -60.0, -1e30, 1e30,
    ];
    inputs.push((edges.to_vec(), vec![1.5; edges.len()]));
    let cap = 3.0f32;
    for (g, u) in inputs {
        let len = g.len();
        let (gate, up) = (f32_data(&[1, len], &g), f32_data(&[1, len], &u));
        let gelu_mul = |isa| {
            let mut out = nan_output(&[1, len]);
            let op = Op::GeluMul {
                gate: &gate,
                up: &up,
                output: &mut out,
            };
            run_at(isa, op);
            out.to_f32_vec().unwrap()
        };
        let soft_cap = |isa| {
            let mut x = gate.clone();
            run_at(isa, Op::SoftCap { x: &mut x, cap });
            x.to_f32_vec().unwrap()
        };
        let exact_gelu: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| {
                let (g, u) = (g as f64, u as f64);
                let inner = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
                0.5 * g * (1.0 + inner.tanh()) * u
            })
            .collect();
        let exact_cap: Vec<f64> = g
            .iter()
            .map(|&x| cap as f64 * (x as f64 / cap as f64).tanh())
            .collect();
        let bound = |want: &[f64], scale: f64| {
            let w = want.to_vec();
            move |i: usize| 16.0 * EPS * (w[i].abs() + scale)
        };
        let (want_gelu, want_cap) = (gelu_mul(Isa::Scalar), soft_cap(Isa::Scalar));
        assert_close(
            &format!("GeluMul scalar vs f64, len={len}"),
            &want_gelu,
            &exact_gelu,
            bound(&exact_gelu, 1.0),
        );
        assert_close(
            &format!("SoftCap scalar vs f64, len={len}"),
            &want_cap,
            &exact_cap,
            bound(&exact_cap, cap as f64),
        );
        for isa in simd_levels() {
            let what = format!("GeluMul at {isa}, len={len}");
            assert_same_bits(&what, &gelu_mul(isa), &want_gelu);
            let what = format!("SoftCap at {isa}, len={len}");
            assert_same_bits(&what, &soft_cap(isa), &want_cap);
        }
    }
}

/// `x += y` at each level: one correctly rounded addition per element, so bit for bit.
#[test]
fn add_matches_scalar() {
    let mut rng = rng(0x1b1);
    for len in LENS.into_iter().chain([1 << 17 | 5]) {
        let (x, _) = random_f32(&mut rng, &[1, len], 4.0);
        let (y, _) = random_f32(&mut rng, &[1, len], 4.0);
        let add = |isa| {
            let mut z = x.clone();
            run_at(isa, Op::Add { x: &mut z, y: &y });
            z.to_f32_vec().unwrap()
        };
        assert_levels_eq(&format!("Add, len={len}"), add);
    }
}

/// Argmax at each level: the same index, ties, NaN, infinities and maxima in the tail
/// included.
#[test]
fn argmax_matches_scalar() {
    let mut rng = rng(0x1c2);
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let mut rows: Vec<Vec<f32>> = LENS
        .into_iter()
        .chain([32000, 32003])
        .map(|len| uniform(&mut rng, len, 10.0))
        .collect();
    let mut tail = vec![0.5f32; 33];
    tail[32] = 1.0;
    rows.extend([
        vec![1.0, 3.0, 3.0, 2.0, 3.0],
        vec![-inf; 17],
        vec![nan; 9],
        vec![nan, -inf, 2.0, nan, 2.0, 7.0, nan, 7.0, 1.0],
        vec![-5.0, -2.0, -2.0, -7.0, -3.0, -2.0, -9.0, -1e30, -inf],
        vec![inf, 1.0, inf, 2.0, 3.0],
        tail,
    ]);
    for row in rows {
        let input = f32_data(&[1, row.len()], &row);
        let argmax = |isa| {
            let mut out = [u32::MAX];
            run_at(
                isa,
                Op::Argmax {
                    input: &input,
                    output: &mut out,
                },
            );
            out[0]
        };
        assert_levels_eq(&format!("Argmax, row {row:?}"), argmax);
    }
}

/// `Op::Linears` gives each part the bits `Op::Linear` gives it alone, at every level, on 1
/// and 2 threads. Parts of one quantised dtype
/// run together (one quantisation of the input, the rows of all parts split over the
/// threads at once); a run of float parts, or of another dtype, runs on its own. Sizes
/// include decode and prefill rows, parts shorter than a parallel chunk, and parts above
/// `PARALLEL_MIN_WORK` with rows that do not divide into tiles.
#[test]
fn linears_match_each_linear() {
    use flm_core::LinearPart;
    use DataType::*;
    let mut rng = rng(0x11ea);
    let dtypes = [
        [I4G32; 3],
        [I8; 3],
        [F16; 3],
        [I8, I8, F32],
        [I4G32, I4G128, I4G32],
        [I4SymG32, I4SymG32, I4SymG128],
        [I4ZpG32, I4ZpG128, I4ZpG32],
        [Q4K, Q6K, Q5K],
        [Q8_0, Q5_0, I8],
        [IQ4NL, MXFP4, IQ4XS],
    ];
    let sizes = [
        (1, 96, [40, 8, 8]),
        (3, 256, [64, 16, 24]),
        (9, 96, [40, 8, 8]),
        (1, 2048, [515, 64, 67]),
        (2, 1000, [300, 45, 67]),
    ];
    for dtypes in dtypes {
        for (n, k, ms) in sizes {
            let (x, _) = random_f32(&mut rng, &[n, k], 1.0);
            let weights: Vec<Data> = ms
                .iter()
                .zip(dtypes)
                .map(|(&m, dtype)| random_weight(&mut rng, &[m, k], dtype).0)
                .collect();
            let biases = [Some(random_f32(&mut rng, &[ms[0]], 1.0).0), None, None];
            for isa in levels() {
                let want: Vec<Vec<f32>> = weights
                    .iter()
                    .zip(&biases)
                    .map(|(w, b)| linear_at(isa, &x, w, b.as_ref()))
                    .collect();
                let exec = executor_at(isa);
                for threads in [1, 2] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .expect("thread pool");
                    let mut outs: Vec<Data> = ms.iter().map(|&m| nan_output(&[n, m])).collect();
                    {
                        let mut parts: Vec<LinearPart<'_>> = weights
                            .iter()
                            .zip(&biases)
                            .zip(outs.iter_mut())
                            .map(|((w, b), output)| LinearPart::new(w, b.as_ref(), output))
                            .collect();
                        let op = Op::Linears {
                            input: &x,
                            parts: &mut parts,
                        };
                        pool.install(|| exec.run(op)).expect("linears");
                    }
                    for (p, (got, want)) in outs.iter().zip(&want).enumerate() {
                        let got = got.as_f32().expect("f32");
                        let what = format!(
                            "part {p} of {dtypes:?} at {isa}, \
                                 {threads} threads, n={n} k={k} ms={ms:?}"
                        );
                        assert_eq!(got.len(), want.len(), "{what}");
                        let same = got
                            .iter()
                            .zip(want)
                            .all(|(g, w)| g.to_bits() == w.to_bits());
                        assert!(same, "{what}: {got:?} against {want:?}");
                    }
                }
            }
        }
    }
}

/// A part with a wrong shape fails the whole `Op::Linears` before any output is written.
#[test]
fn linears_check_every_part_first() {
    use flm_core::LinearPart;
    let mut rng = rng(0x11eb);
    let (x, _) = random_f32(&mut rng, &[1, 64], 1.0);
    let (w, _) = random_weight(&mut rng, &[16, 64], DataType::I8);
    let (bad, _) = random_weight(&mut rng, &[16, 32], DataType::I8);
    let mut good_out = nan_output(&[1, 16]);
    let mut bad_out = nan_output(&[1, 16]);
    let result = executor_at(Isa::Scalar).run(Op::Linears {
        input: &x,
        parts: &mut [
            LinearPart::new(&w, None, &mut good_out),
            LinearPart::new(&bad, None, &mut bad_out),
        ],
    });
    let err = result.expect_err("a [16, 32] weight for a [1, 64] input");
    assert!(err.to_string().contains("weight [16, 32]"), "{err}");
    assert!(good_out.as_f32().expect("f32").iter().all(|v| v.is_nan()));
}

/// Latent attention (values the latent keys, a decoupled RoPE part) and the per-head
/// products of multi-head latent attention at each level against the scalar one, bit for
/// bit: decode past the parallel threshold and a prefill, f32 and f16 caches.
#[test]
fn latent_attention_and_head_linear_match_scalar() {
    let mut rng = rng(0x1a7);
    for (n, start_pos, heads, latent, rope) in [(1, 40, 16, 512, 64), (6, 3, 4, 33, 7)] {
        let rows = start_pos + n;
        let (q, _) = random_f32(&mut rng, &[n, heads * latent], 0.5);
        let (q_rope, _) = random_f32(&mut rng, &[n, heads * rope], 0.5);
        let (c, _) = random_f32(&mut rng, &[rows, latent], 1.0);
        let (k_rope, _) = random_f32(&mut rng, &[rows, rope], 1.0);
        for f16 in [false, true] {
            let (c, k_rope) = if f16 {
                (to_f16(&c), to_f16(&k_rope))
            } else {
                (c.clone(), k_rope.clone())
            };
            assert_levels_eq(&format!("latent attention n={n} f16={f16}"), |isa| {
                let mut out = nan_output(&[n, heads * latent]);
                run_at(
                    isa,
                    Op::Attention {
                        operands: AttentionOperands {
                            q: &q,
                            cache_k: &c,
                            cache_v: &c,
                            rope: Some(flm_core::DecoupledRope {
                                q: &q_rope,
                                cache: &k_rope,
                            }),
                            params: flm_core::AttentionParams::causal(heads, 1, 0.1),
                            sinks: None,
                            output: &mut out,
                        },
                        start_pos,
                    },
                );
                out.to_f32_vec()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>()
            });
        }
        let weights: Vec<Data> = (0..heads)
            .map(|_| random_weight(&mut rng, &[rope + 5, latent], DataType::I8).0)
            .map(|w| w.to_panels().unwrap())
            .collect();
        assert_levels_eq(&format!("head linear n={n}"), |isa| {
            let mut out = nan_output(&[n, heads * (rope + 5)]);
            run_at(
                isa,
                Op::HeadLinear {
                    input: &q,
                    weights: &weights,
                    output: &mut out,
                },
            );
            out.to_f32_vec()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        });
    }
}
