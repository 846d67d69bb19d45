//! A model split between two memories: stories260K (5 layers) with its first layers on a
//! device and the rest on the host, as `--gpu-layers` places them, writes llama2.c's
//! greedy tokens, and the executor's transfer record holds exactly the copies the
//! placement implies. The device is [`SimDevice`] (the CPU kernels over a memory of their
//! own), so this runs on every machine.

use std::sync::Arc;

use flm_core::{Executor, Location, Route, SamplerConfig};
use flm_devices::{CpuDevice, SimDevice};
use flm_models::llama::{Llama, LlamaModel, LlamaWeights, Logits};
use flm_models::Placement;
use flm_models::{import, Graph};
use flm_tests::{
    cpu_executor, data, every_sampling_option, greedy_on, ids, session_ids, stories_placed,
    stories_reference,
};

const SIM: Location = Location::Device {
    name: "sim",
    ordinal: 0,
};

/// The device first, then the CPU, as `--device cuda` orders them.
fn executor() -> Executor {
    Executor::with_profiling(
        vec![
            Box::new(SimDevice::new(0).unwrap()),
            Box::new(CpuDevice::new().unwrap()),
        ],
        false,
    )
}

/// stories260K with its first `on_device` layers on the device.
fn placed(exec: &Executor, on_device: usize) -> Llama {
    stories_placed(exec, SIM, on_device)
}

/// Each `(reason, route)`'s copies in the record.
fn copies(exec: &Executor, reason: &str, from: Location, to: Location) -> u64 {
    exec.transfers()
        .entries
        .iter()
        .filter(|e| e.reason == reason && e.route == Route { from, to })
        .map(|e| e.count)
        .sum()
}

#[test]
fn two_layers_on_a_device_write_llama2c_tokens_with_one_copy_per_step() {
    let expected = ids(&stories_reference()["greedy_from_bos"]["output_ids"]);
    let exec = executor();
    let mut model = placed(&exec, 2);
    assert_eq!(model.config().n_layers, 5);
    assert_eq!(greedy_on(&exec, &mut model, &[1], expected.len()), expected);
    let steps = expected.len() as u64;
    // The embedding table and 9 tensors in each of the 2 layers; the tied classifier stays
    // on the host with the last layer.
    assert_eq!(copies(&exec, "load: weights", Location::Host, SIM), 19);
    // One forward pass per token, one copy of the residual stream at its one boundary.
    let boundary = "layer boundary: activations";
    assert_eq!(copies(&exec, boundary, SIM, Location::Host), steps);
    assert_eq!(copies(&exec, "logits to host", SIM, Location::Host), 0);
    // Each pass's token id goes to the device holding the embedding.
    let ids = copies(&exec, "token ids to device", Location::Host, SIM);
    assert_eq!(ids, steps);
    let (count, _) = exec.transfers().totals();
    assert_eq!(count, 19 + 2 * steps, "{}", exec.transfers().report());
}

#[test]
fn every_layer_on_a_device_brings_back_only_the_logits() {
    let expected = ids(&stories_reference()["greedy_from_bos"]["output_ids"]);
    let exec = executor();
    let mut model = placed(&exec, 99);
    assert_eq!(greedy_on(&exec, &mut model, &[1], expected.len()), expected);
    let steps = expected.len() as u64;
    assert_eq!(copies(&exec, "logits to host", SIM, Location::Host), steps);
    assert_eq!(
        copies(&exec, "layer boundary: activations", SIM, Location::Host),
        0
    );
    // The weights and each pass's token id, and nothing else, went the other way.
    let up: u64 = exec
        .transfers()
        .entries
        .iter()
        .filter(|e| e.route.to == SIM)
        .map(|e| e.count)
        .sum();
    let weights = copies(&exec, "load: weights", Location::Host, SIM);
    assert_eq!(up, weights + steps);
    assert_eq!(
        copies(&exec, "token ids to device", Location::Host, SIM),
        steps
    );
}

