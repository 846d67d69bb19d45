//! Sessions of one model generating at once on several host threads: 8 threads
//! × 8 greedy generations each over one [`SharedModel`], for every weight dtype, with the
//! forward passes on a shared rayon pool of 1, 2 and 4 workers. Every text must equal the
//! text of the same prompt generated alone, and no call may fail. Under emulation (the
//! aarch64 runs of `.ci/run`), where every emulated thread costs a host core, and at the
//! portable level (its kernels take ten times as long; [`flm_tests::slow_kernels`]), 4
//! threads × 2 generations on pools of 1 and 2 workers: a tenth of the work, every dtype
//! still. The C ABI's twin is the `stress` mode of tests/c/flm_test.c, driven by
//! tools/capi/tests/c_program.rs.
//!
//! Each host thread runs its generations inside the pool (`pool.install`), as a host that
//! keeps flm's work on a pool of its own does, and as the C ABI runs each op: a worker that
//! waits for its tasks inside one session's op runs other sessions' ops on its own stack
//! meanwhile, which the CPU kernels' scratch buffers must survive.
//!
//! Under ThreadSanitizer (nightly, with the standard library instrumented too, so that the
//! synchronisation of rayon's latches through std's Mutex and Condvar is visible to it):
//!
//! ```sh
//! RUSTFLAGS=-Zsanitizer=thread CARGO_TARGET_DIR=target/tsan cargo +nightly test \
//!     -Zbuild-std --target x86_64-unknown-linux-gnu -p flm-tests --test concurrent_sessions
//! ```
//!
//! it passes with no report. With std left
//! uninstrumented (`-Cunsafe-allow-abi-mismatch=sanitizer` instead of `-Zbuild-std`) it
//! reports hundreds of races between a parallel region's writes and the reads after its
//! join, which std's unseen synchronisation orders: false positives.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::{Arc, Barrier};

use flm_core::{DataType, Executor, SamplerConfig};
use flm_models::convert::{convert, Recipe};
use flm_models::import;
use flm_models::session::{load_model, GenerateParams, Session};
use flm_models::SharedModel;
use flm_tests::{cpu_executor, data, slow_kernels};
use flm_tokenizer::Tokenizer;

/// Prompts of 1 to about 20 tokens: the longer ones make the prefill's Linears of
/// stories260K large enough to be split over the pool.
const PROMPTS: [&str; 4] = [
    "Once upon a time, there was a little girl named Lily. She loved to play",
    "The big brown dog ran to the park with his friend Tom, and they",
    "Sam had a red ball. One day he went outside and",
    "",
];
const MAX_TOKENS: usize = 32;

/// The greedy continuation of `prompt` in `session`.
fn generate(session: &mut Session, exec: &Executor, prompt: &str) -> String {
    let params = GenerateParams {
        sampler: SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        max_tokens: MAX_TOKENS,
        ignore_eos: false,
        stop: Vec::new(),
    };
    let mut text = String::new();
    session
        .generate(exec, prompt, &params, |piece| {
            text.push_str(piece.text);
            ControlFlow::Continue(())
        })
        .unwrap_or_else(|e| panic!("prompt {prompt:?}: {e}"));
    text
}

fn session(model: &SharedModel, tokenizer: &Arc<Tokenizer>) -> Session {
    Session::new(model.instance().unwrap(), Arc::clone(tokenizer)).unwrap()
}

/// stories260K converted to `dtype` (every matrix in it) under `dir`, loaded.
fn model_in(dtype: DataType, dir: &Path) -> (SharedModel, Arc<Tokenizer>) {
    let source = data("stories260K/stories260K.bin");
    let mut ckpt = import::load(&source).unwrap();
    let tokenizer = ckpt.take_tokenizer(&source).unwrap();
    let path = dir.join(format!("{dtype}.flm"));
    convert(&ckpt, &tokenizer, &path, dtype, Recipe::Pure, |_| {}).unwrap();
    let (model, tokenizer) = load_model(&path, None, None).unwrap();
    (model, Arc::new(tokenizer))
}

#[test]
fn sessions_on_many_threads_generate_their_lone_text() {
    let dir = tempfile::tempdir().unwrap();
    let exec = Arc::new(cpu_executor());
    let (host_threads, generations, pools): (usize, usize, &[usize]) = if slow_kernels() {
        (4, 2, &[1, 2])
    } else {
        (8, 8, &[1, 2, 4])
    };
    for dtype in DataType::VALUES {
        let (model, tokenizer) = model_in(dtype, dir.path());
        let lone: Vec<String> = PROMPTS
            .iter()
            .map(|p| generate(&mut session(&model, &tokenizer), &exec, p))
            .collect();
        assert!(lone.iter().all(|t| !t.is_empty()), "{dtype}: {lone:?}");
        for &workers in pools {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(workers)
                .build()
                .unwrap();
            let start = Barrier::new(host_threads);
            std::thread::scope(|s| {
                for t in 0..host_threads {
                    let (model, tokenizer, exec) = (&model, &tokenizer, &exec);
                    let (pool, start, lone) = (&pool, &start, &lone);
                    s.spawn(move || {
                        let mut session = session(model, tokenizer);
                        start.wait();
                        for g in 0..generations {
                            let p = (t + g) % PROMPTS.len();
                            let text = pool.install(|| generate(&mut session, exec, PROMPTS[p]));
                            assert_eq!(
                                text, lone[p],
                                "{dtype}, {workers} workers, thread {t}, generation {g}"
                            );
                        }
                    });
                }
            });
        }
    }
}
