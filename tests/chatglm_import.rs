//! Conversion of the ChatGLM-family models to .flm in every dtype, and the errors of the
//! importers and of the ChatGLM-6B graph. The models are chatglm.cpp's test files turned
//! into Hugging Face directories (see [`flm_tests::glm_data`]).

use flm_core::DataType;
use flm_models::convert::{convert, Recipe};
use flm_models::llama::Logits;
use flm_models::{import, Error, Model};
use flm_tests::glm_data::{run_steps, write_hf_dir, Family};
use flm_tests::{cpu_executor, data};

/// Every dtype of `flm convert`, loaded back from the .flm file, against the reference.
///
/// Tolerances, relative to the largest expected value, from each dtype's rounding of a
/// weight (the int8 case is argued in `chatglm_reference.rs`): a dot product is off by at
/// most the weight's relative rounding times `Σ|w·x|`, and about four products chain
/// through a layer before the final norm.
/// - f32: the weights are unchanged: chatglm.cpp's 5e-4, absolute.
/// - f16: 2^-11 per weight, `4 · 2^-11 ≈ 0.2%`; allowed 0.5%.
/// - bf16: 2^-8 per weight, `4 · 2^-8 ≈ 1.6%`; allowed 3%.
/// - int4 (group 32, f16 scale and minimum; K/V, down projection and the tied embedding in
///   int8 by the default recipe): half a step of `range/15` is up to `1/30` of a group's
///   range, twice the largest magnitude for these uniform weights, so `6.7%` per product
///   and `4 · 6.7% ≈ 27%` through the layer; allowed 30%.
#[test]
fn every_dtype_converts_and_runs() {
    let tokenizer =
        flm_tokenizer::Tokenizer::from_file(&data("stories260K/tok512.model")).expect("tokenizer");
    let dtypes = [
        (DataType::F32, 0.0),
        (DataType::F16, 0.005),
        (DataType::BF16, 0.03),
        (DataType::I4G32, 0.3),
    ];
    for (file, family) in [
        ("glm_model.data", Family::Glm),
        ("glm2_model.data", Family::Glm2),
        ("baichuan13b_model.data", Family::Baichuan { alibi: true }),
        ("internlm_model.data", Family::InternLm),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let steps = write_hf_dir(file, family, false, dir.path());
        let ckpt = import::load(dir.path()).unwrap();
        for (dtype, rel) in dtypes {
            let out = dir.path().join(format!("{dtype}.flm"));
            convert(&ckpt, &tokenizer, &out, dtype, Recipe::Mixed, |_| {}).unwrap();
            let flm = import::load(&out).unwrap();
            let wq = flm
                .tensor("layers.0.wq".parse().unwrap())
                .unwrap()
                .load()
                .unwrap();
            assert_eq!(wq.dtype(), dtype, "{file} {dtype}");
            let (err, mag) = run_steps(&mut Model::new(&flm).unwrap(), &steps);
            let tol = if rel == 0.0 { 5e-4 } else { rel * mag };
            println!("{file} {dtype}: max abs error {err:.2e} (tolerance {tol:.2e})");
            assert!(err <= tol, "{file} {dtype}: {err} > {tol}");
        }
    }
}

/// ChatGLM-6B places its positions from `[gMASK]` and `sop`: a first call without them, or
/// a call that does not start at position 0, is refused before anything runs.
#[test]
fn chatglm_6b_needs_its_prompt_marks() {
    let dir = tempfile::tempdir().unwrap();
    write_hf_dir("glm_model.data", Family::Glm, false, dir.path());
    let mut model = Model::new(&import::load(dir.path()).unwrap()).unwrap();
    let exec = cpu_executor();
    let err = model.forward(&exec, &[3], 1, Logits::Last).unwrap_err();
    assert!(err.to_string().contains("position 0"), "{err}");
    assert!(matches!(err, Error::State(_)), "{err}");
    // No sop (token 2).
    let err = model
        .forward(&exec, &[0, 1, 3], 0, Logits::Last)
        .unwrap_err();
    assert!(err.to_string().contains("[gMASK]"), "{err}");
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    // [gMASK] then sop: logits of the 5-token vocabulary.
    let logits = model.forward(&exec, &[0, 1, 2], 0, Logits::Last).unwrap();
    assert_eq!(logits.len(), 5);
    assert!(logits.iter().all(|v| v.is_finite()));
}

/// Configurations the importers refuse, each with a message naming the reason.
#[test]
fn unsupported_checkpoints_are_refused() {
    let cases: [(&str, Family, &str, serde_json::Value, &str); 3] = [
        (
            "glm2_model.data",
            Family::Glm2,
            "prefix_projection",
            true.into(),
            "prefix_projection",
        ),
        (
            "baichuan7b_model.data",
            Family::Baichuan { alibi: false },
            "vocab_size",
            125696.into(),
            "Baichuan2",
        ),
        (
            "glm2_model.data",
            Family::Glm2,
            "rmsnorm",
            false.into(),
            "LayerNorm",
        ),
    ];
    for (file, family, key, value, message) in cases {
        let dir = tempfile::tempdir().unwrap();
        write_hf_dir(file, family, false, dir.path());
        let path = dir.path().join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        config[key] = value;
        std::fs::write(&path, config.to_string()).unwrap();
        let err = import::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains(message), "{key}: {err}");
    }
}

/// A ChatGLM2 checkpoint whose config asks for a p-tuning prefix it does not hold names the
/// missing tensor.
#[test]
fn missing_tensors_are_named() {
    let dir = tempfile::tempdir().unwrap();
    write_hf_dir("glm2_model.data", Family::Glm2, false, dir.path());
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["pre_seq_len"] = 5.into();
    std::fs::write(&path, config.to_string()).unwrap();
    let err = import::load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("transformer.prefix_encoder.embedding.weight"),
        "{err}"
    );
}

/// Absurd sizes in a ChatGLM-6B config are refused before anything is allocated.
#[test]
fn absurd_sizes_are_refused() {
    for (key, value) in [
        ("hidden_size", serde_json::json!(1u64 << 62)),
        ("num_attention_heads", serde_json::json!(0)),
        ("inner_hidden_size", serde_json::Value::Null),
    ] {
        let dir = tempfile::tempdir().unwrap();
        write_hf_dir("glm_model.data", Family::Glm, false, dir.path());
        let path = dir.path().join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        config[key] = value;
        if key == "inner_hidden_size" {
            config["hidden_size"] = serde_json::json!(1u64 << 62);
        }
        std::fs::write(&path, config.to_string()).unwrap();
        assert!(import::load(dir.path()).is_err(), "{key}");
    }
}
