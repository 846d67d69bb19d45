//! Model hyper-parameters.

use std::ops::Range;

use flm_core::{ExpertActivation, ExpertGroups, RopeScaling, RopeStyle, RouterScoring};

use crate::{Error, Result};

/// Hyper-parameters of a Llama-family decoder (names as in llama2.c's `Config` and Hugging
/// Face's `LlamaConfig`). Serialised as JSON into .flm files; new fields get a serde default
/// so older files stay readable.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelConfig {
    /// Hidden size (`hidden_size`, llama2.c `dim`).
    pub dim: usize,
    /// Feed-forward inner size (`intermediate_size`, llama2.c `hidden_dim`).
    pub hidden_dim: usize,
    /// Number of transformer layers.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (GQA); divides `n_heads`.
    pub n_kv_heads: usize,
    /// Dimensions per head (usually `dim / n_heads`).
    pub head_dim: usize,
    /// Vocabulary size: rows of the embedding table and of the classifier.
    pub vocab_size: usize,
    /// Context length: positions the KV cache and RoPE table hold.
    pub max_seq_len: usize,
    /// RMSNorm epsilon.
    pub norm_eps: f32,
    /// RoPE base θ (10000 for Llama 2).
    pub rope_theta: f32,
    /// RoPE pairing convention of the checkpoint's q/k weights.
    pub rope_style: RopeStyle,
    /// Whether the classifier reuses the embedding table.
    pub tie_embeddings: bool,
    /// Begin-of-sequence token, if the model has one.
    pub bos_token_id: Option<u32>,
    /// Tokens that end generation.
    pub eos_token_ids: Vec<u32>,
    /// The graph that runs the model. Fields from here on are absent from files written
    /// before ChatGLM support and take the values of a plain Llama.
    #[serde(default)]
    pub arch: Arch,
    /// Rotated dimensions per head; `None`: all of them (ChatGLM2/3 and GLM-4 rotate half).
    #[serde(default)]
    pub rotary_dim: Option<usize>,
    /// ALiBi (Press et al. 2022) instead of RoPE (Baichuan-13B).
    #[serde(default)]
    pub alibi: bool,
    /// Biases on the query, key and value projections (ChatGLM2/3, GLM-4, InternLM).
    #[serde(default)]
    pub qkv_bias: bool,
    /// Bias on the attention output projection (InternLM).
    #[serde(default)]
    pub o_bias: bool,
    /// Length of the P-tuning v2 prefix (Liu et al. 2022) held before the sequence in the
    /// KV cache; 0 without one.
    #[serde(default)]
    pub pre_seq_len: usize,
    /// Rescaled RoPE frequencies (`rope_scaling`: Llama 3.1's, linear, LongRoPE, YaRN);
    /// `None`: plain RoPE.
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    /// Sliding-window attention (Mistral): each token attends to at most this many
    /// positions, its own included; `None`: the whole causal prefix.
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// RMSNorm over each query head and each key head, after the projections and before
    /// RoPE, with gains of `head_dim` (Qwen3's `q_norm` / `k_norm`).
    #[serde(default)]
    pub qk_norm: bool,
    /// The feed-forward gate's activation: SiLU (SwiGLU) or tanh-approximated GELU
    /// (GeGLU, Gemma's `gelu_pytorch_tanh`).
    #[serde(default)]
    pub activation: Activation,
    /// Multiplies the embeddings before the first layer (Gemma: `√hidden_size`, rounded to
    /// f32); `None`: 1.
    #[serde(default)]
    pub embed_scale: Option<f32>,
    /// RMSNorms of the attention output and of the feed-forward output before their
    /// residual adds (Gemma 2 and 3: `post_attention_layernorm`,
    /// `post_feedforward_layernorm`).
    #[serde(default)]
    pub post_norms: bool,
    /// Multiplies the attention scores instead of `1 / √head_dim` (Gemma:
    /// `query_pre_attn_scalar^-0.5`).
    #[serde(default)]
    pub attention_scale: Option<f32>,
    /// Soft-capping of the attention scores, `cap · tanh(s / cap)` (Gemma 2's
    /// `attn_logit_softcapping`).
    #[serde(default)]
    pub attn_softcap: Option<f32>,
    /// Soft-capping of the logits (Gemma 2's `final_logit_softcapping`).
    #[serde(default)]
    pub final_softcap: Option<f32>,
    /// Which layers use `sliding_window` (Gemma 2 and 3 alternate sliding-window and
    /// global layers: transformers' `layer_types`); `None`: every layer.
    #[serde(default)]
    pub sliding_layers: Option<Vec<bool>>,
    /// RoPE base θ of the sliding-window layers, which rotate without `rope_scaling`
    /// (Gemma 3's `rope_local_base_freq`); `None`: the layers share one RoPE.
    #[serde(default)]
    pub rope_local_theta: Option<f32>,
    /// RMSNorm gains are stored as `w` for a gain of `1 + w`, added in f32 at load
    /// (Gemma's `GemmaRMSNorm`; GGUF files hold the sum already).
    #[serde(default)]
    pub norm_unit_offset: bool,
    /// The routed experts that replace the feed-forward of some layers (Mixtral,
    /// Qwen3-MoE); `None`: every layer has the dense feed-forward of `hidden_dim`.
    #[serde(default)]
    pub moe: Option<MoeConfig>,
    /// Multi-head latent attention (DeepSeek-V2/V3) in place of grouped-query attention;
    /// `None`: the q, k and v projections. With it `n_kv_heads` is 1 (the latent head),
    /// `head_dim` is the width of a value head (`v_head_dim`) and `rotary_dim` that of the
    /// rotated part of a query or key head (`qk_rope_head_dim`).
    #[serde(default)]
    pub mla: Option<MlaConfig>,
    /// Multi-token-prediction layers after the `n_layers` (DeepSeek-V3 and GLM-4.5's
    /// `num_nextn_predict_layers`, whose weights the checkpoint holds): each a transformer
    /// layer of the model's kind behind a projection of the token's embedding and the
    /// previous hidden state, drafting the token after next for speculative decoding
    /// ([`crate::speculative`]); 0 without.
    #[serde(default)]
    pub mtp_layers: usize,
    /// One learned attention-sink logit per query head joins each softmax's denominator
    /// (gpt-oss's `self_attn.sinks`, [`flm_core::AttentionOperands::sinks`]).
    #[serde(default)]
    pub attn_sinks: bool,
}

/// Multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2", §2.1; transformers'
/// `DeepseekV2Attention`). Each token's keys and values are compressed into one latent
/// vector `c = RMSNorm(W_DKV · x)` of `kv_lora_rank`, beside one rotated key `k_rope` of
/// `qk_rope_head_dim` shared by the heads; the KV cache holds only these two. Head `h`'s key
/// is `[W_UK_h · c, k_rope]` and its value `W_UV_h · c` (`kv_b_proj`'s rows of the head);
/// its query `[q_nope, q_rope]` comes from `q_proj`, or through a compressed query
/// (`q_a_proj`, its RMSNorm, `q_b_proj`).
///
/// flm runs the absorbed form (§2.1.2, as llama.cpp's and FlashMLA's decode): `W_UK_h` is
/// folded into the query (`q_lat = W_UK_hᵀ · q_nope`), attention runs over the cached
/// latents, which are also the values, and `W_UV_h` maps each head's output back.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MlaConfig {
    /// Rank of the compressed query (`q_lora_rank`); `None`: the plain `q_proj`
    /// (DeepSeek-V2-Lite).
    pub q_lora_rank: Option<usize>,
    /// Width of the cached latent (`kv_lora_rank`, 512 in DeepSeek-V2 and V3).
    pub kv_lora_rank: usize,
    /// Width of the part of a query or key head without RoPE (`qk_nope_head_dim`).
    pub qk_nope_head_dim: usize,
    /// Width of the rotated part (`qk_rope_head_dim`), shared by the heads of a key.
    pub qk_rope_head_dim: usize,
}

impl MlaConfig {
    /// The width of a query or key head, `qk_nope_head_dim + qk_rope_head_dim`.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// What multiplies the scores: `qk_head_dim^-0.5`, times YaRN's `mscale_all_dim` factor
    /// squared under a YaRN `rope_scaling` (transformers' `yarn_apply_mscale`).
    pub fn attention_scale(&self, rope_scaling: Option<&RopeScaling>) -> f32 {
        let mscale = match rope_scaling {
            Some(RopeScaling::Yarn(y)) => y.softmax_scale_factor(),
            _ => 1.0,
        };
        (self.qk_head_dim() as f64).powf(-0.5) as f32 * mscale
    }

