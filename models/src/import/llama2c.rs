//! llama2.c checkpoints (Karpathy's `run.c`, `runq.c` and `export.py`).
//!
//! - Legacy (v0): seven little-endian i32 (`dim, hidden_dim, n_layers, n_heads, n_kv_heads,
//!   vocab_size, seq_len`; a negative `vocab_size` means an unshared classifier), then fp32
//!   tensors back to back, each over all layers: embedding, rms_att, wq, wk, wv, wo, rms_ffn,
//!   w1, w2, w3, rms_final, the legacy RoPE tables (skipped), and the classifier if unshared.
//! - v1/v2: a 256-byte header (magic "ak42", i32 version, the seven params, u8
//!   shared_classifier, v2: i32 group_size). v1 stores fp32 tensors in the order norms
//!   (rms_att, rms_ffn, rms_final), embedding, wq, wk, wv, wo, w1, w2, w3, classifier. v2 stores
//!   the fp32 norms, then for embedding and each per-layer matrix int8 values followed by
//!   fp32 scales of consecutive `group_size` groups (Q8_0: `w = q · scale`).
//!
//! q/k weights use Meta's adjacent-pair RoPE layout.

use std::path::Path;
use std::sync::Arc;

use byteorder::{ByteOrder, LittleEndian};
use flm_core::{Data, DataType, RopeStyle};
use memmap2::Mmap;

use super::{map_file, Checkpoint, Format};
use crate::llama::{LlamaLayer, LlamaWeights};
use crate::{Error, ModelConfig, Result};

/// `"ak42"` read as a little-endian u32.
pub(super) const MAGIC: u32 = 0x616b_3432;
const HEADER_V1: usize = 256;
const HEADER_LEGACY: usize = 28;

/// The config from the seven header params; `shared` is the v1/v2 flag, `None` for legacy
/// files, whose classifier is shared when `vocab_size > 0`.
fn parse_params(path: &Path, p: &[i32], shared: Option<bool>) -> Result<ModelConfig> {
    let bad = |msg: String| Error::format(path, format!("not a valid llama2.c checkpoint: {msg}"));
    let names = [
        "dim",
        "hidden_dim",
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "vocab_size",
        "seq_len",
    ];
    let shared_classifier = shared.unwrap_or(p[5] > 0);
    let mut v = [0usize; 7];
    for i in 0..7 {
        let value = if i == 5 {
            p[i].unsigned_abs() as i64
        } else {
            p[i] as i64
        };
        if value <= 0 || value > 1 << 24 {
            return Err(bad(format!("{} = {} in the header", names[i], p[i])));
        }
        v[i] = value as usize;
    }
    let [dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len] = v;
    if dim % n_heads != 0 || n_heads % n_kv_heads != 0 {
        return Err(bad(format!(
            "dim {dim}, n_heads {n_heads} and n_kv_heads {n_kv_heads} are inconsistent"
        )));
    }
    let config = ModelConfig {
        dim,
        hidden_dim,
        n_layers,
        n_heads,
        n_kv_heads,
        head_dim: dim / n_heads,
        vocab_size,
        max_seq_len: seq_len,
        norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_style: RopeStyle::AdjacentPairs,
        tie_embeddings: shared_classifier,
        bos_token_id: Some(1),
        // run.c stops when it samples BOS (TinyStories separates stories with it); Meta's
        // Llama 2 exports end with EOS.
        eos_token_ids: vec![2, 1],
    };
    config.validate().map_err(|e| bad(e.to_string()))?;
    Ok(config)
}

/// Reads tensors one after another from a mapped file.
struct Cursor<'a> {
    path: &'a Path,
    map: &'a Arc<Mmap>,
    offset: usize,
}

