//! The GGUF importer against files written by llama.cpp's own tooling: the vocabulary-only
//! `ggml-vocab-llama-spm.gguf` from llama.cpp (byte-level BPE's `ggml-vocab-gpt-2.gguf`:
//! `gguf/bpe.rs`), and stories260K written with the `gguf`
//! Python package (`tests/data/gguf/make_stories260k_gguf.py`, SOURCES.md), checked
//! against the transformers references of stories260K. Damaged files: `gguf/damaged.rs`;
//! gpt-oss's o200k_harmony with the `gpt-4o` pre-tokenizer: `gguf/o200k.rs`.

#[path = "gguf/bpe.rs"]
mod bpe;
#[path = "gguf/damaged.rs"]
mod damaged;
#[path = "gguf/o200k.rs"]
mod o200k;

use flm_core::{argmax, Data, Executor, RopeStyle};
use flm_devices::ActivationBits;
use flm_models::import::{self, Checkpoint, Format};
use flm_models::llama::{Llama, LlamaWeights, Logits};
use flm_models::Graph;
use flm_tests::tokenizer::llama_cpp_cases;
use flm_tests::{cpu_executor_with, data, f32_file, ids, stories_reference};

const F32: &str = "gguf/stories260K-f32.gguf";
const Q8_0: &str = "gguf/stories260K-q8_0.gguf";
const Q4_0: &str = "gguf/stories260K-q4_0.gguf";
const Q4_1: &str = "gguf/stories260K-q4_1.gguf";
const Q5_1: &str = "gguf/stories260K-q5_1.gguf";
const Q5_0: &str = "gguf/stories260K-q5_0.gguf";
const VOCAB: &str = "gguf/ggml-vocab-llama-spm.gguf";
const GPT2: &str = "gguf/ggml-vocab-gpt-2.gguf";
const KQUANT: &str = "gguf/tiny-kquant.gguf";
const LUT4: &str = "gguf/tiny-lut4.gguf";

