//! stories260K on the CUDA device against the CPU device:
//! greedy decoding gives the same tokens with f32 and f16 weights, and with int8 and int4
//! weights the teacher-forced top-1 token agrees with the CPU's at >= 99% of positions.
//! With layers placed on the GPU (`--gpu-layers`), greedy decoding writes llama2.c's tokens
//! and the executor records only the copies the placement implies; with int4 weights placed
//! there (in the GPU layout), the top-1 tokens of a prefill and of decode steps agree with
//! the CPU's at >= 99% of positions; a session on the GPU samples there and copies one id
//! in and one id out per step; the serving engine batches on the GPU. DeepSeek-V2/V3
//! (multi-head latent attention) and GLM-4.5 run their layers on the GPU beside their
//! experts on the CPU with transformers' logits. Skipped with a message where no CUDA GPU
//! is usable.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use flm_core::{Data, DataType, Executor, KvDtype, Location, SamplerConfig};
use flm_devices::cuda::CudaDevice;
use flm_devices::CpuDevice;
use flm_models::llama::{Llama, LlamaWeights, Logits, SharedLlama};
use flm_models::Placement;
use flm_models::{import, Graph, ModelConfig, SharedGraph, SharedModel};
use flm_tests::{
    cpu_executor, data, every_sampling_option, f32_file, greedy_on, ids, json, max_abs_diff,
    serve_greedy, session_ids, stories_reference, weights_in,
};

/// The CUDA device first, the CPU for the ops it leaves (as `--device cuda` runs).
fn gpu_executor() -> Option<Executor> {
    match CudaDevice::new(0) {
        Ok(gpu) => Some(Executor::with_profiling(
            vec![Box::new(gpu), Box::new(CpuDevice::new().unwrap())],
            false,
        )),
        Err(why) => {
            eprintln!("skipped: no CUDA GPU ({why})");
            None
        }
    }
}

/// stories260K's configuration and weights with its matrices in `dtype` (norm gains stay
/// f32, as `flm convert` keeps them).
fn stories(dtype: DataType) -> (ModelConfig, LlamaWeights) {
    let ckpt = import::load(&data("hf-stories260K")).unwrap();
    let weights = weights_in(&LlamaWeights::load(&ckpt).unwrap(), |_, shape| {
        if shape.len() == 2 {
            dtype
        } else {
            DataType::F32
        }
    });
    (ckpt.config.clone(), weights)
}

/// stories260K with its matrices in `dtype`, in host memory.
fn model(dtype: DataType) -> Llama {
    let (config, weights) = stories(dtype);
    Llama::new(config, weights).unwrap()
}

fn prompt() -> Vec<u32> {
    ids(&stories_reference()["logits_file"]["input_ids"])
}

/// A text the model writes itself, to teacher-force: the prompt and the 300 greedy tokens
/// of the f32 model on `cpu` after it.
fn self_written_text(cpu: &Executor) -> Vec<u32> {
    let mut text = prompt();
    text.extend(greedy_on(cpu, &mut model(DataType::F32), &prompt(), 300));
    text
}

#[test]
fn greedy_tokens_equal_the_cpu_in_f32_and_f16() {
    let Some(gpu) = gpu_executor() else { return };
    let cpu = cpu_executor();
    for dtype in [DataType::F32, DataType::F16] {
        let want = greedy_on(&cpu, &mut model(dtype), &prompt(), 200);
        let got = greedy_on(&gpu, &mut model(dtype), &prompt(), 200);
        assert_eq!(got, want, "{dtype}");
    }
}

#[test]
fn int8_and_int4_top1_agree_with_the_cpu_on_99_percent_of_positions() {
    let Some(gpu) = gpu_executor() else { return };
    let cpu = cpu_executor();
    let text = self_written_text(&cpu);
    for dtype in [
        DataType::I8,
        DataType::I4G32,
        DataType::I4SymG32,
        DataType::I4ZpG32,
    ] {
        let mut cpu_model = model(dtype);
        let vocab = cpu_model.config().vocab_size;
        let want = cpu_model.forward(&cpu, &text, 0, Logits::All).unwrap();
        let mut gpu_model = model(dtype);
        let got = gpu_model.forward(&gpu, &text, 0, Logits::All).unwrap();
        let same = want
            .chunks(vocab)
            .zip(got.chunks(vocab))
            .filter(|(a, b)| flm_core::argmax(a) == flm_core::argmax(b))
            .count();
        let positions = text.len();
        assert!(
            same * 100 >= positions * 99,
            "{dtype}: top-1 agrees on {same} of {positions} positions"
        );
    }
}

