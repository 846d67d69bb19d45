//! Tensors as their checkpoint stores them, read lazily.
//!
//! Every importer lists the tensors of a checkpoint under flm's canonical names (see
//! [`crate::tensor_names`]) as [`SourceTensor`]s: a byte range of
//! a mapped file plus its encoding. Loading one is zero-copy when the encoding is a flm
//! dtype, and a dequantisation into f32 otherwise, so a converter that loads, converts and
//! writes one tensor at a time never holds more than one tensor in memory.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flm_core::blocks;
use flm_core::ggml::GgmlType;
use flm_core::{quant, Data, DataType};
use memmap2::Mmap;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{Error, Result};

/// How a tensor's values are encoded in its source file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Elements of a flm dtype, little-endian, row-major: used in place.
    Native(DataType),
    /// llama2.c v2 "Q8_0": all int8 values of the tensor, then one f32 scale per
    /// `group` consecutive values; `w = q · scale` (llama2.c `export.py` `quantize_q80`).
    Llama2cQ8 {
        /// Values per scale.
        group: usize,
    },
    /// A ggml block type (GGUF) that no flm dtype holds byte for byte, decoded as
    /// [`flm_core::ggml`] describes: repacked into its [`GgmlType::lossless_dtype`] on load
    /// where it has one (Q4_0, Q4_1), and dequantised then requantised to int8 per row
    /// otherwise (see [`Encoding::load_dtype`]).
    Ggml(GgmlType),
}

impl Encoding {
    /// Bytes that a tensor of `shape` takes, or `None` if it does not fit the encoding's
    /// blocks (ggml types: each row a whole number of blocks) or the size overflows.
    pub fn byte_len(self, shape: &[usize]) -> Option<usize> {
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
        match self {
            Encoding::Native(dtype) => dtype.byte_len(shape),
            Encoding::Llama2cQ8 { group } => (group > 0 && numel % group == 0)
                .then(|| numel.checked_add((numel / group).checked_mul(4)?))
                .flatten(),
            // Whole blocks in every row, which decoding row by row relies on.
            Encoding::Ggml(ty) => ty
                .byte_len(shape.last().copied().unwrap_or(1))
                .and_then(|_| ty.byte_len(numel)),
        }
    }

    /// The dtype a tensor of this encoding has once loaded: its own for
    /// [`Encoding::Native`] (Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and MXFP4 tensors
    /// are native flm dtypes); for the other ggml types the lossless repacking (Q4_0 as
    /// int4-sym-g32, Q4_1 as int4-g32), and int8 per row for the types no flm dtype holds
    /// (Q5_1, Q2_K, Q3_K): fast integer kernels at 8.1 bits per weight, at the cost of
    /// the int8 rounding (at most `max|w| / 254` per row, [`flm_core::quant`]) on top of
    /// the file's own; f32 for llama2.c's Q8_0.
    pub fn load_dtype(self) -> DataType {
        match self {
            Encoding::Native(dtype) => dtype,
            Encoding::Ggml(ty) => ty.lossless_dtype().unwrap_or(DataType::I8),
            Encoding::Llama2cQ8 { .. } => DataType::F32,
        }
    }
}

/// Where a tensor's values come from.
#[derive(Debug, Clone)]
enum Backing {
    /// `map[offset..]`, in the tensor's encoding.
    Mapped { map: Arc<Mmap>, offset: usize },
    /// Synthesised from a seed (benchmarks at real shapes without real weights).
    Random { seed: u64 },
    /// Rows of another tensor, gathered on load (fused checkpoint tensors split into flm's
    /// canonical ones, such as ChatGLM-6B's per-head interleaved `query_key_value`).
    Rows {
        parent: Box<SourceTensor>,
        ranges: Vec<Range<usize>>,
    },
    /// Assembled from several stored tensors (GPTQ and AWQ packed int4).
    Assembled(Arc<dyn Assemble>),
}

