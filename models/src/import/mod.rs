//! Checkpoint importers.
//!
//! [`load`] detects the format from the bytes, not from the file name:
//!
//! | what the path holds | format |
//! |---|---|
//! | a directory with `config.json` | Hugging Face (safetensors, one file or sharded) |
//! | a file starting with a safetensors header | Hugging Face; `config.json` is read beside it |
//! | a file starting with magic `0x616b3432` ("ak42") | llama2.c v1 (fp32) or v2 (Q8_0) |
//! | a file whose 28-byte header predicts its exact size | llama2.c legacy (v0) |
//!
//! Importers list the tensors under flm's canonical names as lazily read
//! [`SourceTensor`]s: weights are zero-copy views of the mapped files where their dtype is
//! f32, f16 or bf16, and are dequantised to f32 when loaded otherwise (llama2.c v2).

mod hf;
mod llama2c;
mod source;

pub use source::{Encoding, SourceTensor};

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use flm_tokenizer::Tokenizer;

use crate::llama::LlamaWeights;
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
}

/// A loaded checkpoint.
#[derive(Debug)]
pub struct Checkpoint {
    /// The detected format.
    pub format: Format,
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// Every tensor, under its canonical name, not yet read.
    pub tensors: Vec<SourceTensor>,
    /// The tokenizer stored inside the checkpoint, if its format carries one.
    pub tokenizer: Option<Tokenizer>,
    /// Tokenizer files that may sit beside the checkpoint, most likely first.
    pub tokenizer_candidates: Vec<PathBuf>,
}

impl Checkpoint {
    /// The tensor with canonical name `name`.
    pub fn tensor(&self, name: &str) -> Option<&SourceTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Loads every weight (zero-copy where the encoding allows).
    ///
    /// Errors: [`Error::Format`] for a missing tensor or one whose shape disagrees with
    /// the configuration.
    pub fn weights(&self) -> Result<LlamaWeights> {
        LlamaWeights::from_tensors(&self.config, |name, shape| {
            let t = self
                .tensor(name)
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
            t.load()
        })
    }
}

/// Memory-maps `path` read-only.
///
/// Safety note: the mapping is only sound while no other process truncates or rewrites the
/// file, the same contract every mmap-based loader (llama.cpp, safetensors) relies on.
pub(crate) fn map_file(path: &Path) -> Result<Arc<Mmap>> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: read-only private mapping of a regular file; see the function doc for the
    // external-modification caveat.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    Ok(Arc::new(map))
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
    if magic.starts_with(&llama2c::MAGIC.to_le_bytes()) {
        return llama2c::load(path);
    }
    if magic.starts_with(b"GGUF") {
        return Err(Error::format(
            path,
            "GGUF checkpoints are not supported yet; use a Hugging Face directory or a \
             llama2.c .bin",
        ));
    }
    if magic.len() == 9 && magic[8] == b'{' {
        let dir = path.parent().unwrap_or(Path::new("."));
        return hf::load_dir(dir, Some(path));
    }
    llama2c::load(path)
}
