//! gpt-oss with its experts in MXFP4, as the released checkpoints store them
//! (`tests/data/hf-families/gpt_oss_mxfp4`, made by `make_gpt_oss_mxfp4.py`; see its
//! SOURCES.md), and its GGUF file by llama.cpp's converter: the experts repacked into
//! ggml's blocks decode to exactly the weights transformers dequantises them to, are the
//! bytes llama.cpp's converter writes, and the model gives transformers' logits.

use std::collections::HashMap;
use std::path::Path;

use flm_core::{DataType, Executor, ExpertActivation, RopeScaling, YarnScaling};
use flm_devices::cpu::ActivationBits;
use flm_models::convert::Recipe;
use flm_models::import::{self, Checkpoint};
use flm_models::llama::{Llama, LlamaWeights, Logits};
use flm_models::tensor_names::{LayerPart, TensorName};
use flm_models::{Graph, MoeConfig};
use flm_tests::{
    convert_with_tok512, cpu_executor, cpu_executor_with, data, f32_file, ids, json, max_abs_diff,
};
use half::bf16;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

/// The bound on the difference to transformers' logits.
const TOLERANCE: f32 = 1e-4;
const FAMILY: &str = "hf-families/gpt_oss_mxfp4";
/// llama.cpp's `convert_hf_to_gguf.py` of the checkpoint (`make_gpt_oss_gguf.py`).
const GGUF: &str = "hf-families/gpt_oss_mxfp4.gguf";

fn checkpoint(path: &Path) -> Checkpoint {
    import::load(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn load(path: &Path) -> Llama {
    let ckpt = checkpoint(path);
    Llama::new(ckpt.config.clone(), LlamaWeights::load(&ckpt).unwrap()).unwrap()
}

fn input_ids() -> Vec<u32> {
    ids(&json("hf-families/reference.json")["input_ids"])
}

/// transformers' experts of every layer after it dequantised the checkpoint's MXFP4 ones
/// (`dequantized_experts.safetensors`, bf16 holding them exactly), by transformers' name,
/// as f32 with their shapes.
fn transformers_experts() -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(data(&format!("{FAMILY}/dequantized_experts.safetensors"))).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), Dtype::BF16, "{name}");
            let values = view
                .data()
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect();
            (name, (view.shape().to_vec(), values))
        })
        .collect()
}

/// Each expert's gate, up and down projection is an MXFP4 tensor `[out, in]` whose values
/// are, bit for bit, the rows transformers dequantises it to: gate row `j` is column `2j` of
/// transformers' `gate_up_proj[e]` `[dim, 2·inner]`, up row `j` column `2j + 1`, down row
/// `i` column `i` of `down_proj[e]` `[inner, dim]`.
#[test]
fn mxfp4_experts_decode_to_transformers_weights_exactly() {
    let ckpt = checkpoint(&data(FAMILY));
    assert!(ckpt.ignored.is_empty(), "{:?}", ckpt.ignored);
    let c = &ckpt.config;
    let moe = c.moe.as_ref().unwrap();
    let (dim, inner) = (c.dim, moe.expert_dim);
    let reference = transformers_experts();
    let mut checked = 0;
    for l in 0..c.n_layers {
        let (gu_shape, gate_up) = &reference[&format!("model.layers.{l}.mlp.experts.gate_up_proj")];
        let (down_shape, down) = &reference[&format!("model.layers.{l}.mlp.experts.down_proj")];
        assert_eq!(gu_shape, &[moe.n_experts, dim, 2 * inner]);
        assert_eq!(down_shape, &[moe.n_experts, inner, dim]);
        for e in 0..moe.n_experts {
            // Row r, column k of each matrix in transformers' tensors.
            let want = |part: LayerPart, r: usize, k: usize| match part {
                LayerPart::WGate => gate_up[(e * dim + k) * 2 * inner + 2 * r],
                LayerPart::WUp => gate_up[(e * dim + k) * 2 * inner + 2 * r + 1],
                _ => down[(e * inner + k) * dim + r],
            };
            let parts = [
                (LayerPart::WGate, inner, dim),
                (LayerPart::WUp, inner, dim),
                (LayerPart::WDown, dim, inner),
            ];
            for (part, rows, cols) in parts {
                let name = TensorName::Expert(l, e, part).to_string();
                let t = ckpt.tensors.iter().find(|t| t.name == name).unwrap();
                assert_eq!(t.shape, [rows, cols], "{name}");
                assert_eq!(t.encoding.load_dtype(), DataType::MXFP4, "{name}");
                let data = t.load().unwrap();
                assert_eq!(data.dtype(), DataType::MXFP4, "{name}");
                let got = data.to_f32_vec().unwrap();
                for (i, g) in got.iter().enumerate() {
                    let w = want(part, i / cols, i % cols);
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "{name}[{}, {}]",
                        i / cols,
                        i % cols
                    );
                }
                checked += got.len();
            }
        }
    }
    assert_eq!(checked, c.n_layers * moe.n_experts * 3 * inner * dim);
}

