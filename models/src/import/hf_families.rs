//! The configuration fields by which Llama 3, Mistral and Qwen2 differ from Llama 2 in a
//! Hugging Face `config.json`, read into [`crate::ModelConfig`] fields of the Llama graph:
//!
//! | `model_type` | what differs | read from |
//! |---|---|---|
//! | `llama` (Llama 3 / 3.1) | RoPE θ 500000, llama3 frequency scaling | `rope_theta`, `rope_scaling` |
//! | `mistral` | sliding-window attention | `sliding_window` (`null`: none) |
//! | `qwen2` | q/k/v biases, no output bias; windows only with `use_sliding_window` | always biased |
//! | `qwen3` | RMSNorm over each query and key head | always |
//! | `phi3` (Phi-3, Phi-4-mini) | fused qkv and gate/up weights, LongRoPE, partial rotary | `rope_scaling`, `partial_rotary_factor` |
//! | `gemma`, `gemma2`, `gemma3_text` | GeGLU, `1 + w` norm gains, √hidden embedding scale; Gemma 2 and 3: post-norms, sliding and global layers, `query_pre_attn_scalar`; Gemma 2: soft-capping; Gemma 3: q/k norms, a local RoPE | `hidden_activation`, `layer_types`, `*_softcapping`, `rope_local_base_freq` |
//! | `mixtral` | routed experts, renormalised top-k; sliding window as Mistral | `num_local_experts`, `num_experts_per_tok`, `intermediate_size` |
//! | `qwen3_moe` | routed experts, dense layers, q/k norms as Qwen3 | `num_experts` (or `num_local_experts`), `num_experts_per_tok`, `moe_intermediate_size`, `norm_topk_prob`, `decoder_sparse_step`, `mlp_only_layers` |
//! | `qwen2_moe` | as `qwen3_moe` without q/k norms, plus q/k/v biases and a sigmoid-gated shared expert | the same, `shared_expert_intermediate_size`, `qkv_bias` |
//! | `glm4` (GLM-4-0414) | post-attention and post-MLP norms, fused gate/up, q/k/v biases, RoPE in adjacent pairs on half of each head | `attention_bias`, `partial_rotary_factor` (default 0.5) |
//! | `gpt_oss` | attention sinks, q/k/v/o biases, sliding and full layers, YaRN; routed experts with biases and a clamped SwiGLU behind a biased router | `layer_types`, `sliding_window`, `num_local_experts`, `num_experts_per_tok`, `swiglu_alpha`, `swiglu_limit` |
//!
//! transformers 5 writes the RoPE settings as one `rope_parameters` object
//! (`{"rope_type": "llama3", "rope_theta": 500000.0, "factor": ..}`), transformers 4 as
//! `rope_theta` and `rope_scaling` (`{"rope_type" or "type": "llama3", "factor": ..}`);
//! both are read. The RoPE scalings read are llama3, linear, longrope and yarn (DeepSeek,
//! Qwen2/Qwen3 long-context configs; the Llama graph does not fold its
//! [`flm_core::YarnScaling::softmax_scale_factor`] into the softmax scale, nor does
//! transformers for these families); others (dynamic NTK) and Qwen2's per-layer windows
//! are refused with an error naming them.

use flm_core::{ExpertActivation, Llama3Scaling, RopeScaling, YarnScaling};

use crate::{Family, MoeConfig};
use serde::Deserialize;
use serde_json::Value;

/// The RoPE fields of a `config.json`.
#[derive(Deserialize, Default)]
pub(super) struct RopeFields {
    rope_theta: Option<f32>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    /// LongRoPE's pre-training context (Phi-3 keeps it beside `rope_scaling`).
    original_max_position_embeddings: Option<usize>,
    /// The rotated fraction of each head (Phi-4-mini: 0.75).
    partial_rotary_factor: Option<f32>,
}

