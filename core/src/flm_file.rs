//! The .flm model file: one file holding a model's configuration, its tokenizer and every
//! tensor, laid out so that loading is an mmap and tensors are zero-copy views.
//!
//! Byte layout (little-endian; the normative description is `docs/flm-format.md`):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `89 46 4C 4D 0D 0A 1A 0A` (`\x89FLM\r\n\x1a\n`) |
//! | 8 | 2 | major version (readers refuse a newer major) |
//! | 10 | 2 | minor version (additions a reader may ignore) |
//! | 12 | 4 | reserved, 0 |
//! | 16 | 8 | `metadata_len`: bytes of the JSON metadata |
//! | 24 | 8 | `data_offset`: start of the tensor data, a multiple of [`ALIGN`] |
//! | 32 | `metadata_len` | metadata, UTF-8 JSON: `{"config": …, "tokenizer": … or null, "tensors": [{"name", "dtype", "shape", "offset", "size"}, …]}` |
//! | … | … | zero padding up to `data_offset` |
//! | `data_offset` | … | tensor data; each tensor at `data_offset + offset`, `offset` a multiple of [`ALIGN`], zero padding between tensors |
//!
//! `dtype` is the name of a [`DataType`] (`"f32"`, `"int8"`, `"int4-g32"`, …) and `size`
//! must equal the byte size the dtype gives for `shape` ([`DataType::byte_len`]). The
//! meaning of `config` and `tokenizer` belongs to the model and tokenizer crates; this
//! module stores them as JSON values.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::partial_file::PartialFile;
use crate::{Data, DataType, Error, Result};

/// The first 8 bytes of every .flm file.
pub const MAGIC: [u8; 8] = *b"\x89FLM\r\n\x1a\n";
/// The major format version this build writes and reads.
pub const FORMAT_MAJOR: u16 = 2;
/// The minor format version this build writes.
pub const FORMAT_MINOR: u16 = 7;
/// Alignment of the data section and of every tensor, in bytes.
pub const ALIGN: u64 = 64;
const HEADER_LEN: u64 = 32;

/// One tensor's entry in the metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorInfo {
    /// Canonical name.
    pub name: String,
    /// Element type, by name.
    #[serde(with = "dtype_name")]
    pub dtype: DataType,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Offset from the start of the data section, a multiple of [`ALIGN`].
    pub offset: u64,
    /// Bytes.
    pub size: u64,
}

mod dtype_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::DataType;

    pub fn serialize<S: Serializer>(d: &DataType, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(d.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DataType, D::Error> {
        let name = String::deserialize(d)?;
        DataType::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown dtype \"{name}\"")))
    }
}

#[derive(Serialize, Deserialize)]
struct Metadata {
    config: Value,
    tokenizer: Option<Value>,
    tensors: Vec<TensorInfo>,
}

