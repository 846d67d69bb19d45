//! PyTorch checkpoints written by `torch.save`: `pytorch_model.bin`, or the shards that
//! `pytorch_model.bin.index.json` lists.
//!
//! Since PyTorch 1.6, `torch.save` writes a zip archive (`torch/serialization.py`,
//! `_save`): `<prefix>/data.pkl` pickles the state dict, whose tensors name their storages
//! by persistent ids, and the raw little-endian bytes of each storage are the entry
//! `<prefix>/data/<key>`, stored uncompressed and 64-byte aligned. This importer reads the
//! pickle with flm's restricted unpickler ([`super::pickle`]), which never runs code, and
//! lists each tensor as a zero-copy view of the mapped archive: the data offset of its
//! storage's entry (from the entry's local header) plus `storage_offset × element size`.
//!
//! Refused with an error saying so: the legacy format of PyTorch before 1.6 (a bare
//! pickle stream), compressed or encrypted entries, big-endian archives, tensors whose
//! strides are not row-major contiguous, and dtypes other than f32, f16 and bf16.

use std::collections::HashMap;
use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;

use flm_core::DataType;
use memmap2::Mmap;
use zip::{CompressionMethod, ZipArchive};

use super::{pickle, Encoding, SourceTensor};
use crate::{Error, Result};

/// A torch storage class: its name, element size and flm dtype (if flm has one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StorageType {
    /// Name under `torch.` (`FloatStorage`).
    pub name: &'static str,
    /// Bytes per element.
    pub elem_size: usize,
    /// The flm dtype of the elements; `None` where flm has none (int64, f64, ...).
    pub dtype: Option<DataType>,
}

const fn storage(name: &'static str, elem_size: usize, dtype: Option<DataType>) -> StorageType {
    StorageType {
        name,
        elem_size,
        dtype,
    }
}

/// The storage classes of `torch.save` persistent ids (`torch/storage.py`).
const STORAGE_TYPES: [StorageType; 13] = [
    storage("FloatStorage", 4, Some(DataType::F32)),
    storage("HalfStorage", 2, Some(DataType::F16)),
    storage("BFloat16Storage", 2, Some(DataType::BF16)),
    storage("DoubleStorage", 8, None),
    storage("LongStorage", 8, None),
    storage("IntStorage", 4, None),
    storage("ShortStorage", 2, None),
    storage("CharStorage", 1, None),
    storage("ByteStorage", 1, None),
    storage("BoolStorage", 1, None),
    storage("ComplexFloatStorage", 8, None),
    storage("ComplexDoubleStorage", 16, None),
    storage("UntypedStorage", 1, None),
];

/// A global that the unpickler resolves, to an inert value: the allow-list of
/// [`Global::resolve`].
///
/// | global | called with | gives |
/// |---|---|---|
/// | `collections.OrderedDict` | no arguments | an empty dict |
/// | `torch._utils._rebuild_tensor_v2` | storage, offset, size, stride, .. | a [`Tensor`] |
/// | `torch._utils._rebuild_parameter(_with_state)` | tensor, .. | the tensor |
/// | `torch.*Storage`, `torch.UntypedStorage` | (used in persistent ids) | |
/// | `torch.float32`, `torch.float16`, `torch.bfloat16` | (a dtype marker) | |
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Global {
    /// `collections.OrderedDict`.
    OrderedDict,
    /// `torch._utils._rebuild_tensor_v2`.
    RebuildTensor,
    /// `torch._utils._rebuild_parameter` (or `.._with_state`).
    RebuildParameter {
        /// Whether it takes a fourth argument, the state.
        with_state: bool,
    },
    /// A storage class.
    Storage(&'static StorageType),
    /// A dtype (`torch.float32`, ...).
    Dtype,
}

impl Global {
    /// The global `module.name`, if it is allowed; only these names are ever resolved.
    pub(super) fn resolve(module: &str, name: &str) -> Option<Global> {
        Some(match (module, name) {
            ("collections", "OrderedDict") => Global::OrderedDict,
            ("torch._utils", "_rebuild_tensor_v2") => Global::RebuildTensor,
            ("torch._utils", "_rebuild_parameter") => {
                Global::RebuildParameter { with_state: false }
            }
            ("torch._utils", "_rebuild_parameter_with_state") => {
                Global::RebuildParameter { with_state: true }
            }
            ("torch", "float32" | "float16" | "bfloat16") => Global::Dtype,
            ("torch" | "torch.storage", "UntypedStorage") => {
                Global::Storage(&STORAGE_TYPES[STORAGE_TYPES.len() - 1])
            }
            ("torch", _) => Global::Storage(STORAGE_TYPES.iter().find(|t| t.name == name)?),
            _ => return None,
        })
    }
}

/// A storage of the archive, as a persistent id names it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Storage {
    /// Its class.
    pub ty: StorageType,
    /// The zip entry holding its bytes is `<prefix>/data/<key>`.
    pub key: String,
    /// Elements it holds.
    pub numel: usize,
}

