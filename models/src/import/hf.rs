//! Hugging Face checkpoints: `config.json` plus safetensors weights (one file, or shards
//! listed by `model.safetensors.index.json`), with the tensor names of transformers'
//! `LlamaForCausalLM`. Their q/k projections use the rotate-half RoPE layout.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flm_core::{Data, DataType, RopeStyle};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use super::{map_file, Checkpoint, Format};
use crate::llama::{LlamaLayer, LlamaWeights};
use crate::{Error, ModelConfig, Result};

/// A token id or a list of them (`eos_token_id` is either in HF configs).
#[derive(Deserialize)]
#[serde(untagged)]
enum Ids {
    One(u32),
    Many(Vec<u32>),
}

impl Ids {
    fn into_vec(self) -> Vec<u32> {
        match self {
            Ids::One(id) => vec![id],
            Ids::Many(ids) => ids,
        }
    }
}

/// The fields of transformers' `LlamaConfig` that the graph uses; optional ones take
/// transformers' defaults.
#[derive(Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    max_position_embeddings: Option<usize>,
    rms_norm_eps: Option<f32>,
    rope_theta: Option<f32>,
    rope_scaling: Option<serde_json::Value>,
    tie_word_embeddings: Option<bool>,
    bos_token_id: Option<Ids>,
    eos_token_id: Option<Ids>,
    hidden_act: Option<String>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
}

fn parse_config(path: &Path) -> Result<ModelConfig> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let hf: HfConfig = serde_json::from_str(&text)
        .map_err(|e| Error::format(path, format!("invalid config.json: {e}")))?;
    let unsupported = |what: String| Error::format(path, format!("unsupported model: {what}"));
    match hf.model_type.as_deref() {
        Some("llama") => {}
        Some(other) => return Err(unsupported(format!("model_type \"{other}\""))),
        None => {
            return Err(Error::format(
                path,
                "invalid config.json: missing field `model_type`",
            ))
        }
    }
    if hf.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(unsupported("rope_scaling is not supported yet".into()));
    }
    if let Some(act) = hf.hidden_act.as_deref().filter(|&a| a != "silu") {
        return Err(unsupported(format!("hidden_act \"{act}\" (only silu)")));
    }
    if hf.attention_bias == Some(true) || hf.mlp_bias == Some(true) {
        return Err(unsupported("attention or MLP biases".into()));
    }
    if hf.num_attention_heads == 0 {
        return Err(Error::Config("num_attention_heads must be positive".into()));
    }
    let config = ModelConfig {
        dim: hf.hidden_size,
        hidden_dim: hf.intermediate_size,
        n_layers: hf.num_hidden_layers,
        n_heads: hf.num_attention_heads,
        n_kv_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
        head_dim: hf
            .head_dim
            .unwrap_or(hf.hidden_size / hf.num_attention_heads),
        vocab_size: hf.vocab_size,
        max_seq_len: hf.max_position_embeddings.unwrap_or(2048),
        norm_eps: hf.rms_norm_eps.unwrap_or(1e-6),
        rope_theta: hf.rope_theta.unwrap_or(10000.0),
        rope_style: RopeStyle::RotateHalf,
        tie_embeddings: hf.tie_word_embeddings.unwrap_or(false),
        bos_token_id: hf.bos_token_id.and_then(|b| b.into_vec().first().copied()),
        eos_token_ids: hf.eos_token_id.map(Ids::into_vec).unwrap_or_default(),
    };
    config
        .validate()
        .map_err(|e| Error::format(path, e.to_string()))?;
    Ok(config)
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

/// The safetensors files holding the weights of the checkpoint in `dir`.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
        let parsed: ShardIndex = serde_json::from_str(&text)
            .map_err(|e| Error::format(&index, format!("invalid shard index: {e}")))?;
        let files: BTreeSet<&String> = parsed.weight_map.values().collect();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::format(
            dir,
            "no *.safetensors weights found (PyTorch .bin checkpoints are not supported yet)",
        ));
    }
    Ok(files)
}

struct TensorRef {
    map: Arc<Mmap>,
    file: PathBuf,
    offset: usize,
    dtype: DataType,
    shape: Vec<usize>,
}

/// Every tensor of the given safetensors files, by name.
struct Tensors {
    by_name: HashMap<String, TensorRef>,
    dir: PathBuf,
}

