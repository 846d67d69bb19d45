//! `Op::MoeFfn` on the CPU device against its formula (transformers'
//! `MixtralSparseMoeBlock` / `Qwen3MoeSparseMoeBlock`, and `GptOssMLP`'s biased router and
//! clamped experts), computed here in f64 one row at a time, its runs of the router's
//! experts (expert parallelism) against the whole op, and its contract's errors.

#[macro_use]
mod common;

use std::ops::Range;

use common::*;
use flm_core::{
    Data, DataType, Error, Expert, ExpertActivation, ExpertGroups, GroupScore, MoeRouting, Op,
    RouterScoring,
};

/// The reference: per row, softmax of the router logits, the `top_k` largest, optionally
/// renormalised, then the weighted sum of those experts' SwiGLUs, all in f64.
struct Reference {
    router: Vec<f32>,
    /// Each expert's gate, up and down values.
    experts: Vec<[Vec<f32>; 3]>,
    dim: usize,
    inner: usize,
}

impl Reference {
    fn row(&self, x: &[f32], top_k: usize, renormalize: bool) -> Vec<f64> {
        self.part(x, top_k, renormalize, 0..self.experts.len())
    }

    /// [`Reference::row`] with only the terms of the chosen experts in `held` (the routing
    /// still over all of them): what an op holding the experts `held` gives.
    fn part(&self, x: &[f32], top_k: usize, renormalize: bool, held: Range<usize>) -> Vec<f64> {
        let (dim, inner) = (self.dim, self.inner);
        let dot =
            |w: &[f32], v: &[f64]| -> f64 { w.iter().zip(v).map(|(&a, &b)| a as f64 * b).sum() };
        let x: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let logits: Vec<f64> = self.router.chunks(dim).map(|r| dot(r, &x)).collect();
        let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
        let sum: f64 = p.iter().sum();
        let mut order: Vec<usize> = (0..p.len()).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        let chosen = &order[..top_k];
        let kept: f64 = chosen.iter().map(|&e| p[e] / sum).sum();
        let mut out = vec![0.0; dim];
        for &e in chosen.iter().filter(|e| held.contains(e)) {
            let mut w = p[e] / sum;
            if renormalize {
                w /= kept;
            }
            let [gate, up, down] = &self.experts[e];
            let h: Vec<f64> = (0..inner)
                .map(|j| {
                    let g = dot(&gate[j * dim..(j + 1) * dim], &x);
                    let u = dot(&up[j * dim..(j + 1) * dim], &x);
                    g / (1.0 + (-g).exp()) * u
                })
                .collect();
            for (i, o) in out.iter_mut().enumerate() {
                *o += w * dot(&down[i * inner..(i + 1) * inner], &h);
            }
        }
        out
    }
}

/// A random router and experts of `dtype`, and the reference over their rounded values.
fn experts(
    seed: u64,
    n_experts: usize,
    dim: usize,
    inner: usize,
    dtype: DataType,
) -> (Data, Vec<Expert>, Reference) {
    let mut rng = rng(seed);
    // Router logits of O(1) so that the softmax is neither flat nor one-hot.
    let (router, router_values) = random_f32(&mut rng, &[n_experts, dim], 3.0 / dim as f32);
    let mut list = Vec::new();
    let mut values = Vec::new();
    for _ in 0..n_experts {
        let (gate, g) = random_weight(&mut rng, &[inner, dim], dtype);
        let (up, u) = random_weight(&mut rng, &[inner, dim], dtype);
        let (down, d) = random_weight(&mut rng, &[dim, inner], dtype);
        list.push(Expert {
            gate,
            up,
            down,
            biases: None,
        });
        values.push([g, u, d]);
    }
    let reference = Reference {
        router: router_values,
        experts: values,
        dim,
        inner,
    };
    (router, list, reference)
}

/// Every row within a few units of rounding of the reference for float weights, and of the
/// int8 activations' rounding for quantised ones; single rows (decode), odd batches in
/// which some experts get no row, top-1 to all experts, with and without renormalising.
fn moe_ffn_matches_formula(dtype: DataType) {
    let (n_experts, dim, inner) = (5, 33, 19);
    let (router, list, reference) = experts(0x3e, n_experts, dim, inner, dtype);
    let mut rng = rng(0x3f);
    for n in [1, 3, 37] {
        let (input, x) = random_f32(&mut rng, &[n, dim], 1.0);
        for (top_k, renormalize) in [(1, false), (2, true), (2, false), (5, true)] {
            let mut out = nan_output(&[n, dim]);
            run(Op::MoeFfn {
                input: &input,
                router: &router,
                experts: &list,
                first_expert: 0,
                routing: MoeRouting::softmax(top_k, renormalize),
                activation: ExpertActivation::SwiGlu,
                output: &mut out,
            })
            .unwrap();
            let want: Vec<f64> = x
                .chunks(dim)
                .flat_map(|row| reference.row(row, top_k, renormalize))
                .collect();
            // The int kernels round the activations to int8 per block: about 1% of the
            // largest output (the routing itself is the same for these inputs).
            let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let tol = if dtype.is_quantized() { 0.02 } else { 1e-5 } * scale;
            assert_close(
                &format!("{dtype} n={n} top_k={top_k} renormalize={renormalize}"),
                out.as_f32().unwrap(),
                &want,
                |_| tol,
            );
        }
    }
}

