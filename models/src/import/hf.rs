//! Hugging Face checkpoints: `config.json` plus safetensors weights (one file, or shards
//! listed by `model.safetensors.index.json`), with the tensor names of transformers'
//! `LlamaForCausalLM`. Their q/k projections use the rotate-half RoPE layout.
//!
//! The same names serve, through the Llama graph, `model_type` `internlm` (q/k/v/o biases,
//! `bias` in the config) and `baichuan` (the fused `W_pack` is split into q, k and v rows;
//! a config without `max_position_embeddings` is a 13B model, which uses ALiBi: its
//! modeling code sizes the ALiBi table from `model_max_length`, the 7B one its RoPE cache
//! from `max_position_embeddings`). `model_type` `chatglm` goes to [`super::thudm`]; what
//! `llama` (Llama 3), `mistral`, `qwen2`, `qwen3` and `phi3` configure is read by
//! [`super::hf_families`]; Qwen3 adds an RMSNorm over each query and key head
//! ([`ModelConfig::qk_norm`]); Phi-3 fuses q/k/v and gate/up, which are split like
//! Baichuan's `W_pack`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use flm_core::DataType;
use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

use super::hf_families::{self, MoeFields, RopeFields, WindowFields};
use super::{
    deepseek, gpt_oss, map_file, packed, pytorch, thudm, Checkpoint, Encoding, Format, SourceTensor,
};
use crate::tensor_names::{canonical_tensors, TensorName};
use crate::{Activation, Error, Family, ModelConfig, Result};

/// A token id or a list of them (`eos_token_id` is either in HF configs).
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Ids {
    One(u32),
    Many(Vec<u32>),
}

