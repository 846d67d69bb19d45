//! The model families flm runs, parsed once from the name a checkpoint gives itself:
//! Hugging Face's `config.json` `model_type` or a GGUF file's `general.architecture`
//! (llama.cpp's `LLM_ARCH_NAMES`). The importers match on [`Family`], never on those
//! strings, and the facts that both formats leave implicit (q/k norms, q/k/v biases, the
//! sliding window's key) are stated here once.

use std::fmt;

use flm_core::RopeStyle;

use crate::tensor_names::LayerPart;
#[cfg(doc)]
use crate::tensor_names::TensorName;

/// A model family: one transformers modeling file, with the variants that share its
/// config keys and tensor names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Llama 1–3 (`LlamaForCausalLM`); in GGUF also Mixtral, written as `llama` with
    /// experts.
    Llama,
    /// InternLM: Llama names with biases on q, k, v and o (`bias`, default true).
    InternLm,
    /// Mistral: Llama with a sliding window.
    Mistral,
    /// Mixtral: Mistral's layers with the experts under `block_sparse_moe`.
    Mixtral,
    /// Baichuan 1: a fused `W_pack`; ALiBi for the 13B model.
    Baichuan,
    /// Qwen2: biases on q, k and v.
    Qwen2,
    /// Qwen2-MoE: Qwen2 with routed experts and a gated shared expert.
    Qwen2Moe,
    /// Qwen3: an RMSNorm over each query and key head.
    Qwen3,
    /// Qwen3-MoE: Qwen3 with routed experts.
    Qwen3Moe,
    /// Phi-3 and Phi-4-mini: fused q/k/v and gate/up, LongRoPE.
    Phi3,
    /// Gemma 1: GeGLU, `1 + w` norm gains, scaled embeddings.
    Gemma,
    /// Gemma 2: post-norms, soft caps, sliding-window layers.
    Gemma2,
    /// Gemma 3 (text): Gemma 2 without soft caps, with q/k norms and a RoPE per layer kind.
    Gemma3,
    /// THUDM's ChatGLM 1–3 and GLM-4 (`modeling_chatglm.py`; Hugging Face directories only).
    ChatGlm,
    /// GLM-4-0414 (transformers' `Glm4ForCausalLM`): Llama's layer with norms after the
    /// attention and the MLP too, a fused `gate_up_proj`, q/k/v biases, and RoPE in adjacent
    /// pairs on part of each head (`partial_rotary_factor`, 0.5 by default).
    Glm4,
    /// DeepSeek-V2 and V2-Lite (`DeepseekV2ForCausalLM`): multi-head latent attention and
    /// DeepSeek's experts with a softmax router (see `import::deepseek`); in GGUF files
    /// (`deepseek2`) also DeepSeek-V3, whose keys give its sigmoid router.
    DeepseekV2,
    /// DeepSeek-V3 and R1 (`DeepseekV3ForCausalLM`): DeepSeek-V2's layers with a sigmoid
    /// router whose bias only chooses.
    DeepseekV3,
    /// GLM-4.5, 4.6 and 4.5-Air (`Glm4MoeForCausalLM`): grouped-query attention with q/k/v
    /// biases, optional q/k norms and RoPE on half of each head; DeepSeek-V3's experts.
    Glm4Moe,
    /// OpenAI's gpt-oss (`GptOssForCausalLM`): grouped-query attention with q/k/v/o biases,
    /// attention sinks, sliding-window and full layers alternating, YaRN; experts with
    /// biases and a clamped SwiGLU behind a biased router (see `import::gpt_oss`). Hugging
    /// Face directories with unquantised experts.
    GptOss,
}

impl Family {
    /// Every family, in the order error messages list them.
    pub const ALL: [Family; 19] = [
        Family::Llama,
        Family::InternLm,
        Family::Mistral,
        Family::Mixtral,
        Family::Baichuan,
        Family::Qwen2,
        Family::Qwen2Moe,
        Family::Qwen3,
        Family::Qwen3Moe,
        Family::Phi3,
        Family::Gemma,
        Family::Gemma2,
        Family::Gemma3,
        Family::ChatGlm,
        Family::Glm4,
        Family::DeepseekV2,
        Family::DeepseekV3,
        Family::Glm4Moe,
        Family::GptOss,
    ];

