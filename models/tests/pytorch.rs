//! PyTorch `torch.save` checkpoints (fixtures: tests/data/pytorch, see its SOURCES.md):
//! the stories260K state dict loads and generates what transformers generates, and
//! malicious, truncated or corrupted files are refused with an error, never a panic.

use std::io::{Cursor, Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use flm_models::import::{self, Checkpoint, Format};
use flm_models::llama::{Llama, LlamaWeights};
use flm_tests::{cpu_executor, data, greedy_on, ids, stories_reference};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipArchive, ZipWriter};

/// Prefills `prompt`, then decodes `steps` greedy tokens one at a time.
fn greedy(ckpt: &Checkpoint, prompt: &[u32], steps: usize) -> Vec<u32> {
    let mut model = Llama::new(ckpt.config.clone(), LlamaWeights::load(ckpt).unwrap()).unwrap();
    greedy_on(&cpu_executor(), &mut model, prompt, steps)
}

/// `greedy_prompt` of stories260K_reference.json: its input and output ids.
fn reference() -> (Vec<u32>, Vec<u32>) {
    let json = stories_reference();
    let case = &json["greedy_prompt"];
    (ids(&case["input_ids"]), ids(&case["output_ids"]))
}

#[test]
fn single_and_sharded_checkpoints_match_transformers() {
    let (prompt, expected) = reference();
    assert_eq!(prompt, [1, 403, 407, 261, 378]);
    let safetensors = import::load(&data("hf-stories260K")).unwrap();
    for dir in ["pytorch/stories260K", "pytorch/stories260K-sharded"] {
        let ckpt = import::load(&data(dir)).unwrap();
        assert_eq!(ckpt.format, Format::HuggingFace, "{dir}");
        assert_eq!(ckpt.tensors.len(), safetensors.tensors.len(), "{dir}");
        for t in &safetensors.tensors {
            let got = ckpt.tensor(t.name.parse().unwrap()).unwrap();
            assert_eq!(
                (&got.shape, got.bytes().unwrap()),
                (&t.shape, t.bytes().unwrap()),
                "{dir} {}",
                t.name
            );
        }
        assert!(
            LlamaWeights::load(&ckpt).unwrap().embedding.is_mapped(),
            "{dir}: zero-copy"
        );
        assert_eq!(greedy(&ckpt, &prompt, expected.len()), expected, "{dir}");
    }
}