/// stories260K int4-g32 with every layer and the tied table placed on the GPU (int4 in
/// the GPU layout, an f32 KV cache): the teacher-forced top-1 token agrees with the CPU's
/// at >= 99% of positions, in prefill and in decode.
#[test]
fn placed_int4_top1_agrees_with_the_cpu_in_prefill_and_decode() {
    let Some(gpu) = gpu_executor() else { return };
    let cpu = cpu_executor();
    let text = self_written_text(&cpu);
    let dtype = DataType::I4G32;
    let mut cpu_model = model(dtype);
    let vocab = cpu_model.config().vocab_size;
    let want = cpu_model
        .forward(&cpu, &text, 0, Logits::All)
        .unwrap()
        .to_vec();
    // Every layer and the tied embedding table on the GPU, int4 in the GPU layout: a
    // prefill of half the text, then one decode step per token.
    let (config, weights) = stories(dtype);
    let n_layers = config.n_layers;
    let placed = SharedLlama::new(config, weights)
        .unwrap()
        .with_kv_dtype(KvDtype::F32)
        .place(&gpu, Placement::first_layers(n_layers, CUDA0, n_layers))
        .unwrap();
    let mut gpu_model = Llama::with_model(Arc::new(placed)).unwrap();
    let half = text.len() / 2;
    let mut got = gpu_model
        .forward(&gpu, &text[..half], 0, Logits::All)
        .unwrap()
        .to_vec();
    for (pos, &token) in text.iter().enumerate().skip(half) {
        let logits = gpu_model
            .forward(&gpu, &[token], pos, Logits::Last)
            .unwrap();
        got.extend_from_slice(logits);
    }
    let agree = |range: std::ops::Range<usize>| {
        range
            .filter(|&p| {
                let row = |l: &[f32]| flm_core::argmax(&l[p * vocab..][..vocab]);
                row(&want) == row(&got)
            })
            .count()
    };
    let (prefill, decode) = (agree(0..half), agree(half..text.len()));
    assert!(
        prefill * 100 >= half * 99 && decode * 100 >= (text.len() - half) * 99,
        "placed {dtype}: top-1 agrees on {prefill} of {half} prefill and {decode} of {} decode positions",
        text.len() - half
    );
}

/// stories260K (5 layers, f32, an f32 KV cache as llama2.c's) with its first `on_gpu`
/// layers' weights, KV cache and activations on the GPU, and the greedy tokens of 200 steps
/// from BOS.
fn placed_greedy(gpu: &Executor, on_gpu: usize) -> Vec<u32> {
    placed_greedy_with(gpu, on_gpu, KvDtype::F32)
}

/// [`placed_greedy`] with KV caches of `kv_dtype`.
fn placed_greedy_with(gpu: &Executor, on_gpu: usize, kv_dtype: KvDtype) -> Vec<u32> {
    let ckpt = import::load(&data("stories260K/stories260K.bin")).unwrap();
    let model = SharedLlama::new(ckpt.config.clone(), LlamaWeights::load(&ckpt).unwrap())
        .unwrap()
        .with_kv_dtype(kv_dtype);
    let n_layers = model.config().n_layers;
    let placement = Placement::first_layers(n_layers, CUDA0, on_gpu);
    let model = model.place(gpu, placement).unwrap();
    let mut llama = Llama::with_model(Arc::new(model)).unwrap();
    greedy_on(gpu, &mut llama, &[1], 200)
}

const CUDA0: Location = Location::Device {
    name: "cuda",
    ordinal: 0,
};

/// `--kv-dtype f16` (auto's choice on a GPU): every layer's cache on the GPU in f16 still
/// writes llama2.c's tokens, as the f16 cache does on the CPU (`llama_reference.rs`).
#[test]
fn an_f16_kv_cache_on_the_gpu_writes_llama2c_tokens() {
    let Some(gpu) = gpu_executor() else { return };
    let expected = ids(&stories_reference()["greedy_from_bos"]["output_ids"]);
    assert_eq!(placed_greedy_with(&gpu, 5, KvDtype::Auto), expected);
}

