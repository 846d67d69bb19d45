//! The continuous-batching engine on the shipped stories260K: concurrent greedy and seeded
//! requests produce exactly what a lone `Session` produces for each; a KV pool too small for
//! all of them makes them wait (and preempts) yet every one finishes; cancellation frees the
//! blocks at once; bad requests are refused synchronously.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;

use flm_core::{Constraint, Grammar, Pattern, SamplerConfig, Vocabulary};
use flm_models::engine::{Engine, EngineConfig, Event, FinishReason, Request};
use flm_models::session::{GenerateParams, Session};
use flm_models::{Error, SharedModel};
use flm_tokenizer::Tokenizer;

use flm_tests::{batch_invariant_executor as exec, stories260k, stories_logits};

/// 32 different prompts: story openings with a name and a thing, after `preamble`.
fn prompts(tokenizer: &Tokenizer, preamble: &str) -> Vec<Vec<u32>> {
    let names = ["Lily", "Tom", "Sue", "Ben", "Max", "Anna", "Sam", "Mia"];
    let things = ["a ball", "a cat", "a big tree", "a red car"];
    let mut out = Vec::new();
    for (i, name) in names.iter().enumerate() {
        for (j, thing) in things.iter().enumerate() {
            let text = if (i + j) % 2 == 0 {
                format!("Once upon a time, {name} had {thing}")
            } else {
                format!("{name} saw {thing}. It was")
            };
            out.push(
                tokenizer
                    .encode(&format!("{preamble}{text}"), true)
                    .unwrap(),
            );
        }
    }
    out
}

/// What a lone session generates for `prompt`.
fn solo(
    model: &SharedModel,
    tokenizer: &Arc<Tokenizer>,
    prompt: &[u32],
    sampler: &SamplerConfig,
    max_tokens: usize,
) -> Vec<u32> {
    let mut session = Session::new(model.instance().unwrap(), Arc::clone(tokenizer)).unwrap();
    let params = GenerateParams {
        sampler: sampler.clone(),
        max_tokens,
        ignore_eos: false,
        stop: Vec::new(),
    };
    let mut ids = Vec::new();
    session
        .generate_tokens(&exec(), prompt.to_vec(), false, &params, |p| {
            ids.extend(p.id);
            ControlFlow::Continue(())
        })
        .unwrap();
    ids
}

fn request(
    tokenizer: &Tokenizer,
    prompt: &[u32],
    sampler: &SamplerConfig,
    max_tokens: usize,
) -> Request {
    Request {
        prompt: prompt.to_vec(),
        sampler: sampler.clone(),
        max_tokens,
        stop_tokens: tokenizer.eos_id().into_iter().collect(),
        logprobs: None,
        constraint: None,
        cancel: None,
    }
}

/// Submits `request` and returns the channel its events arrive on.
fn submit(engine: &Engine, request: Request) -> Receiver<Event> {
    let (tx, rx) = mpsc::channel();
    engine
        .submit(
            request,
            Box::new(move |e| {
                let _ = tx.send(e);
                ControlFlow::Continue(())
            }),
        )
        .unwrap();
    rx
}

/// The tokens of a finished request, and how it finished.
fn collect(rx: Receiver<Event>) -> (Vec<u32>, FinishReason, usize) {
    let mut ids = Vec::new();
    for event in rx {
        match event {
            Event::Token(t, logprobs) => {
                assert!(logprobs.is_none());
                ids.push(t);
            }
            Event::Finished(f) => {
                assert_eq!(f.completion_tokens, ids.len());
                return (ids, f.reason, f.prompt_tokens);
            }
        }
    }
    panic!("the request ended without Finished");
}

