//! The routed mixture-of-experts feed-forward ([`flm_core::Op::MoeFfn`]).
//!
//! The router's logits come from the Linear kernels; the scores, the choice of groups and
//! experts, the renormalisation and the scale run per row in f32 as transformers' routers
//! do (`MixtralTopKRouter`, `Qwen3MoeTopKRouter`, `DeepseekV2TopkRouter`,
//! `DeepseekV3TopkRouter`, `Glm4MoeTopkRouter`). Then each expert that any row chose runs
//! once, over the rows routed to it gathered into one matrix (a decode step touches only its `top_k` experts'
//! weights, a prefill reads each expert's weights once for all its rows), through the
//! Linear and SwiGLU kernels; its rows are scaled by their routing weights and added into
//! the output, experts in ascending order. Each row's sum therefore runs in an order that
//! the other rows do not change, and the kernels it goes through are batch invariant, so
//! the op is too. A single row (a decode step) runs the gate and up projections of all its
//! experts in one call of the Linear kernels and their down projections in another, so
//! that the threads split the step's expert weights twice rather than twice per expert
//! (with the same bits and the same order of the sum). When the op holds a run of the
//! router's experts (expert parallelism),
//! the routing is the same and only the run's experts are computed and added.
//!
//! The logits, the routes and the per-expert matrices live in a per-thread [`Scratch`]
//! (taken with [`scratch::with`]) that only grows, so that a decode step allocates nothing
//! once the first step has sized it; it keeps the size of the largest call on that thread
//! (a prefill chunk: `(2·dim + 3·inner)·4` bytes per row routed to the busiest expert).

use std::cell::Cell;

use flm_core::{
    Data, Expert, ExpertActivation, GroupScore, LinearPart, MoeRouting, Result, RouterScoring,
};

use super::qlinear::LinearLevel;
use super::scratch::{self, tensor, tensors};
use super::{activation, linear, simd, Isa};

/// The choice of the router for one row: one of its `top_k` experts and its weight.
#[derive(Debug, Clone, Copy)]
struct Route {
    expert: usize,
    weight: f32,
}

/// The op's working memory, kept between calls.
#[derive(Default)]
struct Scratch {
    /// f32 `[n, n_experts]`: the router's logits.
    logits: Option<Data>,
    /// The `top_k` routes of each row, row after row.
    routes: Vec<Route>,
    /// The router's working space for one row.
    work: RouteWork,
    /// The rows routed to the current expert and their weights, in row order.
    chosen: Vec<(usize, f32)>,
    /// f32 `[m, dim]`, `[m, inner]` ×3 and `[m, dim]`: the current expert's gathered rows,
    /// its gate, up and SwiGLU values, and its output.
    rows: Option<Data>,
    gate: Option<Data>,
    up: Option<Data>,
    hidden: Option<Data>,
    y: Option<Data>,
    /// A decode step's experts ([`one_row`]): their indices among the op's experts and
    /// their weights, in ascending order.
    picked: Vec<(usize, f32)>,
    /// f32 `[1, inner]` each: their gate projections, then their up projections.
    gate_up: Vec<Data>,
    /// f32 `[1, inner]` each: their SwiGLU values.
    hiddens: Vec<Data>,
    /// f32 `[1, dim]` each: their outputs.
    ys: Vec<Data>,
}

/// The working space of [`route`], for one row.
#[derive(Default)]
struct RouteWork {
    /// The scores: softmax numerators, or sigmoids.
    scores: Vec<f32>,
    /// The normalised scores plus the choice bias, when there is one.
    biased: Vec<f32>,
    /// The candidate experts, then in the order of choice.
    order: Vec<usize>,
    /// Each group's score, and the groups in the order of choice.
    group_scores: Vec<f32>,
    groups: Vec<usize>,
}

thread_local! {
    static SCRATCH: Cell<Scratch> = Cell::new(Scratch::default());
}