impl Tensors {
    fn open(dir: &Path, files: &[PathBuf]) -> Result<Tensors> {
        let mut by_name = HashMap::new();
        for file in files {
            let map = map_file(file)?;
            let (header_len, metadata) = SafeTensors::read_metadata(&map)
                .map_err(|e| Error::format(file, format!("invalid safetensors file: {e}")))?;
            for (name, info) in metadata.tensors() {
                let dtype = match info.dtype {
                    Dtype::F32 => Some(DataType::F32),
                    Dtype::F16 => Some(DataType::F16),
                    Dtype::BF16 => Some(DataType::BF16),
                    _ => None,
                };
                let dtype = dtype.ok_or_else(|| {
                    Error::format(
                        file,
                        format!(
                            "tensor {name} has dtype {:?}; f32, f16 and bf16 are supported",
                            info.dtype
                        ),
                    )
                })?;
                let offset = 8 + header_len + info.data_offsets.0;
                by_name.insert(
                    name,
                    TensorRef {
                        map: Arc::clone(&map),
                        file: file.clone(),
                        offset,
                        dtype,
                        shape: info.shape.clone(),
                    },
                );
            }
        }
        Ok(Tensors {
            by_name,
            dir: dir.to_path_buf(),
        })
    }

    fn has(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The tensor `name`, which must have `shape`.
    fn get(&self, name: &str, shape: &[usize]) -> Result<Data> {
        let t = self
            .by_name
            .get(name)
            .ok_or_else(|| Error::format(&self.dir, format!("missing tensor {name}")))?;
        if t.shape != shape {
            return Err(Error::format(
                &t.file,
                format!(
                    "tensor {name} has shape {:?}, config.json implies {shape:?}",
                    t.shape
                ),
            ));
        }
        Ok(Data::from_mmap(&t.map, t.offset, t.dtype, shape)?)
    }
}

/// Loads the Hugging Face checkpoint in `dir`; `file` restricts the weights to one
/// safetensors file (when the user named it rather than the directory).
pub(super) fn load_dir(dir: &Path, file: Option<&Path>) -> Result<Checkpoint> {
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        return Err(Error::format(
            dir,
            "not a model: no config.json (expected a Hugging Face directory, a llama2.c .bin \
             or a safetensors file beside its config.json)",
        ));
    }
    let c = parse_config(&config_path)?;
    let files = match file {
        Some(f) => vec![f.to_path_buf()],
        None => weight_files(dir)?,
    };
    let t = Tensors::open(dir, &files)?;
    let (dim, hd, q_dim, kv_dim) = (c.dim, c.hidden_dim, c.q_dim(), c.kv_dim());
    let layers = (0..c.n_layers)
        .map(|l| {
            let p = format!("model.layers.{l}");
            Ok(LlamaLayer {
                attn_norm: t.get(&format!("{p}.input_layernorm.weight"), &[dim])?,
                wq: t.get(&format!("{p}.self_attn.q_proj.weight"), &[q_dim, dim])?,
                wk: t.get(&format!("{p}.self_attn.k_proj.weight"), &[kv_dim, dim])?,
                wv: t.get(&format!("{p}.self_attn.v_proj.weight"), &[kv_dim, dim])?,
                wo: t.get(&format!("{p}.self_attn.o_proj.weight"), &[dim, q_dim])?,
                ffn_norm: t.get(&format!("{p}.post_attention_layernorm.weight"), &[dim])?,
                w_gate: t.get(&format!("{p}.mlp.gate_proj.weight"), &[hd, dim])?,
                w_down: t.get(&format!("{p}.mlp.down_proj.weight"), &[dim, hd])?,
                w_up: t.get(&format!("{p}.mlp.up_proj.weight"), &[hd, dim])?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let classifier = if t.has("lm_head.weight") {
        Some(t.get("lm_head.weight", &[c.vocab_size, dim])?)
    } else if c.tie_embeddings {
        None
    } else {
        return Err(Error::format(
            dir,
            "missing tensor lm_head.weight (and tie_word_embeddings is false)",
        ));
    };
    let weights = LlamaWeights {
        embedding: t.get("model.embed_tokens.weight", &[c.vocab_size, dim])?,
        layers,
        final_norm: t.get("model.norm.weight", &[dim])?,
        classifier,
    };
    Ok(Checkpoint {
        format: Format::HuggingFace,
        config: c,
        weights,
        tokenizer_candidates: vec![dir.join("tokenizer.model"), dir.join("tokenizer.json")],
    })
}