fn load(rel: &str) -> Checkpoint {
    import::load(&data(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The tensor `name` of `ckpt`, loaded.
fn tensor(ckpt: &Checkpoint, name: &str) -> Data {
    ckpt.tensor(name.parse().unwrap()).unwrap().load().unwrap()
}

fn model(rel: &str) -> Llama {
    let ckpt = load(rel);
    Llama::new(ckpt.config.clone(), LlamaWeights::load(&ckpt).unwrap()).unwrap()
}

fn exec() -> Executor {
    cpu_executor_with(ActivationBits::Int8)
}

#[test]
fn config_and_tensors_match_the_llama2c_checkpoint() {
    let gguf = load(F32);
    let bin = load("stories260K/stories260K.bin");
    assert_eq!(gguf.format, Format::Gguf);
    let c = &gguf.config;
    let dims = [
        c.dim,
        c.hidden_dim,
        c.n_layers,
        c.n_heads,
        c.n_kv_heads,
        c.head_dim,
    ];
    assert_eq!(dims, [64, 172, 5, 8, 4, 8]);
    assert_eq!((c.vocab_size, c.max_seq_len), (512, 512));
    assert_eq!((c.norm_eps, c.rope_theta), (1e-5, 10000.0));
    assert_eq!(c.rope_style, RopeStyle::AdjacentPairs);
    assert!(c.tie_embeddings, "no output.weight");
    assert_eq!((c.bos_token_id, &c.eos_token_ids[..]), (Some(1), &[2][..]));
    assert!(gguf.tokenizer_candidates.is_empty());
    // Every tensor holds exactly the values of the llama2.c file, as a view of the mmap.
    assert_eq!(gguf.tensors.len(), bin.tensors.len());
    for t in &bin.tensors {
        let g = gguf.tensor(t.name.parse().unwrap()).unwrap();
        assert_eq!(g.shape, t.shape, "{}", t.name);
        let (got, want) = (g.load().unwrap(), t.load().unwrap());
        assert!(got.is_mapped(), "{} is zero-copy", t.name);
        assert_eq!(
            got.to_f32_vec().unwrap(),
            want.to_f32_vec().unwrap(),
            "{}",
            t.name
        );
    }
}

#[test]
fn f32_greedy_from_prompt_matches_transformers() {
    let r = stories_reference();
    let prompt = ids(&r["greedy_prompt"]["input_ids"]);
    let expected = ids(&r["greedy_prompt"]["output_ids"]);
    let (mut m, exec) = (model(F32), exec());
    let mut logits = m.forward(&exec, &prompt, 0, Logits::Last).unwrap();
    let mut out = Vec::new();
    for step in 0..expected.len() {
        out.push(argmax(logits));
        let pos = prompt.len() + step;
        logits = m.forward(&exec, &out[step..], pos, Logits::Last).unwrap();
    }
    assert_eq!(out, expected);
}

/// Teacher-forced logits `[8, 512]` of `model_rel` against the logits file `expected`:
/// the largest absolute error and whether every row keeps its argmax.
fn logits_error(model_rel: &str, expected: &str) -> (f32, bool) {
    logits_error_with(ActivationBits::Int8, model_rel, expected)
}

/// [`logits_error`] with `bits` activations.
fn logits_error_with(bits: ActivationBits, model_rel: &str, expected: &str) -> (f32, bool) {
    let input = ids(&stories_reference()["logits_file"]["input_ids"]);
    let expected = f32_file(&data(expected));
    let got = model(model_rel)
        .forward(&cpu_executor_with(bits), &input, 0, Logits::All)
        .unwrap()
        .to_vec();
    assert_eq!(got.len(), expected.len());
    let err = got.iter().zip(&expected).map(|(a, b)| (a - b).abs());
    let same = got
        .chunks(512)
        .zip(expected.chunks(512))
        .all(|(a, b)| argmax(a) == argmax(b));
    (err.fold(0.0, f32::max), same)
}

const HF_LOGITS: &str = "stories260K/stories260K_logits_f32le.bin";

#[test]
fn q8_0_logits_stay_close_to_fp32() {
    let (err, _) = logits_error(F32, HF_LOGITS);
    assert!(err < 1e-4, "the f32 file is exact: {err}");
    // The same weights as the gguf package decodes them, run by an independent NumPy
    // forward pass (make_stories260k_gguf.py): decoded to f32 first, only f32-vs-f64
    // arithmetic differs. Used in place as q8_0 the weights are dotted against int8
    // activations (as ggml dots Q8_0 against Q8_0), which moves logits of up to 19 by
    // 0.22 (measured; the bound is 0.3) and keeps every argmax; with 16-bit activations
    // by 0.0007 (measured; the bound is 0.002).
    let expected = "gguf/stories260K-q8_0_logits_f32le.bin";
    let err = f32_decoded_error(&load(Q8_0), expected);
    assert!(err < 1e-4, "Q8_0 decoded to f32 against NumPy: {err}");
    let (err, same_argmax) = logits_error(Q8_0, expected);
    assert!(
        err < 0.3 && same_argmax,
        "Q8_0 as q8_0 against NumPy: {err}"
    );
    let (err, _) = logits_error_with(ActivationBits::Int16, Q8_0, expected);
    assert!(
        err < 2e-3,
        "Q8_0 as q8_0, 16-bit activations, against NumPy: {err}"
    );
    // Against transformers' fp32 logits (|x| up to 19.5) the quantisation itself moves
    // them: Q8_0 rounds each weight by up to half a step of 1/127 of its block's absmax.
    // The NumPy pass on the dequantised weights measures that at 0.208, the bound is 0.3;
    // a misread block (swapped halves, a wrong scale) gives errors of several units. The
    // greedy choice must not change.
    let (err, same_argmax) = logits_error(Q8_0, HF_LOGITS);
    assert!(err < 0.3, "Q8_0 max abs logit error {err}");
    assert!(same_argmax, "Q8_0 changes a greedy choice");
}

#[test]
fn q4_0_logits_match_numpy_on_the_same_weights() {
    // Q4_0 has 16 levels per block: against fp32 the logits move by 4.5 on this
    // 260K-parameter model (NumPy measures the same), so the check is against NumPy on the
    // same weights. Loaded as int4-sym-g32 the weights are dotted against int8 activations
    // (as ggml dots Q4_0 against Q8_0), which moves logits of up to 19 by 0.17 (measured;
    // the bound is 0.3) and keeps every argmax; decoded to f32 first, the graph must give
    // NumPy's logits.
    let expected = "gguf/stories260K-q4_0_logits_f32le.bin";
    let (err, same_argmax) = logits_error(Q4_0, expected);
    assert!(
        err < 0.3 && same_argmax,
        "Q4_0 as int4-sym-g32 against NumPy: {err}"
    );
    let err = f32_decoded_error(&load(Q4_0), expected);
    assert!(err < 1e-4, "Q4_0 decoded to f32 against NumPy: {err}");
}

/// Q5_0 tensors are q5_0 views of the file, dotted in place against int8 activations (as
/// ggml dots Q5_0 against Q8_0): against NumPy's logits on the weights as gguf-py decodes
/// them, within 0.3 with every argmax kept; decoded to f32 first, within 1e-4.
#[test]
fn q5_0_loads_in_place_and_matches_numpy() {
    let ckpt = load(Q5_0);
    let wq = tensor(&ckpt, "layers.0.wq");
    assert_eq!(
        (wq.dtype(), wq.is_mapped()),
        (flm_core::DataType::Q5_0, true)
    );
    assert!(ckpt.load_notes().is_empty(), "{:?}", ckpt.load_notes());
    let expected = "gguf/stories260K-q5_0_logits_f32le.bin";
    let (err, same_argmax) = logits_error(Q5_0, expected);
    assert!(
        err < 0.3 && same_argmax,
        "Q5_0 in place against NumPy: {err}"
    );
    let err = f32_decoded_error(&ckpt, expected);
    assert!(err < 1e-4, "Q5_0 decoded to f32 against NumPy: {err}");
}

/// The largest absolute error of the teacher-forced logits of `ckpt` with every weight
/// decoded to f32 first, against the logits file `expected`.
fn f32_decoded_error(ckpt: &Checkpoint, expected: &str) -> f32 {
    let f32_weights = LlamaWeights::from_tensors(&ckpt.config, |name, _| {
        Ok(ckpt
            .tensor(name)
            .unwrap()
            .load()?
            .to_dtype(flm_core::DataType::F32)?)
    })
    .unwrap();
    let input = ids(&stories_reference()["logits_file"]["input_ids"]);
    let got = Llama::new(ckpt.config.clone(), f32_weights)
        .unwrap()
        .forward(&exec(), &input, 0, Logits::All)
        .unwrap()
        .to_vec();
    got.iter()
        .zip(f32_file(&data(expected)))
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
}

/// Dequantised weights are within the quantisation step of the fp32 originals, block by
/// block: checks ggml's block layouts (an f16 scale, then 32 int8 or 16 bytes of nibbles).
/// The step `d` is the block's absmax / 127 for Q8_0 and absmax / 8 for Q4_0 (ggml's
/// `quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`); the bounds allow half a step (a whole
/// one at Q4_0's clamped end) plus the f16 rounding of `d`.
#[test]
fn quantised_blocks_decode_to_the_original_weights() {
    let f32 = load(F32);
    let want = tensor(&f32, "layers.2.wq").to_f32_vec().unwrap();
    for (rel, levels, max_steps) in [(Q8_0, 127.0, 0.6), (Q4_0, 8.0, 1.01)] {
        let got = tensor(&load(rel), "layers.2.wq").to_f32_vec().unwrap();
        for (block, (g, w)) in got.chunks(32).zip(want.chunks(32)).enumerate() {
            let d = w.iter().fold(0.0f32, |m, x| m.max(x.abs())) / levels;
            for (i, (g, w)) in g.iter().zip(w).enumerate() {
                let e = (g - w).abs();
                assert!(
                    e <= max_steps * d + 1e-7,
                    "{rel} block {block}[{i}]: {g} vs {w}"
                );
            }
        }
    }
}

/// Q4_1 runs as int4-g32 (its values exactly) and Q5_1 as int8 per row (decoded, then
/// requantised), each against NumPy's logits on the weights as gguf-py decodes them
/// (`make_stories260k_gguf.py`): only the int8 activations (and for Q5_1 the int8 weight
/// rounding) separate them: measured 0.20 and 0.33 on logits of up to 19 (bounds 0.3 and
/// 0.5), every argmax kept. A misread block moves them by several units.
#[test]
fn q4_1_and_q5_1_logits_match_numpy_on_the_same_weights() {
    for (rel, bound) in [(Q4_1, 0.3), (Q5_1, 0.5)] {
        let name = rel.trim_end_matches(".gguf");
        let (err, same_argmax) = logits_error(rel, &format!("{name}_logits_f32le.bin"));
        eprintln!("{rel}: max abs logit error {err}");
        assert!(err < bound && same_argmax, "{rel} against NumPy: {err}");
    }
}

/// Q4_0 tensors load as int4-sym-g32 and Q4_1 ones as int4-g32, repacked from the file
/// ([`import::Encoding::load_dtype`]); Q8_0 ones as q8_0 and the F16 `ffn_down` are views
/// of it.
#[test]
fn ggml_tensors_load_in_their_flm_dtypes() {
    use flm_core::DataType;
    for (rel, dtype, mapped) in [
        (Q4_0, DataType::I4SymG32, false),
        (Q4_1, DataType::I4G32, false),
        (Q8_0, DataType::Q8_0, true),
    ] {
        let ckpt = load(rel);
        let wq = tensor(&ckpt, "layers.0.wq");
        assert_eq!((wq.dtype(), wq.is_mapped()), (dtype, mapped), "{rel}");
        let down = tensor(&ckpt, "layers.0.w_down");
        assert_eq!(
            (down.dtype(), down.is_mapped()),
            (DataType::F16, true),
            "{rel}"
        );
        let notes = ckpt.load_notes();
        assert!(notes.is_empty(), "{rel}: nothing is lost: {notes:?}");
    }
    let q5_1 = load(Q5_1);
    let wq = tensor(&q5_1, "layers.0.wq");
    assert_eq!(wq.dtype(), DataType::I8);
    let notes = q5_1.load_notes();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].starts_with(
            "31 Q5_1 tensors (6.00 bits/weight) are dequantised and requantised to int8 per row"
        ),
        "{notes:?}"
    );
}

/// `flm convert` without a dtype ([`Recipe::Keep`]) writes each tensor of the Q4_0 file in
/// the dtype it loads as, so the .flm model computes the GGUF model's logits bit for bit.
#[test]
fn q4_0_and_q8_0_convert_to_flm_keeping_each_tensors_type() {
    use flm_core::DataType;
    for (rel, dtype) in [(Q4_0, DataType::I4SymG32), (Q8_0, DataType::Q8_0)] {
        keeps_types_and_logits(
            load(rel),
            rel,
            &[
                ("embedding", dtype),
                ("layers.0.wq", dtype),
                ("layers.0.w_down", DataType::F16),
                ("layers.0.attn_norm", DataType::F32),
            ],
        );
    }
}

/// Converts `ckpt` (the file `rel`) to .flm with [`Recipe::Keep`]: the tensors `types`
/// keep their dtypes, and the .flm model computes the checkpoint's logits bit for bit.
fn keeps_types_and_logits(mut ckpt: Checkpoint, rel: &str, types: &[(&str, flm_core::DataType)]) {
    use flm_models::convert::{convert, Recipe};
    let tok = ckpt.take_tokenizer(&data(rel)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("kept.flm");
    convert(
        &ckpt,
        &tok,
        &out,
        flm_core::DataType::F32,
        Recipe::Keep,
        |_| {},
    )
    .unwrap();
    let flm = import::load(&out).unwrap();
    for &(name, dtype) in types {
        let t = flm.tensor(name.parse().unwrap()).unwrap();
        assert_eq!(t.load().unwrap().dtype(), dtype, "{name}");
    }
    let input = ids(&stories_reference()["logits_file"]["input_ids"]);
    let run = |c: &Checkpoint| {
        let mut m = Llama::new(c.config.clone(), LlamaWeights::load(c).unwrap()).unwrap();
        m.forward(&exec(), &input, 0, Logits::All).unwrap().to_vec()
    };
    assert_eq!(run(&flm), run(&ckpt));
}

/// A one-layer fixture of ggml block types (`file`, with NumPy's logits `expected` on
/// gguf-py's decoding of the same weights): its matrices are used in place from the file
/// as the flm dtypes of `types`; dotted against int8 activations its logits stay within
/// `bound` of NumPy's with every argmax, and decoded to f32 first they are NumPy's;
/// `flm convert` keeps each type, so the .flm model computes the same bits.
fn loads_in_place_and_matches_numpy(
    file: &str,
    expected: &str,
    types: &[(&str, flm_core::DataType)],
    bound: f32,
) {
    let ckpt = load(file);
    for &(name, dtype) in types {
        let t = ckpt.tensor(name.parse().unwrap()).unwrap().load().unwrap();
        assert_eq!((t.dtype(), t.is_mapped()), (dtype, true), "{name}");
    }
    assert!(ckpt.load_notes().is_empty(), "{:?}", ckpt.load_notes());
    let (err, same_argmax) = logits_error(file, expected);
    assert!(err < bound && same_argmax, "{file} against NumPy: {err}");
    let err = f32_decoded_error(&ckpt, expected);
    assert!(err < 1e-4, "{file} decoded to f32 against NumPy: {err}");

    keeps_types_and_logits(ckpt, file, types);
}

/// The K-quant fixture (tools/gguf/make_kquant_fixture.py: one random Llama layer in Q4_K,
/// Q5_K and Q6_K, whole super-blocks), within 0.35 of NumPy (|x| up to 28: measured 0.23,
/// as Q4_0's 0.17 on logits up to 19 above).
#[test]
fn k_quants_load_in_place_and_match_numpy() {
    use flm_core::DataType;
    let types = [
        ("embedding", DataType::Q6K),
        ("layers.0.wq", DataType::Q4K),
        ("layers.0.wk", DataType::Q5K),
        ("layers.0.wv", DataType::Q6K),
        ("layers.0.wo", DataType::Q4K),
        ("layers.0.w_gate", DataType::Q4K),
        ("layers.0.w_up", DataType::Q5K),
        ("layers.0.w_down", DataType::Q6K),
    ];
    loads_in_place_and_matches_numpy(KQUANT, "gguf/tiny-kquant_logits_f32le.bin", &types, 0.35);
}

/// The 4-bit lookup fixture (tools/gguf/make_lut4_fixture.py: the same layer's shapes in
/// IQ4_NL, IQ4_XS and MXFP4), within 0.35 of NumPy as the K-quants (|x| up to 27: measured
/// 0.25).
#[test]
fn iq4_and_mxfp4_load_in_place_and_match_numpy() {
    use flm_core::DataType;
    let types = [
        ("embedding", DataType::IQ4XS),
        ("layers.0.wq", DataType::IQ4NL),
        ("layers.0.wk", DataType::MXFP4),
        ("layers.0.wv", DataType::IQ4XS),
        ("layers.0.wo", DataType::IQ4NL),
        ("layers.0.w_gate", DataType::IQ4NL),
        ("layers.0.w_up", DataType::MXFP4),
        ("layers.0.w_down", DataType::IQ4XS),
    ];
    loads_in_place_and_matches_numpy(LUT4, "gguf/tiny-lut4_logits_f32le.bin", &types, 0.35);
}

#[test]
fn embedded_tokenizer() {
    let tok512 = flm_tokenizer::Tokenizer::from_file(&data("stories260K/tok512.model")).unwrap();
    for rel in [F32, Q8_0, Q4_0] {
        let mut ckpt = load(rel);
        let tok = ckpt.take_tokenizer(&data(rel)).unwrap();
        let once = tok.encode("Once upon a time", false).unwrap();
        assert_eq!(once, [403, 407, 261, 378]);
        assert_eq!(tok.encode("Once upon a time", true).unwrap()[0], 1);
        assert!(tok.add_bos());
        let template = "{% for m in messages %}{{ m['content'] }}{% endfor %}";
        assert_eq!(tok.chat_template(), Some(template));
        for (text, _) in stories_reference()["tok512_encode_cases"]
            .as_object()
            .unwrap()
        {
            let want = tok512.encode(text, false).unwrap();
            assert_eq!(tok.encode(text, false).unwrap(), want, "{rel}: {text:?}");
        }
    }
}

#[test]
fn llama_cpp_vocab_file_encodes_all_46_cases() {
    let tok = import::load_gguf_tokenizer(&data(VOCAB)).unwrap();
    let special = (tok.vocab_size(), tok.bos_id(), tok.eos_id());
    assert_eq!(special, (32000, Some(1), Some(2)));
    for (i, (text, expected)) in llama_cpp_cases().into_iter().enumerate() {
        let got = tok.encode(&text, false).unwrap();
        assert_eq!(got, expected, "case {i}: {text:?}");
        assert_eq!(tok.decode(&got).unwrap(), text, "case {i} decodes back");
    }
    let e = import::load(&data(VOCAB)).unwrap_err().to_string();
    assert!(e.contains("vocabulary-only"), "{e}");
}