/// `output[n, dim] = Σ_e w_e · expert_e(input)` over each row's `top_k` experts that are
/// among `experts`, the router's experts `first..first + experts.len()` (see
/// [`flm_core::Op::MoeFfn`]). `level` says how the Linears run, `vector` is the level of
/// the element-wise kernels.
pub(crate) fn moe_ffn(
    level: LinearLevel,
    vector: Isa,
    input: &Data,
    (router, experts, first): (&Data, &[Expert], usize),
    (routing, activation): (&MoeRouting<'_>, ExpertActivation),
    output: &mut Data,
) -> Result<()> {
    let bias = routing.choice_bias.map(Data::as_f32).transpose()?;
    let top_k = routing.top_k;
    let n_experts = router.rows();
    scratch::with(&SCRATCH, |s| {
        let (n, dim) = (input.rows(), input.cols());
        let logits = tensor(&mut s.logits, &[n, n_experts])?;
        linear::linear(level, input, router, routing.logit_bias, logits)?;
        s.routes.clear();
        for row in logits.as_f32()?.chunks_exact(n_experts) {
            route(row, routing, bias, &mut s.work, &mut s.routes);
        }
        if n == 1 {
            return one_row(
                level,
                vector,
                input,
                (experts, first),
                activation,
                s,
                output,
            );
        }
        let x = input.as_f32()?;
        let out = output.as_f32_mut()?;
        out.fill(0.0);
        for (e, expert) in (first..).zip(experts) {
            s.chosen.clear();
            s.chosen.extend(
                s.routes
                    .chunks_exact(top_k)
                    .enumerate()
                    .filter_map(|(i, r)| r.iter().find(|r| r.expert == e).map(|r| (i, r.weight))),
            );
            let m = s.chosen.len();
            if m == 0 {
                continue;
            }
            let rows = tensor(&mut s.rows, &[m, dim])?;
            for (&(i, _), row) in s
                .chosen
                .iter()
                .zip(rows.as_f32_mut()?.chunks_exact_mut(dim))
            {
                row.copy_from_slice(&x[i * dim..(i + 1) * dim]);
            }
            let inner = expert.gate.rows();
            let gate = tensor(&mut s.gate, &[m, inner])?;
            let up = tensor(&mut s.up, &[m, inner])?;
            let [b_gate, b_up, b_down] = match &expert.biases {
                Some([g, u, d]) => [Some(g), Some(u), Some(d)],
                None => [None; 3],
            };
            linear::linears(
                level,
                rows,
                &mut [
                    LinearPart::new(&expert.gate, b_gate, gate),
                    LinearPart::new(&expert.up, b_up, up),
                ],
            )?;
            let hidden = tensor(&mut s.hidden, &[m, inner])?;
            expert_activation(vector, activation, (gate, up), hidden)?;
            let y = tensor(&mut s.y, &[m, dim])?;
            linear::linear(level, hidden, &expert.down, b_down, y)?;
            for (&(i, w), y) in s.chosen.iter().zip(y.as_f32()?.chunks_exact(dim)) {
                for (o, &v) in out[i * dim..(i + 1) * dim].iter_mut().zip(y) {
                    *o += w * v;
                }
            }
        }
        Ok(())
    })
}

/// [`moe_ffn`] of one row routed to `s.routes`: the projections of all its experts among
/// `experts` (the router's `first..`) in two calls of the Linear kernels, every gate and up
/// in one and every down in the other, so that the threads split a decode step's expert
/// weights once each instead of twice per expert. Each expert's output has the bits the
/// per-expert loop gives it, and they are added in the same order (experts ascending).
fn one_row(
    level: LinearLevel,
    vector: Isa,
    input: &Data,
    (experts, first): (&[Expert], usize),
    activation: ExpertActivation,
    s: &mut Scratch,
    output: &mut Data,
) -> Result<()> {
    const P: usize = super::schedule::MAX_PARTS;
    let out = output.as_f32_mut()?;
    out.fill(0.0);
    let Some(expert) = experts.first() else {
        return Ok(());
    };
    s.picked.clear();
    s.picked.extend(
        s.routes
            .iter()
            .filter(|r| (first..first + experts.len()).contains(&r.expert))
            .map(|r| (r.expert - first, r.weight)),
    );
    s.picked.sort_unstable_by_key(|&(e, _)| e);
    let (dim, inner) = (input.cols(), expert.gate.rows());
    for chosen in s.picked.chunks(P / 2) {
        let c = chosen.len();
        let mut weights = [&expert.gate; P];
        let mut biases: [Option<&Data>; P] = [None; P];
        for (i, &(e, _)) in chosen.iter().enumerate() {
            let expert = &experts[e];
            weights[i] = &expert.gate;
            weights[c + i] = &expert.up;
            if let Some([g, u, _]) = &expert.biases {
                (biases[i], biases[c + i]) = (Some(g), Some(u));
            }
        }
        let gate_up = tensors(&mut s.gate_up, 2 * c, &[1, inner])?;
        linear::linears_each(
            level,
            &[input],
            (&weights[..2 * c], &biases[..2 * c]),
            gate_up,
        )?;
        let (gates, ups) = gate_up.split_at(c);
        let hiddens = tensors(&mut s.hiddens, c, &[1, inner])?;
        for ((gate, up), hidden) in gates.iter().zip(ups).zip(hiddens.iter_mut()) {
            expert_activation(vector, activation, (gate, up), hidden)?;
        }
        let mut inputs = [input; P];
        for (i, (x, &(e, _))) in inputs.iter_mut().zip(chosen).enumerate() {
            *x = &hiddens[i];
            weights[i] = &experts[e].down;
            biases[i] = experts[e].biases.as_ref().map(|[_, _, d]| d);
        }
        let ys = tensors(&mut s.ys, c, &[1, dim])?;
        linear::linears_each(level, &inputs[..c], (&weights[..c], &biases[..c]), ys)?;
        for (y, &(_, w)) in ys.iter().zip(chosen) {
            for (o, &v) in out.iter_mut().zip(y.as_f32()?) {
                *o += w * v;
            }
        }
    }
    Ok(())
}

/// `hidden = act(gate) · up`, the experts' activation of `activation`, element-wise over
/// f32 tensors of one shape.
fn expert_activation(
    vector: Isa,
    activation: ExpertActivation,
    (gate, up): (&Data, &Data),
    hidden: &mut Data,
) -> Result<()> {
    match activation {
        ExpertActivation::SwiGlu => {
            activation::gate_mul::<activation::Silu>(vector, gate, up, hidden)
        }
        ExpertActivation::ClampedSwiGlu { alpha, limit } => {
            activation::clamped_swiglu(vector, (gate, up), (alpha, limit), hidden)
        }
    }
}

/// Appends to `routes` the router's choice for one row of logits, as
/// [`flm_core::Op::MoeFfn`] defines it: the scores, the `top_groups` best groups when there
/// are groups, the `top_k` experts of largest biased score among theirs (the lower index
/// first on ties), their unbiased scores renormalised on request and scaled. `bias` is the
/// choice bias's values; `work` is working space.
fn route(
    logits: &[f32],
    routing: &MoeRouting<'_>,
    bias: Option<&[f32]>,
    work: &mut RouteWork,
    routes: &mut Vec<Route>,
) {
    let RouteWork {
        scores,
        biased,
        order,
        group_scores,
        groups,
    } = work;
    scores.clear();
    // The scores are `scores[e] / norm`. The polynomial `exp` of the kernels gives the same
    // bits on every machine, where libm's `expf` may differ between architectures.
    let norm = match routing.scoring {
        RouterScoring::Softmax => {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            scores.extend(logits.iter().map(|&l| simd::exp(l - max)));
            scores.iter().sum()
        }
        RouterScoring::Sigmoid => {
            scores.extend(logits.iter().map(|&l| sigmoid(l)));
            1.0
        }
    };
    // Without a bias the softmax numerators choose: dividing them by their sum keeps their
    // order, and Mixtral's and Qwen's choice then never rests on that division's rounding.
    let choice: &[f32] = match bias {
        Some(bias) => {
            biased.clear();
            biased.extend(scores.iter().zip(bias).map(|(&s, &b)| s / norm + b));
            biased
        }
        None => scores,
    };
    order.clear();
    match routing.groups {
        None => order.extend(0..logits.len()),
        Some(g) => {
            let size = logits.len() / g.n_groups;
            group_scores.clear();
            group_scores.extend(choice.chunks_exact(size).map(|c| group_score(c, g.score)));
            groups.clear();
            groups.extend(0..g.n_groups);
            groups.sort_unstable_by(|&a, &b| {
                group_scores[b].total_cmp(&group_scores[a]).then(a.cmp(&b))
            });
            let chosen = &groups[..g.top_groups];
            order.extend((0..logits.len()).filter(|e| chosen.contains(&(e / size))));
        }
    }
    // Unstable (it allocates nothing), with ties broken by the index: equal scores keep
    // ascending expert order.
    order.sort_unstable_by(|&a, &b| choice[b].total_cmp(&choice[a]).then(a.cmp(&b)));
    let first = routes.len();
    routes.extend(order[..routing.top_k].iter().map(|&e| Route {
        expert: e,
        weight: scores[e] / norm,
    }));
    let chosen = &mut routes[first..];
    if routing.renormalize {
        let total: f32 = chosen.iter().map(|r| r.weight).sum();
        // DeepSeek-V3's and GLM-4.5's guard against a sum of underflowed sigmoids.
        let total = match routing.scoring {
            RouterScoring::Softmax => total,
            RouterScoring::Sigmoid => total + 1e-20,
        };
        for r in chosen.iter_mut() {
            r.weight /= total;
        }
    }
    for r in chosen {
        r.weight *= routing.scale;
    }
}

/// `σ(l) = 1 / (1 + e^-l)`, as `1 / (1 + e)` for `l >= 0` and `e / (1 + e)` below, with
/// `e = e^-|l|` from the polynomial [`simd::exp`]: `e <= 1` never overflows (that `exp`
/// is only defined up to 88), and each step rounds once or twice.
pub(super) fn sigmoid(l: f32) -> f32 {
    let e = simd::exp(-l.abs());
    if l >= 0.0 {
        1.0 / (1.0 + e)
    } else {
        e / (1.0 + e)
    }
}

/// The score of one group of experts from their choice scores `c` (see [`GroupScore`]);
/// NaNs are passed over.
fn group_score(c: &[f32], score: GroupScore) -> f32 {
    match score {
        GroupScore::Max => c.iter().copied().fold(f32::NEG_INFINITY, f32::max),
        GroupScore::SumOfTop2 => {
            let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
            for &v in c {
                if v > first {
                    (first, second) = (v, first);
                } else if v > second {
                    second = v;
                }
            }
            first + second
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flm_core::ExpertGroups;

    fn routes(logits: &[f32], routing: MoeRouting<'_>, bias: Option<&[f32]>) -> Vec<Route> {
        let mut routes = Vec::new();
        route(
            logits,
            &routing,
            bias,
            &mut RouteWork::default(),
            &mut routes,
        );
        routes
    }

    fn experts(r: &[Route]) -> Vec<usize> {
        r.iter().map(|r| r.expert).collect()
    }

    fn sigmoid_routing(top_k: usize, groups: Option<ExpertGroups>) -> MoeRouting<'static> {
        MoeRouting {
            scoring: RouterScoring::Sigmoid,
            groups,
            ..MoeRouting::softmax(top_k, false)
        }
    }

    fn groups(n_groups: usize, top_groups: usize, score: GroupScore) -> Option<ExpertGroups> {
        Some(ExpertGroups {
            n_groups,
            top_groups,
            score,
        })
    }

    fn close(got: f32, want: f64) -> bool {
        (got as f64 - want).abs() <= 1e-6 * want.abs().max(1e-30)
    }

    fn sig(l: f64) -> f64 {
        1.0 / (1.0 + (-l).exp())
    }

    #[test]
    fn route_takes_the_largest_and_renormalises_on_request() {
        let logits = [0.0f32, 2.0, 1.0, 2.0];
        let r = routes(&logits, MoeRouting::softmax(2, false), None);
        assert_eq!(experts(&r), [1, 3]);
        let e = |x: f32| x.exp();
        let sum = e(0.0) + e(2.0) + e(1.0) + e(2.0);
        assert!((r[0].weight - e(2.0) / sum).abs() < 1e-6);
        let r = routes(&logits, MoeRouting::softmax(2, true), None);
        assert!((r[0].weight - 0.5).abs() < 1e-6 && (r[1].weight - 0.5).abs() < 1e-6);
    }

    #[test]
    fn ties_keep_ascending_expert_order_among_many_experts() {
        // More experts than a sort's small-slice cutoff, all tied but two.
        let mut logits = [0.5f32; 64];
        logits[40] = 1.0;
        logits[7] = 1.0;
        let r = routes(&logits, MoeRouting::softmax(5, false), None);
        assert_eq!(experts(&r), [7, 40, 0, 1, 2]);
        // Tied groups too: the lower ones are chosen.
        let routing = sigmoid_routing(3, groups(4, 2, GroupScore::SumOfTop2));
        assert_eq!(experts(&routes(&[0.25; 8], routing, None)), [0, 1, 2]);
    }

    /// Groups 0..4 of experts {0, 1}, {2, 3}, {4, 5}, {6, 7}.
    const GROUPED: [f32; 8] = [3.0, -5.0, 2.0, 2.9, 2.5, 2.4, 0.0, 0.0];

    #[test]
    fn groups_scored_by_their_best_limit_the_choice() {
        // Best scores per group 3.0, 2.9, 2.5, 0: groups 0 and 1, so expert 4 is passed over.
        let routing = MoeRouting {
            groups: groups(4, 2, GroupScore::Max),
            ..MoeRouting::softmax(3, false)
        };
        let r = routes(&GROUPED, routing, None);
        assert_eq!(experts(&r), [0, 3, 2]);
        let sum: f64 = GROUPED.iter().map(|&l| (l as f64 - 3.0).exp()).sum();
        for r in &r {
            let want = (GROUPED[r.expert] as f64 - 3.0).exp() / sum;
            assert!(close(r.weight, want), "{r:?}, want {want}");
        }
    }

    #[test]
    fn groups_scored_by_their_two_best_limit_the_choice() {
        // σ sums per group 0.959, 1.829, 1.841, 1.0: groups 2 and 1, so expert 0 (the
        // best) is passed over, where scoring by the best would keep it.
        let top2 = routes(
            &GROUPED,
            sigmoid_routing(3, groups(4, 2, GroupScore::SumOfTop2)),
            None,
        );
        assert_eq!(experts(&top2), [3, 4, 5]);
        for r in &top2 {
            assert!(close(r.weight, sig(GROUPED[r.expert] as f64)), "{r:?}");
        }
        let max = routes(
            &GROUPED,
            sigmoid_routing(3, groups(4, 2, GroupScore::Max)),
            None,
        );
        assert_eq!(experts(&max), [0, 3, 2]);
    }

    #[test]
    fn the_bias_chooses_but_does_not_weigh() {
        let logits = [1.0f32, 0.0, 0.5, -1.0];
        let bias = [0.0f32, 2.0, 0.0, 0.0];
        let r = routes(&logits, sigmoid_routing(2, None), Some(&bias));
        assert_eq!(experts(&r), [1, 0]);
        assert!(
            close(r[0].weight, 0.5) && close(r[1].weight, sig(1.0)),
            "{r:?}"
        );
        // With softmax scores the bias is added to the probabilities.
        let r = routes(
            &logits,
            MoeRouting::softmax(1, false),
            Some(&[0.0, 0.0, 0.0, 0.9]),
        );
        assert_eq!(experts(&r), [3]);
        let sum: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        assert!(close(r[0].weight, (-1.0f64).exp() / sum), "{r:?}");
        // The bias also scores the groups: group 1 wins only through it.
        let routing = sigmoid_routing(1, groups(2, 1, GroupScore::Max));
        let r = routes(&logits, routing, Some(&[0.0, 0.0, 0.5, 0.0]));
        assert_eq!(experts(&r), [2]);
        assert!(close(r[0].weight, sig(0.5)), "{r:?}");
    }

    #[test]
    fn the_scale_multiplies_the_final_weights() {
        let logits = [0.0f32, 2.0, 1.0, 2.0];
        for renormalize in [false, true] {
            let plain = routes(&logits, MoeRouting::softmax(2, renormalize), None);
            let routing = MoeRouting {
                scale: 2.5,
                ..MoeRouting::softmax(2, renormalize)
            };
            let scaled = routes(&logits, routing, None);
            for (p, s) in plain.iter().zip(&scaled) {
                assert_eq!(p.expert, s.expert);
                assert_eq!(s.weight, p.weight * 2.5);
            }
        }
    }

    #[test]
    fn sigmoid_weights_renormalise_without_dividing_by_zero() {
        let logits = [0.3f32, -1.2, 2.0, 0.7];
        let routing = MoeRouting {
            renormalize: true,
            scale: 2.5,
            ..sigmoid_routing(3, None)
        };
        let r = routes(&logits, routing, None);
        assert_eq!(experts(&r), [2, 3, 0]);
        let sum: f64 = [2.0, 0.7, 0.3].iter().map(|&l| sig(l)).sum();
        for r in &r {
            let want = 2.5 * sig(logits[r.expert] as f64) / sum;
            assert!(close(r.weight, want), "{r:?}, want {want}");
        }
        // Scores that underflow to 0 give weights of 0, where a bare sum would give NaN.
        let r = routes(&[-200.0; 4], routing, None);
        assert!(r.iter().all(|r| r.weight == 0.0), "{r:?}");
    }

    #[test]
    fn sigmoid_is_close_to_its_f64_value_everywhere() {
        for l in [
            -300.0f32, -100.0, -88.0, -20.0, -1.0, -1e-3, 0.0, 1e-3, 0.5, 3.0, 20.0, 100.0,
        ] {
            let want = sig(l as f64);
            // Below about 1e-38 the exp flushes to 0 (as the SiLU's does).
            let ok = if want < 1e-37 {
                sigmoid(l) < 1e-37
            } else {
                (sigmoid(l) as f64 - want).abs() <= 4.0 * f32::EPSILON as f64 * want
            };
            assert!(ok, "σ({l}) = {}, want {want}", sigmoid(l));
        }
    }
}