/// The parameters of transformers' longrope RoPE type.
#[derive(Deserialize)]
struct LongRope {
    short_factor: Vec<f32>,
    long_factor: Vec<f32>,
    factor: Option<f32>,
    attention_factor: Option<f32>,
    original_max_position_embeddings: Option<usize>,
}

/// The rotated fraction of each head: `partial_rotary_factor` where the config (or, in
/// transformers 5, its `rope_parameters`) gives one, else `None` (the family's default,
/// [`crate::Family::partial_rotary_factor`]).
pub(super) fn partial_rotary_factor(fields: &RopeFields) -> Option<f32> {
    fields
        .rope_parameters
        .as_ref()
        .and_then(|p| p.get("partial_rotary_factor"))
        .and_then(Value::as_f64)
        .map(|f| f as f32)
        .or(fields.partial_rotary_factor)
}

/// The sliding-window fields of a `config.json`.
#[derive(Deserialize, Default)]
pub(super) struct WindowFields {
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
}

/// The mixture-of-experts fields of a `config.json` (Mixtral, Qwen3-MoE).
#[derive(Deserialize, Default)]
pub(super) struct MoeFields {
    num_local_experts: Option<usize>,
    num_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    shared_expert_intermediate_size: Option<usize>,
    /// gpt-oss: the clamped SwiGLU's sigmoid slope and clamp.
    swiglu_alpha: Option<f32>,
    swiglu_limit: Option<f32>,
}

/// The experts of a `family` of `n_layers` layers whose dense feed-forward is
/// `intermediate_size` wide, as transformers' `MixtralSparseMoeBlock` (every layer, experts
/// of `intermediate_size`, top-k always renormalised), `Qwen3MoeSparseMoeBlock` (layer
/// `l` sparse when not in `mlp_only_layers` and `(l + 1) % decoder_sparse_step == 0`,
/// experts of `moe_intermediate_size`, renormalised iff `norm_topk_prob`) and
/// `Qwen2MoeSparseMoeBlock` (as Qwen3-MoE, plus a shared expert of
/// `shared_expert_intermediate_size`) read them; `None` for the other families.
///
/// Errors: a missing field (with transformers' defaults where it has them: Qwen3-MoE's
/// `decoder_sparse_step` 1, `norm_topk_prob` false, `mlp_only_layers` empty; Qwen2-MoE's
/// the same), or a
/// `decoder_sparse_step` of 0.
pub(super) fn moe(
    family: Family,
    f: &MoeFields,
    n_layers: usize,
    intermediate_size: usize,
) -> Result<Option<MoeConfig>, String> {
    let top_k = || {
        f.num_experts_per_tok
            .ok_or_else(|| format!("{family} without num_experts_per_tok"))
    };
    // transformers 5 writes Qwen3-MoE's `num_experts` as `num_local_experts` too.
    let n_experts = || {
        f.num_local_experts
            .or(f.num_experts)
            .ok_or_else(|| format!("{family} without num_local_experts"))
    };
    Ok(Some(match family {
        Family::Mixtral => {
            MoeConfig::softmax_top_k(n_experts()?, top_k()?, intermediate_size, true)
        }
        // `GptOssTopKRouter`: a softmax over the top k biased logits, which is a softmax
        // over all of them renormalised over the top k.
        Family::GptOss => MoeConfig {
            logit_bias: true,
            expert_biases: true,
            activation: ExpertActivation::ClampedSwiGlu {
                alpha: f.swiglu_alpha.unwrap_or(1.702),
                limit: f.swiglu_limit.unwrap_or(7.0),
            },
            ..MoeConfig::softmax_top_k(n_experts()?, top_k()?, intermediate_size, true)
        },
        Family::Qwen3Moe | Family::Qwen2Moe => {
            let step = f.decoder_sparse_step.unwrap_or(1);
            if step == 0 {
                return Err("decoder_sparse_step must be positive".into());
            }
            let only = f.mlp_only_layers.as_deref().unwrap_or_default();
            let expert_dim = f
                .moe_intermediate_size
                .ok_or_else(|| format!("{family} without moe_intermediate_size"))?;
            let renormalize = f.norm_topk_prob.unwrap_or(false);
            MoeConfig {
                dense_layers: (0..n_layers)
                    .filter(|l| only.contains(l) || (l + 1) % step != 0)
                    .collect(),
                shared_expert_dim: match family {
                    Family::Qwen2Moe => Some(
                        f.shared_expert_intermediate_size
                            .ok_or("qwen2_moe without shared_expert_intermediate_size")?,
                    ),
                    _ => None,
                },
                ..MoeConfig::softmax_top_k(n_experts()?, top_k()?, expert_dim, renormalize)
            }
        }
        _ => return Ok(None),
    }))
}

