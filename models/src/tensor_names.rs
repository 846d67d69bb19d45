//! flm's canonical tensor names, in one typed table.
//!
//! Every importer maps its checkpoint's tensors onto [`TensorName`]s, the graphs take their
//! weights by them, .flm files store them (as [`TensorName`]'s `Display` form, such as
//! `layers.3.wq`), and the converter plans a file from [`canonical_tensors`]. The table
//! [`PARTS`] gives each layer part its name in .flm files, in Hugging Face checkpoints
//! (transformers' `LlamaForCausalLM`, under `model.layers.{l}.`) and in GGUF files
//! (llama.cpp's `LLM_TENSOR_NAMES`, under `blk.{l}.`); a name in none of these is never
//! guessed at: importers list it as ignored, and a .flm file holding one is refused.

use std::fmt;
use std::str::FromStr;

use crate::{Arch, ModelConfig};

/// A tensor of one transformer layer. Matrices are `[out, in]` as `torch.nn.Linear`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LayerPart {
    /// Attention norm gain `[dim]`.
    AttnNorm,
    /// Attention LayerNorm shift `[dim]` (ChatGLM-6B).
    AttnNormBias,
    /// Query projection `[n_heads·head_dim, dim]`.
    Wq,
    /// Key projection `[n_kv_heads·head_dim, dim]`.
    Wk,
    /// Value projection `[n_kv_heads·head_dim, dim]`.
    Wv,
    /// Query bias `[n_heads·head_dim]`.
    Bq,
    /// Key bias `[n_kv_heads·head_dim]`.
    Bk,
    /// Value bias `[n_kv_heads·head_dim]`.
    Bv,
    /// RMSNorm gain `[head_dim]` over each query head (Qwen3).
    QNorm,
    /// RMSNorm gain `[head_dim]` over each key head (Qwen3).
    KNorm,
    /// Output projection `[dim, n_heads·head_dim]`.
    Wo,
    /// Output projection bias `[dim]`.
    Bo,
    /// Feed-forward norm gain `[dim]`.
    FfnNorm,
    /// Feed-forward LayerNorm shift `[dim]` (ChatGLM-6B).
    FfnNormBias,
    /// Gate projection W1 `[hidden_dim, dim]` (SwiGLU).
    WGate,
    /// Up projection W3 `[hidden_dim, dim]`.
    WUp,
    /// Up projection bias `[hidden_dim]` (ChatGLM-6B).
    BUp,
    /// Down projection W2 `[dim, hidden_dim]`.
    WDown,
    /// Down projection bias `[dim]` (ChatGLM-6B).
    BDown,
    /// RMSNorm gain `[dim]` of the attention output (Gemma 2 and 3).
    PostAttnNorm,
    /// RMSNorm gain `[dim]` of the feed-forward output (Gemma 2 and 3).
    PostFfnNorm,
    /// Router of a mixture-of-experts layer `[n_experts, dim]` (transformers' `mlp.gate`).
    Router,
    /// Gate projection of the shared expert `[shared_expert_dim, dim]` (Qwen2-MoE).
    SharedWGate,
    /// Up projection of the shared expert `[shared_expert_dim, dim]` (Qwen2-MoE).
    SharedWUp,
    /// Down projection of the shared expert `[dim, shared_expert_dim]` (Qwen2-MoE).
    SharedWDown,
    /// The shared expert's gate `[1, dim]`: its output is weighted by `σ(gate · x)`
    /// (Qwen2-MoE's `shared_expert_gate`).
    SharedExpertGate,
    /// Multi-head latent attention's compressed query projection `[q_lora_rank, dim]`.
    QA,
    /// Its RMSNorm gain `[q_lora_rank]`.
    QANorm,
    /// The queries' parts without RoPE `[n_heads·qk_nope_head_dim, q_in]` (rows of `q_proj`
    /// or `q_b_proj`).
    QNope,
    /// The queries' rotated parts `[n_heads·qk_rope_head_dim, q_in]`.
    QRope,
    /// The latent's projection `[kv_lora_rank, dim]` (rows of `kv_a_proj_with_mqa`).
    KvA,
    /// The shared rotated key's projection `[qk_rope_head_dim, dim]` (its last rows).
    KRope,
    /// The latent's RMSNorm gain `[kv_lora_rank]`.
    KvANorm,
    /// The latent's up-projection to each head's key and value
    /// `[n_heads·(qk_nope_head_dim + head_dim), kv_lora_rank]` (`kv_b_proj`).
    KvB,
    /// The router's bias `[n_experts]`, added to the scores to choose the experts only
    /// (DeepSeek-V3's `e_score_correction_bias`).
    RouterBias,
    /// A multi-token-prediction layer's RMSNorm gain `[dim]` of the token's embedding
    /// (`enorm`).
    MtpEmbedNorm,
    /// Its RMSNorm gain `[dim]` of the previous hidden state (`hnorm`).
    MtpHiddenNorm,
    /// Its projection `[dim, 2·dim]` of the normed embedding and hidden state, concatenated
    /// in that order (`eh_proj`).
    MtpProjection,
    /// Its RMSNorm gain `[dim]` before the classifier (`shared_head.norm`).
    MtpHeadNorm,
    /// One attention-sink logit per query head `[n_heads]` (gpt-oss's `self_attn.sinks`).
    Sinks,
    /// The router's bias `[n_experts]`, added to its logits (gpt-oss's `mlp.router.bias`).
    RouterLogitBias,
    /// Gate projection bias `[hidden_dim]` (an expert's, gpt-oss).
    BGate,
}