fn align(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

/// Whether `bytes` start with the .flm magic.
pub fn is_flm(bytes: &[u8]) -> bool {
    bytes.starts_with(&MAGIC)
}

/// An opened .flm file.
pub struct FlmFile {
    path: PathBuf,
    map: Arc<Mmap>,
    data_offset: u64,
    version: (u16, u16),
    config: Value,
    tokenizer: Option<Value>,
    tensors: Vec<TensorInfo>,
}

impl FlmFile {
    /// Maps and validates `path` against every rule of docs/flm-format.md: magic, version,
    /// reserved field, metadata, zero padding, and every tensor's dtype, size, alignment
    /// and bounds, each name once, the tensors in file order without overlap.
    ///
    /// Errors: [`Error::Io`] if it cannot be read; [`Error::Format`] naming the first
    /// problem (truncated, wrong magic, newer major version, bad metadata, a tensor out of
    /// bounds, overlapping another or listed twice, non-zero padding).
    pub fn open(path: &Path) -> Result<FlmFile> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: read-only mapping of a regular file; sound as long as no other process
        // truncates or rewrites it while mapped, the contract of every mmap-based loader.
        let map = Arc::new(unsafe { Mmap::map(&file) }.map_err(io)?);
        let bad = |msg: String| Error::Format {
            path: path.to_path_buf(),
            msg,
        };
        if map.len() < HEADER_LEN as usize {
            return Err(bad(format!("truncated .flm file: {} bytes", map.len())));
        }
        if !is_flm(&map) {
            return Err(bad("not a .flm file (wrong magic)".into()));
        }
        let u16_at = |o: usize| u16::from_le_bytes([map[o], map[o + 1]]);
        let u64_at = |o: usize| u64::from_le_bytes(map[o..o + 8].try_into().unwrap_or([0; 8]));
        let version = (u16_at(8), u16_at(10));
        if version.0 != FORMAT_MAJOR {
            return Err(bad(format!(
                ".flm format version {}.{} is not supported by this build (it reads {}.x); \
                 convert the model again or upgrade flm",
                version.0, version.1, FORMAT_MAJOR
            )));
        }
        let (meta_len, data_offset) = (u64_at(16), u64_at(24));
        let file_len = map.len() as u64;
        let meta_end = HEADER_LEN.checked_add(meta_len);
        if meta_end.is_none_or(|end| end > data_offset) || data_offset > file_len {
            return Err(bad(format!(
                "truncated or corrupted header: metadata of {meta_len} bytes, data at \
                 {data_offset}, file of {file_len} bytes"
            )));
        }
        if data_offset % ALIGN != 0 {
            return Err(bad(format!(
                "data offset {data_offset} is not {ALIGN}-byte aligned"
            )));
        }
        let reserved = u32::from_le_bytes([map[12], map[13], map[14], map[15]]);
        if reserved != 0 {
            return Err(bad(format!("reserved header field is {reserved}, not 0")));
        }
        let meta_end = (HEADER_LEN + meta_len) as usize;
        let meta = &map[HEADER_LEN as usize..meta_end];
        let meta: Metadata =
            serde_json::from_slice(meta).map_err(|e| bad(format!("invalid metadata: {e}")))?;
        if map[meta_end..data_offset as usize].iter().any(|&b| b != 0) {
            return Err(bad(
                "the padding between the metadata and the data is not zero".into(),
            ));
        }
        let mut names = HashSet::with_capacity(meta.tensors.len());
        // End of the previous tensor, relative to the data section.
        let mut previous_end = 0u64;
        for t in &meta.tensors {
            if !names.insert(t.name.as_str()) {
                return Err(bad(format!("tensor {} is listed twice", t.name)));
            }
            match t.dtype.byte_len(&t.shape) {
                Some(n) if n as u64 == t.size => {}
                Some(n) => {
                    return Err(bad(format!(
                        "tensor {}: {} bytes stored, a {} tensor of shape {:?} needs {n}",
                        t.name, t.size, t.dtype, t.shape
                    )))
                }
                None => {
                    return Err(bad(format!(
                        "tensor {}: the byte size of a {} tensor of shape {:?} overflows",
                        t.name, t.dtype, t.shape
                    )))
                }
            }
            let end = data_offset
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(t.size));
            if t.offset % ALIGN != 0 || end.is_none_or(|e| e > file_len) {
                return Err(bad(format!(
                    "tensor {}: data at offset {} (+{} bytes) is misaligned or past the end \
                     of the file ({file_len} bytes; truncated?)",
                    t.name, t.offset, t.size
                )));
            }
            if t.offset < previous_end {
                return Err(bad(format!(
                    "tensor {} at offset {} overlaps the tensor before it, or is out of file \
                     order (that one ends at {previous_end})",
                    t.name, t.offset
                )));
            }
            let gap = (data_offset + previous_end) as usize..(data_offset + t.offset) as usize;
            if map[gap].iter().any(|&b| b != 0) {
                return Err(bad(format!(
                    "the padding before tensor {} is not zero",
                    t.name
                )));
            }
            previous_end = t.offset + t.size;
        }
        Ok(FlmFile {
            path: path.to_path_buf(),
            map,
            data_offset,
            version,
            config: meta.config,
            tokenizer: meta.tokenizer,
            tensors: meta.tensors,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `(major, minor)` format version of the file.
    pub fn version(&self) -> (u16, u16) {
        self.version
    }

    /// The model configuration, as stored.
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// The tokenizer description, as stored.
    pub fn tokenizer(&self) -> Option<&Value> {
        self.tokenizer.as_ref()
    }

    /// The tensor entries, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The mapping and the absolute byte offset of tensor `info` in it.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> (&Arc<Mmap>, usize) {
        (&self.map, (self.data_offset + info.offset) as usize)
    }

    /// Tensor `name` as a zero-copy view of the mapping.
    ///
    /// Errors: [`Error::Format`] if there is no such tensor.
    pub fn tensor(&self, name: &str) -> Result<Data> {
        let info = self
            .tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| Error::Format {
                path: self.path.clone(),
                msg: format!("no tensor {name}"),
            })?;
        let (map, offset) = self.tensor_bytes(info);
        Data::from_mmap(map, offset, info.dtype, &info.shape)
    }
}