/// A tensor as `_rebuild_tensor_v2(storage, storage_offset, size, stride, ..)` describes it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Tensor {
    /// Where its elements live.
    pub storage: Storage,
    /// Elements of the storage before its first.
    pub offset: usize,
    /// Sizes, outermost first.
    pub shape: Vec<usize>,
    /// Strides in elements.
    pub stride: Vec<usize>,
}

/// The largest `data.pkl` read: a state dict pickles to about 115 bytes per tensor.
const MAX_PICKLE_BYTES: usize = 64 << 20;

/// Whether `bytes` start like a zip archive (a local file header).
fn is_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04")
}

/// The first pickle of a legacy (before PyTorch 1.6) `torch.save` file: protocol 2, then
/// `LONG1` of torch's magic number 0x1950a86a20f9469cfc6c.
const LEGACY_MAGIC: [u8; 14] = *b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";

/// Whether `bytes` start like a `torch.save` file: a zip archive, or the legacy format
/// (which [`read_tensors`] refuses with an explanation).
pub(super) fn is_torch_save(bytes: &[u8]) -> bool {
    is_zip(bytes) || bytes.starts_with(&LEGACY_MAGIC)
}

/// Every tensor of the `torch.save` archive `map` (the mapping of `file`), by its state
/// dict name, in pickle order.
///
/// Errors: [`Error::Format`] naming what is wrong: not a torch.save archive, an entry
/// missing or compressed, a pickle that is malformed or names a global outside the
/// allow-list, or a tensor that does not fit its storage or is not row-major contiguous.
pub(super) fn read_tensors(file: &Path, map: &Arc<Mmap>) -> Result<Vec<(String, SourceTensor)>> {
    let fail = |msg: String| Error::format(file, msg);
    if !is_zip(map) {
        let what = if map.starts_with(&LEGACY_MAGIC) {
            "a legacy torch.save file (PyTorch before 1.6, not a zip archive) is not \
             supported; load it with torch and save it again"
        } else {
            "not a torch.save zip archive"
        };
        return Err(fail(what.into()));
    }
    let zip = ZipArchive::new(Cursor::new(&map[..]))
        .map_err(|e| fail(format!("invalid zip archive: {e}")))?;
    let mut archive = Archive {
        zip,
        file,
        len: map.len(),
    };
    let prefix = archive.prefix()?;
    if let Some((start, len)) = archive.entry(&format!("{prefix}/byteorder"))? {
        let order = &map[start..start + len];
        if order != b"little" {
            let order = String::from_utf8_lossy(order);
            return Err(fail(format!(
                "byte order {order:?}: only little-endian is supported"
            )));
        }
    }
    let (start, len) = archive.require(&format!("{prefix}/data.pkl"))?;
    if len > MAX_PICKLE_BYTES {
        return Err(fail(format!("data.pkl of {len} bytes is too large")));
    }
    let state = pickle::load_state_dict(&map[start..start + len]).map_err(fail)?;
    let mut storages: HashMap<String, (usize, usize)> = HashMap::new();
    let mut out = Vec::with_capacity(state.len());
    for (name, tensor) in state {
        let key = &tensor.storage.key;
        let range = match storages.get(key) {
            Some(&range) => range,
            None => {
                let range = archive.require(&format!("{prefix}/data/{key}"))?;
                storages.insert(key.clone(), range);
                range
            }
        };
        let t = source_tensor(file, map, &name, &tensor, range)?;
        out.push((name, t));
    }
    Ok(out)
}