    /// The rows of a fused query projection of `n_heads` heads (`q_proj` or `q_b_proj`,
    /// each head's part without RoPE, then its rotated part) that hold the parts without
    /// RoPE and the rotated parts, head by head.
    pub fn query_rows(&self, n_heads: usize) -> [Vec<Range<usize>>; 2] {
        let (nope, head) = (self.qk_nope_head_dim, self.qk_head_dim());
        [
            (0..n_heads).map(|h| h * head..h * head + nope).collect(),
            (0..n_heads)
                .map(|h| h * head + nope..(h + 1) * head)
                .collect(),
        ]
    }

    /// The rows of `kv_a_proj_with_mqa` that hold the latent's projection and the rotated
    /// key's.
    pub fn kv_a_rows(&self) -> [Range<usize>; 2] {
        let rank = self.kv_lora_rank;
        [0..rank, rank..rank + self.qk_rope_head_dim]
    }
}

/// The activation of the feed-forward gate: `output = act(gate) · up`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// SiLU (SwiGLU; Llama).
    #[default]
    Silu,
    /// GELU in its tanh approximation (GeGLU; Gemma).
    GeluTanh,
}

/// A mixture-of-experts feed-forward (Shazeer et al. 2017; Mixtral, Jiang et al. 2024;
/// Qwen3-MoE): see [`flm_core::Op::MoeFfn`] for the routing.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MoeConfig {
    /// Experts per MoE layer (`num_local_experts`, Qwen3-MoE's `num_experts`).
    pub n_experts: usize,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub top_k: usize,
    /// Inner width of each expert's SwiGLU (Qwen3-MoE's `moe_intermediate_size`, Mixtral's
    /// `intermediate_size`).
    pub expert_dim: usize,
    /// Whether the top-k routing probabilities are divided by their sum (always for
    /// Mixtral, Qwen3-MoE's `norm_topk_prob`).
    pub renormalize: bool,
    /// Layers whose feed-forward is the dense one of `hidden_dim` (Qwen3-MoE's
    /// `mlp_only_layers`, and the layers `decoder_sparse_step` skips), ascending.
    #[serde(default)]
    pub dense_layers: Vec<usize>,
    /// Inner width of the shared expert that every token of a MoE layer also runs, its
    /// output added to the routed experts' (Qwen2-MoE's `shared_expert_intermediate_size`,
    /// DeepSeek's `moe_intermediate_size · n_shared_experts`); `None`: no shared expert.
    #[serde(default)]
    pub shared_expert_dim: Option<usize>,
    /// Whether the shared expert's output is weighted by `σ(shared_expert_gate · x)`
    /// (Qwen2-MoE) rather than added as it is (DeepSeek).
    #[serde(default = "yes")]
    pub shared_expert_gated: bool,
    /// How the router scores the experts: a softmax (Mixtral, Qwen, DeepSeek-V2) or a
    /// sigmoid per expert (DeepSeek-V3, GLM-4.5).
    #[serde(default)]
    pub scoring: RouterScoring,
    /// The experts chosen only from the best groups (DeepSeek's `n_group` and
    /// `topk_group`); `None`: from all of them.
    #[serde(default)]
    pub groups: Option<ExpertGroups>,
    /// Whether each MoE layer's router has a bias added to the scores to choose the experts,
    /// not to weigh them (DeepSeek-V3's `e_score_correction_bias`, `[n_experts]`).
    #[serde(default)]
    pub choice_bias: bool,
    /// Multiplies the routing weights (DeepSeek's `routed_scaling_factor`).
    #[serde(default = "one")]
    pub routed_scale: f32,
    /// Whether each MoE layer's router has a bias added to its logits, choosing and weighing
    /// (gpt-oss's `router.bias`, `[n_experts]`).
    #[serde(default)]
    pub logit_bias: bool,
    /// Whether each expert's gate, up and down projections have biases (gpt-oss).
    #[serde(default)]
    pub expert_biases: bool,
    /// How the experts gate their up projections: SwiGLU, or gpt-oss's clamped SwiGLU.
    #[serde(default)]
    pub activation: ExpertActivation,
}

