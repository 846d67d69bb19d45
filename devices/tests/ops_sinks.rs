//! Attention sinks (gpt-oss; transformers' `modeling_gpt_oss.py`, `eager_attention_forward`)
//! on the CPU device: `Op::Attention` with `sinks` against the formula in f64 (decode,
//! prefill, GQA, sliding windows, ALiBi, soft caps), sinks of −∞ against no sinks bit for
//! bit, `Op::PagedAttention` against `Op::Attention`, and the contract's checks.
//!
//! The level is the one `FLM_CPU_ISA` selects (`isa_twins.rs` compares every level with the
//! portable twin, sinks included).

mod common;

use common::*;
use flm_core::{alibi_slopes, AttentionOperands, Data, DataType, Error, Op};

/// The operands of one case: the caches `[start_pos + n, kv_dim]`, the queries, the sinks.
struct Operands {
    k: Vec<f32>,
    v: Vec<f32>,
    q: Vec<f32>,
    sinks: Vec<f32>,
}

impl Operands {
    /// Random keys and values in `[-1, 1)`, queries in `[-q_scale, q_scale)` and sinks in
    /// `[-3, 3)`, then `sinks[h] = s` for each `(h, s)` of `fixed`.
    fn new(c: &AttentionCase, q_scale: f32, fixed: &[(usize, f32)], seed: u64) -> Operands {
        let mut rng = rng(seed);
        let rows = c.start_pos + c.n;
        let k = uniform(&mut rng, rows * c.kv_dim(), 1.0);
        let v = uniform(&mut rng, rows * c.kv_dim(), 1.0);
        let q = uniform(&mut rng, c.n * c.q_dim(), q_scale);
        let mut sinks = uniform(&mut rng, c.heads.0, 3.0);
        for &(h, s) in fixed {
            sinks[h] = s;
        }
        Operands { k, v, q, sinks }
    }

    /// `Op::Attention` of case `c` over these operands, with the sinks or without.
    fn attend(&self, c: &AttentionCase, sinks: Option<&[f32]>) -> Vec<f32> {
        let rows = c.start_pos + c.n;
        let k = f32_data(&[rows, c.kv_dim()], &self.k);
        let v = f32_data(&[rows, c.kv_dim()], &self.v);
        let q = f32_data(&[c.n, c.q_dim()], &self.q);
        let sinks = sinks.map(|s| f32_data(&[s.len()], s));
        output_of(&[c.n, c.q_dim()], |output| {
            run(Op::Attention {
                operands: AttentionOperands {
                    q: &q,
                    cache_k: &k,
                    cache_v: &v,
                    rope: None,
                    params: c.params(),
                    sinks: sinks.as_ref(),
                    output,
                },
                start_pos: c.start_pos,
            })
        })
    }
}

