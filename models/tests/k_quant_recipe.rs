//! `flm convert --dtype q4_k` chooses, tensor for tensor, the types llama-quantize's
//! `Q4_K_M` chose for SmolLM2-135M-Instruct (tests/data/llama.cpp/quantize, from
//! llama-quantize's own log; SmolLM2's width of 576 makes it fall back to Q5_0 and Q8_0).

use flm_core::DataType;
use flm_models::convert::{target_dtype, Recipe};
use flm_models::import;
use flm_models::tensor_names::canonical_tensors;
use flm_tests::data;

/// SmolLM2-135M-Instruct's hyperparameters, as its GGUF file's metadata gives them.
const SMOLLM2: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
  "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
  "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 100000.0,
  "tie_word_embeddings": true, "hidden_act": "silu"
}"#;

#[test]
fn q4_k_takes_llama_quantizes_q4_k_m_types() {
    let want: Vec<(String, String)> =
        std::fs::read_to_string(data("llama.cpp/quantize/smollm2-135m-q4_k_m.types"))
            .expect("the types file")
            .lines()
            .map(|l| {
                let (name, ty) = l.split_once(' ').expect("a name and a type");
                (name.to_string(), ty.to_lowercase())
            })
            .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, SMOLLM2).unwrap();
    let config = import::random(&path, 0).expect("the configuration").config;
    let mut got: Vec<(String, String)> = canonical_tensors(&config)
        .into_iter()
        .map(|(name, shape)| {
            (
                name,
                target_dtype(DataType::Q4K, Recipe::Mixed, &config, name, &shape),
            )
        })
        .filter(|(_, dtype)| *dtype != DataType::F32)
        .map(|(name, dtype)| (name.gguf().expect("a GGUF name"), dtype.name().to_string()))
        .collect();
    let mut want = want;
    got.sort();
    want.sort();
    assert_eq!(got.len(), 211);
    assert_eq!(got, want);
}