#[test]
fn gpu_layers_2_of_5_write_llama2c_tokens() {
    let Some(gpu) = gpu_executor() else { return };
    let expected = ids(&stories_reference()["greedy_from_bos"]["output_ids"]);
    assert_eq!(placed_greedy(&gpu, 2), expected);
    let boundary = gpu
        .transfers()
        .entries
        .iter()
        .filter(|e| e.reason == "layer boundary: activations")
        .map(|e| e.count)
        .sum::<u64>();
    assert_eq!(boundary, 200, "{}", gpu.transfers().report());
}

/// Each reason's copies in `exec`'s record but the load's.
fn copies_after_load(exec: &Executor) -> Vec<(&'static str, u64)> {
    exec.transfers()
        .entries
        .iter()
        .filter(|e| !e.reason.starts_with("load: "))
        .map(|e| (e.reason, e.count))
        .collect()
}

#[test]
fn every_layer_on_the_gpu_brings_back_only_the_logits_per_step() {
    let Some(gpu) = gpu_executor() else { return };
    let expected = ids(&stories_reference()["greedy_from_bos"]["output_ids"]);
    assert_eq!(placed_greedy(&gpu, 5), expected);
    // Each pass's token id in, its logits out (the host samples them).
    assert_eq!(
        copies_after_load(&gpu),
        [("token ids to device", 200), ("logits to host", 200)],
        "{}",
        gpu.transfers().report()
    );
}

/// A session whose layers are all on the GPU samples there (`Op::Sample`): greedily it
/// writes the CPU session's ids, and with a seed, penalties, top-k and top-p it writes
/// them too but where the GPU's `expf` rounds a draw across a boundary (counted, at most
/// one step in ten); each decode step's only copies are its token id in and the sampled id
/// out.
#[test]
fn a_session_on_the_gpu_copies_one_id_in_and_one_id_out_per_step() {
    let Some(_) = gpu_executor() else { return };
    for config in [SamplerConfig::default(), every_sampling_option()] {
        let want = session_ids(&cpu_executor(), Location::Host, &config);
        let gpu = gpu_executor().unwrap();
        let got = session_ids(&gpu, CUDA0, &config);
        let first_difference = got.iter().zip(&want).position(|(a, b)| a != b);
        eprintln!("{config:?}: first difference from the CPU at {first_difference:?}");
        if config.is_greedy() {
            assert_eq!(got, want);
        } else {
            // After a draw rounds differently the texts part ways: compare the start.
            assert!(first_difference.is_none_or(|i| i >= 6), "{got:?}\n{want:?}");
        }
        let steps = got.len() as u64;
        assert_eq!(steps, 60);
        assert_eq!(
            copies_after_load(&gpu),
            [
                ("sampler: history", 1),
                ("sampler: seed", 1),
                ("token ids to device", steps),
                ("sampled id to host", steps),
            ],
            "{}",
            gpu.transfers().report()
        );
    }
}

/// The serving engine with stories260K's layers (f16 weights) and KV pool on the GPU, as
/// `flm serve --device cuda --gpu-layers 99` runs it: paged attention and the scatter of
/// new keys and values on the GPU, and each of four concurrent greedy requests writes
/// what the model writes for it alone on the GPU (batch-invariant kernels).
#[test]
fn the_engine_batches_on_the_gpu_with_each_sequence_as_alone() {
    let Some(gpu) = gpu_executor() else { return };
    gpu.require_batch_invariance();
    let f16_on_gpu = |exec: &Executor| {
        let ckpt = import::load(&data("stories260K/stories260K.bin")).unwrap();
        let weights = weights_in(&LlamaWeights::load(&ckpt).unwrap(), |_, shape| {
            if shape.len() == 2 {
                DataType::F16
            } else {
                DataType::F32
            }
        });
        let model = SharedLlama::new(ckpt.config.clone(), weights).unwrap();
        let n_layers = model.config().n_layers;
        model
            .place(exec, Placement::first_layers(n_layers, CUDA0, n_layers))
            .unwrap()
    };
    let requests: [(Vec<u32>, usize); 4] = [
        (vec![1], 120),
        (prompt(), 60),
        (vec![1, 300, 301, 17], 40),
        ((1..40).collect(), 30),
    ];
    let alone: Vec<Vec<u32>> = requests
        .iter()
        .map(|(p, n)| {
            let mut llama = Llama::with_model(Arc::new(f16_on_gpu(&gpu))).unwrap();
            greedy_on(&gpu, &mut llama, p, *n)
        })
        .collect();
    let Some(exec) = gpu_executor() else { return };
    let got = serve_greedy(SharedModel::from(f16_on_gpu(&exec)), exec, &requests);
    assert_eq!(got, alone);
}

