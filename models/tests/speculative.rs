//! Speculative decoding on the shipped stories260K (f32 target) with drafts quantised by
//! the converter at test time (int8, int4) and by llama.cpp (the Q4_0 GGUF): greedy output
//! identical to plain greedy decoding and to llama2.c's reference, every stop condition as
//! in plain generation, the tokens of a round distributed as the target's (chi-square), a
//! sampled run that is reproducible and leaves a consistent KV cache, and the refusals.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use flm_core::{DataType, Sampler, SamplerConfig};
use flm_models::convert::{convert, Recipe};
use flm_models::session::{self, GenerateParams, Generation, Session, StopReason};
use flm_models::speculative::{check_same_vocabulary, Draft};
use flm_models::{import, llama::Logits, Model, SharedModel};
use flm_tokenizer::Tokenizer;

use flm_tests::{batch_invariant_executor as exec, data, emulated, stories260k, stories_reference};

/// stories260K converted to `dtype` by `flm convert`'s code into `dir`, loaded back.
fn converted(dtype: DataType, dir: &Path, context: Option<usize>) -> (SharedModel, Tokenizer) {
    let source = data("stories260K/stories260K.bin");
    let mut ckpt = import::load(&source).unwrap();
    let tokenizer = ckpt.take_tokenizer(&source).unwrap();
    let out = dir.join(format!("stories260K-{dtype:?}.flm"));
    convert(&ckpt, &tokenizer, &out, dtype, Recipe::Mixed, |_| {}).unwrap();
    session::load_model(&out, None, context).unwrap()
}

fn params(max_tokens: usize, sampler: SamplerConfig, stop: Vec<u32>) -> GenerateParams {
    GenerateParams {
        sampler,
        max_tokens,
        ignore_eos: false,
        stop,
    }
}

fn greedy() -> SamplerConfig {
    SamplerConfig::default()
}

/// A session on the target, with `draft` proposing `k` tokens per round if given.
fn session(
    model: &SharedModel,
    tokenizer: &Arc<Tokenizer>,
    draft: Option<(&SharedModel, &Tokenizer, usize)>,
) -> Session {
    let mut s = Session::new(model.instance().unwrap(), Arc::clone(tokenizer)).unwrap();
    if let Some((draft, draft_tokenizer, k)) = draft {
        let draft = Draft::new(draft.instance().unwrap(), k).unwrap();
        s.set_draft(draft, Some(draft_tokenizer)).unwrap();
    }
    s
}

fn run(s: &mut Session, prompt: &str, params: &GenerateParams) -> (Vec<u32>, String, Generation) {
    let (mut ids, mut text) = (Vec::new(), String::new());
    let g = s
        .generate(&exec(), prompt, params, |piece| {
            ids.extend(piece.id);
            text.push_str(piece.text);
            ControlFlow::Continue(())
        })
        .unwrap();
    (ids, text, g)
}

#[test]
fn greedy_output_is_plain_greedy_output() {
    let dir = tempfile::tempdir().unwrap();
    let (model, tokenizer) = stories260k(None);
    let reference = stories_reference();
    let from_bos = reference["greedy_from_bos"]["output_text"]
        .as_str()
        .unwrap();
    let gguf = session::load_model(&data("gguf/stories260K-q4_0.gguf"), None, None).unwrap();
    let drafts = [
        ("int8", converted(DataType::I8, dir.path(), None)),
        ("int4", converted(DataType::I4G32, dir.path(), None)),
        ("llama.cpp Q4_0", gguf),
    ];
    let prompts = ["", "Once upon a time", "Lily and Ben went to the park"];
    // Under emulation, the prompt with llama2.c's reference: every draft and K still run.
    let prompts = if emulated() {
        &prompts[..1]
    } else {
        &prompts[..]
    };
    for &prompt in prompts {
        let p = params(200, greedy(), Vec::new());
        let (plain, plain_text, _) = run(&mut session(&model, &tokenizer, None), prompt, &p);
        if prompt.is_empty() {
            assert_eq!(plain_text, from_bos, "plain greedy is llama2.c's");
        }
        for (name, (draft, draft_tokenizer)) in &drafts {
            for k in [1, 4, 7] {
                let mut s = session(&model, &tokenizer, Some((draft, draft_tokenizer, k)));
                let (ids, text, g) = run(&mut s, prompt, &p);
                assert_eq!(ids, plain, "{name} draft, K = {k}, prompt {prompt:?}");
                assert_eq!(text, plain_text);
                let stats = g.draft.unwrap();
                assert!(stats.accepted <= stats.proposed && stats.rounds > 0);
                println!(
                    "{name} draft, K = {k}, prompt {prompt:?}: acceptance {:.1}% \
                     ({} of {}), {} tokens in {} rounds",
                    stats.acceptance_rate().unwrap() * 100.0,
                    stats.accepted,
                    stats.proposed,
                    g.generated,
                    stats.rounds
                );
            }
        }
    }
}