dtype_tests!([f32: F32, f16: F16, bf16: BF16, i8: I8, i4g32: I4G32, i4sg32: I4SymG32,
    mxfp4: MXFP4] moe_ffn_matches_formula);

/// gpt-oss's experts (transformers' `GptOssMLP`): the router's biased logits, a softmax over
/// the `top_k` largest, and per expert `down · ((u' + 1) · g' · σ(α g')) + b_down` with
/// `g = gate · x + b_gate` clamped above at the limit, `u = up · x + b_up` clamped to
/// `±limit`, in f64 here; f32 weights, a limit that cuts some of the values.
#[test]
fn gpt_oss_experts_match_formula() {
    let (n_experts, dim, inner, top_k) = (6, 24, 10, 2);
    let (alpha, limit) = (1.702f64, 0.8f64);
    let (router, mut list, reference) = experts(0x40, n_experts, dim, inner, DataType::F32);
    let mut rng = rng(0x41);
    let (logit_bias, lb) = random_f32(&mut rng, &[n_experts], 1.0);
    let mut biases = Vec::new();
    for e in &mut list {
        let (g, gv) = random_f32(&mut rng, &[inner], 1.0);
        let (u, uv) = random_f32(&mut rng, &[inner], 1.0);
        let (d, dv) = random_f32(&mut rng, &[dim], 1.0);
        e.biases = Some([g, u, d]);
        biases.push([gv, uv, dv]);
    }
    let dot = |w: &[f32], v: &[f64]| -> f64 { w.iter().zip(v).map(|(&a, &b)| a as f64 * b).sum() };
    let (mut clamped, mut values) = (0, 0);
    let mut row = |x: &[f32]| -> Vec<f64> {
        let x: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let logits: Vec<f64> = reference
            .router
            .chunks(dim)
            .zip(&lb)
            .map(|(r, &b)| dot(r, &x) + b as f64)
            .collect();
        let mut order: Vec<usize> = (0..n_experts).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let chosen = &order[..top_k];
        let max = logits[chosen[0]];
        let total: f64 = chosen.iter().map(|&e| (logits[e] - max).exp()).sum();
        let mut out = vec![0.0; dim];
        for &e in chosen {
            let w = (logits[e] - max).exp() / total;
            let [gate, up, down] = &reference.experts[e];
            let [bg, bu, bd] = &biases[e];
            let h: Vec<f64> = (0..inner)
                .map(|j| {
                    let g = dot(&gate[j * dim..(j + 1) * dim], &x) + bg[j] as f64;
                    let u = dot(&up[j * dim..(j + 1) * dim], &x) + bu[j] as f64;
                    values += 2;
                    clamped += usize::from(g > limit) + usize::from(u.abs() > limit);
                    let g = g.min(limit);
                    let u = u.clamp(-limit, limit);
                    (u + 1.0) * g / (1.0 + (-alpha * g).exp())
                })
                .collect();
            for (i, o) in out.iter_mut().enumerate() {
                *o += w * (dot(&down[i * inner..(i + 1) * inner], &h) + bd[i] as f64);
            }
        }
        out
    };
    for n in [1, 3, 37] {
        let (input, x) = random_f32(&mut rng, &[n, dim], 1.0);
        let mut out = nan_output(&[n, dim]);
        run(Op::MoeFfn {
            input: &input,
            router: &router,
            experts: &list,
            first_expert: 0,
            routing: MoeRouting {
                logit_bias: Some(&logit_bias),
                ..MoeRouting::softmax(top_k, true)
            },
            activation: ExpertActivation::ClampedSwiGlu {
                alpha: alpha as f32,
                limit: limit as f32,
            },
            output: &mut out,
        })
        .unwrap();
        let want: Vec<f64> = x.chunks(dim).flat_map(&mut row).collect();
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert_close(
            &format!("gpt-oss n={n}"),
            out.as_f32().unwrap(),
            &want,
            |_| 1e-5 * scale,
        );
    }
    // The clamp decides part of the values, so the test sees it.
    assert!(
        clamped * 10 > values,
        "{clamped} of {values} values clamped"
    );
}

