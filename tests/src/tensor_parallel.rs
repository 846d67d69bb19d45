//! The cases of the tensor-parallel tests (`tests/tensor_parallel.rs` in one process,
//! `tests/tensor_parallel_mpi.rs` under `mpirun`): the checkpoints, a prompt, and the run
//! whose logits and greedy tokens a split model must reproduce.

use std::path::Path;

use flm_core::DataType;
use flm_models::convert::Recipe;
use flm_models::import::{self, Checkpoint};
use flm_models::{Logits, SharedModel};

use crate::glm_data::{write_hf_dir, Family};
use crate::{convert_stories260k, convert_with_tok512, cpu_executor, data};

/// The split's checkpoints, each with its name, made in `dir` where they are converted:
/// llama2.c's stories260K (f32, int8, int4 with a minimum and int4-sym, groups of 32),
/// transformers' tiny Llama 3 (GQA, untied classifier) and Qwen3-MoE (4 routed experts,
/// which split whole among 2 or 4 ranks; in f32, and in int8 as `qwen3_moe int8`), Qwen3
/// in int8 and int4 (whose widths keep whole blocks at 4 ranks), and chatglm.cpp's ChatGLM2 (multi-query attention, q/k/v biases).
pub fn checkpoints(dir: &Path) -> Vec<(String, Checkpoint)> {
    let mut out = vec![(
        "stories260K f32".to_string(),
        import::load(&data("stories260K/stories260K.bin")).expect("stories260K"),
    )];
    for dtype in [DataType::I8, DataType::I4G32, DataType::I4SymG32] {
        let path = dir.join(format!("{dtype}.flm"));
        convert_stories260k(&path, dtype, Recipe::Pure);
        out.push((
            format!("stories260K {dtype}"),
            import::load(&path).expect("converted"),
        ));
    }
    for family in ["llama3", "qwen3_moe"] {
        let path = data(&format!("hf-families/{family}"));
        out.push((family.to_string(), import::load(&path).expect(family)));
    }
    // Each expert's int8 width of 32 is one block, which only whole experts keep uncut.
    let path = dir.join("qwen3_moe-int8.flm");
    let (_, moe) = out.last().expect("qwen3_moe");
    convert_with_tok512(moe, &path, DataType::I8, Recipe::Pure);
    out.push((
        "qwen3_moe int8".to_string(),
        import::load(&path).expect("converted"),
    ));
    // Qwen3's attention width (4 heads of 32) and FFN width (128) keep whole blocks of 32
    // at 4 ranks.
    let qwen3 = import::load(&data("hf-families/qwen3")).expect("qwen3");
    for dtype in [DataType::I8, DataType::I4G32] {
        let path = dir.join(format!("qwen3-{dtype}.flm"));
        convert_with_tok512(&qwen3, &path, dtype, Recipe::Pure);
        out.push((
            format!("qwen3 {dtype}"),
            import::load(&path).expect("converted"),
        ));
    }
    let glm = dir.join("glm2");
    std::fs::create_dir_all(&glm).expect("a directory for ChatGLM2");
    write_hf_dir("glm2_model.data", Family::Glm2, false, &glm);
    out.push((
        "ChatGLM2".to_string(),
        import::load(&glm).expect("ChatGLM2"),
    ));
    out
}

/// The prompt of the tests, for a vocabulary of `vocab` ids.
pub fn prompt(vocab: usize) -> Vec<u32> {
    (0..11u32).map(|i| (i * 37 + 5) % vocab as u32).collect()
}

/// What a run gives: every position's logits of the prompt, the greedy tokens after it and
/// the logits each of them was chosen from.
#[derive(Debug)]
pub struct Outcome {
    pub all: Vec<f32>,
    pub ids: Vec<u32>,
    pub seen: Vec<f32>,
}

/// The prompt's logits (one pass of all positions), then up to 12 greedy tokens (as the
/// context allows) decoded one at a time by another instance.
pub fn run(model: &SharedModel, tokens: &[u32]) -> Outcome {
    let exec = cpu_executor();
    let steps = 12.min(model.config().max_seq_len - tokens.len());
    let mut m = model.instance().expect("an instance");
    let all = m
        .forward(&exec, tokens, 0, Logits::All)
        .expect("prefill")
        .to_vec();
    let mut m = model.instance().expect("an instance");
    let mut logits = m
        .forward(&exec, tokens, 0, Logits::Last)
        .expect("prefill")
        .to_vec();
    let (mut ids, mut seen) = (Vec::new(), Vec::new());
    for step in 0..steps {
        let next = flm_core::argmax(&logits);
        ids.push(next);
        seen.extend_from_slice(&logits);
        let pos = tokens.len() + step;
        logits = m
            .forward(&exec, &[next], pos, Logits::Last)
            .expect("decode")
            .to_vec();
    }
    Outcome { all, ids, seen }
}

/// Why `split` is not `whole` within 1e-4 with the same tokens, if it is not.
pub fn mismatch(whole: &Outcome, split: &Outcome) -> Option<String> {
    let diff = |a: &[f32], b: &[f32]| {
        (a.len() == b.len()).then(|| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max)
        })
    };
    let (all, seen) = (diff(&whole.all, &split.all), diff(&whole.seen, &split.seen));
    match (all, seen) {
        (Some(a), Some(s)) if a <= 1e-4 && s <= 1e-4 && whole.ids == split.ids => None,
        _ => Some(format!(
            "logits differ by {all:?} and {seen:?}; tokens {:?} against {:?}",
            split.ids, whole.ids
        )),
    }
}