/// A tensor that an importer assembles on load from several stored tensors (GPTQ's and
/// AWQ's packed codes, zero points and scales: [`super::packed`]).
pub(crate) trait Assemble: std::fmt::Debug + Send + Sync {
    /// The tensor's values, in the dtype its [`SourceTensor`] was declared with.
    fn load(&self) -> Result<Data>;
    /// One line on what loading changes (a dequantisation and its cost), or `None` when
    /// the values are kept as stored.
    fn note(&self) -> Option<String>;
    /// As [`SourceTensor::release`], for the stored tensors it reads.
    fn release(&self);
    /// Whether the loaded tensor has an input permutation ([`Data::input_perm`]).
    fn permuted(&self) -> bool;
}

/// One tensor of a checkpoint, not yet read.
#[derive(Debug, Clone)]
pub struct SourceTensor {
    /// flm's canonical name (`embedding`, `layers.3.wq`, ...).
    pub name: String,
    /// Logical shape, outermost first (`[out, in]` for matrices).
    pub shape: Vec<usize>,
    /// How the bytes encode the values.
    pub encoding: Encoding,
    backing: Backing,
    file: PathBuf,
    /// The i32 input permutation stored beside the tensor (`<name>.perm` in a .flm file),
    /// attached on load ([`Data::input_perm`]).
    perm: Option<Box<SourceTensor>>,
}

impl SourceTensor {
    /// A tensor at `map[offset..]`.
    ///
    /// Errors: [`Error::Format`] if the encoding cannot hold `shape` or the bytes do not fit
    /// in the file.
    pub fn new(
        name: impl Into<String>,
        shape: Vec<usize>,
        encoding: Encoding,
        map: &Arc<Mmap>,
        offset: usize,
        file: &Path,
    ) -> Result<SourceTensor> {
        let name = name.into();
        let len = encoding.byte_len(&shape).ok_or_else(|| {
            Error::format(
                file,
                format!("tensor {name}: shape {shape:?} does not fit {encoding:?}"),
            )
        })?;
        if offset.checked_add(len).is_none_or(|end| end > map.len()) {
            return Err(Error::format(
                file,
                format!(
                    "tensor {name}: {len} bytes at offset {offset} run past the end of the file ({} bytes)",
                    map.len()
                ),
            ));
        }
        Ok(SourceTensor {
            name,
            shape,
            encoding,
            backing: Backing::Mapped {
                map: Arc::clone(map),
                offset,
            },
            file: file.to_path_buf(),
            perm: None,
        })
    }

    /// A tensor of random f32 values, reproducible from `seed`: vectors (norm gains) are
    /// 1, matrices uniform in `±1/sqrt(cols)` (the scale of PyTorch's default `nn.Linear`
    /// initialisation), so activations stay finite through any number of layers.
    /// `origin` names where the shapes came from, for messages.
    pub fn random(name: impl Into<String>, shape: Vec<usize>, seed: u64, origin: &Path) -> Self {
        SourceTensor {
            name: name.into(),
            shape,
            encoding: Encoding::Native(DataType::F32),
            backing: Backing::Random { seed },
            file: origin.to_path_buf(),
            perm: None,
        }
    }

    /// A tensor of `dtype` (once loaded) that `parts` assembles on load; `file` names where
    /// it is stored, for messages.
    pub(crate) fn assembled(
        name: String,
        shape: Vec<usize>,
        dtype: DataType,
        file: &Path,
        parts: Arc<dyn Assemble>,
    ) -> SourceTensor {
        SourceTensor {
            name,
            shape,
            encoding: Encoding::Native(dtype),
            backing: Backing::Assembled(parts),
            file: file.to_path_buf(),
            perm: None,
        }
    }

    /// What loading this tensor changes, in one line, for a tensor assembled from several
    /// stored ones (GPTQ, AWQ); `None` otherwise, or when the values are kept as stored.
    pub fn assembly_note(&self) -> Option<String> {
        match &self.backing {
            Backing::Assembled(parts) => parts.note(),
            _ => None,
        }
    }

