//! THUDM's ChatGLM checkpoints in Hugging Face directories (`config.json` with
//! `model_type: "chatglm"`, the tensor names of THUDM's `modeling_chatglm.py`).
//!
//! The generation is told from the configuration: ChatGLM-6B has `position_encoding_2d`
//! (and `inner_hidden_size`); ChatGLM2/3 and GLM-4 have `ffn_hidden_size`,
//! `multi_query_attention` and `rmsnorm` (GLM-4 differs in `layernorm_epsilon`,
//! `rope_ratio` and its tokenizer only). Fused tensors are split into flm's canonical ones
//! (see [`crate::chatglm`]):
//! - ChatGLM-6B `query_key_value` `[3·dim, dim]` interleaves per head: rows
//!   `h·3·hd + [0, hd)` are head `h`'s queries, `+ [hd, 2·hd)` its keys, `+ [2·hd, 3·hd)`
//!   its values;
//! - ChatGLM2+ `query_key_value` is q `[n_heads·hd]`, then k and v `[groups·hd]` each;
//!   `dense_h_to_4h` is the gate rows, then the up rows.
//!
//! The tokenizer beside the weights (`tokenizer.model`, ChatGLM-6B's `ice_text.model`) is
//! loaded as a plain SentencePiece model. The special tokens ChatGLM appends after that
//! vocabulary (`[gMASK]`, `sop`, the ChatGLM3 role tokens) and each generation's prompt
//! construction belong to flm-tokenizer's ChatGLM support, which builds on this checkpoint:
//! ChatGLM-6B's graph takes its positions from the `[gMASK]` and `sop` ids of the
//! configuration (`gmask_token_id`, `bos_token_id`).

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use flm_core::RopeStyle;
use serde::Deserialize;

use super::SourceTensor;
use crate::tensor_names::{LayerPart::*, TensorName};
use crate::{Arch, Error, ModelConfig, Result};

/// THUDM's residual scale: `GLMBlock` is built without `num_layers`, so its default of 28
/// gives `alpha = sqrt(2 · 28)` whatever the configuration says.
pub const GLM_RESIDUAL_ALPHA: f32 = 7.483_315;

/// The fields of THUDM's `ChatGLMConfig` (both generations) that the graphs use.
#[derive(Deserialize)]
struct GlmConfig {
    hidden_size: usize,
    num_layers: usize,
    num_attention_heads: usize,
    layernorm_epsilon: Option<f32>,
    // ChatGLM-6B.
    vocab_size: Option<usize>,
    inner_hidden_size: Option<usize>,
    max_sequence_length: Option<usize>,
    position_encoding_2d: Option<bool>,
    mask_token_id: Option<u32>,
    gmask_token_id: Option<u32>,
    // ChatGLM2/3, GLM-4.
    padded_vocab_size: Option<usize>,
    ffn_hidden_size: Option<usize>,
    kv_channels: Option<usize>,
    multi_query_attention: Option<bool>,
    multi_query_group_num: Option<usize>,
    seq_length: Option<usize>,
    rmsnorm: Option<bool>,
    add_qkv_bias: Option<bool>,
    add_bias_linear: Option<bool>,
    rope_ratio: Option<f32>,
    // Both.
    bos_token_id: Option<u32>,
    eos_token_id: Option<super::hf::Ids>,
    pre_seq_len: Option<usize>,
    prefix_projection: Option<bool>,
    tie_word_embeddings: Option<bool>,
}

