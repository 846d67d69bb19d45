//! Multi-token prediction: the prediction layers of the tiny DeepSeek-V3 and GLM-4.5
//! checkpoints (tests/data/hf-families, the layer added by its `make_mtp.py`) against
//! torch's computation of them, from Hugging Face files, .flm files and GLM-4.5's GGUF
//! file; and speculative decoding drafted by them, whose greedy output is plain greedy
//! decoding's.

use std::path::{Path, PathBuf};

use flm_core::{DataType, Executor, Sampler, SamplerConfig};
use flm_models::convert::Recipe;
use flm_models::llama::{Llama, LlamaWeights, Logits};
use flm_models::speculative::Draft;
use flm_models::{import, Graph, Model, MtpInput};
use flm_tests::{
    batch_invariant_executor, convert_with_tok512, cpu_executor, data, f32_file, ids, json,
    max_abs_diff,
};

/// The bound on the difference to the reference logits.
const TOLERANCE: f32 = 1e-4;

/// The families whose tiny checkpoints have a prediction layer.
const FAMILIES: [&str; 2] = ["deepseek_v3", "glm4_moe"];

fn input_ids() -> Vec<u32> {
    ids(&json("hf-families/reference.json")["input_ids"])
}

/// `make_mtp.py`'s record of the family's prediction layer.
fn described(family: &str) -> serde_json::Value {
    json("hf-families/reference.json")["families"][family]["mtp"].clone()
}

/// The token the reference drafts on with (the argmax of the last row).
fn chain_token(family: &str) -> u32 {
    described(family)["chain_token"].as_u64().unwrap() as u32
}

/// torch's logits `[24][vocab]`: rows 0..23 draft from position `i` (the model's hidden
/// state there and the token at `i + 1`), row 23 drafts on from row 22's output.
fn expected(family: &str) -> Vec<Vec<f32>> {
    let all = f32_file(&data(&format!("hf-families/{family}/mtp_logits_f32le.bin")));
    all.chunks(all.len() / 24).map(<[f32]>::to_vec).collect()
}

/// Each family's checkpoint as Hugging Face files and converted to an f32 .flm file in
/// `dir`, and GLM-4.5 as llama.cpp's converter writes it (DeepSeek's converter drops the
/// layer).
fn sources(family: &str, dir: &Path) -> Vec<(String, PathBuf)> {
    let hf = data(&format!("hf-families/{family}"));
    let ckpt = import::load(&hf).unwrap();
    assert_eq!(ckpt.config.mtp_layers, 1, "{family}");
    let flm = dir.join(format!("{family}.flm"));
    convert_with_tok512(&ckpt, &flm, DataType::F32, Recipe::Mixed);
    let mut out = vec![
        (format!("{family} (HF)"), hf),
        (format!("{family}.flm"), flm),
    ];
    if family == "glm4_moe" {
        let gguf = data("hf-families/glm4_moe.gguf");
        out.push(("glm4_moe.gguf".into(), gguf));
    }
    out
}

