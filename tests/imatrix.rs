//! Importance matrices (`flm_models::imatrix`) against llama.cpp's `llama-imatrix`: the
//! files it wrote for stories260K over a text (`tests/data/llama.cpp/imatrix`, see SOURCES
//! there) are read in both forms, written back byte for byte, and flm's own statistics of
//! the same model, text and chunks agree with them; `flm convert --imatrix` rounds with
//! them.

use flm_core::{DataType, KvDtype};
use flm_devices::CpuDevice;
use flm_models::convert::{convert_with_imatrix, Recipe};
use flm_models::eval::{self, LogProbReader, Method};
use flm_models::imatrix::{self, ImatrixFormat, ImportanceMatrix};
use flm_models::llama::LlamaWeights;
use flm_models::tensor_names::TensorName;
use flm_models::{import, session, Error, SharedGraph, SharedModel};
use flm_tests::{cpu_executor, data};

/// llama.cpp's matrix of stories260K in `form` ("gguf" or "dat").
fn llama_cpp(form: &str) -> ImportanceMatrix {
    ImportanceMatrix::read(&data(&format!(
        "llama.cpp/imatrix/stories260K.imatrix.{form}"
    )))
    .unwrap()
}

/// The bytes of llama.cpp's file in `form`.
fn llama_cpp_bytes(form: &str) -> Vec<u8> {
    std::fs::read(data(&format!(
        "llama.cpp/imatrix/stories260K.imatrix.{form}"
    )))
    .unwrap()
}

/// As llama-imatrix ran (SOURCES.md): stories260K in f32, the text in chunks of 128 tokens
/// with BOS first, the KV cache in f16 as llama.cpp keeps it.
#[test]
fn flm_gathers_llama_imatrix_statistics() {
    let want = llama_cpp("gguf");
    let (model, tokenizer) =
        session::load_model(&data("gguf/stories260K-f32.gguf"), None, Some(128)).unwrap();
    let model = model.with_kv_dtype(KvDtype::F16).unwrap();
    let text = std::fs::read_to_string(data("text/tinystories_style.txt")).unwrap();
    let tokens = tokenizer.encode(&text, true).unwrap();
    let windows = eval::windows(&tokens, tokenizer.bos_id(), 128, Method::LlamaCpp).unwrap();
    let dataset = &want.datasets[0];
    let got = imatrix::collect(
        &model,
        CpuDevice::new().unwrap(),
        &windows,
        (dataset, false),
        |_, _| {},
    )
    .unwrap();
    assert_eq!(
        (got.chunk_count, got.chunk_size, &got.datasets),
        (33, 128, &want.datasets)
    );
    assert_eq!(
        got.entries.keys().collect::<Vec<_>>(),
        want.entries.keys().collect::<Vec<_>>()
    );
    let mut worst = 0f32;
    for (name, w) in &want.entries {
        let g = &got.entries[name];
        assert_eq!(g.counts, w.counts, "{name}");
        for (a, b) in g.sums.iter().zip(&w.sums) {
            worst = worst.max((a - b).abs() / b.abs().max(1e-6));
        }
    }
    eprintln!("largest relative difference from llama.cpp: {worst:e}");
    // The same sums but for the order of f32 additions (llama.cpp's) and of the kernels.
    assert!(worst < 1e-4, "largest relative difference {worst}");
}

/// Both of llama.cpp's forms give the same importance (`sums / count`) per column.
#[test]
fn the_legacy_and_gguf_files_hold_the_same_importance() {
    let (gguf, dat) = (llama_cpp("gguf"), llama_cpp("dat"));
    assert_eq!((dat.chunk_count, &dat.datasets), (33, &gguf.datasets));
    assert_eq!(dat.entries.len(), gguf.entries.len());
    for (name, e) in &gguf.entries {
        let (a, b) = (
            e.importance(0).unwrap(),
            dat.entries[name].importance(0).unwrap(),
        );
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 1e-6 * x.abs(), "{name}: {x} against {y}");
        }
    }
}

/// Read and written again, llama.cpp's GGUF file is the same bytes, and so is its legacy
/// file written from the GGUF one's sums (the legacy values `sums / count · ncall` in f32,
/// as llama-imatrix computes them).
#[test]
fn files_are_written_as_llama_imatrix_writes_them() {
    let dir = tempfile::tempdir().unwrap();
    let m = llama_cpp("gguf");
    for (form, format) in [("gguf", ImatrixFormat::Gguf), ("dat", ImatrixFormat::Dat)] {
        let path = dir.path().join(format!("m.{form}"));
        assert_eq!(ImatrixFormat::for_path(&path), format);
        m.write(&path, format).unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            llama_cpp_bytes(form),
            "{form}"
        );
    }
    assert_eq!(
        ImportanceMatrix::read(&dir.path().join("m.gguf")).unwrap(),
        m
    );
}