/// Runs every prompt at once through an engine with `config` and checks each against its
/// lone run; returns the engine's stats at the end.
fn all_equal_their_solo_runs(
    config: EngineConfig,
    samplers: &[SamplerConfig],
    max_tokens: usize,
    preamble: &str,
) -> flm_models::engine::EngineStats {
    let (model, tokenizer) = stories260k(Some(256));
    let prompts = prompts(&tokenizer, preamble);
    let engine = Engine::new(model.clone(), exec(), config).unwrap();
    let pending: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let sampler = &samplers[i % samplers.len()];
            submit(&engine, request(&tokenizer, p, sampler, max_tokens))
        })
        .collect();
    for (i, (rx, prompt)) in pending.into_iter().zip(&prompts).enumerate() {
        let (got, reason, prompt_tokens) = collect(rx);
        let sampler = &samplers[i % samplers.len()];
        let want = solo(&model, &tokenizer, prompt, sampler, max_tokens);
        assert_eq!(got, want, "request {i}");
        assert_eq!(prompt_tokens, prompt.len());
        let expected = if got.len() == max_tokens {
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        assert_eq!(reason, expected, "request {i}");
    }
    let stats = engine.stats();
    assert_eq!(stats.free_blocks, stats.total_blocks);
    assert_eq!((stats.running, stats.waiting), (0, 0));
    assert_eq!(stats.finished_requests, prompts.len() as u64);
    stats
}

#[test]
fn thirty_two_concurrent_greedy_requests_equal_their_solo_runs() {
    let stats =
        all_equal_their_solo_runs(EngineConfig::default(), &[SamplerConfig::default()], 60, "");
    assert_eq!(stats.preemptions, 0);
}

#[test]
fn seeded_sampling_with_penalties_equals_the_solo_runs() {
    let samplers = [
        SamplerConfig {
            temperature: 0.9,
            top_p: 0.9,
            seed: 11,
            presence_penalty: 0.5,
            frequency_penalty: 0.3,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            temperature: 1.0,
            top_k: 20,
            seed: 5,
            repeat_penalty: 1.2,
            ..SamplerConfig::default()
        },
    ];
    all_equal_their_solo_runs(EngineConfig::default(), &samplers, 40, "");
}

/// A pool of 16 blocks of 8 positions (128 in all) for 32 requests of up to about 75
/// positions each: they wait, sequences are preempted and recomputed, and every request
/// still gets exactly its solo tokens.
#[test]
fn a_small_pool_makes_requests_wait_and_preempts_yet_all_finish_exactly() {
    let config = EngineConfig {
        block_size: 8,
        max_batch_total_tokens: 128,
        max_batch_prefill_tokens: 12,
        max_waiting: 64,
        max_batch_tokens: None,
    };
    let stats = all_equal_their_solo_runs(config, &[SamplerConfig::default()], 60, "");
    assert!(stats.preemptions > 0, "{stats:?}");
    assert_eq!(stats.total_blocks, 16);
}

/// A step budget of 24 tokens, decode and prefill together: prompts are prefilled a few
/// tokens a step (one when 24 or more sequences decode) between decode steps, and every
/// request still gets exactly its solo tokens.
#[test]
fn a_step_token_budget_chunks_prompts_between_decode_steps_exactly() {
    let config = EngineConfig {
        max_batch_tokens: Some(24),
        ..EngineConfig::default()
    };
    let preamble = "The sun was shining and the birds were singing. ";
    all_equal_their_solo_runs(config, &[SamplerConfig::default()], 30, preamble);
}

/// Prompts that share a long preamble, admitted a few per step: the later ones take the
/// preamble's blocks from the running ones and still produce exactly their solo tokens.
#[test]
fn a_shared_prompt_prefix_is_computed_once_and_changes_nothing() {
    let config = EngineConfig {
        block_size: 4,
        max_batch_total_tokens: 8192,
        max_batch_prefill_tokens: 48,
        max_waiting: 64,
        max_batch_tokens: None,
    };
    let preamble = "The sun was shining and the birds were singing in the big green park. ";
    let stats = all_equal_their_solo_runs(config, &[SamplerConfig::default()], 30, preamble);
    assert!(stats.prefix_cached_tokens >= 100, "{stats:?}");
}

