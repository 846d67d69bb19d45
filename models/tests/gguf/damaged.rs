//! Damaged and unsupported GGUF files: truncations, bad headers, absurd counts and lengths,
//! offsets past the end, unsupported types and architectures, random corruption. Each is
//! refused with a clear message, never a panic (the fixtures are edited in memory).

use flm_models::import::{self, Checkpoint};
use flm_models::llama::LlamaWeights;
use flm_models::Error;
use flm_tests::data;

use super::{F32, GPT2, Q8_0, VOCAB};

fn read(rel: &str) -> Vec<u8> {
    std::fs::read(data(rel)).unwrap()
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).unwrap()
}

/// The offset just past the GGUF string `s` (its bytes, after the u64 length).
fn after(bytes: &[u8], s: &str) -> usize {
    let mut key = (s.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(s.as_bytes());
    find(bytes, &key) + key.len()
}

/// Replaces the string value of metadata `key` (the file grows or shrinks).
fn set_str(bytes: &mut Vec<u8>, key: &str, value: &str) {
    let at = after(bytes, key) + 4;
    let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
    let mut new = (value.len() as u64).to_le_bytes().to_vec();
    new.extend_from_slice(value.as_bytes());
    bytes.splice(at..at + 8 + len, new);
}

/// A copy of `bytes` with `new` written over it at `at`.
fn edited(bytes: &[u8], at: usize, new: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[at..at + new.len()].copy_from_slice(new);
    b
}

/// Loads `bytes` as a file: the checkpoint, or the error message.
fn try_load(bytes: &[u8]) -> Result<Checkpoint, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, bytes).unwrap();
    match import::load(&path) {
        Ok(c) => LlamaWeights::load(&c).map(|_| c).map_err(|e| e.to_string()),
        Err(e @ (Error::Format { .. } | Error::Config(_) | Error::Core(_))) => Err(e.to_string()),
        Err(e) => panic!("unexpected error kind: {e}"),
    }
}

/// Asserts that `bytes` do not load, with an error that mentions `needle`.
fn refused(bytes: &[u8], needle: &str) {
    let e = try_load(bytes).expect_err("a damaged file must not load");
    assert!(e.contains(needle), "expected {needle:?} in: {e}");
}

/// The error of `import::load_gguf_tokenizer` on `bytes`.
fn tokenizer_error(bytes: &[u8]) -> String {
    let path = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(path.path(), bytes).unwrap();
    let result = import::load_gguf_tokenizer(path.path());
    result.expect_err("must not load").to_string()
}

/// Where the tensor data starts in the Q8_0 fixture: after the last tensor info (1-D:
/// u32 n_dims, u64 ne, u32 type, u64 offset), aligned to 32.
fn data_start(bytes: &[u8]) -> usize {
    (after(bytes, "output_norm.weight") + 24).div_ceil(32) * 32
}

#[test]
fn truncated_files_are_refused() {
    let bytes = read(Q8_0);
    let start = data_start(&bytes);
    for len in [4, 10, 23, 40, 1000, start - 40] {
        let e = try_load(&bytes[..len]).err().unwrap();
        let clear = e.contains("truncated: ") || e.contains("(truncated or corrupted file)");
        assert!(clear && e.contains("invalid GGUF file: "), "{len}: {e}");
    }
    for len in [start + 10, bytes.len() / 2, bytes.len() - 1] {
        refused(&bytes[..len], "past the end of the file");
    }
}

#[test]
fn bad_headers_are_refused() {
    let bytes = read(Q8_0);
    let edit = |at: usize, new: &[u8]| edited(&bytes, at, new);
    assert!(tokenizer_error(&edit(0, b"GGUX")).contains("magic \"GGUF\""));
    assert!(try_load(&edit(0, b"GGUX")).is_err(), "not read as GGUF");
    refused(
        &edit(4, &1u32.to_le_bytes()),
        "version 1 is not supported (2 and 3 are)",
    );
    refused(
        &edit(4, &3u32.to_be_bytes()),
        "big-endian GGUF files are not supported",
    );
    let huge = (1u64 << 60).to_le_bytes();
    refused(&edit(16, &huge), "kv_count 1152921504606846976 cannot fit");
    refused(
        &edit(8, &huge),
        "tensor_count 1152921504606846976 cannot fit",
    );
    let e = (1u64 << 40).to_le_bytes();
    refused(
        &edit(24, &e),
        "metadata key length 1099511627776 cannot fit",
    );
}

