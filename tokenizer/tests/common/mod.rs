//! What `benches/encode.rs` takes from the tests' helpers (it includes this file by path):
//! the shared helpers of the `flm-tests` crate, where the integration tests take them too.

pub use flm_tests::data;
pub use flm_tests::tokenizer::{gguf_gpt2_variant, gpt2_variant};
