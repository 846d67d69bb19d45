//! GPTQ and AWQ int4 checkpoints (models/src/import/packed.rs) against their references:
//! tiny random Llamas packed as GPTQModel and AutoAWQ pack them, checked against those
//! packages' own unpacking, with transformers' logits and greedy ids for the dequantised
//! weights (tests/data/gptq-awq, made by tools/quant/make_gptq_awq.py; see SOURCES.md).

use std::path::PathBuf;

use flm_core::flm_file::FlmFile;
use flm_core::{Data, DataType, Executor};
use flm_models::convert::Recipe;
use flm_models::import::{self, Checkpoint};
use flm_models::llama::{Llama, LlamaWeights, Logits};
use flm_models::tensor_names::{LayerPart, TensorName};
use flm_models::Graph;
use flm_tests::{
    convert_with_tok512, cpu_executor, data, f32_file, greedy_on, ids, json, max_abs_diff,
    weights_in,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Each variant and the dtype its projections load as: symmetric GPTQ repacks into
/// int4-sym, asymmetric GPTQ and AWQ into int4-zp (whatever their scales), act-order
/// ones too with their input channels permuted into group order; 8-bit GPTQ is
/// dequantised to f16.
const VARIANTS: [(&str, DataType); 8] = [
    ("gptq-sym-g128", DataType::I4SymG128),
    ("gptq-sym-g32-actorder", DataType::I4SymG32),
    ("gptq-asym-g32", DataType::I4ZpG32),
    ("gptq-asym-g128-actorder", DataType::I4ZpG128),
    ("gptq-asym-g32-short-scales", DataType::I4ZpG32),
    ("awq-g32", DataType::I4ZpG32),
    ("awq-g128-short-scales", DataType::I4ZpG128),
    ("gptq-8bit-asym-g32-v2", DataType::F16),
];

/// The dtype `part` of `variant` (whose projections mostly load as `dtype`) loads as: with
/// act-order at groups of 128, a projection of 128 input channels is one group, which
/// `g_idx` cannot scatter, so all but the down projection (256 inputs) repack.
fn loads_as(variant: &str, dtype: DataType, part: LayerPart) -> DataType {
    if variant == "gptq-asym-g128-actorder" && part != LayerPart::WDown {
        DataType::I4ZpG128
    } else {
        dtype
    }
}

/// The projections of a layer, every one quantised in the checkpoints.
const PROJECTIONS: [LayerPart; 7] = [
    LayerPart::Wq,
    LayerPart::Wk,
    LayerPart::Wv,
    LayerPart::Wo,
    LayerPart::WGate,
    LayerPart::WUp,
    LayerPart::WDown,
];

fn reference() -> Value {
    json("gptq-awq/reference.json")
}

/// What the checks of loaded variants are given besides the checkpoint: the reference, its
/// input ids and a CPU executor.
struct Given {
    reference: Value,
    input: Vec<u32>,
    exec: Executor,
}

/// Calls `check` on each of `variants` (name, dtype) with its checkpoint loaded.
fn check_loaded(
    variants: impl IntoIterator<Item = (&'static str, DataType)>,
    mut check: impl FnMut(&Given, &str, DataType, Checkpoint),
) {
    let reference = reference();
    let given = Given {
        input: ids(&reference["input_ids"]),
        reference,
        exec: cpu_executor(),
    };
    for (variant, dtype) in variants {
        check(&given, variant, dtype, import::load(&dir(variant)).unwrap());
    }
}

fn dir(variant: &str) -> PathBuf {
    data(&format!("gptq-awq/{variant}"))
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The weight's values as f32 `[out, in]` in the checkpoint's column order: a weight with
/// an input permutation has column `j` holding input channel `perm[j]`.
fn unpermuted_f32(weight: &Data) -> Vec<f32> {
    let values = weight.to_f32_vec().unwrap();
    let Some(perm) = weight.input_perm() else {
        return values;
    };
    let perm = perm.as_i32().unwrap();
    let mut out = vec![0.0; values.len()];
    for (dst, src) in out
        .chunks_exact_mut(perm.len())
        .zip(values.chunks_exact(perm.len()))
    {
        for (&p, &v) in perm.iter().zip(src) {
            dst[p as usize] = v;
        }
    }
    out
}

fn f16_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect()
}

#[test]
fn dequantised_weights_equal_the_references_bit_for_bit() {
    check_loaded(VARIANTS, |given, variant, dtype, ckpt| {
        let hashes = &given.reference["variants"][variant]["dequantised_sha256"];
        let act_order = given.reference["variants"][variant]["desc_act"] == true;
        let mut permuted = 0;
        for l in 0..ckpt.config.n_layers {
            for part in PROJECTIONS {
                let name = TensorName::Layer(l, part);
                let want = &hashes[name.hf().unwrap()];
                let weight = ckpt.tensor(name).unwrap().load().unwrap();
                let dtype = loads_as(variant, dtype, part);
                assert_eq!(weight.dtype(), dtype, "{variant} {name}");
                // Act-order weights of more than one group repacked into int4 carry their
                // permutation; others keep the checkpoint's column order.
                if weight.input_perm().is_some() {
                    assert!(act_order && dtype != DataType::F16, "{variant} {name}");
                    permuted += 1;
                }
                let f32 = &unpermuted_f32(&weight);
                // Rounding flm's values to f16 gives the references' own f16 arithmetic.
                assert_eq!(sha256(&f16_bytes(f32)), want["f16"], "{variant} {name} f16");
                if dtype != DataType::F16 {
                    let bytes: Vec<u8> = f32.iter().flat_map(|v| v.to_le_bytes()).collect();
                    assert_eq!(sha256(&bytes), want["f32"], "{variant} {name} f32");
                }
            }
        }
        assert_eq!(permuted > 0, act_order, "{variant}: {permuted} permuted");
    });
}

#[test]
fn logits_match_transformers_on_the_dequantised_weights() {
    check_loaded(VARIANTS, |given, variant, _, ckpt| {
        // The weights rounded to f16, as the references dequantise them, then held in f32:
        // the values transformers runs, without flm's int8 activations.
        let f16 = weights_in(&LlamaWeights::load(&ckpt).unwrap(), |_, _| DataType::F16);
        let weights = weights_in(&f16, |_, _| DataType::F32);
        let mut model = Llama::new(ckpt.config.clone(), weights).unwrap();
        let got = model
            .forward(&given.exec, &given.input, 0, Logits::All)
            .unwrap()
            .to_vec();
        let want = f32_file(&dir(variant).join("logits_f32le.bin"));
        let diff = max_abs_diff(&got, &want);
        assert!(diff < 1e-4, "{variant}: logits differ by {diff}");
    });
}

#[test]
fn greedy_ids_match_transformers_with_the_loaded_dtypes() {
    check_loaded(VARIANTS, |given, variant, _, ckpt| {
        let weights = LlamaWeights::load(&ckpt).unwrap();
        let mut model = Llama::new(ckpt.config.clone(), weights).unwrap();
        let want = ids(&given.reference["variants"][variant]["greedy_ids"]);
        let got = greedy_on(&given.exec, &mut model, &given.input, want.len());
        assert_eq!(got, want, "{variant}");
    });
}

#[test]
fn dequantised_tensors_are_noted_with_their_reason() {
    let notes = |variant: &str| import::load(&dir(variant)).unwrap().load_notes();
    for variant in [
        "gptq-sym-g128",
        "gptq-sym-g32-actorder",
        "gptq-asym-g32",
        "gptq-asym-g128-actorder",
        "awq-g32",
        "awq-g128-short-scales",
    ] {
        assert!(notes(variant).is_empty(), "{variant}");
    }
    assert!(notes("gptq-8bit-asym-g32-v2")[0].contains("GPTQ 8-bit with 8-bit codes in groups"));
}

/// `variant` converted with [`Recipe::Keep`] to `tmp/<variant>.flm`.
fn converted(tmp: &std::path::Path, variant: &str) -> PathBuf {
    let ckpt = import::load(&dir(variant)).unwrap();
    let out = tmp.join(format!("{variant}.flm"));
    convert_with_tok512(&ckpt, &out, DataType::F32, Recipe::Keep);
    out
}

#[test]
fn converted_files_keep_the_repacked_int4_and_its_permutation() {
    let tmp = tempfile::tempdir().unwrap();
    let int4 = VARIANTS.into_iter().filter(|&(_, d)| d != DataType::F16);
    check_loaded(int4, |given, variant, dtype, ckpt| {
        let out = converted(tmp.path(), variant);
        let file = FlmFile::open(&out).unwrap();
        for l in 0..ckpt.config.n_layers {
            for part in PROJECTIONS {
                let name = TensorName::Layer(l, part);
                let stored: Data = file.tensor(&name.to_string()).unwrap();
                let loaded = ckpt.tensor(name).unwrap().load().unwrap();
                assert_eq!(stored.dtype(), dtype, "{variant} {name}");
                assert_eq!(stored.bytes().unwrap(), loaded.bytes().unwrap());
                // The scheme's 4-bit codes and a scale per group, and a 16-bit minimum or
                // zero point per group unless symmetric: 4 + 32 / G bits per weight.
                let g = dtype.group_size().unwrap();
                let per_group = if dtype.is_int4_symmetric() { 16 } else { 32 };
                let [rows, cols] = <[usize; 2]>::try_from(stored.shape()).unwrap();
                let bits = rows * cols.div_ceil(g) * (4 * g + per_group);
                assert_eq!(8 * stored.size_bytes(), bits, "{variant} {name}");
                let perm = file.tensor(&format!("{name}.perm")).ok();
                let want = loaded.input_perm().map(|p| p.bytes().unwrap());
                assert_eq!(
                    perm.as_ref().map(|p| p.bytes().unwrap()),
                    want,
                    "{variant} {name}"
                );
            }
        }
        // Read back, the file decodes as transformers does.
        let flm = import::load(&out).unwrap();
        let mut model = Llama::new(flm.config.clone(), LlamaWeights::load(&flm).unwrap()).unwrap();
        let want = ids(&given.reference["variants"][variant]["greedy_ids"]);
        assert_eq!(
            greedy_on(&given.exec, &mut model, &given.input, want.len()),
            want,
            "{variant}"
        );
    });
}

#[test]
fn a_stored_permutation_that_is_not_one_or_of_no_tensor_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = converted(tmp.path(), "gptq-sym-g32-actorder");
    let file = FlmFile::open(&out).unwrap();
    let info = file
        .tensors()
        .iter()
        .find(|t| t.name == "layers.1.w_down.perm")
        .unwrap()
        .clone();
    let start = file.tensor_bytes(&info).1;
    drop(file);
    let bytes = std::fs::read(&out).unwrap();
    let cols = info.shape[0] as i32;
    let second = i32::from_le_bytes(bytes[start + 4..start + 8].try_into().unwrap());
    for (case, value, want) in [
        (
            "out-of-range",
            cols,
            format!("value {cols} at 0 is out of range"),
        ),
        ("negative", -1, "value -1 at 0 is out of range".to_string()),
        (
            "repeated",
            second,
            format!("value {second} at 1 is out of range"),
        ),
    ] {
        let mut edited = bytes.clone();
        // Entry 0 becomes `value`: out of range, or the value of entry 1 repeated.
        edited[start..start + 4].copy_from_slice(&value.to_le_bytes());
        let path = tmp.path().join(format!("{case}.flm"));
        std::fs::write(&path, &edited).unwrap();
        let ckpt = import::load(&path).unwrap();
        let err = LlamaWeights::load(&ckpt).unwrap_err().to_string();
        assert!(err.contains("layers.1.w_down"), "{case}: {err}");
        assert!(err.contains(&want), "{case}: {err}");
        assert!(err.contains("not a permutation"), "{case}: {err}");
    }
    // A permutation whose name is no tensor's (`w_down` renamed `w_dowX` in the metadata).
    let at = bytes
        .windows(21)
        .position(|w| w == b"layers.1.w_down.perm\"".as_slice())
        .unwrap();
    let mut orphan = bytes.clone();
    orphan[at + 14] = b'X';
    let path = tmp.path().join("orphan.flm");
    std::fs::write(&path, &orphan).unwrap();
    let err = import::load(&path).unwrap_err().to_string();
    assert!(
        err.contains("layers.1.w_dowX.perm is the input permutation of no tensor"),
        "{err}"
    );
}

#[test]
fn asymmetric_schemes_requantise_to_int4_within_a_hundredth_of_a_step() {
    // What `flm convert --dtype int4 --group-size 32 --pure` makes of the values that
    // asymmetric groups of 32 load as: flm's fit finds the checkpoint's grid again, with
    // the minimum rounded to f16.
    for variant in ["gptq-asym-g32", "awq-g32"] {
        let ckpt = import::load(&dir(variant)).unwrap();
        let mut worst = 0.0f32;
        for l in 0..ckpt.config.n_layers {
            for part in PROJECTIONS {
                let loaded = ckpt.tensor(TensorName::Layer(l, part)).unwrap();
                let want = loaded.load().unwrap().to_dtype(DataType::F32).unwrap();
                let int4 = want.to_dtype(DataType::I4G32).unwrap();
                let got = int4.to_dtype(DataType::F32).unwrap();
                let (want, got) = (want.as_f32().unwrap(), got.as_f32().unwrap());
                for (w, g) in want.chunks(32).zip(got.chunks(32)) {
                    let lo = w.iter().copied().fold(f32::INFINITY, f32::min);
                    let hi = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    // At most the group's scale: its codes span at most 0..=15.
                    let step = (hi - lo) / 15.0;
                    for (a, b) in w.iter().zip(g) {
                        worst = worst.max((a - b).abs() / step);
                    }
                }
            }
        }
        assert!(worst < 0.01, "{variant}: {worst} of a step");
    }
}

/// Passes a stored tensor (name, bytes) through, changed, or drops it (`None`).
type Edit<'a> = &'a dyn Fn(&str, &[u8]) -> Option<Vec<u8>>;

/// A copy of `gptq-sym-g128` in `tmp/name` with config.json `config` and each tensor of
/// model.safetensors passed through `edit` (`None` drops it).
fn edited_copy(tmp: &std::path::Path, name: &str, config: &str, edit: Edit<'_>) -> PathBuf {
    let d = tmp.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("config.json"), config).unwrap();
    let bytes = std::fs::read(dir("gptq-sym-g128").join("model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .filter_map(|(n, t)| {
            Some((
                n.clone(),
                t.dtype(),
                t.shape().to_vec(),
                edit(&n, t.data())?,
            ))
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = kept
        .iter()
        .map(|(n, dtype, shape, data)| {
            let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap();
            (n.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &d.join("model.safetensors")).unwrap();
    d
}

#[test]
fn unsupported_schemes_and_broken_checkpoints_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let config = std::fs::read_to_string(dir("gptq-sym-g128").join("config.json")).unwrap();
    let error = |name: &str, config: &str, edit: Edit<'_>| {
        let d = edited_copy(tmp.path(), name, config, edit);
        import::load(&d).unwrap_err().to_string()
    };
    let same = |_: &str, b: &[u8]| Some(b.to_vec());
    let marlin = config.replace(
        "\"checkpoint_format\": \"gptq\"",
        "\"checkpoint_format\": \"marlin\"",
    );
    assert!(error("marlin", &marlin, &same).contains("GPTQ checkpoint_format \"marlin\""));
    let bnb = config.replace(
        "\"quant_method\": \"gptq\"",
        "\"quant_method\": \"bitsandbytes\"",
    );
    assert!(error("bnb", &bnb, &same).contains("quant_method \"bitsandbytes\""));
    const QZEROS: &str = "model.layers.0.self_attn.q_proj.qzeros";
    let missing = error("missing", &config, &|n, b| {
        (n != QZEROS).then(|| b.to_vec())
    });
    assert!(missing.contains(&format!("has no {QZEROS}")), "{missing}");
    let bad_group = |n: &str, b: &[u8]| {
        let mut b = b.to_vec();
        if n.ends_with("0.mlp.down_proj.g_idx") {
            b[..4].copy_from_slice(&7i32.to_le_bytes());
        }
        Some(b)
    };
    let g_idx = error("g_idx", &config, &bad_group);
    assert!(g_idx.contains("g_idx names group 7 of 2"), "{g_idx}");
}