/// The names of one [`LayerPart`] in each file format.
#[derive(Debug, Clone, Copy)]
pub struct PartNames {
    /// The part.
    pub part: LayerPart,
    /// Its name in .flm files, after `layers.{l}.`.
    pub flm: &'static str,
    /// Its name in transformers' Llama-family checkpoints, after `model.layers.{l}.`.
    pub hf: Option<&'static str>,
    /// Its name in GGUF files, after `blk.{l}.`.
    pub gguf: Option<&'static str>,
}

const fn part(
    part: LayerPart,
    flm: &'static str,
    hf: Option<&'static str>,
    gguf: Option<&'static str>,
) -> PartNames {
    PartNames {
        part,
        flm,
        hf,
        gguf,
    }
}

/// Every layer part and its names. ChatGLM's own HF names are mapped in the THUDM
/// importer, which splits its fused tensors.
pub const PARTS: [PartNames; 42] = {
    use LayerPart::*;
    [
        part(
            AttnNorm,
            "attn_norm",
            Some("input_layernorm.weight"),
            Some("attn_norm.weight"),
        ),
        part(AttnNormBias, "attn_norm_bias", None, None),
        part(
            Wq,
            "wq",
            Some("self_attn.q_proj.weight"),
            Some("attn_q.weight"),
        ),
        part(
            Wk,
            "wk",
            Some("self_attn.k_proj.weight"),
            Some("attn_k.weight"),
        ),
        part(
            Wv,
            "wv",
            Some("self_attn.v_proj.weight"),
            Some("attn_v.weight"),
        ),
        part(Bq, "bq", Some("self_attn.q_proj.bias"), Some("attn_q.bias")),
        part(Bk, "bk", Some("self_attn.k_proj.bias"), Some("attn_k.bias")),
        part(Bv, "bv", Some("self_attn.v_proj.bias"), Some("attn_v.bias")),
        part(
            QNorm,
            "q_norm",
            Some("self_attn.q_norm.weight"),
            Some("attn_q_norm.weight"),
        ),
        part(
            KNorm,
            "k_norm",
            Some("self_attn.k_norm.weight"),
            Some("attn_k_norm.weight"),
        ),
        part(
            Wo,
            "wo",
            Some("self_attn.o_proj.weight"),
            Some("attn_output.weight"),
        ),
        part(
            Bo,
            "bo",
            Some("self_attn.o_proj.bias"),
            Some("attn_output.bias"),
        ),
        part(
            FfnNorm,
            "ffn_norm",
            Some("post_attention_layernorm.weight"),
            Some("ffn_norm.weight"),
        ),
        part(FfnNormBias, "ffn_norm_bias", None, None),
        part(
            WGate,
            "w_gate",
            Some("mlp.gate_proj.weight"),
            Some("ffn_gate.weight"),
        ),
        part(
            WUp,
            "w_up",
            Some("mlp.up_proj.weight"),
            Some("ffn_up.weight"),
        ),
        part(BUp, "b_up", None, None),
        part(
            WDown,
            "w_down",
            Some("mlp.down_proj.weight"),
            Some("ffn_down.weight"),
        ),
        part(BDown, "b_down", None, None),
        // Gemma 2 and 3 call the attention post-norm `post_attention_layernorm`, the
        // name Llama gives its feed-forward norm: their importer maps both.
        part(
            PostAttnNorm,
            "post_attn_norm",
            None,
            Some("post_attention_norm.weight"),
        ),
        part(
            PostFfnNorm,
            "post_ffn_norm",
            Some("post_feedforward_layernorm.weight"),
            Some("post_ffw_norm.weight"),
        ),
        part(
            Router,
            "router",
            Some("mlp.gate.weight"),
            Some("ffn_gate_inp.weight"),
        ),
        part(
            SharedWGate,
            "shared_w_gate",
            Some("mlp.shared_expert.gate_proj.weight"),
            Some("ffn_gate_shexp.weight"),
        ),
        part(
            SharedWUp,
            "shared_w_up",
            Some("mlp.shared_expert.up_proj.weight"),
            Some("ffn_up_shexp.weight"),
        ),
        part(
            SharedWDown,
            "shared_w_down",
            Some("mlp.shared_expert.down_proj.weight"),
            Some("ffn_down_shexp.weight"),
        ),
        part(
            SharedExpertGate,
            "shared_gate",
            Some("mlp.shared_expert_gate.weight"),
            Some("ffn_gate_inp_shexp.weight"),
        ),
        part(
            QA,
            "q_a",
            Some("self_attn.q_a_proj.weight"),
            Some("attn_q_a.weight"),
        ),
        part(
            QANorm,
            "q_a_norm",
            Some("self_attn.q_a_layernorm.weight"),
            Some("attn_q_a_norm.weight"),
        ),
        // Rows of fused checkpoint tensors, split by the DeepSeek importer.
        part(QNope, "wq_nope", None, None),
        part(QRope, "wq_rope", None, None),
        part(KvA, "kv_a", None, None),
        part(KRope, "k_rope", None, None),
        part(
            KvANorm,
            "kv_a_norm",
            Some("self_attn.kv_a_layernorm.weight"),
            Some("attn_kv_a_norm.weight"),
        ),
        part(
            KvB,
            "kv_b",
            Some("self_attn.kv_b_proj.weight"),
            Some("attn_kv_b.weight"),
        ),
        part(
            RouterBias,
            "router_bias",
            Some("mlp.gate.e_score_correction_bias"),
            Some("exp_probs_b.bias"),
        ),
        // The prediction layers' own tensors (DeepSeek-V3's `model.layers.61.`, llama.cpp's
        // `blk.{l}.nextn.`); their embedding and head copies are the model's own.
        part(
            MtpEmbedNorm,
            "mtp_embed_norm",
            Some("enorm.weight"),
            Some("nextn.enorm.weight"),
        ),
        part(
            MtpHiddenNorm,
            "mtp_hidden_norm",
            Some("hnorm.weight"),
            Some("nextn.hnorm.weight"),
        ),
        part(
            MtpProjection,
            "mtp_projection",
            Some("eh_proj.weight"),
            Some("nextn.eh_proj.weight"),
        ),
        part(
            MtpHeadNorm,
            "mtp_head_norm",
            Some("shared_head.norm.weight"),
            Some("nextn.shared_head_norm.weight"),
        ),
        part(
            Sinks,
            "sinks",
            Some("self_attn.sinks"),
            Some("attn_sinks.weight"),
        ),
        part(
            RouterLogitBias,
            "router_logit_bias",
            Some("mlp.router.bias"),
            Some("ffn_gate_inp.bias"),
        ),
        // Expert biases, split out of stacked tensors by the gpt-oss importer.
        part(BGate, "b_gate", None, None),
    ]
};

