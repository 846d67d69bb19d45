//! Helpers shared by the workspace integration tests: where the test data lives and how
//! to read the reference files (their provenance is in `tests/data/SOURCES.md`).

pub mod fuzz;
pub mod glm_data;
pub mod tensor_parallel;
pub mod tokenizer;

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};

use flm_core::{Data, DataType, Executor, KvDtype, Location, PagedKvCache, SamplerConfig};
use flm_devices::{ActivationBits, CpuDevice, Isa};
use flm_models::convert::{convert, Recipe};
use flm_models::engine::{Engine, EngineConfig, Event, FinishReason, Request};
use flm_models::import::Checkpoint;
use flm_models::llama::{Attention, Ffn, Llama, LlamaWeights, Logits, SharedLlama};
use flm_models::session::{self, GenerateParams, Session};
use flm_models::tensor_names::{LayerPart, TensorName};
use flm_models::{
    import, BatchSeq, BatchedForward, Graph, Model, Placement, SharedGraph, SharedModel,
};
use flm_tokenizer::Tokenizer;
use serde_json::Value;

/// `tests/data` of the repository.
pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data")
}

/// A path below `tests/data`.
pub fn data(rel: &str) -> PathBuf {
    data_dir().join(rel)
}

/// The JSON file `rel` below `tests/data`, parsed; panics with the path when it cannot be
/// read or parsed.
pub fn json(rel: &str) -> Value {
    let bytes = std::fs::read(data(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Whether the tests run under an emulator: `FLM_TEST_RUNNER` is set (`.ci/run`'s aarch64
/// section sets it to `qemu-aarch64 -cpu ...`), where a step costs ~50 times a native one.
pub fn emulated() -> bool {
    std::env::var("FLM_TEST_RUNNER").is_ok_and(|r| !r.trim().is_empty())
}

/// Whether every kernel step is slow here: under an emulator, or at the portable level
/// (`FLM_CPU_ISA=scalar`, about ten times the vector levels' time in `.ci/run`'s rerun).
/// Tests that repeat the same work many times take a lighter load then.
pub fn slow_kernels() -> bool {
    emulated() || Isa::from_env().is_ok_and(|isa| isa == Isa::Scalar)
}

/// The CPU device at its best level, or the one `FLM_CPU_ISA` names.
fn cpu() -> CpuDevice {
    CpuDevice::new().expect("FLM_CPU_ISA names a level this CPU has")
}

/// An executor with the CPU device, profiling off.
pub fn cpu_executor() -> Executor {
    Executor::with_profiling(vec![Box::new(cpu())], false)
}

/// An executor with the CPU device whose quantised Linears dot their weights against
/// `bits` activations, profiling off.
pub fn cpu_executor_with(bits: ActivationBits) -> Executor {
    Executor::with_profiling(vec![Box::new(cpu().with_activation_bits(bits))], false)
}

/// A batch-invariant executor on the CPU at its best level (or the one `FLM_CPU_ISA`
/// names), as the engine and speculative decoding make theirs, so that a sequence run alone
/// is comparable bit for bit with the same sequence batched.
pub fn batch_invariant_executor() -> Executor {
    let exec = cpu_executor();
    exec.require_batch_invariance();
    exec
}

/// llama2.c's stories260K (`stories260K/stories260K.bin`) with its tokenizer, its context
/// cut to `context`, loaded as sessions load models.
pub fn stories260k(context: Option<usize>) -> (SharedModel, Arc<Tokenizer>) {
    let path = data("stories260K/stories260K.bin");
    let (model, tokenizer) = session::load_model(&path, None, context).unwrap();
    (model, Arc::new(tokenizer))
}

/// `stories260K_reference.json` (generated with HF transformers, see SOURCES.md).
pub fn stories_reference() -> Value {
    json("stories260K/stories260K_reference.json")
}

/// A JSON array of integers as token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// The little-endian f32 values of the file `path` (the logits files of `tests/data`).
pub fn f32_file(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The largest absolute difference between `a` and `b`, which must be as long.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The reference logits `[8, 512]` of `stories260K_logits_f32le.bin`.
pub fn stories_logits() -> Vec<f32> {
    f32_file(&data("stories260K/stories260K_logits_f32le.bin"))
}

/// The tiny transformers checkpoints of `tests/data/hf-families` (made by its
/// `make_tiny.py`; for DeepSeek and GLM-4.5, `make_mla.py`; for gpt-oss, `make_gpt_oss.py`),
/// by directory name.
pub const HF_FAMILIES: [&str; 16] = [
    "llama3",
    "mistral",
    "qwen2",
    "qwen3",
    "phi3",
    "gemma",
    "gemma2",
    "gemma3",
    "mixtral",
    "qwen3_moe",
    "qwen2_moe",
    "glm4",
    "deepseek_v2",
    "deepseek_v3",
    "glm4_moe",
    "gpt_oss",
];

/// Converts `ckpt` to the .flm file `out` with `dtype` and `recipe`, stories260K's tok512
/// riding along as its tokenizer (the tiny test checkpoints have none).
pub fn convert_with_tok512(ckpt: &Checkpoint, out: &Path, dtype: DataType, recipe: Recipe) {
    let tokenizer = Tokenizer::from_file(&data("stories260K/tok512.model")).expect("tok512");
    convert(ckpt, &tokenizer, out, dtype, recipe, |_| {}).expect("convert");
}

/// The sorted names of the entries of `dir`.
pub fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("a readable directory")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// The arguments of `flm run` that generate `max_tokens` greedy tokens (temperature 0) from
/// `model` after `prompt`.
pub fn greedy_run_args<'a>(model: &'a str, prompt: &'a str, max_tokens: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "--model",
        model,
        "--prompt",
        prompt,
        "--temperature",
        "0",
        "--max-tokens",
        max_tokens,
    ]
}

/// Converts stories260K, with its own tokenizer, to the .flm file `out` with `dtype` and
/// `recipe`.
pub fn convert_stories260k(out: &Path, dtype: DataType, recipe: Recipe) {
    let source = data("stories260K/stories260K.bin");
    let mut ckpt = import::load(&source).expect("stories260K");
    let tokenizer = ckpt.take_tokenizer(&source).expect("its tokenizer");
    convert(&ckpt, &tokenizer, out, dtype, recipe, |_| {}).expect("convert");
}

/// Prefills `prompt` on `exec`, then decodes `steps` greedy tokens one at a time.
pub fn greedy_on(exec: &Executor, model: &mut Llama, prompt: &[u32], steps: usize) -> Vec<u32> {
    let mut logits = model
        .forward(exec, prompt, 0, Logits::Last)
        .expect("prefill");
    let mut out = Vec::new();
    for step in 0..steps {
        let next = flm_core::argmax(logits);
        out.push(next);
        if step + 1 < steps {
            logits = model
                .forward(exec, &[next], prompt.len() + step, Logits::Last)
                .expect("decode");
        }
    }
    out
}

/// llama2.c's stories260K (5 layers, f32) with its first `on_device` layers' weights, KV
/// cache (of `kv_dtype`) and activations in the memory `at` of a device of `exec`, the rest
/// on the host.
pub fn stories_placed(exec: &Executor, at: Location, on_device: usize, kv_dtype: KvDtype) -> Llama {
    let ckpt = import::load(&data("stories260K/stories260K.bin")).expect("stories260K");
    let model = SharedLlama::new(ckpt.config.clone(), LlamaWeights::load(&ckpt).unwrap())
        .expect("stories260K builds")
        .with_kv_dtype(kv_dtype);
    let placement = Placement::first_layers(model.config().n_layers, at, on_device);
    let model = model.place(exec, placement).expect("placement");
    Llama::with_model(Arc::new(model)).expect("instance")
}

/// Sampling with every option of [`SamplerConfig`] on: temperature, top-k, top-p, the
/// repetition, presence and frequency penalties, and a seed.
pub fn every_sampling_option() -> SamplerConfig {
    SamplerConfig {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        repeat_penalty: 1.1,
        seed: 7,
        presence_penalty: 0.3,
        frequency_penalty: 0.2,
    }
}

/// The 60 ids a session over stories260K generates from "Once upon a time" on `exec` with
/// `sampler` (end-of-sequence ignored), every layer in the memory of `at` (host memory:
/// not placed).
pub fn session_ids(exec: &Executor, at: Location, sampler: &SamplerConfig) -> Vec<u32> {
    let (model, tokenizer) = stories260k(None);
    let model = model
        .place(exec, |c, _| Ok(Placement::first_layers(c.n_layers, at, 99)))
        .unwrap();
    let mut session = Session::new(model.instance().unwrap(), tokenizer).unwrap();
    let params = GenerateParams {
        sampler: sampler.clone(),
        max_tokens: 60,
        ignore_eos: true,
        stop: Vec::new(),
    };
    let mut out = Vec::new();
    session
        .generate(exec, "Once upon a time", &params, |piece| {
            out.extend(piece.id);
            ControlFlow::Continue(())
        })
        .unwrap();
    out
}

/// `w` with each tensor converted by [`Data::to_dtype`] to the dtype `dtype_of` gives its
/// canonical name and shape.
pub fn weights_in(
    w: &LlamaWeights,
    dtype_of: impl Fn(TensorName, &[usize]) -> DataType,
) -> LlamaWeights {
    use LayerPart::*;
    let c = |name, d: &Data| d.to_dtype(dtype_of(name, d.shape())).expect("conversion");
    let mut out = w.clone();
    out.embedding = c(TensorName::Embedding, &w.embedding);
    for (l, (dst, src)) in out.layers.iter_mut().zip(&w.layers).enumerate() {
        for (part, d, s) in [
            (Wo, &mut dst.wo, &src.wo),
            (AttnNorm, &mut dst.attn_norm, &src.attn_norm),
            (FfnNorm, &mut dst.ffn_norm, &src.ffn_norm),
        ] {
            *d = c(TensorName::Layer(l, part), s);
        }
        if let Attention::Heads(h) = &mut dst.attn {
            for (part, d) in [(Wq, &mut h.wq), (Wk, &mut h.wk), (Wv, &mut h.wv)] {
                *d = c(TensorName::Layer(l, part), d);
            }
        }
        match &mut dst.ffn {
            Ffn::Dense {
                w_gate,
                w_down,
                w_up,
            } => {
                for (part, d) in [(WGate, w_gate), (WDown, w_down), (WUp, w_up)] {
                    *d = c(TensorName::Layer(l, part), d);
                }
            }
            Ffn::Moe {
                router,
                experts,
                shared,
                ..
            } => {
                *router = c(TensorName::Layer(l, Router), router);
                if let Some(s) = shared {
                    let parts = [
                        (SharedWGate, &mut s.ffn.gate),
                        (SharedWDown, &mut s.ffn.down),
                        (SharedWUp, &mut s.ffn.up),
                    ];
                    for (part, d) in parts
                        .into_iter()
                        .chain(s.gate.as_mut().map(|g| (SharedExpertGate, g)))
                    {
                        *d = c(TensorName::Layer(l, part), d);
                    }
                }
                for (e, x) in experts.iter_mut().enumerate() {
                    for (part, d) in [(WGate, &mut x.gate), (WDown, &mut x.down), (WUp, &mut x.up)]
                    {
                        *d = c(TensorName::Expert(l, e, part), d);
                    }
                }
            }
        }
    }
    out.final_norm = c(TensorName::FinalNorm, &w.final_norm);
    if let (Some(dst), Some(src)) = (out.classifier.as_mut(), w.classifier.as_ref()) {
        *dst = c(TensorName::Classifier, src);
    }
    out
}

/// Runs sequences step by step through `batch` over `kv`, and each alone through its own
/// instance of `model`, asserting that every row of the batch's logits equals those of its
/// sequence alone, bit for bit (every kernel is batch invariant on `exec`). Sequence `i` is
/// `seqs[i]`, its tokens and how many of them it runs at each step (0: it sits the step
/// out), in the KV blocks `tables[i]`; `what` names the case in a failure.
pub fn assert_batched_equals_single(
    model: &SharedModel,
    exec: &Executor,
    batch: &mut dyn BatchedForward,
    kv: &mut PagedKvCache,
    seqs: &[(&[u32], &[usize])],
    tables: &[Vec<u32>],
    what: &str,
) {
    let vocab = model.config().vocab_size;
    let mut singles: Vec<Model> = seqs.iter().map(|_| model.instance().unwrap()).collect();
    let mut done = vec![0; seqs.len()];
    for step in 0..seqs[0].1.len() {
        let mut batch_seqs = Vec::new();
        let mut who = Vec::new();
        for (i, (tokens, chunks)) in seqs.iter().enumerate() {
            let n = chunks[step];
            if n > 0 {
                batch_seqs.push(BatchSeq {
                    tokens: &tokens[done[i]..done[i] + n],
                    start_pos: done[i],
                    blocks: &tables[i],
                });
                who.push(i);
            }
        }
        let got = batch.forward(exec, kv, &batch_seqs).unwrap().to_vec();
        assert_eq!(got.len(), batch_seqs.len() * vocab, "{what}: step {step}");
        for (row, (&i, seq)) in who.iter().zip(&batch_seqs).enumerate() {
            let want = singles[i]
                .forward(exec, seq.tokens, seq.start_pos, Logits::Last)
                .unwrap();
            let got = &got[row * vocab..][..vocab];
            assert!(
                got.iter()
                    .zip(want)
                    .all(|(g, w)| g.to_bits() == w.to_bits()),
                "{what}: step {step}, sequence {i}: the batched logits differ from the single ones"
            );
            done[i] += seq.tokens.len();
        }
    }
}

/// Runs every `(prompt, max_tokens)` at once, greedy, through an engine over `model` on
/// `exec` (its default budgets); returns each request's tokens, checking that it ended
/// without an error.
pub fn serve_greedy(
    model: SharedModel,
    exec: Executor,
    requests: &[(Vec<u32>, usize)],
) -> Vec<Vec<u32>> {
    let engine = Engine::new(model, exec, EngineConfig::default()).unwrap();
    let pending: Vec<_> = requests
        .iter()
        .map(|(prompt, max_tokens)| {
            let (tx, rx) = mpsc::channel();
            let request = Request {
                prompt: prompt.clone(),
                sampler: SamplerConfig::default(),
                max_tokens: *max_tokens,
                stop_tokens: Vec::new(),
                logprobs: None,
                constraint: None,
                cancel: None,
            };
            let on_event = Box::new(move |e| {
                let _ = tx.send(e);
                ControlFlow::Continue(())
            });
            engine.submit(request, on_event).unwrap();
            rx
        })
        .collect();
    pending
        .into_iter()
        .map(|rx| {
            let mut ids = Vec::new();
            for event in rx {
                match event {
                    Event::Token(t, _) => ids.push(t),
                    Event::Finished(f) => {
                        assert!(
                            matches!(f.reason, FinishReason::Length | FinishReason::Stop),
                            "{:?}",
                            f.reason
                        );
                        break;
                    }
                }
            }
            ids
        })
        .collect()
}
