//! DeepSeek-V2 and DeepSeek-V3 checkpoints (transformers' `DeepseekV2ForCausalLM` and
//! `DeepseekV3ForCausalLM`, DeepSeek-AI's `modeling_deepseek.py`): multi-head latent
//! attention ([`MlaConfig`]) and DeepSeek's mixture of experts, through the Llama graph; and
//! GLM-4.5, 4.6 and 4.5-Air (`Glm4MoeForCausalLM`), whose experts are DeepSeek-V3's behind
//! grouped-query attention with q/k/v biases, optional q/k norms (`use_qk_norm`) and RoPE
//! on half of each head.
//!
//! What the config says beyond a Llama's:
//! - MLA: `q_lora_rank` (null: a plain `q_proj`), `kv_lora_rank`, `qk_nope_head_dim`,
//!   `qk_rope_head_dim`, `v_head_dim`. The scores are scaled by `qk_head_dim^-0.5`, times
//!   YaRN's `mscale_all_dim` factor squared with YaRN (transformers' `yarn_apply_mscale`).
//!   RoPE rotates adjacent pairs: V2 as complex numbers, V3 with `rope_interleave` (its
//!   default; `false` rotates halves).
//! - Experts: `n_routed_experts` of `moe_intermediate_size`, `num_experts_per_tok` per token,
//!   in layers `first_k_dense_replace..` (every `moe_layer_freq`-th), with
//!   `n_shared_experts` shared experts run as one of `n_shared_experts ·
//!   moe_intermediate_size`, ungated.
//! - V2's router: a softmax, the top-k of all experts (`topk_method` `greedy`) or of the
//!   `topk_group` groups of `n_group` whose best expert scores highest
//!   (`group_limited_greedy`); weights times `routed_scaling_factor`, or renormalised instead
//!   when `norm_topk_prob` (DeepSeek's own code; transformers 5 never renormalises V2).
//! - V3's router: a sigmoid per expert, the `e_score_correction_bias` added to choose the
//!   groups (by the sum of their two best) and the experts, the unbiased scores weighing
//!   them, renormalised when `norm_topk_prob`, times `routed_scaling_factor`.
//!
//! - Multi-token prediction (V3, GLM-4.5): `num_nextn_predict_layers` layers after the
//!   others, under `model.layers.{num_hidden_layers + j}.` ([`crate::MtpLayer`]).
//!
//! The checkpoints fuse what flm's graph reads apart: the rows of each head's query are
//! split into the parts without and with RoPE, and `kv_a_proj_with_mqa` into the latent's
//! and the rotated key's rows ([`split`]).

use std::collections::HashMap;

use flm_core::{ExpertGroups, GroupScore, RopeStyle, RouterScoring};
use serde::{Deserialize, Deserializer};

use super::SourceTensor;
use crate::tensor_names::{LayerPart, TensorName};
use crate::{Family, MlaConfig, ModelConfig, MoeConfig, Result};

/// A field present in the config, possibly `null` (`Some(None)`), or absent (`None`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> std::result::Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// The fields of transformers' `DeepseekV2Config` / `DeepseekV3Config` that a Llama's lack.
#[derive(Deserialize)]
struct Fields {
    #[serde(default, deserialize_with = "present")]
    q_lora_rank: Option<Option<usize>>,
    kv_lora_rank: Option<usize>,
    qk_nope_head_dim: Option<usize>,
    qk_rope_head_dim: Option<usize>,
    v_head_dim: Option<usize>,
    use_qk_norm: Option<bool>,
    n_routed_experts: Option<usize>,
    n_shared_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    routed_scaling_factor: Option<f32>,
    topk_method: Option<String>,
    scoring_func: Option<String>,
    n_group: Option<usize>,
    topk_group: Option<usize>,
    first_k_dense_replace: Option<usize>,
    moe_layer_freq: Option<usize>,
    norm_topk_prob: Option<bool>,
    rope_interleave: Option<bool>,
    num_nextn_predict_layers: Option<usize>,
}

/// `c` (read as a Llama's from the `config.json` text `text`) with what DeepSeek-V2, V3
/// or GLM-4.5 (`family`) configure: the experts and their router, and for DeepSeek MLA,
/// RoPE's pairing and the score scale, for GLM-4.5 the q/k norms.
///
/// Errors: a message for a missing MLA size, an unknown `topk_method` or `scoring_func`,
/// or a `moe_layer_freq` of 0.
pub(super) fn configure(
    mut c: ModelConfig,
    family: Family,
    text: &str,
) -> std::result::Result<ModelConfig, String> {
    let f: Fields = serde_json::from_str(text).map_err(|e| format!("{family}: {e}"))?;
    if family == Family::Glm4Moe {
        c.qk_norm = f.use_qk_norm.unwrap_or(false);
    } else {
        c = latent(c, family, &f)?;
    }
    c.moe = moe(family, &f, c.n_layers)?;
    // DeepSeek-V3 and GLM-4.5 ship them; the importer drops them when their weights are
    // not in the checkpoint (transformers saves none).
    if family != Family::DeepseekV2 {
        c.mtp_layers = f.num_nextn_predict_layers.unwrap_or(0);
    }
    Ok(c)
}