/// Malformed files and mismatched weights are errors, not panics.
#[test]
fn malformed_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        ImportanceMatrix::read(&path)
    };
    let dat = llama_cpp_bytes("dat");
    for cut in [0, 3, 4, 30, 200, dat.len() / 2] {
        assert!(
            matches!(write("cut.dat", &dat[..cut]), Err(Error::Format { .. })),
            "{cut} bytes"
        );
    }
    assert!(matches!(
        write("empty.dat", &0i32.to_le_bytes()),
        Err(Error::Format { .. })
    ));
    let gguf = llama_cpp_bytes("gguf");
    for cut in [5, 100, 4000, gguf.len() - 30] {
        assert!(
            matches!(write("cut.gguf", &gguf[..cut]), Err(Error::Format { .. })),
            "{cut} bytes"
        );
    }
    // A counts tensor renamed away leaves its sums alone.
    let text = String::from_utf8_lossy(&gguf).into_owned();
    let at = text.find("blk.0.attn_k.weight.counts").unwrap();
    let mut renamed = gguf.clone();
    renamed[at + "blk.0.attn_k.weight.".len()] = b'k';
    let err = write("renamed.gguf", &renamed).unwrap_err();
    assert!(err.to_string().contains("blk.0.attn_k.weight"), "{err}");
    let m = llama_cpp("gguf");
    assert!(matches!(
        m.importance("blk.0.attn_q.weight", 0, 65),
        Err(Error::Config(_))
    ));
    assert_eq!(m.importance("blk.9.attn_q.weight", 0, 64).unwrap(), None);
}

/// stories260K converted to `dtype` (every matrix), with `imatrix` or without, as a model.
fn converted(
    dir: &std::path::Path,
    dtype: DataType,
    imatrix: Option<&ImportanceMatrix>,
) -> (SharedModel, Vec<bool>) {
    let mut ckpt = import::load(&data("gguf/stories260K-f32.gguf")).unwrap();
    let tokenizer = ckpt
        .take_tokenizer(&data("gguf/stories260K-f32.gguf"))
        .unwrap();
    let out = dir.join(format!("{dtype}-{}.flm", imatrix.is_some()));
    let mut weighted = Vec::new();
    convert_with_imatrix(
        &ckpt,
        &tokenizer,
        &out,
        (dtype, Recipe::Pure),
        imatrix,
        |p| weighted.push(p.weighted),
    )
    .unwrap();
    let (model, _) = session::load_model(&out, None, None).unwrap();
    (model, weighted)
}

/// `flm convert --imatrix` with llama.cpp's matrix: each of the 35 matrices it has an
/// entry for is rounded with its importance, and no other tensor; each has a lower
/// importance-weighted squared error against the f32 weights than without the matrix (or
/// the same); and the int4 model's KL divergence from the f32 model (llama-perplexity's
/// saved log-probabilities) is lower.
#[test]
fn convert_rounds_with_the_importance_matrix() {
    let dir = tempfile::tempdir().unwrap();
    let m = llama_cpp("gguf");
    let f32_model = import::load(&data("gguf/stories260K-f32.gguf")).unwrap();
    let f32_weights = LlamaWeights::load(&f32_model).unwrap();
    let exact: Vec<(TensorName, Vec<f32>)> = f32_weights
        .named_tensors(&f32_model.config)
        .unwrap()
        .into_iter()
        .map(|(n, d)| (n, d.to_f32_vec().unwrap()))
        .collect();
    let mut kld = Vec::new();
    for with in [false, true] {
        let (model, weighted) = converted(dir.path(), DataType::I4G32, with.then_some(&m));
        assert_eq!(
            weighted.iter().filter(|&&w| w).count(),
            if with { 35 } else { 0 }
        );
        let llama = model.llama().unwrap();
        let errors: Vec<f64> = llama
            .weights()
            .named_tensors(llama.config())
            .unwrap()
            .into_iter()
            .zip(&exact)
            .filter_map(|((name, d), (_, want))| {
                let imp = m.importance(&name.gguf()?, 0, d.cols()).unwrap()?;
                let got = d.to_f32_vec().unwrap();
                let err = got
                    .iter()
                    .zip(want)
                    .enumerate()
                    .map(|(i, (g, w))| f64::from(imp[i % imp.len()] * (g - w) * (g - w)))
                    .sum();
                Some(err)
            })
            .collect();
        kld.push((errors, {
            let mut base =
                LogProbReader::open(&data("llama.cpp/perplexity/stories260K-f32-c128.kld"))
                    .unwrap();
            let mut instance = model.instance().unwrap();
            // 1: stories260K's BOS, which starts each of llama-perplexity's chunks.
            eval::kl_divergence(
                &mut instance,
                &cpu_executor(),
                &mut base,
                Some(1),
                |_, _| {},
            )
            .unwrap()
            .kld
            .value
        }));
    }
    let ((plain_err, plain_kld), (weighted_err, weighted_kld)) = (&kld[0], &kld[1]);
    assert_eq!(plain_err.len(), 35);
    for (p, w) in plain_err.iter().zip(weighted_err) {
        assert!(w <= &(p * (1.0 + 1e-9)), "weighted error {w} above {p}");
    }
    eprintln!("int4-g32: mean KLD {plain_kld} without the matrix, {weighted_kld} with it");
    assert!(
        weighted_kld < &(plain_kld * 0.95),
        "{weighted_kld} against {plain_kld}"
    );
}