impl Ids {
    pub(super) fn into_vec(self) -> Vec<u32> {
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
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    max_position_embeddings: Option<usize>,
    rms_norm_eps: Option<f32>,
    #[serde(flatten)]
    rope: RopeFields,
    #[serde(flatten)]
    window: WindowFields,
    #[serde(flatten)]
    moe: MoeFields,
    tie_word_embeddings: Option<bool>,
    bos_token_id: Option<Ids>,
    eos_token_id: Option<Ids>,
    hidden_act: Option<String>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    /// InternLM: biases on q, k, v and o.
    bias: Option<bool>,
    /// Qwen2-MoE: biases on q, k and v (default true).
    qkv_bias: Option<bool>,
    /// Baichuan-13B: the context length (it has no `max_position_embeddings`).
    model_max_length: Option<usize>,
    /// Gemma: the feed-forward gate's activation (`gelu_pytorch_tanh`).
    hidden_activation: Option<String>,
    /// Gemma 2 and 3: the attention scale is `query_pre_attn_scalar^-0.5`.
    query_pre_attn_scalar: Option<f64>,
    /// Gemma 2: soft-capping of the attention scores.
    attn_logit_softcapping: Option<f32>,
    /// Gemma 2: soft-capping of the logits.
    final_logit_softcapping: Option<f32>,
    /// Gemma 2 and 3 (transformers 5), gpt-oss: `sliding_attention` or `full_attention` per
    /// layer.
    layer_types: Option<Vec<String>>,
    /// Gemma 3 (transformers 4): every this-many-th layer is global.
    sliding_window_pattern: Option<usize>,
    /// Gemma 3 (transformers 4): the RoPE θ of the sliding-window layers.
    rope_local_base_freq: Option<f32>,
}

fn parse_config(path: &Path) -> Result<(ModelConfig, Family)> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    #[derive(Deserialize)]
    struct ModelType {
        model_type: Option<String>,
    }
    let kind: ModelType = serde_json::from_str(&text)
        .map_err(|e| Error::format(path, format!("invalid config.json: {e}")))?;
    let unsupported = |what: String| Error::format(path, format!("unsupported model: {what}"));
    let family = match kind.model_type.as_deref() {
        Some(t) => Family::from_hf_model_type(t)
            .ok_or_else(|| unsupported(format!("model_type \"{t}\"")))?,
        None => {
            return Err(Error::format(
                path,
                "invalid config.json: missing field `model_type`",
            ))
        }
    };
    if family == Family::ChatGlm {
        return Ok((thudm::parse_config(path, &text)?, family));
    }
    let mut hf: HfConfig = serde_json::from_str(&text)
        .map_err(|e| Error::format(path, format!("invalid config.json: {e}")))?;
    // Baichuan2's NormHead normalises the classifier rows at run time; its vocabulary of
    // 125696 tells it from Baichuan 1.
    if family == Family::Baichuan && hf.vocab_size == 125696 {
        return Err(unsupported("Baichuan2's normalised classifier head".into()));
    }
    let ((rope_theta, rope_scaling), rope_local_theta) = if family == Family::Gemma3 {
        let (global, local) = hf_families::gemma3_ropes(
            &hf.rope,
            hf.rope_local_base_freq,
            hf.max_position_embeddings,
        )
        .map_err(unsupported)?;
        (global, Some(local))
    } else {
        let global =
            hf_families::rope(&hf.rope, hf.max_position_embeddings).map_err(unsupported)?;
        (global, None)
    };
    let sliding_window = hf_families::sliding_window(family, &hf.window).map_err(unsupported)?;
    let activation = if family.is_gemma() {
        // Gemma 1 reads `hidden_act`, whose `gelu` in the official configs transformers
        // runs as the tanh approximation; Gemma 2 and 3 read `hidden_activation`.
        let (act, legacy) = match family {
            Family::Gemma => (hf.hidden_act.as_deref(), Some("gelu")),
            _ => (hf.hidden_activation.as_deref(), None),
        };
        match act {
            None | Some("gelu_pytorch_tanh") => Activation::GeluTanh,
            Some(a) if Some(a) == legacy => Activation::GeluTanh,
            Some(act) => {
                let msg = format!("hidden_activation \"{act}\" (only gelu_pytorch_tanh)");
                return Err(unsupported(msg));
            }
        }
    } else {
        if let Some(act) = hf.hidden_act.as_deref().filter(|&a| a != "silu") {
            return Err(unsupported(format!("hidden_act \"{act}\" (only silu)")));
        }
        Activation::Silu
    };
    if hf.mlp_bias == Some(true) {
        return Err(unsupported("MLP biases".into()));
    }
    let (qkv_bias, o_bias) = match family {
        Family::InternLm => (hf.bias.unwrap_or(true), hf.bias.unwrap_or(true)),
        Family::Qwen2 => (true, false),
        Family::Qwen2Moe => (hf.qkv_bias.unwrap_or(true), false),
        Family::Glm4 => (hf.attention_bias.unwrap_or(true), false),
        Family::Glm4Moe => (hf.attention_bias.unwrap_or(false), false),
        _ => (
            hf.attention_bias.unwrap_or(false),
            hf.attention_bias.unwrap_or(false),
        ),
    };
    let alibi = family == Family::Baichuan && hf.max_position_embeddings.is_none();
    if hf.num_attention_heads == 0 {
        return Err(Error::Config("num_attention_heads must be positive".into()));
    }
    let head_dim = hf
        .head_dim
        .unwrap_or(hf.hidden_size / hf.num_attention_heads);
    // transformers' `int(head_dim * partial_rotary_factor)`.
    let partial = hf_families::partial_rotary_factor(&hf.rope)
        .unwrap_or_else(|| family.partial_rotary_factor());
    let rotary_dim = (partial < 1.0).then_some((head_dim as f32 * partial) as usize);
    let config = ModelConfig {
        dim: hf.hidden_size,
        hidden_dim: hf.intermediate_size,
        n_layers: hf.num_hidden_layers,
        n_heads: hf.num_attention_heads,
        n_kv_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
        head_dim,
        rotary_dim,
        vocab_size: hf.vocab_size,
        max_seq_len: hf
            .max_position_embeddings
            .or(hf.model_max_length)
            .unwrap_or(2048),
        norm_eps: hf.rms_norm_eps.unwrap_or(1e-6),
        rope_theta,
        rope_style: family.hf_rope_style(),
        tie_embeddings: hf.tie_word_embeddings.unwrap_or(false),
        bos_token_id: hf
            .bos_token_id
            .take()
            .and_then(|b| b.into_vec().first().copied()),
        eos_token_ids: hf
            .eos_token_id
            .take()
            .map(Ids::into_vec)
            .unwrap_or_default(),
        alibi,
        qkv_bias,
        o_bias,
        rope_scaling,
        sliding_window,
        qk_norm: family.qk_norm(),
        post_norms: family.post_norms(),
        activation,
        rope_local_theta,
        moe: hf_families::moe(family, &hf.moe, hf.num_hidden_layers, hf.intermediate_size)
            .map_err(unsupported)?,
        ..ModelConfig::default()
    };
    let config = if family.is_gemma() {
        gemma(config, &hf, family).map_err(unsupported)?
    } else if family == Family::GptOss {
        gpt_oss(config, &hf).map_err(unsupported)?
    } else if family.has_deepseek_experts() {
        deepseek::configure(config, family, &text).map_err(unsupported)?
    } else {
        config
    };
    config
        .validate()
        .map_err(|e| Error::format(path, e.to_string()))?;
    Ok((config, family))
}