    /// The rows `ranges` of this tensor (its first dimension), in order, as a tensor named
    /// `name`: a view of the same bytes when they are one range of a natively encoded
    /// tensor, rows gathered into an owned tensor on load otherwise.
    ///
    /// Errors: [`Error::Format`] if a range is empty or past the tensor's rows, or the
    /// tensor is not at least one-dimensional.
    pub fn rows(&self, name: impl Into<String>, ranges: Vec<Range<usize>>) -> Result<SourceTensor> {
        let name = name.into();
        let n_rows = self.shape.first().copied().unwrap_or(0);
        if ranges.is_empty() || ranges.iter().any(|r| r.is_empty() || r.end > n_rows) {
            return Err(Error::format(
                &self.file,
                format!(
                    "tensor {}: rows {ranges:?} of shape {:?} for {name}",
                    self.name, self.shape
                ),
            ));
        }
        let mut shape = self.shape.clone();
        shape[0] = ranges.iter().map(|r| r.len()).sum();
        if let ([range], Encoding::Native(dtype), Backing::Mapped { map, offset }) =
            (ranges.as_slice(), self.encoding, &self.backing)
        {
            let row_bytes = dtype.byte_len(&self.shape[1..]).unwrap_or(0);
            let mut rows = SourceTensor::new(
                name,
                shape,
                self.encoding,
                map,
                offset + range.start * row_bytes,
                &self.file,
            )?;
            rows.perm = self.perm.clone();
            return Ok(rows);
        }
        let encoding = Encoding::Native(self.encoding.load_dtype());
        Ok(SourceTensor {
            name,
            shape,
            encoding,
            backing: Backing::Rows {
                parent: Box::new(self.clone()),
                ranges,
            },
            file: self.file.clone(),
            perm: None,
        })
    }

    /// This tensor with `perm` (an i32 tensor `[cols]`, stored beside it) as its input
    /// permutation, attached on load ([`Data::input_perm`], which checks that it is a
    /// permutation).
    ///
    /// Errors: [`Error::Format`] if `perm` is not i32 of one value per column.
    pub fn with_input_perm(mut self, perm: SourceTensor) -> Result<SourceTensor> {
        let cols = self.shape.last().copied().unwrap_or(0);
        if perm.encoding != Encoding::Native(DataType::I32) || perm.shape != [cols] {
            return Err(Error::format(
                &self.file,
                format!(
                    "tensor {}: input permutation {} is {:?} {:?}, not i32 [{cols}]",
                    self.name, perm.name, perm.encoding, perm.shape
                ),
            ));
        }
        self.perm = Some(Box::new(perm));
        Ok(self)
    }

    /// Whether the loaded tensor has an input permutation ([`Data::input_perm`]).
    pub fn has_input_perm(&self) -> bool {
        self.perm.is_some()
            || match &self.backing {
                Backing::Assembled(parts) => parts.permuted(),
                Backing::Rows { parent, .. } => parent.has_input_perm(),
                _ => false,
            }
    }

    /// The file the tensor is read from.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Tells the kernel that this tensor's pages of the mapped file are not needed any more
    /// (`MADV_DONTNEED`), so a converter streaming a large checkpoint does not keep every
    /// page it has read resident. The bytes stay valid: a later access reads them again
    /// from the file. A no-op for random tensors and on non-Unix systems.
    pub fn release(&self) {
        if let Some(perm) = &self.perm {
            perm.release();
        }
        match &self.backing {
            Backing::Rows { parent, .. } => parent.release(),
            Backing::Assembled(parts) => parts.release(),
            _ => {}
        }
        #[cfg(unix)]
        if let (Backing::Mapped { map, offset }, Some(len)) =
            (&self.backing, self.encoding.byte_len(&self.shape))
        {
            // `shape` and `encoding` are public, so the range checked in `new` may have
            // changed since: check it again.
            if offset.checked_add(len).is_none_or(|end| end > map.len()) {
                return;
            }
            // SAFETY: `map_file` maps the file read-only and shared (MAP_SHARED). Dropping
            // the pages of a shared file mapping only discards this process's copies; any
            // later read of the range (through this or another view of the Arc'd map)
            // faults the unchanged bytes back in from the file, so no reference ever sees
            // different contents. The range lies inside the map (checked just above). The
            // advice is best effort, so its result is ignored.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, *offset, len)
            };
        }
    }

    /// The encoded bytes in the mapped file (`None` for a random tensor).
    pub fn bytes(&self) -> Option<&[u8]> {
        let Backing::Mapped { map, offset } = &self.backing else {
            return None;
        };
        let len = self.encoding.byte_len(&self.shape).unwrap_or(0);
        map.get(*offset..offset + len)
    }

    /// The tensor as [`Data`] of its [`Encoding::load_dtype`]: a view of the mapped file
    /// for [`Encoding::Native`], an owned tensor decoded from the file otherwise, generated
    /// for random tensors.
    pub fn load(&self) -> Result<Data> {
        let data = self.load_values()?;
        match &self.perm {
            Some(perm) => data
                .with_input_perm(perm.load()?)
                .map_err(|e| Error::format(&self.file, format!("tensor {}: {e}", self.name))),
            None => Ok(data),
        }
    }

    /// The tensor's values, without the permutation stored beside them.
    fn load_values(&self) -> Result<Data> {
        let (map, offset) = match &self.backing {
            Backing::Mapped { map, offset } => (map, *offset),
            Backing::Random { seed } => return Ok(random_data(&self.shape, *seed)?),
            Backing::Rows { parent, ranges } => return gather_rows(parent, ranges, &self.shape),
            Backing::Assembled(parts) => return parts.load(),
        };
        let bytes = self.bytes().unwrap_or_default();
        let values: Vec<f32> = match self.encoding {
            Encoding::Native(dtype) => {
                return Ok(Data::from_mmap(map, offset, dtype, &self.shape)?)
            }
            Encoding::Llama2cQ8 { group } => {
                let (q, scales) = bytes.split_at(self.shape.iter().product());
                q.chunks(group)
                    .zip(scales.chunks_exact(4))
                    .flat_map(|(qs, s)| {
                        let s = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                        qs.iter().map(move |&b| b as i8 as f32 * s)
                    })
                    .collect()
            }
            Encoding::Ggml(ty) => return ggml_data(ty, bytes, &self.shape),
        };
        Ok(Data::from_f32(&self.shape, &values)?)
    }
}