/// A GGUF v3 file of no tensors and one metadata key "k": value type `ty`, then `value`.
fn one_kv(ty: u32, value: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(
        3u32.to_le_bytes()
            .iter()
            .chain(&0u64.to_le_bytes())
            .chain(&1u64.to_le_bytes()),
    );
    b.extend(
        1u64.to_le_bytes()
            .iter()
            .chain(b"k")
            .chain(&ty.to_le_bytes())
            .chain(value),
    );
    b
}

#[test]
fn metadata_bombs_are_refused() {
    // 5M one-byte values: more than the 4M metadata values allowed.
    let mut array = 0u32.to_le_bytes().to_vec();
    array.extend(
        5_000_000u64
            .to_le_bytes()
            .iter()
            .chain(&vec![0u8; 5_000_000]),
    );
    let e = tokenizer_error(&one_kv(9, &array));
    assert!(
        e.contains("metadata k: more than 4194304 metadata values"),
        "{e}"
    );
    // Arrays nested 20 deep.
    let nested: Vec<u8> = (0..20)
        .flat_map(|_| [9, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0])
        .collect();
    let e = tokenizer_error(&one_kv(9, &nested));
    assert!(e.contains("arrays nested deeper than 8"), "{e}");
    assert!(tokenizer_error(&one_kv(7, &[2])).contains("bool value 2"));
    assert!(tokenizer_error(&one_kv(13, &[])).contains("unknown metadata value type 13"));
}

#[test]
fn bad_metadata_and_tensor_infos_are_refused() {
    let bytes = read(Q8_0);
    let edit = |at: usize, new: &[u8]| edited(&bytes, at, new);
    // The token list: after the key, u32 array type, u32 element type, u64 length, then
    // the first token's u64 length.
    let tokens = after(&bytes, "tokenizer.ggml.tokens");
    let e = (1u64 << 50).to_le_bytes();
    refused(
        &edit(tokens + 8, &e),
        "metadata tokenizer.ggml.tokens: array length",
    );
    let e = (bytes.len() as u64).to_le_bytes();
    refused(&edit(tokens + 16, &e), "string length");
    // token_embd.weight's info: u32 n_dims, 2 × u64 ne, u32 type, u64 offset.
    let info = after(&bytes, "token_embd.weight");
    let e = (1u64 << 40).to_le_bytes();
    refused(
        &edit(info + 24, &e),
        "data offset 1099511627776 is past the end",
    );
    let past = (bytes.len().div_ceil(32) * 32 - data_start(&bytes)) as u64;
    refused(
        &edit(info + 24, &past.to_le_bytes()),
        "past the end of the file",
    );
    refused(
        &edit(info + 24, &7u64.to_le_bytes()),
        "not a multiple of the alignment 32",
    );
    refused(&edit(info, &99u32.to_le_bytes()), "99 dimensions");
    // A type flm does not read (IQ2_XXS), and one whose 256-value blocks do not fit the
    // embedding's rows of 64 values (Q4_K).
    refused(
        &edit(info + 20, &16u32.to_le_bytes()),
        "token_embd.weight: ggml type IQ2_XXS (16)",
    );
    refused(
        &edit(info + 20, &12u32.to_le_bytes()),
        "token_embd.weight: rows of 64 values do not fill 256-value blocks",
    );
    // Architecture "mamba" (same length, so the file stays consistent).
    let at = after(&bytes, "general.architecture") + 12;
    refused(
        &edit(at, b"mamba"),
        "unsupported model: architecture \"mamba\"",
    );
    let at = after(&bytes, "llama.block_count") + 4;
    let e = 60_000u32.to_le_bytes();
    refused(
        &edit(at, &e),
        "block_count 60000 implies at least 360002 tensors",
    );
    // Refused by the tensors present before any list is sized by the count.
    let e = 1_000_000u32.to_le_bytes();
    refused(
        &edit(at, &e),
        "block_count 1000000 implies at least 6000002 tensors",
    );
}

