//! GGUF v2/v3 files (llama.cpp; format in ggml `docs/gguf.md`), little-endian:
//!
//! ```text
//! "GGUF"  u32 version  u64 tensor_count  u64 kv_count
//! kv_count × (string key, u32 value type, value)        string = u64 length + bytes
//! tensor_count × (string name, u32 n_dims, n_dims × u64 ne, u32 ggml type, u64 offset)
//! padding to general.alignment (default 32), then the tensor data; offsets are relative
//! to its start and multiples of the alignment.
//! ```
//!
//! Value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string,
//! 9 array (u32 element type, u64 count, elements; arrays may nest), 10 u64, 11 i64, 12 f64.
//! Dimensions are in ggml order: `ne[0]` is the innermost (row) length, so a `[out, in]`
//! matrix is stored as `ne = [in, out]` and flm's shape is `ne` reversed.
//!
//! Every count, length and offset is untrusted: arithmetic is checked, each is bounded by
//! the bytes left in the file before anything is allocated for it, nesting is limited, and
//! a bad file gives [`Error::Format`], never a panic.
//!
//! `general.architecture` `llama`, `qwen2`, `qwen3`, `qwen2moe`, `qwen3moe`, `phi3`,
//! `gemma`, `gemma2`, `gemma3`, `glm4`, `glm4moe`, `deepseek2` and `gpt-oss`
//! ([`Family::gguf_architecture`]; DeepSeek's multi-head latent attention in `gguf/mla.rs`,
//! its YaRN in [`yarn`]; gpt-oss's sinks, windows, expert biases and MXFP4 experts in
//! `gguf/gpt_oss.rs`) map onto
//! [`ModelConfig`] from the keys under the architecture's name. llama.cpp's converter
//! stores a Llama's q/k in Meta's layout ([`flm_core::RopeStyle::AdjacentPairs`]) and the
//! others' as transformers has them (GLM-4's adjacent pairs; the rest
//! [`flm_core::RopeStyle::RotateHalf`], its NEOX RoPE type); Qwen2 adds q/k/v biases
//! (`attn_q.bias`...), Qwen3 a norm over each query and key head (`attn_q_norm`,
//! `attn_k_norm`). Mixtures of experts (`{arch}.expert_count`: `llama` for Mixtral,
//! `qwen2moe`, `qwen3moe`) stack each layer's experts into one tensor per projection
//! (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`, `[n_experts, out, in]`), each
//! expert read as a view of its rows; Qwen2-MoE adds a shared expert (`*_shexp`). Phi-3
//! fuses q/k/v (`attn_qkv`) and gate/up (`ffn_up`), read as row views, and keeps
//! LongRoPE's factors as F32 tensors (`rope_factors_short`, `rope_factors_long`); GLM-4
//! fuses gate/up as Phi-3 does and has Gemma 2's post-norms (`post_attention_norm`,
//! `post_ffw_norm`). GLM-4.5 (`glm4moe`) has DeepSeek-V3's experts (see [`moe`]), q/k/v
//! biases and q/k norms where its tensors have them, and counts its multi-token-prediction
//! layer (`nextn_predict_layers`) in `block_count`: its tensors (`blk.{l}.nextn.*` beside
//! the layer's own) load as [`crate::MtpLayer`]s; where a converter counted it without
//! writing them, flm runs the others.
//! Tensors F32, F16, BF16
//! (zero-copy) and the ggml block types of [`GgmlType`] are read, each into the dtype
//! [`Encoding::load_dtype`] names (Q4_0 and Q4_1 repacked without loss; Q4_K, Q5_K and
//! Q6_K used in place as flm's dtypes of the same bytes, [`flm_core::kquant`]). A SentencePiece
//! vocabulary (`tokenizer.ggml.model = "llama"`) or a byte-level BPE one (`"gpt2"`,
//! `gguf/bpe.rs`) becomes the checkpoint's tokenizer; other tokenizer kinds leave
//! [`Checkpoint::tokenizer`] `None`.

mod bpe;
mod file;
mod gpt_oss;
mod mla;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use flm_core::ggml::GgmlType;
use flm_core::{
    DataType, ExpertGroups, GroupScore, RopeScaling, RopeStyle, RouterScoring, YarnScaling,
};
use flm_tokenizer::{PieceType, SentencePieceSpec, Tokenizer, TokenizerKind, TokenizerSpec};

use super::hf_families::longrope_attention_factor;
use super::{map_file, Checkpoint, Encoding, Format, SourceTensor};
use crate::imatrix::{ImatrixEntry, ImportanceMatrix};
use crate::tensor_names::{canonical_tensors, LayerPart, TensorName};
use crate::{Activation, Error, Family, MlaConfig, ModelConfig, MoeConfig, Result};
use file::{parse, Gguf, Meta, TensorInfo, Value};
use gpt_oss::gpt_oss;

