//! Every error kind a model file can cause reaches a C caller of `flm_model_load` as the
//! status include/flm.h documents for it: FLM_STATUS_FORMAT for malformed .flm,
//! GGUF, safetensors, PyTorch pickle and llama2.c files and tokenizers, FLM_STATUS_IO for a
//! file that cannot be read, never FLM_STATUS_INTERNAL ("a bug of flm"), and always with a
//! message of the call's own. The statuses of bad arguments (NULL pointers, invalid UTF-8,
//! out-of-range ids and options, small buffers, a full context) are checked by the C host
//! program (tests/c/flm_test.c, `check`).
//!
//! Besides the named malformations, sweeps over the bytes of each format's header cut the
//! file at many lengths and flip bytes: each result must be FLM_STATUS_OK or
//! FLM_STATUS_FORMAT.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use flm::{flm_last_error, flm_model_free, flm_model_load, FlmModel, FlmModelOptions, FlmStatus};
use flm_core::DataType;
use flm_models::convert::Recipe;
use flm_tests::{convert_stories260k, data};
use serde_json::Value;

/// The message of `flm_model_load` with a NULL path.
const NULL_PATH: &str = "path is NULL";

/// `flm_model_load(path)` with a 1-thread pool: the status and the message of the last
/// error (set first by a failing call with a known message, [`NULL_PATH`], so that a
/// status without a message of its own shows).
fn load(path: &Path) -> (FlmStatus, String) {
    let path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let options = FlmModelOptions {
        threads: 1,
        device: std::ptr::null(),
        context: 0,
        activation_bits: 0,
        kv_dtype: std::ptr::null(),
        gpu_layers: std::ptr::null(),
    };
    let mut model: *mut FlmModel = std::ptr::null_mut();
    // SAFETY: a NULL path is refused (this sets the last error to a known message); the
    // output pointer is valid for a write.
    let status = unsafe { flm_model_load(std::ptr::null(), &options, &mut model) };
    assert_eq!(status, FlmStatus::NullPointer);
    // SAFETY: flm_last_error returns a NUL-terminated string valid until the next failing
    // call on this thread.
    assert_eq!(
        unsafe { CStr::from_ptr(flm_last_error()) }.to_str(),
        Ok(NULL_PATH)
    );
    // SAFETY: a NUL-terminated path, valid options and output pointer.
    let status = unsafe { flm_model_load(path.as_ptr(), &options, &mut model) };
    if status == FlmStatus::Ok {
        // SAFETY: a live handle from flm_model_load, freed once.
        unsafe { flm_model_free(model) };
    } else {
        assert!(model.is_null());
    }
    // SAFETY: flm_last_error returns a NUL-terminated string valid until the next failing
    // call on this thread.
    let message = unsafe { CStr::from_ptr(flm_last_error()) };
    (status, message.to_string_lossy().into_owned())
}

/// Asserts that loading `path` fails with `status` and a message of its own, which never
/// prints a Rust `None`.
fn expect(path: &Path, status: FlmStatus, what: &str) {
    let (got, message) = load(path);
    assert_eq!(got, status, "{what}: {message}");
    assert!(
        message != NULL_PATH && !message.is_empty(),
        "{what}: the message is not the call's own: {message:?}"
    );
    assert!(!message.contains("None"), "{what}: {message}");
}

/// Asserts that loading `path` succeeds or fails with FLM_STATUS_FORMAT.
fn expect_ok_or_format(path: &Path, what: &str) {
    let (got, message) = load(path);
    assert!(
        got == FlmStatus::Ok || got == FlmStatus::Format,
        "{what}: status {got:?}: {message}"
    );
}

/// Copies the files of `src` (a directory) into `dst`.
fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
        }
    }
}

/// Writes `bytes` to `path`, loads it and checks the status with `check`.
fn with_bytes(path: &Path, bytes: &[u8], check: impl FnOnce(&Path)) {
    std::fs::write(path, bytes).unwrap();
    check(path);
}

