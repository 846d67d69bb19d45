//! Checkpoint importers.
//!
//! [`load`] detects the format from the bytes, not from the file name:
//!
//! | what the path holds | format |
//! |---|---|
//! | a directory with `config.json` | Hugging Face (safetensors, one file or sharded; GPTQ and AWQ int4: `packed.rs`) |
//! | a file starting with a safetensors header | Hugging Face; `config.json` is read beside it |
//! | a file starting with `\x89FLM\r\n\x1a\n` | flm's own .flm file |
//! | a file starting with `GGUF` | GGUF v2/v3 (llama.cpp) |
//! | a file starting with magic `0x616b3432` ("ak42") | llama2.c v1 (fp32) or v2 (Q8_0) |
//! | a file whose 28-byte header predicts its exact size | llama2.c legacy (v0) |
//!
//! Importers list the tensors under flm's canonical names as lazily read
//! [`SourceTensor`]s: weights are zero-copy views of the mapped files where their dtype is
//! f32, f16 or bf16, and are decoded when loaded otherwise (llama2.c v2, GGUF's block
//! types: [`Encoding::load_dtype`]).

mod awq;
mod deepseek;
mod flm;
mod gguf;
mod gpt_oss;
mod gptq;
mod hf;
mod hf_families;
mod llama2c;
mod packed;
mod pickle;
mod pytorch;
mod quant_config;
mod source;
mod thudm;

pub(crate) use flm::PERM_SUFFIX;
pub use gguf::load_tokenizer as load_gguf_tokenizer;
pub(crate) use gguf::read_imatrix as read_gguf_imatrix;
pub use source::{Encoding, SourceTensor};

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use flm_core::ggml::GgmlType;
use flm_tokenizer::Tokenizer;

use crate::tensor_names::TensorName;
use crate::{Error, ModelConfig, Result};

/// The checkpoint formats [`load`] understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// llama2.c legacy `.bin`: 28-byte header, fp32 weights (`run.c`).
    Llama2cLegacy,
    /// llama2.c v1 `.bin`: 256-byte header, fp32 weights (`export.py --version 1`).
    Llama2cV1,
    /// llama2.c v2 `.bin`: 256-byte header, Q8_0 group-quantised weights (`runq.c`).
    Llama2cV2,
    /// Hugging Face directory: `config.json` plus safetensors weights.
    HuggingFace,
    /// flm's own file (`flm convert`).
    Flm,
    /// GGUF v2/v3 (llama.cpp), architecture `llama`.
    Gguf,
}

/// A loaded checkpoint.
#[derive(Debug)]
pub struct Checkpoint {
    /// The detected format.
    pub format: Format,
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// Every tensor, under its canonical name ([`TensorName`]'s `Display` form), not yet
    /// read.
    pub tensors: Vec<SourceTensor>,
    /// The names of the file's tensors that no canonical tensor maps to (such as
    /// `rotary_emb.inv_freq` buffers or GGUF's `rope_freqs.weight`), which are not loaded.
    pub ignored: Vec<String>,
    /// The tokenizer stored inside the checkpoint, if its format carries one (.flm; GGUF:
    /// SentencePiece and byte-level BPE vocabularies, `None` for other kinds or a
    /// pre-tokenizer flm does not implement).
    pub tokenizer: Option<Tokenizer>,
    /// Tokenizer files that may sit beside the checkpoint, most likely first.
    pub tokenizer_candidates: Vec<PathBuf>,
}

impl Checkpoint {
    /// The number of weights: the elements of every tensor.
    pub fn parameter_count(&self) -> u64 {
        self.tensors
            .iter()
            .map(|t| t.shape.iter().map(|&d| d as u64).product::<u64>())
            .sum()
    }