/// `c` with DeepSeek's multi-head latent attention as `f` describes it.
fn latent(
    mut c: ModelConfig,
    family: Family,
    f: &Fields,
) -> std::result::Result<ModelConfig, String> {
    let need = |v: Option<usize>, name: &str| v.ok_or_else(|| format!("{family} without {name}"));
    let mla = MlaConfig {
        // transformers' default when the config does not say.
        q_lora_rank: f.q_lora_rank.unwrap_or(Some(1536)),
        kv_lora_rank: need(f.kv_lora_rank, "kv_lora_rank")?,
        qk_nope_head_dim: need(f.qk_nope_head_dim, "qk_nope_head_dim")?,
        qk_rope_head_dim: need(f.qk_rope_head_dim, "qk_rope_head_dim")?,
    };
    c.attention_scale = Some(mla.attention_scale(c.rope_scaling.as_ref()));
    c.n_kv_heads = 1;
    c.head_dim = need(f.v_head_dim, "v_head_dim")?;
    c.rotary_dim = Some(mla.qk_rope_head_dim);
    let v3 = family == Family::DeepseekV3;
    c.rope_style = if v3 && !f.rope_interleave.unwrap_or(true) {
        RopeStyle::RotateHalf
    } else {
        RopeStyle::AdjacentPairs
    };
    c.mla = Some(mla);
    Ok(c)
}

/// The experts of DeepSeek-V2, V3 or GLM-4.5 (`family`) as `f` describes them, for
/// `n_layers` layers; `None` without routed experts.
fn moe(
    family: Family,
    f: &Fields,
    n_layers: usize,
) -> std::result::Result<Option<MoeConfig>, String> {
    let Some(n_experts) = f.n_routed_experts else {
        return Ok(None);
    };
    let v2 = family == Family::DeepseekV2;
    let need = |v: Option<usize>, name: &str| v.ok_or_else(|| format!("{family} without {name}"));
    let (top_k, expert_dim) = (
        need(f.num_experts_per_tok, "num_experts_per_tok")?,
        need(f.moe_intermediate_size, "moe_intermediate_size")?,
    );
    let freq = f.moe_layer_freq.unwrap_or(1);
    if freq == 0 {
        return Err("moe_layer_freq must be positive".into());
    }
    let first = f.first_k_dense_replace.unwrap_or(0);
    let groups = |score| {
        let n_groups = f.n_group.unwrap_or(1);
        (n_groups > 1).then_some(ExpertGroups {
            n_groups,
            top_groups: f.topk_group.unwrap_or(n_groups),
            score,
        })
    };
    let scale = f.routed_scaling_factor.unwrap_or(1.0);
    // GLM-4.5's `norm_topk_prob` defaults to true, DeepSeek's to false.
    let norm = f.norm_topk_prob.unwrap_or(family == Family::Glm4Moe);
    let method = f.topk_method.as_deref();
    let scoring = f
        .scoring_func
        .as_deref()
        .unwrap_or(if v2 { "softmax" } else { "sigmoid" });
    let base = MoeConfig::softmax_top_k(n_experts, top_k, expert_dim, false);
    let routing = match (v2, scoring, method) {
        (true, "softmax", None | Some("greedy")) => base,
        (true, "softmax", Some("group_limited_greedy")) => MoeConfig {
            groups: groups(GroupScore::Max),
            ..base
        },
        (false, "sigmoid", None | Some("noaux_tc")) => MoeConfig {
            scoring: RouterScoring::Sigmoid,
            groups: groups(GroupScore::SumOfTop2),
            choice_bias: true,
            ..base
        },
        (_, s, m) => {
            return Err(format!(
                "{family} routing: scoring_func {s:?}, topk_method {m:?}"
            ))
        }
    };
    // DeepSeek-V2's own code renormalises instead of scaling; V3 and GLM-4.5 do both.
    let (renormalize, routed_scale) = match (v2, norm && top_k > 1) {
        (true, true) => (true, 1.0),
        (true, false) => (false, scale),
        (false, _) => (norm, scale),
    };
    let shared = f.n_shared_experts.filter(|&n| n > 0);
    Ok(Some(MoeConfig {
        renormalize,
        routed_scale,
        dense_layers: (0..n_layers)
            .filter(|&l| l < first || l % freq != 0)
            .collect(),
        shared_expert_dim: shared.map(|n| n * expert_dim),
        shared_expert_gated: false,
        ..routing
    }))
}