/// Cuts `bytes` at lengths spread over `0..limit` (every `step`) and at the last byte,
/// and flips every byte of `0..flip_limit` in turn: each load must give OK or FORMAT, and
/// every cut must give FORMAT.
fn sweep(path: &Path, bytes: &[u8], limit: usize, step: usize, flip_limit: usize) {
    let lengths = (0..limit.min(bytes.len())).step_by(step);
    for len in lengths.chain([bytes.len() - 1]) {
        with_bytes(path, &bytes[..len], |p| {
            expect(p, FlmStatus::Format, &format!("cut at {len}"))
        });
    }
    for i in 0..flip_limit.min(bytes.len()) {
        let mut flipped = bytes.to_vec();
        flipped[i] ^= 0xa5;
        with_bytes(path, &flipped, |p| {
            expect_ok_or_format(p, &format!("byte {i} flipped"))
        });
    }
}

/// A .flm file split into its header fields, metadata and data section.
struct Flm {
    head: [u8; 16],
    meta: Value,
    data: Vec<u8>,
}

impl Flm {
    fn parse(bytes: &[u8]) -> Flm {
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap()) as usize;
        let (meta_len, data_offset) = (u64_at(16), u64_at(24));
        Flm {
            head: bytes[..16].try_into().unwrap(),
            meta: serde_json::from_slice(&bytes[32..32 + meta_len]).unwrap(),
            data: bytes[data_offset..].to_vec(),
        }
    }

    /// The file, its data section placed after the metadata at the next multiple of 64.
    fn bytes(&self) -> Vec<u8> {
        let meta = serde_json::to_vec(&self.meta).unwrap();
        let data_offset = (32 + meta.len()).next_multiple_of(64);
        let mut out = self.head.to_vec();
        out.extend((meta.len() as u64).to_le_bytes());
        out.extend((data_offset as u64).to_le_bytes());
        out.extend(&meta);
        out.resize(data_offset, 0);
        out.extend(&self.data);
        out
    }

    fn tensor(&mut self, i: usize) -> &mut Value {
        &mut self.meta["tensors"][i]
    }
}

