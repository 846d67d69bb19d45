//! ChatGLM-6B, ChatGLM2/3, GLM-4, Baichuan-7B/13B and InternLM against chatglm.cpp's test
//! data (`tests/data/chatglm`, generated from the Hugging Face modeling code of each model;
//! provenance in its SOURCES.md).
//!
//! Each `*_model.data` file becomes a tiny Hugging Face directory (see
//! [`flm_tests::glm_data`]) loaded by the same importer as a real checkpoint; the model
//! then runs chatglm.cpp's three steps on one KV cache (a 3-token prefill, then position 3,
//! then position 4), and the hidden states after the final norm must match within 5e-4,
//! chatglm.cpp's own tolerance. The op files check Linear with bias, LayerNorm and RMSNorm.

use flm_core::{Data, DataType, Op};
use flm_models::convert::{convert, Recipe};
use flm_models::{import, Model};
use flm_tests::glm_data::{run_steps, write_hf_dir, Reader, MODELS};
use flm_tests::{cpu_executor, data};

/// chatglm.cpp `chatglm_test.cpp`'s absolute tolerance.
const TOL: f32 = 5e-4;

#[test]
fn models_match_chatglm_cpp() {
    for (file, family, prefix) in MODELS {
        let dir = tempfile::tempdir().unwrap();
        let steps = write_hf_dir(file, family, prefix, dir.path());
        let ckpt = import::load(dir.path()).unwrap_or_else(|e| panic!("{file}: {e}"));
        let mut model = Model::new(&ckpt).unwrap_or_else(|e| panic!("{file}: {e}"));
        // A second instance over the same shared weights (as each libflm session is) has
        // its own KV cache, with the p-tuning prefix in it, and gives the same results,
        // also after the first instance has run.
        let mut second = model.shared().instance().unwrap();
        for (name, model) in [("first", &mut model), ("second", &mut second)] {
            let (err, _) = run_steps(model, &steps);
            println!("{file} ({name} instance): max abs error {err:.2e}");
            assert!(err <= TOL, "{file}: max abs error {err} > {TOL}");
        }
    }
}

/// The same models converted to a .flm file with int8 matrices (`flm convert --dtype
/// int8`), loaded back from it.
///
/// Tolerance. int8 weights have one scale per output channel, `s_w = max|w_row| / 127`,
/// and activations are quantised per row on the fly, `s_x = max|x| / 127`; each is off by
/// at most half a step. A product `Σ_j w_j x_j` is then off by at most
/// `Σ_j (|w_j|·s_x + |x_j|·s_w)/2 + K·s_w·s_x/4 ≤ (1/127 + 1/127²/4)·K·max|w|·max|x|`: under
/// 0.8% of the largest possible term sum, and for the random weights of these files, whose
/// products partly cancel, typically a few times less relative to the result. A layer
/// chains two such products per block (q/k/v then the output projection; up/gate then
/// down), and the final norm divides by the RMS of the residual stream, so the relative
/// error of the hidden states stays within about `4 × 0.8% ≈ 3%` of their scale. The
/// tolerance is 4% of the largest expected value (0.038 to 0.052 for these files); the errors
/// measured, printed by the test, are 0.5% to 2.3% of that scale (Baichuan-13B the largest).
#[test]
fn int8_models_stay_within_the_quantisation_bound() {
    let tokenizer =
        flm_tokenizer::Tokenizer::from_file(&data("stories260K/tok512.model")).expect("tokenizer");
    for (file, family, prefix) in MODELS {
        let dir = tempfile::tempdir().unwrap();
        let steps = write_hf_dir(file, family, prefix, dir.path());
        let ckpt = import::load(dir.path()).unwrap();
        // The .flm file carries a tokenizer; any valid one serves for hidden states.
        let out = dir.path().join("model.flm");
        convert(&ckpt, &tokenizer, &out, DataType::I8, Recipe::Mixed, |_| {})
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let flm = import::load(&out).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(
            flm.config, ckpt.config,
            "{file}: the .flm records the configuration"
        );
        let wq = flm.tensor("layers.0.wq".parse().unwrap()).expect("wq");
        assert_eq!(wq.load().unwrap().dtype(), DataType::I8);
        let mut model = Model::new(&flm).unwrap();
        let (err, mag) = run_steps(&mut model, &steps);
        let tol = 0.04 * mag;
        println!("{file}: int8 max abs error {err:.2e} (tolerance {tol:.2e})");
        assert!(err <= tol, "{file}: int8 max abs error {err} > {tol}");
    }
}

/// `linear.data`: `y = x·wᵀ + b` for a matrix and a vector input.
#[test]
fn linear_op_matches() {
    let mut r = Reader::open("linear.data");
    let w = Data::from_f32(&[32, 64], &r.f32s(32 * 64)).unwrap();
    let b = Data::from_f32(&[32], &r.f32s(32)).unwrap();
    let exec = cpu_executor();
    for n in [2, 1] {
        let x = Data::from_f32(&[n, 64], &r.f32s(n * 64)).unwrap();
        let want = r.f32s(n * 32);
        let mut y = Data::zeros(DataType::F32, &[n, 32]).unwrap();
        exec.run(Op::Linear {
            input: &x,
            weight: &w,
            bias: Some(&b),
            output: &mut y,
        })
        .unwrap();
        assert_close("linear", y.as_f32().unwrap(), &want);
    }
    assert!(r.at_end());
}

/// `layer_norm.data` (eps 1e-5) and `rms_norm.data` (eps 1e-5).
#[test]
fn norm_ops_match() {
    let exec = cpu_executor();
    // Each file: the weight, the bias (LayerNorm only), the input [3, 64], the output.
    for (file, with_bias) in [("layer_norm.data", true), ("rms_norm.data", false)] {
        let mut r = Reader::open(file);
        let w = Data::from_f32(&[64], &r.f32s(64)).unwrap();
        let b = with_bias.then(|| Data::from_f32(&[64], &r.f32s(64)).unwrap());
        let x = Data::from_f32(&[3, 64], &r.f32s(3 * 64)).unwrap();
        let mut y = Data::zeros(DataType::F32, &[3, 64]).unwrap();
        let (input, weight, eps, output) = (&x, &w, 1e-5, &mut y);
        exec.run(match &b {
            Some(bias) => Op::LayerNorm {
                input,
                weight,
                bias,
                eps,
                output,
            },
            None => Op::RmsNorm {
                input,
                weight,
                eps,
                output,
            },
        })
        .unwrap();
        assert_close(file, y.as_f32().unwrap(), &r.f32s(3 * 64));
        assert!(r.at_end());
    }
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= TOL, "{what}[{i}]: {g} vs {w}");
    }
}