/// The hyper-parameters and family of a file of one of [`Family::gguf_architectures`]
/// (llama.cpp `llm_load_hparams` keys, under the architecture's name).
fn config(m: &Meta, g: &Gguf, map: &[u8]) -> Result<(ModelConfig, Family)> {
    let unsupported = |what: String| Error::format(m.path, format!("unsupported model: {what}"));
    let family = match m.str("general.architecture")? {
        Some(a) => match Family::from_gguf_architecture(&a) {
            Some(family) => family,
            None => {
                return Err(unsupported(format!(
                    "architecture \"{a}\" ({} are supported)",
                    Family::gguf_architectures().join(", ")
                )))
            }
        },
        None => {
            return Err(Error::format(
                m.path,
                "missing metadata general.architecture",
            ))
        }
    };
    let key = |k: &str| key(family, k);
    let rope_scaling = match m.str(&key("rope.scaling.type"))?.as_deref() {
        None | Some("none") => None,
        Some("linear") => Some(RopeScaling::Linear {
            factor: m.f32(&key("rope.scaling.factor"))?.unwrap_or(1.0),
        }),
        Some("yarn") => Some(yarn(m, family)?),
        Some(t) => return Err(unsupported(format!("RoPE scaling \"{t}\""))),
    };
    if g.tensors.iter().any(|t| t.name == "rope_freqs.weight") {
        return Err(unsupported(
            "RoPE frequency factors (rope_freqs.weight)".into(),
        ));
    }
    let dim = m.required(&key("embedding_length"))?;
    let n_heads = m.required(&key("attention.head_count"))?;
    if n_heads == 0 {
        return Err(Error::format(
            m.path,
            format!("{} is 0", key("attention.head_count")),
        ));
    }
    let mla = latent(m, family)?;
    let head_dim = match &mla {
        Some((_, v)) => *v,
        None => m
            .usize(&key("attention.key_length"))?
            .unwrap_or(dim / n_heads),
    };
    let value_key = key("attention.value_length");
    let value_length = m.usize(&value_key)?.filter(|_| mla.is_none());
    if let Some(v) = value_length.filter(|&v| v != head_dim) {
        return Err(unsupported(format!(
            "{value_key} {v} differs from head_dim {head_dim}"
        )));
    }
    // Partial rotary (Phi-4-mini): RoPE on the first `rope.dimension_count` of each head.
    let rotary_dim = m
        .usize(&key("rope.dimension_count"))?
        .filter(|&r| r != head_dim);
    let max_seq_len = m.required(&key("context_length"))?;
    let rope_scaling = match longrope(m, g, map, family, max_seq_len)? {
        Some(longrope) => Some(longrope),
        None => rope_scaling,
    };
    let vocab_size = match m.array("tokenizer.ggml.tokens")? {
        Some(tokens) => tokens.len(),
        None => m.required(&key("vocab_size"))?,
    };
    let eos = [
        m.id("tokenizer.ggml.eos_token_id")?,
        m.id("tokenizer.ggml.eot_token_id")?,
    ];
    let mut eos_token_ids: Vec<u32> = eos.into_iter().flatten().collect();
    eos_token_ids.dedup();
    let has = |name: &str| g.tensors.iter().any(|t| t.name == name);
    let blocks = m.required(&key("block_count"))?;
    if g.tensors.is_empty() {
        return Err(Error::format(
            m.path,
            "a vocabulary-only GGUF file (no tensors) is not a model",
        ));
    }
    // Bound the layer count by the tensors present before anything is sized or searched by
    // it (a Phi-3 layer has the fewest: two norms, fused qkv, output, fused gate/up, down).
    let needed = blocks.saturating_mul(6).saturating_add(2);
    if needed > g.tensors.len() {
        let msg = format!(
            "block_count {blocks} implies at least {needed} tensors, the file has {}",
            g.tensors.len()
        );
        return Err(Error::format(m.path, msg));
    }
    let (n_layers, mtp_layers) = match m.usize(&key("nextn_predict_layers"))? {
        Some(extra) if extra >= blocks => {
            let msg = format!("{extra} prediction layers of {blocks} blocks");
            return Err(Error::format(m.path, msg));
        }
        extra => {
            let (extra, n) = (extra.unwrap_or(0), blocks - extra.unwrap_or(0));
            // Some converters count the layers without writing their weights.
            let written = (n..blocks).all(|l| has(&format!("blk.{l}.nextn.eh_proj.weight")));
            (n, if written { extra } else { 0 })
        }
    };
    // GLM-4.5's biases and norms are optional in its config: the tensors say.
    let glm4_moe = family == Family::Glm4Moe;
    let config = ModelConfig {
        dim,
        hidden_dim: m.required(&key("feed_forward_length"))?,
        n_layers,
        mtp_layers,
        n_heads,
        n_kv_heads: m.usize(&key("attention.head_count_kv"))?.unwrap_or(n_heads),
        head_dim,
        vocab_size,
        max_seq_len,
        rotary_dim,
        norm_eps: m
            .f32(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-5),
        rope_theta: m.f32(&key("rope.freq_base"))?.unwrap_or(10000.0),
        rope_style: family.gguf_rope_style(),
        tie_embeddings: !g.tensors.iter().any(|t| t.name == "output.weight"),
        bos_token_id: m.id("tokenizer.ggml.bos_token_id")?,
        eos_token_ids,
        qkv_bias: family.qkv_bias() || (glm4_moe && has("blk.0.attn_q.bias")),
        qk_norm: family.qk_norm() || (glm4_moe && has("blk.0.attn_q_norm.weight")),
        post_norms: family.post_norms(),
        rope_scaling,
        ..ModelConfig::default()
    };
    let config = ModelConfig {
        moe: moe(m, g, family, &config)?,
        // Phi-3's window (0 for none: Phi-4-mini); Gemma's are read below.
        sliding_window: match family {
            Family::Phi3 => m
                .usize(&key("attention.sliding_window"))?
                .filter(|&w| w > 0),
            _ => None,
        },
        ..config
    };
    let config = if family.is_gemma() {
        gemma(config, m, family)?
    } else if family == Family::GptOss {
        gpt_oss(config, m, &has)?
    } else {
        config
    };
    let config = match mla {
        Some((mla, _)) => with_latent(config, mla),
        None => config,
    };
    config
        .validate()
        .map_err(|e| Error::format(m.path, e.to_string()))?;
    Ok((config, family))
}

/// The multi-head latent attention of a file that has `attention.kv_lora_rank`, and the
/// width of a value head (see `gguf/mla.rs`); `None` without it.
///
/// Errors: [`Error::Format`] for a missing or inconsistent width.
fn latent(m: &Meta, family: Family) -> Result<Option<(MlaConfig, usize)>> {
    let key = |k: &str| key(family, k);
    let Some(kv_lora_rank) = m.usize(&key("attention.kv_lora_rank"))? else {
        return Ok(None);
    };
    let rope = m.required(&key("rope.dimension_count"))?;
    let (k, v) = match m.usize(&key("attention.key_length_mla"))? {
        Some(k) => (k, m.required(&key("attention.value_length_mla"))?),
        None => (
            m.required(&key("attention.key_length"))?,
            m.required(&key("attention.value_length"))?,
        ),
    };
    let nope = k
        .checked_sub(rope)
        .filter(|&n| n > 0)
        .ok_or_else(|| Error::format(m.path, format!("key heads of {k} with {rope} rotated")))?;
    let mla = MlaConfig {
        q_lora_rank: m.usize(&key("attention.q_lora_rank"))?,
        kv_lora_rank,
        qk_nope_head_dim: nope,
        qk_rope_head_dim: rope,
    };
    Ok(Some((mla, v)))
}

