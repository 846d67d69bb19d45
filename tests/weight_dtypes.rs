//! f16 and bf16 weights (as published Hugging Face checkpoints store them) run through the
//! same kernels, widened exactly to f32, and stay close to the fp32 reference logits.
//! llama2.c v1 (fp32) and v2 (Q8_0) files, laid out here from the legacy file exactly as
//! llama2.c's `export.py` writes them, load and reproduce the reference.

use std::path::Path;

use byteorder::{LittleEndian, WriteBytesExt};
use flm_core::DataType;
use flm_models::import::{self, Format};
use flm_models::llama::{Llama, LlamaWeights, Logits};
use flm_models::Graph;
use flm_tests::{
    cpu_executor, data, ids, max_abs_diff, stories_logits, stories_reference, weights_in,
};

/// Writes `bytes` to `path` and loads the model there, whose format must read as `format`.
fn write_and_load(path: &Path, bytes: &[u8], format: Format) -> Llama {
    std::fs::write(path, bytes).unwrap();
    let ckpt = import::load(path).unwrap();
    assert_eq!(ckpt.format, format);
    Llama::new(ckpt.config.clone(), LlamaWeights::load(&ckpt).unwrap()).unwrap()
}

/// Max abs error of the teacher-forced logits against the reference, and the number of
/// positions whose argmax differs.
fn logits_error(model: &mut Llama) -> (f32, usize) {
    let reference = stories_reference();
    let input = ids(&reference["logits_file"]["input_ids"]);
    let expected = stories_logits();
    let got = model
        .forward(&cpu_executor(), &input, 0, Logits::All)
        .unwrap();
    let max_err = max_abs_diff(got, &expected);
    let flips = got
        .chunks(512)
        .zip(expected.chunks(512))
        .filter(|(a, b)| flm_core::argmax(a) != flm_core::argmax(b))
        .count();
    (max_err, flips)
}

#[test]
fn half_precision_weights_stay_close_to_fp32() {
    let ckpt = import::load(&data("hf-stories260K")).unwrap();
    // Tolerances: logits reach |19.5|; f16 keeps 11 significant bits (relative rounding
    // 2^-11 ≈ 5e-4 per weight), bf16 8 bits (2^-8 ≈ 4e-3). Errors of independent roundings
    // partly cancel over each dot product; the bounds leave 2-4x headroom over what was
    // measured (f16 0.017, bf16 0.078).
    for (dtype, tol) in [(DataType::F16, 0.05), (DataType::BF16, 0.3)] {
        let weights = weights_in(&LlamaWeights::load(&ckpt).unwrap(), |_, _| dtype);
        assert_eq!(weights.layers[0].wo.dtype(), dtype);
        let mut model = Llama::new(ckpt.config.clone(), weights).unwrap();
        let (err, flips) = logits_error(&mut model);
        assert!(err < tol, "{dtype}: max abs logit error {err}");
        assert_eq!(flips, 0, "{dtype}: argmax changed");
    }
}

/// Header of a llama2.c v1/v2 file (export.py `version1_export` / `version2_export`).
fn v_header(version: i32, params: &[i32], group: Option<i32>) -> Vec<u8> {
    let mut h = Vec::new();
    h.write_u32::<LittleEndian>(0x616b_3432).unwrap();
    h.write_i32::<LittleEndian>(version).unwrap();
    for &p in params {
        h.write_i32::<LittleEndian>(p.abs()).unwrap();
    }
    h.push(u8::from(params[5] > 0));
    if let Some(g) = group {
        h.write_i32::<LittleEndian>(g).unwrap();
    }
    h.resize(256, 0);
    h
}

/// The legacy file split into its tensors (each over all layers), in file order.
struct Legacy {
    params: Vec<i32>,
    tensors: Vec<Vec<f32>>,
}

fn read_legacy() -> Legacy {
    let bytes = std::fs::read(data("stories260K/stories260K.bin")).unwrap();
    let ints: Vec<i32> = bytes[..28]
        .chunks(4)
        .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let [dim, hidden, layers, heads, kv_heads, vocab, _seq] = ints[..] else {
        unreachable!()
    };
    let (dim, hidden, l) = (dim as usize, hidden as usize, layers as usize);
    let kv = dim * kv_heads as usize / heads as usize;
    let sizes = [
        vocab as usize * dim,
        l * dim,
        l * dim * dim,
        l * kv * dim,
        l * kv * dim,
        l * dim * dim,
        l * dim,
        l * hidden * dim,
        l * dim * hidden,
        l * hidden * dim,
        dim,
    ];
    let floats: Vec<f32> = bytes[28..]
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let mut offset = 0;
    let tensors = sizes
        .iter()
        .map(|&n| {
            offset += n;
            floats[offset - n..offset].to_vec()
        })
        .collect();
    Legacy {
        params: ints,
        tensors,
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// export.py `quantize_q80`: per group of `g`, scale = absmax / 127, q = round(w / scale).
fn q80(w: &[f32], g: usize) -> Vec<u8> {
    let mut q = Vec::new();
    let mut scales = Vec::new();
    for group in w.chunks(g) {
        let scale = group.iter().fold(0.0f32, |m, x| m.max(x.abs())) / 127.0;
        scales.push(scale);
        q.extend(group.iter().map(|x| (x / scale).round() as i8 as u8));
    }
    q.extend(f32_bytes(&scales));
    q
}

#[test]
fn llama2c_v1_and_v2_exports_load() {
    let legacy = read_legacy();
    let t = &legacy.tensors;
    // Legacy order: emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final.
    let (emb, rms_att, rms_ffn, rms_final) = (&t[0], &t[1], &t[6], &t[10]);
    let matrices = [&t[2], &t[3], &t[4], &t[5], &t[7], &t[8], &t[9]];
    let dir = tempfile::tempdir().unwrap();

    let mut v1 = v_header(1, &legacy.params, None);
    for x in [rms_att, rms_ffn, rms_final, emb]
        .into_iter()
        .chain(matrices)
    {
        v1.extend(f32_bytes(x));
    }
    let mut model = write_and_load(&dir.path().join("v1.bin"), &v1, Format::Llama2cV1);
    let (err, flips) = logits_error(&mut model);
    assert!(err < 1e-4 && flips == 0, "v1: {err}, {flips}");

    // v2: group size 64 (export.py's default; divides dim = 64). Per-layer tensors are
    // quantised one layer at a time.
    let g = 64;
    let mut v2 = v_header(2, &legacy.params, Some(g as i32));
    for x in [rms_att, rms_ffn, rms_final] {
        v2.extend(f32_bytes(x));
    }
    v2.extend(q80(emb, g));
    let n_layers = legacy.params[2] as usize;
    for m in matrices {
        for layer in m.chunks(m.len() / n_layers) {
            v2.extend(q80(layer, g));
        }
    }
    let path = dir.path().join("v2.bin");
    let mut model = write_and_load(&path, &v2, Format::Llama2cV2);
    let (err, flips) = logits_error(&mut model);
    // Q8_0 rounds each weight by at most scale/2 = absmax/254 per group (measured 0.29).
    assert!(
        err < 0.5 && flips == 0,
        "v2: max abs logit error {err}, {flips} argmax flips"
    );

    // The same file cut short is refused.
    std::fs::write(&path, &v2[..v2.len() - 10]).unwrap();
    let err = import::load(&path).unwrap_err().to_string();
    assert!(err.contains("truncated"), "{err}");
}