#[test]
fn malformed_flm_files_are_format_errors() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.flm");
    convert_stories260k(&good, DataType::F32, Recipe::Pure);
    assert_eq!(load(&good).0, FlmStatus::Ok);
    let bytes = std::fs::read(&good).unwrap();
    let path = dir.path().join("bad.flm");
    let edited = |edit: &dyn Fn(&mut Flm), what: &str| {
        let mut flm = Flm::parse(&bytes);
        edit(&mut flm);
        with_bytes(&path, &flm.bytes(), |p| expect(p, FlmStatus::Format, what));
    };
    edited(&|f| f.head[8] = 3, "a newer major version");
    edited(&|f| f.head[12] = 1, "a reserved field that is not 0");
    edited(
        &|f| f.tensor(0)["size"] = 4.into(),
        "a tensor size that does not fit",
    );
    edited(
        &|f| f.tensor(0)["shape"] = serde_json::json!([usize::MAX, 4]),
        "a shape that overflows",
    );
    edited(
        &|f| f.tensor(0)["dtype"] = "int3".into(),
        "an unknown dtype",
    );
    edited(
        &|f| f.tensor(1)["offset"] = f.tensor(0)["offset"].clone(),
        "overlapping tensors",
    );
    edited(
        &|f| f.tensor(1)["offset"] = 64.into(),
        "a tensor misplaced within another",
    );
    edited(
        &|f| f.tensor(2)["name"] = f.tensor(1)["name"].clone(),
        "a tensor listed twice",
    );
    edited(
        &|f| f.tensor(1)["offset"] = (1u64 << 40).into(),
        "a tensor past the end",
    );
    edited(
        &|f| f.tensor(1)["offset"] = 65.into(),
        "a misaligned tensor",
    );
    edited(
        &|f| {
            f.meta["tensors"].as_array_mut().unwrap().pop();
        },
        "a missing tensor",
    );
    edited(
        &|f| {
            // [hidden, dim] read as [dim, hidden]: the same size, the wrong shape.
            let tensors = f.meta["tensors"].as_array_mut().unwrap();
            let t = tensors
                .iter_mut()
                .find(|t| t["name"] == "layers.0.w_gate")
                .unwrap();
            let shape = t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .rev()
                .cloned()
                .collect();
            t["shape"] = Value::Array(shape);
        },
        "a tensor whose shape does not fit the model",
    );
    edited(
        &|f| f.meta["config"]["n_heads"] = 0.into(),
        "a configuration of 0 heads",
    );
    edited(
        &|f| f.meta["config"]["vocab_size"] = 10.into(),
        "a vocabulary smaller than the tokenizer's",
    );
    edited(&|f| f.meta["config"] = Value::Null, "no configuration");
    edited(
        &|f| f.meta["tokenizer"]["kind"] = 5.into(),
        "a malformed tokenizer",
    );
    edited(
        &|f| f.data.truncate(f.data.len() / 2),
        "a truncated data section",
    );
    // The raw header: the data offset misaligned, a huge metadata length, JSON garbage,
    // non-zero padding after the metadata.
    let raw_edited = |edit: &dyn Fn(&mut [u8]), what: &str| {
        let mut raw = bytes.clone();
        edit(&mut raw);
        with_bytes(&path, &raw, |p| expect(p, FlmStatus::Format, what));
    };
    raw_edited(&|raw| raw[24] ^= 1, "a misaligned data offset");
    raw_edited(
        &|raw| raw[16..24].copy_from_slice(&u64::MAX.to_le_bytes()),
        "a huge metadata length",
    );
    raw_edited(&|raw| raw[32] = b'x', "metadata that is not JSON");
    let flm = Flm::parse(&bytes);
    let meta_end = 32 + serde_json::to_vec(&flm.meta).unwrap().len();
    let data_offset = bytes.len() - flm.data.len();
    if meta_end < data_offset {
        raw_edited(
            &|raw| raw[data_offset - 1] = 7,
            "non-zero padding after the metadata",
        );
    }
    raw_edited(&|raw| raw[1] = b'X', "a wrong magic");
    sweep(&path, &bytes, data_offset + 256, 61, 64);
}

#[test]
fn malformed_gguf_files_are_format_errors() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(data("gguf/stories260K-q8_0.gguf")).unwrap();
    let path = dir.path().join("bad.gguf");
    with_bytes(&path, &bytes, |p| assert_eq!(load(p).0, FlmStatus::Ok));
    // Header: magic, u32 version, u64 tensor count, u64 key-value count.
    for (at, value, what) in [
        (4, 99u64, "version 99"),
        (8, u64::MAX, "a huge tensor count"),
        (16, u64::MAX, "a huge key-value count"),
        (16, 0, "no key-value pairs"),
    ] {
        let mut raw = bytes.clone();
        if at == 4 {
            raw[4..8].copy_from_slice(&(value as u32).to_le_bytes());
        } else {
            raw[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }
        with_bytes(&path, &raw, |p| expect(p, FlmStatus::Format, what));
    }
    sweep(&path, &bytes, 4096, 37, 64);
}

