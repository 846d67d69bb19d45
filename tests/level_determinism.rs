//! The same model and prompt give the same logits, to the bit, at every instruction-set
//! level and on every machine: a laptop (AVX2), a server (AVX-512, AMX) and an
//! ARM board (NEON, dotprod) write the same greedy text.
//!
//! Each case decodes [`STEPS`] tokens greedily from a prompt, at every level this CPU has
//! (or the one `FLM_CPU_ISA` names), and digests every logit's bits (SHA-256 of the logits
//! of the prompt's last position and of each step, little-endian f32): the levels must
//! agree on the tokens and the digest. The cases cover every weight dtype the CPU computes
//! with: stories260K in every float dtype (f32, f16, bf16), in int8 and in the three int4
//! forms; its GGUFs (tests/data/gguf, written by gguf-py) in Q8_0, Q4_0, Q4_1, Q5_1 and Q5_0; a
//! one-layer Llama in Q4_K, Q5_K and Q6_K (tests/data/gguf/tiny-kquant.gguf) and one in
//! IQ4_NL, IQ4_XS and MXFP4 (tiny-lut4.gguf); a tiny
//! Qwen3-MoE checkpoint (tests/data/hf-families, made with transformers' own class) as its
//! GGUF; and, where `FLM_SMOLLM2_GGUF` names it, SmolLM2-135M-Instruct in Q4_1 with its
//! Q8_0 embedding as the classifier (the file .ci/run downloads).
//!
//! Across machines, without a file of our own output in the repository: with
//! `FLM_DETERMINISM_OUT=DIR` each test writes its digests as JSON into `DIR`, and with
//! `FLM_DETERMINISM_EXPECT=DIR` it compares with such a file; `.ci/run` writes them on x86
//! and checks the aarch64 runs under qemu against them. Correctness is checked elsewhere
//! (stories260K's tokens against llama2.c, the GGUFs' logits against gguf-py's, the MoE's
//! against transformers); this test checks that every machine computes the same thing.

use std::collections::BTreeMap;

use flm_core::{argmax, DataType, Executor};
use flm_devices::{CpuDevice, Isa};
use flm_models::convert::{convert, Recipe};
use flm_models::import;
use flm_models::llama::Logits;
use flm_models::session::load_model;
use flm_models::SharedModel;
use flm_tests::data;
use flm_tokenizer::Message;
use sha2::{Digest, Sha256};

/// Greedy steps after the prompt.
const STEPS: usize = 200;

/// The greedy tokens after `prompt` and the digest of every logit computed on the way.
fn greedy(model: &SharedModel, isa: Isa, prompt: &[u32]) -> (Vec<u32>, String) {
    let cpu = CpuDevice::with_isa(isa).expect("a supported level");
    let exec = Executor::with_profiling(vec![Box::new(cpu)], false);
    let mut instance = model.instance().expect("an instance");
    let steps = STEPS.min(model.config().max_seq_len - prompt.len());
    let mut hash = Sha256::new();
    let mut tokens = Vec::with_capacity(steps);
    let mut logits = instance
        .forward(&exec, prompt, 0, Logits::Last)
        .expect("prefill")
        .to_vec();
    for step in 0..steps {
        for v in &logits {
            hash.update(v.to_le_bytes());
        }
        let next = argmax(&logits);
        tokens.push(next);
        if step + 1 < steps {
            let pos = prompt.len() + step;
            logits = instance
                .forward(&exec, &[next], pos, Logits::Last)
                .expect("decode step")
                .to_vec();
        }
    }
    let digest = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    (tokens, digest)
}

/// Checks that every level gives `model` the same tokens and digest, records the digest
/// under `case`.
fn check(
    case: String,
    model: &SharedModel,
    prompt: &[u32],
    digests: &mut BTreeMap<String, String>,
) {
    let mut first: Option<(Isa, Vec<u32>, String)> = None;
    for isa in Isa::to_check().expect("FLM_CPU_ISA names a level this CPU has") {
        let (tokens, digest) = greedy(model, isa, prompt);
        match &first {
            None => first = Some((isa, tokens, digest)),
            Some((level, want_tokens, want_digest)) => {
                assert_eq!(
                    &tokens, want_tokens,
                    "{case}: tokens at {isa} against {level}"
                );
                assert_eq!(
                    &digest, want_digest,
                    "{case}: logits at {isa} against {level}"
                );
            }
        }
    }
    let (_, _, digest) = first.expect("at least the portable level");
    digests.insert(case, digest);
}