/// Writes a .flm file tensor by tensor, atomically.
///
/// The output gets its name only when [`FlmWriter::finish`] completes it, so an interrupted
/// conversion never leaves a partial .flm behind: on Linux it is written unnamed
/// (`O_TMPFILE`) and linked into place, elsewhere it is a temporary file of the
/// destination's directory renamed over the destination (removed when the writer is
/// dropped unfinished). Creating a writer removes the partial files that killed
/// conversions left in that directory. See `partial_file` for the details.
pub struct FlmWriter {
    dest: PathBuf,
    out: BufWriter<PartialFile>,
    tensors: Vec<TensorInfo>,
    next: usize,
    position: u64,
}

impl FlmWriter {
    /// Starts `dest` with the metadata and the plan of tensors `(name, dtype, shape)`, in
    /// the order they will be written.
    ///
    /// Errors: [`Error::Io`] if the temporary file cannot be created or written;
    /// [`Error::Shape`] if a tensor's size overflows.
    pub fn create(
        dest: &Path,
        config: Value,
        tokenizer: Option<Value>,
        plan: &[(String, DataType, Vec<usize>)],
    ) -> Result<FlmWriter> {
        let io = |source| Error::Io {
            path: dest.to_path_buf(),
            source,
        };
        let mut offset = 0u64;
        let mut tensors = Vec::with_capacity(plan.len());
        for (name, dtype, shape) in plan {
            let size = dtype.byte_len(shape).ok_or_else(|| Error::Shape {
                op: "FlmWriter",
                msg: format!("{name}: {dtype} shape {shape:?} overflows"),
            })? as u64;
            tensors.push(TensorInfo {
                name: name.clone(),
                dtype: *dtype,
                shape: shape.clone(),
                offset,
                size,
            });
            offset = align(offset + size);
        }
        let meta = serde_json::to_vec(&Metadata {
            config,
            tokenizer,
            tensors: tensors.clone(),
        })
        .map_err(|e| Error::InvalidArgument(format!("metadata does not serialise: {e}")))?;
        let data_offset = align(HEADER_LEN + meta.len() as u64);
        let partial = PartialFile::create(dest).map_err(io)?;
        let mut out = BufWriter::with_capacity(1 << 20, partial);
        let mut header = Vec::with_capacity(HEADER_LEN as usize);
        header.extend_from_slice(&MAGIC);
        header.extend_from_slice(&FORMAT_MAJOR.to_le_bytes());
        header.extend_from_slice(&FORMAT_MINOR.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        header.extend_from_slice(&(meta.len() as u64).to_le_bytes());
        header.extend_from_slice(&data_offset.to_le_bytes());
        out.write_all(&header).map_err(io)?;
        out.write_all(&meta).map_err(io)?;
        let pad = data_offset - HEADER_LEN - meta.len() as u64;
        out.write_all(&vec![0u8; pad as usize]).map_err(io)?;
        Ok(FlmWriter {
            dest: dest.to_path_buf(),
            out,
            tensors,
            next: 0,
            position: 0,
        })
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io {
            path: self.dest.clone(),
            source,
        }
    }

    /// The plan entry of the next tensor to write, if any is left.
    pub fn next_tensor(&self) -> Option<&TensorInfo> {
        self.tensors.get(self.next)
    }

    /// Writes the next tensor of the plan.
    ///
    /// Errors: [`Error::InvalidArgument`] if `data` is not the next planned tensor's dtype
    /// and shape (or every tensor was written); [`Error::Io`] on a write error.
    pub fn write_tensor(&mut self, data: &Data) -> Result<()> {
        let info = self
            .tensors
            .get(self.next)
            .ok_or_else(|| Error::InvalidArgument("more tensors written than planned".into()))?;
        if info.dtype != data.dtype() || info.shape != data.shape() {
            return Err(Error::InvalidArgument(format!(
                "tensor {} planned as {} {:?}, got {} {:?}",
                info.name,
                info.dtype,
                info.shape,
                data.dtype(),
                data.shape()
            )));
        }
        let bytes = data.bytes()?;
        let pad = info.offset - self.position;
        let size = info.size;
        let result = self
            .out
            .write_all(&vec![0u8; pad as usize])
            .and_then(|()| self.out.write_all(bytes));
        result.map_err(|e| self.io(e))?;
        self.position = info.offset + size;
        self.next += 1;
        Ok(())
    }

    /// Flushes and syncs the file, then gives it its name.
    ///
    /// Errors: [`Error::InvalidArgument`] if planned tensors were not written;
    /// [`Error::Io`] if flushing or naming fails (the destination is then untouched).
    pub fn finish(self) -> Result<()> {
        if self.next != self.tensors.len() {
            return Err(Error::InvalidArgument(format!(
                "{} of {} tensors written",
                self.next,
                self.tensors.len()
            )));
        }
        let dest = self.dest.clone();
        let io = |source| Error::Io {
            path: dest.clone(),
            source,
        };
        let partial = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        partial.persist().map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read_back_zero_copy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.flm");
        let a = Data::from_f32(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let b = Data::from_f32(&[40], &(0..40).map(|i| i as f32).collect::<Vec<_>>())
            .unwrap()
            .to_dtype(DataType::I4G32)
            .unwrap();
        let plan = vec![
            ("a".to_string(), DataType::F32, vec![2, 3]),
            ("b".to_string(), DataType::I4G32, vec![40]),
        ];
        let mut w = FlmWriter::create(&path, serde_json::json!({"k": 1}), None, &plan).unwrap();
        assert!(w.write_tensor(&b).is_err(), "out of order");
        w.write_tensor(&a).unwrap();
        w.write_tensor(&b).unwrap();
        w.finish().unwrap();
        let f = FlmFile::open(&path).unwrap();
        assert_eq!(f.config()["k"], 1);
        let back = f.tensor("a").unwrap();
        assert!(back.is_mapped());
        assert_eq!(back.as_f32().unwrap(), a.as_f32().unwrap());
        assert_eq!(f.tensor("b").unwrap().bytes().unwrap(), b.bytes().unwrap());
        assert_eq!(f.tensors()[1].offset % ALIGN, 0);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left");
    }

    #[test]
    fn an_unfinished_writer_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.flm");
        let plan = vec![("a".to_string(), DataType::F32, vec![1])];
        let w = FlmWriter::create(&path, Value::Null, None, &plan).unwrap();
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn padding_between_tensors_must_be_zero() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.flm");
        let plan = vec![
            ("a".to_string(), DataType::F32, vec![3]),
            ("b".to_string(), DataType::F32, vec![2]),
        ];
        let mut w = FlmWriter::create(&path, Value::Null, None, &plan).unwrap();
        w.write_tensor(&Data::from_f32(&[3], &[1.0, 2.0, 3.0]).unwrap())
            .unwrap();
        w.write_tensor(&Data::from_f32(&[2], &[4.0, 5.0]).unwrap())
            .unwrap();
        w.finish().unwrap();
        let f = FlmFile::open(&path).unwrap();
        let (_, a) = f.tensor_bytes(&f.tensors()[0]);
        drop(f);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[a + 12] = 1;
        std::fs::write(&path, &bytes).unwrap();
        let err = FlmFile::open(&path).err().unwrap().to_string();
        assert!(err.contains("padding before tensor b"), "{err}");
    }
}