/// transformers' logits of the input ids, loading the checkpoint with
/// `Mxfp4Config(dequantize=True)`: as it is (`logits`), or with `swiglu_limit` 7.0, the
/// model its GGUF file describes (`limit7_logits`).
fn transformers_logits(which: &str) -> Vec<f32> {
    f32_file(&data(&format!("{FAMILY}/{which}_f32le.bin")))
}

/// In place, the MXFP4 experts dotted against int8 (or int16) activations as ggml dots
/// them, the checkpoint and the GGUF file give transformers' logits within the activations'
/// rounding, the same in the three ways. Measured: int8 0.048 (checkpoint) and 0.081 (GGUF
/// file), int16 1.5e-4 and 3.0e-4; the bounds are about 2.5 and 3 times those. The decoded
/// weights meet 1e-4 (the f32 conversions below); a block read at a wrong offset or with
/// its nibbles swapped moves the logits by whole units.
#[test]
fn mxfp4_in_place_matches_transformers_within_the_activations_rounding() {
    for (path, which) in [(FAMILY, "logits"), (GGUF, "limit7_logits")] {
        for (bits, bound) in [(ActivationBits::Int8, 0.2), (ActivationBits::Int16, 1e-3)] {
            let what = format!("{path} in place, {bits:?} activations");
            assert_three_ways_near(&data(path), &cpu_executor_with(bits), which, bound, &what);
        }
    }
}

/// Converted with `--recipe keep`, the .flm file holds the experts' MXFP4 blocks as
/// imported, byte for byte, and gives the checkpoint's logits bit for bit.
#[test]
fn mxfp4_kept_in_a_flm_file_runs_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gpt_oss_mxfp4.keep.flm");
    let ckpt = checkpoint(&data(FAMILY));
    convert_with_tok512(&ckpt, &out, DataType::F32, Recipe::Keep);
    let flm = checkpoint(&out);
    let mut kept = 0;
    for t in ckpt
        .tensors
        .iter()
        .filter(|t| t.encoding.load_dtype() == DataType::MXFP4)
    {
        let f = flm.tensors.iter().find(|f| f.name == t.name).unwrap();
        let (want, got) = (t.load().unwrap(), f.load().unwrap());
        assert_eq!(got.dtype(), DataType::MXFP4, "{}", t.name);
        assert_eq!(got.bytes().unwrap(), want.bytes().unwrap(), "{}", t.name);
        kept += 1;
    }
    assert_eq!(kept, 4 * 8 * 3);
    let exec = cpu_executor();
    for ((how, got), (_, want)) in three_ways(&out, &exec)
        .into_iter()
        .zip(three_ways(&data(FAMILY), &exec))
    {
        assert!(
            got.iter()
                .zip(&want)
                .all(|(g, w)| g.to_bits() == w.to_bits()),
            "{how}"
        );
    }
}

/// Greedy decoding with the cache writes the 20 ids of transformers' full-prefill argmax:
/// `reference.json`'s `gpt_oss_mxfp4.greedy_ids` for the checkpoint (best logit ahead by
/// 0.05 or more) and its `gguf_file.greedy_ids` for the GGUF file (0.018 or more).
#[test]
fn mxfp4_greedy_continuations_are_transformers() {
    let reference = &json("hf-families/reference.json")["families"]["gpt_oss_mxfp4"];
    for (path, want) in [
        (FAMILY, &reference["greedy_ids"]),
        (GGUF, &reference["gguf_file"]["greedy_ids"]),
    ] {
        let want = ids(want);
        let mut model = load(&data(path));
        let got = flm_tests::greedy_on(&cpu_executor(), &mut model, &input_ids(), want.len());
        assert_eq!(got, want, "{path}");
    }
}

/// Converted to an f32 .flm file (the experts decoded from their blocks), the model gives
/// transformers' logits too: the repacked blocks decode to its weights
/// (`mxfp4_experts_decode_to_transformers_weights_exactly`), and the rest of the graph is
/// the unquantised gpt-oss one.
#[test]
fn mxfp4_converted_to_f32_matches_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gpt_oss_mxfp4.f32.flm");
    let ckpt = checkpoint(&data(FAMILY));
    convert_with_tok512(&ckpt, &out, DataType::F32, Recipe::Pure);
    let flm = checkpoint(&out);
    let down = TensorName::Expert(3, 7, LayerPart::WDown).to_string();
    let t = flm.tensors.iter().find(|t| t.name == down).unwrap();
    assert_eq!(t.encoding.load_dtype(), DataType::F32);
    assert_three_ways_near(&out, &cpu_executor(), "logits", TOLERANCE, "f32 .flm");
}