/// Splits of 8 experts into 2 and 4 runs, even and uneven, by their bounds.
const SPLITS: [&[usize]; 4] = [&[0, 4, 8], &[0, 3, 8], &[0, 2, 4, 6, 8], &[0, 1, 4, 5, 8]];

/// One routing of [`expert_runs_add_up_to_the_whole_op`]: its name, experts, routing and
/// activation, and for plain softmax routings the `(top_k, renormalize)` of [`Reference`].
type RunCase<'a> = (
    &'static str,
    &'a [Expert],
    MoeRouting<'a>,
    ExpertActivation,
    Option<(usize, bool)>,
);

/// Expert parallelism: for random inputs and routings of 8 experts (softmax top-1 to all,
/// DeepSeek-V2's groups by their best with a scale, DeepSeek-V3's sigmoid groups with a
/// choice bias, gpt-oss's logit bias and biased clamped experts), each run of the experts
/// `lo..hi` of the splits into 2 and 4 runs gives the terms of its chosen experts: bit for
/// bit the single experts' outputs added in ascending order (as the whole op adds them),
/// and within rounding of [`Reference::part`] for the softmax routings; the runs' outputs
/// add up to the whole op's within the rounding of summing the terms in another order,
/// `(2·top_k + runs)·u·Σ|terms|`.
fn expert_runs_add_up_to_the_whole_op(dtype: DataType) {
    let (n_experts, dim, inner) = (8, 33, 19);
    let (router, list, reference) = experts(0x50, n_experts, dim, inner, dtype);
    let mut rng = rng(0x51);
    let (choice_bias, _) = random_f32(&mut rng, &[n_experts], 0.3);
    let (logit_bias, _) = random_f32(&mut rng, &[n_experts], 1.0);
    let mut biased = list.clone();
    for e in &mut biased {
        let [g, u, d] = [inner, inner, dim].map(|len| random_f32(&mut rng, &[len], 1.0).0);
        e.biases = Some([g, u, d]);
    }
    let groups = |top_groups, score| {
        Some(ExpertGroups {
            n_groups: 4,
            top_groups,
            score,
        })
    };
    let swiglu = ExpertActivation::SwiGlu;
    let mut cases: Vec<RunCase<'_>> = [(1, false), (2, true), (3, false), (8, true)]
        .map(|(k, r)| {
            (
                "softmax",
                &list[..],
                MoeRouting::softmax(k, r),
                swiglu,
                Some((k, r)),
            )
        })
        .to_vec();
    cases.extend([
        (
            "DeepSeek-V2",
            &list[..],
            MoeRouting {
                groups: groups(2, GroupScore::Max),
                scale: 1.5,
                ..MoeRouting::softmax(3, false)
            },
            swiglu,
            None,
        ),
        (
            "DeepSeek-V3",
            &list[..],
            MoeRouting {
                scoring: RouterScoring::Sigmoid,
                groups: groups(2, GroupScore::SumOfTop2),
                choice_bias: Some(&choice_bias),
                scale: 2.5,
                ..MoeRouting::softmax(3, true)
            },
            swiglu,
            None,
        ),
        (
            "gpt-oss",
            &biased[..],
            MoeRouting {
                logit_bias: Some(&logit_bias),
                ..MoeRouting::softmax(2, true)
            },
            ExpertActivation::ClampedSwiGlu {
                alpha: 1.702,
                limit: 0.8,
            },
            None,
        ),
    ]);
    let exec = executor();
    for n in [1, 5, 37] {
        let (input, x) = random_f32(&mut rng, &[n, dim], 1.0);
        for &(name, experts, routing, activation, softmax) in &cases {
            let what = format!("{dtype} {name} top_k={} n={n}", routing.top_k);
            let run_of = |lo: usize, hi: usize| {
                output_of(&[n, dim], |output| {
                    exec.run(Op::MoeFfn {
                        input: &input,
                        router: &router,
                        experts: &experts[lo..hi],
                        first_expert: lo,
                        routing,
                        activation,
                        output,
                    })
                })
            };
            let whole = run_of(0, n_experts);
            let singles: Vec<Vec<f32>> = (0..n_experts).map(|e| run_of(e, e + 1)).collect();
            let ascending = |lo: usize, hi: usize| {
                let mut sum = vec![0.0f32; n * dim];
                for single in &singles[lo..hi] {
                    sum.iter_mut().zip(single).for_each(|(s, &t)| *s += t);
                }
                sum
            };
            assert_same_bits(
                &format!("{what}: the singles"),
                &whole,
                &ascending(0, n_experts),
            );
            let terms: Vec<f64> = (0..n * dim)
                .map(|i| singles.iter().map(|s| s[i].abs() as f64).sum())
                .collect();
            let scale = whole.iter().fold(0.0f64, |m, v| m.max(v.abs() as f64));
            for bounds in SPLITS {
                let mut sum = vec![0.0f32; n * dim];
                for run in bounds.windows(2) {
                    let (lo, hi) = (run[0], run[1]);
                    let part = run_of(lo, hi);
                    let what = format!("{what}, experts {lo}..{hi}");
                    assert_same_bits(&what, &part, &ascending(lo, hi));
                    if let Some((top_k, renormalize)) = softmax {
                        let want: Vec<f64> = x
                            .chunks(dim)
                            .flat_map(|row| reference.part(row, top_k, renormalize, lo..hi))
                            .collect();
                        // As in `moe_ffn_matches_formula`, of the whole output's size.
                        let tol = if dtype.is_quantized() { 0.02 } else { 1e-5 } * scale;
                        assert_close(&what, &part, &want, |_| tol);
                    }
                    sum.iter_mut().zip(&part).for_each(|(s, &p)| *s += p);
                }
                let whole: Vec<f64> = whole.iter().map(|&v| v as f64).collect();
                let adds = (2 * routing.top_k + bounds.len() - 1) as f64;
                assert_close(&format!("{what}, runs {bounds:?}"), &sum, &whole, |i| {
                    adds * EPS / 2.0 * terms[i]
                });
            }
        }
    }
}

