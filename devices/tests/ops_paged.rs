//! The ops of batched serving over a paged KV cache on the CPU device:
//! `Op::PagedAttention` (vLLM's PagedAttention, Kwon et al. 2023) against `Op::Attention`
//! over a contiguous cache holding the same keys and values, sequence by sequence — the same
//! bits at every instruction-set level, and each level against the portable twin; odd block
//! sizes, GQA, sliding windows, ALiBi and attention sinks; `Op::ScatterRows` and
//! `Op::RopeRows`.

mod common;

use common::*;
use flm_core::{
    AttentionOperands, AttentionParams, Data, Error, Executor, Op, PagedSeq, RopeStyle, RopeTable,
};
use flm_devices::{CpuDevice, Isa};
use rand::seq::SliceRandom;

fn executor_at(isa: Isa) -> Executor {
    Executor::with_profiling(vec![Box::new(CpuDevice::with_isa(isa).unwrap())], false)
}

#[derive(Debug, Clone, Copy)]
struct Case {
    block_size: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    window: Option<usize>,
    alibi: bool,
    /// Attention sinks (gpt-oss), one random logit per query head.
    sinks: bool,
}

impl Case {
    /// The attention of the case, paged or contiguous.
    fn params(&self) -> AttentionParams {
        AttentionParams {
            alibi: self.alibi,
            sliding_window: self.window,
            ..AttentionParams::causal(
                self.n_heads,
                self.n_kv_heads,
                1.0 / (self.head_dim as f32).sqrt(),
            )
        }
    }
}

/// A batch: per sequence `(start_pos, n_rows)`, its contiguous keys/values, its rows of q.
struct Batch {
    seqs: Vec<(usize, usize)>,
    q: Data,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    pool_k: Data,
    pool_v: Data,
    tables: Vec<Vec<u32>>,
    sinks: Option<Data>,
}

fn batch(c: Case, seqs: &[(usize, usize)], seed: u64) -> Batch {
    let mut rng = rng(seed);
    let kv_dim = c.n_kv_heads * c.head_dim;
    let needed: Vec<usize> = seqs
        .iter()
        .map(|&(p, n)| (p + n).div_ceil(c.block_size))
        .collect();
    let n_blocks = needed.iter().sum::<usize>() + 3;
    let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
    ids.shuffle(&mut rng);
    // Junk in the whole pool: a wrong slot shows.
    let pool_rows = n_blocks * c.block_size;
    let mut pool_k = uniform(&mut rng, pool_rows * kv_dim, 1.0);
    let mut pool_v = uniform(&mut rng, pool_rows * kv_dim, 1.0);
    let (mut keys, mut values, mut tables) = (Vec::new(), Vec::new(), Vec::new());
    let mut next = 0;
    for (&(p, n), &need) in seqs.iter().zip(&needed) {
        let table = ids[next..next + need].to_vec();
        next += need;
        let k = uniform(&mut rng, (p + n) * kv_dim, 1.0);
        let v = uniform(&mut rng, (p + n) * kv_dim, 1.0);
        for t in 0..p + n {
            let slot = table[t / c.block_size] as usize * c.block_size + t % c.block_size;
            pool_k[slot * kv_dim..][..kv_dim].copy_from_slice(&k[t * kv_dim..][..kv_dim]);
            pool_v[slot * kv_dim..][..kv_dim].copy_from_slice(&v[t * kv_dim..][..kv_dim]);
        }
        keys.push(k);
        values.push(v);
        tables.push(table);
    }
    let rows: usize = seqs.iter().map(|s| s.1).sum();
    let (q, _) = random_f32(&mut rng, &[rows, c.n_heads * c.head_dim], 2.0);
    let sinks = c.sinks.then(|| random_f32(&mut rng, &[c.n_heads], 3.0).0);
    Batch {
        seqs: seqs.to_vec(),
        q,
        keys,
        values,
        pool_k: f32_data(&[pool_rows, kv_dim], &pool_k),
        pool_v: f32_data(&[pool_rows, kv_dim], &pool_v),
        tables,
        sinks,
    }
}