/// The archive, opened over the mapping.
struct Archive<'a> {
    zip: ZipArchive<Cursor<&'a [u8]>>,
    file: &'a Path,
    /// Bytes in the file.
    len: usize,
}

impl Archive<'_> {
    /// The top-level directory holding `data.pkl` (the file stem, or `archive`).
    fn prefix(&self) -> Result<String> {
        let mut found = self
            .zip
            .file_names()
            .filter_map(|n| n.strip_suffix("/data.pkl"))
            .filter(|p| !p.contains('/'));
        match (found.next(), found.next()) {
            (Some(prefix), None) => Ok(prefix.to_string()),
            (None, _) => Err(Error::format(
                self.file,
                "a zip archive without <prefix>/data.pkl: not a torch.save checkpoint",
            )),
            (Some(_), Some(_)) => Err(Error::format(self.file, "several data.pkl entries")),
        }
    }

    /// The byte range of the entry `name` in the file, if it exists; it must be stored
    /// uncompressed and unencrypted, as torch.save writes every entry.
    fn entry(&mut self, name: &str) -> Result<Option<(usize, usize)>> {
        let file = self.file;
        let fail = |msg: String| Error::format(file, format!("zip entry {name}: {msg}"));
        let Some(index) = self.zip.index_for_name(name) else {
            return Ok(None);
        };
        let entry = self
            .zip
            .by_index_raw(index)
            .map_err(|e| fail(e.to_string()))?;
        if entry.encrypted() {
            return Err(fail("encrypted".into()));
        }
        if entry.compression() != CompressionMethod::Stored {
            return Err(fail(
                "compressed, but torch.save stores entries uncompressed; re-save the \
                 checkpoint with torch.save"
                    .into(),
            ));
        }
        if entry.compressed_size() != entry.size() {
            return Err(fail("stored sizes disagree".into()));
        }
        let start = entry
            .data_start()
            .ok_or_else(|| fail("no data offset".into()))?;
        let range = usize::try_from(start)
            .ok()
            .zip(usize::try_from(entry.size()).ok())
            .filter(|&(s, l)| s.checked_add(l).is_some_and(|end| end <= self.len));
        range
            .map(Some)
            .ok_or_else(|| fail("runs past the end of the file".into()))
    }

    /// As [`Archive::entry`], an error if the entry is missing.
    fn require(&mut self, name: &str) -> Result<(usize, usize)> {
        self.entry(name)?
            .ok_or_else(|| Error::format(self.file, format!("missing zip entry {name}")))
    }
}