/// Requests one after another that share a preamble: each later one takes the blocks the
/// earlier ones left in the prefix cache, computes only its own tail and still produces its
/// solo tokens; in a pool too small to keep every prefix, the least recently used cached
/// blocks are evicted and nothing waits.
#[test]
fn a_finished_requests_prefix_is_reused_by_later_requests() {
    let (model, tokenizer) = stories260k(Some(256));
    let preamble = "The sun was shining and the birds were singing in the big green park. ";
    let prompts = prompts(&tokenizer, preamble);
    let greedy = SamplerConfig::default();
    for (total, reused) in [(8192, true), (96, false)] {
        let config = EngineConfig {
            block_size: 4,
            max_batch_total_tokens: total,
            ..EngineConfig::default()
        };
        let engine = Engine::new(model.clone(), exec(), config).unwrap();
        for (i, prompt) in prompts.iter().take(6).enumerate() {
            let (got, _, _) = collect(submit(&engine, request(&tokenizer, prompt, &greedy, 12)));
            assert_eq!(
                got,
                solo(&model, &tokenizer, prompt, &greedy, 12),
                "request {i}"
            );
            let stats = engine.stats();
            assert_eq!(stats.free_blocks, stats.total_blocks, "{stats:?}");
            assert!(stats.cached_blocks > 0, "{stats:?}");
            assert_eq!(stats.prefix_cache_hits, i as u64, "{stats:?}");
        }
        let stats = engine.stats();
        let shared = tokenizer.encode(preamble, true).unwrap().len() / 4 * 4;
        if reused {
            assert!(
                stats.prefix_cached_tokens >= 5 * shared as u64 - 20,
                "{stats:?}"
            );
        }
        assert_eq!(stats.preemptions, 0, "{stats:?}");
    }
}

/// The log-probabilities the engine reports for the first token after
/// `[1, 403, 407, 261, 378, 432, 383, 286]` equal the log-softmax of transformers' logits for
/// that prompt (tests/data/SOURCES.md), and later ones are consistent: the greedy token is
/// the most likely, with its own log-probability, and the top list is sorted.
#[test]
fn logprobs_equal_the_log_softmax_of_transformers_logits() {
    let (model, _) = stories260k(Some(256));
    let hf: Vec<f64> = stories_logits().into_iter().map(f64::from).collect();
    let last = &hf[7 * 512..8 * 512];
    let max = last.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let log_z = max + last.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
    let engine = Engine::new(model, exec(), EngineConfig::default()).unwrap();
    let req = Request {
        prompt: vec![1, 403, 407, 261, 378, 432, 383, 286],
        sampler: SamplerConfig::default(),
        max_tokens: 5,
        stop_tokens: Vec::new(),
        logprobs: Some(5),
        constraint: None,
        cancel: None,
    };
    let rx = submit(&engine, req);
    let tokens: Vec<(u32, flm_core::TokenLogprobs)> = rx
        .iter()
        .filter_map(|e| match e {
            Event::Token(id, l) => Some((id, l.unwrap())),
            Event::Finished(_) => None,
        })
        .collect();
    assert_eq!(tokens.len(), 5);
    let (first, l) = &tokens[0];
    let want = last[*first as usize] - log_z;
    assert!(
        (f64::from(l.logprob) - want).abs() < 1e-3,
        "{l:?} vs {want}"
    );
    for (id, lp) in &l.top {
        let want = last[*id as usize] - log_z;
        assert!((f64::from(*lp) - want).abs() < 1e-3, "{id}: {lp} vs {want}");
    }
    for (id, l) in &tokens {
        assert_eq!(l.top.len(), 5);
        assert_eq!((l.top[0].0, l.top[0].1), (*id, l.logprob));
        assert!(l.top.windows(2).all(|w| w[0].1 >= w[1].1), "{l:?}");
        assert!(l.logprob <= 0.0);
    }
}