impl LayerPart {
    /// The part's row of [`PARTS`].
    pub fn names(self) -> &'static PartNames {
        // PARTS lists the variants in declaration order.
        &PARTS[self as usize]
    }
}

/// A canonical tensor of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TensorName {
    /// P-tuning v2 prefix keys and values `[pre_seq_len, n_layers·2·kv_dim]`.
    PrefixKv,
    /// Token embedding table `[vocab_size, dim]`.
    Embedding,
    /// A tensor of layer `.0`.
    Layer(usize, LayerPart),
    /// The [`LayerPart::WGate`], [`LayerPart::WUp`] or [`LayerPart::WDown`] matrix of
    /// expert `.1` of layer `.0`, `[expert_dim, dim]` or `[dim, expert_dim]`.
    Expert(usize, usize, LayerPart),
    /// Final norm gain `[dim]`.
    FinalNorm,
    /// Final LayerNorm shift `[dim]` (ChatGLM-6B).
    FinalNormBias,
    /// Classifier `[vocab_size, dim]` (absent when tied to the embedding table).
    Classifier,
}

impl TensorName {
    /// Its name in transformers' Llama-family checkpoints, or `None` for a tensor they do
    /// not have.
    pub fn hf(self) -> Option<String> {
        // transformers' `mlp.experts.{e}.gate_proj.weight` beside the dense
        // `mlp.gate_proj.weight` (Qwen3-MoE; the Mixtral importer renames its own).
        if let TensorName::Expert(l, e, p) = self {
            let n = p.names().hf?.strip_prefix("mlp.")?;
            return Some(format!("model.layers.{l}.mlp.experts.{e}.{n}"));
        }
        let top = [
            "model.embed_tokens.weight",
            "model.norm.weight",
            "lm_head.weight",
        ];
        self.foreign(top, "model.layers", |n| n.hf)
    }