/// `c` with multi-head latent attention `mla`: one latent KV head, RoPE in adjacent pairs
/// on the rotated part (llama.cpp's NORM type), the scores scaled by `qk_head_dim^-0.5`
/// and YaRN's `mscale_all_dim` factor.
fn with_latent(c: ModelConfig, mla: MlaConfig) -> ModelConfig {
    ModelConfig {
        n_kv_heads: 1,
        rotary_dim: Some(mla.qk_rope_head_dim),
        rope_style: RopeStyle::AdjacentPairs,
        attention_scale: Some(mla.attention_scale(c.rope_scaling.as_ref())),
        mla: Some(mla),
        ..c
    }
}

/// YaRN as llama.cpp's converter writes it: `rope.scaling.factor`,
/// `original_context_length`, `yarn_beta_fast` and `yarn_beta_slow` (defaults 32 and 1),
/// `attn_factor`, and DeepSeek's `yarn_log_multiplier` (`0.1 · mscale_all_dim`). A file
/// does not keep DeepSeek's `mscale`: with a log multiplier it is taken to equal
/// `mscale_all_dim`, as in every DeepSeek release, which makes the attention factor 1.
///
/// Errors: [`Error::Format`] for a missing factor or original context length.
fn yarn(m: &Meta, family: Family) -> Result<RopeScaling> {
    let key = |k: &str| key(family, k);
    let factor = m
        .f32(&key("rope.scaling.factor"))?
        .ok_or_else(|| Error::format(m.path, format!("missing {}", key("rope.scaling.factor"))))?;
    let mscale_all_dim = m
        .f32(&key("rope.scaling.yarn_log_multiplier"))?
        .filter(|&l| l != 0.0)
        .map(|l| l / 0.1);
    let attention_factor = match m.f32(&key("rope.scaling.attn_factor"))? {
        Some(a) => a,
        None => YarnScaling::default_attention_factor(factor, mscale_all_dim, mscale_all_dim),
    };
    Ok(RopeScaling::Yarn(YarnScaling {
        factor,
        original_max_position_embeddings: m
            .required(&key("rope.scaling.original_context_length"))?,
        beta_fast: m.f32(&key("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0),
        beta_slow: m.f32(&key("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0),
        attention_factor,
        truncate: true,
        mscale_all_dim,
    }))
}

/// `{arch}.{k}`: metadata key `k` under the architecture name of `family`, one that
/// [`Family::from_gguf_architecture`] read from the file (llama.cpp's `LLM_KV` names).
fn key(family: Family, k: &str) -> String {
    format!("{}.{k}", family.gguf_architecture().unwrap_or_default())
}

/// Phi-3's LongRoPE (Ding et al. 2024), as llama.cpp's converter writes it: the
/// per-frequency divisors as the F32 tensors `rope_factors_short.weight` and
/// `rope_factors_long.weight` `[rotary_dim / 2]`, the pre-training context
/// `{arch}.rope.scaling.original_context_length`, and `{arch}.rope.scaling.attn_factor`
/// (default: LongRoPE's for the extension `context_length / original`); `None` without the
/// factor tensors.
///
/// Errors: [`Error::Format`] for factors that are not F32 vectors inside the file, or a
/// missing original context length.
fn longrope(
    m: &Meta,
    g: &Gguf,
    map: &[u8],
    family: Family,
    max_seq_len: usize,
) -> Result<Option<RopeScaling>> {
    let key = |k: &str| key(family, k);
    let factors = |name: &str| -> Result<Option<Vec<f32>>> {
        let Some(t) = g.tensors.iter().find(|t| t.name == name) else {
            return Ok(None);
        };
        let bytes = match (t.ggml_type, t.ne.as_slice()) {
            (0, &[n]) => n
                .checked_mul(4)
                .and_then(|len| map.get(t.offset..t.offset.checked_add(len)?)),
            _ => None,
        };
        let bytes = bytes.ok_or_else(|| {
            let msg = format!("tensor {name}: not an F32 vector inside the file");
            Error::format(m.path, msg)
        })?;
        Ok(Some(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ))
    };
    let (Some(short_factor), Some(long_factor)) = (
        factors("rope_factors_short.weight")?,
        factors("rope_factors_long.weight")?,
    ) else {
        return Ok(None);
    };
    let original = m
        .required(&key("rope.scaling.original_context_length"))?
        .max(1);
    let attention_factor = match m.f32(&key("rope.scaling.attn_factor"))? {
        Some(f) => f,
        None => longrope_attention_factor(max_seq_len as f32 / original as f32, original),
    };
    Ok(Some(RopeScaling::LongRope {
        short_factor,
        long_factor,
        original_max_position_embeddings: original,
        attention_factor,
    }))
}

/// The experts of a file whose `{arch}.expert_count` is positive, as llama.cpp reads them
/// (`src/models/*.cpp`): `expert_used_count` per token, experts of
/// `expert_feed_forward_length` (default: `feed_forward_length` for Mixtral's `llama`,
/// `feed_forward_length / expert_used_count` for Qwen's), scored by a softmax or a sigmoid
/// (`expert_gating_func` 1 or 2), chosen from the `expert_group_used_count` best of
/// `expert_group_count` groups (by their best score after a softmax, by the sum of their
/// two best after a sigmoid, as DeepSeek-V2 and V3 choose), with the router's bias
/// `blk.{l}.exp_probs_b.bias` where the file has it, the top-k weights renormalised by
/// `expert_weights_norm` (else as llama.cpp's graphs fix it: `qwen2moe` not, `llama`,
/// `qwen3moe` and `glm4moe` always) and scaled by `expert_weights_scale`; `qwen2moe`'s
/// gated shared expert of `expert_shared_feed_forward_length` (default
/// `feed_forward_length`), `glm4moe`'s ungated `expert_shared_count` experts of the
/// routed width. A layer without a router (`blk.{l}.ffn_gate_inp.weight`) is dense, as
/// Qwen3-MoE's `mlp_only_layers` and GLM-4.5's leading dense layers.
///
/// Errors: [`Error::Format`] for a missing `expert_used_count`, malformed values, or
/// another gating function.
fn moe(m: &Meta, g: &Gguf, family: Family, c: &ModelConfig) -> Result<Option<MoeConfig>> {
    let key = |k: &str| key(family, k);
    let n_experts = m.usize(&key("expert_count"))?.unwrap_or(0);
    if n_experts == 0 {
        return Ok(None);
    }
    let unsupported = |what: String| Error::format(m.path, format!("unsupported model: {what}"));
    // llama.cpp's gating functions: 1 softmax, 2 sigmoid, 3 softmax of the top-k.
    let (scoring, group_score) = match m.usize(&key("expert_gating_func"))? {
        None | Some(1) => (RouterScoring::Softmax, GroupScore::Max),
        Some(2) => (RouterScoring::Sigmoid, GroupScore::SumOfTop2),
        Some(f) => {
            return Err(unsupported(format!(
                "expert gating function {f} (softmax, 1, or sigmoid, 2)"
            )))
        }
    };
    // 0 is llama.cpp's "not set".
    let routed_scale = match m.f32(&key("expert_weights_scale"))? {
        Some(w) if w != 0.0 => w,
        _ => 1.0,
    };
    let groups = match m.usize(&key("expert_group_count"))? {
        Some(n_groups) if n_groups > 1 => Some(ExpertGroups {
            n_groups,
            top_groups: m
                .usize(&key("expert_group_used_count"))?
                .unwrap_or(n_groups),
            score: group_score,
        }),
        _ => None,
    };
    let biased = |l: usize| {
        let bias = format!("blk.{l}.exp_probs_b.bias");
        g.tensors.iter().any(|t| t.name == bias)
    };
    let routed = |l: usize| {
        let router = format!("blk.{l}.ffn_gate_inp.weight");
        g.tensors.iter().any(|t| t.name == router)
    };
    let top_k = m.required(&key("expert_used_count"))?;
    let expert_dim = match m.usize(&key("expert_feed_forward_length"))? {
        Some(d) if d > 0 => d,
        _ if family == Family::Llama => c.hidden_dim,
        _ => c.hidden_dim / top_k.max(1),
    };
    let renormalize = m
        .bool(&key("expert_weights_norm"))?
        .unwrap_or(!matches!(family, Family::Qwen2Moe | Family::DeepseekV2));
    let dense_layers: Vec<usize> = (0..c.n_layers).filter(|&l| !routed(l)).collect();
    let shared_count = m.usize(&key("expert_shared_count"))?.unwrap_or(0);
    Ok(Some(MoeConfig {
        shared_expert_dim: match family {
            Family::Qwen2Moe => Some(
                m.usize(&key("expert_shared_feed_forward_length"))?
                    .filter(|&d| d > 0)
                    .unwrap_or(c.hidden_dim),
            ),
            _ => (shared_count > 0).then_some(shared_count * expert_dim),
        },
        // Qwen2-MoE's shared expert is gated; the counted ones (GLM-4.5's) are not.
        shared_expert_gated: shared_count == 0,
        scoring,
        groups,
        choice_bias: (0..c.n_layers).any(|l| routed(l) && biased(l)),
        routed_scale,
        dense_layers,
        ..MoeConfig::softmax_top_k(n_experts, top_k, expert_dim, renormalize)
    }))
}

/// Where canonical tensor `canonical` (of `shape`) is in a GGUF file of `family` whose tensors
/// are `by_name`: the name of the file's tensor ([`Family::gguf_layer_name`] where the family
/// renames it), and `None` when it is that whole tensor, or
/// `Some((first, total))` when it is the rows `first..first + shape[0]` of a tensor of
/// `total` rows (its dimensions past the row flattened; a vector is one row): an expert of
/// the layer's stacked `ffn_*_exps` `[n_experts, out, in]` (gpt-oss's expert biases of
/// `ffn_*_exps.bias` `[n_experts, out]`; or, in files without them, its own
/// `ffn_*.{e}` tensor, as llama.cpp wrote Mixtral before stacking), Phi-3's q, k and v of `attn_qkv` and its gate and
/// up of `ffn_up` (gate rows first, as transformers' `chunk(2)`), or the shared expert's
/// gate, which converters before 2025 squeezed from `[1, dim]` to `[dim]`.
fn place(
    canonical: TensorName,
    shape: &[usize],
    family: Family,
    c: &ModelConfig,
    by_name: &HashMap<&str, &TensorInfo>,
) -> Option<(String, Option<(usize, usize)>)> {
    use LayerPart::*;
    // A vector is one row of its stacked tensor (gpt-oss's expert biases).
    let rows = match shape {
        [_] => 1,
        _ => shape.first().copied().unwrap_or(0),
    };
    if let Some((stacked, e)) = canonical.gguf_stacked() {
        if !by_name.contains_key(stacked.as_str()) {
            if let Some(own) = canonical
                .gguf_per_expert()
                .filter(|own| by_name.contains_key(own.as_str()))
            {
                return Some((own, None));
            }
        }
        let n = c.moe.as_ref().map_or(0, |m| m.n_experts);
        return Some((stacked, Some((e * rows, n * rows))));
    }
    let TensorName::Layer(l, part) = canonical else {
        return Some((canonical.gguf()?, None));
    };
    if let Some(renamed) = family.gguf_layer_name(part) {
        return Some((format!("blk.{l}.{renamed}"), None));
    }
    let (q, kv, ff) = (c.q_dim(), c.kv_dim(), c.hidden_dim);
    let qkv = format!("blk.{l}.attn_qkv.weight");
    let fused = match part {
        Wq | Wk | Wv if by_name.contains_key(qkv.as_str()) => {
            let first = match part {
                Wq => 0,
                Wk => q,
                _ => q + kv,
            };
            Some((qkv, Some((first, q + 2 * kv))))
        }
        WGate | WUp if family.fused_gate_up() => {
            let first = if part == WGate { 0 } else { ff };
            Some((format!("blk.{l}.ffn_up.weight"), Some((first, 2 * ff))))
        }
        SharedExpertGate => Some((canonical.gguf()?, Some((0, 1)))),
        _ => None,
    };
    fused.or_else(|| Some((canonical.gguf()?, None)))
}

/// The file offset of rows `first..first + shape[0]` of `t` (`rows` = `(first, total)`, see
/// [`place`]) as a `shape` `[rows, row]` tensor: a row range of any ggml type is contiguous.
/// `None` when `t` does not have `total` rows of `shape[1]` values or the range overflows.
fn row_offset(
    t: &TensorInfo,
    (first, total): (usize, usize),
    shape: &[usize],
    enc: Encoding,
) -> Option<usize> {
    let [n, row] = *shape else { return None };
    let t_rows =
        t.ne.get(1..)?
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))?;
    if t.ne.first() != Some(&row) || t_rows != total || first.checked_add(n)? > total {
        return None;
    }
    first
        .checked_mul(enc.byte_len(&[1, row])?)?
        .checked_add(t.offset)
}

/// What Gemma changes, as llama.cpp reads it (`src/models/gemma*.cpp`): GeGLU, embeddings
/// times `√n_embd`, the norm gains with their `+ 1` already added by the converter;
/// Gemma 2 and 3: post-norms, sliding-window layers (`attention.sliding_window`, Gemma 2's
/// default 4096; `attention.sliding_window_pattern`, an array of flags or a period `n` whose
/// layers `il % n < n − 1` slide, default 2 and 6), the attention scale
/// `1/√n_embd_head_k` but `1/√(n_embd/n_head)` for the 27B models (46 and 62 layers), the
/// soft caps (`attn_logit_softcapping`, `final_logit_softcapping`); Gemma 3: q/k norms and
/// the sliding layers' RoPE base `rope.freq_base_swa` (default 10000, unscaled).
///
/// Errors: [`Error::Format`] for a malformed pattern.
fn gemma(mut c: ModelConfig, m: &Meta, family: Family) -> Result<ModelConfig> {
    let key = |k: &str| key(family, k);
    c.activation = Activation::GeluTanh;
    c.embed_scale = Some((c.dim as f64).sqrt() as f32);
    if family == Family::Gemma {
        return Ok(c);
    }
    let large = matches!(
        (family, c.n_layers),
        (Family::Gemma2, 46) | (Family::Gemma3, 62)
    );
    let width = if large { c.dim / c.n_heads } else { c.head_dim };
    c.attention_scale = Some(1.0 / (width as f32).sqrt());
    c.final_softcap = m.f32(&key("final_logit_softcapping"))?.filter(|&v| v > 0.0);
    let default_window = (family == Family::Gemma2).then_some(4096);
    c.sliding_window = m
        .usize(&key("attention.sliding_window"))?
        .or(default_window)
        .filter(|&w| w > 0);
    if family == Family::Gemma2 {
        c.attn_softcap = m.f32(&key("attn_logit_softcapping"))?.filter(|&v| v > 0.0);
    } else {
        c.rope_local_theta = Some(m.f32(&key("rope.freq_base_swa"))?.unwrap_or(10000.0));
    }
    let default = if family == Family::Gemma2 { 2 } else { 6 };
    c.sliding_layers = Some(sliding_layers(m, family, c.n_layers, default)?);
    Ok(c)
}

/// Which layers slide, as llama.cpp's `load_swa_pattern` reads
/// `attention.sliding_window_pattern`: an array of flags, or a period `n` (default
/// `default`) whose layers `l % n < n − 1` slide (every layer for 0).
///
/// Errors: [`Error::Format`] for a malformed pattern.
fn sliding_layers(m: &Meta, family: Family, n_layers: usize, default: usize) -> Result<Vec<bool>> {
    let pattern_key = key(family, "attention.sliding_window_pattern");
    match m.array(&pattern_key)? {
        Some(values) => values
            .iter()
            .map(|v| match v {
                Value::Bool(b) => Ok(*b),
                other => Err(Error::format(
                    m.path,
                    format!("{pattern_key} holds {}", other.describe()),
                )),
            })
            .collect::<Result<Vec<bool>>>(),
        None => {
            let n = m.usize(&pattern_key)?.unwrap_or(default);
            Ok((0..n_layers).map(|l| n == 0 || l % n < n - 1).collect())
        }
    }
}

/// The encoding of `t`, whose rows must fill its blocks.
///
/// Errors: [`Error::Format`] for a type flm does not read or rows that do not fill blocks.
fn checked_encoding(t: &TensorInfo, path: &Path) -> Result<Encoding> {
    let name = &t.name;
    let (enc, block) =
        encoding(t.ggml_type).map_err(|e| Error::format(path, format!("tensor {name}: {e}")))?;
    if t.ne.first().is_some_and(|&row| row % block != 0) {
        let msg = format!(
            "tensor {name}: rows of {} values do not fill {block}-value blocks",
            t.ne[0]
        );
        return Err(Error::format(path, msg));
    }
    Ok(enc)
}

/// File tensor `t` whole, under its own name, its shape `ne` reversed.
///
/// Errors: those of [`checked_encoding`] and [`SourceTensor::new`].
fn whole_tensor(
    t: &TensorInfo,
    map: &std::sync::Arc<memmap2::Mmap>,
    path: &Path,
) -> Result<SourceTensor> {
    let enc = checked_encoding(t, path)?;
    let shape = t.ne.iter().rev().copied().collect();
    SourceTensor::new(t.name.clone(), shape, enc, map, t.offset, path)
}

/// The encoding of a ggml tensor type, and its block length along `ne[0]`.
fn encoding(ggml_type: u32) -> std::result::Result<(Encoding, usize), String> {
    Ok(match ggml_type {
        0 => (Encoding::Native(DataType::F32), 1),
        1 => (Encoding::Native(DataType::F16), 1),
        30 => (Encoding::Native(DataType::BF16), 1),
        t => match GgmlType::from_id(t) {
            // Q8_0, the K-quants, the IQ4 types and MXFP4 rows are flm rows of the same
            // bytes: used in place.
            Some(ty) => match ty.native_dtype() {
                Some(dtype) => (Encoding::Native(dtype), ty.block_len()),
                None => (Encoding::Ggml(ty), ty.block_len()),
            },
            None => {
                const NAMES: &str = "F32 F16 Q4_0 Q4_1 Q4_2 Q4_3 Q5_0 Q5_1 Q8_0 Q8_1 Q2_K Q3_K \
                    Q4_K Q5_K Q6_K Q8_K IQ2_XXS IQ2_XS IQ3_XXS IQ1_S IQ4_NL IQ3_S IQ2_S IQ4_XS \
                    I8 I16 I32 I64 F64 IQ1_M BF16 Q4_0_4_4 Q4_0_4_8 Q4_0_8_8 TQ1_0 TQ2_0 \
                    IQ4_NL_4_4 IQ4_NL_4_8 IQ4_NL_8_8 MXFP4";
                let name = NAMES
                    .split_whitespace()
                    .nth(t as usize)
                    .unwrap_or("unknown");
                let known: Vec<&str> = GgmlType::ALL.iter().map(|t| t.name()).collect();
                return Err(format!(
                    "ggml type {name} ({t}); F32, F16, BF16, {} are supported",
                    known.join(", ")
                ));
            }
        },
    })
}

/// The tokenizer of the metadata: byte-level BPE for `tokenizer.ggml.model = "gpt2"`
/// (`gguf/bpe.rs`), else SentencePiece (llama.cpp's `llama` vocabulary):
/// `tokenizer.ggml.tokens` with `.scores` (default 0) and `.token_type` (SentencePiece's
/// numbers; 0, "undefined", counts as normal), BOS/EOS from `.bos_token_id`/
/// `.eos_token_id`, the unknown piece being the one of type 2 (as in SentencePiece;
/// `.unknown_token_id` is not consulted), byte fallback when byte pieces (type 6) exist,
/// `.add_space_prefix` (default true), `.remove_extra_whitespaces` (default false),
/// `.add_bos_token` (default true) and `tokenizer.chat_template`.
///
/// `Ok(Err(why))` when the file has no tokenizer flm can build (none, or a kind it does not
/// implement); `Err` when the `llama` vocabulary is malformed.
fn tokenizer(m: &Meta) -> Result<std::result::Result<Tokenizer, String>> {
    match m.str("tokenizer.ggml.model")?.as_deref() {
        Some("llama") => {}
        Some("gpt2") => return bpe::tokenizer(m),
        None => {
            return Ok(Err(
                "the file has no tokenizer (tokenizer.ggml.model)".into()
            ))
        }
        Some(k) => {
            return Ok(Err(format!(
                "tokenizer.ggml.model \"{k}\" is not supported yet"
            )))
        }
    }
    if m.array("tokenizer.ggml.precompiled_charsmap")?
        .is_some_and(|a| !a.is_empty())
    {
        return Ok(Err(
            "precompiled normalisation rules are not supported".into()
        ));
    }
    let bad = |msg: String| Error::format(m.path, format!("invalid tokenizer metadata: {msg}"));
    let tokens = m
        .array("tokenizer.ggml.tokens")?
        .ok_or_else(|| bad("no tokens".into()))?;
    let n = tokens.len();
    let list = |key: &str| -> Result<Option<&[Value]>> {
        match m.array(key)? {
            Some(a) if a.len() != n => {
                Err(bad(format!("{key} has {} entries, {n} tokens", a.len())))
            }
            a => Ok(a),
        }
    };
    let (scores, types) = (
        list("tokenizer.ggml.scores")?,
        list("tokenizer.ggml.token_type")?,
    );
    let mut spec = TokenizerSpec {
        kind: TokenizerKind::SentencePieceBpe(SentencePieceSpec {
            add_dummy_prefix: m.bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true),
            remove_extra_whitespaces: m
                .bool("tokenizer.ggml.remove_extra_whitespaces")?
                .unwrap_or(false),
            escape_whitespaces: true,
            unk_surface: " \u{2047} ".into(),
        }),
        pieces: Vec::with_capacity(n),
        scores: Vec::with_capacity(n),
        types: Vec::with_capacity(n),
        byte_fallback: false,
        unk_id: None,
        bos_id: m.id("tokenizer.ggml.bos_token_id")?,
        eos_id: m.id("tokenizer.ggml.eos_token_id")?,
        add_bos: m.bool("tokenizer.ggml.add_bos_token")?.unwrap_or(true),
        chat_template: None,
        prefix: None,
        chat_format: None,
    };
    for i in 0..n {
        let Value::Str(piece) = &tokens[i] else {
            return Err(bad(format!("token {i} is not a string")));
        };
        let score = match scores.map(|s| &s[i]) {
            None => 0.0,
            Some(Value::Float(f)) => *f as f32,
            Some(v) => return Err(bad(format!("score {i} is {}", v.describe()))),
        };
        let ty = match types.map(|t| &t[i]) {
            None | Some(Value::Int(0 | 1)) => PieceType::Normal,
            Some(Value::Int(t @ 2..=6)) => PieceType::try_from(*t as u8).map_err(bad)?,
            Some(v) => {
                let v = v.describe();
                return Err(bad(format!("token type {i} is {v}, not 0 to 6")));
            }
        };
        if ty == PieceType::Unknown && spec.unk_id.is_none() {
            spec.unk_id = Some(i as u32);
        }
        spec.byte_fallback |= ty == PieceType::Byte;
        spec.pieces.push(piece.clone());
        spec.scores.push(score);
        spec.types.push(ty);
    }
    with_chat_template(m, spec)
}

/// The tokenizer of `spec` with the file's `tokenizer.chat_template`, checked on a sample
/// conversation under the render budget ([`Tokenizer::with_chat_template`]), so that a
/// hostile template fails when the file is loaded, named as GGUF metadata.
///
/// Errors: [`Error::Format`] for an invalid spec or a template that fails the check.
fn with_chat_template(
    m: &Meta,
    spec: TokenizerSpec,
) -> Result<std::result::Result<Tokenizer, String>> {
    let template = m.str("tokenizer.chat_template")?;
    Tokenizer::from_spec(spec)
        .and_then(|t| t.with_chat_template(template, "GGUF metadata `tokenizer.chat_template`"))
        .map(Ok)
        .map_err(|e| Error::format(m.path, e.to_string()))
}

/// An importance matrix in llama.cpp's GGUF form ([`crate::imatrix`]): the `in_sum2` and
/// `counts` f32 tensors of each entry, and the `imatrix.*` metadata (as llama.cpp's
/// `common_imatrix_load`).
///
/// Errors: [`Error::Format`] for a malformed file, an entry without its sums or counts,
/// tensors that are not f32, or counts that do not divide the sums.
pub(crate) fn read_imatrix(bytes: &[u8], path: &Path) -> Result<ImportanceMatrix> {
    let gguf = parse(bytes, path)?;
    let meta = Meta {
        kv: &gguf.meta,
        path,
    };
    let bad = |msg: String| Error::format(path, msg);
    let mut m = ImportanceMatrix {
        chunk_count: meta.id("imatrix.chunk_count")?.unwrap_or(0),
        chunk_size: meta.id("imatrix.chunk_size")?.unwrap_or(0),
        ..ImportanceMatrix::default()
    };
    for v in meta.array("imatrix.datasets")?.unwrap_or(&[]) {
        if let Value::Str(s) = v {
            m.datasets.push(String::from_utf8_lossy(s).into_owned());
        }
    }
    let mut parts: HashMap<&str, [Option<Vec<f32>>; 2]> = HashMap::new();
    for t in &gguf.tensors {
        let (base, which) = match (
            t.name.strip_suffix(".in_sum2"),
            t.name.strip_suffix(".counts"),
        ) {
            (Some(base), _) => (base, 0),
            (_, Some(base)) => (base, 1),
            _ => continue,
        };
        if t.ggml_type != 0 {
            return Err(bad(format!("{} is not an f32 tensor", t.name)));
        }
        let n: usize = t.ne.iter().product();
        let values = bytes
            .get(t.offset..)
            .and_then(|b| b.get(..n.checked_mul(4)?))
            .ok_or_else(|| bad(format!("{} runs past the end of the file", t.name)))?
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        parts.entry(base).or_default()[which] = Some(values);
    }
    for (name, [sums, counts]) in parts {
        let (Some(sums), Some(counts)) = (sums, counts) else {
            return Err(bad(format!(
                "{name} has its sums without its counts, or the reverse"
            )));
        };
        if counts.is_empty() || sums.is_empty() || sums.len() % counts.len() != 0 {
            return Err(bad(format!(
                "{name} has {} sums for {} counts",
                sums.len(),
                counts.len()
            )));
        }
        m.entries
            .insert(name.to_owned(), ImatrixEntry { sums, counts });
    }
    if m.entries.is_empty() {
        return Err(bad("an importance matrix with no entry".into()));
    }
    Ok(m)
}

/// Reads only the tokenizer of a GGUF file (it may have no tensors: llama.cpp's
/// vocabulary-only files).
///
/// Errors: [`Error::Io`] if the file cannot be read; [`Error::Format`] if it is not a valid
/// GGUF file, its tokenizer metadata is malformed, or it has no tokenizer flm implements
/// (`tokenizer.ggml.model` `"llama"`, SentencePiece BPE, and `"gpt2"`, byte-level BPE
/// with the pre-tokenisers of `flm_tokenizer::gguf_gpt2_spec`).
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    let map = map_file(path)?;
    let g = parse(&map, path)?;
    let m = Meta { kv: &g.meta, path };
    tokenizer(&m)?.map_err(|why| Error::format(path, why))
}