/// LongRoPE's default attention factor for a context extended `factor` times over the
/// pre-training context `original`: `sqrt(1 + ln(factor) / ln(original))`, 1 without an
/// extension (transformers' `_compute_longrope_parameters`, llama.cpp's converter).
pub(super) fn longrope_attention_factor(factor: f32, original: usize) -> f32 {
    if factor <= 1.0 {
        1.0
    } else {
        (1.0 + (factor as f64).ln() / (original as f64).ln()).sqrt() as f32
    }
}

/// The parameters of transformers' llama3 RoPE type.
#[derive(Deserialize)]
struct Llama3 {
    factor: f32,
    low_freq_factor: f32,
    high_freq_factor: f32,
    original_max_position_embeddings: usize,
}

/// The parameters of transformers' yarn RoPE type, each optional there.
#[derive(Deserialize)]
struct Yarn {
    factor: Option<f32>,
    original_max_position_embeddings: Option<usize>,
    beta_fast: Option<f32>,
    beta_slow: Option<f32>,
    mscale: Option<f32>,
    mscale_all_dim: Option<f32>,
    attention_factor: Option<f32>,
    truncate: Option<bool>,
}

/// YaRN's parameters with transformers' defaults (`standardize_rope_params`,
/// `_compute_yarn_parameters`): the pre-training context from the config's top-level
/// `original_max_position_embeddings`, else the block's, else `max_position_embeddings`;
/// `factor` from `max_position_embeddings / original` when missing; `beta_fast` 32 and
/// `beta_slow` 1 when missing or 0; `truncate` true; the attention factor from `factor`
/// and the mscales ([`YarnScaling::default_attention_factor`]) when missing.
///
/// Errors: a message for a malformed block or no (or a zero) pre-training context.
fn yarn(
    fields: &RopeFields,
    scaling: &Value,
    max_position_embeddings: Option<usize>,
) -> Result<YarnScaling, String> {
    let p = Yarn::deserialize(scaling).map_err(|e| format!("invalid yarn rope scaling: {e}"))?;
    let original = fields
        .original_max_position_embeddings
        .or(p.original_max_position_embeddings)
        .or(max_position_embeddings)
        .filter(|&o| o > 0)
        .ok_or("yarn rope scaling without original_max_position_embeddings")?;
    let factor = p.factor.unwrap_or_else(|| {
        (max_position_embeddings.unwrap_or(original) as f64 / original as f64) as f32
    });
    // transformers reads the betas with `or`, so that 0 stands for the default too.
    let or_default = |v: Option<f32>, default| v.filter(|&v| v != 0.0).unwrap_or(default);
    Ok(YarnScaling {
        factor,
        original_max_position_embeddings: original,
        beta_fast: or_default(p.beta_fast, 32.0),
        beta_slow: or_default(p.beta_slow, 1.0),
        attention_factor: p.attention_factor.unwrap_or_else(|| {
            YarnScaling::default_attention_factor(factor, p.mscale, p.mscale_all_dim)
        }),
        truncate: p.truncate.unwrap_or(true),
        mscale_all_dim: p.mscale_all_dim.filter(|&m| m != 0.0),
    })
}