    /// Its name in GGUF files (llama.cpp's `LLM_TENSOR_NAMES`), or `None` for a tensor they
    /// do not have on its own (the experts, which GGUF files stack into one tensor per
    /// part: [`TensorName::gguf_stacked`]).
    pub fn gguf(self) -> Option<String> {
        let top = ["token_embd.weight", "output_norm.weight", "output.weight"];
        self.foreign(top, "blk", |n| n.gguf)
    }

    /// For an expert's matrix, the GGUF tensor that stacks this matrix of every expert of
    /// its layer, `[n_experts, out, in]` (llama.cpp's `ffn_gate_exps`, `ffn_up_exps`,
    /// `ffn_down_exps`), and the expert's index in it; for an expert's bias (gpt-oss), the
    /// `[n_experts, out]` one beside it (`ffn_gate_exps.bias`...); `None` for other tensors.
    pub fn gguf_stacked(self) -> Option<(String, usize)> {
        let TensorName::Expert(l, e, p) = self else {
            return None;
        };
        let (matrix, kind) = match p {
            LayerPart::BGate => (LayerPart::WGate, "bias"),
            LayerPart::BUp => (LayerPart::WUp, "bias"),
            LayerPart::BDown => (LayerPart::WDown, "bias"),
            p => (p, "weight"),
        };
        let name = matrix.names().gguf?.strip_suffix(".weight")?;
        Some((format!("blk.{l}.{name}_exps.{kind}"), e))
    }