/// What Gemma changes in the Llama graph (transformers' `GemmaModel`, `Gemma2Model`,
/// `Gemma3TextModel`): RMSNorm gains stored as `w` for `1 + w`, embeddings times
/// `√hidden_size`, tied embeddings by default; Gemma 2 and 3 add the post-norms, the
/// attention scale `query_pre_attn_scalar^-0.5` and sliding-window layers (`layer_types`,
/// else Gemma 2's even layers and Gemma 3's all but every `sliding_window_pattern`-th);
/// Gemma 2 soft-caps the scores and the logits.
///
/// Errors: a message for `layer_types` of the wrong length or an unknown type.
fn gemma(
    mut c: ModelConfig,
    hf: &HfConfig,
    family: Family,
) -> std::result::Result<ModelConfig, String> {
    c.norm_unit_offset = true;
    c.embed_scale = Some((hf.hidden_size as f64).sqrt() as f32);
    c.tie_embeddings = hf.tie_word_embeddings.unwrap_or(true);
    if family == Family::Gemma {
        return Ok(c);
    }
    c.attention_scale = hf.query_pre_attn_scalar.map(|q| q.powf(-0.5) as f32);
    c.attn_softcap = hf.attn_logit_softcapping;
    c.final_softcap = hf.final_logit_softcapping;
    let sliding: Vec<bool> = match layer_types(hf)? {
        Some(sliding) => sliding,
        None if family == Family::Gemma2 => (0..c.n_layers).map(|l| l % 2 == 0).collect(),
        None => {
            let pattern = hf.sliding_window_pattern.unwrap_or(6).max(1);
            (0..c.n_layers).map(|l| (l + 1) % pattern != 0).collect()
        }
    };
    c.sliding_layers = Some(sliding);
    Ok(c)
}

/// Which layers `layer_types` makes sliding-window ones; `None` without the field.
///
/// Errors: a message naming an unknown type.
fn layer_types(hf: &HfConfig) -> std::result::Result<Option<Vec<bool>>, String> {
    hf.layer_types
        .as_ref()
        .map(|types| {
            types
                .iter()
                .map(|t| match t.as_str() {
                    "sliding_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(format!("layer type \"{other}\"")),
                })
                .collect()
        })
        .transpose()
}