/// RoPE θ (default 10000, as transformers' `LlamaConfig`) and the frequency scaling.
///
/// Errors: a message for an unknown or malformed scaling (the caller adds the file).
pub(super) fn rope(
    fields: &RopeFields,
    max_position_embeddings: Option<usize>,
) -> Result<(f32, Option<RopeScaling>), String> {
    let parameters = fields.rope_parameters.as_ref().filter(|v| !v.is_null());
    let scaling = parameters.or(fields.rope_scaling.as_ref().filter(|v| !v.is_null()));
    let theta = parameters
        .and_then(|p| p.get("rope_theta"))
        .and_then(Value::as_f64)
        .map(|t| t as f32)
        .or(fields.rope_theta)
        .unwrap_or(10000.0);
    let Some(scaling) = scaling else {
        return Ok((theta, None));
    };
    let kind = ["rope_type", "type"]
        .iter()
        .find_map(|k| scaling.get(k))
        .and_then(Value::as_str)
        .unwrap_or("default");
    match kind {
        "default" => Ok((theta, None)),
        "linear" => {
            let factor = scaling
                .get("factor")
                .and_then(Value::as_f64)
                .ok_or("linear rope scaling without a factor")?;
            Ok((
                theta,
                Some(RopeScaling::Linear {
                    factor: factor as f32,
                }),
            ))
        }
        "llama3" => {
            let p = Llama3::deserialize(scaling)
                .map_err(|e| format!("invalid llama3 rope scaling: {e}"))?;
            Ok((
                theta,
                Some(RopeScaling::Llama3(Llama3Scaling {
                    factor: p.factor,
                    low_freq_factor: p.low_freq_factor,
                    high_freq_factor: p.high_freq_factor,
                    original_max_position_embeddings: p.original_max_position_embeddings,
                })),
            ))
        }
        "longrope" => {
            let p = LongRope::deserialize(scaling)
                .map_err(|e| format!("invalid longrope rope scaling: {e}"))?;
            let original = p
                .original_max_position_embeddings
                .or(fields.original_max_position_embeddings)
                .filter(|&o| o > 0)
                .ok_or("longrope rope scaling without original_max_position_embeddings")?;
            // transformers' default: the extension of the context over the pre-training
            // one, and the attention factor the LongRoPE paper suggests for it.
            let factor = p.factor.unwrap_or_else(|| {
                max_position_embeddings.unwrap_or(original) as f32 / original as f32
            });
            let attention_factor = p
                .attention_factor
                .unwrap_or_else(|| longrope_attention_factor(factor, original));
            Ok((
                theta,
                Some(RopeScaling::LongRope {
                    short_factor: p.short_factor,
                    long_factor: p.long_factor,
                    original_max_position_embeddings: original,
                    attention_factor,
                }),
            ))
        }
        "yarn" => Ok((
            theta,
            Some(RopeScaling::Yarn(yarn(
                fields,
                scaling,
                max_position_embeddings,
            )?)),
        )),
        other => Err(format!(
            "rope scaling of type \"{other}\" (only \"llama3\", \"linear\", \"longrope\" and \
             \"yarn\" are supported)"
        )),
    }
}

/// Gemma 3's two RoPEs: the global layers' θ and scaling, and the sliding-window layers'
/// θ (unscaled). transformers 5 writes them as `rope_parameters` keyed by layer type
/// (`{"full_attention": {..}, "sliding_attention": {..}}`), transformers 4 as `rope_theta`
/// and `rope_scaling` for the global layers and `rope_local_base_freq` (default 10000).
///
/// Errors: a message for an unknown or malformed scaling, or a scaled local RoPE.
pub(super) fn gemma3_ropes(
    fields: &RopeFields,
    rope_local_base_freq: Option<f32>,
    max_position_embeddings: Option<usize>,
) -> Result<((f32, Option<RopeScaling>), f32), String> {
    let per_type = fields
        .rope_parameters
        .as_ref()
        .filter(|p| p.get("full_attention").is_some() || p.get("sliding_attention").is_some());
    let Some(per_type) = per_type else {
        let global = rope(fields, max_position_embeddings)?;
        return Ok((global, rope_local_base_freq.unwrap_or(10000.0)));
    };
    let of = |kind: &str| -> Result<(f32, Option<RopeScaling>), String> {
        let fields = RopeFields {
            rope_parameters: per_type.get(kind).cloned(),
            ..RopeFields::default()
        };
        rope(&fields, max_position_embeddings)
    };
    let (local, local_scaling) = of("sliding_attention")?;
    if local_scaling.is_some() {
        return Err("a scaled RoPE on the sliding-window layers".into());
    }
    Ok((of("full_attention")?, local))
}