    /// For an expert's matrix, its own GGUF tensor in the files llama.cpp wrote before it
    /// stacked the experts (early 2024 Mixtral conversions: `blk.{l}.ffn_gate.{e}.weight`);
    /// `None` for other tensors.
    pub fn gguf_per_expert(self) -> Option<String> {
        let TensorName::Expert(l, e, p) = self else {
            return None;
        };
        let name = p.names().gguf?.strip_suffix(".weight")?;
        Some(format!("blk.{l}.{name}.{e}.weight"))
    }

    /// Its name in a format naming the embedding, final norm and classifier `top`, and
    /// layer parts `{layers}.{l}.{part(names)}`.
    fn foreign(
        self,
        [embedding, final_norm, classifier]: [&str; 3],
        layers: &str,
        part: impl Fn(&PartNames) -> Option<&'static str>,
    ) -> Option<String> {
        match self {
            TensorName::Embedding => Some(embedding.into()),
            TensorName::FinalNorm => Some(final_norm.into()),
            TensorName::Classifier => Some(classifier.into()),
            TensorName::Layer(l, p) => part(p.names()).map(|n| format!("{layers}.{l}.{n}")),
            TensorName::PrefixKv | TensorName::FinalNormBias | TensorName::Expert(..) => None,
        }
    }

    /// Whether this is a matrix that quantisation is most sensitive in: the classifier,
    /// the embedding table when tied to it, the K and V projections (with multi-head latent
    /// attention, the latent's, the rotated key's and `kv_b_proj`) and the FFN down
    /// projection, the shared expert's too (llama.cpp's Q4_K_M keeps these at higher
    /// precision for the same reason), but not the routed experts' down projections.
    pub fn is_sensitive(self, tied: bool) -> bool {
        match self {
            TensorName::Classifier => true,
            TensorName::Embedding => tied,
            // The shared expert is a dense feed-forward every token runs.
            TensorName::Layer(_, p) => matches!(
                p,
                LayerPart::Wk
                    | LayerPart::Wv
                    | LayerPart::WDown
                    | LayerPart::SharedWDown
                    | LayerPart::KvA
                    | LayerPart::KRope
                    | LayerPart::KvB
            ),
            // The experts are most of a mixture's bytes: int8 down projections would cost a
            // third more memory and decode time where the experts are the bottleneck.
            TensorName::Expert(..) => false,
            _ => false,
        }
    }
}

impl fmt::Display for TensorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorName::PrefixKv => f.write_str("prefix_kv"),
            TensorName::Embedding => f.write_str("embedding"),
            TensorName::Layer(l, p) => write!(f, "layers.{l}.{}", p.names().flm),
            TensorName::Expert(l, e, p) => write!(f, "layers.{l}.experts.{e}.{}", p.names().flm),
            TensorName::FinalNorm => f.write_str("final_norm"),
            TensorName::FinalNormBias => f.write_str("final_norm_bias"),
            TensorName::Classifier => f.write_str("classifier"),
        }
    }
}

impl FromStr for TensorName {
    type Err = String;

