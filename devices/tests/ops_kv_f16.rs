//! f16 KV caches on the CPU device (`--kv-dtype f16`): `Op::CopyRows` and `Op::ScatterRows`
//! into an f16 cache round each value as `half::f16::from_f32` does (to nearest, ties to
//! even), and `Op::Attention` / `Op::PagedAttention` over an f16 cache give, bit for bit,
//! their result over an f32 cache holding the same rounded values (the widening is exact and
//! the arithmetic the same), at every instruction-set level; each level's f16 result is also
//! checked against the portable twin's.

mod common;

use common::*;
use flm_core::{AttentionOperands, AttentionParams, Data, DataType, Executor, Op};
use flm_devices::{CpuDevice, Isa};
use half::f16;

fn executor_at(isa: Isa) -> Executor {
    Executor::with_profiling(vec![Box::new(CpuDevice::with_isa(isa).unwrap())], false)
}

/// `values` rounded to f16, as an f16 tensor and as the f32 tensor of the same values.
fn f16_and_rounded(shape: &[usize], values: &[f32]) -> (Data, Data) {
    let half = to_f16(&f32_data(shape, values));
    let rounded = f32_data(shape, &half.to_f32_vec().unwrap());
    (half, rounded)
}

fn cases() -> Vec<AttentionCase> {
    let case = AttentionCase::new;
    vec![
        case(1, 0, (4, 4), 64),
        case(1, 37, (8, 2), 64),
        case(5, 11, (6, 1), 5),
        AttentionCase {
            mask: Mask {
                window: Some(7),
                alibi: true,
                ..Mask::default()
            },
            ..case(3, 20, (4, 4), 33)
        },
        AttentionCase {
            mask: Mask {
                bidirectional: 6,
                softcap: Some(0.9),
                ..Mask::default()
            },
            ..case(4, 2, (4, 4), 16)
        },
        // Above the parallel threshold, with 128-wide heads.
        case(9, 100, (32, 8), 128),
    ]
}

