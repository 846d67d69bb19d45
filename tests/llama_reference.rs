//! stories260K against references produced by independent implementations (HF
//! transformers and llama2.c `run.c`; see tests/data/SOURCES.md).

use std::sync::Arc;

use flm_core::KvDtype;
use flm_models::import::{self, Format};
use flm_models::llama::{Llama, LlamaWeights, Logits, SharedLlama};
use flm_models::Graph;
use flm_tests::{
    cpu_executor, data, greedy_on, ids, max_abs_diff, stories_logits, stories_reference,
};

fn load(rel: &str) -> Llama {
    let ckpt = import::load(&data(rel)).expect("checkpoint loads");
    Llama::new(ckpt.config.clone(), LlamaWeights::load(&ckpt).unwrap()).expect("model builds")
}

/// Prefills `prompt`, then decodes `steps` greedy tokens one at a time.
fn greedy(model: &mut Llama, prompt: &[u32], steps: usize) -> Vec<u32> {
    greedy_on(&cpu_executor(), model, prompt, steps)
}

const MODELS: [&str; 2] = ["stories260K/stories260K.bin", "hf-stories260K"];

#[test]
fn formats_are_detected_from_bytes() {
    let bin = import::load(&data(MODELS[0])).unwrap();
    assert_eq!(bin.format, Format::Llama2cLegacy);
    let hf = import::load(&data(MODELS[1])).unwrap();
    assert_eq!(hf.format, Format::HuggingFace);
    assert_eq!(bin.config.n_kv_heads, 4);
    assert!(
        LlamaWeights::load(&bin).unwrap().embedding.is_mapped(),
        "weights are views of the mmap"
    );
    let single = import::load(&data("hf-stories260K/model.safetensors")).unwrap();
    assert_eq!(single.format, Format::HuggingFace);
}

#[test]
fn greedy_from_prompt_matches_transformers() {
    let reference = stories_reference();
    let case = &reference["greedy_prompt"];
    let prompt = ids(&case["input_ids"]);
    let expected = ids(&case["output_ids"]);
    for rel in MODELS {
        let mut model = load(rel);
        assert_eq!(
            greedy(&mut model, &prompt, expected.len()),
            expected,
            "{rel}"
        );
    }
}

#[test]
fn greedy_from_bos_matches_llama2c_for_200_tokens() {
    let reference = stories_reference();
    let case = &reference["greedy_from_bos"];
    let expected = ids(&case["output_ids"]);
    for rel in MODELS {
        let mut model = load(rel);
        assert_eq!(greedy(&mut model, &[1], 200), expected, "{rel}");
    }
}

/// With an f16 KV cache (`--kv-dtype f16`) the greedy tokens from BOS are still llama2.c's
/// (run.c keeps an f32 cache): the rounding of the keys and values (relative 2^-11) moves
/// the logits far less than the gap between the two best tokens along these 200 steps.
#[test]
fn greedy_from_bos_with_an_f16_kv_cache_matches_llama2c() {
    let reference = stories_reference();
    let expected = ids(&reference["greedy_from_bos"]["output_ids"]);
    let ckpt = import::load(&data(MODELS[0])).unwrap();
    let shared = SharedLlama::new(ckpt.config.clone(), LlamaWeights::load(&ckpt).unwrap())
        .unwrap()
        .with_kv_dtype(KvDtype::F16);
    let mut model = Llama::with_model(Arc::new(shared)).unwrap();
    assert_eq!(greedy(&mut model, &[1], 200), expected);
    // The cache is f16 indeed: the logits of a prompt move, a little.
    let prompt = ids(&reference["greedy_prompt"]["input_ids"]);
    let exec = cpu_executor();
    let half = model
        .forward(&exec, &prompt, 0, Logits::Last)
        .unwrap()
        .to_vec();
    let full = load(MODELS[0])
        .forward(&exec, &prompt, 0, Logits::Last)
        .unwrap()
        .to_vec();
    let diff = max_abs_diff(&half, &full);
    assert!(diff > 0.0 && diff < 0.05, "largest logit change {diff}");
}

#[test]
fn teacher_forced_logits_match_within_1e_4() {
    let reference = stories_reference();
    let input = ids(&reference["logits_file"]["input_ids"]);
    let expected = stories_logits();
    let exec = cpu_executor();
    for rel in MODELS {
        // Prefill of all 8 tokens in one pass.
        let mut model = load(rel);
        let all = model
            .forward(&exec, &input, 0, Logits::All)
            .unwrap()
            .to_vec();
        // The same positions one token at a time through the KV cache.
        let mut stepped = Vec::new();
        let mut model = load(rel);
        for (pos, &tok) in input.iter().enumerate() {
            stepped.extend(
                model
                    .forward(&exec, &[tok], pos, Logits::Last)
                    .unwrap()
                    .iter(),
            );
        }
        for got in [&all, &stepped] {
            let max_err = max_abs_diff(got, &expected);
            assert!(max_err < 1e-4, "{rel}: max abs error {max_err}");
        }
    }
}
