//! gpt-oss (`general.architecture` `gpt-oss`) as llama.cpp reads it
//! (`src/models/openai-moe.cpp`, its `LLM_ARCH_OPENAI_MOE`) and its converter writes it
//! (`convert_hf_to_gguf.py`'s `GptOssModel`):
//!
//! - attention: q/k/v and output biases (`attn_q.bias`, ..., `attn_output.bias`), one sink
//!   logit per query head (`attn_sinks.weight` `[n_head]`), a window of
//!   `attention.sliding_window` positions (the query's own included, llama.cpp's
//!   `LLAMA_SWA_TYPE_STANDARD`) on the layers `attention.sliding_window_pattern` marks,
//!   by default the even ones (period 2);
//! - the feed-forward norm (transformers' `post_attention_layernorm`) is
//!   `post_attention_norm.weight` ([`crate::Family::gguf_layer_name`]);
//! - the router has a bias (`ffn_gate_inp.bias`), added before the top-k, and weights the
//!   chosen experts by a softmax over their logits (`SOFTMAX_WEIGHT`, the renormalised
//!   softmax); the experts `ffn_{gate,up,down}_exps` (MXFP4 in the released files, used in
//!   place as [`flm_core::DataType::MXFP4`]) have stacked biases `ffn_*_exps.bias`
//!   `[n_experts, out]`, and the clamped SwiGLU with llama.cpp's constants
//!   (`LLM_FFN_SWIGLU_OAI_MOE`: alpha 1.702, limit 7.0, the released models' values;
//!   the file has no key for them);
//! - YaRN from the usual keys, but with its correction range unrounded (transformers'
//!   `truncate: false`, which every gpt-oss release sets, and OpenAI's reference
//!   implementation): llama.cpp's `ggml_rope_yarn_corr_dims` rounds it (floor and ceil), which
//!   moves the ramp of the tiny test model by a whole dimension; flm follows the
//!   model's definition.

use flm_core::{ExpertActivation, RopeScaling};

use super::{key, sliding_layers, Meta};
use crate::{Error, Family, ModelConfig, Result};

/// llama.cpp's SwiGLU constants for gpt-oss (`llama-graph.cpp`, `LLM_FFN_SWIGLU_OAI_MOE`).
const SWIGLU_ALPHA: f32 = 1.702;
const SWIGLU_LIMIT: f32 = 7.0;

/// `c` (read by the common keys) with what gpt-oss adds; `has` tells whether the file has a
/// tensor of that name.
///
/// Errors: [`Error::Format`] for a missing `attention.sliding_window`, a malformed window
/// pattern, or a file without experts.
pub(super) fn gpt_oss(
    mut c: ModelConfig,
    m: &Meta,
    has: &dyn Fn(&str) -> bool,
) -> Result<ModelConfig> {
    let family = Family::GptOss;
    c.attn_sinks = true;
    c.qkv_bias = has("blk.0.attn_q.bias");
    c.o_bias = has("blk.0.attn_output.bias");
    c.sliding_window =
        Some(m.required(&key(family, "attention.sliding_window"))?).filter(|&w| w > 0);
    c.sliding_layers = Some(sliding_layers(m, family, c.n_layers, 2)?);
    if let Some(RopeScaling::Yarn(yarn)) = c.rope_scaling.as_mut() {
        yarn.truncate = false;
    }
    let moe = c.moe.as_mut().ok_or_else(|| {
        let msg = format!(
            "gpt-oss without experts ({} 0)",
            key(family, "expert_count")
        );
        Error::format(m.path, msg)
    })?;
    moe.logit_bias = true;
    moe.expert_biases = true;
    moe.activation = ExpertActivation::ClampedSwiGlu {
        alpha: SWIGLU_ALPHA,
        limit: SWIGLU_LIMIT,
    };
    Ok(c)
}