/// The view of `map` that `tensor` describes, its storage's entry at `entry` (start, len).
fn source_tensor(
    file: &Path,
    map: &Arc<Mmap>,
    name: &str,
    tensor: &Tensor,
    (start, len): (usize, usize),
) -> Result<SourceTensor> {
    let fail = |msg: String| Error::format(file, format!("tensor {name}: {msg}"));
    let (ty, shape) = (tensor.storage.ty, &tensor.shape);
    let dtype = ty.dtype.ok_or_else(|| {
        fail(format!(
            "its storage is torch.{}; f32, f16 and bf16 tensors are supported",
            ty.name
        ))
    })?;
    let numel = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| fail(format!("shape {shape:?} overflows")))?;
    let mut contiguous = 1;
    for (&size, &stride) in shape.iter().zip(&tensor.stride).rev() {
        if numel == 0 {
            break; // an empty tensor is contiguous whatever its strides
        }
        if size != 1 && stride != contiguous {
            return Err(fail(format!(
                "strides {:?} of shape {shape:?} are not row-major contiguous; save \
                 tensor.contiguous() instead",
                tensor.stride
            )));
        }
        contiguous *= size; // no overflow: a prefix product of the checked numel
    }
    let storage_bytes = tensor.storage.numel.checked_mul(ty.elem_size);
    if storage_bytes.is_none_or(|b| b > len) {
        return Err(fail(format!(
            "storage {} of {} elements does not fit its {len}-byte zip entry",
            tensor.storage.key, tensor.storage.numel
        )));
    }
    if tensor
        .offset
        .checked_add(numel)
        .is_none_or(|end| end > tensor.storage.numel)
    {
        return Err(fail(format!(
            "{numel} elements at offset {} overrun its storage of {}",
            tensor.offset, tensor.storage.numel
        )));
    }
    // No overflow: offset × elem_size ≤ the storage's bytes ≤ len, and start + len fits.
    let offset = start + tensor.offset * ty.elem_size;
    SourceTensor::new(
        name,
        shape.clone(),
        Encoding::Native(dtype),
        map,
        offset,
        file,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tensors of `tests/data/pytorch/<name>` (written by make_fixture.py).
    fn read(name: &str) -> Result<HashMap<String, SourceTensor>> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/pytorch");
        let path = path.join(name);
        let map = super::super::map_file(&path)?;
        Ok(read_tensors(&path, &map)?.into_iter().collect())
    }

    #[test]
    fn dtypes_views_and_shared_storages() {
        let t = read("tensors.bin").unwrap();
        let base: Vec<f32> = (0..24).map(|i| i as f32 / 4.0).collect();
        for (name, dtype) in [
            ("f32", DataType::F32),
            ("f16", DataType::F16),
            ("bf16", DataType::BF16),
            ("shared", DataType::F32),
        ] {
            let data = t[name].load().unwrap();
            assert_eq!((data.dtype(), data.shape()), (dtype, &[4, 6][..]), "{name}");
            assert!(data.is_mapped(), "{name} is a view of the file");
            assert_eq!(data.to_f32_vec().unwrap(), base, "{name}");
        }
        assert_eq!(t["param"].load().unwrap().to_f32_vec().unwrap(), base[..12]);
        let view = t["offset_view"].load().unwrap();
        assert_eq!(
            (view.shape(), view.to_f32_vec().unwrap()),
            (&[2, 6][..], base[6..18].to_vec())
        );
        assert_eq!(
            t["offset_view"].bytes().unwrap().as_ptr(),
            t["f32"].bytes().unwrap()[24..].as_ptr()
        );
        assert_eq!(
            t["shared"].bytes().unwrap().as_ptr(),
            t["f32"].bytes().unwrap().as_ptr()
        );
        let scalar = t["scalar"].load().unwrap();
        assert_eq!(
            (scalar.shape(), scalar.to_f32_vec().unwrap()),
            (&[][..], vec![2.5])
        );
        assert_eq!(t["empty"].shape, [0, 3]);
    }

    #[test]
    fn refuses_strided_and_unsupported_dtypes() {
        let e = read("noncontiguous.bin").unwrap_err().to_string();
        assert!(
            e.contains("transposed") && e.contains("not row-major"),
            "{e}"
        );
        let e = read("int64.bin").unwrap_err().to_string();
        assert!(e.contains("int64") && e.contains("LongStorage"), "{e}");
        let e = read("compressed.bin").unwrap_err().to_string();
        assert!(e.contains("byteorder: compressed, but torch.save"), "{e}");
    }
}