/// Phi-3's LongRoPE factors and a mixture's stacked experts that do not fit the
/// configuration are refused with the tensor's name.
#[test]
fn bad_factors_and_stacked_experts_are_refused() {
    // A tensor's info after its name: u32 n_dims, a u64 ne per dimension, u32 type.
    let cases: [(&str, &str, usize, &[u8], &str); 2] = [
        // rope_factors_long.weight (1 dimension): type F16 instead of F32.
        (
            "hf-families/phi3.gguf",
            "rope_factors_long.weight",
            12,
            &1u32.to_le_bytes(),
            "rope_factors_long.weight: not an F32 vector",
        ),
        // blk.0.ffn_up_exps.weight: its third ne, 3 experts instead of 4.
        (
            "hf-families/qwen2_moe.gguf",
            "blk.0.ffn_up_exps.weight",
            20,
            &3u64.to_le_bytes(),
            "tensor blk.0.ffn_up_exps.weight of ne [64, 32, 3] does not hold",
        ),
    ];
    for (file, tensor, offset, new, why) in cases {
        let bytes = read(file);
        assert!(try_load(&bytes).is_ok(), "{file}");
        refused(&edited(&bytes, after(&bytes, tensor) + offset, new), why);
    }
    let moe = read("hf-families/qwen2_moe.gguf");
    let at = after(&moe, "qwen2moe.expert_used_count") + 4;
    refused(&edited(&moe, at, &5u32.to_le_bytes()), "top_k = 5");
}

/// `bytes` with u32 metadata `keys` added after the last key, and a string key of padding
/// that makes the insertion a multiple of the 32-byte alignment, so that the tensor data
/// moves with the header and every offset stays right. `first_tensor`: the name of the
/// file's first tensor info, where the metadata ends.
fn with_u32_keys(bytes: &[u8], first_tensor: &str, keys: &[(&str, u32)]) -> Vec<u8> {
    let kv = |key: &str, ty: u32, value: &[u8]| {
        let mut b = (key.len() as u64).to_le_bytes().to_vec();
        b.extend(key.as_bytes().iter().chain(&ty.to_le_bytes()).chain(value));
        b
    };
    let mut added: Vec<u8> = keys
        .iter()
        .flat_map(|(k, v)| kv(k, 4, &v.to_le_bytes()))
        .collect();
    // The padding key: u64 length + "pad", u32 type, u64 length + the string.
    let pad = (32 - (added.len() + 23) % 32) % 32;
    let mut string = (pad as u64).to_le_bytes().to_vec();
    string.extend(std::iter::repeat_n(b' ', pad));
    added.extend(kv("pad", 8, &string));
    let at = after(bytes, first_tensor) - first_tensor.len() - 8;
    let mut b = bytes.to_vec();
    b.splice(at..at, added);
    let count = u64::from_le_bytes(b[16..24].try_into().unwrap()) + keys.len() as u64 + 1;
    b[16..24].copy_from_slice(&count.to_le_bytes());
    b
}

/// `block_count` against the layers' tensors, and `expert_count` against the expert
/// tensors: each mismatch is refused with the tensor or the layer it concerns, where it
/// loaded before with layers or experts silently dropped.
#[test]
fn block_and_expert_counts_must_match_the_tensors() {
    let stories = read(F32);
    assert!(try_load(&with_u32_keys(&stories, "token_embd.weight", &[])).is_ok());
    let at = after(&stories, "llama.block_count") + 4;
    refused(
        &edited(&stories, at, &4u32.to_le_bytes()),
        "tensor blk.4.attn_norm.weight is of layer 4, but llama.block_count is 4",
    );
    refused(
        &edited(&stories, at, &6u32.to_le_bytes()),
        "llama.block_count is 6, but the file has no tensor of layer 5 (blk.5.*)",
    );
    // A dense model that claims experts.
    let claims = [("llama.expert_count", 4), ("llama.expert_used_count", 2)];
    refused(
        &with_u32_keys(&stories, "token_embd.weight", &claims),
        "llama.expert_count is 4, but the file has no expert tensors",
    );
    // A mixture whose expert_count is 0.
    let moe = read("hf-families/qwen2_moe.gguf");
    let at = after(&moe, "qwen2moe.expert_count") + 4;
    refused(
        &edited(&moe, at, &0u32.to_le_bytes()),
        "tensor blk.0.ffn_gate_inp.weight belongs to a mixture of experts, but \
         qwen2moe.expert_count is absent or 0",
    );
}

