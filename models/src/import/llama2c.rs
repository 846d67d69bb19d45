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
use flm_core::DataType;
use memmap2::Mmap;

use super::{map_file, Checkpoint, Encoding, Format, SourceTensor};
use crate::tensor_names::{LayerPart, TensorName};
use crate::{Error, ModelConfig, Result};

/// `"ak42"` read as a little-endian u32.
pub(super) const MAGIC: u32 = 0x616b_3432;
const HEADER_V1: usize = 256;
const HEADER_LEGACY: usize = 28;

/// The config from the seven header params; `shared` is the v1/v2 flag, `None` for legacy
/// files, whose classifier is shared when `vocab_size > 0`.
fn parse_params(path: &Path, p: &[i32], shared: Option<bool>) -> Result<ModelConfig> {
    let bad = |msg: String| {
        let what = if shared.is_some() {
            "not a valid llama2.c checkpoint"
        } else {
            "not a recognised checkpoint (no .flm, GGUF, safetensors or llama2.c v1/v2 \
             header) nor a valid legacy llama2.c checkpoint"
        };
        Error::format(path, format!("{what}: {msg}"))
    };
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
        tie_embeddings: shared_classifier,
        bos_token_id: Some(1),
        // run.c stops when it samples BOS (TinyStories separates stories with it); Meta's
        // Llama 2 exports end with EOS.
        eos_token_ids: vec![2, 1],
        ..ModelConfig::default()
    };
    config.validate().map_err(|e| bad(e.to_string()))?;
    Ok(config)
}

/// One item of a llama2.c file, in file order.
enum Item {
    Tensor(TensorName, Vec<usize>, Encoding),
    /// Bytes that are skipped (the legacy RoPE tables).
    Skip(usize),
}

/// The canonical names and shapes of `part` in every layer.
fn per_layer(c: &ModelConfig, part: LayerPart, shape: &[usize], enc: Encoding) -> Vec<Item> {
    (0..c.n_layers)
        .map(|l| Item::Tensor(TensorName::Layer(l, part), shape.to_vec(), enc))
        .collect()
}

/// The matrices in the order export.py writes them (embedding first, classifier last).
fn matrices(c: &ModelConfig, enc: Encoding) -> Vec<Item> {
    let (dim, hd, kv) = (c.dim, c.hidden_dim, c.kv_dim());
    let mut items = vec![Item::Tensor(
        TensorName::Embedding,
        vec![c.vocab_size, dim],
        enc,
    )];
    for (part, shape) in [
        (LayerPart::Wq, [dim, dim]),
        (LayerPart::Wk, [kv, dim]),
        (LayerPart::Wv, [kv, dim]),
        (LayerPart::Wo, [dim, dim]),
        (LayerPart::WGate, [hd, dim]),
        (LayerPart::WDown, [dim, hd]),
        (LayerPart::WUp, [hd, dim]),
    ] {
        items.extend(per_layer(c, part, &shape, enc));
    }
    if !c.tie_embeddings {
        items.push(Item::Tensor(
            TensorName::Classifier,
            vec![c.vocab_size, dim],
            enc,
        ));
    }
    items
}

/// The v1/v2 layout: fp32 norms, then the matrices in `enc`.
fn layout_v1_v2(c: &ModelConfig, enc: Encoding) -> Vec<Item> {
    let f32 = Encoding::Native(DataType::F32);
    let mut items = per_layer(c, LayerPart::AttnNorm, &[c.dim], f32);
    items.extend(per_layer(c, LayerPart::FfnNorm, &[c.dim], f32));
    items.push(Item::Tensor(TensorName::FinalNorm, vec![c.dim], f32));
    items.extend(matrices(c, enc));
    items
}