fn paged(exec: &Executor, c: Case, b: &Batch) -> Vec<f32> {
    let seqs = paged_seqs(b.seqs.iter().copied(), &b.tables);
    let mut out = nan_output(b.q.shape());
    exec.run(Op::PagedAttention {
        operands: AttentionOperands {
            q: &b.q,
            cache_k: &b.pool_k,
            cache_v: &b.pool_v,
            rope: None,
            params: c.params(),
            sinks: b.sinks.as_ref(),
            output: &mut out,
        },
        block_size: c.block_size,
        seqs: &seqs,
    })
    .unwrap();
    out.as_f32().unwrap().to_vec()
}

/// Each sequence alone through `Op::Attention` over a contiguous cache.
fn contiguous(exec: &Executor, c: Case, b: &Batch) -> Vec<f32> {
    let (q_dim, kv_dim) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
    let q = b.q.as_f32().unwrap();
    let mut all = Vec::new();
    let mut row = 0;
    for (s, &(start_pos, n)) in b.seqs.iter().enumerate() {
        let qs = f32_data(&[n, q_dim], &q[row * q_dim..][..n * q_dim]);
        let k = f32_data(&[start_pos + n, kv_dim], &b.keys[s]);
        let v = f32_data(&[start_pos + n, kv_dim], &b.values[s]);
        let mut out = nan_output(&[n, q_dim]);
        exec.run(Op::Attention {
            operands: AttentionOperands {
                q: &qs,
                cache_k: &k,
                cache_v: &v,
                rope: None,
                params: c.params(),
                sinks: b.sinks.as_ref(),
                output: &mut out,
            },
            start_pos,
        })
        .unwrap();
        all.extend_from_slice(out.as_f32().unwrap());
        row += n;
    }
    all
}

fn cases() -> Vec<(Case, Vec<(usize, usize)>)> {
    let case = |block_size, n_heads, n_kv_heads, head_dim, window, alibi| Case {
        block_size,
        n_heads,
        n_kv_heads,
        head_dim,
        window,
        alibi,
        sinks: false,
    };
    let sinks = |c| Case { sinks: true, ..c };
    let mixed = vec![(0, 5), (9, 1), (20, 3), (2, 1), (0, 1)];
    vec![
        (case(1, 4, 4, 8, None, false), mixed.clone()),
        (case(3, 6, 2, 17, None, false), mixed.clone()),
        (case(5, 8, 1, 64, Some(4), false), mixed.clone()),
        (case(16, 4, 2, 48, None, true), mixed.clone()),
        (case(7, 6, 3, 33, Some(9), true), mixed.clone()),
        // Above the parallel threshold: a long prefill chunk beside decode rows.
        (
            case(16, 8, 2, 64, None, false),
            vec![(100, 40), (300, 1), (7, 1)],
        ),
        // Attention sinks (gpt-oss), with and without ALiBi and a window.
        (sinks(case(3, 6, 2, 17, None, false)), mixed.clone()),
        (sinks(case(5, 8, 1, 64, Some(4), true)), mixed),
        (
            sinks(case(16, 8, 2, 64, Some(50), false)),
            vec![(100, 40), (300, 1), (7, 1)],
        ),
    ]
}

#[test]
fn paged_attention_equals_contiguous_attention_bit_for_bit_at_every_level() {
    for isa in Isa::supported() {
        let exec = executor_at(isa);
        for (i, (c, seqs)) in cases().into_iter().enumerate() {
            let b = batch(c, &seqs, 0x9a6ed + i as u64);
            let got = paged(&exec, c, &b);
            let want = contiguous(&exec, c, &b);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{isa:?} {c:?}"
            );
        }
    }
}

#[test]
fn paged_attention_simd_levels_match_the_portable_twin() {
    let scalar = executor_at(Isa::Scalar);
    for isa in Isa::supported() {
        let exec = executor_at(isa);
        for (i, (c, seqs)) in cases().into_iter().enumerate() {
            let b = batch(c, &seqs, 0x7a1e + i as u64);
            let want: Vec<f64> = paged(&scalar, c, &b).iter().map(|&v| v as f64).collect();
            let got = paged(&exec, c, &b);
            // Outputs are convex combinations of values in [-1, 1]; the levels differ in
            // the order of f32 sums and in the exponential's polynomial.
            assert_close("PagedAttention", &got, &want, |_| 1e-4);
        }
    }
}