    /// The tensor `name`.
    pub fn tensor(&self, name: TensorName) -> Option<&SourceTensor> {
        let name = name.to_string();
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The tokenizer of the checkpoint: the one stored inside it, else the first candidate
    /// file beside it that exists (moved out of the checkpoint), with what a
    /// `tokenizer_config.json` beside that file says (the Jinja chat template; ChatGLM2/3's
    /// special tokens and format: [`Tokenizer::from_file_with_hf_config`]).
    ///
    /// Errors: [`Error::Format`] if there is none, naming the files looked for, or if the
    /// file found is not a valid tokenizer or the `tokenizer_config.json` is malformed.
    pub fn take_tokenizer(&mut self, model: &Path) -> Result<Tokenizer> {
        if let Some(tokenizer) = self.tokenizer.take() {
            return Ok(tokenizer);
        }
        if self.tokenizer_candidates.is_empty() {
            return Err(Error::format(
                model,
                "the checkpoint carries no tokenizer this build can use; pass --tokenizer",
            ));
        }
        let Some(path) = self.tokenizer_candidates.iter().find(|p| p.is_file()) else {
            let looked: Vec<String> = self
                .tokenizer_candidates
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            return Err(Error::format(
                model,
                format!(
                    "no tokenizer found beside the model (looked for {}); pass --tokenizer",
                    looked.join(", ")
                ),
            ));
        };
        Tokenizer::from_file_with_hf_config(path)
            .map_err(|e| Error::format(path, format!("cannot load the tokenizer: {e}")))
    }

    /// One line per ggml weight type of the checkpoint that loading converts into another
    /// kind of dtype (not Q4_0/Q4_1, which are repacked without loss), and per kind of GPTQ
    /// or AWQ tensor that is dequantised ([`SourceTensor::assembly_note`]): what it becomes,
    /// and what that costs in memory and accuracy; then one line listing the tensors of the
    /// file that are ignored ([`Checkpoint::ignored`]), if any.
    pub fn load_notes(&self) -> Vec<String> {
        let mut assembled: Vec<(String, usize)> = Vec::new();
        for note in self.tensors.iter().filter_map(SourceTensor::assembly_note) {
            match assembled.iter_mut().find(|(n, _)| *n == note) {
                Some((_, count)) => *count += 1,
                None => assembled.push((note, 1)),
            }
        }
        let mut by_type: Vec<(GgmlType, usize, usize)> = Vec::new();
        for t in &self.tensors {
            let Encoding::Ggml(ty) = t.encoding else {
                continue;
            };
            if ty.lossless_dtype().is_some() {
                continue;
            }
            let numel: usize = t.shape.iter().product();
            match by_type.iter_mut().find(|(u, ..)| *u == ty) {
                Some((_, n, values)) => (*n, *values) = (*n + 1, *values + numel),
                None => by_type.push((ty, 1, numel)),
            }
        }
        let mut notes: Vec<String> = by_type
            .into_iter()
            .map(|(ty, n, values)| {
                let bits = 8.0;
                let extra = values as f64 * (bits - ty.bits_per_weight() as f64) / 8.0;
                let how = "dequantised and requantised to int8 per row (adds int8 rounding, at most max|w|/254 per row)";
                format!(
                    "{n} {} tensors ({:.2} bits/weight) are {how}: {bits} bits/weight, {:.1} MiB more memory",
                    ty.name(),
                    ty.bits_per_weight(),
                    extra / (1024.0 * 1024.0)
                )
            })
            .chain(
                assembled
                    .into_iter()
                    .map(|(note, n)| format!("{n} tensors: {note}")),
            )
            .collect();
        if !self.ignored.is_empty() {
            notes.push(format!(
                "{} tensors of the file are not used by the graph and are ignored: {}",
                self.ignored.len(),
                self.ignored.join(", ")
            ));
        }
        notes
    }

    /// A function that loads tensor `name` (zero-copy where the encoding allows), checking
    /// its `shape`: what the graphs' `from_tensors` take. The tensors are indexed once
    /// ([`Checkpoint::sources`]), so loading every tensor of a model costs one lookup each.
    ///
    /// The function's errors: those of [`Sources::get`], and [`Error::Format`] when the
    /// bytes cannot be decoded.
    pub fn loader(&self) -> impl FnMut(TensorName, &[usize]) -> Result<flm_core::Data> + '_ {
        let sources = self.sources();
        move |name, shape| sources.get(name, shape)?.load()
    }

    /// The tensors indexed by name (one pass; [`Checkpoint::tensor`] scans for each).
    pub fn sources(&self) -> Sources<'_> {
        Sources(self.tensors.iter().map(|t| (t.name.as_str(), t)).collect())
    }
}

