//! `.flm` conversion: round trips, and the quality of int8/int4 weights measured against
//! the f32 model on a text of about 4,200 tokens (tests/data/text, written for this
//! project in the style of TinyStories).

use std::path::{Path, PathBuf};

use flm_core::flm_file::{FlmFile, FlmWriter};
use flm_core::{Data, DataType};
use flm_models::convert::{convert, Recipe};
use flm_models::eval::{self, teacher_forced, Method, TeacherForced};
use flm_models::import::{self, Format};
use flm_models::llama::{Llama, LlamaWeights, Logits};
use flm_models::{Graph, Model};
use flm_tests::{cpu_executor, data, dir_names, ids, stories_logits, stories_reference};
use flm_tokenizer::Tokenizer;
use serde_json::Value;

fn convert_with(dir: &Path, input: &str, dtype: DataType, recipe: Recipe) -> PathBuf {
    let mut ckpt = import::load(&data(input)).unwrap();
    let tokenizer = ckpt.take_tokenizer(&data(input)).unwrap();
    let out = dir.join(format!("{}-{recipe:?}.flm", dtype.name()));
    convert(&ckpt, &tokenizer, &out, dtype, recipe, |_| {}).unwrap();
    out
}

fn convert_to(dir: &Path, input: &str, dtype: DataType) -> PathBuf {
    convert_with(dir, input, dtype, Recipe::Mixed)
}

fn model_and_tokenizer(path: &Path) -> (Llama, Tokenizer) {
    let mut ckpt = import::load(path).unwrap();
    let tokenizer = ckpt.take_tokenizer(path).unwrap();
    let weights = LlamaWeights::load(&ckpt).unwrap();
    (Llama::new(ckpt.config, weights).unwrap(), tokenizer)
}

fn greedy(model: &mut Llama, prompt: &[u32], steps: usize) -> Vec<u32> {
    let exec = cpu_executor();
    let mut out = Vec::new();
    let mut logits = model.forward(&exec, prompt, 0, Logits::Last).unwrap();
    for step in 0..steps {
        let next = flm_core::argmax(logits);
        out.push(next);
        logits = model
            .forward(&exec, &[next], prompt.len() + step, Logits::Last)
            .unwrap();
    }
    out
}

#[test]
fn f32_round_trip_gives_exactly_the_reference_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let reference = stories_reference();
    let case = &reference["greedy_prompt"];
    for input in ["hf-stories260K", "stories260K/stories260K.bin"] {
        let path = convert_to(dir.path(), input, DataType::F32);
        let ckpt = import::load(&path).unwrap();
        assert_eq!(ckpt.format, Format::Flm);
        assert!(
            LlamaWeights::load(&ckpt).unwrap().layers[0].wo.is_mapped(),
            "zero-copy"
        );
        let (mut model, tokenizer) = model_and_tokenizer(&path);
        let prompt = tokenizer.encode("Once upon a time", true).unwrap();
        assert_eq!(
            prompt,
            ids(&case["input_ids"]),
            "{input}: embedded tokenizer"
        );
        assert_eq!(
            greedy(&mut model, &prompt, 32),
            ids(&case["output_ids"]),
            "{input}"
        );
    }
}