/// The layer of a tensor named `blk.{l}.{part}`, and its part.
fn layer_of(name: &str) -> Option<(usize, &str)> {
    let (l, part) = name.strip_prefix("blk.")?.split_once('.')?;
    Some((l.parse().ok()?, part))
}

/// Whether a layer part belongs to a mixture of experts: the router (`ffn_gate_inp`), the
/// stacked experts (`ffn_*_exps`), the shared expert (`*_shexp`), or one expert's own
/// matrix (`ffn_gate.{e}`, as llama.cpp wrote Mixtral before stacking), with `e`.
fn expert_part(part: &str) -> Option<Option<usize>> {
    let stem = part
        .strip_suffix(".weight")
        .or_else(|| part.strip_suffix(".bias"))
        .unwrap_or(part);
    if stem.starts_with("ffn_gate_inp") || stem.ends_with("_exps") || stem.contains("_shexp") {
        return Some(None);
    }
    let (matrix, e) = stem.rsplit_once('.')?;
    matches!(matrix, "ffn_gate" | "ffn_up" | "ffn_down")
        .then(|| e.parse().ok().map(Some))
        .flatten()
}

/// The tensors agree with `{arch}.block_count` and `{arch}.expert_count` (llama.cpp's
/// loader finds the same mismatches through its per-layer tensor lookups): every tensor of
/// a layer `blk.{l}.*` has `l < block_count` and every layer has tensors, expert tensors
/// are present exactly when `expert_count` is positive, and no expert's own matrix has an
/// index `>= expert_count`. Otherwise a file could load with layers or experts silently
/// dropped and produce garbage.
///
/// Errors: a message naming the tensor or the layer.
fn check_layers_and_experts(
    g: &Gguf,
    c: &ModelConfig,
    arch: &str,
) -> std::result::Result<(), String> {
    let n_experts = c.moe.as_ref().map_or(0, |m| m.n_experts);
    let blocks = c.n_layers + c.mtp_layers;
    let mut has_tensors = vec![false; blocks];
    let mut expert_tensors = 0usize;
    for t in &g.tensors {
        let Some((l, part)) = layer_of(&t.name) else {
            continue;
        };
        match has_tensors.get_mut(l) {
            Some(seen) => *seen = true,
            None => {
                return Err(format!(
                    "tensor {} is of layer {l}, but {arch}.block_count is {blocks}",
                    t.name
                ))
            }
        }
        match expert_part(part) {
            None => {}
            Some(_) if n_experts == 0 => {
                return Err(format!(
                    "tensor {} belongs to a mixture of experts, but {arch}.expert_count is \
                     absent or 0",
                    t.name
                ))
            }
            Some(Some(e)) if e >= n_experts => {
                return Err(format!(
                    "tensor {} is of expert {e}, but {arch}.expert_count is {n_experts}",
                    t.name
                ))
            }
            Some(_) => expert_tensors += 1,
        }
    }
    if let Some(l) = has_tensors.iter().position(|&seen| !seen) {
        return Err(format!(
            "{arch}.block_count is {blocks}, but the file has no tensor of layer {l} (blk.{l}.*)"
        ));
    }
    if n_experts > 0 && expert_tensors == 0 {
        return Err(format!(
            "{arch}.expert_count is {n_experts}, but the file has no expert tensors \
             (blk.*.ffn_gate_inp, blk.*.ffn_*_exps)"
        ));
    }
    Ok(())
}

