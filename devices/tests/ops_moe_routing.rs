//! `Op::MoeFfn`'s routing against transformers' own routers: `DeepseekV2TopkRouter`
//! (`greedy` and `group_limited_greedy`), `DeepseekV3TopkRouter` and `Glm4MoeTopkRouter`
//! (groups scored by their two best biased scores, a random `e_score_correction_bias`, with
//! and without `norm_topk_prob`), all with `routed_scaling_factor` 2.5. The cases, their
//! router weights, hidden states and transformers' experts and weights per row, come from
//! `tests/data/moe_routing/make.py` (transformers 5.25, f32).
//!
//! The op's output reveals its routing: expert `e` outputs the one-hot vector of column
//! `e`, whatever the row (see [`revealing_experts`]), so output column `e` of a row is the
//! weight of expert `e`, 0 where the row did not choose it.

mod common;

use common::*;
use flm_core::{Data, DataType, Executor, Expert, ExpertActivation, MoeRouting, Op};
use flm_devices::{CpuDevice, Isa};
use serde_json::Value;

/// transformers' cases (see the module's documentation).
const CASES: &str = include_str!("../../tests/data/moe_routing/routing.json");

/// A row of the input: the hidden state, zeros, and a last column of 1.
const ONE: f32 = 1.0;

/// `n_experts` experts of one inner unit over `dim` columns, the last of which is the
/// constant [`ONE`]: `gate · x = 32` (so `silu = 32 · σ(32)`, and `σ(32)` rounds to 1 in
/// f32), `up · x = 1/32` and `down` the one-hot column `e`, so that expert `e` outputs
/// exactly the one-hot vector of column `e` for every row.
fn revealing_experts(n_experts: usize, dim: usize) -> Vec<Expert> {
    let constant = |coefficient: f32| {
        let mut w = vec![0.0; dim];
        w[dim - 1] = coefficient;
        f32_data(&[1, dim], &w)
    };
    (0..n_experts)
        .map(|e| {
            let mut down = vec![0.0; dim];
            down[e] = 1.0;
            Expert {
                gate: constant(32.0),
                up: constant(1.0 / 32.0),
                down: f32_data(&[dim, 1], &down),
                biases: None,
            }
        })
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

fn count(v: &Value) -> usize {
    v.as_u64().expect("a count") as usize
}

/// Every case at every level this machine has (or the one `FLM_CPU_ISA` names): each row's
/// experts are transformers' and their weights within 1e-6 of its, relative; the levels
/// agree bit for bit.
#[test]
fn routing_matches_transformers_routers() {
    let doc: Value = serde_json::from_str(CASES).expect("routing.json");
    let cases = doc["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 6);
    let levels = Isa::to_check().expect("FLM_CPU_ISA names a level this CPU has");
    for case in cases {
        let name = case["name"].as_str().expect("a name");
        let (n_experts, hidden) = (count(&case["n_experts"]), count(&case["hidden"]));
        let r = &case["routing"];
        let routing = MoeRouting {
            top_k: count(&r["top_k"]),
            scoring: serde_json::from_value(r["scoring"].clone()).expect("a scoring"),
            groups: serde_json::from_value(r["groups"].clone()).expect("groups or null"),
            choice_bias: None,
            logit_bias: None,
            renormalize: r["renormalize"].as_bool().expect("a flag"),
            scale: r["scale"].as_f64().expect("a scale") as f32,
        };
        // Room for a one-hot output column per expert and the constant column.
        let dim = n_experts.max(hidden) + 1;
        let widen = |values: &[f32], rows: usize, last: f32| {
            let mut wide = vec![0.0; rows * dim];
            for (w, v) in wide.chunks_exact_mut(dim).zip(values.chunks_exact(hidden)) {
                w[..hidden].copy_from_slice(v);
                w[dim - 1] = last;
            }
            f32_data(&[rows, dim], &wide)
        };
        let router = widen(&floats(&case["router_weight"]), n_experts, 0.0);
        let input_values = floats(&case["input"]);
        let rows = input_values.len() / hidden;
        let input = widen(&input_values, rows, ONE);
        let bias = (!case["choice_bias"].is_null())
            .then(|| Data::from_f32(&[n_experts], &floats(&case["choice_bias"])).unwrap());
        let routing = MoeRouting {
            choice_bias: bias.as_ref(),
            ..routing
        };
        let experts = revealing_experts(n_experts, dim);
        let want_ids = case["expert_ids"].as_array().expect("ids");
        let want_weights = case["expert_weights"].as_array().expect("weights");
        let mut first: Option<Vec<f32>> = None;
        for &isa in &levels {
            let exec = Executor::with_profiling(
                vec![Box::new(CpuDevice::with_isa(isa).expect("a level it has"))],
                false,
            );
            let out = output_of(&[rows, dim], |output| {
                exec.run(Op::MoeFfn {
                    input: &input,
                    router: &router,
                    experts: &experts,
                    first_expert: 0,
                    routing,
                    activation: ExpertActivation::SwiGlu,
                    output,
                })
            });
            for (i, row) in out.chunks_exact(dim).enumerate() {
                let what = format!("{name}, row {i}, at {isa}");
                let ids: Vec<u64> = (0..n_experts as u64)
                    .filter(|&e| row[e as usize] != 0.0)
                    .collect();
                let want: Vec<u64> = want_ids[i]
                    .as_array()
                    .expect("a row of ids")
                    .iter()
                    .map(|e| e.as_u64().expect("an id"))
                    .collect();
                assert_eq!(ids, want, "{what}: experts");
                assert_eq!(row[dim - 1], 0.0, "{what}: the constant column");
                for (&e, w) in ids.iter().zip(floats(&want_weights[i])) {
                    let got = row[e as usize];
                    let rel = ((got as f64 - w as f64) / w as f64).abs();
                    assert!(rel <= 1e-6, "{what}: expert {e} weighs {got}, want {w}");
                }
            }
            match &first {
                None => first = Some(out),
                Some(want) => assert_same_bits(&format!("{name} at {isa}"), &out, want),
            }
        }
    }
}

/// The routing's checks run before the op does: groups that cannot hold `top_k` experts
/// are refused with the op's shape error.
#[test]
fn routing_is_checked_before_the_op_runs() {
    let experts = revealing_experts(4, 5);
    let (router, input) = (f32_data(&[4, 5], &[0.0; 20]), f32_data(&[1, 5], &[ONE; 5]));
    let routing = MoeRouting {
        groups: Some(flm_core::ExpertGroups {
            n_groups: 2,
            top_groups: 1,
            score: flm_core::GroupScore::Max,
        }),
        ..MoeRouting::softmax(3, false)
    };
    let mut output = Data::zeros(DataType::F32, &[1, 5]).unwrap();
    let err = run(Op::MoeFfn {
        input: &input,
        router: &router,
        experts: &experts,
        first_expert: 0,
        routing,
        activation: ExpertActivation::SwiGlu,
        output: &mut output,
    })
    .unwrap_err();
    assert!(
        matches!(err, flm_core::Error::Shape { op: "MoeFfn", .. }),
        "{err}"
    );
}