/// The configuration of the ChatGLM checkpoint whose `config.json` (at `path`) holds `text`.
///
/// Errors: [`Error::Format`] for an invalid or unsupported configuration.
pub(super) fn parse_config(path: &Path, text: &str) -> Result<ModelConfig> {
    let g: GlmConfig = serde_json::from_str(text)
        .map_err(|e| Error::format(path, format!("invalid ChatGLM config.json: {e}")))?;
    let unsupported = |what: &str| Error::format(path, format!("unsupported ChatGLM: {what}"));
    if g.prefix_projection == Some(true) {
        return Err(unsupported(
            "p-tuning v2 with prefix_projection (an MLP prefix encoder)",
        ));
    }
    if g.num_attention_heads == 0 {
        return Err(Error::Config("num_attention_heads must be positive".into()));
    }
    let eos_token_ids = g
        .eos_token_id
        .map(super::hf::Ids::into_vec)
        .unwrap_or_default();
    let head_dim = g
        .kv_channels
        .unwrap_or(g.hidden_size / g.num_attention_heads);
    let config = if g.position_encoding_2d == Some(true) {
        ModelConfig {
            dim: g.hidden_size,
            hidden_dim: g
                .inner_hidden_size
                .unwrap_or(g.hidden_size.saturating_mul(4)),
            n_layers: g.num_layers,
            n_heads: g.num_attention_heads,
            n_kv_heads: g.num_attention_heads,
            head_dim,
            vocab_size: g.vocab_size.unwrap_or(0),
            max_seq_len: g.max_sequence_length.unwrap_or(2048),
            norm_eps: g.layernorm_epsilon.unwrap_or(1e-5),
            rope_style: RopeStyle::RotateHalf,
            tie_embeddings: g.tie_word_embeddings.unwrap_or(false),
            bos_token_id: g.bos_token_id,
            eos_token_ids,
            arch: Arch::ChatGlm {
                residual_alpha: GLM_RESIDUAL_ALPHA,
                mask_token_id: g.mask_token_id.unwrap_or(130000),
                gmask_token_id: g.gmask_token_id.unwrap_or(130001),
            },
            qkv_bias: true,
            o_bias: true,
            pre_seq_len: g.pre_seq_len.unwrap_or(0),
            ..ModelConfig::default()
        }
    } else {
        if g.rmsnorm == Some(false) || g.add_bias_linear == Some(true) {
            return Err(unsupported(
                "LayerNorm or linear biases in a ChatGLM2-style model",
            ));
        }
        let n_kv_heads = if g.multi_query_attention == Some(true) {
            g.multi_query_group_num.unwrap_or(1)
        } else {
            g.num_attention_heads
        };
        ModelConfig {
            dim: g.hidden_size,
            hidden_dim: g.ffn_hidden_size.unwrap_or(0),
            n_layers: g.num_layers,
            n_heads: g.num_attention_heads,
            n_kv_heads,
            head_dim,
            vocab_size: g.padded_vocab_size.or(g.vocab_size).unwrap_or(0),
            max_seq_len: g.seq_length.unwrap_or(2048),
            norm_eps: g.layernorm_epsilon.unwrap_or(1e-5),
            rope_theta: 10000.0 * g.rope_ratio.unwrap_or(1.0),
            tie_embeddings: g.tie_word_embeddings.unwrap_or(false),
            eos_token_ids,
            rotary_dim: Some(head_dim / 2),
            qkv_bias: g.add_qkv_bias.unwrap_or(true),
            pre_seq_len: g.pre_seq_len.unwrap_or(0),
            ..ModelConfig::default()
        }
    };
    config
        .validate()
        .map_err(|e| Error::format(path, e.to_string()))?;
    Ok(config)
}