    /// Parses the .flm form (`embedding`, `layers.3.wq`, ...).
    ///
    /// Errors: a message naming `s` when it is not a canonical tensor name.
    fn from_str(s: &str) -> Result<TensorName, String> {
        Ok(match s {
            "prefix_kv" => TensorName::PrefixKv,
            "embedding" => TensorName::Embedding,
            "final_norm" => TensorName::FinalNorm,
            "final_norm_bias" => TensorName::FinalNormBias,
            "classifier" => TensorName::Classifier,
            _ => s
                .strip_prefix("layers.")
                .and_then(|rest| rest.split_once('.'))
                .and_then(|(l, p)| {
                    let layer = l.parse().ok()?;
                    let part = |p| Some(PARTS.iter().find(|n| n.flm == p)?.part);
                    match p.strip_prefix("experts.") {
                        Some(rest) => {
                            let (e, p) = rest.split_once('.')?;
                            let p = part(p).filter(|p| {
                                EXPERT_PARTS.contains(p) || EXPERT_BIASES.contains(p)
                            })?;
                            Some(TensorName::Expert(layer, e.parse().ok()?, p))
                        }
                        None => Some(TensorName::Layer(layer, part(p)?)),
                    }
                })
                .ok_or_else(|| format!("{s:?} is not one of flm's tensor names"))?,
        })
    }
}

/// The tensors of `c`'s graph and their shapes, in canonical order (the order .flm files
/// store them): `prefix_kv` when `pre_seq_len > 0`, `embedding`, each layer's parts that
/// the configuration has, each multi-token-prediction layer's own parts and then its
/// transformer layer's (numbered after the others, as in the checkpoints), the final norm,
/// then `classifier` unless the embeddings are tied.
pub fn canonical_tensors(c: &ModelConfig) -> Vec<(TensorName, Vec<usize>)> {
    let mut out = Vec::new();
    if c.pre_seq_len > 0 {
        let width = c.n_layers * 2 * c.kv_dim();
        out.push((TensorName::PrefixKv, vec![c.pre_seq_len, width]));
    }
    out.push((TensorName::Embedding, vec![c.vocab_size, c.dim]));
    for l in 0..c.n_layers {
        match c.arch {
            Arch::Llama => out.extend(llama_layer(c, l)),
            Arch::ChatGlm { .. } => out.extend(
                chatglm_layer(c)
                    .into_iter()
                    .map(|(p, shape)| (TensorName::Layer(l, p), shape)),
            ),
        }
    }
    for l in c.n_layers..c.n_layers + c.mtp_layers {
        use LayerPart::*;
        let own = [
            (MtpEmbedNorm, vec![c.dim]),
            (MtpHiddenNorm, vec![c.dim]),
            (MtpProjection, vec![c.dim, 2 * c.dim]),
            (MtpHeadNorm, vec![c.dim]),
        ];
        out.extend(own.map(|(p, shape)| (TensorName::Layer(l, p), shape)));
        out.extend(llama_layer(c, l));
    }
    out.push((TensorName::FinalNorm, vec![c.dim]));
    if matches!(c.arch, Arch::ChatGlm { .. }) {
        out.push((TensorName::FinalNormBias, vec![c.dim]));
    }
    if !c.tie_embeddings {
        out.push((TensorName::Classifier, vec![c.vocab_size, c.dim]));
    }
    out
}

/// The parts of an expert, in the order .flm files store them.
const EXPERT_PARTS: [LayerPart; 3] = [LayerPart::WGate, LayerPart::WDown, LayerPart::WUp];

/// The biases of an expert's matrices, in [`EXPERT_PARTS`]' order (gpt-oss).
const EXPERT_BIASES: [LayerPart; 3] = [LayerPart::BGate, LayerPart::BDown, LayerPart::BUp];

