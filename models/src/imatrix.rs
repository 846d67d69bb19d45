//! Importance matrices, as llama.cpp's `llama-imatrix` gathers them and `llama-quantize
//! --imatrix` uses them (llama.cpp `tools/imatrix/imatrix.cpp`, `common/imatrix-loader.cpp`,
//! `tools/quantize/quantize.cpp`).
//!
//! For every Linear weight, named as in a GGUF file (`blk.0.attn_q.weight`), the matrix holds
//! `Σ_t x_t[j]²` over the calibration tokens `t` for each input column `j`, and the number of
//! tokens summed. A quantiser weighs each column's rounding error by the mean `Σ x² / n`
//! ([`ImatrixEntry::importance`]): columns that carry large activations are rounded more
//! carefully.
//!
//! [`collect`] gathers a matrix as llama-imatrix does: the text in chunks of `ctx` tokens
//! (BOS first where the tokenizer adds one), each run in one forward pass, and the inputs of
//! every Linear of a layer (`blk.*`) summed; the classifier (`output.weight`) only when asked
//! (`--process-output`). As in llama-imatrix, products of fewer than 16 input rows (the
//! classifier of a last-token pass) are not counted. The experts of a mixture-of-experts
//! layer run inside one op that does not expose their inputs, so they get no entries, and
//! neither do the per-head products of multi-head latent attention.
//!
//! Both file forms are read and written:
//! - **GGUF** (llama.cpp's default since 2025): `general.type = "imatrix"`,
//!   `imatrix.datasets`, `imatrix.chunk_count`, `imatrix.chunk_size`, and per entry the f32
//!   tensors `<name>.in_sum2` `[cols, n_mat]` (the raw sums) and `<name>.counts` `[1, n_mat]`.
//! - **legacy `.dat`**: `i32` entry count; per entry its name (`i32` length, bytes), `ncall`
//!   (`i32`, the chunks summed), `nval` (`i32`) and `nval` f32 values `Σx²/n · ncall`; then
//!   the chunk count (`i32`) and the dataset's name (`i32` length, bytes).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use flm_core::PartialFile;
use flm_core::{BaseDevice, CheckedOp, Data, Executor, Location, Op, Result as CoreResult};

use crate::eval::Window;
use crate::llama::Logits;
use crate::tensor_names::TensorName;
use crate::{Error, Model, Result, SharedGraph, SharedModel};

/// Products of fewer input rows than this are not counted (llama-imatrix's rule: its
/// scheduler asks for batches of at least 16 tokens).
pub const MIN_ROWS: usize = 16;

/// The statistics of one weight.
#[derive(Debug, Clone, PartialEq)]
pub struct ImatrixEntry {
    /// `counts.len()` blocks of `cols` values: per matrix (one, or one per expert of a
    /// stacked expert tensor), `Σ x[j]²` over the tokens it saw (GGUF), or `Σx²/n · ncall`
    /// (legacy files).
    pub sums: Vec<f32>,
    /// Per matrix, the tokens summed (GGUF), or `[ncall]` (legacy files).
    pub counts: Vec<f32>,
}

impl ImatrixEntry {
    /// Input columns per matrix.
    pub fn cols(&self) -> usize {
        self.sums.len() / self.counts.len().max(1)
    }

    /// The importance of each input column of matrix `mat`: `sums / count`, the mean square
    /// of its activations (`llama-quantize`'s `load_imatrix`; 1 for a matrix no token
    /// reached, as there). `None` for a matrix the entry does not have.
    pub fn importance(&self, mat: usize) -> Option<Vec<f32>> {
        let cols = self.cols();
        let count = *self.counts.get(mat)?;
        let sums = self.sums.get(mat * cols..(mat + 1) * cols)?;
        Some(if count > 0.0 {
            sums.iter().map(|s| s / count).collect()
        } else {
            vec![1.0; cols]
        })
    }
}

/// An importance matrix: an entry per weight name, and where it came from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImportanceMatrix {
    /// By GGUF tensor name (`blk.0.attn_q.weight`), in name order.
    pub entries: BTreeMap<String, ImatrixEntry>,
    /// The calibration texts (file names) it was gathered on.
    pub datasets: Vec<String>,
    /// Chunks of calibration text run.
    pub chunk_count: u32,
    /// Tokens per chunk (0 where a legacy file does not say).
    pub chunk_size: u32,
}

/// The file form of an importance matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImatrixFormat {
    /// llama.cpp's GGUF form.
    Gguf,
    /// llama.cpp's legacy `.dat` form.
    Dat,
}

