//! The GGUF container (ggml `docs/gguf.md`, v2/v3, little-endian): header, typed
//! metadata and tensor directory, read with every count, length and offset checked
//! against the bytes left in the file (see the parent module for the layout).

use std::collections::HashMap;
use std::path::Path;

use crate::{Error, Result};

/// Arrays nested deeper than this are refused (each level costs the parser stack).
const MAX_DEPTH: usize = 8;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// Metadata values (array elements included) a file may hold. A value takes 32 bytes in
/// memory however few it takes in the file, so this bounds the memory metadata can claim
/// (128 MiB plus the strings' bytes); real files hold under a million (a 256k-token
/// vocabulary with scores and types).
const MAX_VALUES: usize = 1 << 22;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value {
    Int(i128),
    Float(f64),
    Bool(bool),
    Str(Vec<u8>),
    Array(Vec<Value>),
}

impl Value {
    /// The value for an error message: scalars and short strings whole, arrays by length.
    pub(super) fn describe(&self) -> String {
        match self {
            Value::Int(i) => format!("the integer {i}"),
            Value::Float(f) => format!("the float {f}"),
            Value::Bool(b) => format!("the bool {b}"),
            Value::Str(s) if s.len() <= 40 => {
                format!("the string {:?}", String::from_utf8_lossy(s))
            }
            Value::Str(s) => format!("a string of {} bytes", s.len()),
            Value::Array(a) => format!("an array of {} values", a.len()),
        }
    }
}

/// One tensor's directory entry.
pub(super) struct TensorInfo {
    pub(super) name: String,
    /// ggml order, innermost first.
    pub(super) ne: Vec<usize>,
    pub(super) ggml_type: u32,
    /// Absolute offset in the file.
    pub(super) offset: usize,
}

/// A parsed GGUF file: metadata and tensor directory.
pub(super) struct Gguf {
    pub(super) meta: HashMap<String, Value>,
    pub(super) tensors: Vec<TensorInfo>,
}