/// The model at `path`, keeping its hidden states for its prediction layer.
fn load(path: &Path) -> Llama {
    let ckpt = import::load(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut model = Llama::new(ckpt.config.clone(), LlamaWeights::load(&ckpt).unwrap()).unwrap();
    assert_eq!(model.mtp_layers(), 1, "{}", path.display());
    model.keep_mtp_hidden().unwrap();
    model
}

fn assert_near(got: &[f32], want: &[f32], what: &str) {
    let diff = max_abs_diff(got, want);
    assert!(diff <= TOLERANCE, "{what}: max |Δ| = {diff}");
}

#[test]
fn prediction_layers_match_torch_within_1e_4() {
    let dir = tempfile::tempdir().unwrap();
    let (exec, input) = (cpu_executor(), input_ids());
    let mtp = |m: &mut Llama, tokens: &[u32], pos, input| {
        m.mtp_forward(&exec, 0, tokens, pos, input)
            .unwrap()
            .to_vec()
    };
    for family in FAMILIES {
        let want = expected(family);
        for (what, path) in sources(family, dir.path()) {
            // One prefill and one prediction call, then one token drafted on.
            let mut m = load(&path);
            m.forward(&exec, &input, 0, Logits::All).unwrap();
            let got = mtp(&mut m, &input[1..], 0, MtpInput::Model);
            assert_near(&got, &want[22], &format!("{what}, one call"));
            let got = mtp(&mut m, &[chain_token(family)], 23, MtpInput::Previous);
            assert_near(&got, &want[23], &format!("{what}, drafting on"));
            // The prefill in two chunks, then a call per position.
            let mut m = load(&path);
            m.forward(&exec, &input[..10], 0, Logits::Last).unwrap();
            m.forward(&exec, &input[10..], 10, Logits::All).unwrap();
            for i in 0..23 {
                let got = mtp(&mut m, &input[i + 1..i + 2], i, MtpInput::Model);
                assert_near(&got, &want[i], &format!("{what}, position {i}"));
            }
            // Decoding token by token, and prediction calls of two chunks.
            let mut m = load(&path);
            for (pos, &token) in input.iter().enumerate() {
                m.forward(&exec, &[token], pos, Logits::Last).unwrap();
            }
            let got = mtp(&mut m, &input[1..11], 0, MtpInput::Model);
            assert_near(&got, &want[9], &format!("{what}, first chunk"));
            let got = mtp(&mut m, &input[11..], 10, MtpInput::Model);
            assert_near(&got, &want[22], &format!("{what}, second chunk"));
        }
    }
}

#[test]
fn prediction_calls_without_kept_states_are_errors() {
    let exec = cpu_executor();
    let input = input_ids();
    let path = data("hf-families/glm4_moe");
    let ckpt = import::load(&path).unwrap();
    let mut plain = Llama::new(ckpt.config.clone(), LlamaWeights::load(&ckpt).unwrap()).unwrap();
    let err = plain.mtp_forward(&exec, 0, &input[1..3], 0, MtpInput::Model);
    assert!(err
        .unwrap_err()
        .to_string()
        .contains("before its hidden states"));
    let mut m = load(&path);
    m.forward(&exec, &input[..4], 0, Logits::Last).unwrap();
    // Positions past those the model has run, a second layer, a chain without a call.
    let err = m.mtp_forward(&exec, 0, &input[1..6], 0, MtpInput::Model);
    assert!(err.unwrap_err().to_string().contains("not kept"));
    let err = m.mtp_forward(&exec, 1, &input[1..2], 0, MtpInput::Model);
    assert!(err
        .unwrap_err()
        .to_string()
        .contains("prediction layer 1 of 1"));
    let err = m.mtp_forward(&exec, 0, &input[1..2], 0, MtpInput::Previous);
    assert!(err
        .unwrap_err()
        .to_string()
        .contains("one row, after a call"));
    let err = m.mtp_forward(&exec, 0, &[999], 0, MtpInput::Model);
    assert!(err.is_err());
    // Models without prediction layers.
    let llama3 = import::load(&data("hf-families/llama3")).unwrap();
    let mut llama3 = Model::new(&llama3).unwrap();
    assert_eq!(llama3.mtp_layers(), 0);
    assert!(llama3.keep_mtp_hidden().is_err());
}

/// Greedy decoding of `n` tokens after `prompt`, plainly or, with `k`, in speculative
/// rounds drafted by the prediction layer (as `Session` runs them); with the draft's
/// counts.
fn greedy(
    exec: &Executor,
    path: &Path,
    prompt: &[u32],
    n: usize,
    k: Option<usize>,
) -> (Vec<u32>, Option<(usize, usize, usize)>) {
    let mut model = load(path);
    let mut sampler = Sampler::new(SamplerConfig::default()).unwrap();
    let logits = model.forward(exec, prompt, 0, Logits::Last).unwrap();
    let mut tokens = prompt.to_vec();
    tokens.push(sampler.sample(logits, &tokens).unwrap());
    let Some(k) = k else {
        while tokens.len() < prompt.len() + n {
            let pos = tokens.len() - 1;
            let logits = model
                .forward(exec, &tokens[pos..], pos, Logits::Last)
                .unwrap();
            let output = &tokens[prompt.len()..];
            let next = sampler.sample_with_output(logits, &tokens, output).unwrap();
            tokens.push(next);
        }
        return (tokens[prompt.len()..].to_vec(), None);
    };
    let mut draft = Draft::mtp(k).unwrap();
    draft.start(&SamplerConfig::default()).unwrap();
    let mut model: Model = Model::from_graph(model);
    while tokens.len() < prompt.len() + n {
        let max_new = prompt.len() + n - tokens.len();
        let round = draft
            .round(
                exec,
                &mut model,
                &tokens,
                prompt.len(),
                &mut sampler,
                max_new,
            )
            .unwrap()
            .to_vec();
        tokens.extend(round);
    }
    let s = draft.stats();
    (
        tokens[prompt.len()..].to_vec(),
        Some((s.accepted, s.proposed, s.rounds)),
    )
}

/// Greedy output with drafts is plain greedy output, after a prompt the layer was trained
/// on (whose first drafts are mostly accepted) and after the test's input (whose drafts are
/// mostly not), a prompt of one token included, at 1, 2 and 4 drafts a round.
#[test]
fn drafts_of_the_prediction_layer_keep_greedy_output() {
    let exec = batch_invariant_executor();
    let input = input_ids();
    let dir = tempfile::tempdir().unwrap();
    // GLM-4.5 also as an int4 .flm file: its prediction layer quantised with the rest.
    let int4 = dir.path().join("glm4_moe-int4.flm");
    let ckpt = import::load(&data("hf-families/glm4_moe")).unwrap();
    convert_with_tok512(&ckpt, &int4, DataType::I4G32, Recipe::Mixed);
    let models = FAMILIES
        .map(|f| (f, "f32", data(&format!("hf-families/{f}"))))
        .into_iter()
        .chain([("glm4_moe", "int4", int4)]);
    for (family, dtype, path) in models {
        let seen = ids(&described(family)["seen_prompt"]);
        let prompts = [
            ("seen", &seen[..]),
            ("unseen", &input[..8]),
            ("one", &input[..1]),
        ];
        for (name, prompt) in prompts {
            let (plain, _) = greedy(&exec, &path, prompt, 40, None);
            for k in [1, 2, 4] {
                let (got, stats) = greedy(&exec, &path, prompt, 40, Some(k));
                let what = format!("{family} {dtype}, K = {k}, {name} prompt");
                assert_eq!(got, plain, "{what}");
                let (accepted, proposed, rounds) = stats.unwrap();
                assert!(accepted <= proposed && rounds < 40, "{what}");
                // The layer was trained on the first draft of each round, not on drafting
                // on from its own output.
                if (name, dtype) == ("seen", "f32") {
                    let enough = if k == 1 { proposed / 2 + 1 } else { 1 };
                    assert!(accepted >= enough, "{what}: {accepted} of {proposed}");
                }
                println!(
                    "{what}: acceptance {accepted} of {proposed} ({:.0}%), 40 tokens in \
                     {rounds} rounds",
                    100.0 * accepted as f64 / proposed as f64
                );
            }
        }
    }
}
