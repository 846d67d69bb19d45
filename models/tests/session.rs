//! Generation sessions on the shipped stories260K against llama2.c's reference
//! (tests/data/stories260K/stories260K_reference.json): the streamed ids and text, every
//! stop reason (stop tokens included), KV-cache reuse across calls, and two instances over
//! one shared model on two threads.

use std::ops::ControlFlow;
use std::sync::Arc;

use flm_core::SamplerConfig;
use flm_models::session::{GenerateParams, Generation, Session, StopReason};
use flm_models::{Error, SharedModel};
use flm_tests::{batch_invariant_executor as exec, ids, stories260k, stories_reference};
use flm_tokenizer::Tokenizer;

fn new_session(model: &SharedModel, tokenizer: &Arc<Tokenizer>) -> Session {
    Session::new(model.instance().unwrap(), Arc::clone(tokenizer)).unwrap()
}

fn params(max_tokens: usize, sampler: SamplerConfig) -> GenerateParams {
    GenerateParams {
        sampler,
        max_tokens,
        ignore_eos: false,
        stop: Vec::new(),
    }
}

/// Runs `session` and collects the ids and text it streams; `stop_after` pieces with an
/// id, the callback asks to stop.
fn run(
    session: &mut Session,
    prompt: &str,
    params: &GenerateParams,
    stop_after: Option<usize>,
) -> (Vec<u32>, String, Generation) {
    let (mut ids, mut text) = (Vec::new(), String::new());
    let generation = session
        .generate(&exec(), prompt, params, |piece| {
            ids.extend(piece.id);
            text.push_str(piece.text);
            match stop_after {
                Some(n) if ids.len() >= n => ControlFlow::Break(()),
                _ => ControlFlow::Continue(()),
            }
        })
        .unwrap();
    (ids, text, generation)
}

#[test]
fn greedy_ids_and_text_match_llama2c() {
    let (model, tokenizer) = stories260k(None);
    let mut session = new_session(&model, &tokenizer);
    let case = &stories_reference()["greedy_prompt"];
    let max = case["max_new_tokens"].as_u64().unwrap() as usize;
    let (got, text, generation) = run(
        &mut session,
        "Once upon a time",
        &params(max, SamplerConfig::default()),
        None,
    );
    let expected = ids(&case["output_ids"]);
    assert_eq!(got, expected[expected.len() - max..]);
    let full = case["output_text"].as_str().unwrap();
    assert_eq!(Some(text.as_str()), full.strip_prefix("Once upon a time"));
    assert_eq!(generation.stop, StopReason::MaxTokens);
    assert_eq!(generation.generated, max);
    assert_eq!(generation.prompt_tokens, ids(&case["input_ids"]).len());
}

#[test]
fn stop_reasons() {
    let (model, tokenizer) = stories260k(Some(6));
    let mut session = new_session(&model, &tokenizer);
    let greedy = params(100, SamplerConfig::default());
    // BOS and 5 generated tokens fill the 6 positions.
    let (got, _, generation) = run(&mut session, "", &greedy, None);
    assert_eq!((got.len(), generation.stop), (5, StopReason::ContextFull));
    let (stopped, _, generation) = run(&mut session, "", &greedy, Some(2));
    assert_eq!(generation.stop, StopReason::Stopped);
    assert_eq!(stopped, got[..2]);
    let err = session
        .generate(&exec(), "Once upon a time there was", &greedy, |_| {
            ControlFlow::Continue(())
        })
        .unwrap_err();
    assert!(
        matches!(err, Error::PromptTooLong { context: 6, .. }),
        "{err}"
    );
    // A sampled story that ends before the context does (seed 2: after 298 tokens).
    let (model, tokenizer) = stories260k(None);
    let mut session = new_session(&model, &tokenizer);
    let sampled = params(
        512,
        SamplerConfig {
            temperature: 1.0,
            seed: 2,
            ..SamplerConfig::default()
        },
    );
    let (got, _, generation) = run(&mut session, "", &sampled, None);
    assert_eq!(generation.stop, StopReason::EndOfSequence);
    assert!(got.len() < 511 && got.len() == generation.generated);
}