/// The canonical tensors of the ChatGLM checkpoint in `dir` of configuration `c`, from
/// its tensors `by_name` (THUDM names).
///
/// Errors: [`Error::Format`] for a missing tensor or one of an unexpected shape.
// `vec![a..b]` is a list of row ranges holding one range, not the rows `a..b` collected.
#[allow(clippy::single_range_in_vec_init)]
pub(super) fn tensors(
    dir: &Path,
    c: &ModelConfig,
    by_name: &mut HashMap<String, SourceTensor>,
) -> Result<Vec<SourceTensor>> {
    let glm1 = matches!(c.arch, Arch::ChatGlm { .. });
    let mut take = |name: &str| {
        by_name
            .remove(name)
            .ok_or_else(|| Error::format(dir, format!("missing tensor {name}")))
    };
    let mut out = Vec::new();
    let mut add = |t: SourceTensor, canonical: TensorName| {
        let mut t = t;
        t.name = canonical.to_string();
        out.push(t);
    };
    if c.pre_seq_len > 0 {
        add(
            take("transformer.prefix_encoder.embedding.weight")?,
            TensorName::PrefixKv,
        );
    }
    let (root, attn) = if glm1 {
        add(
            take("transformer.word_embeddings.weight")?,
            TensorName::Embedding,
        );
        ("transformer.layers", "attention")
    } else {
        let e = take("transformer.embedding.word_embeddings.weight")?;
        add(e, TensorName::Embedding);
        ("transformer.encoder.layers", "self_attention")
    };
    let (hd, q_dim, kv_dim) = (c.head_dim, c.q_dim(), c.kv_dim());
    // Rows of q, k and v in the fused query_key_value.
    let qkv_rows: [Vec<Range<usize>>; 3] = if glm1 {
        std::array::from_fn(|part| {
            (0..c.n_heads)
                .map(|h| h * 3 * hd + part * hd..h * 3 * hd + (part + 1) * hd)
                .collect()
        })
    } else {
        [
            vec![0..q_dim],
            vec![q_dim..q_dim + kv_dim],
            vec![q_dim + kv_dim..q_dim + 2 * kv_dim],
        ]
    };
    for l in 0..c.n_layers {
        let p = format!("{root}.{l}");
        let canon = |part| TensorName::Layer(l, part);
        add(
            take(&format!("{p}.input_layernorm.weight"))?,
            canon(AttnNorm),
        );
        if glm1 {
            let b = take(&format!("{p}.input_layernorm.bias"))?;
            add(b, canon(AttnNormBias));
        }
        let w = take(&format!("{p}.{attn}.query_key_value.weight"))?;
        let b = take(&format!("{p}.{attn}.query_key_value.bias"))?;
        for ((wn, bn), rows) in [(Wq, Bq), (Wk, Bk), (Wv, Bv)].into_iter().zip(&qkv_rows) {
            add(w.rows(canon(wn).to_string(), rows.clone())?, canon(wn));
            add(b.rows(canon(bn).to_string(), rows.clone())?, canon(bn));
        }
        add(take(&format!("{p}.{attn}.dense.weight"))?, canon(Wo));
        if glm1 {
            add(take(&format!("{p}.{attn}.dense.bias"))?, canon(Bo));
        }
        add(
            take(&format!("{p}.post_attention_layernorm.weight"))?,
            canon(FfnNorm),
        );
        let up = take(&format!("{p}.mlp.dense_h_to_4h.weight"))?;
        let down = take(&format!("{p}.mlp.dense_4h_to_h.weight"))?;
        if glm1 {
            let nb = take(&format!("{p}.post_attention_layernorm.bias"))?;
            add(nb, canon(FfnNormBias));
            add(up, canon(WUp));
            add(take(&format!("{p}.mlp.dense_h_to_4h.bias"))?, canon(BUp));
            add(down, canon(WDown));
            add(take(&format!("{p}.mlp.dense_4h_to_h.bias"))?, canon(BDown));
        } else {
            let h = c.hidden_dim;
            add(up.rows(canon(WGate).to_string(), vec![0..h])?, canon(WGate));
            add(up.rows(canon(WUp).to_string(), vec![h..2 * h])?, canon(WUp));
            add(down, canon(WDown));
        }
    }
    if glm1 {
        add(
            take("transformer.final_layernorm.weight")?,
            TensorName::FinalNorm,
        );
        add(
            take("transformer.final_layernorm.bias")?,
            TensorName::FinalNormBias,
        );
        if !c.tie_embeddings {
            add(take("lm_head.weight")?, TensorName::Classifier);
        }
    } else {
        add(
            take("transformer.encoder.final_layernorm.weight")?,
            TensorName::FinalNorm,
        );
        if !c.tie_embeddings {
            add(
                take("transformer.output_layer.weight")?,
                TensorName::Classifier,
            );
        }
    }
    Ok(out)
}