/// `out_h = Σ_t p_t·v_t`, `p_t = e^(s_t − M) / (e^(sink_h − M) + Σ_t e^(s_t − M))`,
/// `M = max(sink_h, max_t s_t)`, over the positions `t` row `i` sees, where `s_t` is
/// `scale·q·k_t`, soft-capped (`cap·tanh(s/cap)`), plus the ALiBi bias `m_h·t`; in f64.
///
/// Tolerance per element: each f32 score is off by about `DOT_REL·scale·Σ|q·k|` from its dot
/// product and a few units of rounding of its size from the cap and the bias, which moves
/// the output by at most twice the worst of those times `max|v|`; the f32 weighted sum of
/// `len` values adds about `u·√len·max|v|`.
fn reference(c: &AttentionCase, o: &Operands) -> (Vec<f64>, Vec<f64>) {
    let (hd, kv_dim) = (c.head_dim, c.kv_dim());
    let (n_heads, n_kv_heads) = c.heads;
    let group = n_heads / n_kv_heads;
    let scale = c.params().scale as f64;
    let slopes = alibi_slopes(n_heads);
    let mut want = vec![0.0; c.n * c.q_dim()];
    let mut tol = vec![0.0; want.len()];
    for i in 0..c.n {
        let len = c.start_pos + i + 1;
        let first = c.mask.window.map_or(0, |w| len.saturating_sub(w));
        for h in 0..n_heads {
            let qh = &o.q[(i * n_heads + h) * hd..][..hd];
            let kv_off = (h / group) * hd;
            let (mut scores, mut err) = (Vec::new(), 0.0f64);
            for t in first..len {
                let kt = &o.k[t * kv_dim + kv_off..][..hd];
                let dot: f64 = qh.iter().zip(kt).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = qh
                    .iter()
                    .zip(kt)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                let mut s = dot * scale;
                if let Some(cap) = c.mask.softcap {
                    s = cap as f64 * (s / cap as f64).tanh();
                }
                if c.mask.alibi {
                    s += slopes[h] as f64 * t as f64;
                }
                scores.push(s);
                err = err.max(DOT_REL * mag * scale + 4.0 * EPS * (s.abs() + 1.0));
            }
            let sink = o.sinks[h] as f64;
            let max = scores.iter().copied().fold(sink, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total = (sink - max).exp() + weights.iter().sum::<f64>();
            let mut vmax = 0.0f64;
            let out = &mut want[(i * n_heads + h) * hd..][..hd];
            for (t, w) in (first..).zip(&weights) {
                let vt = &o.v[t * kv_dim + kv_off..][..hd];
                for (out, &x) in out.iter_mut().zip(vt) {
                    *out += w / total * x as f64;
                    vmax = vmax.max((x as f64).abs());
                }
            }
            let t = vmax * (2.0 * (err + 4.0 * EPS) + EPS * (len as f64).sqrt());
            tol[(i * n_heads + h) * hd..][..hd].fill(t);
        }
    }
    (want, tol)
}

/// The cases: decode and prefill, multi-head, GQA and multi-query, odd head sizes, a
/// sliding window, ALiBi, soft caps, and shapes above the parallel threshold.
fn cases() -> Vec<AttentionCase> {
    let case = AttentionCase::new;
    let mask = |c: AttentionCase, window, alibi, softcap| AttentionCase {
        mask: Mask {
            window,
            alibi,
            softcap,
            bidirectional: 0,
        },
        ..c
    };
    vec![
        case(1, 0, (4, 4), 8),
        case(1, 37, (8, 2), 16),
        case(5, 0, (4, 1), 7),
        case(6, 11, (6, 3), 33),
        mask(case(1, 40, (8, 2), 64), Some(9), false, None),
        mask(case(7, 13, (4, 2), 16), Some(5), false, None),
        mask(case(1, 30, (8, 4), 32), None, true, None),
        mask(case(6, 20, (6, 2), 17), Some(7), true, None),
        mask(case(4, 9, (4, 2), 64), None, false, Some(0.9)),
        mask(case(3, 50, (8, 8), 24), Some(11), true, Some(5.0)),
        case(1, 1000, (8, 2), 64),
        case(40, 100, (16, 4), 64),
    ]
}

/// Every case against [`reference`], with sinks among the scores (random in `[-3, 3)`),
/// one far above them (the output shrinks towards 0) and one far below (no effect).
#[test]
fn attention_with_sinks_matches_formula() {
    for (i, c) in cases().into_iter().enumerate() {
        for q_scale in [1.0, 4.0] {
            let fixed = [(0, 30.0), (c.heads.0 - 1, -60.0)];
            let o = Operands::new(&c, q_scale, &fixed, 0x51c + i as u64);
            let got = o.attend(&c, Some(&o.sinks));
            let (want, tol) = reference(&c, &o);
            assert_close(&format!("sinks {c:?} q×{q_scale}"), &got, &want, |i| {
                tol[i]
            });
        }
    }
}

/// A sink far above every score takes almost all of the probability, and the others
/// none of the values: the output is the values' average times a tiny weight.
#[test]
fn a_dominant_sink_silences_its_head() {
    let c = AttentionCase::new(3, 10, (4, 2), 16);
    let o = Operands::new(&c, 1.0, &[(0, 50.0), (1, 50.0), (2, 50.0), (3, 50.0)], 7);
    let got = o.attend(&c, Some(&o.sinks));
    assert!(got.iter().all(|x| x.abs() < 1e-15), "{got:?}");
}

/// Sinks of −∞ give the bits of attention without sinks: `e^(−∞) = 0` joins the sum and
/// the maximum is the scores'.
#[test]
fn sinks_of_minus_infinity_are_no_sinks() {
    for (i, c) in cases().into_iter().enumerate() {
        let o = Operands::new(&c, 2.0, &[], 0x1af + i as u64);
        let none = vec![f32::NEG_INFINITY; c.heads.0];
        assert_same_bits(
            &format!("{c:?}"),
            &o.attend(&c, Some(&none)),
            &o.attend(&c, None),
        );
    }
}

/// Paged attention with sinks gives each sequence the bits of `Op::Attention` over a
/// contiguous cache, the block tables scattering its positions over the pool.
#[test]
fn paged_attention_with_sinks_equals_contiguous() {
    let (block_size, heads, hd) = (4, (6, 2), 24);
    let seqs = [(0, 5), (9, 1), (21, 3), (40, 1)];
    for (window, alibi) in [(None, false), (Some(6), true)] {
        let mask = Mask {
            window,
            alibi,
            ..Mask::default()
        };
        let case = |(start_pos, n)| AttentionCase {
            mask,
            ..AttentionCase::new(n, start_pos, heads, hd)
        };
        let kv_dim = heads.1 * hd;
        let mut rng = rng(0x9a9);
        let sinks = uniform(&mut rng, heads.0, 3.0);
        let ops: Vec<Operands> = seqs
            .iter()
            .enumerate()
            .map(|(s, &seq)| Operands::new(&case(seq), 2.0, &[], 0x3c + s as u64))
            .collect();
        // Each sequence's positions in blocks taken from the end of the pool backwards.
        let n_blocks: usize = seqs
            .iter()
            .map(|&(p, n)| (p + n).div_ceil(block_size))
            .sum();
        let mut pool_k = vec![f32::NAN; n_blocks * block_size * kv_dim];
        let mut pool_v = pool_k.clone();
        let (mut tables, mut next, mut q) = (Vec::new(), n_blocks as u32, Vec::new());
        for (&(p, n), o) in seqs.iter().zip(&ops) {
            let table: Vec<u32> = (0..(p + n).div_ceil(block_size))
                .map(|_| {
                    next -= 1;
                    next
                })
                .collect();
            for t in 0..p + n {
                let slot = table[t / block_size] as usize * block_size + t % block_size;
                pool_k[slot * kv_dim..][..kv_dim].copy_from_slice(&o.k[t * kv_dim..][..kv_dim]);
                pool_v[slot * kv_dim..][..kv_dim].copy_from_slice(&o.v[t * kv_dim..][..kv_dim]);
            }
            q.extend_from_slice(&o.q);
            tables.push(table);
        }
        let total: usize = seqs.iter().map(|s| s.1).sum();
        let pool_rows = n_blocks * block_size;
        let (q, pool_k, pool_v) = (
            f32_data(&[total, heads.0 * hd], &q),
            f32_data(&[pool_rows, kv_dim], &pool_k),
            f32_data(&[pool_rows, kv_dim], &pool_v),
        );
        let sink_data = f32_data(&[heads.0], &sinks);
        let paged_seqs = paged_seqs(seqs, &tables);
        let got = output_of(&[total, heads.0 * hd], |output| {
            run(Op::PagedAttention {
                operands: AttentionOperands {
                    q: &q,
                    cache_k: &pool_k,
                    cache_v: &pool_v,
                    rope: None,
                    params: case(seqs[0]).params(),
                    sinks: Some(&sink_data),
                    output,
                },
                block_size,
                seqs: &paged_seqs,
            })
        });
        let want: Vec<f32> = seqs
            .iter()
            .zip(&ops)
            .flat_map(|(&seq, o)| o.attend(&case(seq), Some(&sinks)))
            .collect();
        assert_same_bits(&format!("paged, {mask:?}"), &got, &want);
    }
}

/// The contract refuses sinks that are not f32 or not one per query head.
#[test]
fn sinks_must_be_f32_one_per_query_head() {
    let c = AttentionCase::new(1, 2, (4, 2), 8);
    let (q, cache) = (
        f32_data(&[1, c.q_dim()], &vec![0.0; c.q_dim()]),
        f32_data(&[3, c.kv_dim()], &vec![0.0; 3 * c.kv_dim()]),
    );
    let attend = |sinks: &Data| {
        run(Op::Attention {
            operands: AttentionOperands {
                q: &q,
                cache_k: &cache,
                cache_v: &cache,
                rope: None,
                params: c.params(),
                sinks: Some(sinks),
                output: &mut nan_output(&[1, c.q_dim()]),
            },
            start_pos: 2,
        })
    };
    assert!(attend(&f32_data(&[4], &[0.0; 4])).is_ok());
    assert!(matches!(
        attend(&f32_data(&[3], &[0.0; 3])),
        Err(Error::Shape {
            op: "Attention",
            ..
        })
    ));
    assert!(matches!(
        attend(&Data::zeros(DataType::F16, &[4]).unwrap()),
        Err(Error::DType {
            op: "Attention",
            ..
        })
    ));
}
