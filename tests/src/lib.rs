//! Helpers shared by the workspace integration tests: where the test data lives and how
//! to read the reference files (their provenance is in `tests/data/SOURCES.md`).

use std::path::PathBuf;

use flm_core::Executor;
use flm_devices::CpuDevice;
use serde_json::Value;

/// `tests/data` of the repository.
pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data")
}

/// A path below `tests/data`.
pub fn data(rel: &str) -> PathBuf {
    data_dir().join(rel)
}

/// An executor with the CPU device, profiling off.
pub fn cpu_executor() -> Executor {
    Executor::with_profiling(
        vec![Box::new(
            CpuDevice::new().expect("FLM_CPU_ISA names a level this CPU has"),
        )],
        false,
    )
}

/// `stories260K_reference.json` (generated with HF transformers, see SOURCES.md).
pub fn stories_reference() -> Value {
    let text = std::fs::read_to_string(data("stories260K/stories260K_reference.json"))
        .expect("reference json");
    serde_json::from_str(&text).expect("reference json parses")
}

/// A JSON array of integers as token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// The reference logits `[8, 512]` of `stories260K_logits_f32le.bin`.
pub fn stories_logits() -> Vec<f32> {
    let bytes = std::fs::read(data("stories260K/stories260K_logits_f32le.bin")).expect("logits");
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}