fn max_logit_error(model: &mut Llama) -> f32 {
    let input = ids(&stories_reference()["logits_file"]["input_ids"]);
    let got = model
        .forward(&cpu_executor(), &input, 0, Logits::All)
        .unwrap();
    got.iter()
        .zip(stories_logits())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

#[test]
fn half_precision_files_stay_within_their_rounding() {
    let dir = tempfile::tempdir().unwrap();
    // As in weight_dtypes.rs: f16 keeps 11 significant bits, bf16 8.
    for (dtype, tol) in [(DataType::F16, 0.05), (DataType::BF16, 0.3)] {
        let path = convert_to(dir.path(), "hf-stories260K", dtype);
        let (mut model, _) = model_and_tokenizer(&path);
        assert_eq!(model.weights().layers[0].wo.dtype(), dtype);
        assert_eq!(model.weights().layers[0].attn_norm.dtype(), DataType::F32);
        let err = max_logit_error(&mut model);
        assert!(err < tol, "{dtype}: {err}");
    }
}

fn evaluate(path: &Path) -> TeacherForced {
    let (model, tokenizer) = model_and_tokenizer(path);
    let mut model = Model::from_graph(model);
    let text = std::fs::read_to_string(data("text/tinystories_style.txt")).unwrap();
    let tokens = tokenizer.encode(&text, true).unwrap();
    assert_eq!(tokens[0], 1, "BOS");
    assert!(tokens.len() > 4000, "{} tokens", tokens.len());
    // Non-overlapping windows of 512, each BOS and 511 tokens of text.
    let windows = eval::windows(&tokens, Some(1), 512, Method::Sliding { stride: 511 }).unwrap();
    let mut calls = Vec::new();
    let result = teacher_forced(&mut model, &cpu_executor(), &windows, |done, all, r| {
        calls.push((done, all, r.scored))
    })
    .unwrap();
    // Every token after BOS is scored once; one call per window, in order, each with the
    // tokens scored so far.
    assert_eq!(result.scored, tokens.len() - 1);
    let n = (tokens.len() - 1).div_ceil(511);
    let want: Vec<(usize, usize, usize)> = (1..=n)
        .map(|w| (w, n, (w * 511).min(tokens.len() - 1)))
        .collect();
    assert_eq!(calls, want);
    result
}

#[test]
fn int8_and_int4_agree_with_f32_on_a_long_text() {
    let dir = tempfile::tempdir().unwrap();
    let base = evaluate(&convert_to(dir.path(), "hf-stories260K", DataType::F32));
    // int8 must keep nearly every top-1 token, mixed int4 nine in ten; pure int4 (every
    // matrix in 4 bits) and int4-sym (Q4_0's 4.5 bits per weight against int4's 5) are held
    // to what they measured with a small margin (docs/benchmarks.md, "Accuracy of the `.flm`
    // weight types").
    for (dtype, recipe, agreement_min, ppl_tol) in [
        (DataType::I8, Recipe::Mixed, 0.97, 0.02),
        (DataType::I4G32, Recipe::Mixed, 0.90, 0.10),
        (DataType::I4G64, Recipe::Mixed, 0.87, 0.10),
        (DataType::I4G128, Recipe::Mixed, 0.87, 0.10),
        (DataType::I4G32, Recipe::Pure, 0.84, 0.10),
        (DataType::I4SymG32, Recipe::Mixed, 0.88, 0.06),
        (DataType::I4SymG32, Recipe::Pure, 0.80, 0.14),
    ] {
        let q = evaluate(&convert_with(dir.path(), "hf-stories260K", dtype, recipe));
        let same = q
            .predictions
            .iter()
            .zip(&base.predictions)
            .filter(|(a, b)| a == b)
            .count();
        let agreement = same as f64 / base.predictions.len() as f64;
        let ppl_change = q.perplexity() / base.perplexity() - 1.0;
        eprintln!(
            "{dtype} {recipe:?}: top-1 agreement {:.2}%, perplexity {:.4} vs f32 {:.4} \
             ({:+.2}%), {} tokens",
            agreement * 100.0,
            q.perplexity(),
            base.perplexity(),
            ppl_change * 100.0,
            base.scored
        );
        assert!(
            agreement >= agreement_min,
            "{dtype} {recipe:?}: agreement {agreement}"
        );
        assert!(
            ppl_change.abs() <= ppl_tol,
            "{dtype} {recipe:?}: perplexity {ppl_change:+}"
        );
    }
}

/// A writer replaces its file only when finished, and removes partial files that a killed
/// conversion left in the directory.
#[test]
fn a_writer_replaces_a_file_and_removes_stale_partial_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.flm");
    std::fs::write(&path, b"old").unwrap();
    let stale = dir.path().join(".flm-partial-AbC123");
    std::fs::write(&stale, b"left by a killed conversion").unwrap();
    let plan = vec![("a".to_string(), DataType::F32, vec![1])];
    let mut w = FlmWriter::create(&path, Value::Null, None, &plan).unwrap();
    assert_eq!(
        dir_names(dir.path()),
        ["m.flm"],
        "the stale file is removed"
    );
    // A second writer in the same directory leaves the live one's file alone.
    let other = dir.path().join("n.flm");
    drop(FlmWriter::create(&other, Value::Null, None, &plan).unwrap());
    assert_eq!(
        std::fs::read(&path).unwrap(),
        b"old",
        "untouched until finished"
    );
    w.write_tensor(&Data::from_f32(&[1], &[7.0]).unwrap())
        .unwrap();
    w.finish().unwrap();
    let f = FlmFile::open(&path).unwrap();
    assert_eq!(f.tensor("a").unwrap().as_f32().unwrap(), [7.0]);
    assert_eq!(dir_names(dir.path()), ["m.flm"]);
}