/// The tensors of Llama-graph layer `l` and their shapes: the biases and the q/k norms only
/// where the configuration has them; in a mixture-of-experts layer the router, the shared
/// expert if any, and each expert's matrices in place of the dense feed-forward's.
fn llama_layer(c: &ModelConfig, l: usize) -> Vec<(TensorName, Vec<usize>)> {
    use LayerPart::*;
    let (dim, hd, q_dim, kv_dim) = (c.dim, c.hidden_dim, c.q_dim(), c.kv_dim());
    let moe = c.moe_layer(l);
    let dense = moe.is_none();
    let shared = moe.and_then(|m| m.shared_expert_dim);
    let heads = c.mla.is_none();
    let mla = c.mla.as_ref();
    let q_lora = mla.and_then(|m| m.q_lora_rank);
    let q_in = q_lora.unwrap_or(dim);
    let mut out: Vec<(TensorName, Vec<usize>)> = [
        (AttnNorm, Some(vec![dim])),
        (Wq, heads.then(|| vec![q_dim, dim])),
        (Wk, heads.then(|| vec![kv_dim, dim])),
        (Wv, heads.then(|| vec![kv_dim, dim])),
        (Bq, c.qkv_bias.then(|| vec![q_dim])),
        (Bk, c.qkv_bias.then(|| vec![kv_dim])),
        (Bv, c.qkv_bias.then(|| vec![kv_dim])),
        (QNorm, c.qk_norm.then(|| vec![c.head_dim])),
        (KNorm, c.qk_norm.then(|| vec![c.head_dim])),
        (Sinks, c.attn_sinks.then(|| vec![c.n_heads])),
        (QA, q_lora.map(|r| vec![r, dim])),
        (QANorm, q_lora.map(|r| vec![r])),
        (
            QNope,
            mla.map(|m| vec![c.n_heads * m.qk_nope_head_dim, q_in]),
        ),
        (
            QRope,
            mla.map(|m| vec![c.n_heads * m.qk_rope_head_dim, q_in]),
        ),
        (KvA, mla.map(|m| vec![m.kv_lora_rank, dim])),
        (KRope, mla.map(|m| vec![m.qk_rope_head_dim, dim])),
        (KvANorm, mla.map(|m| vec![m.kv_lora_rank])),
        (
            KvB,
            mla.map(|m| {
                vec![
                    c.n_heads * (m.qk_nope_head_dim + c.head_dim),
                    m.kv_lora_rank,
                ]
            }),
        ),
        (Wo, Some(vec![dim, q_dim])),
        (Bo, c.o_bias.then(|| vec![dim])),
        (FfnNorm, Some(vec![dim])),
        (WGate, dense.then(|| vec![hd, dim])),
        (WDown, dense.then(|| vec![dim, hd])),
        (WUp, dense.then(|| vec![hd, dim])),
        (Router, moe.map(|m| vec![m.n_experts, dim])),
        (
            RouterBias,
            moe.filter(|m| m.choice_bias).map(|m| vec![m.n_experts]),
        ),
        (
            RouterLogitBias,
            moe.filter(|m| m.logit_bias).map(|m| vec![m.n_experts]),
        ),
        (SharedWGate, shared.map(|d| vec![d, dim])),
        (SharedWDown, shared.map(|d| vec![dim, d])),
        (SharedWUp, shared.map(|d| vec![d, dim])),
        (
            SharedExpertGate,
            moe.filter(|m| m.shared_expert_gated)
                .and(shared)
                .map(|_| vec![1, dim]),
        ),
        (PostAttnNorm, c.post_norms.then(|| vec![dim])),
        (PostFfnNorm, c.post_norms.then(|| vec![dim])),
    ]
    .into_iter()
    .filter_map(|(p, shape)| Some((TensorName::Layer(l, p), shape?)))
    .collect();
    if let Some(m) = moe {
        for e in 0..m.n_experts {
            for p in EXPERT_PARTS {
                let shape = match p {
                    WDown => vec![dim, m.expert_dim],
                    _ => vec![m.expert_dim, dim],
                };
                out.push((TensorName::Expert(l, e, p), shape));
            }
            if m.expert_biases {
                for p in EXPERT_BIASES {
                    let len = if p == BDown { dim } else { m.expert_dim };
                    out.push((TensorName::Expert(l, e, p), vec![len]));
                }
            }
        }
    }
    out
}