/// A bounds-checked little-endian cursor over the file.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
    /// Metadata values that may still be read ([`MAX_VALUES`] in all).
    budget: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::format(self.path, format!("invalid GGUF file: {msg}"))
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.left() {
            return Err(self.err(format!(
                "truncated: {what} at offset {} needs {n} bytes, {} are left",
                self.pos,
                self.left()
            )));
        }
        self.pos += n;
        Ok(&self.bytes[self.pos - n..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A count of items of at least `min_size` bytes each, bounded by the bytes left.
    fn count(&mut self, what: &str, min_size: usize) -> Result<usize> {
        let n = self.u64(what)?;
        match usize::try_from(n) {
            Ok(n) if n <= self.left() / min_size => Ok(n),
            _ => Err(self.err(format!(
                "{what} {n} cannot fit in the {} bytes left at offset {} (truncated or \
                 corrupted file)",
                self.left(),
                self.pos
            ))),
        }
    }

    fn string(&mut self, what: &str) -> Result<&'a [u8]> {
        let len = self.count(&format!("{what} length"), 1)?;
        self.take(len, what)
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<Value> {
        self.budget = self
            .budget
            .checked_sub(1)
            .ok_or_else(|| self.err(format!("more than {MAX_VALUES} metadata values")))?;
        let v = match ty {
            0 => Value::Int(self.array::<1>("u8")?[0].into()),
            1 => Value::Int((self.array::<1>("i8")?[0] as i8).into()),
            2 => Value::Int(u16::from_le_bytes(self.array("u16")?).into()),
            3 => Value::Int(i16::from_le_bytes(self.array("i16")?).into()),
            4 => Value::Int(self.u32("u32")?.into()),
            5 => Value::Int(i32::from_le_bytes(self.array("i32")?).into()),
            6 => Value::Float(f32::from_le_bytes(self.array("f32")?).into()),
            7 => match self.array::<1>("bool")?[0] {
                b @ (0 | 1) => Value::Bool(b == 1),
                b => return Err(self.err(format!("bool value {b} at offset {}", self.pos - 1))),
            },
            8 => Value::Str(self.string("string")?.to_vec()),
            9 if depth >= MAX_DEPTH => {
                return Err(self.err(format!("arrays nested deeper than {MAX_DEPTH}")))
            }
            9 => {
                let elem = self.u32("array type")?;
                let min_size = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    t => return Err(self.err(format!("unknown array element type {t}"))),
                };
                let n = self.count("array length", min_size)?;
                if n > self.budget {
                    return Err(self.err(format!("more than {MAX_VALUES} metadata values")));
                }
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::Int(self.u64("u64")?.into()),
            11 => Value::Int(i64::from_le_bytes(self.array("i64")?).into()),
            12 => Value::Float(f64::from_le_bytes(self.array("f64")?)),
            t => return Err(self.err(format!("unknown metadata value type {t}"))),
        };
        Ok(v)
    }
}

pub(super) fn parse(bytes: &[u8], path: &Path) -> Result<Gguf> {
    let mut r = Reader {
        bytes,
        pos: 0,
        path,
        budget: MAX_VALUES,
    };
    if r.take(4, "magic")? != b"GGUF" {
        return Err(r.err("the file does not start with the magic \"GGUF\""));
    }
    match r.u32("version")? {
        2 | 3 => {}
        v if v.swap_bytes() <= 3 => return Err(r.err("big-endian GGUF files are not supported")),
        v => return Err(r.err(format!("version {v} is not supported (2 and 3 are)"))),
    }
    let n_tensors = r.count("tensor_count", 24)?;
    let n_kv = r.count("kv_count", 13)?;
    let mut meta = HashMap::with_capacity(n_kv);
    for _ in 0..n_kv {
        let key = String::from_utf8(r.string("metadata key")?.to_vec())
            .map_err(|_| r.err("a metadata key is not UTF-8"))?;
        let ty = r.u32("value type")?;
        let value = r.value(ty, 0).map_err(|e| match e {
            Error::Format { msg, .. } => {
                let msg = msg.strip_prefix("invalid GGUF file: ").unwrap_or(&msg);
                r.err(format!("metadata {key}: {msg}"))
            }
            e => e,
        })?;
        if meta.insert(key.clone(), value).is_some() {
            return Err(r.err(format!("metadata key {key} appears twice")));
        }
    }
    let alignment = match meta.get("general.alignment") {
        None => 32,
        Some(Value::Int(a)) if *a > 0 && (*a as u64).is_power_of_two() && *a <= 1 << 30 => {
            *a as usize
        }
        Some(v) => {
            let v = v.describe();
            return Err(r.err(format!("general.alignment is {v}, not a power of two")));
        }
    };
    let mut infos = Vec::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        let name = String::from_utf8(r.string("tensor name")?.to_vec())
            .map_err(|_| r.err("a tensor name is not UTF-8"))?;
        let n_dims = r.u32("n_dims")?;
        if n_dims > MAX_DIMS {
            return Err(r.err(format!("tensor {name} has {n_dims} dimensions (at most 4)")));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = r.u64("tensor dimension")?;
            ne.push(
                usize::try_from(d)
                    .ok()
                    .filter(|&d| d < 1 << 48)
                    .ok_or_else(|| r.err(format!("tensor {name} has dimension {d}")))?,
            );
        }
        let ggml_type = r.u32("tensor type")?;
        let offset = r.u64("tensor offset")?;
        if offset % alignment as u64 != 0 {
            return Err(r.err(format!(
                "tensor {name}: offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        infos.push((name, ne, ggml_type, offset));
    }
    let data = r.pos.div_ceil(alignment) * alignment;
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors);
    let mut names = std::collections::HashSet::with_capacity(n_tensors);
    for (name, ne, ggml_type, offset) in infos {
        let abs = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(data));
        let Some(offset) = abs.filter(|&a| a <= bytes.len()) else {
            return Err(r.err(format!(
                "tensor {name}: data offset {offset} is past the end of the file ({} bytes)",
                bytes.len()
            )));
        };
        if !names.insert(name.clone()) {
            return Err(r.err(format!("tensor {name} appears twice")));
        }
        tensors.push(TensorInfo {
            name,
            ne,
            ggml_type,
            offset,
        });
    }
    Ok(Gguf { meta, tensors })
}

/// Typed metadata lookups; a key of the wrong type is an error, a missing one `None`.
pub(super) struct Meta<'a> {
    pub(super) kv: &'a HashMap<String, Value>,
    pub(super) path: &'a Path,
}

impl Meta<'_> {
    fn wrong(&self, key: &str, v: &Value, want: &str) -> Error {
        let msg = format!("metadata {key} is {}, expected {want}", v.describe());
        Error::format(self.path, msg)
    }

    pub(super) fn usize(&self, key: &str) -> Result<Option<usize>> {
        match self.kv.get(key) {
            None => Ok(None),
            Some(Value::Int(i)) if *i >= 0 && *i <= 1 << 40 => Ok(Some(*i as usize)),
            Some(v) => Err(self.wrong(key, v, "a non-negative integer")),
        }
    }

    pub(super) fn required(&self, key: &str) -> Result<usize> {
        self.usize(key)?
            .ok_or_else(|| Error::format(self.path, format!("missing metadata {key}")))
    }

    pub(super) fn id(&self, key: &str) -> Result<Option<u32>> {
        Ok(self.usize(key)?.map(|i| i.min(u32::MAX as usize) as u32))
    }

    pub(super) fn f32(&self, key: &str) -> Result<Option<f32>> {
        match self.kv.get(key) {
            None => Ok(None),
            Some(Value::Float(f)) => Ok(Some(*f as f32)),
            Some(v) => Err(self.wrong(key, v, "a float")),
        }
    }

    pub(super) fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.kv.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(key, v, "a bool")),
        }
    }

    pub(super) fn str(&self, key: &str) -> Result<Option<String>> {
        match self.kv.get(key) {
            None => Ok(None),
            Some(Value::Str(s)) => Ok(Some(String::from_utf8_lossy(s).into_owned())),
            Some(v) => Err(self.wrong(key, v, "a string")),
        }
    }

    pub(super) fn array(&self, key: &str) -> Result<Option<&[Value]>> {
        match self.kv.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.wrong(key, v, "an array")),
        }
    }
}