#[test]
fn stop_conditions_are_those_of_plain_generation() {
    let dir = tempfile::tempdir().unwrap();
    let (draft, draft_tokenizer) = converted(DataType::I4G32, dir.path(), None);
    let (model, tokenizer) = stories260k(None);
    let draft = Some((&draft, &draft_tokenizer, 5));
    let prompt = "Once upon a time";
    let (plain, _, _) = run(
        &mut session(&model, &tokenizer, None),
        prompt,
        &params(60, greedy(), Vec::new()),
    );
    // max_tokens: exactly that many, however the rounds fall.
    for max_tokens in 0..=12 {
        let p = params(max_tokens, greedy(), Vec::new());
        let (ids, _, g) = run(&mut session(&model, &tokenizer, draft), prompt, &p);
        assert_eq!(ids, plain[..max_tokens], "max_tokens {max_tokens}");
        assert_eq!((g.generated, g.stop), (max_tokens, StopReason::MaxTokens));
    }
    // A stop token in the middle of a round: nothing after it comes out, nor the token.
    for at in [3, 10, 25] {
        let p = params(60, greedy(), vec![plain[at]]);
        let first = plain.iter().position(|&t| t == plain[at]).unwrap();
        let (ids, _, g) = run(&mut session(&model, &tokenizer, draft), prompt, &p);
        assert_eq!(ids, plain[..first], "stop token {}", plain[at]);
        assert_eq!(g.stop, StopReason::EndOfSequence);
    }
    // A context of 24 positions (target and draft): the rounds shrink near the end.
    let (small, small_tokenizer) = stories260k(Some(24));
    let (small_draft, small_draft_tokenizer) = converted(DataType::I4G32, dir.path(), Some(24));
    let p = params(100, greedy(), Vec::new());
    let (plain_small, _, g) = run(&mut session(&small, &small_tokenizer, None), prompt, &p);
    assert_eq!(g.stop, StopReason::ContextFull);
    let draft = Some((&small_draft, &small_draft_tokenizer, 7));
    let (ids, _, g) = run(&mut session(&small, &small_tokenizer, draft), prompt, &p);
    assert_eq!(ids, plain_small);
    assert_eq!(
        (g.stop, g.prompt_tokens + g.generated),
        (StopReason::ContextFull, 24)
    );
}

/// Upper 0.1% point of the chi-square distribution with `df` degrees of freedom, by the
/// Wilson–Hilferty approximation (accurate to about 1% for `df ≥ 10`).
fn chi_square_critical(df: usize) -> f64 {
    let (df, z) = (df as f64, 3.090_232);
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + z * a.sqrt()).powi(3)
}