/// A request constrained to ` Lily saw` followed by one to three digits or ` a dog.`:
/// whatever stories260K prefers, the reply is a word of that language, and the request ends
/// by itself (Stop) when no character can extend it.
#[test]
fn a_constrained_request_stays_in_its_language_and_ends() {
    let (model, tokenizer) = stories260k(Some(256));
    let tokens: Vec<Option<Vec<u8>>> = (0..tokenizer.vocab_size() as u32)
        .map(|id| tokenizer.token_bytes(id))
        .collect();
    let vocab = Arc::new(Vocabulary::new(&tokens));
    let pattern = Pattern::Seq(vec![
        Pattern::Literal(" Lily saw".into()),
        Pattern::Alt(vec![
            Pattern::Repeat {
                item: Box::new(Pattern::Class(vec![('0', '9')])),
                min: 1,
                max: 3,
            },
            Pattern::Literal(" a dog.".into()),
        ]),
    ]);
    let grammar = Grammar::new(&pattern, vocab, std::time::Duration::from_secs(60));
    let grammar = Arc::new(grammar.unwrap());
    let engine = Engine::new(model, exec(), EngineConfig::default()).unwrap();
    let prompt = tokenizer.encode("Once upon a time", true).unwrap();
    for seed in 0..4 {
        let sampler = SamplerConfig {
            temperature: 1.0,
            seed,
            ..SamplerConfig::default()
        };
        let mut req = request(&tokenizer, &prompt, &sampler, 40);
        req.constraint = Some(Constraint::new(Arc::clone(&grammar)));
        let (ids, reason, _) = collect(submit(&engine, req));
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| tokenizer.token_bytes(id).unwrap())
            .collect();
        let text = String::from_utf8(bytes).unwrap();
        let digits = text
            .strip_prefix(" Lily saw")
            .unwrap_or_else(|| panic!("{text:?}"));
        assert!(
            digits == " a dog."
                || (1..=3).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()),
            "{text:?}"
        );
        if digits.len() == 3 || digits == " a dog." {
            assert_eq!(reason, FinishReason::Stop, "{text:?}");
        }
    }
}

#[test]
fn a_callback_that_breaks_cancels_and_frees_the_blocks() {
    let (model, tokenizer) = stories260k(Some(256));
    let engine = Engine::new(model, exec(), EngineConfig::default()).unwrap();
    let prompt = tokenizer.encode("Once upon a time", true).unwrap();
    let (tx, rx) = mpsc::channel();
    let mut seen = 0;
    engine
        .submit(
            request(&tokenizer, &prompt, &SamplerConfig::default(), 200),
            Box::new(move |e| {
                seen += 1;
                let _ = tx.send(e);
                if seen == 3 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            }),
        )
        .unwrap();
    let events: Vec<Event> = rx.iter().collect();
    assert_eq!(events.len(), 3, "no event after the break: {events:?}");
    assert!(events.iter().all(|e| matches!(e, Event::Token(..))));
    // The sender went with the request; its blocks went before the next step, so a new
    // request runs to its end in a pool with all blocks back.
    let rx = submit(
        &engine,
        request(&tokenizer, &prompt, &SamplerConfig::default(), 5),
    );
    collect(rx);
    let stats = engine.stats();
    assert_eq!(stats.free_blocks, stats.total_blocks);
    assert_eq!(stats.finished_requests, 2);
}

#[test]
fn a_set_cancel_flag_ends_a_request_before_its_next_step() {
    let (model, tokenizer) = stories260k(Some(256));
    let engine = Engine::new(model, exec(), EngineConfig::default()).unwrap();
    let prompt = tokenizer.encode("Once upon a time", true).unwrap();
    let sampler = SamplerConfig::default();
    // Set before it is queued: it leaves without a token.
    let early = Request {
        cancel: Some(Arc::new(AtomicBool::new(true))),
        ..request(&tokenizer, &prompt, &sampler, 200)
    };
    assert_eq!(
        collect(submit(&engine, early)),
        (Vec::new(), FinishReason::Cancelled, prompt.len())
    );
    // Set by its callback at its third token, which goes on returning Continue.
    let flag = Arc::new(AtomicBool::new(false));
    let running = Request {
        cancel: Some(Arc::clone(&flag)),
        ..request(&tokenizer, &prompt, &sampler, 200)
    };
    let (tx, rx) = mpsc::channel();
    let mut seen = 0;
    engine
        .submit(
            running,
            Box::new(move |e| {
                seen += 1;
                if seen == 3 {
                    flag.store(true, Ordering::Relaxed);
                }
                let _ = tx.send(e);
                ControlFlow::Continue(())
            }),
        )
        .unwrap();
    let (ids, reason, _) = collect(rx);
    assert_eq!((ids.len(), reason), (3, FinishReason::Cancelled));
    let stats = engine.stats();
    assert_eq!(stats.free_blocks, stats.total_blocks);
    assert_eq!(
        (stats.finished_requests, stats.running, stats.waiting),
        (2, 0, 0)
    );
}