fn attend(exec: &Executor, c: AttentionCase, q: &Data, k: &Data, v: &Data) -> Vec<f32> {
    output_of(&[c.n, c.q_dim()], |output| {
        exec.run(Op::Attention {
            operands: AttentionOperands {
                q,
                cache_k: k,
                cache_v: v,
                rope: None,
                params: c.params(),
                sinks: None,
                output,
            },
            start_pos: c.start_pos,
        })
    })
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn attention_over_an_f16_cache_equals_an_f32_cache_of_the_rounded_values() {
    let scalar = executor_at(Isa::Scalar);
    for (i, c) in cases().into_iter().enumerate() {
        let mut rng = rng(0xf16 + i as u64);
        let rows = c.start_pos + c.n + 3;
        let kv_dim = c.kv_dim();
        let (q, _) = random_f32(&mut rng, &[c.n, c.q_dim()], 2.0);
        let (k16, k32) = f16_and_rounded(&[rows, kv_dim], &uniform(&mut rng, rows * kv_dim, 3.0));
        let (v16, v32) = f16_and_rounded(&[rows, kv_dim], &uniform(&mut rng, rows * kv_dim, 1.0));
        let twin: Vec<f64> = attend(&scalar, c, &q, &k16, &v16)
            .iter()
            .map(|&x| x as f64)
            .collect();
        for isa in Isa::supported() {
            let exec = executor_at(isa);
            let half = attend(&exec, c, &q, &k16, &v16);
            let full = attend(&exec, c, &q, &k32, &v32);
            assert!(same_bits(&half, &full), "{isa:?} {c:?}");
            // Outputs are convex combinations of values in [-1, 1]; the levels differ in
            // the order of f32 sums and in the exponential's polynomial.
            assert_close(&format!("{isa:?} {c:?}"), &half, &twin, |_| 1e-4);
        }
    }
}

#[test]
fn paged_attention_over_an_f16_pool_equals_an_f32_pool_of_the_rounded_values() {
    let (block_size, n_heads, n_kv_heads, head_dim) = (5, 8, 2, 24);
    let kv_dim = n_kv_heads * head_dim;
    let seqs_at = [(13usize, 1usize), (0, 6), (30, 2)];
    let mut rng = rng(0x9a6e);
    let n_blocks = 16;
    let pool_rows = n_blocks * block_size;
    let (k16, k32) = f16_and_rounded(
        &[pool_rows, kv_dim],
        &uniform(&mut rng, pool_rows * kv_dim, 2.0),
    );
    let (v16, v32) = f16_and_rounded(
        &[pool_rows, kv_dim],
        &uniform(&mut rng, pool_rows * kv_dim, 1.0),
    );
    // Disjoint, shuffled block tables.
    let tables: [Vec<u32>; 3] = [vec![9, 2, 14], vec![0, 11], vec![3, 7, 1, 12, 5, 8, 15]];
    let seqs = paged_seqs(seqs_at, &tables);
    let rows: usize = seqs_at.iter().map(|s| s.1).sum();
    let (q, _) = random_f32(&mut rng, &[rows, n_heads * head_dim], 2.0);
    for (alibi, window) in [(false, None), (true, Some(6))] {
        let paged = |exec: &Executor, k: &Data, v: &Data| {
            let mut out = nan_output(q.shape());
            exec.run(Op::PagedAttention {
                operands: AttentionOperands {
                    q: &q,
                    cache_k: k,
                    cache_v: v,
                    rope: None,
                    params: AttentionParams {
                        n_heads,
                        n_kv_heads,
                        scale: 1.0 / (head_dim as f32).sqrt(),
                        alibi,
                        softcap: None,
                        bidirectional: 0,
                        sliding_window: window,
                    },
                    sinks: None,
                    output: &mut out,
                },
                block_size,
                seqs: &seqs,
            })
            .unwrap();
            out.to_f32_vec().unwrap()
        };
        for isa in Isa::supported() {
            let exec = executor_at(isa);
            assert!(
                same_bits(&paged(&exec, &k16, &v16), &paged(&exec, &k32, &v32)),
                "{isa:?} alibi={alibi} window={window:?}"
            );
        }
    }
}

/// Values whose rounding to f16 is easy to get wrong: ties (to even), the largest finite
/// value and the first that overflows, subnormals, signed zero, infinities and NaN.
fn awkward_values() -> Vec<f32> {
    let mut rng = rng(0x7e5);
    let mut v = vec![
        1.0 + 2f32.powi(-11),       // a tie: rounds down to 1.0 (even)
        1.0 + 3.0 * 2f32.powi(-11), // a tie: rounds up to 1 + 2^-9 (even)
        65504.0,
        65519.99,
        65520.0, // rounds to infinity
        -1e6,
        2f32.powi(-24), // the smallest subnormal
        3e-8,           // rounds to 2^-24
        2f32.powi(-26), // rounds to 0
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    v.extend(uniform(&mut rng, 64 - v.len(), 100.0));
    v
}

#[test]
fn copy_rows_and_scatter_rows_round_into_an_f16_cache_as_half_does() {
    let cols = 16;
    let src_values = awkward_values();
    let src = f32_data(&[4, cols], &src_values);
    let want = |r: usize| -> Vec<u16> {
        src_values[r * cols..][..cols]
            .iter()
            .map(|&x| f16::from_f32(x).to_bits())
            .collect()
    };
    let row_bits = |d: &Data, r: usize| -> Vec<u16> {
        d.as_f16().unwrap()[r * cols..][..cols]
            .iter()
            .map(|h| h.to_bits())
            .collect()
    };
    for isa in Isa::supported() {
        let exec = executor_at(isa);
        let mut cache = Data::zeros(DataType::F16, &[6, cols]).unwrap();
        exec.run(Op::CopyRows {
            src: (&src, 1),
            dst: (&mut cache, 2),
            n_rows: 3,
        })
        .unwrap();
        for r in 0..3 {
            assert_eq!(
                row_bits(&cache, 2 + r),
                want(1 + r),
                "{isa:?} CopyRows row {r}"
            );
        }
        assert!(row_bits(&cache, 0).iter().all(|&b| b == 0));

        let mut pool = Data::zeros(DataType::F16, &[9, cols]).unwrap();
        exec.run(Op::ScatterRows {
            src: &src,
            rows: &[7, 0, 4, 2],
            dst: &mut pool,
        })
        .unwrap();
        for (r, slot) in [7, 0, 4, 2].into_iter().enumerate() {
            assert_eq!(
                row_bits(&pool, slot),
                want(r),
                "{isa:?} ScatterRows row {r}"
            );
        }
    }
}