impl Cursor<'_> {
    fn truncated(&self, need: usize) -> Error {
        Error::format(
            self.path,
            format!(
                "truncated llama2.c checkpoint: needs at least {} bytes, the file has {}",
                self.offset.saturating_add(need),
                self.map.len()
            ),
        )
    }

    /// Fails unless `count` tensors of `size` bytes each fit in the rest of the file.
    fn ensure(&self, count: usize, size: Option<usize>) -> Result<usize> {
        let total = size.and_then(|s| s.checked_mul(count));
        match total.and_then(|t| self.offset.checked_add(t)) {
            Some(end) if end <= self.map.len() => Ok(size.unwrap_or(0)),
            _ => Err(self.truncated(total.unwrap_or(usize::MAX))),
        }
    }

    /// `count` consecutive f32 tensors of `shape`.
    fn f32s(&mut self, count: usize, shape: &[usize]) -> Result<Vec<Data>> {
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let size = self.ensure(count, numel.and_then(|n| n.checked_mul(4)))?;
        (0..count)
            .map(|_| {
                let d = Data::from_mmap(self.map, self.offset, DataType::F32, shape)?;
                self.offset += size;
                Ok(d)
            })
            .collect()
    }

    fn f32(&mut self, shape: &[usize]) -> Result<Data> {
        Ok(self.f32s(1, shape)?.remove(0))
    }

    /// `count` Q8_0 tensors of `shape`: int8 values, then one f32 scale per group.
    fn q8s(&mut self, count: usize, shape: &[usize], group: usize) -> Result<Vec<Data>> {
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| self.truncated(usize::MAX))?;
        if numel % group != 0 {
            return Err(Error::format(
                self.path,
                format!("tensor of {numel} values is not a multiple of the group size {group}"),
            ));
        }
        let size = self.ensure(count, numel.checked_add(numel / group * 4))?;
        (0..count)
            .map(|_| {
                let q = &self.map[self.offset..self.offset + numel];
                let scales = &self.map[self.offset + numel..self.offset + size];
                let mut values = Vec::with_capacity(numel);
                for (g, qs) in q.chunks_exact(group).enumerate() {
                    let s = LittleEndian::read_f32(&scales[g * 4..]);
                    values.extend(qs.iter().map(|&b| b as i8 as f32 * s));
                }
                self.offset += size;
                Ok(Data::from_f32(shape, &values)?)
            })
            .collect()
    }
}

struct Matrices {
    embedding: Data,
    wq: Vec<Data>,
    wk: Vec<Data>,
    wv: Vec<Data>,
    wo: Vec<Data>,
    w1: Vec<Data>,
    w2: Vec<Data>,
    w3: Vec<Data>,
}