/// Sampling on the device that holds the logits: a session whose layers are all on the
/// device writes the ids of the same session on the CPU (host sampling), with every
/// penalty, top-k, top-p and a seed, and greedily; each decode step's only copies are its
/// token id to the device and the sampled id to the host.
#[test]
fn a_session_on_a_device_copies_one_id_in_and_one_id_out_per_step() {
    for config in [every_sampling_option(), SamplerConfig::default()] {
        let want = session_ids(&cpu_executor(), Location::Host, &config);
        let exec = executor();
        let got = session_ids(&exec, SIM, &config);
        assert_eq!(got, want, "{config:?}");
        let steps = want.len() as u64;
        assert_eq!(steps, 60);
        // "Once upon a time" with BOS: the prefill's ids cross in one copy.
        let prompt = 5;
        let record = exec.transfers();
        let per_step: Vec<_> = record
            .entries
            .iter()
            .filter(|e| !e.reason.starts_with("load: "))
            .map(|e| (e.reason, e.route, e.count, e.bytes))
            .collect();
        let (up, down) = (
            Route {
                from: Location::Host,
                to: SIM,
            },
            Route {
                from: SIM,
                to: Location::Host,
            },
        );
        assert_eq!(
            per_step,
            [
                ("sampler: history", up, 1, 4 * 512),
                ("sampler: seed", up, 1, 40),
                ("token ids to device", up, steps, 4 * (prompt + steps - 1)),
                ("sampled id to host", down, steps, 4 * steps),
            ],
            "{}",
            record.report()
        );
    }
}

#[test]
fn a_placement_of_the_wrong_length_is_refused() {
    let exec = executor();
    let ckpt = import::load(&data("stories260K/stories260K.bin")).unwrap();
    let model = LlamaModel::new(ckpt.config.clone(), LlamaWeights::load(&ckpt).unwrap()).unwrap();
    let err = model
        .place(&exec, Placement::first_layers(4, SIM, 2))
        .err()
        .unwrap();
    assert!(err.to_string().contains("4 layers"), "{err}");
}

/// Tiny Mixtral and Qwen2-MoE with every layer on the device and its experts in host
/// memory (`--moe-device cpu`): transformers' logits, the experts' weights (Qwen2-MoE's
/// shared expert's too) never copied, and the experts' input and output crossing once
/// each per layer and step.
#[test]
fn experts_in_host_memory_beside_layers_on_a_device() {
    for family in ["mixtral", "qwen2_moe"] {
        experts_in_host_memory(family);
    }
}

fn experts_in_host_memory(family: &str) {
    let ckpt = import::load(&data(&format!("hf-families/{family}"))).unwrap();
    let c = ckpt.config.clone();
    let weights = LlamaWeights::load(&ckpt).unwrap();
    let moe = c.moe.as_ref().unwrap();
    // The router, the experts' matrices, and the shared expert's three and its gate.
    let routed = moe.n_experts * 3 + 1 + moe.shared_expert_dim.map_or(0, |_| 4);
    let per_layer = weights.layers[0].tensors().len();
    let model = LlamaModel::new(c.clone(), weights).unwrap();
    let exec = executor();
    let placement =
        Placement::first_layers(c.n_layers, SIM, c.n_layers).with_experts_on(Location::Host);
    let mut model = Llama::with_model(Arc::new(model.place(&exec, placement).unwrap())).unwrap();
    let text = std::fs::read_to_string(data("hf-families/reference.json")).unwrap();
    let input = ids(&serde_json::from_str::<serde_json::Value>(&text).unwrap()["input_ids"]);
    let bytes = std::fs::read(data(&format!("hf-families/{family}/logits_f32le.bin"))).unwrap();
    let want: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let mut steps = 0;
    for (pos, &token) in input.iter().enumerate() {
        let got = model.forward(&exec, &[token], pos, Logits::Last).unwrap();
        let row = &want[pos * c.vocab_size..][..c.vocab_size];
        let diff = got
            .iter()
            .zip(row)
            .map(|(g, w)| (g - w).abs())
            .fold(0.0, f32::max);
        assert!(diff <= 1e-4, "{family} at {pos}: max |Δ| = {diff}");
        steps += 1;
    }
    // The embedding table, the untied classifier and final norm, and every layer's tensors
    // but the router and the experts.
    let weights = 3 + c.n_layers as u64 * (per_layer - routed) as u64;
    assert_eq!(copies(&exec, "load: weights", Location::Host, SIM), weights);
    let io = "experts: activations";
    let per_step = c.n_layers as u64 * steps;
    assert_eq!(copies(&exec, io, SIM, Location::Host), per_step);
    assert_eq!(copies(&exec, io, Location::Host, SIM), per_step);
}