/// `true`, the default of [`MoeConfig::shared_expert_gated`] in files written before it.
fn yes() -> bool {
    true
}

/// `1.0`, the default of [`MoeConfig::routed_scale`] in files written before it.
fn one() -> f32 {
    1.0
}

impl MoeConfig {
    /// Top-k routing of `n_experts` experts of `expert_dim` as Mixtral and Qwen route: a
    /// softmax, the probabilities renormalised or not, every layer routed, no shared expert,
    /// groups, bias or scale.
    pub fn softmax_top_k(
        n_experts: usize,
        top_k: usize,
        expert_dim: usize,
        renormalize: bool,
    ) -> MoeConfig {
        MoeConfig {
            n_experts,
            top_k,
            expert_dim,
            renormalize,
            dense_layers: Vec::new(),
            shared_expert_dim: None,
            shared_expert_gated: true,
            scoring: RouterScoring::Softmax,
            groups: None,
            choice_bias: false,
            routed_scale: 1.0,
            logit_bias: false,
            expert_biases: false,
            activation: ExpertActivation::SwiGlu,
        }
    }
}

impl ModelConfig {
    /// The experts of layer `l`, or `None` when its feed-forward is dense.
    pub fn moe_layer(&self, l: usize) -> Option<&MoeConfig> {
        self.moe
            .as_ref()
            .filter(|m| m.dense_layers.binary_search(&l).is_err())
    }
}

impl Default for ModelConfig {
    /// A plain Llama 2 decoder of no size (llama2.c's defaults: ε = 1e-5, RoPE θ = 10000 on
    /// adjacent pairs, untied classifier, no biases), which [`ModelConfig::validate`]
    /// refuses: importers set the dimensions, the vocabulary, the context and what their
    /// family changes, and take the rest from here.
    fn default() -> Self {
        ModelConfig {
            dim: 0,
            hidden_dim: 0,
            n_layers: 0,
            n_heads: 0,
            n_kv_heads: 0,
            head_dim: 0,
            vocab_size: 0,
            max_seq_len: 0,
            norm_eps: 1e-5,
            rope_theta: 10000.0,
            rope_style: RopeStyle::AdjacentPairs,
            tie_embeddings: false,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
            arch: Arch::Llama,
            rotary_dim: None,
            alibi: false,
            qkv_bias: false,
            o_bias: false,
            pre_seq_len: 0,
            rope_scaling: None,
            sliding_window: None,
            qk_norm: false,
            activation: Activation::Silu,
            embed_scale: None,
            post_norms: false,
            attention_scale: None,
            attn_softcap: None,
            final_softcap: None,
            sliding_layers: None,
            rope_local_theta: None,
            norm_unit_offset: false,
            moe: None,
            mla: None,
            mtp_layers: 0,
            attn_sinks: false,
        }
    }
}

/// Which graph runs a model.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Arch {
    /// [`crate::llama::Llama`]: Llama, and by configuration ChatGLM2/3, GLM-4, Baichuan and
    /// InternLM.
    #[default]
    Llama,
    /// [`crate::chatglm::ChatGlm`]: ChatGLM-6B (GLM with LayerNorm, GELU, 2D RoPE and the
    /// prefix-LM mask).
    ChatGlm {
        /// The residual scale `alpha = sqrt(2 · num_layers)` (THUDM `GLMBlock`).
        residual_alpha: f32,
        /// `[MASK]`: the position the answer fills (used when `[gMASK]` is absent).
        mask_token_id: u32,
        /// `[gMASK]`: the generation mask.
        gmask_token_id: u32,
    },
}

/// Largest accepted dimension, head count, vocabulary or context length (2^24).
pub const MAX_SIZE: usize = 1 << 24;
/// Largest accepted number of layers.
pub const MAX_LAYERS: usize = 1 << 16;

impl ModelConfig {
    /// `n_kv_heads * head_dim`: the width of a key or value row.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// The widths of a row of each layer's two KV cache tensors: the keys and the values
    /// ([`ModelConfig::kv_dim`] each), or with multi-head latent attention the latent
    /// (`kv_lora_rank`) and the rotated key (`qk_rope_head_dim`).
    pub fn kv_widths(&self) -> (usize, usize) {
        match &self.mla {
            Some(m) => (m.kv_lora_rank, m.qk_rope_head_dim),
            None => (self.kv_dim(), self.kv_dim()),
        }
    }