impl ImatrixFormat {
    /// The form llama-imatrix gives a file name: legacy for `.dat`, GGUF otherwise.
    pub fn for_path(path: &Path) -> ImatrixFormat {
        match path.extension() {
            Some(e) if e == "dat" => ImatrixFormat::Dat,
            _ => ImatrixFormat::Gguf,
        }
    }
}

impl ImportanceMatrix {
    /// Reads a matrix in either form, told apart by the GGUF magic.
    ///
    /// Errors: [`Error::Io`] if the file cannot be read; [`Error::Format`] if it is
    /// truncated, holds an entry without values, sums without counts, counts that do not
    /// divide the sums, or non-f32 tensors.
    pub fn read(path: &Path) -> Result<ImportanceMatrix> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        if bytes.starts_with(b"GGUF") {
            return crate::import::read_gguf_imatrix(&bytes, path);
        }
        read_dat(&bytes, path)
    }

    /// The importance of each input column of the weight `name` (matrix `mat` of a stacked
    /// expert tensor, else 0); `None` when the matrix has no entry for it.
    ///
    /// Errors: [`Error::Config`] when the entry's columns are not `cols`.
    pub fn importance(&self, name: &str, mat: usize, cols: usize) -> Result<Option<Vec<f32>>> {
        let Some(entry) = self.entries.get(name) else {
            return Ok(None);
        };
        if entry.cols() != cols {
            return Err(Error::Config(format!(
                "the importance matrix has {} columns for {name}, the weight has {cols}",
                entry.cols()
            )));
        }
        Ok(entry.importance(mat))
    }

    /// Writes the matrix to `path` in `format`; the file gets its name only once complete.
    ///
    /// Errors: [`Error::Io`]; [`Error::InvalidInput`] for an entry whose sizes exceed the
    /// format's integers.
    pub fn write(&self, path: &Path, format: ImatrixFormat) -> Result<()> {
        let bytes = match format {
            ImatrixFormat::Gguf => self.gguf_bytes()?,
            ImatrixFormat::Dat => self.dat_bytes()?,
        };
        let io = |e| Error::io(path, e);
        let mut out = BufWriter::new(PartialFile::create(path).map_err(io)?);
        out.write_all(&bytes).map_err(io)?;
        out.into_inner()
            .map_err(|e| io(e.into_error()))?
            .persist()
            .map_err(io)
    }

    /// The legacy form: each entry's values `sums / count · ncall` with `ncall` its most
    /// tokens of any matrix over the chunk size, rounded up (llama-imatrix's
    /// `save_imatrix_legacy`; a matrix no token reached is written as 1).
    fn dat_bytes(&self) -> Result<Vec<u8>> {
        let chunk = self.chunk_size.max(1) as f32;
        let mut out = Vec::new();
        let stored: Vec<_> = self
            .entries
            .iter()
            .filter(|(_, e)| e.counts.iter().any(|&c| c > 0.0))
            .collect();
        out.extend_from_slice(&i32_of(stored.len())?.to_le_bytes());
        for (name, e) in stored {
            out.extend_from_slice(&i32_of(name.len())?.to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            let most = e.counts.iter().copied().fold(0.0f32, f32::max);
            let ncall = (most / chunk).ceil();
            out.extend_from_slice(&i32_of(ncall as usize)?.to_le_bytes());
            out.extend_from_slice(&i32_of(e.sums.len())?.to_le_bytes());
            for (mat, block) in e.sums.chunks(e.cols().max(1)).enumerate() {
                let count = e.counts[mat];
                for &s in block {
                    let v = if count > 0.0 {
                        s / count * ncall
                    } else {
                        ncall
                    };
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        out.extend_from_slice(&i32_of(self.chunk_count as usize)?.to_le_bytes());
        let dataset = self.datasets.last().map_or("", String::as_str);
        out.extend_from_slice(&i32_of(dataset.len())?.to_le_bytes());
        out.extend_from_slice(dataset.as_bytes());
        Ok(out)
    }

    /// The GGUF form (v3, alignment 32, tensors in name order, `in_sum2` then `counts`).
    fn gguf_bytes(&self) -> Result<Vec<u8>> {
        const ALIGN: usize = 32;
        let put_str = |out: &mut Vec<u8>, s: &str| {
            out.extend_from_slice(&(s.len() as u64).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        };
        // GGUF value types (ggml docs/gguf.md).
        const U32: u32 = 4;
        const STRING: u32 = 8;
        const ARRAY: u32 = 9;
        let mut head = Vec::new();
        head.extend_from_slice(b"GGUF");
        head.extend_from_slice(&3u32.to_le_bytes());
        let tensors: Vec<(String, [usize; 2], Vec<f32>)> = self
            .entries
            .iter()
            .flat_map(|(name, e)| {
                [
                    (
                        format!("{name}.in_sum2"),
                        [e.cols(), e.counts.len()],
                        e.sums.clone(),
                    ),
                    (
                        format!("{name}.counts"),
                        [1, e.counts.len()],
                        e.counts.clone(),
                    ),
                ]
            })
            .collect();
        head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&4u64.to_le_bytes());
        put_str(&mut head, "general.type");
        head.extend_from_slice(&STRING.to_le_bytes());
        put_str(&mut head, "imatrix");
        put_str(&mut head, "imatrix.datasets");
        head.extend_from_slice(&ARRAY.to_le_bytes());
        head.extend_from_slice(&STRING.to_le_bytes());
        head.extend_from_slice(&(self.datasets.len() as u64).to_le_bytes());
        for d in &self.datasets {
            put_str(&mut head, d);
        }
        for (key, v) in [
            ("imatrix.chunk_count", self.chunk_count),
            ("imatrix.chunk_size", self.chunk_size),
        ] {
            put_str(&mut head, key);
            head.extend_from_slice(&U32.to_le_bytes());
            head.extend_from_slice(&v.to_le_bytes());
        }
        let mut offset = 0usize;
        for (name, ne, values) in &tensors {
            put_str(&mut head, name);
            // As ggml_n_dims: trailing dimensions of 1 are not written.
            let dims = if ne[1] == 1 { &ne[..1] } else { &ne[..] };
            head.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for &d in dims {
                head.extend_from_slice(&(d as u64).to_le_bytes());
            }
            // ggml type 0: F32.
            head.extend_from_slice(&0u32.to_le_bytes());
            head.extend_from_slice(&(offset as u64).to_le_bytes());
            offset += (values.len() * 4).div_ceil(ALIGN) * ALIGN;
        }
        head.resize(head.len().div_ceil(ALIGN) * ALIGN, 0);
        for (_, _, values) in &tensors {
            let start = head.len();
            for v in values {
                head.extend_from_slice(&v.to_le_bytes());
            }
            head.resize(start + (head.len() - start).div_ceil(ALIGN) * ALIGN, 0);
        }
        Ok(head)
    }
}

/// `v` as a file's `i32`.
fn i32_of(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::InvalidInput(format!("{v} exceeds an i32")))
}

/// A bounds-checked little-endian cursor over a legacy file.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                Error::format(
                    self.path,
                    format!("an importance matrix cut short in {what}"),
                )
            })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn i32(&mut self, what: &str) -> Result<i32> {
        let b = self.take(4, what)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A length: a non-negative `i32`.
    fn len(&mut self, what: &str) -> Result<usize> {
        let v = self.i32(what)?;
        usize::try_from(v).map_err(|_| Error::format(self.path, format!("{what} is {v}")))
    }
}

