//! A model split between two memories: stories260K (5 layers) with its first layers on a
//! device and the rest on the host, as `--gpu-layers` places them, writes llama2.c's
//! greedy tokens, alone and served by the batching engine (its KV pool placed with the
//! layers), and the executor's transfer record holds exactly the copies the placement
//! implies. The device is [`SimDevice`] (the CPU kernels over a memory of their own), so
//! this runs on every machine.

use std::sync::Arc;

use flm_core::{DataType, Executor, KvDtype, Location, Route, SamplerConfig};
use flm_devices::{CpuDevice, SimDevice};
use flm_models::llama::{Llama, LlamaWeights, Logits, SharedLlama};
use flm_models::BatchSeq;
use flm_models::{import, Graph, SharedGraph, SharedModel};
use flm_models::{GpuLayers, Placement};
use flm_tests::{
    cpu_executor, data, every_sampling_option, greedy_on, ids, serve_greedy, session_ids,
    stories_placed, stories_reference,
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

/// stories260K with its first `on_device` layers on the device, its KV caches f32 (the
/// tokens are compared with llama2.c's, whose cache is f32).
fn placed(exec: &Executor, on_device: usize) -> Llama {
    placed_with(exec, on_device, KvDtype::F32)
}

/// [`placed`] with KV caches of `kv_dtype`.
fn placed_with(exec: &Executor, on_device: usize, kv_dtype: KvDtype) -> Llama {
    stories_placed(exec, SIM, on_device, kv_dtype)
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

/// `--kv-dtype auto` puts f16 caches in a device's memory and keeps f32 ones in host memory;
/// stories260K's greedy tokens stay llama2.c's with them (as on the CPU, see
/// `llama_reference.rs`).
#[test]
fn auto_kv_caches_are_f16_on_a_device_and_keep_llama2c_tokens() {
    let expected = ids(&stories_reference()["greedy_from_bos"]["output_ids"]);
    let exec = executor();
    let mut model = placed_with(&exec, 2, KvDtype::Auto);
    assert_eq!(greedy_on(&exec, &mut model, &[1], expected.len()), expected);
    let (device, host) = (model.kv_dtypes()[0], model.kv_dtypes()[4]);
    assert_eq!((device, host), (DataType::F16, KvDtype::HOST_DEFAULT));
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
    let model = SharedLlama::new(ckpt.config.clone(), LlamaWeights::load(&ckpt).unwrap()).unwrap();
    let err = model
        .place(&exec, Placement::first_layers(4, SIM, 2))
        .err()
        .unwrap();
    assert!(err.to_string().contains("4 layers"), "{err}");
}

/// Tiny Mixtral, Qwen2-MoE, DeepSeek-V2/V3 and GLM-4.5 with every layer on the device and
/// its experts in host memory (`--moe-device cpu`): transformers' logits, the experts'
/// weights (the shared expert's and the router's bias too) never copied, and the experts'
/// input and output crossing once
/// each per layer and step.
#[test]
fn experts_in_host_memory_beside_layers_on_a_device() {
    for family in [
        "mixtral",
        "qwen2_moe",
        "deepseek_v2",
        "deepseek_v3",
        "glm4_moe",
    ] {
        experts_in_host_memory(family);
    }
}

fn experts_in_host_memory(family: &str) {
    let ckpt = import::load(&data(&format!("hf-families/{family}"))).unwrap();
    let c = ckpt.config.clone();
    let weights = LlamaWeights::load(&ckpt).unwrap();
    // Each layer's tensors that go to the device: all of them (with multi-head latent
    // attention, its per-head absorbed matrices too) but the router and the experts.
    let mut moved = 0;
    for lw in &weights.layers {
        let _ = lw.clone().try_map(|d, routed| {
            moved += u64::from(!routed);
            Ok(d)
        });
    }
    let moe_layers = (0..c.n_layers)
        .filter(|&l| c.moe_layer(l).is_some())
        .count() as u64;
    // Logits against transformers': an f32 KV cache, as transformers keeps it.
    let model = SharedLlama::new(c.clone(), weights)
        .unwrap()
        .with_kv_dtype(KvDtype::F32);
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
    // The embedding table, the untied classifier and final norm, and the layers' tensors.
    assert_eq!(
        copies(&exec, "load: weights", Location::Host, SIM),
        3 + moved
    );
    let io = "experts: activations";
    let per_step = moe_layers * steps;
    assert_eq!(copies(&exec, io, SIM, Location::Host), per_step);
    assert_eq!(copies(&exec, io, Location::Host, SIM), per_step);
}

/// stories260K as a shared model with its first `on_device` layers on the device of `exec`.
fn shared_on(exec: &Executor, on_device: usize) -> SharedModel {
    let ckpt = import::load(&data("stories260K/stories260K.bin")).unwrap();
    let model = SharedLlama::new(ckpt.config.clone(), LlamaWeights::load(&ckpt).unwrap()).unwrap();
    let placement = Placement::first_layers(model.config().n_layers, SIM, on_device);
    SharedModel::from(model.place(exec, placement).unwrap())
}

/// The serving engine over stories260K with every layer, then the first two, on the
/// device (their KV pools and activations there): its concurrent greedy requests write
/// llama2.c's and transformers' tokens, and the others the CPU engine's.
#[test]
fn the_engine_serves_layers_on_a_device_with_the_cpu_engines_tokens() {
    let reference = stories_reference();
    let from_bos = ids(&reference["greedy_from_bos"]["output_ids"]);
    let prompt = ids(&reference["greedy_prompt"]["input_ids"]);
    let from_prompt = ids(&reference["greedy_prompt"]["output_ids"]);
    let requests = [
        (vec![1], from_bos.len()),
        (prompt, from_prompt.len()),
        (vec![1, 300, 301, 17], 40),
        (
            vec![
                1, 5, 9, 200, 33, 7, 90, 12, 400, 3, 8, 61, 77, 21, 15, 16, 18,
            ],
            25,
        ),
    ];
    let cpu = serve_greedy(shared_on(&cpu_executor(), 0), cpu_executor(), &requests);
    assert_eq!(cpu[0], from_bos);
    assert_eq!(cpu[1], from_prompt);
    for on_device in [99, 2] {
        let exec = executor();
        let got = serve_greedy(shared_on(&exec, on_device), exec, &requests);
        assert_eq!(got, cpu, "{on_device} layers on the device");
    }
}

/// A batched step (what the engine runs) over a model and a KV pool on the device copies
/// its token ids to the device and the logits of its sequences to the host, once each,
/// and nothing else crosses: the block tables and positions go with the ops.
#[test]
fn a_batched_step_on_a_device_copies_its_ids_in_and_the_logits_out() {
    let exec = executor();
    let model = shared_on(&exec, 99);
    let (vocab, loaded) = (
        model.config().vocab_size,
        copies(&exec, "load: weights", Location::Host, SIM),
    );
    let mut batch = model.batch(1).unwrap();
    let block_size = 16;
    let mut kv = batch.kv_pool(&exec, 12, block_size).unwrap();
    assert_eq!(kv.layer_mut(0).0.location(), SIM);
    let prompts: [&[u32]; 3] = [
        &[1, 40, 41],
        &[1],
        &[
            1, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
        ],
    ];
    let tables: Vec<Vec<u32>> = (0..3)
        .map(|_| {
            (0..4)
                .map(|_| kv.allocator_mut().alloc().unwrap())
                .collect()
        })
        .collect();
    let mut tokens: Vec<Vec<u32>> = prompts.iter().map(|p| p.to_vec()).collect();
    let mut start = [0usize; 3];
    let steps = 6;
    let mut rows = 0;
    for _ in 0..steps {
        let seqs: Vec<BatchSeq<'_>> = (0..3)
            .map(|i| BatchSeq {
                tokens: &tokens[i][start[i]..],
                start_pos: start[i],
                blocks: &tables[i],
            })
            .collect();
        let logits = batch.forward(&exec, &mut kv, &seqs).unwrap().to_vec();
        rows += seqs.len();
        for (i, row) in logits.chunks_exact(vocab).enumerate() {
            start[i] = tokens[i].len();
            tokens[i].push(flm_core::argmax(row));
        }
    }
    let record = exec.transfers();
    let to_host = "logits to host";
    assert_eq!(copies(&exec, to_host, SIM, Location::Host), steps);
    let bytes: u64 = record
        .entries
        .iter()
        .filter(|e| e.reason == to_host)
        .map(|e| e.bytes)
        .sum();
    assert_eq!(bytes, (rows * vocab * 4) as u64);
    let ids_in = "token ids to device";
    assert_eq!(copies(&exec, ids_in, Location::Host, SIM), steps);
    let (count, _) = record.totals();
    assert_eq!(count, loaded + 2 * steps, "{}", record.report());
}

/// What `--gpu-layers` and libflm's `gpu_layers` call, `SharedModel::place_gpu_layers`: a
/// count puts that many first layers on the device and the rest on the host (0: none);
/// auto needs the device's free memory, which the stand-in device does not tell, and says
/// so.
#[test]
fn gpu_layers_place_a_count_and_auto_asks_for_free_memory() {
    let exec = executor();
    let model = || {
        let ckpt = import::load(&data("stories260K/stories260K.bin")).unwrap();
        let weights = LlamaWeights::load(&ckpt).unwrap();
        SharedModel::from(SharedLlama::new(ckpt.config.clone(), weights).unwrap())
    };
    for n in [0, 2, 5, 9] {
        let placed = model()
            .place_gpu_layers(&exec, SIM, GpuLayers::Count(n), false)
            .unwrap();
        let p = placed.placement().unwrap().clone();
        assert_eq!(p, Placement::first_layers(5, SIM, n), "{n}");
    }
    let err = model()
        .place_gpu_layers(&exec, SIM, GpuLayers::Auto, false)
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("does not tell its free memory"),
        "{err}"
    );
    assert_eq!("auto".parse(), Ok(GpuLayers::Auto));
    assert_eq!("12".parse(), Ok(GpuLayers::Count(12)));
    assert!("most".parse::<GpuLayers>().is_err());
}