/// Groups the per-layer tensors (each vector holds one tensor per layer) into layers.
fn assemble(
    path: &Path,
    m: Matrices,
    rms_att: Vec<Data>,
    rms_ffn: Vec<Data>,
    final_norm: Data,
    classifier: Option<Data>,
) -> Result<LlamaWeights> {
    let n_layers = rms_att.len();
    let mut att = rms_att.into_iter();
    let mut ffn = rms_ffn.into_iter();
    let (mut wq, mut wk, mut wv, mut wo) = (
        m.wq.into_iter(),
        m.wk.into_iter(),
        m.wv.into_iter(),
        m.wo.into_iter(),
    );
    let (mut w1, mut w2, mut w3) = (m.w1.into_iter(), m.w2.into_iter(), m.w3.into_iter());
    let layers = (0..n_layers)
        .map(|_| {
            Some(LlamaLayer {
                attn_norm: att.next()?,
                wq: wq.next()?,
                wk: wk.next()?,
                wv: wv.next()?,
                wo: wo.next()?,
                ffn_norm: ffn.next()?,
                w_gate: w1.next()?,
                w_down: w2.next()?,
                w_up: w3.next()?,
            })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Error::format(path, "a layer is missing tensors"))?;
    Ok(LlamaWeights {
        embedding: m.embedding,
        layers,
        final_norm,
        classifier,
    })
}

fn finish(
    path: &Path,
    cur: &Cursor<'_>,
    format: Format,
    config: ModelConfig,
    weights: LlamaWeights,
) -> Result<Checkpoint> {
    if cur.offset != cur.map.len() {
        return Err(Error::format(
            path,
            format!(
                "corrupted llama2.c checkpoint: the header implies {} bytes, the file has {}",
                cur.offset,
                cur.map.len()
            ),
        ));
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let tokenizer_candidates = vec![
        dir.join(format!("tok{}.bin", config.vocab_size)),
        dir.join("tokenizer.bin"),
        dir.join("tokenizer.model"),
    ];
    Ok(Checkpoint {
        format,
        config,
        weights,
        tokenizer_candidates,
    })
}

/// Loads a llama2.c checkpoint (legacy, v1 or v2).
pub(super) fn load(path: &Path) -> Result<Checkpoint> {
    let map = map_file(path)?;
    let ints = |from: usize, n: usize| -> Option<Vec<i32>> {
        let bytes = map.get(from..from + 4 * n)?;
        Some(bytes.chunks_exact(4).map(LittleEndian::read_i32).collect())
    };
    let too_short = || {
        Error::format(
            path,
            "not a checkpoint: the file is too short for a llama2.c header",
        )
    };
    let magic = map.get(..4).map(LittleEndian::read_u32);
    if magic == Some(MAGIC) {
        let head = ints(4, 8).ok_or_else(too_short)?;
        let version = head[0];
        let shared = map.get(36).ok_or_else(too_short)? != &0;
        let config = parse_params(path, &head[1..8], Some(shared))?;
        let group = match version {
            1 => None,
            2 => Some(ints(37, 1).ok_or_else(too_short)?[0]),
            v => {
                return Err(Error::format(
                    path,
                    format!("llama2.c checkpoint version {v} is not supported (1 and 2 are)"),
                ))
            }
        };
        return load_v1_v2(path, &map, config, group);
    }
    let params = ints(0, 7).ok_or_else(too_short)?;
    let config = parse_params(path, &params, None)?;
    let c = &config;
    let (l, dim, hd, kv) = (c.n_layers, c.dim, c.hidden_dim, c.kv_dim());
    let mut cur = Cursor {
        path,
        map: &map,
        offset: HEADER_LEGACY,
    };
    let embedding = cur.f32(&[c.vocab_size, dim])?;
    let rms_att = cur.f32s(l, &[dim])?;
    let wq = cur.f32s(l, &[dim, dim])?;
    let wk = cur.f32s(l, &[kv, dim])?;
    let wv = cur.f32s(l, &[kv, dim])?;
    let wo = cur.f32s(l, &[dim, dim])?;
    let rms_ffn = cur.f32s(l, &[dim])?;
    let w1 = cur.f32s(l, &[hd, dim])?;
    let w2 = cur.f32s(l, &[dim, hd])?;
    let w3 = cur.f32s(l, &[hd, dim])?;
    let final_norm = cur.f32(&[dim])?;
    cur.f32s(2, &[c.max_seq_len, c.head_dim / 2])?;
    let classifier = if c.tie_embeddings {
        None
    } else {
        Some(cur.f32(&[c.vocab_size, dim])?)
    };
    let m = Matrices {
        embedding,
        wq,
        wk,
        wv,
        wo,
        w1,
        w2,
        w3,
    };
    let weights = assemble(path, m, rms_att, rms_ffn, final_norm, classifier)?;
    finish(path, &cur, Format::Llama2cLegacy, config, weights)
}

fn load_v1_v2(
    path: &Path,
    map: &Arc<Mmap>,
    config: ModelConfig,
    group: Option<i32>,
) -> Result<Checkpoint> {
    let c = &config;
    let (l, dim, hd, kv) = (c.n_layers, c.dim, c.hidden_dim, c.kv_dim());
    let mut cur = Cursor {
        path,
        map,
        offset: HEADER_V1,
    };
    if map.len() < HEADER_V1 {
        return Err(cur.truncated(0));
    }
    let rms_att = cur.f32s(l, &[dim])?;
    let rms_ffn = cur.f32s(l, &[dim])?;
    let final_norm = cur.f32(&[dim])?;
    let (m, classifier, format) = match group {
        None => {
            let m = Matrices {
                embedding: cur.f32(&[c.vocab_size, dim])?,
                wq: cur.f32s(l, &[dim, dim])?,
                wk: cur.f32s(l, &[kv, dim])?,
                wv: cur.f32s(l, &[kv, dim])?,
                wo: cur.f32s(l, &[dim, dim])?,
                w1: cur.f32s(l, &[hd, dim])?,
                w2: cur.f32s(l, &[dim, hd])?,
                w3: cur.f32s(l, &[hd, dim])?,
            };
            let cls = (!c.tie_embeddings)
                .then(|| cur.f32(&[c.vocab_size, dim]))
                .transpose()?;
            (m, cls, Format::Llama2cV1)
        }
        Some(g) => {
            let g = usize::try_from(g)
                .ok()
                .filter(|&g| g > 0)
                .ok_or_else(|| Error::format(path, format!("invalid Q8_0 group size {g}")))?;
            let m = Matrices {
                embedding: cur.q8s(1, &[c.vocab_size, dim], g)?.remove(0),
                wq: cur.q8s(l, &[dim, dim], g)?,
                wk: cur.q8s(l, &[kv, dim], g)?,
                wv: cur.q8s(l, &[kv, dim], g)?,
                wo: cur.q8s(l, &[dim, dim], g)?,
                w1: cur.q8s(l, &[hd, dim], g)?,
                w2: cur.q8s(l, &[dim, hd], g)?,
                w3: cur.q8s(l, &[hd, dim], g)?,
            };
            let cls = if c.tie_embeddings {
                None
            } else {
                Some(cur.q8s(1, &[c.vocab_size, dim], g)?.remove(0))
            };
            (m, cls, Format::Llama2cV2)
        }
    };
    let weights = assemble(path, m, rms_att, rms_ffn, final_norm, classifier)?;
    finish(path, &cur, format, config, weights)
}