/// What gpt-oss changes in the Llama graph (transformers' `GptOssModel`): attention sinks,
/// and sliding-window layers where `layer_types` says (transformers' default: the even
/// layers).
///
/// Errors: a message for an unknown layer type.
fn gpt_oss(mut c: ModelConfig, hf: &HfConfig) -> std::result::Result<ModelConfig, String> {
    c.attn_sinks = true;
    let sliding = layer_types(hf)?.unwrap_or_else(|| (0..c.n_layers).map(|l| l % 2 == 0).collect());
    c.sliding_layers = Some(sliding);
    Ok(c)
}

/// The Hugging Face name of `name` in a checkpoint of `family`: the table's
/// ([`TensorName::hf`]), but where the family names a layer's part otherwise
/// ([`Family::hf_layer_name`]).
fn hf_name(family: Family, name: TensorName) -> Option<String> {
    let renamed = match name {
        TensorName::Layer(l, part) => family
            .hf_layer_name(part)
            .map(|n| format!("model.layers.{l}.{n}")),
        _ => None,
    };
    renamed.or_else(|| name.hf())
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: HashMap<String, String>,
}

/// The files holding the weights of the checkpoint in `dir`, in transformers' order of
/// preference: safetensors (`model.safetensors.index.json`, `model.safetensors`, any
/// `*.safetensors`), then PyTorch `torch.save` files (`pytorch_model.bin.index.json`,
/// `pytorch_model.bin`).
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let sharded = |index: &str| -> Result<Option<Vec<PathBuf>>> {
        let index = dir.join(index);
        if !index.is_file() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
        let parsed: ShardIndex = serde_json::from_str(&text)
            .map_err(|e| Error::format(&index, format!("invalid shard index: {e}")))?;
        let files: BTreeSet<&String> = parsed.weight_map.values().collect();
        files
            .into_iter()
            .map(|f| {
                // Shards are files of `dir`: no absolute paths, no `..`.
                let relative = Path::new(f)
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
                if relative {
                    Ok(dir.join(f))
                } else {
                    Err(Error::format(
                        &index,
                        format!("shard {f:?} is not a file name"),
                    ))
                }
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    };
    if let Some(files) = sharded("model.safetensors.index.json")? {
        return Ok(files);
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
    if !files.is_empty() {
        return Ok(files);
    }
    if let Some(files) = sharded("pytorch_model.bin.index.json")? {
        return Ok(files);
    }
    let bin = dir.join("pytorch_model.bin");
    if bin.is_file() {
        return Ok(vec![bin]);
    }
    Err(Error::format(
        dir,
        "no weights found (looked for model.safetensors, model.safetensors.index.json, \
         *.safetensors, pytorch_model.bin and pytorch_model.bin.index.json)",
    ))
}

/// Every tensor of the given safetensors or PyTorch `torch.save` files (told apart by
/// their first bytes), by Hugging Face name, but the safetensors ones `skip` names.
fn read_tensors(
    files: &[PathBuf],
    skip: impl Fn(&str) -> bool,
) -> Result<HashMap<String, SourceTensor>> {
    let mut by_name = HashMap::new();
    for file in files {
        let map = map_file(file)?;
        if pytorch::is_torch_save(&map) {
            by_name.extend(pytorch::read_tensors(file, &map)?);
            continue;
        }
        let (header_len, metadata) = SafeTensors::read_metadata(&map)
            .map_err(|e| Error::format(file, format!("invalid safetensors file: {e}")))?;
        for (name, info) in metadata.tensors() {
            if skip(&name) {
                continue;
            }
            let dtype = match info.dtype {
                Dtype::F32 => DataType::F32,
                Dtype::F16 => DataType::F16,
                Dtype::BF16 => DataType::BF16,
                other => {
                    return Err(Error::format(
                        file,
                        format!(
                            "tensor {name} has dtype {other:?}; f32, f16 and bf16 are supported"
                        ),
                    ))
                }
            };
            let offset = 8 + header_len + info.data_offsets.0;
            let t = SourceTensor::new(
                name.clone(),
                info.shape.clone(),
                Encoding::Native(dtype),
                &map,
                offset,
                file,
            )?;
            by_name.insert(name, t);
        }
    }
    Ok(by_name)
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
    let (mut config, family) = parse_config(&config_path)?;
    let files = match file {
        Some(f) => vec![f.to_path_buf()],
        None => weight_files(dir)?,
    };
    // GPTQ/AWQ linears: their packed parts become one `<prefix>.weight` each.
    let packed = packed::read(dir, &config_path, &files)?;
    // gpt-oss's MXFP4 experts: U8 blocks and scales, repacked by `gpt_oss::split`.
    let mut mxfp4 = match family {
        Family::GptOss => gpt_oss::Mxfp4Parts::read(&files)?,
        _ => gpt_oss::Mxfp4Parts::default(),
    };
    let mut by_name = read_tensors(&files, |name| {
        packed.as_ref().is_some_and(|p| p.consumes(name)) || mxfp4.consumes(name)
    })?;
    for t in packed.into_iter().flat_map(|p| p.tensors) {
        by_name.insert(t.name.clone(), t);
    }
    // A checkpoint saved by transformers has no prediction layers' weights.
    let mtp = format!("model.layers.{}.eh_proj.weight", config.n_layers);
    if config.mtp_layers > 0 && !by_name.contains_key(&mtp) {
        config.mtp_layers = 0;
    }
    // ChatGLM-6B names its SentencePiece model `ice_text.model`.
    let candidates: Vec<PathBuf> = ["tokenizer.model", "ice_text.model", "tokenizer.json"]
        .iter()
        .filter(|&&f| f != "ice_text.model" || family == Family::ChatGlm)
        .map(|f| dir.join(f))
        .collect();
    let checkpoint = |tensors, ignored| Checkpoint {
        format: Format::HuggingFace,
        config: config.clone(),
        tensors,
        tokenizer: None,
        tokenizer_candidates: candidates.clone(),
        ignored,
    };
    match family {
        Family::ChatGlm => {
            let tensors = thudm::tensors(dir, &config, &mut by_name)?;
            return Ok(checkpoint(tensors, ignored(by_name)));
        }
        Family::Baichuan => split_w_pack(&config, &mut by_name)?,
        _ if family.fused_gate_up() => split_fused(&config, &mut by_name)?,
        Family::Mixtral => rename_mixtral(&mut by_name),
        _ => {}
    }
    let mut split = deepseek::split(&config, &mut by_name)?;
    split.extend(gpt_oss::split(&config, &mut by_name, &mut mxfp4)?);
    let tensors = canonical_tensors(&config)
        .into_iter()
        .map(|(canonical, _)| {
            if let Some(mut t) = split.remove(&canonical) {
                t.name = canonical.to_string();
                return Ok(t);
            }
            let hf = hf_name(family, canonical).ok_or_else(|| {
                Error::format(
                    dir,
                    format!("{family} checkpoints have no tensor {canonical}"),
                )
            })?;
            let mut t = by_name.remove(&hf).ok_or_else(|| {
                let hint = if canonical == TensorName::Classifier {
                    " (and tie_word_embeddings is false)"
                } else {
                    ""
                };
                Error::format(dir, format!("missing tensor {hf}{hint}"))
            })?;
            t.name = canonical.to_string();
            Ok(t)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut unused = ignored(by_name);
    unused.extend(mxfp4.unused());
    unused.sort();
    Ok(checkpoint(tensors, unused))
}

/// Replaces each layer's Baichuan `self_attn.W_pack.weight` `[3·dim, dim]` (q, k, v rows)
/// by the `q_proj`, `k_proj` and `v_proj` tensors of the Llama names.
fn split_w_pack(c: &ModelConfig, by_name: &mut HashMap<String, SourceTensor>) -> Result<()> {
    let (q, kv) = (c.q_dim(), c.kv_dim());
    for l in 0..c.n_layers {
        let p = format!("model.layers.{l}.self_attn");
        let Some(pack) = by_name.remove(&format!("{p}.W_pack.weight")) else {
            continue;
        };
        for (name, rows) in [("q", 0..q), ("k", q..q + kv), ("v", q + kv..q + 2 * kv)] {
            let name = format!("{p}.{name}_proj.weight");
            by_name.insert(name.clone(), pack.rows(name, vec![rows])?);
        }
    }
    Ok(())
}

/// Replaces each layer's fused `self_attn.qkv_proj.weight` (q, k, v rows; Phi-3) and
/// `mlp.gate_up_proj.weight` (gate, then up rows: transformers' `chunk(2)`; Phi-3, GLM-4)
/// by the Llama names.
fn split_fused(c: &ModelConfig, by_name: &mut HashMap<String, SourceTensor>) -> Result<()> {
    let (q, kv, hd) = (c.q_dim(), c.kv_dim(), c.hidden_dim);
    for l in 0..c.n_layers {
        let p = format!("model.layers.{l}");
        let fused = [
            (
                "self_attn.qkv_proj",
                [
                    ("self_attn.q_proj", 0..q),
                    ("self_attn.k_proj", q..q + kv),
                    ("self_attn.v_proj", q + kv..q + 2 * kv),
                ]
                .to_vec(),
            ),
            (
                "mlp.gate_up_proj",
                [("mlp.gate_proj", 0..hd), ("mlp.up_proj", hd..2 * hd)].to_vec(),
            ),
        ];
        for (name, parts) in fused {
            let Some(t) = by_name.remove(&format!("{p}.{name}.weight")) else {
                continue;
            };
            for (part, rows) in parts {
                let part = format!("{p}.{part}.weight");
                by_name.insert(part.clone(), t.rows(part, vec![rows])?);
            }
        }
    }
    Ok(())
}

/// Renames Mixtral's `block_sparse_moe.gate` and `block_sparse_moe.experts.{e}.w1`, `w2`,
/// `w3` (gate, down, up: transformers' `MixtralBlockSparseTop2MLP`) to the
/// `mlp.gate` and `mlp.experts.{e}.gate_proj`, `down_proj`, `up_proj` of [`TensorName::hf`].
fn rename_mixtral(by_name: &mut HashMap<String, SourceTensor>) {
    let names: Vec<String> = by_name
        .keys()
        .filter(|n| n.contains(".block_sparse_moe."))
        .cloned()
        .collect();
    for name in names {
        let renamed = name
            .replace(".block_sparse_moe.", ".mlp.")
            .replace(".w1.weight", ".gate_proj.weight")
            .replace(".w2.weight", ".down_proj.weight")
            .replace(".w3.weight", ".up_proj.weight");
        if let Some(t) = by_name.remove(&name) {
            by_name.insert(renamed, t);
        }
    }
}

/// A checkpoint of random weights at the shapes of the Hugging Face `config.json` at
/// `config_path` (for benchmarks and load tests: speed does not depend on the values).
pub(super) fn random(config_path: &Path, seed: u64) -> Result<Checkpoint> {
    let (config, _) = parse_config(config_path)?;
    let tensors = canonical_tensors(&config)
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let seed = seed.wrapping_add(i as u64);
            SourceTensor::random(name.to_string(), shape, seed, config_path)
        })
        .collect();
    Ok(Checkpoint {
        format: Format::HuggingFace,
        config,
        tensors,
        tokenizer: None,
        tokenizer_candidates: Vec::new(),
        ignored: Vec::new(),
    })
}

/// The names of the tensors left after the canonical ones were taken, sorted.
fn ignored(by_name: HashMap<String, SourceTensor>) -> Vec<String> {
    let mut names: Vec<String> = by_name.into_keys().collect();
    names.sort();
    names
}