#[test]
fn round_tokens_follow_the_target_distribution() {
    let dir = tempfile::tempdir().unwrap();
    let (draft_model, _) = converted(DataType::I4G32, dir.path(), None);
    let (model, tokenizer) = stories260k(None);
    let exec = exec();
    let tokens = tokenizer
        .encode("Once upon a time, there was a", true)
        .unwrap();
    let len = tokens.len();
    let mut target: Model = model.instance().unwrap();
    // The target's distribution after the sequence, and its cache of tokens[..len-1].
    let config = SamplerConfig {
        temperature: 1.0,
        ..SamplerConfig::default()
    };
    let mut p = Vec::new();
    let logits = target.forward(&exec, &tokens, 0, Logits::Last).unwrap();
    Sampler::new(config.clone())
        .unwrap()
        .probabilities(logits, &tokens, &[], &mut p)
        .unwrap();
    // The first token of a round is the accepted draft or the residual's draw, whatever K:
    // K = 1 (at most 2 tokens per round) keeps the test short under emulation.
    let mut draft = Draft::new(draft_model.instance().unwrap(), 1).unwrap();
    let n = 4000;
    let mut counts = vec![0usize; p.len()];
    let (mut proposed, mut accepted) = (0, 0);
    for seed in 0..n as u64 {
        let config = SamplerConfig {
            seed,
            ..config.clone()
        };
        draft.start(&config).unwrap();
        let mut sampler = Sampler::new(config).unwrap();
        let out = draft
            .round(&exec, &mut target, &tokens, tokens.len(), &mut sampler, 2)
            .unwrap();
        counts[out[0] as usize] += 1;
        proposed += draft.stats().proposed;
        accepted += draft.stats().accepted;
    }
    // Bins with an expected count under 5 are pooled, as Pearson's test asks.
    let (mut stat, mut df, mut pooled_count, mut pooled_p) = (0.0, 0, 0usize, 0.0);
    for (&c, &p) in counts.iter().zip(&p) {
        let expected = n as f64 * p as f64;
        if expected < 5.0 {
            pooled_count += c;
            pooled_p += p as f64;
        } else {
            stat += (c as f64 - expected).powi(2) / expected;
            df += 1;
        }
    }
    let expected = n as f64 * pooled_p;
    stat += (pooled_count as f64 - expected).powi(2) / expected.max(1e-9);
    let critical = chi_square_critical(df);
    println!(
        "first token of {n} rounds: chi-square {stat:.1}, {df} degrees of freedom, 0.1% \
         critical value {critical:.1}; acceptance {accepted} of {proposed}"
    );
    assert!(stat < critical, "{stat} >= {critical}");
    assert_eq!(len, tokens.len());
}

#[test]
fn sampled_run_is_reproducible_and_leaves_a_consistent_kv_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (draft, draft_tokenizer) = converted(DataType::I4G32, dir.path(), None);
    let (model, tokenizer) = stories260k(None);
    let sampled = SamplerConfig {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        repeat_penalty: 1.1,
        presence_penalty: 0.3,
        frequency_penalty: 0.2,
        seed: 7,
    };
    let p = params(150, sampled, Vec::new());
    let prompt = "Once upon a time";
    let draft = Some((&draft, &draft_tokenizer, 4));
    let mut s = session(&model, &tokenizer, draft);
    let (ids, text, g) = run(&mut s, prompt, &p);
    assert!(!ids.is_empty() && ids.len() == g.generated);
    assert!(ids.iter().all(|&id| (id as usize) < tokenizer.vocab_size()));
    assert_eq!(text, tokenizer.decode(&ids).unwrap());
    let (again, _, _) = run(&mut session(&model, &tokenizer, draft), prompt, &p);
    assert_eq!(again, ids, "the same seed gives the same tokens");
    // The session's cache holds the prompt and the generated tokens: a greedy continuation
    // that reuses it equals one from a fresh session.
    let mut sequence = tokenizer.encode(prompt, true).unwrap();
    sequence.extend(&ids);
    let greedy = params(30, greedy(), Vec::new());
    let continue_from = |s: &mut Session| {
        let mut out = Vec::new();
        let g = s
            .generate_tokens(&exec(), sequence.clone(), false, &greedy, |piece| {
                out.extend(piece.id);
                ControlFlow::Continue(())
            })
            .unwrap();
        (out, g.reused_tokens)
    };
    let (reused_out, reused) = continue_from(&mut s);
    assert_eq!(reused, sequence.len() - 1);
    let (fresh_out, _) = continue_from(&mut session(&model, &tokenizer, None));
    assert_eq!(reused_out, fresh_out);
}

#[test]
fn drafts_of_another_vocabulary_are_refused() {
    let (model, tokenizer) = stories260k(None);
    let other = import::load(&data("hf-families/llama3")).unwrap();
    let other = Model::new(&other).unwrap();
    let target = model.instance().unwrap();
    let err = check_same_vocabulary(&target, &tokenizer, &other, &tokenizer).unwrap_err();
    assert!(err.to_string().contains("512 and 256"), "{err}");
    let gpt2 = Tokenizer::from_file(&data("tokenizer/gpt2/tokenizer.json")).unwrap();
    let err = check_same_vocabulary(&target, &tokenizer, &target, &gpt2).unwrap_err();
    assert!(err.to_string().contains("share one tokenizer"), "{err}");
    assert!(Draft::new(model.instance().unwrap(), 0).is_err());
}