#[test]
fn malformed_safetensors_files_and_tokenizers_are_format_errors() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("hf");
    copy_dir(&data("hf-stories260K"), &model);
    assert_eq!(load(&model).0, FlmStatus::Ok);
    let weights = model.join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut raw = bytes.clone();
    raw[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&weights, &raw).unwrap();
    expect(&model, FlmStatus::Format, "a huge header length");
    let mut raw = bytes.clone();
    raw[8] = b'x';
    std::fs::write(&weights, &raw).unwrap();
    expect(&model, FlmStatus::Format, "a header that is not JSON");
    for len in (0..header_len + 8).step_by(53).chain([bytes.len() - 1]) {
        std::fs::write(&weights, &bytes[..len]).unwrap();
        expect(
            &model,
            FlmStatus::Format,
            &format!("safetensors cut at {len}"),
        );
    }
    for i in (0..header_len + 8).step_by(7) {
        let mut flipped = bytes.clone();
        flipped[i] ^= 0xa5;
        std::fs::write(&weights, &flipped).unwrap();
        expect_ok_or_format(&model, &format!("safetensors byte {i} flipped"));
    }
    std::fs::write(&weights, &bytes).unwrap();
    for (file, content) in [
        ("config.json", "{\"hidden_size\": \"wide\"}"),
        ("tokenizer.json", "{\"model\": 3}"),
        ("tokenizer.model", "\u{8}\u{1}garbage"),
    ] {
        let saved = std::fs::read(model.join(file)).unwrap();
        std::fs::write(model.join(file), content).unwrap();
        let (status, message) = load(&model);
        // Either tokenizer file is enough: spoiling one may leave the other to load from.
        assert!(
            status == FlmStatus::Format || (status == FlmStatus::Ok && file != "config.json"),
            "{file}: {status:?}: {message}"
        );
        std::fs::write(model.join(file), saved).unwrap();
    }
    std::fs::remove_file(model.join("tokenizer.model")).unwrap();
    std::fs::write(model.join("tokenizer.json"), "{\"model\": 3}").unwrap();
    expect(&model, FlmStatus::Format, "a malformed tokenizer.json");
}

#[test]
fn malformed_pickles_are_format_errors() {
    let dir = tempfile::tempdir().unwrap();
    for fixture in ["malicious", "bogus-global"] {
        expect(
            &data(&format!("pytorch/{fixture}")),
            FlmStatus::Format,
            fixture,
        );
    }
    let model = dir.path().join("pt");
    copy_dir(&data("pytorch/stories260K"), &model);
    assert_eq!(load(&model).0, FlmStatus::Ok);
    let weights = model.join("pytorch_model.bin");
    let bytes = std::fs::read(&weights).unwrap();
    for len in (0..bytes.len()).step_by(4099).chain([bytes.len() - 1]) {
        std::fs::write(&weights, &bytes[..len]).unwrap();
        expect(&model, FlmStatus::Format, &format!("pickle cut at {len}"));
    }
    // The zip's local header and the start of data.pkl (the pickle opcodes).
    for i in (0..512).step_by(3) {
        let mut flipped = bytes.clone();
        flipped[i] ^= 0xa5;
        std::fs::write(&weights, &flipped).unwrap();
        expect_ok_or_format(&model, &format!("pickle byte {i} flipped"));
    }
}

#[test]
fn malformed_llama2c_files_are_format_errors() {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&data("stories260K"), dir.path());
    let path = dir.path().join("stories260K.bin");
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(load(&path).0, FlmStatus::Ok);
    // The header: 7 int32 (dim, hidden, layers, heads, kv heads, vocab, seq len).
    for (field, value, what) in [
        (0, -64, "a negative dimension"),
        (2, 0, "no layers"),
        (3, 7, "heads that do not divide the dimension"),
        (5, i32::MAX, "a huge vocabulary"),
        (6, 0, "a context of 0"),
    ] {
        let mut raw = bytes.clone();
        raw[field * 4..field * 4 + 4].copy_from_slice(&i32::to_le_bytes(value));
        with_bytes(&path, &raw, |p| expect(p, FlmStatus::Format, what));
    }
    std::fs::write(dir.path().join("tok512.bin"), b"\x05").unwrap();
    with_bytes(&path, &bytes, |p| {
        expect(p, FlmStatus::Format, "a truncated tokenizer")
    });
    copy_dir(&data("stories260K"), dir.path());
    sweep(&path, &bytes, 4096, 29, 28);
}

#[test]
fn unreadable_files_are_io_errors() {
    let dir = tempfile::tempdir().unwrap();
    expect(
        &dir.path().join("missing.flm"),
        FlmStatus::Io,
        "a missing file",
    );
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    expect(
        &file.join("model.flm"),
        FlmStatus::Io,
        "a path through a file",
    );
}