/// A legacy `.dat` matrix (see the module docs), read as llama.cpp's
/// `common_imatrix_load_legacy` reads it: values as they are, `counts` `[ncall]`.
fn read_dat(bytes: &[u8], path: &Path) -> Result<ImportanceMatrix> {
    let mut c = Cursor { bytes, at: 0, path };
    let n_entries = c.len("the entry count")?;
    if n_entries == 0 {
        return Err(Error::format(path, "an importance matrix with no entry"));
    }
    let mut m = ImportanceMatrix::default();
    for i in 0..n_entries {
        let len = c.len("a name length")?;
        let name = String::from_utf8(c.take(len, "a name")?.to_vec())
            .map_err(|_| Error::format(path, format!("entry {i}'s name is not UTF-8")))?;
        let ncall = c.i32("ncall")?;
        let nval = c.len("nval")?;
        if nval == 0 {
            return Err(Error::format(path, format!("entry {name} has no values")));
        }
        let sums = c
            .take(nval.saturating_mul(4), "values")?
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        m.entries.insert(
            name,
            ImatrixEntry {
                sums,
                counts: vec![ncall as f32],
            },
        );
    }
    // The chunk count and the dataset are optional, as llama.cpp reads them.
    if let Ok(chunks) = c.len("the chunk count") {
        m.chunk_count = u32::try_from(chunks).unwrap_or(u32::MAX);
        if let Ok(name) = c
            .len("the dataset's name length")
            .and_then(|len| c.take(len, "the dataset's name"))
        {
            m.datasets.push(String::from_utf8_lossy(name).into_owned());
        }
    }
    Ok(m)
}

/// Sums of squares and token counts by weight ([`Data::id`]).
type Sums = HashMap<u64, (Vec<f64>, u64)>;

/// A device that runs `inner`'s ops and, before each Linear, adds the squares of its input
/// columns to its weight's sums.
struct Collecting<D> {
    inner: D,
    sums: Arc<Mutex<Sums>>,
}

