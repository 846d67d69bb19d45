//! The decode step as a CUDA graph, on stories260K with every layer on
//! the GPU: greedy decoding through the captured and replayed step writes llama2.c's tokens
//! and those of the op-by-op step (`--cuda-graph off`), also when prefills of several
//! tokens and of all logits run between replays; each step still copies only its token id
//! in and its logits out; and the decode rate with and without the graph is printed. (The
//! session tests of tests/cuda_models.rs run through the graph too: it is on by default.) Skipped with a
//! message where no CUDA GPU is usable.
#![cfg(feature = "cuda")]

use std::sync::Arc;
use std::time::Instant;

use flm_core::{DataType, Executor, KvDtype, Location};
use flm_devices::cuda::CudaDevice;
use flm_devices::CpuDevice;
use flm_models::llama::{Llama, LlamaWeights, Logits, SharedLlama};
use flm_models::{import, Graph, Placement, SharedGraph};
use flm_tests::{data, greedy_on, ids, stories_reference, weights_in};

const CUDA0: Location = Location::Device {
    name: "cuda",
    ordinal: 0,
};

/// The CUDA device first, the CPU for the ops it leaves, with step graphs on or off.
fn gpu_executor(graphs: bool) -> Option<Executor> {
    match CudaDevice::new(0) {
        Ok(gpu) => {
            let exec = Executor::with_profiling(
                vec![Box::new(gpu), Box::new(CpuDevice::new().unwrap())],
                false,
            );
            exec.set_step_graphs(graphs);
            Some(exec)
        }
        Err(why) => {
            eprintln!("skipped: no CUDA GPU ({why})");
            None
        }
    }
}

/// A stories260K checkpoint (llama2.c's `.bin`, or the HF directory) with its matrices in
/// `dtype`, every layer on the GPU of `exec`, its KV cache f32 (llama2.c's).
fn on_gpu(exec: &Executor, path: &str, dtype: DataType) -> Llama {
    let ckpt = import::load(&data(path)).unwrap();
    let weights = weights_in(&LlamaWeights::load(&ckpt).unwrap(), |_, shape| {
        if shape.len() == 2 {
            dtype
        } else {
            DataType::F32
        }
    });
    let model = SharedLlama::new(ckpt.config.clone(), weights)
        .unwrap()
        .with_kv_dtype(KvDtype::F32);
    let n_layers = model.config().n_layers;
    let model = model
        .place(exec, Placement::first_layers(n_layers, CUDA0, n_layers))
        .unwrap();
    Llama::with_model(Arc::new(model)).unwrap()
}

/// The copies of every call but the load's, by reason.
fn per_step(exec: &Executor) -> Vec<(&'static str, u64)> {
    (exec.transfers().entries.iter())
        .filter(|e| !e.reason.starts_with("load: "))
        .map(|e| (e.reason, e.count))
        .collect()
}

#[test]
fn graph_decode_writes_llama2c_tokens_with_one_copy_per_step() {
    let expected = ids(&stories_reference()["greedy_from_bos"]["output_ids"]);
    for graphs in [true, false] {
        let Some(gpu) = gpu_executor(graphs) else {
            return;
        };
        let mut llama = on_gpu(&gpu, "stories260K/stories260K.bin", DataType::F32);
        assert_eq!(
            greedy_on(&gpu, &mut llama, &[1], 200),
            expected,
            "graphs {graphs}"
        );
        let captured = if graphs { vec![1] } else { vec![] };
        assert_eq!(llama.captured_steps(), captured);
        assert_eq!(
            per_step(&gpu),
            [("token ids to device", 200), ("logits to host", 200)],
            "graphs {graphs}"
        );
    }
}

/// Greedy decoding with prompts of several tokens (and a prefill of all logits) between
/// runs of decode steps, as a chat's turns: the captured step is replayed after prefills
/// changed the activations' shapes and filled the cache rows before it.
fn turns(exec: &Executor, llama: &mut Llama) -> Vec<u32> {
    let prompt = ids(&stories_reference()["logits_file"]["input_ids"]);
    let mut out = greedy_on(exec, llama, &prompt, 40);
    let mut pos = prompt.len() + 39;
    let vocab = llama.config().vocab_size;
    for turn in 0..3 {
        let text: Vec<u32> = out[out.len() - 5..].to_vec();
        let logits = if turn == 1 {
            let all = llama.forward(exec, &text, pos, Logits::All).unwrap();
            all[all.len() - vocab..].to_vec()
        } else {
            llama
                .forward(exec, &text, pos, Logits::Last)
                .unwrap()
                .to_vec()
        };
        pos += text.len();
        let mut next = flm_core::argmax(&logits);
        for _ in 0..30 {
            out.push(next);
            next = flm_core::argmax(llama.forward(exec, &[next], pos, Logits::Last).unwrap());
            pos += 1;
        }
    }
    out
}

#[test]
fn replays_after_prefills_give_the_op_by_op_tokens_in_f32_and_f16() {
    for dtype in [DataType::F32, DataType::F16] {
        let Some(eager) = gpu_executor(false) else {
            return;
        };
        let want = turns(&eager, &mut on_gpu(&eager, "hf-stories260K", dtype));
        let graph = gpu_executor(true).unwrap();
        let mut llama = on_gpu(&graph, "hf-stories260K", dtype);
        assert_eq!(turns(&graph, &mut llama), want, "{dtype}");
        assert_eq!(llama.captured_steps(), [1], "{dtype}");
        assert_eq!(per_step(&graph), per_step(&eager), "{dtype}");
    }
}

#[test]
fn decode_rate_with_and_without_the_graph() {
    for graphs in [false, true] {
        let Some(gpu) = gpu_executor(graphs) else {
            return;
        };
        let mut llama = on_gpu(&gpu, "stories260K/stories260K.bin", DataType::F32);
        // Warm-up and capture, then 255 timed steps.
        greedy_on(&gpu, &mut llama, &[1], 3);
        let start = Instant::now();
        let mut next = 1;
        for pos in 3..258 {
            next = flm_core::argmax(llama.forward(&gpu, &[next], pos, Logits::Last).unwrap());
        }
        let rate = 255.0 / start.elapsed().as_secs_f64();
        eprintln!("stories260K decode on the GPU, CUDA graph {graphs}: {rate:.0} tokens/s");
    }
}
