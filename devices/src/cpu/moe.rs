//! The routed mixture-of-experts feed-forward ([`flm_core::Op::MoeFfn`]).
//!
//! The router's logits come from the Linear kernels; the softmax, the top-k choice and the
//! renormalisation run per row in f32 as transformers' `MixtralTopKRouter` and
//! `Qwen3MoeTopKRouter` do. Then each expert that any row chose runs once, over the rows
//! routed to it gathered into one matrix (a decode step touches only its `top_k` experts'
//! weights, a prefill reads each expert's weights once for all its rows), through the
//! Linear and SwiGLU kernels; its rows are scaled by their routing weights and added into
//! the output, experts in ascending order. Each row's sum therefore runs in an order that
//! the other rows do not change, and the kernels it goes through are batch invariant, so
//! the op is too.
//!
//! The logits, the routes and the per-expert matrices live in a per-thread [`Scratch`]
//! (taken with [`scratch::with`]) that only grows, so that a decode step allocates nothing
//! once the first step has sized it; it keeps the size of the largest call on that thread
//! (a prefill chunk: `(2·dim + 3·inner)·4` bytes per row routed to the busiest expert).

use std::cell::Cell;

use flm_core::Data;
use flm_core::{DataType, Expert, LinearPart, Result};

use super::qlinear::LinearLevel;
use super::{activation, linear, scratch, simd, Isa};

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
    /// One row's softmax numerators, and its experts in the order of choice.
    exp: Vec<f32>,
    order: Vec<usize>,
    /// The rows routed to the current expert and their weights, in row order.
    chosen: Vec<(usize, f32)>,
    /// f32 `[m, dim]`, `[m, inner]` ×3 and `[m, dim]`: the current expert's gathered rows,
    /// its gate, up and SwiGLU values, and its output.
    rows: Option<Data>,
    gate: Option<Data>,
    up: Option<Data>,
    hidden: Option<Data>,
    y: Option<Data>,
}

thread_local! {
    static SCRATCH: Cell<Scratch> = Cell::new(Scratch::default());
}

/// The f32 tensor of `slot` reshaped to `shape`, allocated only when its storage is too
/// small (its contents are left as they were).
pub(crate) fn tensor<'a>(slot: &'a mut Option<Data>, shape: &[usize]) -> Result<&'a mut Data> {
    let mut kept = slot.take();
    let fits = kept.as_mut().is_some_and(|d| d.set_shape(shape).is_ok());
    let data = match kept {
        Some(data) if fits => data,
        _ => Data::zeros(DataType::F32, shape)?,
    };
    Ok(slot.insert(data))
}

/// `output[n, dim] = Σ_e w_e · expert_e(input)` over each row's `top_k` experts (see
/// [`flm_core::Op::MoeFfn`]). `level` says how the Linears run, `vector` is the level of
/// the element-wise kernels.
pub(crate) fn moe_ffn(
    level: LinearLevel,
    vector: Isa,
    input: &Data,
    router: &Data,
    experts: &[Expert],
    (top_k, renormalize): (usize, bool),
    output: &mut Data,
) -> Result<()> {
    scratch::with(&SCRATCH, |s| {
        let (n, dim) = (input.rows(), input.cols());
        let logits = tensor(&mut s.logits, &[n, experts.len()])?;
        linear::linear(level, input, router, None, logits)?;
        s.routes.clear();
        for row in logits.as_f32()?.chunks_exact(experts.len()) {
            route(
                row,
                top_k,
                renormalize,
                (&mut s.exp, &mut s.order),
                &mut s.routes,
            );
        }
        let x = input.as_f32()?;
        let out = output.as_f32_mut()?;
        out.fill(0.0);
        for (e, expert) in experts.iter().enumerate() {
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
            linear::linears(
                level,
                rows,
                &mut [
                    LinearPart::new(&expert.gate, None, gate),
                    LinearPart::new(&expert.up, None, up),
                ],
            )?;
            let hidden = tensor(&mut s.hidden, &[m, inner])?;
            activation::gate_mul::<activation::Silu>(vector, gate, up, hidden)?;
            let y = tensor(&mut s.y, &[m, dim])?;
            linear::linear(level, hidden, &expert.down, None, y)?;
            for (&(i, w), y) in s.chosen.iter().zip(y.as_f32()?.chunks_exact(dim)) {
                for (o, &v) in out[i * dim..(i + 1) * dim].iter_mut().zip(y) {
                    *o += w * v;
                }
            }
        }
        Ok(())
    })
}

/// Appends to `routes` the router's choice for one row of logits: softmax over all
/// experts, the `top_k` largest probabilities (the lower index first on ties), divided by
/// their sum if `renormalize`. `exp` and `order` are working space.
fn route(
    logits: &[f32],
    top_k: usize,
    renormalize: bool,
    (exp, order): (&mut Vec<f32>, &mut Vec<usize>),
    routes: &mut Vec<Route>,
) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    exp.clear();
    // The polynomial `exp` of the kernels: the same bits on every machine, where libm's
    // `expf` may differ between architectures.
    exp.extend(logits.iter().map(|&l| simd::exp(l - max)));
    let sum: f32 = exp.iter().sum();
    order.clear();
    order.extend(0..logits.len());
    // Unstable (it allocates nothing), with ties broken by the index: equal probabilities
    // keep ascending expert order.
    order.sort_unstable_by(|&a, &b| exp[b].total_cmp(&exp[a]).then(a.cmp(&b)));
    let first = routes.len();
    routes.extend(order[..top_k].iter().map(|&e| Route {
        expert: e,
        weight: exp[e] / sum,
    }));
    if renormalize {
        let chosen = &mut routes[first..];
        let total: f32 = chosen.iter().map(|r| r.weight).sum();
        for r in chosen {
            r.weight /= total;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(logits: &[f32], top_k: usize, renormalize: bool) -> Vec<Route> {
        let mut routes = Vec::new();
        let mut work = (Vec::new(), Vec::new());
        route(
            logits,
            top_k,
            renormalize,
            (&mut work.0, &mut work.1),
            &mut routes,
        );
        routes
    }

    #[test]
    fn route_takes_the_largest_and_renormalises_on_request() {
        let logits = [0.0f32, 2.0, 1.0, 2.0];
        let r = routes(&logits, 2, false);
        assert_eq!([r[0].expert, r[1].expert], [1, 3]);
        let e = |x: f32| x.exp();
        let sum = e(0.0) + e(2.0) + e(1.0) + e(2.0);
        assert!((r[0].weight - e(2.0) / sum).abs() < 1e-6);
        let r = routes(&logits, 2, true);
        assert!((r[0].weight - 0.5).abs() < 1e-6 && (r[1].weight - 0.5).abs() < 1e-6);
    }

    #[test]
    fn ties_keep_ascending_expert_order_among_many_experts() {
        // More experts than a sort's small-slice cutoff, all tied but two.
        let mut logits = [0.5f32; 64];
        logits[40] = 1.0;
        logits[7] = 1.0;
        let r = routes(&logits, 5, false);
        let chosen: Vec<usize> = r.iter().map(|r| r.expert).collect();
        assert_eq!(chosen, [7, 40, 0, 1, 2]);
    }
}
