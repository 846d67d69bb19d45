//! The Rust side of the decode step as a step graph (CUDA graphs on the GPU), without a
//! GPU: stories260K with its layers on a stand-in device (the CPU kernels over a memory of
//! their own, [`SimDevice`]) that captures by recording which ops the step gives it. The
//! step is run op by op the first time, captured the second and replayed after, each
//! replay with its own token, position and cache row; the ops that read the step's ids and
//! positions are the ones marked to follow the step; a model split between memories, or
//! `--cuda-graph off`, never captures. That the replayed tokens equal the op-by-op ones is
//! checked on a GPU (tests/cuda_graph.rs).

use std::sync::Arc;

use flm_core::recording::{RecordLog, RecordingDevice};
use flm_core::{BaseDevice, Executor, KvDtype, Location, OpKind};
use flm_devices::{CpuDevice, SimDevice};
use flm_models::llama::{Llama, Logits};
use flm_models::Graph;
use flm_tests::stories_placed;

const SIM: Location = Location::Device {
    name: "sim",
    ordinal: 0,
};

/// The recorder ([`SimDevice`] capturing by recording) first, then the CPU, with its log.
fn executor() -> (Executor, Arc<RecordLog>) {
    let recorder = RecordingDevice::new(SimDevice::new(0).unwrap());
    let log = recorder.log();
    let devices: Vec<Box<dyn BaseDevice>> =
        vec![Box::new(recorder), Box::new(CpuDevice::new().unwrap())];
    (Executor::with_profiling(devices, false), log)
}

/// stories260K (5 layers) with its first `on_device` layers on the recorder.
fn placed(exec: &Executor, on_device: usize) -> Llama {
    stories_placed(exec, SIM, on_device, KvDtype::F32)
}

/// A prompt of 3 tokens, then 5 decode steps of the tokens 20, 21, ... at positions 3...
fn decode(exec: &Executor, llama: &mut Llama) {
    llama.forward(exec, &[1, 5, 9], 0, Logits::Last).unwrap();
    for i in 0..5 {
        llama
            .forward(exec, &[20 + i as u32], 3 + i, Logits::Last)
            .unwrap();
    }
}

#[test]
fn the_second_decode_step_is_captured_and_replayed_with_each_steps_inputs() {
    let (exec, log) = executor();
    let mut llama = placed(&exec, 5);
    decode(&exec, &mut llama);
    assert_eq!(llama.captured_steps(), [1]);
    // The step at position 4 is captured, then replayed with its own inputs; the later
    // steps are replays (each with its words: token, position, cache row).
    let want: Vec<_> = (1..5u32).map(|i| vec![20 + i, 3 + i, 3 + i]).collect();
    assert_eq!(log.replays(), want);
    let captures = log.captures();
    assert_eq!(captures.len(), 1);
    let count = |kind: OpKind, follows: bool| {
        captures[0]
            .iter()
            .filter(|&&(k, f)| k == kind && f == follows)
            .count()
    };
    let layers = llama.config().n_layers;
    // What reads the step's ids and positions follows the step: the embedding, RoPE of q
    // and k, the key and value rows stored in the cache and attention up to them.
    assert_eq!(count(OpKind::Embedding, true), 1);
    assert_eq!(count(OpKind::Rope, true), 2 * layers);
    assert_eq!(count(OpKind::CopyRows, true), 2 * layers);
    assert_eq!(count(OpKind::Attention, true), layers);
    // Nothing else does, and none of those kinds runs at positions of its own; the one
    // other row copy (the last row to the head) is at fixed rows.
    let follows = captures[0].iter().filter(|(_, f)| *f).count();
    assert_eq!(follows, 1 + 5 * layers, "{:?}", captures[0]);
    for kind in [OpKind::Embedding, OpKind::Rope, OpKind::Attention] {
        assert_eq!(count(kind, false), 0, "{kind:?}");
    }
    assert_eq!(count(OpKind::CopyRows, false), 1);
    assert_eq!(count(OpKind::Linear, false), 2 * layers + 1);
}

#[test]
fn split_models_and_graphs_off_run_every_step_op_by_op() {
    let (exec, log) = executor();
    let mut split = placed(&exec, 2);
    decode(&exec, &mut split);
    assert!(split.captured_steps().is_empty());
    let (exec, log_off) = {
        let (exec, log_off) = executor();
        exec.set_step_graphs(false);
        (exec, log_off)
    };
    let mut whole = placed(&exec, 5);
    decode(&exec, &mut whole);
    assert!(whole.captured_steps().is_empty());
    for log in [log, log_off] {
        assert!(log.captures().is_empty());
        assert!(log.replays().is_empty());
    }
}