    /// The `model_type` of its Hugging Face `config.json`.
    pub fn hf_model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::InternLm => "internlm",
            Family::Mistral => "mistral",
            Family::Mixtral => "mixtral",
            Family::Baichuan => "baichuan",
            Family::Qwen2 => "qwen2",
            Family::Qwen2Moe => "qwen2_moe",
            Family::Qwen3 => "qwen3",
            Family::Qwen3Moe => "qwen3_moe",
            Family::Phi3 => "phi3",
            Family::Gemma => "gemma",
            Family::Gemma2 => "gemma2",
            Family::Gemma3 => "gemma3_text",
            Family::ChatGlm => "chatglm",
            Family::Glm4 => "glm4",
            Family::DeepseekV2 => "deepseek_v2",
            Family::DeepseekV3 => "deepseek_v3",
            Family::Glm4Moe => "glm4_moe",
            Family::GptOss => "gpt_oss",
        }
    }

    /// The `general.architecture` of its GGUF files that flm reads, `None` for families
    /// flm reads from Hugging Face directories only (Mixtral's GGUF files say `llama`).
    pub fn gguf_architecture(self) -> Option<&'static str> {
        Some(match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen2Moe => "qwen2moe",
            Family::Qwen3 => "qwen3",
            Family::Qwen3Moe => "qwen3moe",
            Family::Phi3 => "phi3",
            Family::Gemma => "gemma",
            Family::Gemma2 => "gemma2",
            Family::Gemma3 => "gemma3",
            Family::Glm4 => "glm4",
            Family::Glm4Moe => "glm4moe",
            Family::DeepseekV2 => "deepseek2",
            Family::GptOss => "gpt-oss",
            Family::InternLm
            | Family::Mistral
            | Family::Mixtral
            | Family::Baichuan
            | Family::ChatGlm
            | Family::DeepseekV3 => return None,
        })
    }

    /// The family whose `config.json` says `model_type`, if flm runs it.
    pub fn from_hf_model_type(model_type: &str) -> Option<Family> {
        Family::ALL
            .into_iter()
            .find(|f| f.hf_model_type() == model_type)
    }

    /// The family whose GGUF files say `architecture`, if flm reads them.
    pub fn from_gguf_architecture(architecture: &str) -> Option<Family> {
        Family::ALL
            .into_iter()
            .find(|f| f.gguf_architecture() == Some(architecture))
    }

    /// The GGUF architectures flm reads, in [`Family::ALL`]'s order.
    pub fn gguf_architectures() -> Vec<&'static str> {
        Family::ALL
            .iter()
            .filter_map(|f| f.gguf_architecture())
            .collect()
    }

    /// DeepSeek-V2 or V3 (multi-head latent attention, [`crate::MlaConfig`]), or GLM-4.5:
    /// DeepSeek's experts, configured by `import::deepseek`.
    pub fn has_deepseek_experts(self) -> bool {
        matches!(
            self,
            Family::DeepseekV2 | Family::DeepseekV3 | Family::Glm4Moe
        )
    }

    /// Gemma 1, 2 or 3.
    pub fn is_gemma(self) -> bool {
        matches!(self, Family::Gemma | Family::Gemma2 | Family::Gemma3)
    }

    /// An RMSNorm over each query and key head before RoPE (Qwen3's `q_norm`/`k_norm`).
    pub fn qk_norm(self) -> bool {
        matches!(self, Family::Qwen3 | Family::Qwen3Moe | Family::Gemma3)
    }

    /// Biases on the q, k and v projections (and none on o) unless the config says
    /// otherwise: Qwen2's `Qwen2Attention` always has them, Qwen2-MoE's `qkv_bias` and
    /// GLM-4's `attention_bias` default to true.
    pub fn qkv_bias(self) -> bool {
        matches!(self, Family::Qwen2 | Family::Qwen2Moe | Family::Glm4)
    }

    /// The share of each head that RoPE rotates when the config does not say
    /// (`partial_rotary_factor`): GLM-4's and GLM-4.5's 0.5, else all of it.
    pub fn partial_rotary_factor(self) -> f32 {
        if matches!(self, Family::Glm4 | Family::Glm4Moe) {
            0.5
        } else {
            1.0
        }
    }

    /// RoPE's pairing in its Hugging Face checkpoints: adjacent pairs for GLM-4
    /// (`rotate_half` on interleaved halves), else transformers' `rotate_half`.
    pub fn hf_rope_style(self) -> RopeStyle {
        if self == Family::Glm4 {
            RopeStyle::AdjacentPairs
        } else {
            RopeStyle::RotateHalf
        }
    }

    /// RoPE's pairing in its GGUF files: llama.cpp's converter permutes Llama's q and k
    /// rows to adjacent pairs; the others keep their Hugging Face layout.
    pub fn gguf_rope_style(self) -> RopeStyle {
        if self == Family::Llama {
            RopeStyle::AdjacentPairs
        } else {
            self.hf_rope_style()
        }
    }

    /// Norms after the attention and after the feed-forward network, before each residual
    /// add (Gemma 2 and 3, GLM-4).
    pub fn post_norms(self) -> bool {
        matches!(self, Family::Gemma2 | Family::Gemma3 | Family::Glm4)
    }

    /// A fused gate/up projection, gate rows first (transformers' `chunk(2)`): Phi-3's and
    /// GLM-4's `gate_up_proj`, llama.cpp's `ffn_up` of twice the rows.
    pub fn fused_gate_up(self) -> bool {
        matches!(self, Family::Phi3 | Family::Glm4)
    }

    /// The Hugging Face name of layer part `part` (after `model.layers.{l}.`) where this
    /// family's differs from [`TensorName::hf`]'s: Gemma 2 and 3 call the attention's
    /// post-norm `post_attention_layernorm`, Llama's name for the feed-forward norm, which
    /// they call `pre_feedforward_layernorm`; GLM-4 has `post_self_attn_layernorm` and
    /// `post_mlp_layernorm`.
    pub fn hf_layer_name(self, part: LayerPart) -> Option<&'static str> {
        match (self, part) {
            (Family::Gemma2 | Family::Gemma3, LayerPart::FfnNorm) => {
                Some("pre_feedforward_layernorm.weight")
            }
            (Family::Gemma2 | Family::Gemma3, LayerPart::PostAttnNorm) => {
                Some("post_attention_layernorm.weight")
            }
            (Family::Glm4, LayerPart::PostAttnNorm) => Some("post_self_attn_layernorm.weight"),
            (Family::Glm4, LayerPart::PostFfnNorm) => Some("post_mlp_layernorm.weight"),
            (f, LayerPart::SharedWGate) if f.has_deepseek_experts() => {
                Some("mlp.shared_experts.gate_proj.weight")
            }
            (f, LayerPart::SharedWUp) if f.has_deepseek_experts() => {
                Some("mlp.shared_experts.up_proj.weight")
            }
            (f, LayerPart::SharedWDown) if f.has_deepseek_experts() => {
                Some("mlp.shared_experts.down_proj.weight")
            }
            (Family::GptOss, LayerPart::Router) => Some("mlp.router.weight"),
            _ => None,
        }
    }

    /// The GGUF name of layer part `part` (after `blk.{l}.`) where this family's differs
    /// from [`TensorName::gguf`]'s: llama.cpp's gpt-oss calls its feed-forward norm
    /// (transformers' `post_attention_layernorm`) `post_attention_norm`, Gemma 2's name
    /// for the attention's post-norm.
    pub fn gguf_layer_name(self, part: LayerPart) -> Option<&'static str> {
        match (self, part) {
            (Family::GptOss, LayerPart::FfnNorm) => Some("post_attention_norm.weight"),
            _ => None,
        }
    }

    /// Whether its Hugging Face config's `sliding_window` applies to every layer (Mistral's
    /// and Phi-3's; Gemma 2 and 3 on their sliding layers), rather than being absent or, for
    /// Qwen's `use_sliding_window`, per layer range.
    pub fn reads_sliding_window(self) -> bool {
        matches!(
            self,
            Family::Mistral
                | Family::Mixtral
                | Family::Phi3
                | Family::Gemma2
                | Family::Gemma3
                | Family::GptOss
        )
    }

    /// Whether its config can turn on Qwen2's windows from `max_window_layers` on
    /// (`use_sliding_window`), which flm does not run.
    pub fn has_qwen_window_layers(self) -> bool {
        matches!(
            self,
            Family::Qwen2 | Family::Qwen2Moe | Family::Qwen3 | Family::Qwen3Moe
        )
    }
}

impl fmt::Display for Family {
    /// The Hugging Face `model_type`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.hf_model_type())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_name_parses_back_to_its_family() {
        for f in Family::ALL {
            assert_eq!(Family::from_hf_model_type(f.hf_model_type()), Some(f));
            if let Some(arch) = f.gguf_architecture() {
                assert_eq!(Family::from_gguf_architecture(arch), Some(f));
            }
        }
        assert_eq!(Family::from_hf_model_type("qwen3moe"), None);
        assert_eq!(Family::from_gguf_architecture("qwen3_moe"), None);
    }
}
