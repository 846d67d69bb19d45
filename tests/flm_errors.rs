//! Damaged .flm files give clear errors, never a panic: truncation, a wrong magic, a newer
//! major version, tensor data out of bounds, a shape that disagrees with the configuration,
//! and a few hundred random mutations.

use std::path::{Path, PathBuf};

use flm_core::flm_file::FlmFile;
use flm_core::DataType;
use flm_models::convert::Recipe;
use flm_models::import;
use flm_models::llama::LlamaWeights;
use flm_tests::convert_stories260k;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

fn small_flm(dir: &Path) -> (PathBuf, Vec<u8>) {
    let path = dir.join("model.flm");
    convert_stories260k(&path, DataType::I4G32, Recipe::Mixed);
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

/// The error `import::load` + `weights()` give for `bytes`, as text.
fn load_error(dir: &Path, bytes: &[u8]) -> String {
    let path = dir.join("damaged.flm");
    std::fs::write(&path, bytes).unwrap();
    match import::load(&path).and_then(|c| LlamaWeights::load(&c).map(|_| ())) {
        Ok(()) => String::new(),
        Err(e) => e.to_string(),
    }
}

/// Re-serialises the metadata after `edit`, moving the data section as needed.
fn rewrite_metadata(bytes: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let meta_len = u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize;
    let data_offset = u64::from_le_bytes(bytes[24..32].try_into().unwrap()) as usize;
    let mut meta: Value = serde_json::from_slice(&bytes[32..32 + meta_len]).unwrap();
    edit(&mut meta);
    let meta = serde_json::to_vec(&meta).unwrap();
    let new_offset = (32 + meta.len()).div_ceil(64) * 64;
    let mut out = bytes[..16].to_vec();
    out.extend((meta.len() as u64).to_le_bytes());
    out.extend((new_offset as u64).to_le_bytes());
    out.extend(&meta);
    out.resize(new_offset, 0);
    out.extend(&bytes[data_offset..]);
    out
}

#[test]
fn damaged_headers_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let (path, bytes) = small_flm(dir.path());
    assert!(FlmFile::open(&path).is_ok());

    for cut in [0, 10, 31, 100, bytes.len() / 2, bytes.len() - 1] {
        let err = load_error(dir.path(), &bytes[..cut]);
        assert!(!err.is_empty(), "cut at {cut} accepted");
    }
    let err = load_error(dir.path(), &bytes[..bytes.len() - 1]);
    assert!(err.contains("past the end of the file"), "{err}");

    let mut wrong = bytes.clone();
    wrong[1] = b'X';
    let p = dir.path().join("wrong.flm");
    std::fs::write(&p, &wrong).unwrap();
    let err = FlmFile::open(&p).err().unwrap().to_string();
    assert!(err.contains("wrong magic"), "{err}");
    assert!(load_error(dir.path(), &wrong).contains("not a recognised checkpoint"));

    let mut newer = bytes.clone();
    newer[8..10].copy_from_slice(&3u16.to_le_bytes());
    let err = load_error(dir.path(), &newer);
    let minor = flm_core::flm_file::FORMAT_MINOR;
    assert!(
        err.contains(&format!("format version 3.{minor} is not supported")),
        "{err}"
    );
    // Version 1 interleaved the int4 scales with the codes: refused, not misread.
    let mut older = bytes.clone();
    older[8..10].copy_from_slice(&1u16.to_le_bytes());
    let err = load_error(dir.path(), &older);
    assert!(
        err.contains(&format!("format version 1.{minor} is not supported")),
        "{err}"
    );
    let mut minor = bytes.clone();
    minor[10..12].copy_from_slice(&(flm_core::flm_file::FORMAT_MINOR + 1).to_le_bytes());
    assert_eq!(
        load_error(dir.path(), &minor),
        "",
        "a newer minor version still loads"
    );
}

#[test]
fn tensors_out_of_bounds_or_of_the_wrong_shape_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_, bytes) = small_flm(dir.path());
    let far = rewrite_metadata(&bytes, |m| m["tensors"][3]["offset"] = (1u64 << 40).into());
    let err = load_error(dir.path(), &far);
    assert!(err.contains("past the end of the file"), "{err}");

    let misaligned = rewrite_metadata(&bytes, |m| m["tensors"][3]["offset"] = 65.into());
    assert!(load_error(dir.path(), &misaligned).contains("misaligned"));

    let wrong_size = rewrite_metadata(&bytes, |m| m["tensors"][0]["shape"] = vec![511, 64].into());
    let err = load_error(dir.path(), &wrong_size);
    assert!(err.contains("bytes stored"), "{err}");

    let wrong_dim = rewrite_metadata(&bytes, |m| m["config"]["hidden_dim"] = 180.into());
    let err = load_error(dir.path(), &wrong_dim);
    assert!(err.contains("the configuration implies"), "{err}");

    let bad_dtype = rewrite_metadata(&bytes, |m| m["tensors"][0]["dtype"] = "int3".into());
    assert!(load_error(dir.path(), &bad_dtype).contains("unknown dtype"));

    let no_field = rewrite_metadata(&bytes, |m| {
        m["config"].as_object_mut().unwrap().remove("n_heads");
    });
    assert!(load_error(dir.path(), &no_field).contains("missing field `n_heads`"));
}

#[test]
fn random_mutations_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (_, bytes) = small_flm(dir.path());
    let meta_end = 32 + u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize;
    // Seeded: the same mutations every run.
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let mut next = move || rng.random::<u64>() as usize;
    let mut refused = 0;
    for round in 0..300 {
        let mut m = bytes.clone();
        // Mostly the header and metadata, where the parser's decisions are.
        for _ in 0..1 + next() % 4 {
            let at = if round % 4 == 0 {
                next() % m.len()
            } else {
                next() % meta_end
            };
            m[at] = next() as u8;
        }
        if round % 10 == 0 {
            m.truncate(next() % m.len());
        }
        if !load_error(dir.path(), &m).is_empty() {
            refused += 1;
        }
    }
    assert!(
        refused > 100,
        "only {refused} of 300 mutations were refused"
    );
}