dtype_tests!([f32: F32, f16: F16, bf16: BF16, i8: I8, i4g32: I4G32, i4sg32: I4SymG32,
    mxfp4: MXFP4] expert_runs_add_up_to_the_whole_op);

#[test]
fn moe_ffn_contract_errors() {
    let (router, list, _) = experts(1, 3, 8, 4, DataType::F32);
    let input = f32_data(&[2, 8], &[0.5; 16]);
    let run_part = |router: &Data, (experts, first): (&[Expert], usize), top_k, out: &[usize]| {
        run(Op::MoeFfn {
            input: &input,
            router,
            experts,
            first_expert: first,
            routing: MoeRouting::softmax(top_k, true),
            activation: ExpertActivation::SwiGlu,
            output: &mut nan_output(out),
        })
    };
    let run_with = |router: &Data, experts: &[Expert], top_k: usize, out: &[usize]| {
        run_part(router, (experts, 0), top_k, out)
    };
    assert!(run_with(&router, &list, 2, &[2, 8]).is_ok());
    // A run of the router's experts routes over all three: top 3 of 3 with one held.
    assert!(run_part(&router, (&list[..1], 2), 3, &[2, 8]).is_ok());
    for (what, result) in [
        ("top_k 0", run_with(&router, &list, 0, &[2, 8])),
        ("top_k > experts", run_with(&router, &list, 4, &[2, 8])),
        ("output shape", run_with(&router, &list, 1, &[2, 7])),
        (
            "router columns",
            run_with(&f32_data(&[3, 7], &[0.0; 21]), &list, 1, &[2, 8]),
        ),
        ("no experts", run_with(&router, &[], 1, &[2, 8])),
        (
            "more experts than the router's",
            run_with(&router, &[list.clone(), list.clone()].concat(), 1, &[2, 8]),
        ),
    ] {
        assert!(
            matches!(result, Err(Error::Shape { op: "MoeFfn", .. })),
            "{what}: {result:?}"
        );
    }
    // A run past the router's experts, or one whose end overflows, is refused, naming both.
    for (first, len) in [(2, 2), (3, 1), (usize::MAX, 1)] {
        let err = run_part(&router, (&list[..len], first), 1, &[2, 8]).unwrap_err();
        let want = format!("experts {first}..{first}+{len} of a router of 3 experts");
        assert!(
            matches!(&err, Error::Shape { op: "MoeFfn", msg } if msg.contains(&want)),
            "{err}"
        );
    }
    let mut odd = list.clone();
    odd[1].down = f32_data(&[8, 5], &[0.0; 40]);
    let err = run_with(&router, &odd, 1, &[2, 8]).unwrap_err();
    assert!(err.to_string().contains("expert 1"), "{err}");
    // An expert is named by its index in the router.
    let err = run_part(&router, (&odd[..2], 1), 1, &[2, 8]).unwrap_err();
    assert!(err.to_string().contains("expert 2:"), "{err}");
}
