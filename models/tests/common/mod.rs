//! Helpers shared by the tests that run the shipped stories260K (batched forward, engine,
//! session, speculative decoding).
#![allow(dead_code)] // each test crate uses a different subset

use std::path::{Path, PathBuf};
use std::sync::Arc;

use flm_core::Executor;
use flm_devices::CpuDevice;
use flm_models::{session, SharedModel};
use flm_tokenizer::Tokenizer;

/// A file or directory of the repository's test data (`tests/data`).
pub fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data")
        .join(rel)
}

/// A batch-invariant executor on the CPU at its best level (or the one `FLM_CPU_ISA`
/// names), as the engine and speculative decoding make theirs, so that a sequence run alone
/// is comparable bit for bit with the same sequence batched.
pub fn exec() -> Executor {
    let exec = Executor::with_profiling(vec![Box::new(CpuDevice::new().unwrap())], false);
    exec.require_batch_invariance();
    exec
}

/// stories260K (llama2.c's file) with its tokenizer, its context cut to `context`.
pub fn stories260k(context: Option<usize>) -> (SharedModel, Arc<Tokenizer>) {
    let path = data("stories260K/stories260K.bin");
    let (model, tokenizer) = session::load_model(&path, None, context).unwrap();
    (model, Arc::new(tokenizer))
}