/// The parts of a ChatGLM-6B layer and their shapes.
fn chatglm_layer(c: &ModelConfig) -> Vec<(LayerPart, Vec<usize>)> {
    use LayerPart::*;
    let (dim, hd, q_dim, kv_dim) = (c.dim, c.hidden_dim, c.q_dim(), c.kv_dim());
    vec![
        (AttnNorm, vec![dim]),
        (AttnNormBias, vec![dim]),
        (Wq, vec![q_dim, dim]),
        (Bq, vec![q_dim]),
        (Wk, vec![kv_dim, dim]),
        (Bk, vec![kv_dim]),
        (Wv, vec![kv_dim, dim]),
        (Bv, vec![kv_dim]),
        (Wo, vec![dim, q_dim]),
        (Bo, vec![dim]),
        (FfnNorm, vec![dim]),
        (FfnNormBias, vec![dim]),
        (WUp, vec![hd, dim]),
        (BUp, vec![hd]),
        (WDown, vec![dim, hd]),
        (BDown, vec![dim]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_table_is_in_declaration_order() {
        for (i, n) in PARTS.iter().enumerate() {
            assert_eq!(n.part as usize, i, "{}", n.flm);
        }
    }

    #[test]
    fn display_and_parse_round_trip() {
        for n in &PARTS {
            let name = TensorName::Layer(7, n.part);
            assert_eq!(name.to_string().parse::<TensorName>(), Ok(name));
        }
        for name in [
            TensorName::PrefixKv,
            TensorName::Embedding,
            TensorName::FinalNorm,
            TensorName::FinalNormBias,
            TensorName::Classifier,
        ] {
            assert_eq!(name.to_string().parse::<TensorName>(), Ok(name));
        }
        assert_eq!(
            "layers.3.wq".parse::<TensorName>(),
            Ok(TensorName::Layer(3, LayerPart::Wq))
        );
        for bad in [
            "layers.x.wq",
            "layers.3.mlp",
            "layers.3",
            "lm_head.weight",
            "",
        ] {
            assert!(bad.parse::<TensorName>().is_err(), "{bad}");
        }
    }

    #[test]
    fn foreign_names_follow_transformers_and_llama_cpp() {
        let wq = TensorName::Layer(2, LayerPart::Wq);
        assert_eq!(wq.hf().unwrap(), "model.layers.2.self_attn.q_proj.weight");
        assert_eq!(wq.gguf().unwrap(), "blk.2.attn_q.weight");
        let down = TensorName::Layer(0, LayerPart::WDown);
        assert_eq!(down.hf().unwrap(), "model.layers.0.mlp.down_proj.weight");
        assert_eq!(down.gguf().unwrap(), "blk.0.ffn_down.weight");
        assert_eq!(TensorName::Layer(0, LayerPart::BUp).hf(), None);
        let expert = TensorName::Expert(1, 3, LayerPart::WUp);
        assert_eq!(
            expert.hf().unwrap(),
            "model.layers.1.mlp.experts.3.up_proj.weight"
        );
        assert_eq!(expert.gguf(), None);
        assert_eq!(
            expert.gguf_stacked(),
            Some(("blk.1.ffn_up_exps.weight".into(), 3))
        );
        assert_eq!(wq.gguf_stacked(), None);
        assert_eq!(
            expert.gguf_per_expert(),
            Some("blk.1.ffn_up.3.weight".into())
        );
        assert_eq!(
            TensorName::Layer(2, LayerPart::SharedExpertGate).gguf(),
            Some("blk.2.ffn_gate_inp_shexp.weight".into())
        );
        assert_eq!(expert.to_string(), "layers.1.experts.3.w_up");
        assert_eq!(expert.to_string().parse::<TensorName>(), Ok(expert));
        assert!("layers.1.experts.3.wq".parse::<TensorName>().is_err());
        assert_eq!(
            TensorName::Layer(4, LayerPart::Router).hf().unwrap(),
            "model.layers.4.mlp.gate.weight"
        );
        assert_eq!(TensorName::PrefixKv.gguf(), None);
    }
}