/// The canonical tensors that DeepSeek checkpoints fuse, taken out of `by_name` (their
/// Hugging Face names) as rows of the fused tensors: per layer (the prediction layers
/// included), the query's parts without
/// and with RoPE (of `q_proj`, or `q_b_proj` with a compressed query) and the latent's and
/// the rotated key's projections (of `kv_a_proj_with_mqa`).
///
/// Errors: a fused tensor too short for the configuration's rows.
pub(super) fn split(
    c: &ModelConfig,
    by_name: &mut HashMap<String, SourceTensor>,
) -> Result<HashMap<TensorName, SourceTensor>> {
    let mut out = HashMap::new();
    let Some(m) = &c.mla else {
        return Ok(out);
    };
    let ([nope, rope], [latent, rotated]) = (m.query_rows(c.n_heads), m.kv_a_rows());
    for l in 0..c.n_layers + c.mtp_layers {
        let p = format!("model.layers.{l}.self_attn");
        let q = if m.q_lora_rank.is_some() {
            "q_b_proj"
        } else {
            "q_proj"
        };
        let mut take = |name: String| by_name.remove(&name);
        let parts = [
            (
                format!("{p}.{q}.weight"),
                [
                    (LayerPart::QNope, nope.clone()),
                    (LayerPart::QRope, rope.clone()),
                ],
            ),
            (
                format!("{p}.kv_a_proj_with_mqa.weight"),
                [
                    (LayerPart::KvA, vec![latent.clone()]),
                    (LayerPart::KRope, vec![rotated.clone()]),
                ],
            ),
        ];
        for (fused, rows) in parts {
            let Some(t) = take(fused) else {
                continue;
            };
            for (part, ranges) in rows {
                let name = TensorName::Layer(l, part);
                out.insert(name, t.rows(name.to_string(), ranges)?);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DeepSeek-V2-Lite's `config.json` fields (deepseek-ai/DeepSeek-V2-Lite).
    const V2_LITE: &str = r#"{"hidden_size": 2048, "num_hidden_layers": 27,
        "num_attention_heads": 16, "kv_lora_rank": 512, "q_lora_rank": null,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
        "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
        "moe_intermediate_size": 1408, "routed_scaling_factor": 1.0, "topk_method": "greedy",
        "n_group": 1, "topk_group": 1, "moe_layer_freq": 1, "first_k_dense_replace": 1,
        "norm_topk_prob": false, "scoring_func": "softmax"}"#;

    #[test]
    fn v2_lite_caches_576_values_a_position_where_expanded_heads_take_5120() {
        let base = ModelConfig {
            n_layers: 27,
            n_heads: 16,
            n_kv_heads: 16,
            ..ModelConfig::default()
        };
        let c = configure(base, Family::DeepseekV2, V2_LITE).unwrap();
        let m = c.mla.as_ref().unwrap();
        assert_eq!((m.q_lora_rank, c.kv_values_per_position()), (None, 576));
        // The expanded form caches every head's key (nope + rope) and value.
        let expanded = c.n_heads * (m.qk_head_dim() + c.head_dim);
        assert_eq!(expanded, 5120);
        let moe = c.moe.unwrap();
        assert_eq!(
            (moe.n_experts, moe.top_k, moe.dense_layers),
            (64, 6, vec![0])
        );
        assert_eq!((moe.shared_expert_dim, moe.groups), (Some(2816), None));
        assert!(!moe.renormalize && moe.routed_scale == 1.0 && !moe.shared_expert_gated);
    }

    #[test]
    fn a_missing_q_lora_rank_takes_transformers_default_and_null_means_none() {
        let base = || ModelConfig {
            n_layers: 2,
            ..ModelConfig::default()
        };
        let text = |q: &str| {
            format!(
                r#"{{{q} "kv_lora_rank": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
                "qk_nope_head_dim": 8}}"#
            )
        };
        let q_lora = |q: &str| {
            let c = configure(base(), Family::DeepseekV3, &text(q)).unwrap();
            c.mla.unwrap().q_lora_rank
        };
        assert_eq!(q_lora(""), Some(1536));
        assert_eq!(q_lora(r#""q_lora_rank": null,"#), None);
        assert_eq!(q_lora(r#""q_lora_rank": 24,"#), Some(24));
    }
}