/// A checkpoint's tensors by canonical name ([`Checkpoint::sources`]).
pub struct Sources<'a>(HashMap<&'a str, &'a SourceTensor>);

impl<'a> Sources<'a> {
    /// The tensor `name`, if the checkpoint has it.
    pub fn find(&self, name: TensorName) -> Option<&'a SourceTensor> {
        self.0.get(name.to_string().as_str()).copied()
    }

    /// The tensor `name`, whose shape must be `shape`.
    ///
    /// Errors: [`Error::Config`] when the checkpoint lacks it; [`Error::Format`] when its
    /// shape is not `shape`.
    pub fn get(&self, name: TensorName, shape: &[usize]) -> Result<&'a SourceTensor> {
        let t = self
            .find(name)
            .ok_or_else(|| Error::Config(format!("the checkpoint has no tensor {name}")))?;
        if t.shape != shape {
            return Err(Error::format(
                t.file(),
                format!(
                    "tensor {name} has shape {:?}, the configuration implies {shape:?}",
                    t.shape
                ),
            ));
        }
        Ok(t)
    }
}

/// Memory-maps `path` read-only.
///
/// Safety note: the mapping is only sound while no other process truncates or rewrites the
/// file, the same contract every mmap-based loader (llama.cpp, safetensors) relies on.
pub(crate) fn map_file(path: &Path) -> Result<Arc<Mmap>> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: read-only shared mapping (memmap2's `Mmap::map` uses MAP_SHARED) of a
    // regular file; see the function doc for the external-modification caveat.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    Ok(Arc::new(map))
}

/// Random weights at the shapes of the Hugging Face `config.json` at `config`,
/// reproducible from `seed` (see [`SourceTensor::random`]); no tokenizer.
///
/// Errors: as for a Hugging Face directory's `config.json`.
pub fn random(config: &Path, seed: u64) -> Result<Checkpoint> {
    hf::random(config, seed)
}

/// Reads a tokenizer file of any kind flm-tokenizer reads
/// ([`Tokenizer::from_file_with_hf_config`]: SentencePiece `.model`, `tokenizer.json`,
/// llama2.c `tokenizer.bin`, ...) or a GGUF file's tokenizer metadata
/// ([`load_gguf_tokenizer`]), told apart by the GGUF magic.
///
/// Errors: [`Error::Io`] if it cannot be read; [`Error::Format`] if it is not a tokenizer
/// flm implements or is malformed.
pub fn load_tokenizer_file(path: &Path) -> Result<Tokenizer> {
    let mut magic = [0u8; 4];
    let n = File::open(path)
        .and_then(|mut f| f.read(&mut magic))
        .map_err(|e| Error::io(path, e))?;
    if magic[..n] == *b"GGUF" {
        return gguf::load_tokenizer(path);
    }
    Tokenizer::from_file_with_hf_config(path)
        .map_err(|e| Error::format(path, format!("cannot load the tokenizer: {e}")))
}

/// Loads the checkpoint at `path` (a file or a directory), detecting its format.
///
/// Errors: [`Error::Io`] if it cannot be read; [`Error::Format`] if it is truncated,
/// corrupted or of an unknown kind; [`Error::Config`] if its hyper-parameters are invalid.
pub fn load(path: &Path) -> Result<Checkpoint> {
    if path.is_dir() {
        return hf::load_dir(path, None);
    }
    let mut magic = [0u8; 9];
    let n = File::open(path)
        .and_then(|mut f| f.read(&mut magic))
        .map_err(|e| Error::io(path, e))?;
    let magic = &magic[..n];
    if flm_core::flm_file::is_flm(magic) {
        return flm::load(path);
    }
    if magic.starts_with(&llama2c::MAGIC.to_le_bytes()) {
        return llama2c::load(path);
    }
    if magic.starts_with(b"GGUF") {
        return gguf::load(path);
    }
    if magic.len() == 9 && magic[8] == b'{' {
        let dir = path.parent().unwrap_or(Path::new("."));
        return hf::load_dir(dir, Some(path));
    }
    llama2c::load(path)
}
