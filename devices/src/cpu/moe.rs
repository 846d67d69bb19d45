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

use flm_core::Data;
use flm_core::{DataType, Expert, LinearPart, Result};

use super::qlinear::LinearLevel;
use super::{activation, linear, Isa};

/// The choice of the router for one row: its `top_k` experts and their weights.
struct Route {
    expert: usize,
    weight: f32,
}

/// `output[n, dim] = Σ_e w_e · expert_e(input)` over each row's `top_k` experts (see
/// [`flm_core::Op::MoeFfn`]). `linear_isa(rows)` gives the level of a Linear over `rows`
/// input rows, `vector` the level of the element-wise kernels.
pub(crate) fn moe_ffn(
    linear_isa: impl Fn(usize) -> LinearLevel,
    vector: Isa,
    input: &Data,
    router: &Data,
    experts: &[Expert],
    (top_k, renormalize): (usize, bool),
    output: &mut Data,
) -> Result<()> {
    let (n, dim) = (input.rows(), input.cols());
    let n_experts = experts.len();
    let mut logits = Data::zeros(DataType::F32, &[n, n_experts])?;
    linear::linear(linear_isa(n), input, router, None, &mut logits)?;
    let routes: Vec<Vec<Route>> = logits
        .as_f32()?
        .chunks_exact(n_experts)
        .map(|row| route(row, top_k, renormalize))
        .collect();
    let x = input.as_f32()?;
    let out = output.as_f32_mut()?;
    out.fill(0.0);
    for (e, expert) in experts.iter().enumerate() {
        // The rows routed to expert `e` and their weights, in row order.
        let chosen: Vec<(usize, f32)> = routes
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.iter().find(|r| r.expert == e).map(|r| (i, r.weight)))
            .collect();
        if chosen.is_empty() {
            continue;
        }
        let m = chosen.len();
        let gathered: Vec<f32> = chosen
            .iter()
            .flat_map(|&(i, _)| &x[i * dim..(i + 1) * dim])
            .copied()
            .collect();
        let rows = Data::from_f32(&[m, dim], &gathered)?;
        let inner = expert.gate.rows();
        let mut gate = Data::zeros(DataType::F32, &[m, inner])?;
        let mut up = Data::zeros(DataType::F32, &[m, inner])?;
        linear::linears(
            linear_isa(m),
            &rows,
            &mut [
                LinearPart::new(&expert.gate, None, &mut gate),
                LinearPart::new(&expert.up, None, &mut up),
            ],
        )?;
        let mut hidden = Data::zeros(DataType::F32, &[m, inner])?;
        activation::gate_mul::<activation::Silu>(vector, &gate, &up, &mut hidden)?;
        let mut y = Data::zeros(DataType::F32, &[m, dim])?;
        linear::linear(linear_isa(m), &hidden, &expert.down, None, &mut y)?;
        for (&(i, w), y) in chosen.iter().zip(y.as_f32()?.chunks_exact(dim)) {
            for (o, &v) in out[i * dim..(i + 1) * dim].iter_mut().zip(y) {
                *o += w * v;
            }
        }
    }
    Ok(())
}

/// The router's choice for one row of logits: softmax over all experts, the `top_k` largest
/// probabilities (the lower index first on ties), divided by their sum if `renormalize`.
fn route(logits: &[f32], top_k: usize, renormalize: bool) -> Vec<Route> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    // Stable: equal probabilities keep ascending expert order.
    order.sort_by(|&a, &b| exp[b].total_cmp(&exp[a]));
    let mut routes: Vec<Route> = order[..top_k]
        .iter()
        .map(|&e| Route {
            expert: e,
            weight: exp[e] / sum,
        })
        .collect();
    if renormalize {
        let total: f32 = routes.iter().map(|r| r.weight).sum();
        for r in &mut routes {
            r.weight /= total;
        }
    }
    routes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_takes_the_largest_and_renormalises_on_request() {
        let logits = [0.0f32, 2.0, 1.0, 2.0];
        let r = route(&logits, 2, false);
        assert_eq!([r[0].expert, r[1].expert], [1, 3]);
        let e = |x: f32| x.exp();
        let sum = e(0.0) + e(2.0) + e(1.0) + e(2.0);
        assert!((r[0].weight - e(2.0) / sum).abs() < 1e-6);
        let r = route(&logits, 2, true);
        assert!((r[0].weight - 0.5).abs() < 1e-6 && (r[1].weight - 0.5).abs() < 1e-6);
    }
}