#[test]
fn two_instances_of_one_model_on_two_threads_equal_their_solo_runs() {
    let (model, tokenizer) = stories260k(None);
    let jobs = [
        ("Once upon a time", SamplerConfig::default()),
        (
            "Tom had a dog",
            SamplerConfig {
                temperature: 0.8,
                top_k: 40,
                top_p: 0.95,
                seed: 7,
                ..SamplerConfig::default()
            },
        ),
    ];
    let job = |(prompt, sampler): &(&str, SamplerConfig)| {
        let mut session = new_session(&model, &tokenizer);
        run(&mut session, prompt, &params(100, sampler.clone()), None).0
    };
    let solo: Vec<Vec<u32>> = jobs.iter().map(job).collect();
    let together: Vec<Vec<u32>> = std::thread::scope(|s| {
        let handles: Vec<_> = jobs.iter().map(|j| s.spawn(move || job(j))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, solo);
}

/// Runs `session` on the token ids `prompt` and returns the generated ids.
fn run_tokens(
    session: &mut Session,
    prompt: &[u32],
    params: &GenerateParams,
) -> (Vec<u32>, Generation) {
    let mut ids = Vec::new();
    let generation = session
        .generate_tokens(&exec(), prompt.to_vec(), false, params, |piece| {
            ids.extend(piece.id);
            ControlFlow::Continue(())
        })
        .unwrap();
    (ids, generation)
}

/// A session over stories260K, the input ids of the reference's `greedy_prompt` and the
/// tokens transformers generates after them.
fn greedy_prompt_session() -> (Session, Vec<u32>, Vec<u32>) {
    let (model, tokenizer) = stories260k(None);
    let case = &stories_reference()["greedy_prompt"];
    let expected = ids(&case["output_ids"]);
    let new_tokens = case["max_new_tokens"].as_u64().unwrap() as usize;
    let continuation = expected[expected.len() - new_tokens..].to_vec();
    let input = ids(&case["input_ids"]);
    (new_session(&model, &tokenizer), input, continuation)
}

#[test]
fn a_prompt_extending_the_cached_sequence_prefills_only_its_new_tokens() {
    let (mut session, input, continuation) = greedy_prompt_session();
    let greedy = |max| params(max, SamplerConfig::default());
    let (first, generation) = run_tokens(&mut session, &input, &greedy(8));
    assert_eq!(first, continuation[..8]);
    assert_eq!(generation.reused_tokens, 0);
    // The cache holds the prompt and the first 7 generated tokens (the 8th was never fed).
    let mut second_prompt = input.clone();
    second_prompt.extend(&continuation[..5]);
    let (second, generation) = run_tokens(&mut session, &second_prompt, &greedy(10));
    assert_eq!(generation.reused_tokens, second_prompt.len() - 1);
    assert_eq!(second, continuation[5..15]);
    // A prefix of the cached sequence reruns only its last token, for the logits.
    let (third, generation) = run_tokens(&mut session, &input, &greedy(10));
    assert_eq!(generation.reused_tokens, input.len() - 1);
    assert_eq!(third, continuation[..10]);
    // A prompt that diverges after BOS reuses BOS only.
    let (_, _, generation) = run(&mut session, "Tom had a dog", &greedy(3), None);
    assert_eq!(generation.reused_tokens, 1);
}

#[test]
fn a_stop_token_ends_generation_before_it_is_handed_out() {
    let (mut session, input, continuation) = greedy_prompt_session();
    let stop_at = 6;
    let stop = continuation[stop_at];
    let first = continuation.iter().position(|&t| t == stop).unwrap();
    let mut stopping = params(50, SamplerConfig::default());
    stopping.stop = vec![stop];
    let (got, generation) = run_tokens(&mut session, &input, &stopping);
    assert_eq!(generation.stop, StopReason::EndOfSequence);
    assert_eq!(got, continuation[..first]);
    stopping.ignore_eos = true;
    let (got, _) = run_tokens(&mut session, &input, &stopping);
    assert_eq!(got[..first + 1], continuation[..first + 1]);
}