/// Locks the sums, whose holders never panic while holding them.
fn lock(m: &Mutex<Sums>) -> MutexGuard<'_, Sums> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<D: BaseDevice> Collecting<D> {
    /// Adds `input`'s column squares to each weight's sums (inputs in host memory).
    fn observe(&self, input: &Data, weights: &[&Data]) -> CoreResult<()> {
        let rows = input.rows();
        if rows < MIN_ROWS {
            return Ok(());
        }
        let x = input.as_f32()?;
        let cols = input.cols();
        let mut squares = vec![0f64; cols];
        for row in x.chunks_exact(cols) {
            for (s, &v) in squares.iter_mut().zip(row) {
                *s += f64::from(v) * f64::from(v);
            }
        }
        let mut sums = lock(&self.sums);
        for w in weights {
            let (acc, count) = sums.entry(w.id()).or_insert_with(|| (vec![0.0; cols], 0));
            for (a, s) in acc.iter_mut().zip(&squares) {
                *a += s;
            }
            *count += rows as u64;
        }
        Ok(())
    }
}

impl<D: BaseDevice> BaseDevice for Collecting<D> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn supports(&self, op: &Op<'_>) -> bool {
        self.inner.supports(op)
    }
    fn run(&self, op: CheckedOp<'_>) -> CoreResult<()> {
        match op.op() {
            Op::Linear { input, weight, .. } => self.observe(input, &[weight])?,
            Op::Linears { input, parts } => {
                let weights: Vec<&Data> = parts.iter().map(|p| p.weight).collect();
                self.observe(input, &weights)?;
            }
            _ => {}
        }
        self.inner.run(op)
    }
    fn require_batch_invariance(&self) {
        self.inner.require_batch_invariance();
    }
    fn location(&self) -> Location {
        self.inner.location()
    }
}

/// Gathers an importance matrix of `model` over `windows` (llama.cpp's chunks, from
/// [`crate::eval::windows`] with its llama.cpp method), each run from an empty KV cache on a
/// CPU `device`, calling `progress(done, windows)` after each; `process_output` also sums
/// the inputs of an untied classifier (llama-imatrix's `--process-output`, which leaves a
/// tied one, `token_embd.weight`, out). `dataset` names the text in the file.
///
/// Errors: [`Error::Config`] for a model that is not of the Llama graph (ChatGLM) or a
/// window longer than its context, [`Error::InvalidInput`] for no window, and the model's
/// errors.
pub fn collect(
    model: &SharedModel,
    device: impl BaseDevice + 'static,
    windows: &[Window],
    (dataset, process_output): (&str, bool),
    mut progress: impl FnMut(usize, usize),
) -> Result<ImportanceMatrix> {
    let llama = model.llama().ok_or_else(|| {
        Error::Config("importance matrices are gathered for Llama-graph models".into())
    })?;
    let names: HashMap<u64, TensorName> = llama
        .weights()
        .named_tensors(llama.config())?
        .into_iter()
        .filter(|(name, d)| {
            d.shape().len() == 2
                && (matches!(name, TensorName::Layer(..))
                    || process_output && *name == TensorName::Classifier)
        })
        .map(|(name, d)| (d.id(), name))
        .collect();
    let sums = Arc::new(Mutex::new(Sums::new()));
    let exec = Executor::new(vec![Box::new(Collecting {
        inner: device,
        sums: Arc::clone(&sums),
    })]);
    let mut instance: Model = model.instance()?;
    let max = model.config().max_seq_len;
    if windows.is_empty() {
        return Err(Error::InvalidInput("no chunk of text to run".into()));
    }
    let logits = if process_output {
        Logits::All
    } else {
        Logits::Last
    };
    for (done, w) in windows.iter().enumerate() {
        if w.tokens.len() > max {
            return Err(Error::Config(format!(
                "a chunk of {} tokens exceeds the model's context of {max}",
                w.tokens.len()
            )));
        }
        instance.forward(&exec, &w.tokens, 0, logits)?;
        progress(done + 1, windows.len());
    }
    let chunk_size = windows[0].tokens.len();
    let mut m = ImportanceMatrix {
        datasets: vec![dataset.to_owned()],
        chunk_count: u32::try_from(windows.len()).unwrap_or(u32::MAX),
        chunk_size: u32::try_from(chunk_size).unwrap_or(u32::MAX),
        ..ImportanceMatrix::default()
    };
    for (id, (acc, count)) in lock(&sums).drain() {
        let Some(name) = names.get(&id).and_then(|n| n.gguf()) else {
            continue;
        };
        m.entries.insert(
            name,
            ImatrixEntry {
                sums: acc.iter().map(|&s| s as f32).collect(),
                counts: vec![count as f32],
            },
        );
    }
    Ok(m)
}