/// The legacy layout (run.c `memory_map_weights`).
fn layout_legacy(c: &ModelConfig) -> Vec<Item> {
    let f32 = Encoding::Native(DataType::F32);
    let mut m = matrices(c, f32).into_iter();
    let mut items: Vec<Item> = m.by_ref().take(1).collect();
    items.extend(per_layer(c, LayerPart::AttnNorm, &[c.dim], f32));
    items.extend(m.by_ref().take(4 * c.n_layers));
    items.extend(per_layer(c, LayerPart::FfnNorm, &[c.dim], f32));
    items.extend(m.by_ref().take(3 * c.n_layers));
    items.push(Item::Tensor(TensorName::FinalNorm, vec![c.dim], f32));
    items.push(Item::Skip(c.max_seq_len * c.head_dim * 4));
    items.extend(m);
    items
}

/// Places the items one after another from `start`; the file must end exactly after them.
fn place(
    path: &Path,
    map: &Arc<Mmap>,
    start: usize,
    items: Vec<Item>,
) -> Result<Vec<SourceTensor>> {
    let mut offset = start;
    let mut tensors = Vec::with_capacity(items.len());
    let truncated = |needed: Option<usize>| {
        Error::format(
            path,
            format!(
                "truncated llama2.c checkpoint: the header implies at least {} bytes, the file \
                 has {}",
                needed.map_or("2^64".to_string(), |n| n.to_string()),
                map.len()
            ),
        )
    };
    for item in items {
        let len = match &item {
            Item::Tensor(_, shape, enc) => enc.byte_len(shape),
            Item::Skip(n) => Some(*n),
        };
        let end = len.and_then(|l| offset.checked_add(l));
        if end.is_none_or(|e| e > map.len()) {
            return Err(truncated(end));
        }
        if let Item::Tensor(name, shape, enc) = item {
            tensors.push(SourceTensor::new(
                name.to_string(),
                shape,
                enc,
                map,
                offset,
                path,
            )?);
        }
        offset = end.unwrap_or(offset);
    }
    if offset != map.len() {
        return Err(Error::format(
            path,
            format!(
                "corrupted llama2.c checkpoint: the header implies {offset} bytes, the file has {}",
                map.len()
            ),
        ));
    }
    Ok(tensors)
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
    let (format, config, start, items) =
        if map.get(..4).map(LittleEndian::read_u32) == Some(MAGIC) {
            let head = ints(4, 8).ok_or_else(too_short)?;
            let shared = *map.get(36).ok_or_else(too_short)? != 0;
            let config = parse_params(path, &head[1..8], Some(shared))?;
            let (format, enc) = match head[0] {
                1 => (Format::Llama2cV1, Encoding::Native(DataType::F32)),
                2 => {
                    let g = ints(37, 1).ok_or_else(too_short)?[0];
                    let group = usize::try_from(g).ok().filter(|&g| g > 0).ok_or_else(|| {
                        Error::format(path, format!("invalid Q8_0 group size {g}"))
                    })?;
                    (Format::Llama2cV2, Encoding::Llama2cQ8 { group })
                }
                v => {
                    return Err(Error::format(
                        path,
                        format!("llama2.c checkpoint version {v} is not supported (1 and 2 are)"),
                    ))
                }
            };
            let items = layout_v1_v2(&config, enc);
            (format, config, HEADER_V1, items)
        } else {
            let config = parse_params(path, &ints(0, 7).ok_or_else(too_short)?, None)?;
            let items = layout_legacy(&config);
            (Format::Llama2cLegacy, config, HEADER_LEGACY, items)
        };
    if map.len() < start {
        return Err(too_short());
    }
    let tensors = place(path, &map, start, items)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let tokenizer_candidates = vec![
        dir.join(format!("tok{}.bin", config.vocab_size)),
        dir.join("tokenizer.bin"),
        dir.join("tokenizer.model"),
    ];
    Ok(Checkpoint {
        format,
        config,
        tensors,
        tokenizer: None,
        tokenizer_candidates,
        ignored: Vec::new(),
    })
}