/// Loads a GGUF checkpoint (of one of [`Family::gguf_architectures`]).
pub(super) fn load(path: &Path) -> Result<Checkpoint> {
    let map = map_file(path)?;
    let g = parse(&map, path)?;
    let m = Meta { kv: &g.meta, path };
    let (config, family) = config(&m, &g, &map)?;
    let arch = family.gguf_architecture().unwrap_or_default();
    check_layers_and_experts(&g, &config, arch).map_err(|why| Error::format(path, why))?;
    let by_name: HashMap<&str, &TensorInfo> =
        g.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut used: HashSet<&str> = ["rope_factors_long.weight", "rope_factors_short.weight"]
        .into_iter()
        .collect();
    let has = |name: &str| by_name.contains_key(name);
    let tensors = canonical_tensors(&config)
        .into_iter()
        .map(|(canonical, shape)| {
            if let Some(source) = mla::source(canonical, &config, &has) {
                let whole = source
                    .files()
                    .into_iter()
                    .map(|name| {
                        let t = by_name
                            .get(name)
                            .ok_or_else(|| Error::format(path, format!("missing tensor {name}")))?;
                        used.insert(t.name.as_str());
                        whole_tensor(t, &map, path)
                    })
                    .collect::<Result<Vec<_>>>()?;
                return source.build(canonical, shape, &config, whole);
            }
            let no_tensor = || format!("GGUF files have no tensor {canonical}");
            let (name, rows) = place(canonical, &shape, family, &config, &by_name)
                .ok_or_else(|| Error::format(path, no_tensor()))?;
            let t = by_name
                .get(name.as_str())
                .ok_or_else(|| Error::format(path, format!("missing tensor {name}")))?;
            used.insert(t.name.as_str());
            let enc = checked_encoding(t, path)?;
            let (shape, offset) = match rows {
                None => (t.ne.iter().rev().copied().collect(), t.offset),
                Some(rows) => {
                    let matrix = match shape[..] {
                        [len] => vec![1, len],
                        _ => shape.clone(),
                    };
                    let offset = row_offset(t, rows, &matrix, enc).ok_or_else(|| {
                        let ne = &t.ne;
                        let msg = format!(
                            "tensor {name} of ne {ne:?} does not hold {canonical} {shape:?} \
                             as rows {rows:?}"
                        );
                        Error::format(path, msg)
                    })?;
                    (shape, offset)
                }
            };
            SourceTensor::new(canonical.to_string(), shape, enc, &map, offset, path)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut ignored: Vec<String> = by_name
        .into_keys()
        .filter(|n| !used.contains(n))
        .map(str::to_string)
        .collect();
    ignored.sort();
    Ok(Checkpoint {
        format: Format::Gguf,
        config,
        tensors,
        tokenizer: tokenizer(&m)?.ok(),
        tokenizer_candidates: Vec::new(),
        ignored,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The experts of metadata `kv` (under `arch`) for a 2-layer model whose dense
    /// feed-forward is 128 wide and whose layer 0 alone has a router.
    fn experts(arch: &str, kv: &[(&str, Value)]) -> Result<Option<MoeConfig>> {
        let meta = kv
            .iter()
            .map(|(k, v)| (format!("{arch}.{k}"), v.clone()))
            .collect();
        let family = Family::from_gguf_architecture(arch).unwrap();
        let router = TensorInfo {
            name: "blk.0.ffn_gate_inp.weight".into(),
            ne: vec![64, 4],
            ggml_type: 0,
            offset: 0,
        };
        let g = Gguf {
            meta,
            tensors: vec![router],
        };
        let m = Meta {
            kv: &g.meta,
            path: Path::new("test.gguf"),
        };
        let c = ModelConfig {
            hidden_dim: 128,
            n_layers: 2,
            ..ModelConfig::default()
        };
        moe(&m, &g, family, &c)
    }

    /// llama.cpp's defaults per architecture, DeepSeek-V3's and GLM-4.5's routing keys, and
    /// the routings the graph does not have refused with their key's meaning.
    #[test]
    fn experts_follow_llama_cpp_and_other_routings_are_refused() {
        let base = [
            ("expert_count", Value::Int(4)),
            ("expert_used_count", Value::Int(2)),
        ];
        assert_eq!(experts("qwen3", &[]).unwrap(), None);
        let mixtral = experts("llama", &base).unwrap().unwrap();
        assert_eq!(
            (
                mixtral.expert_dim,
                mixtral.renormalize,
                mixtral.dense_layers
            ),
            (128, true, vec![1])
        );
        let qwen2 = experts("qwen2moe", &base).unwrap().unwrap();
        assert_eq!(
            (qwen2.expert_dim, qwen2.renormalize, qwen2.shared_expert_dim),
            (64, false, Some(128))
        );
        let mut normed = base.to_vec();
        normed.push(("expert_weights_norm", Value::Bool(true)));
        assert!(experts("qwen2moe", &normed).unwrap().unwrap().renormalize);
        let refused = |kv: (&str, Value), needle: &str| {
            let mut kvs = base.to_vec();
            kvs.push(kv);
            let err = experts("qwen3moe", &kvs).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        };
        // llama.cpp's softmax of the top-k (3) has no transformers counterpart here.
        refused(("expert_gating_func", Value::Int(3)), "gating function 3");
        // DeepSeek-V3's and GLM-4.5's: a sigmoid, groups by their two best, scaled.
        let mut v3 = base.to_vec();
        v3.extend([
            ("expert_gating_func", Value::Int(2)),
            ("expert_weights_scale", Value::Float(2.5)),
            ("expert_group_count", Value::Int(2)),
            ("expert_group_used_count", Value::Int(1)),
        ]);
        let v3 = experts("glm4moe", &v3).unwrap().unwrap();
        assert_eq!(
            (v3.scoring, v3.routed_scale, v3.groups),
            (
                RouterScoring::Sigmoid,
                2.5,
                Some(ExpertGroups {
                    n_groups: 2,
                    top_groups: 1,
                    score: GroupScore::SumOfTop2
                })
            )
        );
        let err = experts("qwen3moe", &base[..1]).unwrap_err().to_string();
        assert!(err.contains("expert_used_count"), "{err}");
    }
}