#[test]
fn other_tokenizer_kinds_leave_no_tokenizer() {
    // "llama" -> "bert" and one byte more in the name: the data section does not move.
    let mut b = read(F32);
    set_str(&mut b, "tokenizer.ggml.model", "bert");
    set_str(&mut b, "general.name", "stories260K!");
    assert!(try_load(&b).unwrap().tokenizer.is_none());
    let e = tokenizer_error(&b);
    assert!(
        e.contains("tokenizer.ggml.model \"bert\" is not supported yet"),
        "{e}"
    );
    // A byte-level BPE pre-tokeniser flm does not implement, and a name llama.cpp does
    // not know: no tokenizer either, and the error names it.
    for pre in ["kimi-k2", "no-such-pre"] {
        let mut b = read(GPT2);
        set_str(&mut b, "tokenizer.ggml.pre", pre);
        let e = tokenizer_error(&b);
        assert!(
            e.contains(&format!(
                "tokenizer.ggml.pre \"{pre}\": not a pre-tokenizer"
            )),
            "{e}"
        );
    }
}

#[test]
fn malformed_byte_level_vocabularies_are_clear_errors() {
    // A "gpt2" tokenizer without merges (stories260K's SentencePiece pieces).
    let mut b = read(F32);
    set_str(&mut b, "tokenizer.ggml.model", "gpt2");
    set_str(&mut b, "general.name", "stories260K!");
    refused(&b, "invalid tokenizer metadata: no tokenizer.ggml.merges");
    // A merge naming a missing token ("Ġ t" -> "Ġ q", same length).
    let mut b = read(GPT2);
    let at = find(&b, "\u{120} t".as_bytes());
    b[at + 3] = b'\x01';
    let e = tokenizer_error(&b);
    assert!(e.contains("is not a token"), "{e}");
    // A normal token outside GPT-2's byte spelling: token 0, "!", made a plain space
    // (spelled "Ġ" there).
    let mut b = read(GPT2);
    let at = after(&b, "tokenizer.ggml.tokens") + 4 + 4 + 8 + 8;
    b[at] = b' ';
    let e = tokenizer_error(&b);
    assert!(e.contains("not spelled in GPT-2's byte characters"), "{e}");
}

/// Random damage never panics: every outcome is a checkpoint or an error.
#[test]
fn corrupted_files_never_panic() {
    let original = read(Q8_0);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    // The header and directory are where parsing can go wrong.
    let start = data_start(&original);
    for _ in 0..300 {
        let mut b = original.clone();
        for _ in 0..1 + next(4) {
            let i = next(start);
            b[i] = next(256) as u8;
        }
        let _ = try_load(&b);
        let _ = try_load(&b[..next(b.len())]);
    }
    // The vocabulary: a tokenizer (usable) or an error.
    let vocab = read(VOCAB);
    for _ in 0..60 {
        let mut b = vocab.clone();
        b[next(vocab.len())] = next(256) as u8;
        let path = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(path.path(), &b[..vocab.len() - next(2) * next(vocab.len())]).unwrap();
        if let Ok(tok) = import::load_gguf_tokenizer(path.path()) {
            let ids = tok.encode("Once upon a time, 🦙", true).unwrap();
            tok.decode(&ids).unwrap();
        }
    }
}

/// A GGUF file whose `tokenizer.chat_template` loops for ever (it once hung `flm chat`
/// and the server) is refused when its tokenizer loads, the error naming the
/// metadata key and the render budget, within a second or two.
#[test]
fn a_hostile_chat_template_is_refused_when_the_tokenizer_loads() {
    let mut bytes = read(F32);
    let old = "{% for m in messages %}{{ m['content'] }}{% endfor %}";
    let mut hostile = "{% for i in range(100000) %}{% for j in range(100000) %}{% set k = j %}\
                       {% endfor %}{% endfor %}"
        .to_string();
    // The same length modulo the tensor data's alignment of 32, so the data stays aligned.
    while !(hostile.len() - old.len()).is_multiple_of(32) {
        hostile.push(' ');
    }
    set_str(&mut bytes, "tokenizer.chat_template", &hostile);
    let start = std::time::Instant::now();
    let e = tokenizer_error(&bytes);
    assert!(
        e.contains("chat template (GGUF metadata `tokenizer.chat_template`)"),
        "{e}"
    );
    assert!(e.contains("out of fuel"), "{e}");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}