#[test]
fn paged_attention_rejects_bad_tables() {
    let c = Case {
        block_size: 4,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 8,
        window: None,
        alibi: false,
        sinks: false,
    };
    let b = batch(c, &[(3, 2)], 1);
    let run_with = |blocks: &[u32], n_rows: usize, block_size: usize| {
        let seqs = [PagedSeq {
            n_rows,
            start_pos: 3,
            blocks,
        }];
        let mut out = nan_output(b.q.shape());
        run(Op::PagedAttention {
            operands: AttentionOperands {
                q: &b.q,
                cache_k: &b.pool_k,
                cache_v: &b.pool_v,
                rope: None,
                params: AttentionParams::causal(2, 1, 1.0),
                sinks: None,
                output: &mut out,
            },
            block_size,
            seqs: &seqs,
        })
    };
    let table = b.tables[0].clone();
    run_with(&table, 2, 4).unwrap();
    // Positions 3..5 need two blocks.
    assert!(matches!(
        run_with(&table[..1], 2, 4),
        Err(Error::ContextOverflow { .. })
    ));
    assert!(matches!(
        run_with(&[table[0], 999], 2, 4),
        Err(Error::OutOfBounds(_))
    ));
    assert!(matches!(run_with(&table, 1, 4), Err(Error::Shape { .. })));
    assert!(matches!(run_with(&table, 2, 0), Err(Error::Shape { .. })));
    assert!(matches!(run_with(&table, 2, 3), Err(Error::Shape { .. })));
}

#[test]
fn scatter_rows_writes_each_row_to_its_slot() {
    let src = f32_data(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let mut dst = f32_data(&[5, 2], &[0.0; 10]);
    run(Op::ScatterRows {
        src: &src,
        rows: &[4, 0, 2],
        dst: &mut dst,
    })
    .unwrap();
    assert_eq!(
        dst.as_f32().unwrap(),
        &[3.0, 4.0, 0.0, 0.0, 5.0, 6.0, 0.0, 0.0, 1.0, 2.0]
    );
    let err = run(Op::ScatterRows {
        src: &src,
        rows: &[4, 0, 5],
        dst: &mut dst,
    });
    assert!(matches!(err, Err(Error::OutOfBounds(_))));
    let err = run(Op::ScatterRows {
        src: &src,
        rows: &[4, 0],
        dst: &mut dst,
    });
    assert!(matches!(err, Err(Error::Shape { .. })));
}

/// `RopeRows` at positions `p_i` equals `Rope` of each row alone at `start_pos = p_i`,
/// bit for bit, in both styles and at every level.
#[test]
fn rope_rows_equals_rope_row_by_row() {
    let positions = [5u32, 0, 17, 3, 3, 40];
    for isa in Isa::supported() {
        let exec = executor_at(isa);
        for (style, head_dim, rotary) in [
            (RopeStyle::AdjacentPairs, 64, 64),
            (RopeStyle::RotateHalf, 34, 34),
            (RopeStyle::AdjacentPairs, 16, 8),
        ] {
            let table = RopeTable::new(style, head_dim, rotary, 10000.0, 64).unwrap();
            let n_heads = 3;
            let cols = n_heads * head_dim;
            let (_, values) = random_f32(&mut rng(7), &[positions.len(), cols], 1.0);
            let mut x = f32_data(&[positions.len(), cols], &values);
            exec.run(Op::RopeRows {
                x: &mut x,
                table: &table,
                n_heads,
                positions: &positions,
            })
            .unwrap();
            for (i, &p) in positions.iter().enumerate() {
                let mut row = f32_data(&[1, cols], &values[i * cols..][..cols]);
                exec.run(Op::Rope {
                    x: &mut row,
                    table: &table,
                    n_heads,
                    start_pos: p as usize,
                })
                .unwrap();
                let got = &x.as_f32().unwrap()[i * cols..][..cols];
                assert!(got
                    .iter()
                    .zip(row.as_f32().unwrap())
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
            }
            let err = exec.run(Op::RopeRows {
                x: &mut x,
                table: &table,
                n_heads,
                positions: &[1, 2, 3, 4, 5, 64],
            });
            assert!(matches!(err, Err(Error::ContextOverflow { .. })));
        }
    }
}
