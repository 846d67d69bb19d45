//! A restricted unpickler for the `data.pkl` of `torch.save` checkpoints.
//!
//! A pickle is a program for a small stack machine (every opcode is documented in CPython
//! `Lib/pickletools.py`); Python's unpickler calls whatever functions the program names,
//! which is how a `pytorch_model.bin` can run code. This machine implements only the
//! opcodes `torch.save` (pickle protocol 2) emits, and resolves `GLOBAL` against the
//! allow-list of [`Global::resolve`], each name to an inert Rust value. Any other global,
//! or a call (`REDUCE`) of anything but `OrderedDict()`, `_rebuild_tensor_v2` and
//! `_rebuild_parameter`, is an error naming it: nothing is executed. A persistent id
//! (`BINPERSID`) must be torch's `('storage', storage type, key, location, numel)`.
//!
//! The bytes are untrusted: every read is bounds-checked, a length is checked against the
//! bytes left before anything is allocated, integers wider than 64 bits are refused, and
//! popping below a `MARK` or the bottom of the stack is an error. The machine is a loop,
//! not a recursion; objects live in an arena and the stack and memo hold their indices,
//! so shared and even cyclic references are cheap; and [`MAX_OPCODES`] bounds the memory.

use std::collections::HashMap;

use super::pytorch::{Global, Storage, Tensor};

/// The most opcodes a pickle may run. Each makes at most one object, stack slot or memo
/// entry, so this bounds the memory a hostile pickle can claim (to a few hundred MB); a
/// state dict takes about 35 opcodes per tensor, so a file may hold 120,000 tensors.
/// Most dimensions a tensor may have (torch checkpoints of LLMs use at most 4).
const MAX_RANK: usize = 8;
const MAX_OPCODES: usize = 1 << 22;

/// An object's index in the arena.
type Id = usize;

#[derive(Debug, Clone)]
enum Object {
    /// None or a bool, by name: values a state dict never needs.
    Other(&'static str),
    Int(i64),
    Str(String),
    Tuple(Vec<Id>),
    List(Vec<Id>),
    Dict(Vec<(Id, Id)>),
    Global(Global),
    Storage(Box<Storage>),
    Tensor(Box<Tensor>),
}

impl Object {
    fn kind(&self) -> &'static str {
        match self {
            Object::Other(kind) => kind,
            Object::Int(_) => "int",
            Object::Str(_) => "str",
            Object::Tuple(_) => "tuple",
            Object::List(_) => "list",
            Object::Dict(_) => "dict",
            Object::Global(_) => "global",
            Object::Storage(_) => "storage",
            Object::Tensor(_) => "tensor",
        }
    }
}

/// Runs `code` and returns the entries of the state dict it builds, in pickle order (of a
/// repeated key, Python keeps the last).
///
/// Errors: a message naming what is wrong and where, for a truncated or malformed pickle,
/// a global outside the allow-list, a call of anything but the allowed functions, or a
/// result that is not a dict of tensors.
pub(super) fn load_state_dict(code: &[u8]) -> Result<Vec<(String, Tensor)>, String> {
    let mut m = Machine {
        code,
        pos: 0,
        objects: Vec::new(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        budget: MAX_OPCODES,
    };
    let root = loop {
        let at = m.pos;
        let op = m.u8()?;
        match m.step(op) {
            Ok(None) => {}
            Ok(Some(root)) => break root,
            Err(e) => return Err(format!("{e} (opcode {op:#04x} at byte {at} of data.pkl)")),
        }
    };
    let Object::Dict(items) = &m.objects[root] else {
        return Err(format!(
            "data.pkl holds a {}, not a state dict",
            m.objects[root].kind()
        ));
    };
    let mut out = Vec::with_capacity(items.len());
    for &(k, v) in items {
        let Object::Str(name) = &m.objects[k] else {
            return Err(format!("a state dict key is a {}", m.objects[k].kind()));
        };
        let Object::Tensor(t) = &m.objects[v] else {
            return Err(format!(
                "state dict entry {name} is a {}, not a tensor",
                m.objects[v].kind()
            ));
        };
        out.push((name.clone(), (**t).clone()));
    }
    Ok(out)
}

struct Machine<'a> {
    code: &'a [u8],
    pos: usize,
    objects: Vec<Object>,
    stack: Vec<Id>,
    /// Stack lengths at each open MARK (CPython's metastack).
    marks: Vec<usize>,
    memo: HashMap<u32, Id>,
    /// Opcodes left to run.
    budget: usize,
}