/// The tiny DeepSeek-V2 (multi-head latent attention without query compression),
/// DeepSeek-V3 (with it, and the grouped sigmoid router) and GLM-4.5 checkpoints with every
/// layer on the GPU and the routed experts in host memory, as `--device cuda --gpu-layers
/// 99 --moe-device cpu` runs them: with f32 weights and an f32 KV cache, transformers'
/// logits within 1e-4 token by token and in one prefill; with f16 matrices, the paged
/// engine's greedy tokens for concurrent requests are those of each request alone.
#[test]
fn deepseek_and_glm4_moe_layers_on_the_gpu_beside_their_experts() {
    let Some(gpu) = gpu_executor() else { return };
    let input = ids(&json("hf-families/reference.json")["input_ids"]);
    for family in ["deepseek_v2", "deepseek_v3", "glm4_moe"] {
        let ckpt = import::load(&data(&format!("hf-families/{family}"))).unwrap();
        let c = ckpt.config.clone();
        let placed = |exec: &Executor, weights: LlamaWeights| {
            let model = SharedLlama::new(c.clone(), weights)
                .unwrap()
                .with_kv_dtype(KvDtype::F32);
            let placement = Placement::first_layers(c.n_layers, CUDA0, c.n_layers)
                .with_experts_on(Location::Host);
            model.place(exec, placement).unwrap()
        };
        let f32_weights = LlamaWeights::load(&ckpt).unwrap();
        let shared = Arc::new(placed(&gpu, f32_weights.clone()));
        let want = f32_file(&data(&format!("hf-families/{family}/logits_f32le.bin")));
        let vocab = c.vocab_size;
        let mut llama = Llama::with_model(Arc::clone(&shared)).unwrap();
        let mut steps = 0f32;
        for (pos, &token) in input.iter().enumerate() {
            let got = llama.forward(&gpu, &[token], pos, Logits::Last).unwrap();
            steps = steps.max(max_abs_diff(got, &want[pos * vocab..][..vocab]));
        }
        let mut llama = Llama::with_model(shared).unwrap();
        let got = llama.forward(&gpu, &input, 0, Logits::All).unwrap();
        let prefill = max_abs_diff(got, &want[..input.len() * vocab]);
        eprintln!("{family}: max |Δ| against transformers {steps:e} token by token, {prefill:e} in one prefill");
        assert!(
            steps <= 1e-4 && prefill <= 1e-4,
            "{family}: {steps} / {prefill}"
        );

        // The batch-invariant GPU kernels take 16-bit matrices (cuBLAS's f32 GEMM is not).
        let f16 = f16_matrices(f32_weights);
        let requests: [(Vec<u32>, usize); 3] = [
            (input.clone(), 12),
            (vec![1, 5, 9], 20),
            (input[..4].to_vec(), 16),
        ];
        let Some(alone_exec) = gpu_executor() else {
            return;
        };
        alone_exec.require_batch_invariance();
        let alone_model = Arc::new(placed(&alone_exec, f16.clone()));
        let alone: Vec<Vec<u32>> = requests
            .iter()
            .map(|(p, n)| {
                let mut llama = Llama::with_model(Arc::clone(&alone_model)).unwrap();
                greedy_on(&alone_exec, &mut llama, p, *n)
            })
            .collect();
        let Some(exec) = gpu_executor() else { return };
        exec.require_batch_invariance();
        let model = SharedModel::from(placed(&exec, f16));
        assert_eq!(serve_greedy(model, exec, &requests), alone, "{family}");
    }
}

/// `w` with every matrix but the routed experts' (and the router's) in f16.
fn f16_matrices(mut w: LlamaWeights) -> LlamaWeights {
    let half = |d: Data| {
        if d.shape().len() == 2 {
            d.to_dtype(DataType::F16)
        } else {
            Ok(d)
        }
    };
    w.embedding = half(w.embedding).unwrap();
    w.classifier = w.classifier.map(|d| half(d).unwrap());
    w.layers = w
        .layers
        .into_iter()
        .map(|l| {
            l.try_map(|d, routed| if routed { Ok(d) } else { Ok(half(d)?) })
                .unwrap()
        })
        .collect();
    w
}