#[test]
fn every_level_computes_the_same_logits() {
    let mut digests = BTreeMap::new();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let source = data("stories260K/stories260K.bin");
    let mut ckpt = import::load(&source).expect("stories260K");
    let tokenizer = ckpt.take_tokenizer(&source).expect("its tokenizer");
    let prompt = tokenizer
        .encode("Once upon a time", true)
        .expect("the prompt encodes");
    for dtype in [
        DataType::F32,
        DataType::F16,
        DataType::BF16,
        DataType::I8,
        DataType::I4G32,
        DataType::I4SymG64,
        DataType::I4ZpG128,
        DataType::IQ4NL,
        DataType::IQ4XS,
        DataType::MXFP4,
    ] {
        let path = dir.path().join(format!("{dtype}.flm"));
        convert(&ckpt, &tokenizer, &path, dtype, Recipe::Pure, |_| {}).expect("convert");
        let (model, _) = load_model(&path, None, None).expect("load");
        check(
            format!("stories260K {dtype}"),
            &model,
            &prompt,
            &mut digests,
        );
    }
    // The GGUFs of stories260K share its vocabulary, and so does the K-quant Llama.
    for name in ["q8_0", "q4_0", "q4_1", "q5_1", "q5_0"] {
        let path = data(&format!("gguf/stories260K-{name}.gguf"));
        let model = SharedModel::new(&import::load(&path).expect(name)).expect("its graph");
        check(
            format!("stories260K {name} GGUF"),
            &model,
            &prompt,
            &mut digests,
        );
    }
    let kquant = import::load(&data("gguf/tiny-kquant.gguf")).expect("the K-quant Llama");
    let model = SharedModel::new(&kquant).expect("its graph");
    check("tiny-kquant GGUF".into(), &model, &prompt, &mut digests);
    let lut4 = import::load(&data("gguf/tiny-lut4.gguf")).expect("the IQ4/MXFP4 Llama");
    let model = SharedModel::new(&lut4).expect("its graph");
    check("tiny-lut4 GGUF".into(), &model, &prompt, &mut digests);
    // The tiny MoE carries no tokenizer: a prompt of token ids.
    let moe = import::load(&data("hf-families/qwen3_moe.gguf")).expect("the tiny Qwen3-MoE");
    let model = SharedModel::new(&moe).expect("its graph");
    check(
        "qwen3_moe GGUF".into(),
        &model,
        &[1, 17, 42, 99, 5, 23],
        &mut digests,
    );
    compare_across_machines("every_level", &digests);
}

/// SmolLM2-135M-Instruct (Q4_1 matrices, the Q8_0 embedding as its classifier) on a chat
/// prompt, where `FLM_SMOLLM2_GGUF` names the GGUF; skipped with a message otherwise.
#[test]
fn every_level_computes_the_same_smollm2_logits() {
    let Some(path) = std::env::var_os("FLM_SMOLLM2_GGUF") else {
        eprintln!("skipped: FLM_SMOLLM2_GGUF is not set (see .ci/run)");
        return;
    };
    let path = std::path::PathBuf::from(path);
    let tokenizer = import::load_gguf_tokenizer(&path).expect("its tokenizer");
    let messages = [Message::new(
        "user",
        "Write a short story about a robot who learns to paint.",
    )];
    let prompt = tokenizer
        .encode_chat(&messages, true)
        .expect("the chat prompt");
    let model = SharedModel::new(&import::load(&path).expect("SmolLM2")).expect("its graph");
    let mut digests = BTreeMap::new();
    check(
        "SmolLM2 Q4_1 GGUF".into(),
        &model,
        &prompt.ids,
        &mut digests,
    );
    compare_across_machines("smollm2", &digests);
}

/// Writes `digests` to `$FLM_DETERMINISM_OUT/{name}.json` and compares them with
/// `$FLM_DETERMINISM_EXPECT/{name}.json`, for each variable that is set.
fn compare_across_machines(name: &str, digests: &BTreeMap<String, String>) {
    let json = serde_json::to_string_pretty(digests).expect("digests as JSON");
    if let Some(dir) = std::env::var_os("FLM_DETERMINISM_OUT") {
        let path = std::path::Path::new(&dir).join(format!("{name}.json"));
        std::fs::create_dir_all(&dir).expect("the digests' directory");
        std::fs::write(&path, &json).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    if let Some(dir) = std::env::var_os("FLM_DETERMINISM_EXPECT") {
        let path = std::path::Path::new(&dir).join(format!("{name}.json"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let want: BTreeMap<String, String> = serde_json::from_str(&text).expect("digests");
        for (case, digest) in digests {
            assert_eq!(
                Some(digest),
                want.get(case),
                "{case}: against {}",
                path.display()
            );
        }
    }
}