/// A tensor of ggml type `ty` (`bytes`, whole rows of `shape`'s last dimension) as
/// [`Encoding::load_dtype`] says, one row at a time.
fn ggml_data(ty: GgmlType, bytes: &[u8], shape: &[usize]) -> Result<Data> {
    let dtype = Encoding::Ggml(ty).load_dtype();
    let mut data = Data::zeros(dtype, shape)?;
    let cols = data.cols().max(1);
    let src_row = ty.byte_len(cols).unwrap_or(0).max(1);
    let dst_row = flm_core::quant::row_bytes(dtype, cols).unwrap_or(cols * dtype.size_of());
    let mut values = vec![0f32; cols];
    let dst = data.bytes_mut()?;
    for (src, dst) in bytes
        .chunks_exact(src_row)
        .zip(dst.chunks_exact_mut(dst_row))
    {
        if ty.lossless_dtype().is_some() {
            quant::repack_ggml_row(ty, src, dst);
            continue;
        }
        blocks::dequantize(ty, src, &mut values);
        flm_core::quant::quantize_row(dtype, &values, dst);
    }
    Ok(data)
}

/// The rows `ranges` of `parent`, in its [`Encoding::load_dtype`].
fn gather_rows(parent: &SourceTensor, ranges: &[Range<usize>], shape: &[usize]) -> Result<Data> {
    let data = parent.load()?;
    let row_bytes = data.size_bytes() / data.shape()[0].max(1);
    let mut bytes = Vec::with_capacity(shape[0] * row_bytes);
    for r in ranges {
        bytes.extend_from_slice(&data.bytes()?[r.start * row_bytes..r.end * row_bytes]);
    }
    let rows = Data::from_bytes(data.dtype(), shape, &bytes)?;
    match data.input_perm() {
        Some(perm) => Ok(rows.with_input_perm(perm.clone())?),
        None => Ok(rows),
    }
}

/// Random values for [`SourceTensor::random`], from a ChaCha8 stream: identical on every
/// platform.
fn random_data(shape: &[usize], seed: u64) -> flm_core::Result<Data> {
    let mut data = Data::zeros(DataType::F32, shape)?;
    let cols = data.cols().max(1);
    let values = data.as_f32_mut()?;
    if shape.len() < 2 {
        values.fill(1.0);
        return Ok(data);
    }
    let scale = 1.0 / (cols as f32).sqrt();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for v in values.iter_mut() {
        *v = rng.random_range(-scale..scale);
    }
    Ok(data)
}