    /// Values a layer's KV cache holds per position: the two widths of
    /// [`ModelConfig::kv_widths`] together (`2 · kv_dim`, or 576 for DeepSeek-V2's latent
    /// and rotated key against its 4096 expanded keys and values).
    pub fn kv_values_per_position(&self) -> usize {
        let (k, v) = self.kv_widths();
        k + v
    }

    /// The width of the heads the RoPE table rotates: `head_dim`, or with multi-head latent
    /// attention the rotated part alone (`qk_rope_head_dim`).
    pub fn rope_head_dim(&self) -> usize {
        self.mla
            .as_ref()
            .map_or(self.head_dim, |m| m.qk_rope_head_dim)
    }

    /// Rotated dimensions per head (`rotary_dim`, else `head_dim`).
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim.unwrap_or(self.head_dim)
    }

    /// The sliding window of layer `l`: `sliding_window` where `sliding_layers` (if given)
    /// marks the layer, else `None`.
    pub fn layer_window(&self, l: usize) -> Option<usize> {
        let sliding = self
            .sliding_layers
            .as_ref()
            .is_none_or(|layers| layers.get(l).copied().unwrap_or(false));
        self.sliding_window.filter(|_| sliding)
    }

    /// What multiplies the attention scores: `attention_scale`, else `1 / √head_dim`.
    pub fn attention_scale(&self) -> f32 {
        self.attention_scale
            .unwrap_or_else(|| 1.0 / (self.head_dim as f32).sqrt())
    }

    /// `n_heads * head_dim`: the width of a query row.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Checks that the numbers describe a runnable model.
    ///
    /// Errors: [`Error::Config`] naming the first problem.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("dim", self.dim),
            ("hidden_dim", self.hidden_dim),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_seq_len", self.max_seq_len),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(Error::Config(format!("{name} must be positive")));
        }
        // Bounds far above any real model, so that sizes computed from them cannot
        // overflow and a corrupted header is refused before anything is allocated.
        if let Some((name, v)) = positive.iter().find(|(_, v)| *v > MAX_SIZE) {
            return Err(Error::Config(format!("{name} = {v} exceeds {MAX_SIZE}")));
        }
        if self.n_layers > MAX_LAYERS {
            return Err(Error::Config(format!(
                "n_layers = {} exceeds {MAX_LAYERS}",
                self.n_layers
            )));
        }
        if self.mtp_layers > MAX_LAYERS - self.n_layers {
            return Err(Error::Config(format!(
                "n_layers = {} and mtp_layers = {} exceed {MAX_LAYERS}",
                self.n_layers, self.mtp_layers
            )));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(Error::Config(format!(
                "n_heads ({}) is not a multiple of n_kv_heads ({})",
                self.n_heads, self.n_kv_heads
            )));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(Error::Config(format!(
                "head_dim ({}) must be even for RoPE",
                self.head_dim
            )));
        }
        let rot = self.rotary_dim();
        if rot == 0 || !rot.is_multiple_of(2) || rot > self.rope_head_dim() {
            return Err(Error::Config(format!(
                "rotary_dim ({rot}) must be even, positive and at most the rotated heads' \
                 width ({})",
                self.rope_head_dim()
            )));
        }
        if let Some(m) = &self.mla {
            let sizes = [
                m.q_lora_rank.unwrap_or(1),
                m.kv_lora_rank,
                m.qk_nope_head_dim,
                m.qk_rope_head_dim,
            ];
            if sizes.iter().any(|&d| d == 0 || d > MAX_SIZE)
                || self.n_kv_heads != 1
                || rot != m.qk_rope_head_dim
                || !matches!(self.arch, Arch::Llama)
                || self.alibi
                || self.qk_norm
                || self.qkv_bias
                || self.pre_seq_len > 0
            {
                return Err(Error::Config(format!(
                    "multi-head latent attention {m:?} needs positive sizes, one KV head, \
                     RoPE on the whole rotated part, the Llama graph, and no ALiBi, q/k norm, \
                     q/k/v biases or p-tuning prefix"
                )));
            }
        }
        if self.pre_seq_len > MAX_SIZE {
            return Err(Error::Config(format!(
                "pre_seq_len = {} exceeds {MAX_SIZE}",
                self.pre_seq_len
            )));
        }
        if let Arch::ChatGlm { residual_alpha, .. } = self.arch {
            if !(residual_alpha > 0.0 && residual_alpha.is_finite()) {
                return Err(Error::Config(format!(
                    "invalid residual alpha {residual_alpha}"
                )));
            }
            let llama_only = self.rope_scaling.is_some()
                || self.sliding_window.is_some()
                || self.qk_norm
                || self.post_norms
                || self.embed_scale.is_some()
                || self.attn_softcap.is_some()
                || self.final_softcap.is_some()
                || self.rope_local_theta.is_some();
            if llama_only {
                return Err(Error::Config(
                    "the ChatGLM-6B graph has no RoPE scaling, sliding window, q/k norm, \
                     post-norms, embedding scale or soft-capping"
                        .into(),
                ));
            }
        }
        if let Some(m) = &self.moe {
            if m.n_experts == 0
                || m.n_experts > MAX_SIZE
                || m.expert_dim == 0
                || m.expert_dim > MAX_SIZE
            {
                return Err(Error::Config(format!(
                    "{} experts of inner width {}: both must be positive and at most {MAX_SIZE}",
                    m.n_experts, m.expert_dim
                )));
            }
            if let Some(d) = m.shared_expert_dim.filter(|&d| d == 0 || d > MAX_SIZE) {
                return Err(Error::Config(format!(
                    "shared expert of inner width {d}: must be positive and at most {MAX_SIZE}"
                )));
            }
            if m.top_k == 0 || m.top_k > m.n_experts {
                return Err(Error::Config(format!(
                    "top_k = {} must be in 1..={} (the experts)",
                    m.top_k, m.n_experts
                )));
            }
            if !(m.routed_scale > 0.0 && m.routed_scale.is_finite()) {
                return Err(Error::Config(format!(
                    "routed_scale must be positive and finite, got {}",
                    m.routed_scale
                )));
            }
            if let Some(g) = m.groups {
                let per_group = m.n_experts / g.n_groups.max(1);
                if g.n_groups == 0
                    || !m.n_experts.is_multiple_of(g.n_groups)
                    || g.top_groups == 0
                    || g.top_groups > g.n_groups
                    || m.top_k > g.top_groups * per_group
                {
                    return Err(Error::Config(format!(
                        "{} experts in {} groups, {} chosen, cannot route {} per token",
                        m.n_experts, g.n_groups, g.top_groups, m.top_k
                    )));
                }
            }
            if !m.dense_layers.windows(2).all(|w| w[0] < w[1]) {
                return Err(Error::Config("dense_layers must be ascending".into()));
            }
            if !matches!(self.arch, Arch::Llama) {
                return Err(Error::Config("experts are a Llama-graph feature".into()));
            }
        }
        if let Some(scaling) = &self.rope_scaling {
            scaling
                .validate()
                .map_err(|e| Error::Config(e.to_string()))?;
            if self.alibi {
                return Err(Error::Config("RoPE scaling on an ALiBi model".into()));
            }
        }
        match self.sliding_window {
            Some(0) => return Err(Error::Config("sliding_window must be positive".into())),
            Some(_) if self.pre_seq_len > 0 => {
                return Err(Error::Config(
                    "a sliding window with a p-tuning prefix is not supported".into(),
                ))
            }
            _ => {}
        }
        if let Some(layers) = &self.sliding_layers {
            if layers.len() != self.n_layers {
                return Err(Error::Config(format!(
                    "sliding_layers marks {} layers of {}",
                    layers.len(),
                    self.n_layers
                )));
            }
        }
        let positive = [
            ("embed_scale", self.embed_scale),
            ("attention_scale", self.attention_scale),
            ("attn_softcap", self.attn_softcap),
            ("final_softcap", self.final_softcap),
            ("rope_local_theta", self.rope_local_theta),
        ];
        if let Some((name, Some(v))) = positive
            .iter()
            .find(|(_, v)| v.is_some_and(|v| !(v > 0.0 && v.is_finite())))
        {
            return Err(Error::Config(format!(
                "{name} must be positive and finite, got {v}"
            )));
        }
        if self.attn_softcap.is_some() && self.alibi {
            return Err(Error::Config(
                "attention soft-capping with ALiBi is not supported".into(),
            ));
        }
        if !(self.norm_eps >= 0.0 && self.norm_eps.is_finite()) {
            return Err(Error::Config(format!("invalid norm eps {}", self.norm_eps)));
        }
        if !(self.rope_theta > 0.0 && self.rope_theta.is_finite()) {
            return Err(Error::Config(format!(
                "invalid rope theta {}",
                self.rope_theta
            )));
        }
        let too_large = [
            ("bos_token_id", self.bos_token_id),
            ("eos_token_id", self.eos_token_ids.iter().copied().max()),
        ];
        for (name, id) in too_large {
            if let Some(id) = id.filter(|&id| id as usize >= self.vocab_size) {
                return Err(Error::Config(format!(
                    "{name} {id} is outside the vocabulary of {}",
                    self.vocab_size
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flm_core::Llama3Scaling;

    /// A configuration written before the ChatGLM fields existed reads as a plain Llama, and
    /// a ChatGLM-6B one round-trips through JSON as .flm files store it.
    #[test]
    fn older_configs_read_as_llama_and_chatglm_round_trips() {
        let old = r#"{"dim": 64, "hidden_dim": 172, "n_layers": 5, "n_heads": 8,
            "n_kv_heads": 4, "head_dim": 8, "vocab_size": 512, "max_seq_len": 512,
            "norm_eps": 1e-5, "rope_theta": 10000.0, "rope_style": "rotate_half",
            "tie_embeddings": true, "bos_token_id": 1, "eos_token_ids": [2]}"#;
        let mut c: ModelConfig = serde_json::from_str(old).unwrap();
        assert_eq!(c.arch, Arch::Llama);
        assert_eq!(c.rotary_dim(), 8);
        assert!(!c.alibi && !c.qkv_bias && !c.o_bias && c.pre_seq_len == 0);
        c.validate().unwrap();
        c.arch = Arch::ChatGlm {
            residual_alpha: 7.483_315,
            mask_token_id: 3,
            gmask_token_id: 4,
        };
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["arch"]["kind"], "chat_glm");
        assert_eq!(serde_json::from_value::<ModelConfig>(json).unwrap(), c);
        c.rotary_dim = Some(3);
        assert!(c.validate().is_err());
    }

    /// The family fields round-trip as .flm files store them, and the combinations the
    /// graphs cannot run are refused.
    #[test]
    fn family_fields_round_trip_and_bad_combinations_are_refused() {
        let text = r#"{"dim": 64, "hidden_dim": 128, "n_layers": 2, "n_heads": 4,
            "n_kv_heads": 2, "head_dim": 16, "vocab_size": 256, "max_seq_len": 128,
            "norm_eps": 1e-5, "rope_theta": 500000.0, "rope_style": "rotate_half",
            "tie_embeddings": false, "bos_token_id": 1, "eos_token_ids": [2],
            "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            "sliding_window": 8}"#;
        let c: ModelConfig = serde_json::from_str(text).unwrap();
        c.validate().unwrap();
        assert_eq!(c.sliding_window, Some(8));
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(serde_json::from_value::<ModelConfig>(json).unwrap(), c);
        let refused = |edit: fn(&mut ModelConfig), needle: &str| {
            let mut bad = c.clone();
            edit(&mut bad);
            let err = bad.validate().unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        };
        refused(|c| c.sliding_window = Some(0), "sliding_window");
        refused(|c| c.pre_seq_len = 4, "p-tuning");
        refused(|c| c.alibi = true, "ALiBi");
        refused(
            |c| {
                c.arch = Arch::ChatGlm {
                    residual_alpha: 2.0,
                    mask_token_id: 3,
                    gmask_token_id: 4,
                }
            },
            "ChatGLM-6B",
        );
        refused(
            |c| {
                c.rope_scaling = Some(RopeScaling::Llama3(Llama3Scaling {
                    factor: 0.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 64,
                }))
            },
            "factor",
        );
    }
}