impl Machine<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.code.len())
            .ok_or_else(|| format!("truncated pickle: {n} bytes needed at byte {}", self.pos))?;
        let bytes = &self.code[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn line(&mut self) -> Result<String, String> {
        let rest = &self.code[self.pos..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or("unterminated GLOBAL")?;
        let s = std::str::from_utf8(&rest[..n])
            .map_err(|_| "bad UTF-8")?
            .to_string();
        self.pos += n + 1;
        Ok(s)
    }

    fn push(&mut self, object: Object) {
        self.stack.push(self.objects.len());
        self.objects.push(object);
    }

    fn top(&self) -> Result<Id, String> {
        match self.stack.last() {
            Some(&id) if self.stack.len() > self.marks.last().copied().unwrap_or(0) => Ok(id),
            _ => Err("stack underflow".into()),
        }
    }

    fn pop(&mut self) -> Result<Id, String> {
        let id = self.top()?;
        self.stack.pop();
        Ok(id)
    }

    fn pop_mark(&mut self) -> Result<Vec<Id>, String> {
        let mark = self.marks.pop().ok_or("no MARK to pop to")?;
        if mark > self.stack.len() {
            return Err("stack underflow below a MARK".into());
        }
        Ok(self.stack.split_off(mark))
    }

    fn global(&mut self, module: &str, name: &str) -> Result<(), String> {
        let g = Global::resolve(module, name)
            .ok_or_else(|| format!("refusing to load pickle global {module}.{name}"))?;
        self.push(Object::Global(g));
        Ok(())
    }

    fn tuple(&mut self, n: usize) -> Result<(), String> {
        let mut items = vec![0; n];
        for slot in items.iter_mut().rev() {
            *slot = self.pop()?;
        }
        self.push(Object::Tuple(items));
        Ok(())
    }

    /// SETITEM(S) (`dict`: `items` are keys and values) or APPEND(S) onto the top object.
    fn extend(&mut self, items: Vec<Id>, dict: bool) -> Result<(), String> {
        let target = self.top()?;
        match (&mut self.objects[target], dict) {
            (Object::Dict(entries), true) if items.len().is_multiple_of(2) => {
                entries.extend(items.chunks_exact(2).map(|kv| (kv[0], kv[1])));
            }
            (Object::List(list), false) => list.extend(items),
            (other, _) => return Err(format!("cannot add items to a {}", other.kind())),
        }
        Ok(())
    }

    fn int(&self, id: Id, what: &str) -> Result<usize, String> {
        match self.objects[id] {
            Object::Int(v) => usize::try_from(v).map_err(|_| format!("{what} is negative: {v}")),
            ref other => Err(format!("{what} is a {}, not an int", other.kind())),
        }
    }

    fn ints(&self, id: Id, what: &str) -> Result<Vec<usize>, String> {
        match &self.objects[id] {
            Object::Tuple(items) if items.len() > MAX_RANK => Err(format!(
                "{what} has {} dimensions; tensors of more than {MAX_RANK} are refused",
                items.len()
            )),
            Object::Tuple(items) => items.iter().map(|&i| self.int(i, what)).collect(),
            other => Err(format!("{what} is a {}, not a tuple", other.kind())),
        }
    }

    /// `BINPERSID` of torch's `('storage', type, key, location, numel)`.
    fn persistent_load(&self, pid: Id) -> Result<Object, String> {
        let Object::Tuple(items) = &self.objects[pid] else {
            return Err(format!("persistent id is a {}", self.objects[pid].kind()));
        };
        let &[tag, ty, key, _location, numel] = items.as_slice() else {
            return Err(format!("persistent id of {} items, not 5", items.len()));
        };
        match (&self.objects[tag], &self.objects[ty], &self.objects[key]) {
            (Object::Str(tag), Object::Global(Global::Storage(ty)), Object::Str(key))
                if tag == "storage" =>
            {
                Ok(Object::Storage(Box::new(Storage {
                    ty: **ty,
                    key: key.clone(),
                    numel: self.int(numel, "storage numel")?,
                })))
            }
            _ => Err("persistent id is not ('storage', storage type, key, ..)".into()),
        }
    }

    /// `REDUCE`: calls one of the allow-listed functions. Sizes and strides are bounded to
    /// [`MAX_RANK`] entries, so memoised tuples reused by many calls cost little.
    fn call(&self, func: Id, args: Id) -> Result<Object, String> {
        let Object::Tuple(args) = &self.objects[args] else {
            return Err("REDUCE arguments are not a tuple".into());
        };
        let global = match &self.objects[func] {
            Object::Global(g) => *g,
            other => return Err(format!("refusing to call a {}", other.kind())),
        };
        match (global, args.as_slice()) {
            (Global::OrderedDict, []) => Ok(Object::Dict(Vec::new())),
            (Global::RebuildTensor, [storage, offset, size, stride, _grad, _hooks, ..])
                if args.len() <= 7 =>
            {
                let Object::Storage(storage) = &self.objects[*storage] else {
                    return Err("_rebuild_tensor_v2 without a storage".into());
                };
                let (shape, stride) = (self.ints(*size, "size")?, self.ints(*stride, "stride")?);
                if shape.len() != stride.len() {
                    return Err("size and stride differ in rank".into());
                }
                Ok(Object::Tensor(Box::new(Tensor {
                    storage: (**storage).clone(),
                    offset: self.int(*offset, "storage offset")?,
                    shape,
                    stride,
                })))
            }
            (Global::RebuildParameter { with_state }, [data, _grad, _hooks, rest @ ..])
                if rest.len() == usize::from(with_state) =>
            {
                match &self.objects[*data] {
                    Object::Tensor(t) => Ok(Object::Tensor(t.clone())),
                    other => Err(format!("_rebuild_parameter of a {}", other.kind())),
                }
            }
            (Global::Storage(t), _) => Err(format!("refusing to call torch.{}", t.name)),
            (g, _) => Err(format!(
                "refusing to call {g:?} on {} arguments",
                args.len()
            )),
        }
    }

    /// Executes one opcode; returns the result at `STOP`.
    fn step(&mut self, op: u8) -> Result<Option<Id>, String> {
        self.budget = self.budget.checked_sub(1).ok_or("too many opcodes")?;
        match op {
            0x80 => {
                let proto = self.u8()?;
                if proto > 5 {
                    return Err(format!("unsupported pickle protocol {proto}"));
                }
            }
            0x95 => {
                self.take(8)?; // FRAME: a length hint only
            }
            b'.' => return self.pop().map(Some),
            b'}' => self.push(Object::Dict(Vec::new())),
            b']' => self.push(Object::List(Vec::new())),
            b')' => self.push(Object::Tuple(Vec::new())),
            b'(' => self.marks.push(self.stack.len()),
            b'q' | b'r' | 0x94 => {
                let key = match op {
                    b'q' => u32::from(self.u8()?),
                    b'r' => u32::from_le_bytes(self.array()?),
                    _ => u32::try_from(self.memo.len()).map_err(|_| "memo full")?,
                };
                let id = self.top()?;
                self.memo.insert(key, id);
            }
            b'h' | b'j' => {
                let key = match op {
                    b'h' => u32::from(self.u8()?),
                    _ => u32::from_le_bytes(self.array()?),
                };
                let id = *self.memo.get(&key).ok_or(format!("memo key {key} unset"))?;
                self.stack.push(id);
            }
            b'X' | 0x8c | 0x8d => {
                let len = match op {
                    b'X' => u64::from(u32::from_le_bytes(self.array()?)),
                    0x8c => u64::from(self.u8()?),
                    _ => u64::from_le_bytes(self.array()?),
                };
                let len = usize::try_from(len).map_err(|_| format!("string of {len} bytes"))?;
                let s = String::from_utf8(self.take(len)?.to_vec()).map_err(|_| "bad UTF-8")?;
                self.push(Object::Str(s));
            }
            b'J' | b'K' | b'M' => {
                let v = match op {
                    b'J' => i64::from(i32::from_le_bytes(self.array()?)),
                    b'K' => i64::from(self.u8()?),
                    _ => i64::from(u16::from_le_bytes(self.array()?)),
                };
                self.push(Object::Int(v));
            }
            0x8a => {
                let n = usize::from(self.u8()?);
                let bytes = self.take(n)?;
                if n > 8 {
                    return Err(format!("integer of {n} bytes is wider than 64 bits"));
                }
                let fill = if bytes.last() >= Some(&0x80) { 0xff } else { 0 };
                let mut le = [fill; 8];
                le[..n].copy_from_slice(bytes);
                self.push(Object::Int(i64::from_le_bytes(le)));
            }
            0x88 | 0x89 => self.push(Object::Other("bool")),
            b'N' => self.push(Object::Other("None")),
            b't' => {
                let items = self.pop_mark()?;
                self.push(Object::Tuple(items));
            }
            0x85..=0x87 => self.tuple(usize::from(op - 0x84))?,
            b'c' => {
                let (module, name) = (self.line()?, self.line()?);
                self.global(&module, &name)?;
            }
            0x93 => {
                let (name, module) = (self.pop()?, self.pop()?);
                let (Object::Str(module), Object::Str(name)) =
                    (&self.objects[module], &self.objects[name])
                else {
                    return Err("STACK_GLOBAL of non-strings".into());
                };
                let (module, name) = (module.clone(), name.clone());
                self.global(&module, &name)?;
            }
            b'Q' => {
                let pid = self.pop()?;
                let storage = self.persistent_load(pid)?;
                self.push(storage);
            }
            b'R' => {
                let (args, func) = (self.pop()?, self.pop()?);
                let result = self.call(func, args)?;
                self.push(result);
            }
            b's' => {
                let (value, key) = (self.pop()?, self.pop()?);
                self.extend(vec![key, value], true)?;
            }
            b'u' => {
                let items = self.pop_mark()?;
                self.extend(items, true)?;
            }
            b'a' => {
                let value = self.pop()?;
                self.extend(vec![value], false)?;
            }
            b'e' => {
                let items = self.pop_mark()?;
                self.extend(items, false)?;
            }
            b'b' => {
                // BUILD sets attributes: harmless (and ignored) on a dict, like the
                // `_metadata` of a state dict; refused on anything else.
                self.pop()?;
                let target = self.top()?;
                if !matches!(self.objects[target], Object::Dict(_)) {
                    return Err(format!("BUILD on a {}", self.objects[target].kind()));
                }
            }
            _ => return Err(format!("unsupported pickle opcode {op:#04x}")),
        }
        Ok(None)
    }
}