/// The sliding window of a `family` ([`Family::reads_sliding_window`]): Mistral's
/// `sliding_window`; Qwen2's is refused when `use_sliding_window` turns it on (Qwen2 applies
/// it only to the layers from `max_window_layers` on); other families have none.
///
/// Errors: a message for a window of 0 or Qwen2's per-layer windows.
pub(super) fn sliding_window(
    family: Family,
    fields: &WindowFields,
) -> Result<Option<usize>, String> {
    if family.reads_sliding_window() {
        return match fields.sliding_window {
            Some(0) => Err("sliding_window must be positive".into()),
            window => Ok(window),
        };
    }
    if family.has_qwen_window_layers() && fields.use_sliding_window == Some(true) {
        return Err(format!(
            "{family}'s use_sliding_window (windows on the layers from max_window_layers on)"
        ));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope_of(json: &str) -> Result<(f32, Option<RopeScaling>), String> {
        rope(&serde_json::from_str(json).unwrap(), Some(131072))
    }

    /// Llama 3.1's published `config.json` fields (transformers 4 form) and the same in
    /// transformers 5's `rope_parameters` give one scaling; other types are named in errors.
    #[test]
    fn llama3_scaling_in_both_forms_and_unsupported_types_refused() {
        let want = RopeScaling::Llama3(Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        });
        let v4 = r#"{"rope_theta": 500000.0, "rope_scaling": {"factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"}}"#;
        assert_eq!(rope_of(v4).unwrap(), (500000.0, Some(want.clone())));
        let v5 = r#"{"rope_parameters": {"factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
            "rope_theta": 500000.0, "rope_type": "llama3"}}"#;
        assert_eq!(rope_of(v5).unwrap(), (500000.0, Some(want)));
        let plain = r#"{"rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}}"#;
        assert_eq!(rope_of(plain).unwrap(), (1e6, None));
        assert_eq!(rope_of("{}").unwrap(), (10000.0, None));
        let dynamic = r#"{"rope_scaling": {"type": "dynamic", "factor": 4.0}}"#;
        assert!(rope_of(dynamic).unwrap_err().contains("\"dynamic\""));
        let partial = r#"{"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}"#;
        assert!(rope_of(partial).unwrap_err().contains("low_freq_factor"));
    }

    /// Phi-3's transformers 4 form: the pre-training context beside `rope_scaling`, no
    /// attention factor, which is then `sqrt(1 + ln(131072 / 4096) / ln(4096))`.
    #[test]
    fn longrope_reads_its_factors_and_derives_the_attention_factor() {
        let v4 = r#"{"rope_theta": 10000.0, "original_max_position_embeddings": 4096,
            "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.5],
            "long_factor": [2.0, 4.0]}}"#;
        let Ok((
            10000.0,
            Some(RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings: 4096,
                attention_factor,
            }),
        )) = rope_of(v4)
        else {
            panic!("{:?}", rope_of(v4));
        };
        assert_eq!(
            (short_factor, long_factor),
            (vec![1.0, 1.5], vec![2.0, 4.0])
        );
        let want = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt() as f32;
        assert_eq!(attention_factor, want);
        let missing = r#"{"rope_scaling": {"type": "longrope", "short_factor": [1.0],
            "long_factor": [1.0]}}"#;
        assert!(rope_of(missing)
            .unwrap_err()
            .contains("original_max_position_embeddings"));
    }

    /// DeepSeek-V2-Lite's `rope_scaling` (its published `config.json`), whose equal mscales
    /// give an attention factor of 1 and a softmax scale factor of
    /// `(0.1·0.707·ln 40 + 1)²`, and Qwen's documented long-context block, with the
    /// defaults and an attention factor of `0.1·ln 4 + 1`.
    #[test]
    fn yarn_reads_deepseek_and_qwen_blocks() {
        let deepseek = r#"{"rope_theta": 10000, "max_position_embeddings": 163840,
            "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
            "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
            "type": "yarn"}}"#;
        // factor, pre-training context, betas, attention factor, truncation, mscale_all_dim.
        let yarn = |text: &str| match rope_of(text).unwrap() {
            (theta, Some(RopeScaling::Yarn(y))) => (
                theta,
                (y.factor, y.original_max_position_embeddings),
                (y.beta_fast, y.beta_slow, y.attention_factor),
                (y.truncate, y.mscale_all_dim, y.softmax_scale_factor()),
            ),
            other => panic!("{other:?}"),
        };
        let (theta, sizes, betas, rest) = yarn(deepseek);
        assert_eq!(
            (theta, sizes, betas),
            (10000.0, (40.0, 4096), (32.0, 1.0, 1.0))
        );
        let m = 0.1 * 0.707 * 40f64.ln() + 1.0;
        assert_eq!((rest.0, rest.1), (true, Some(0.707)));
        assert!((f64::from(rest.2) - m * m).abs() < 1e-6);
        let qwen = r#"{"rope_theta": 1000000.0, "rope_scaling": {"type": "yarn",
            "factor": 4.0, "original_max_position_embeddings": 32768}}"#;
        let attention = (0.1 * 4f64.ln() + 1.0) as f32;
        assert_eq!(
            yarn(qwen),
            (1e6, (4.0, 32768), (32.0, 1.0, attention), (true, None, 1.0))
        );
    }

    /// The configurations of `tests/data/yarn/yarn.json` (`make.py`) read as the parameters
    /// transformers 5.25 resolves for them: its attention factor (to f32 rounding of the
    /// f64 mscales) and the defaults it fills in for the rest, the factor from the context
    /// lengths included.
    #[test]
    fn yarn_resolves_as_transformers() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/yarn/yarn.json");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let json: Value = serde_json::from_str(&text).unwrap();
        for case in json["cases"].as_array().unwrap() {
            let name = &case["name"];
            let config = &case["config"];
            let max_position_embeddings = config["max_position_embeddings"].as_u64();
            let fields = RopeFields::deserialize(config).unwrap();
            let got = rope(&fields, max_position_embeddings.map(|m| m as usize));
            let Ok((_, Some(RopeScaling::Yarn(got)))) = got else {
                panic!("{name}: {got:?}");
            };
            let Ok(RopeScaling::Yarn(want)) = RopeScaling::deserialize(&case["flm"]) else {
                panic!("{name}: {}", case["flm"]);
            };
            let close = (got.attention_factor - want.attention_factor).abs()
                <= 1e-6 * want.attention_factor;
            assert!(close, "{name}: {got:?} vs {want:?}");
            let got = YarnScaling {
                attention_factor: want.attention_factor,
                ..got
            };
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn windows_per_model_type() {
        let w = |window, use_sliding| WindowFields {
            sliding_window: window,
            use_sliding_window: use_sliding,
        };
        assert_eq!(
            sliding_window(Family::Mistral, &w(Some(4096), None)),
            Ok(Some(4096))
        );
        assert_eq!(sliding_window(Family::Mistral, &w(None, None)), Ok(None));
        assert!(sliding_window(Family::Mistral, &w(Some(0), None)).is_err());
        assert_eq!(
            sliding_window(Family::Qwen2, &w(Some(32768), Some(false))),
            Ok(None)
        );
        assert!(sliding_window(Family::Qwen2, &w(Some(32768), Some(true))).is_err());
        assert_eq!(sliding_window(Family::Llama, &w(Some(8), None)), Ok(None));
    }
}