#[test]
fn dropping_the_engine_cancels_what_is_left() {
    let (model, tokenizer) = stories260k(Some(256));
    let engine = Engine::new(model, exec(), EngineConfig::default()).unwrap();
    let prompt = tokenizer.encode("Once upon a time", true).unwrap();
    let rxs: Vec<_> = (0..4)
        .map(|_| {
            let sampler = SamplerConfig::default();
            submit(&engine, request(&tokenizer, &prompt, &sampler, 100_000))
        })
        .collect();
    drop(engine);
    for rx in rxs {
        let (_, reason, _) = collect(rx);
        // A request may have filled the context (Length) before the engine stopped.
        assert!(matches!(
            reason,
            FinishReason::Cancelled | FinishReason::Length
        ));
    }
}

#[test]
fn bad_requests_and_configs_are_refused() {
    let (model, tokenizer) = stories260k(Some(256));
    let prompt = tokenizer.encode("Once upon a time", true).unwrap();
    for config in [
        EngineConfig {
            block_size: 0,
            ..EngineConfig::default()
        },
        EngineConfig {
            max_batch_total_tokens: 15,
            ..EngineConfig::default()
        },
        EngineConfig {
            max_batch_prefill_tokens: 0,
            ..EngineConfig::default()
        },
        EngineConfig {
            max_batch_tokens: Some(0),
            ..EngineConfig::default()
        },
    ] {
        let err = Engine::new(model.clone(), exec(), config).err().unwrap();
        assert!(matches!(err, Error::Config(_)), "{err}");
    }
    let small = EngineConfig {
        max_batch_total_tokens: 32,
        ..EngineConfig::default()
    };
    let engine = Engine::new(model.clone(), exec(), small).unwrap();
    let greedy = SamplerConfig::default();
    let try_submit = |r: Request| engine.submit(r, Box::new(|_| ControlFlow::Continue(())));
    let err = try_submit(request(&tokenizer, &[], &greedy, 4)).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    let err = try_submit(request(&tokenizer, &[1, 100_000], &greedy, 4)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Core(flm_core::Error::TokenOutOfRange { id: 100_000, .. })
        ),
        "{err}"
    );
    let err = try_submit(request(&tokenizer, &vec![1; 256], &greedy, 4)).unwrap_err();
    assert!(matches!(err, Error::PromptTooLong { .. }), "{err}");
    // 32 positions in the pool: a prompt of 32 leaves none to generate into.
    let err = try_submit(request(&tokenizer, &[1; 32], &greedy, 4)).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    let hot = SamplerConfig {
        temperature: -1.0,
        ..SamplerConfig::default()
    };
    let err = try_submit(request(&tokenizer, &prompt, &hot, 4)).unwrap_err();
    assert!(matches!(err, Error::Core(_)), "{err}");
    let (_, reason, _) = collect(submit(&engine, request(&tokenizer, &prompt, &greedy, 0)));
    assert_eq!(reason, FinishReason::Length);

    let closed = EngineConfig {
        max_waiting: 0,
        ..EngineConfig::default()
    };
    let engine = Engine::new(model, exec(), closed).unwrap();
    let err = engine
        .submit(
            request(&tokenizer, &prompt, &greedy, 4),
            Box::new(|_| ControlFlow::Continue(())),
        )
        .unwrap_err();
    assert!(matches!(err, Error::QueueFull { .. }), "{err}");
}
