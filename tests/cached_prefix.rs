//! A prompt's logits do not depend on how much of it was already in the KV cache.
//!
//! A session that is asked a prompt whose beginning it has cached (a second turn of a chat,
//! the server's prefix cache, a prompt asked again) runs only the rest: a prefill of fewer
//! rows, or single-token steps. At [`Isa::Amx`] a prefill of many rows runs tile kernels
//! and one of few rows the vector kernels; both must give every row the bits a fresh
//! prefill of the whole prompt gives it, or the greedy text changes with the cache state.
//!
//! For every weight dtype of stories260K and every level this CPU has (or the one
//! `FLM_CPU_ISA` names), on an executor that was never asked for batch invariance (as
//! `flm run` and `flm chat` use it): the whole prompt in one prefill, then the same prompt
//! split after 1, 4 and 9 tokens, and token by token; every position's logits must have the
//! same bits.

use flm_core::{DataType, Executor};
use flm_devices::{CpuDevice, Isa};
use flm_models::convert::{convert, Recipe};
use flm_models::import;
use flm_models::llama::Logits;
use flm_models::session::load_model;
use flm_models::SharedModel;
use flm_tests::data;

const PROMPT: &str = "Once upon a time, there was a little girl named Lily. She loved to play";

/// Asserts that `got` has the bits of `want` (so `-0.0 != 0.0`, and NaN fails).
fn assert_same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(c) = (0..got.len()).find(|&c| got[c].to_bits() != want[c].to_bits()) {
        panic!(
            "{what}: logit {c}: {:e}, {:e} in one prefill",
            got[c], want[c]
        );
    }
}

/// Runs `tokens` in `chunks` (their lengths, summing to `tokens.len()`) through a new
/// instance of `model`, and returns every position's logits.
fn logits_in_chunks(
    model: &SharedModel,
    exec: &Executor,
    tokens: &[u32],
    chunks: &[usize],
) -> Vec<f32> {
    let mut instance = model.instance().expect("an instance");
    let (mut all, mut at) = (Vec::new(), 0);
    for &len in chunks {
        let logits = instance
            .forward(exec, &tokens[at..at + len], at, Logits::All)
            .expect("forward");
        all.extend_from_slice(logits);
        at += len;
    }
    assert_eq!(at, tokens.len());
    all
}

#[test]
fn logits_do_not_depend_on_the_cached_prefix() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let source = data("stories260K/stories260K.bin");
    let mut ckpt = import::load(&source).expect("stories260K");
    let tokenizer = ckpt.take_tokenizer(&source).expect("its tokenizer");
    let tokens = tokenizer.encode(PROMPT, true).expect("the prompt encodes");
    let n = tokens.len();
    assert!(n > 16, "{n} tokens: too few for a prefill of AMX tiles");
    for dtype in DataType::VALUES {
        let path = dir.path().join(format!("{dtype}.flm"));
        convert(&ckpt, &tokenizer, &path, dtype, Recipe::Pure, |_| {}).expect("convert");
        let (model, _) = load_model(&path, None, None).expect("load");
        let vocab = model.config().vocab_size;
        for isa in Isa::to_check().expect("FLM_CPU_ISA names a level this CPU has") {
            let cpu = CpuDevice::with_isa(isa).expect("a supported level");
            let exec = Executor::with_profiling(vec![Box::new(cpu)], false);
            let whole = logits_in_chunks(&model, &exec, &tokens, &[n]);
            let mut splits: Vec<Vec<usize>> = [1, 4, 9].iter().map(|&s| vec![s, n - s]).collect();
            splits.push(vec![1; n]);
            for chunks in splits {
                let got = logits_in_chunks(&model, &exec, &tokens, &chunks);
                for (pos, (got, want)) in got
                    .chunks_exact(vocab)
                    .zip(whole.chunks_exact(vocab))
                    .enumerate()
                {
                    let what = format!("{dtype} at {isa}, chunks {chunks:?}: position {pos}");
                    assert_same_bits(&what, got, want);
                }
            }
        }
    }
}
