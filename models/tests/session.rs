//! Generation sessions on the shipped stories260K against llama2.c's reference
//! (tests/data/stories260K/stories260K_reference.json): the streamed ids and text, every
//! stop reason, and two instances over one shared model on two threads.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flm_core::{Executor, SamplerConfig};
use flm_devices::CpuDevice;
use flm_models::llama::{Llama, LlamaModel};
use flm_models::session::{self, GenerateParams, Generation, Session, StopReason};
use flm_models::Error;
use flm_tokenizer::Tokenizer;
use serde_json::Value;

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data")
        .join(rel)
}

fn reference() -> Value {
    let text = std::fs::read_to_string(data("stories260K/stories260K_reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn exec() -> Executor {
    Executor::with_profiling(vec![Box::new(CpuDevice::new().unwrap())], false)
}

fn load(context: Option<usize>) -> (Arc<LlamaModel>, Arc<Tokenizer>) {
    let path = data("stories260K/stories260K.bin");
    let (model, tokenizer) = session::load_model(&path, None, context).unwrap();
    (Arc::new(model), Arc::new(tokenizer))
}

fn new_session(model: &Arc<LlamaModel>, tokenizer: &Arc<Tokenizer>) -> Session {
    let instance = Llama::with_model(Arc::clone(model)).unwrap();
    Session::new(instance, Arc::clone(tokenizer)).unwrap()
}

fn params(max_tokens: usize, sampler: SamplerConfig) -> GenerateParams {
    GenerateParams {
        sampler,
        max_tokens,
        ignore_eos: false,
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

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn greedy_ids_and_text_match_llama2c() {
    let (model, tokenizer) = load(None);
    let mut session = new_session(&model, &tokenizer);
    let case = &reference()["greedy_prompt"];
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
    let (model, tokenizer) = load(Some(6));
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
    let (model, tokenizer) = load(None);
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
    let (model, tokenizer) = load(None);
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