fn load_err(dir: &Path) -> String {
    match import::load(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn code_in_the_pickle_is_refused() {
    let e = load_err(&data("pytorch/malicious"));
    assert!(
        e.contains("refusing to load pickle global posix.system"),
        "{e}"
    );
    let e = load_err(&data("pytorch/bogus-global"));
    assert!(
        e.contains("refusing to load pickle global evil_module.payload"),
        "{e}"
    );
}

/// The entries of a zip archive: name and bytes.
fn entries(zip: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut archive = ZipArchive::new(Cursor::new(zip)).unwrap();
    (0..archive.len())
        .map(|i| {
            let mut entry = archive.by_index(i).unwrap();
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).unwrap();
            (entry.name().to_string(), bytes)
        })
        .collect()
}

/// A zip archive as torch.save writes it: entries stored, 64-byte aligned.
fn zip_of(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default()
        .compression_method(CompressionMethod::Stored)
        .with_alignment(64);
    for (name, bytes) in entries {
        zip.start_file(name.as_str(), options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

/// A model directory holding stories260K's config.json and `bin` as pytorch_model.bin.
fn model_dir(bin: &[u8]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        data("pytorch/stories260K/config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    std::fs::write(dir.path().join("pytorch_model.bin"), bin).unwrap();
    dir
}

/// Loads `bin` (weights too, if it loads), turning a panic into a failure that names
/// `case`. Returns whether it loaded.
fn loads_without_panic(dir: &Path, bin: &[u8], case: &str) -> bool {
    std::fs::write(dir.join("pytorch_model.bin"), bin).unwrap();
    let result = catch_unwind(AssertUnwindSafe(|| {
        import::load(dir).and_then(|ckpt| LlamaWeights::load(&ckpt).map(|_| ()))
    }));
    result
        .unwrap_or_else(|_| panic!("{case}: panicked"))
        .is_ok()
}

/// xorshift64*: a seeded generator, enough for picking mutations.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as usize % n.max(1)
    }
}

/// One random change to `bytes`: overwritten bytes, a deletion, an insertion, a copied
/// slice, or (when `truncate`) a truncation. Returns whether it truncated.
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>, truncate: bool) -> bool {
    let at = rng.below(bytes.len());
    match rng.below(if truncate { 5 } else { 4 }) {
        0 => {
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(bytes.len());
                bytes[i] = rng.below(256) as u8;
            }
        }
        1 => drop(bytes.drain(at..(at + 1 + rng.below(16)).min(bytes.len()))),
        2 => {
            let junk: Vec<u8> = (0..1 + rng.below(16))
                .map(|_| rng.below(256) as u8)
                .collect();
            bytes.splice(at..at, junk);
        }
        3 => {
            let end = (at + 1 + rng.below(64)).min(bytes.len());
            let copy = bytes[at..end].to_vec();
            let to = rng.below(bytes.len());
            bytes.splice(to..to, copy);
        }
        _ => {
            bytes.truncate(at);
            return true;
        }
    }
    false
}

#[test]
fn truncated_archives_are_errors() {
    let bin = std::fs::read(data("pytorch/stories260K/pytorch_model.bin")).unwrap();
    let dir = model_dir(&bin);
    let cuts = [
        0,
        3,
        4,
        30,
        100,
        4000,
        bin.len() / 2,
        bin.len() - 22,
        bin.len() - 1,
    ];
    for cut in cuts {
        let case = format!("truncated at {cut}");
        assert!(
            !loads_without_panic(dir.path(), &bin[..cut], &case),
            "{case}"
        );
    }
}

#[test]
fn mutated_archives_never_panic() {
    let bin = std::fs::read(data("pytorch/stories260K/pytorch_model.bin")).unwrap();
    let dir = model_dir(&bin);
    let mut rng = Rng(0x5eed_0001);
    let mut failures = 0;
    for seed in 0..300 {
        let mut bytes = bin.clone();
        // The pickle and headers lead the file and the central directory ends it: aim
        // two thirds of the mutations there rather than into the weights.
        let (lo, hi) = match rng.below(3) {
            0 => (0, 8 << 10),
            1 => (bin.len() - (4 << 10), bin.len()),
            _ => (0, bin.len()),
        };
        let mut region = bytes[lo..hi].to_vec();
        let truncated = mutate(&mut rng, &mut region, true);
        bytes.splice(lo..hi, region);
        let ok = loads_without_panic(dir.path(), &bytes, &format!("file mutation {seed}"));
        assert!(
            !(ok && truncated && hi == bin.len()),
            "seed {seed}: truncated file loaded"
        );
        failures += usize::from(!ok);
    }
    assert!(
        failures > 100,
        "only {failures} of 300 mutated files were refused"
    );
}

#[test]
fn mutated_pickles_never_panic() {
    let bin = std::fs::read(data("pytorch/stories260K/pytorch_model.bin")).unwrap();
    let original = entries(&bin);
    let pkl = original
        .iter()
        .position(|(n, _)| n.ends_with("/data.pkl"))
        .unwrap();
    let dir = model_dir(&bin);
    assert!(loads_without_panic(
        dir.path(),
        &zip_of(&original),
        "re-zipped"
    ));
    let mut rng = Rng(0x5eed_0002);
    let mut failures = 0;
    for seed in 0..400 {
        let mut entries = original.clone();
        let mut truncated = false;
        for _ in 0..1 + rng.below(3) {
            truncated |= mutate(&mut rng, &mut entries[pkl].1, true);
        }
        let case = format!("pickle mutation {seed}");
        let ok = loads_without_panic(dir.path(), &zip_of(&entries), &case);
        // Truncation drops STOP, the last opcode.
        assert!(!(ok && truncated), "{case}: a truncated pickle loaded");
        failures += usize::from(!ok);
    }
    assert!(
        failures > 300,
        "only {failures} of 400 mutated pickles were refused"
    );
}

/// A pickle integer (BININT).
fn int(v: i32) -> Vec<u8> {
    [&[b'J'][..], &v.to_le_bytes()].concat()
}

/// A pickle string (SHORT_BINUNICODE).
fn string(s: &str) -> Vec<u8> {
    [&[0x8c, s.len() as u8][..], s.as_bytes()].concat()
}

/// The pickle of `{"model.embed_tokens.weight": tensor}` as torch.save writes it, the
/// tensor a view of `FloatStorage` key "0" of `numel` elements.
fn tensor_pickle(numel: i32, offset: i32, shape: [i32; 2], stride: [i32; 2]) -> Vec<u8> {
    let ints = |v: [i32; 2]| [int(v[0]), int(v[1]), vec![0x86]].concat();
    [
        b"\x80\x02}".to_vec(),
        string("model.embed_tokens.weight"),
        b"ctorch._utils\n_rebuild_tensor_v2\n((".to_vec(),
        string("storage"),
        b"ctorch\nFloatStorage\n".to_vec(),
        string("0"),
        string("cpu"),
        int(numel),
        b"tQ".to_vec(),
        int(offset),
        ints(shape),
        ints(stride),
        b"\x89ccollections\nOrderedDict\n)RtRs.".to_vec(),
    ]
    .concat()
}

/// The error of loading an archive of `pkl` and a 64-byte storage "0".
fn pickle_err(pkl: &[u8]) -> String {
    let bin = zip_of(&[
        ("archive/data.pkl".into(), pkl.to_vec()),
        ("archive/data/0".into(), vec![0; 64]),
    ]);
    load_err(model_dir(&bin).path())
}

#[test]
fn crafted_pickles_are_refused_with_reasons() {
    let nested: Vec<u8> = [&b"\x80\x02)"[..], &[0x85; 100_000], b"."].concat();
    let marks: Vec<u8> = [&b"\x80\x02"[..], &[b'('; 100_000], b"}."].concat();
    let flood: Vec<u8> = [&b"\x80\x02"[..], &vec![b'('; 5 << 20], b"}."].concat();
    let cases: [(&[u8], &str); 16] = [
        (
            &tensor_pickle(16, 0, [4, 4], [4, 1]),
            "missing tensor model.layers.0",
        ),
        (
            &tensor_pickle(16, 8, [4, 4], [4, 1]),
            "16 elements at offset 8 overrun",
        ),
        (
            &tensor_pickle(17, 0, [4, 4], [4, 1]),
            "does not fit its 64-byte zip entry",
        ),
        (
            &tensor_pickle(16, 0, [4, 4], [1, 4]),
            "not row-major contiguous",
        ),
        (
            &tensor_pickle(16, -1, [4, 4], [4, 1]),
            "storage offset is negative",
        ),
        (
            b"\x80\x02cos\nsystem\nq\x00.",
            "refusing to load pickle global os.system",
        ),
        (
            b"\x80\x04\x8c\x02os\x8c\x06system\x93.",
            "pickle global os.system",
        ),
        (
            b"\x80\x02ctorch\nFloatStorage\n)R.",
            "refusing to call torch.FloatStorage",
        ),
        (b"\x80\x02.", "stack underflow"),
        (b"\x80\x02}(s.", "stack underflow"),
        (b"\x80\x02h\x07.", "memo key 7 unset"),
        (
            b"\x80\x02\x8d\xff\xff\xff\xff\xff\xff\xff\x3f.",
            "truncated pickle",
        ),
        (
            b"\x80\x02\x8a\x09\x01\x02\x03\x04\x05\x06\x07\x08\x09.",
            "wider than 64 bits",
        ),
        (&nested, "holds a tuple, not a state dict"),
        (&marks, "missing tensor model.embed_tokens.weight"),
        (&flood, "too many opcodes"),
    ];
    for (pkl, expected) in cases {
        let e = pickle_err(pkl);
        assert!(e.contains(expected), "expected {expected:?}, got {e}");
    }
    let cyclic = b"\x80\x02]q\x00h\x00a.";
    assert!(pickle_err(cyclic).contains("holds a list"));
    let storage = ("archive/data/0".to_string(), vec![0; 64]);
    let archive_cases = [
        (vec![storage.clone()], "without <prefix>/data.pkl"),
        (
            vec![("a/data.pkl".into(), vec![]), ("b/data.pkl".into(), vec![])],
            "several data.pkl",
        ),
        (
            vec![
                ("archive/data.pkl".into(), b"\x80\x02}.".to_vec()),
                ("archive/byteorder".into(), b"big".to_vec()),
            ],
            "only little-endian",
        ),
    ];
    for (entries, expected) in archive_cases {
        let e = load_err(model_dir(&zip_of(&entries)).path());
        assert!(e.contains(expected), "expected {expected:?}, got {e}");
    }
    let legacy = model_dir(b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.");
    assert!(load_err(legacy.path()).contains("legacy torch.save"));
}
