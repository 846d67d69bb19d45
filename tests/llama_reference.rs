//! stories260K against references produced by independent implementations (HF
//! transformers and llama2.c `run.c`; see tests/data/SOURCES.md).

use flm_models::import::{self, Format};
use flm_models::llama::{Llama, LlamaWeights, Logits};
use flm_models::Graph;
use flm_tests::{cpu_executor, data, greedy_on, ids, stories_logits, stories_reference};

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
            assert_eq!(got.len(), expected.len());
            let max_err = got
                .iter()
                .zip(&expected)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(max_err < 1e-4, "{rel}: max abs error {max_err}");
        }
    }
}
