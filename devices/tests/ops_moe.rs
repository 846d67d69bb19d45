//! `Op::MoeFfn` on the CPU device against its formula (transformers'
//! `MixtralSparseMoeBlock` / `Qwen3MoeSparseMoeBlock`, and `GptOssMLP`'s biased router and
//! clamped experts), computed here in f64 one row at a time, and its contract's errors.

#[macro_use]
mod common;

use common::*;
use flm_core::{Data, DataType, Error, Expert, ExpertActivation, MoeRouting, Op};

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
        for &e in chosen {
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

#[test]
fn moe_ffn_contract_errors() {
    let (router, list, _) = experts(1, 3, 8, 4, DataType::F32);
    let input = f32_data(&[2, 8], &[0.5; 16]);
    let run_with = |router: &Data, experts: &[Expert], top_k: usize, out: &[usize]| {
        run(Op::MoeFfn {
            input: &input,
            router,
            experts,
            routing: MoeRouting::softmax(top_k, true),
            activation: ExpertActivation::SwiGlu,
            output: &mut nan_output(out),
        })
    };
    assert!(run_with(&router, &list, 2, &[2, 8]).is_ok());
    for (what, result) in [
        ("top_k 0", run_with(&router, &list, 0, &[2, 8])),
        ("top_k > experts", run_with(&router, &list, 4, &[2, 8])),
        ("output shape", run_with(&router, &list, 1, &[2, 7])),
        ("router rows", run_with(&router, &list[..2], 1, &[2, 8])),
        ("no experts", run_with(&router, &[], 1, &[2, 8])),
    ] {
        assert!(
            matches!(result, Err(Error::Shape { op: "MoeFfn", .. })),
            "{what}: {result:?}"
        );
    }
    let mut odd = list.clone();
    odd[1].down = f32_data(&[8, 5], &[0.0; 40]);
    let err = run_with(&router, &odd, 1, &[2, 8]).unwrap_err();
    assert!(err.to_string().contains("expert 1"), "{err}");
}