/// The logits of the model at `path` in one prefill, two chunks (10 ids, then 14) and token
/// by token, on `exec`, by name.
fn three_ways(path: &Path, exec: &Executor) -> [(&'static str, Vec<f32>); 3] {
    let input = input_ids();
    let prefill = load(path)
        .forward(exec, &input, 0, Logits::All)
        .unwrap()
        .to_vec();
    let mut model = load(path);
    let mut chunked = model
        .forward(exec, &input[..10], 0, Logits::All)
        .unwrap()
        .to_vec();
    chunked.extend(model.forward(exec, &input[10..], 10, Logits::All).unwrap());
    let mut model = load(path);
    let mut stepped = Vec::new();
    for (pos, &token) in input.iter().enumerate() {
        stepped.extend(model.forward(exec, &[token], pos, Logits::Last).unwrap());
    }
    [
        ("prefill", prefill),
        ("two chunks", chunked),
        ("decode", stepped),
    ]
}

/// The logits of the model at `path` on `exec` ([`three_ways`]) are within `tolerance` of
/// transformers' `which` ([`transformers_logits`]); `what` names it in messages.
fn assert_three_ways_near(path: &Path, exec: &Executor, which: &str, tolerance: f32, what: &str) {
    let want = transformers_logits(which);
    for (how, got) in three_ways(path, exec) {
        let diff = max_abs_diff(&got, &want);
        eprintln!("gpt_oss_mxfp4 {what} {how}: max |Δ| = {diff:e}");
        assert!(diff <= tolerance, "{what} {how}: max |Δ| = {diff}");
    }
}

/// A change to a checkpoint's tensor (name, stored view): its new shape and bytes, or
/// `None` to drop it.
type Edit = dyn Fn(&str, TensorView<'_>) -> Option<(Vec<usize>, Vec<u8>)>;

/// A copy of the checkpoint whose tensors `edit` changes (by name: `None` drops one).
fn edited_tensors(edit: &Edit) -> tempfile::TempDir {
    let src = data(FAMILY);
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let edited: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .filter_map(|(name, view)| {
            let dtype = view.dtype();
            edit(&name, view).map(|(shape, data)| (name, dtype, shape, data))
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = edited
        .iter()
        .map(|(name, dtype, shape, data)| {
            (
                name.clone(),
                TensorView::new(*dtype, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    safetensors::tensor::serialize_to_file(views, None, &dir.path().join("model.safetensors"))
        .unwrap();
    dir
}

/// The error of loading (and, if that succeeds, of reading every tensor of) the checkpoint
/// at `path`.
fn load_error(path: &Path) -> String {
    let ckpt = match import::load(path) {
        Ok(ckpt) => ckpt,
        Err(e) => return e.to_string(),
    };
    for t in &ckpt.tensors {
        if let Err(e) = t.load() {
            return e.to_string();
        }
    }
    panic!("{} loads", path.display());
}

/// A tensor as it is stored.
fn keep(view: TensorView<'_>) -> Option<(Vec<usize>, Vec<u8>)> {
    Some((view.shape().to_vec(), view.data().to_vec()))
}

/// Missing or misshapen MXFP4 parts are errors that name the tensor, not panics.
#[test]
fn broken_mxfp4_experts_are_clear_errors() {
    let cases: [(&str, &Edit); 4] = [
        (
            "model.layers.1.mlp.experts.down_proj_blocks without model.layers.1.mlp.experts.down_proj_scales",
            &|name, view| (name != "model.layers.1.mlp.experts.down_proj_scales").then(|| keep(view)).flatten(),
        ),
        (
            "gpt_oss checkpoint without model.layers.2.mlp.experts.gate_up_proj (or",
            &|name, view| {
                (!name.starts_with("model.layers.2.mlp.experts.gate_up_proj_"))
                    .then(|| keep(view))
                    .flatten()
            },
        ),
        (
            "model.layers.0.mlp.experts.gate_up_proj_blocks has shape [8, 64, 1, 32]",
            &|name, view| {
                let (mut shape, data) = keep(view)?;
                if name == "model.layers.0.mlp.experts.gate_up_proj_blocks" {
                    shape = vec![8, 64, 1, 32];
                }
                Some((shape, data))
            },
        ),
        (
            "model.layers.3.mlp.experts.down_proj_scales has shape [8, 32, 2]",
            &|name, view| {
                let (mut shape, data) = keep(view)?;
                if name == "model.layers.3.mlp.experts.down_proj_scales" {
                    shape = vec![8, 32, 2];
                }
                Some((shape, data))
            },
        ),
    ];
    for (want, edit) in cases {
        let dir = edited_tensors(edit);
        let err = load_error(dir.path());
        assert!(err.contains(want), "{err}");
    }
}

/// The GGUF file describes the checkpoint's model as llama.cpp runs gpt-oss: sinks, q/k/v/o
/// biases, windows on the even layers, YaRN unrounded, the biased router and the expert
/// biases, but llama.cpp's SwiGLU limit of 7 (the file has no key for it).
#[test]
fn gguf_configuration_is_the_checkpoints_with_llama_cpps_limit() {
    let hf = checkpoint(&data(FAMILY)).config;
    let gguf = checkpoint(&data(GGUF)).config;
    assert!(gguf.attn_sinks && gguf.qkv_bias && gguf.o_bias);
    assert_eq!(
        (
            gguf.n_layers,
            gguf.dim,
            gguf.n_heads,
            gguf.n_kv_heads,
            gguf.head_dim
        ),
        (hf.n_layers, hf.dim, hf.n_heads, hf.n_kv_heads, hf.head_dim)
    );
    assert_eq!(gguf.rope_style, hf.rope_style);
    assert_eq!(gguf.rope_theta, hf.rope_theta);
    assert_eq!(
        (gguf.sliding_window, &gguf.sliding_layers),
        (hf.sliding_window, &hf.sliding_layers)
    );
    let (Some(RopeScaling::Yarn(g)), Some(RopeScaling::Yarn(h))) =
        (&gguf.rope_scaling, &hf.rope_scaling)
    else {
        panic!("{:?} {:?}", gguf.rope_scaling, hf.rope_scaling);
    };
    assert!((g.attention_factor - h.attention_factor).abs() < 1e-6);
    assert_eq!(
        YarnScaling {
            attention_factor: h.attention_factor,
            ..*g
        },
        *h
    );
    let want = MoeConfig {
        activation: ExpertActivation::ClampedSwiGlu {
            alpha: 1.702,
            limit: 7.0,
        },
        ..hf.moe.clone().unwrap()
    };
    assert_eq!(gguf.moe, Some(want));
}

/// Every tensor of the GGUF file is read, and each expert's MXFP4 matrix is, byte for byte,
/// the one flm repacks from the checkpoint's blocks and scales: llama.cpp's converter
/// (`GptOssModel.repack_mxfp4`) and flm's importer move the same nibbles to the same
/// places. Its biases and the other tensors hold the checkpoint's values.
#[test]
fn gguf_experts_are_the_checkpoints_repacked_blocks() {
    let hf = checkpoint(&data(FAMILY));
    let gguf = checkpoint(&data(GGUF));
    assert!(gguf.ignored.is_empty(), "{:?}", gguf.ignored);
    assert_eq!(gguf.tensors.len(), hf.tensors.len());
    let mut mxfp4 = 0;
    for t in &hf.tensors {
        let g = gguf.tensors.iter().find(|g| g.name == t.name).unwrap();
        assert_eq!(g.shape, t.shape, "{}", t.name);
        let (want, got) = (t.load().unwrap(), g.load().unwrap());
        assert_eq!(got.dtype(), want.dtype(), "{}", t.name);
        if want.dtype() == DataType::MXFP4 {
            assert_eq!(got.bytes().unwrap(), want.bytes().unwrap(), "{}", t.name);
            mxfp4 += 1;
        } else {
            assert_eq!(
                got.to_f32_vec().unwrap(),
                want.to_f32_vec().unwrap(),
                "{}",
                t.name
            );
        }
    }
    let c = &hf.config;
    assert_eq!(mxfp4, c.n_layers * c.moe.as_ref().unwrap().n_experts * 3);
}

/// Converted to an f32 .flm file, the GGUF file gives transformers' logits of the model it
/// describes (the checkpoint with `swiglu_limit` 7).
#[test]
fn gguf_converted_to_f32_matches_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gpt_oss_mxfp4-gguf.f32.flm");
    convert_with_tok512(&checkpoint(&data(GGUF)), &out, DataType::F32, Recipe::Pure);
    assert_three_ways_near(
        &out,
        &cpu_executor(),
        "limit7_logits",
        TOLERANCE,
        "GGUF as f32 .flm",
    );
}
