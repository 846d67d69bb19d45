//! The typed operations that model graphs are built from.
//!
//! Activations are f32 tensors seen as matrices `[rows, cols]` (rows = tokens); weights may
//! be f32, f16 or bf16. Each variant documents its shapes and the math it computes; devices
//! check shapes and return [`crate::Error::Shape`] on a mismatch.

use crate::{Data, RopeTable, SamplerConfig};

/// How attention weighs the cache rows, for [`Op::Attention`] and [`Op::PagedAttention`]
/// and every device's kernels: grouped-query heads, the score scale, the ALiBi bias,
/// soft-capping and the mask.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads; divides `n_heads` (GQA, Ainslie et al. 2023).
    pub n_kv_heads: usize,
    /// Multiplies the scores, usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// Adds the ALiBi bias `m_h · t` for cache row `t` (Press et al. 2022; Baichuan-13B).
    pub alibi: bool,
    /// Soft-capping of the scaled scores before the bias and the softmax (Gemma 2's
    /// `attn_logit_softcapping`): `s ← cap · tanh(s / cap)`. `None`: none; must be
    /// positive and finite.
    pub softcap: Option<f32>,
    /// Cache rows `0..bidirectional` are seen by every row: the prefix-LM mask of GLM
    /// (Du et al. 2022; ChatGLM-6B's prompt up to `sop`). 0 for a purely causal mask; at
    /// most the last row's position + 1.
    pub bidirectional: usize,
    /// Sliding-window attention (Beltagy et al. 2020; Mistral, Jiang et al. 2023): each
    /// row sees at most this many positions, its own included. `None`: unlimited. Must be
    /// positive, and is refused together with a `bidirectional` prefix.
    pub sliding_window: Option<usize>,
}

impl AttentionParams {
    /// Plain causal attention: `n_heads` query heads over `n_kv_heads` KV heads, scores
    /// times `scale`, no bias, no soft-capping, no prefix, no window.
    pub fn causal(n_heads: usize, n_kv_heads: usize, scale: f32) -> AttentionParams {
        AttentionParams {
            n_heads,
            n_kv_heads,
            scale,
            alibi: false,
            softcap: None,
            bidirectional: 0,
            sliding_window: None,
        }
    }
}

/// The operands of [`Op::Attention`] and [`Op::PagedAttention`]: the new rows' queries, the
/// keys and values they attend to, how heads, scale, bias and mask combine, and the output.
///
/// The values may be narrower than the keys (`v_head_dim ≤ head_dim`), and may be the keys
/// themselves (`cache_v` the same tensor as `cache_k`): multi-head latent attention in its
/// absorbed form (DeepSeek-V2, DeepSeek-AI 2024, §2.1) attends over one latent head that
/// is both the key (with [`DecoupledRope`]) and the value.
#[derive(Debug)]
pub struct AttentionOperands<'a> {
    /// f32 `[n, n_heads * head_dim]`.
    pub q: &'a Data,
    /// f32 or f16 `[rows, n_kv_heads * head_dim]`: the layer's key cache
    /// ([`Op::Attention`]) or key pool ([`Op::PagedAttention`]).
    pub cache_k: &'a Data,
    /// `cache_k`'s dtype, `[rows, n_kv_heads * v_head_dim]`: the values.
    pub cache_v: &'a Data,
    /// A second part of every query and key head, added to the scores and with no values.
    pub rope: Option<DecoupledRope<'a>>,
    /// Heads, scale, bias and mask.
    pub params: AttentionParams,
    /// Attention sinks (gpt-oss): f32 `[n_heads]`, in the memory of `q`, one learned logit
    /// per query head that joins the softmax's denominator and has no value. For query head
    /// `h` with scores `s_t` over the positions it sees (after the scale, soft-capping, the
    /// ALiBi bias and the mask), `p_t = e^(s_t − M) / (e^(sink_h − M) + Σ_t e^(s_t − M))`
    /// with `M = max(sink_h, max_t s_t)`, and `output = Σ_t p_t·v_t` (transformers'
    /// `modeling_gpt_oss.py`, `eager_attention_forward`: the sinks are a last column of the
    /// logits, dropped after the softmax). Each value finite or −∞ (no sink, as `None`).
    /// `None`: no sinks.
    pub sinks: Option<&'a Data>,
    /// f32 `[n, n_heads * v_head_dim]`.
    pub output: &'a mut Data,
}

/// The decoupled RoPE part of multi-head latent attention (DeepSeek-V2, §2.1.3): each query
/// head has `rope_dim` more values and each KV head a shared rotated key of `rope_dim`, and
/// the score of query head `h` at cache row `t` is `(q_h · k_t + q_rope_h · k_rope_t) · scale`.
#[derive(Debug, Clone, Copy)]
pub struct DecoupledRope<'a> {
    /// f32 `[n, n_heads * rope_dim]`, the rows of [`AttentionOperands::q`].
    pub q: &'a Data,
    /// `cache_k`'s dtype, `[rows, n_kv_heads * rope_dim]`: the rotated keys, in the rows of
    /// the caches.
    pub cache: &'a Data,
}

/// One operation, borrowing its inputs and its output.
#[derive(Debug)]
pub enum Op<'a> {
    /// `output[i, :] = table[tokens[i], :]`.
    ///
    /// `table`: `[vocab, dim]` (any float dtype); `output`: f32 `[tokens.len(), dim]`.
    /// Errors on a token id `>= vocab`.
    Embedding {
        /// Embedding table `[vocab, dim]`.
        table: &'a Data,
        /// Token ids, in host memory or in a tensor.
        tokens: TokenIds<'a>,
        /// f32 `[tokens.len(), dim]`.
        output: &'a mut Data,
    },
    /// RMSNorm (Zhang & Sennrich 2019), per row:
    /// `output = input / sqrt(mean(input²) + eps) * weight`.
    ///
    /// `input`, `output`: f32 `[n, dim]`; `weight`: `[dim]`.
    RmsNorm {
        /// f32 `[n, dim]`.
        input: &'a Data,
        /// Gain `[dim]`.
        weight: &'a Data,
        /// Added to the mean square (1e-5 in Llama 2, 1e-6 in many HF configs).
        eps: f32,
        /// f32 `[n, dim]`.
        output: &'a mut Data,
    },
    /// Linear layer as `torch.nn.Linear`: `output[n, out] = input[n, in] · weight[out, in]ᵀ
    /// (+ bias[out])`. With `n == 1` this is the decode matrix × vector product, with
    /// `n > 1` the prefill matrix × matrix product. A weight with an input permutation
    /// ([`Data::input_perm`], act-order GPTQ) multiplies the gathered input:
    /// `output[n, out] = input[n, perm] · weightᵀ`, the device gathering each row first.
    Linear {
        /// f32 `[n, in]`.
        input: &'a Data,
        /// `[out, in]`, f32, f16, bf16 or a quantised dtype, with an optional i32 `[in]`
        /// input permutation ([`Data::input_perm`]).
        weight: &'a Data,
        /// Optional `[out]`.
        bias: Option<&'a Data>,
        /// f32 `[n, out]`.
        output: &'a mut Data,
    },
    /// Several Linear layers over the same input, such as the Q, K and V projections or
    /// the gate and up projections of a SwiGLU feed-forward: for each part `p`,
    /// `parts[p].output = input · parts[p].weight ᵀ (+ parts[p].bias)`, each with the
    /// shapes and the bits of [`Op::Linear`]. A device may quantise the input once and
    /// split the rows of every part over its threads at once, so that decode pays for one
    /// fork and join instead of one per part.
    Linears {
        /// f32 `[n, in]`.
        input: &'a Data,
        /// The layers: weights `[out_p, in]`, optional biases `[out_p]`, f32 outputs
        /// `[n, out_p]`.
        parts: &'a mut [LinearPart<'a>],
    },
    /// One [`Op::Linear`] per head (a matrix product batched over heads, `torch.bmm`): for
    /// head `h`, `output[:, h·out..(h + 1)·out] = input[:, h·in..(h + 1)·in] · weights[h]ᵀ`,
    /// each with the bits of [`Op::Linear`]. Multi-head latent attention applies its
    /// absorbed projections so (DeepSeek-V2, §2.1.2): `W_UK` of each head folded into its
    /// query, `W_UV` to its output.
    HeadLinear {
        /// f32 `[n, heads · in]`.
        input: &'a Data,
        /// One `[out, in]` weight per head, each of a weight dtype of [`Op::Linear`].
        weights: &'a [Data],
        /// f32 `[n, heads · out]`.
        output: &'a mut Data,
    },
    /// Rotary position embedding (Su et al. 2021, RoFormer) applied in place to each head of
    /// each row; row `i` is at position `start_pos + i`. The table fixes the style (adjacent
    /// pairs or rotate-half), the rotated dimensions and the frequencies.
    Rope {
        /// f32 `[n, n_heads * head_dim]`, rotated in place.
        x: &'a mut Data,
        /// Precomputed cos/sin values.
        table: &'a RopeTable,
        /// Number of heads in a row.
        n_heads: usize,
        /// Position of row 0.
        start_pos: usize,
    },
    /// Copies rows: `dst[dst_row + r, :] = src[src_row + r, :]` for `r < n_rows`. Used to
    /// store keys and values in the KV cache and to pick the last row of a prefill. Into an
    /// f16 `dst` each value is rounded to the nearest f16, ties to even (`half`'s
    /// `f16::from_f32`, as llama.cpp's f16 cache).
    CopyRows {
        /// `(src, src_row)`: f32 `[_, cols]` and the first row read.
        src: (&'a Data, usize),
        /// `(dst, dst_row)`: f32 or f16 `[_, cols]` and the first row written.
        dst: (&'a mut Data, usize),
        /// Rows copied.
        n_rows: usize,
    },
    /// Causal scaled dot-product attention (Vaswani et al. 2017) with grouped-query
    /// attention (Ainslie et al. 2023): query head `h` reads KV head
    /// `h / (n_heads / n_kv_heads)`. Row `i` of `q` is at position `p = start_pos + i` and
    /// attends to cache rows `0..max(p + 1, bidirectional)`, or with a `sliding_window` of
    /// `w` to the last `w` of them, `p + 1 − w..p + 1` (Mistral; transformers'
    /// `sliding_window_overlay`: key `t` is seen when `t > p − w`):
    /// `output = softmax(q·Kᵀ · scale + bias) · V`, where `bias` is 0, or with `alibi` the
    /// ALiBi term `m_h · t` for cache row `t` (Press et al. 2022; slopes from
    /// [`crate::alibi_slopes`]; the `−m_h · p` part of `m_h · (t − p)` is the same for the
    /// whole row and cancels in the softmax).
    Attention {
        /// The caches hold `[max_seq, n_kv_heads * head_dim]`, rows `0..start_pos + n`
        /// filled.
        operands: AttentionOperands<'a>,
        /// Position of row 0 of `q`.
        start_pos: usize,
    },
    /// [`Op::Attention`] over a paged KV cache ([`crate::PagedKvCache`]; Kwon et al. 2023,
    /// vLLM's PagedAttention) for a batch of sequences at once. The rows of `q` are the
    /// sequences' rows one after the other, `seqs[s].n_rows` each; row `i` of sequence `s` is
    /// at cache position `p = seqs[s].start_pos + i` and attends to its positions
    /// `0..p + 1` (the last `sliding_window` of them with a window), position `t` being pool
    /// row `blocks[t / block_size] · block_size + t % block_size`. Masking, GQA, scale and
    /// ALiBi are those of [`Op::Attention`] (with no bidirectional prefix); each
    /// row's result is computed exactly as [`Op::Attention`] computes it over a contiguous
    /// cache holding the same values.
    PagedAttention {
        /// `q` and `output` of `Σ n_rows` rows; the caches are the layer's pools,
        /// `[n_blocks * block_size, n_kv_heads * head_dim]`; `params.bidirectional` must be
        /// 0.
        operands: AttentionOperands<'a>,
        /// Positions per block.
        block_size: usize,
        /// The sequences, in the order of their rows in `q`.
        seqs: &'a [PagedSeq<'a>],
    },
    /// Scatters rows: `dst[rows[r], :] = src[r, :]` for every row `r` of `src` (vLLM's
    /// `reshape_and_cache`: new keys and values into their slots of a paged KV pool), rounded
    /// to the nearest f16 into an f16 `dst` as [`Op::CopyRows`].
    ScatterRows {
        /// f32 `[rows.len(), cols]`.
        src: &'a Data,
        /// The destination row of each source row.
        rows: &'a [u32],
        /// f32 or f16 `[_, cols]`.
        dst: &'a mut Data,
    },
    /// [`Op::Rope`] with a position per row: row `i` is rotated at `positions[i]` (the rows
    /// of a batch of sequences, each at its own positions).
    RopeRows {
        /// f32 `[positions.len(), n_heads * head_dim]`, rotated in place.
        x: &'a mut Data,
        /// Precomputed cos/sin values.
        table: &'a RopeTable,
        /// Number of heads in a row.
        n_heads: usize,
        /// The position of each row.
        positions: &'a [u32],
    },
    /// LayerNorm (Ba et al. 2016), per row:
    /// `output = (input − mean) / sqrt(var + eps) * weight + bias`, `var` the biased variance.
    ///
    /// `input`, `output`: f32 `[n, dim]`; `weight`, `bias`: `[dim]`.
    LayerNorm {
        /// f32 `[n, dim]`.
        input: &'a Data,
        /// Gain `[dim]`.
        weight: &'a Data,
        /// Shift `[dim]`.
        bias: &'a Data,
        /// Added to the variance (1e-5 in ChatGLM-6B).
        eps: f32,
        /// f32 `[n, dim]`.
        output: &'a mut Data,
    },
    /// GELU with the tanh approximation (Hendrycks & Gimpel 2016), in place:
    /// `x = 0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³)))`, as ChatGLM-6B's `gelu_impl`.
    Gelu {
        /// f32, any shape.
        x: &'a mut Data,
    },
    /// `x *= alpha` in place (ChatGLM-6B's scaled residual).
    Scale {
        /// f32, any shape.
        x: &'a mut Data,
        /// The factor.
        alpha: f32,
    },
    /// ChatGLM-6B's two-dimensional RoPE (Du et al. 2022, GLM; THUDM `modeling_chatglm.py`),
    /// in place: each head of `x` is two halves of `table.head_dim()` dimensions, rotated
    /// (in `table`'s style) at `positions[i]` for the first half and `block_positions[i]`
    /// for the second, for row `i`.
    Rope2d {
        /// f32 `[n, n_heads * 2 * table.head_dim()]`.
        x: &'a mut Data,
        /// cos/sin of one half (`rotary_dim == head_dim`).
        table: &'a RopeTable,
        /// Number of heads in a row.
        n_heads: usize,
        /// `n` positions of the first halves.
        positions: &'a [u32],
        /// `n` positions of the second halves.
        block_positions: &'a [u32],
    },
    /// SwiGLU gate (Shazeer 2020): `output = silu(gate) * up`, `silu(x) = x / (1 + e^-x)`.
    SiluMul {
        /// f32 `[n, hidden]`.
        gate: &'a Data,
        /// f32 `[n, hidden]`.
        up: &'a Data,
        /// f32 `[n, hidden]`.
        output: &'a mut Data,
    },
    /// GeGLU gate (Shazeer 2020; Gemma's MLP with `gelu_pytorch_tanh`):
    /// `output = gelu(gate) * up`, GELU in the tanh approximation of [`Op::Gelu`].
    GeluMul {
        /// f32 `[n, hidden]`.
        gate: &'a Data,
        /// f32 `[n, hidden]`.
        up: &'a Data,
        /// f32 `[n, hidden]`.
        output: &'a mut Data,
    },
    /// Soft-capping in place (Gemma 2's `final_logit_softcapping`): `x = cap · tanh(x / cap)`.
    SoftCap {
        /// f32, any shape.
        x: &'a mut Data,
        /// The cap; positive and finite.
        cap: f32,
    },
    /// Residual add in place: `x += y`; both f32 of the same shape.
    Add {
        /// Accumulator.
        x: &'a mut Data,
        /// Added values.
        y: &'a Data,
    },
    /// Sigmoid-gated residual add in place, per row: `x[i, :] += σ(gate[i]) · y[i, :]`,
    /// `σ(g) = 1 / (1 + e^-g)` (Qwen2-MoE's `shared_expert_gate`, transformers'
    /// `Qwen2MoeSparseMoeBlock`: `sigmoid(shared_expert_gate(x)) * shared_expert(x)`).
    GatedAdd {
        /// f32 `[n, cols]`: the accumulator.
        x: &'a mut Data,
        /// f32 `[n, cols]`: the added rows.
        y: &'a Data,
        /// f32 `[n, 1]`: each row's gate logit.
        gate: &'a Data,
    },
    /// A routed mixture-of-experts SwiGLU feed-forward (Shazeer et al. 2017; Mixtral, Jiang
    /// et al. 2024; Qwen3-MoE; DeepSeek-V2/V3; GLM-4.5), as transformers 5's
    /// `MixtralSparseMoeBlock`, `Qwen3MoeSparseMoeBlock`, `DeepseekV2Moe`, `DeepseekV3MoE`
    /// and `Glm4MoeMoE` compute their routed experts. For each row `x` of `input`, in f32,
    /// with the parameters of `routing` ([`MoeRouting`]):
    ///
    /// ```text
    /// l   = router · x (+ logit_bias)
    /// s   = softmax(l) over all experts,  or σ(l) per expert  (scoring)
    /// c   = s + choice_bias                        (c = s without a bias)
    /// G   = the top_groups groups of largest group score of c   (every expert without groups)
    /// E   = the top_k experts of G of largest c    (the lower index first on ties)
    /// w_e = scale · s_e / Σ_{e' ∈ E} s_e'          if renormalize,  else scale · s_e
    /// out = Σ_{e ∈ E, ascending e} w_e · (down_e · act(gate_e · x + b_gate, up_e · x + b_up) + b_down)
    /// ```
    ///
    /// with the expert biases where the experts have them (gpt-oss) and `act` the
    /// [`ExpertActivation`].
    ///
    /// Groups are `n_groups` runs of consecutive experts, scored by their largest `c`
    /// ([`GroupScore::Max`]) or by the sum of their two largest ([`GroupScore::SumOfTop2`]),
    /// the lower group first on ties. With sigmoid scores the renormalising sum is
    /// `Σ s_e' + 1e-20`, as DeepSeek-V3 and GLM-4.5 write it.
    ///
    /// Mixtral and gpt-oss always renormalise (the same as a softmax over the top-k logits,
    /// transformers' `GptOssTopKRouter`); Qwen3-MoE
    /// does iff `norm_topk_prob` ([`MoeRouting::softmax`]). A device computes each expert
    /// over the rows routed to it at once (one matrix product per projection), so that a
    /// decode step reads only the weights of its `top_k` experts. Each row's result does not
    /// depend on the other rows.
    ///
    /// `experts` may be a contiguous run of the router's experts, `first_expert..first_expert
    /// + experts.len()` (expert parallelism: each rank of a split model holds some of them,
    /// DeepSpeed-MoE, Rajbhandari et al. 2022; GShard, Lepikhin et al. 2020): the routing
    /// above still runs over all `n_experts` of the router, and `out` sums only the terms of
    /// the chosen experts in the run, so that the outputs of runs that cover the experts add
    /// up to the whole op's. With `first_expert = 0` and every expert, it is the op above.
    MoeFfn {
        /// f32 `[n, dim]`: the normed hidden states.
        input: &'a Data,
        /// The router (transformers' `gate`) `[n_experts, dim]`, any weight dtype of
        /// [`Op::Linear`].
        router: &'a Data,
        /// The experts `first_expert..first_expert + experts.len()` of the router's
        /// `n_experts` (all of them, usually), each with the weights of a SwiGLU
        /// feed-forward.
        experts: &'a [Expert],
        /// The router's index of `experts[0]`: 0 unless the experts are a part of the
        /// router's.
        first_expert: usize,
        /// How the router's logits choose and weigh each row's experts.
        routing: MoeRouting<'a>,
        /// How each expert gates its up projection.
        activation: ExpertActivation,
        /// f32 `[n, dim]`: overwritten with the weighted sum of the experts' outputs.
        output: &'a mut Data,
    },
    /// Index of the largest value of each row (the first one on ties).
    Argmax {
        /// f32 `[n, cols]`.
        input: &'a Data,
        /// `n` indices.
        output: &'a mut [u32],
    },
    /// Samples the next token on the device holding the logits: the id
    /// [`crate::Sampler::sample_with_output`] picks with `config` from `logits`, with the
    /// history and output it would be given and its random stream's position held in
    /// `state` ([`SampleState`]); then the id is added to the history and output and the
    /// stream advanced (one word per draw; none when greedy), so the next op continues as
    /// the next call of the host sampler. [`crate::sample_tensors`] defines it. Every
    /// per-step operand is a tensor, so that a device can replay the step (a CUDA graph)
    /// without host values.
    ///
    /// A device may differ from the host in the last bits of `exp` and of the sums over the
    /// candidates, and so pick a neighbouring id where the draw falls within rounding of a
    /// boundary between two candidates (see the device's kernel).
    Sample {
        /// f32 `[1, vocab]`, read only.
        logits: &'a Data,
        /// The sampling state, in the logits' memory.
        state: &'a mut SampleState,
        /// i32 `[1]`: the sampled id; `-1` (`u32::MAX`) when every logit is NaN (a host
        /// device returns the error instead).
        output: &'a mut Data,
        /// The parameters, fixed for a generation.
        config: &'a SamplerConfig,
    },
}

/// What an [`Op::Sample`] carries from one step to the next, in the memory of the logits.
#[derive(Debug)]
pub struct SampleState {
    /// i32 `[vocab]`: nonzero for the ids of the history (the repetition penalty's).
    pub seen: Data,
    /// i32 `[vocab]`: how often each id occurs in the generated output (the presence and
    /// frequency penalties').
    pub counts: Data,
    /// i32 `[SAMPLER_STATE_WORDS]` ([`crate::SAMPLER_STATE_WORDS`]): the ChaCha8 key and the
    /// position of the next word of the stream ([`crate::sampler_state`]).
    pub stream: Data,
}

/// The token ids of an [`Op::Embedding`].
#[derive(Debug, Clone, Copy)]
pub enum TokenIds<'a> {
    /// Ids in host memory, checked against the vocabulary by [`Op::validate`].
    Host(&'a [u32]),
    /// An i32 `[n]` tensor in the memory of the table (the ids a step copied to a device,
    /// or sampled there); the device checks them against the vocabulary as it runs the op
    /// ([`crate::Error::TokenOutOfRange`]).
    Tensor(&'a Data),
}

impl TokenIds<'_> {
    /// The number of ids.
    pub fn len(&self) -> usize {
        match self {
            TokenIds::Host(ids) => ids.len(),
            TokenIds::Tensor(d) => d.numel(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'a> From<&'a [u32]> for TokenIds<'a> {
    fn from(ids: &'a [u32]) -> Self {
        TokenIds::Host(ids)
    }
}

/// One sequence of an [`Op::PagedAttention`] batch.
#[derive(Debug, Clone, Copy)]
pub struct PagedSeq<'a> {
    /// Rows of `q` belonging to this sequence (1 when decoding, a chunk when prefilling).
    pub n_rows: usize,
    /// Cache position of its first row; positions `0..start_pos + n_rows` are filled.
    pub start_pos: usize,
    /// Its block table: the pool block of positions `k · block_size..(k + 1) · block_size`
    /// is `blocks[k]`.
    pub blocks: &'a [u32],
}

/// How [`Op::MoeFfn`]'s router turns a row's logits into its experts and their weights
/// (see the op for the formula). The contract ([`Op::validate`]) checks it against the
/// router's `n_experts` experts.
#[derive(Debug, Clone, Copy)]
pub struct MoeRouting<'a> {
    /// Experts per row, `1..=n_experts`, and at most the experts of the chosen groups.
    pub top_k: usize,
    /// How the logits become the scores `s`.
    pub scoring: RouterScoring,
    /// Group-limited choice (DeepSeek's `n_group` and `topk_group`); `None`: every expert
    /// may be chosen.
    pub groups: Option<ExpertGroups>,
    /// f32 `[n_experts]` in the memory of the other operands, added to the scores only to
    /// choose the groups and experts (DeepSeek-V3's and GLM-4.5's
    /// `e_score_correction_bias`); the weights stay the unbiased scores.
    pub choice_bias: Option<&'a Data>,
    /// f32 `[n_experts]` in the memory of the other operands, added to the router's logits
    /// (gpt-oss's `router.bias`): it chooses and weighs.
    pub logit_bias: Option<&'a Data>,
    /// Whether the chosen scores are divided by their sum (`norm_topk_prob`).
    pub renormalize: bool,
    /// Multiplies the final weights (`routed_scaling_factor`; 1 for none); finite.
    pub scale: f32,
}

impl MoeRouting<'_> {
    /// Mixtral's and Qwen's routing: softmax scores, the `top_k` largest, divided by their
    /// sum if `renormalize`; no groups, no bias, scale 1.
    pub fn softmax(top_k: usize, renormalize: bool) -> MoeRouting<'static> {
        MoeRouting {
            top_k,
            scoring: RouterScoring::Softmax,
            groups: None,
            choice_bias: None,
            logit_bias: None,
            renormalize,
            scale: 1.0,
        }
    }
}

/// How [`Op::MoeFfn`]'s router turns its logits into scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouterScoring {
    /// A softmax over all experts (Mixtral, Qwen-MoE, DeepSeek-V2).
    #[default]
    Softmax,
    /// `σ(l) = 1 / (1 + e^-l)` per expert (DeepSeek-V3's and GLM-4.5's `sigmoid`).
    Sigmoid,
}

/// Group-limited expert choice (DeepSeek-V2's `group_limited_greedy`, DeepSeek-V3,
/// GLM-4.5): the experts are `n_groups` runs of `n_experts / n_groups` consecutive ones,
/// and a row chooses its experts only in its `top_groups` best groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExpertGroups {
    /// Groups (`n_group`); divides the experts.
    pub n_groups: usize,
    /// Groups a row chooses among (`topk_group`), `1..=n_groups`.
    pub top_groups: usize,
    /// How a group is scored.
    pub score: GroupScore,
}

/// The score of a group of experts, from the (biased) scores of its experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupScore {
    /// The largest (DeepSeek-V2's `group_limited_greedy`).
    Max,
    /// The sum of the two largest (DeepSeek-V3, GLM-4.5); groups of two experts at least.
    SumOfTop2,
}

/// One expert of [`Op::MoeFfn`]: a gated feed-forward
/// `down · act(gate · x + b_gate, up · x + b_up) + b_down`, each matrix `[out, in]` of any
/// weight dtype of [`Op::Linear`].
#[derive(Debug, Clone)]
pub struct Expert {
    /// Gate projection `[expert_dim, dim]` (Mixtral's `w1`).
    pub gate: Data,
    /// Up projection `[expert_dim, dim]` (Mixtral's `w3`).
    pub up: Data,
    /// Down projection `[dim, expert_dim]` (Mixtral's `w2`).
    pub down: Data,
    /// f32 biases of the gate, up and down projections `[expert_dim]`, `[expert_dim]`,
    /// `[dim]` (gpt-oss's `gate_up_proj_bias` and `down_proj_bias`); `None`: none.
    pub biases: Option<[Data; 3]>,
}

/// How an expert of [`Op::MoeFfn`] gates its up projection `u` with its gate projection
/// `g`, per value.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertActivation {
    /// SwiGLU (Shazeer 2020): `silu(g) · u`, `silu(g) = g · σ(g)`.
    #[default]
    SwiGlu,
    /// gpt-oss's clamped SwiGLU (transformers' `GptOssExperts._apply_gate`):
    /// `g' = min(g, limit)`, `u' = clamp(u, −limit, limit)`, `g' · σ(alpha · g') · (u' + 1)`.
    ClampedSwiGlu {
        /// The sigmoid's slope (`swiglu_alpha`, 1.702); finite.
        alpha: f32,
        /// The clamp (`swiglu_limit`, 7); positive and finite.
        limit: f32,
    },
}

/// One layer of [`Op::Linears`]: the operands of an [`Op::Linear`] but its input.
#[derive(Debug)]
pub struct LinearPart<'a> {
    /// `[out, in]`, any weight dtype of [`Op::Linear`].
    pub weight: &'a Data,
    /// Optional `[out]`.
    pub bias: Option<&'a Data>,
    /// f32 `[n, out]`.
    pub output: &'a mut Data,
}

impl<'a> LinearPart<'a> {
    /// The part `output = input · weightᵀ (+ bias)`.
    pub fn new(weight: &'a Data, bias: Option<&'a Data>, output: &'a mut Data) -> Self {
        LinearPart {
            weight,
            bias,
            output,
        }
    }
}

/// The kind of an [`Op`], without its operands: used by the profiler and in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// [`Op::Embedding`]
    Embedding,
    /// [`Op::RmsNorm`]
    RmsNorm,
    /// [`Op::Linear`]
    Linear,
    /// [`Op::Linears`]
    Linears,
    /// [`Op::Rope`]
    Rope,
    /// [`Op::CopyRows`]
    CopyRows,
    /// [`Op::Attention`]
    Attention,
    /// [`Op::SiluMul`]
    SiluMul,
    /// [`Op::Add`]
    Add,
    /// [`Op::Argmax`]
    Argmax,
    /// [`Op::LayerNorm`]
    LayerNorm,
    /// [`Op::Gelu`]
    Gelu,
    /// [`Op::Scale`]
    Scale,
    /// [`Op::Rope2d`]
    Rope2d,
    /// [`Op::PagedAttention`]
    PagedAttention,
    /// [`Op::ScatterRows`]
    ScatterRows,
    /// [`Op::RopeRows`]
    RopeRows,
    /// [`Op::GeluMul`]
    GeluMul,
    /// [`Op::SoftCap`]
    SoftCap,
    /// [`Op::MoeFfn`]
    MoeFfn,
    /// [`Op::GatedAdd`]
    GatedAdd,
    /// [`Op::Sample`]
    Sample,
    /// [`Op::HeadLinear`]
    HeadLinear,
}

impl OpKind {
    /// Every kind, in declaration order (`ALL[k as usize] == k`).
    pub const ALL: [OpKind; 23] = [
        OpKind::Embedding,
        OpKind::RmsNorm,
        OpKind::Linear,
        OpKind::Linears,
        OpKind::Rope,
        OpKind::CopyRows,
        OpKind::Attention,
        OpKind::SiluMul,
        OpKind::Add,
        OpKind::Argmax,
        OpKind::LayerNorm,
        OpKind::Gelu,
        OpKind::Scale,
        OpKind::Rope2d,
        OpKind::PagedAttention,
        OpKind::ScatterRows,
        OpKind::RopeRows,
        OpKind::GeluMul,
        OpKind::SoftCap,
        OpKind::MoeFfn,
        OpKind::GatedAdd,
        OpKind::Sample,
        OpKind::HeadLinear,
    ];

    /// The op's name as printed by the profiler.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Embedding => "Embedding",
            OpKind::RmsNorm => "RmsNorm",
            OpKind::Linear => "Linear",
            OpKind::Linears => "Linears",
            OpKind::Rope => "Rope",
            OpKind::CopyRows => "CopyRows",
            OpKind::Attention => "Attention",
            OpKind::SiluMul => "SiluMul",
            OpKind::Add => "Add",
            OpKind::Argmax => "Argmax",
            OpKind::LayerNorm => "LayerNorm",
            OpKind::Gelu => "Gelu",
            OpKind::Scale => "Scale",
            OpKind::Rope2d => "Rope2d",
            OpKind::PagedAttention => "PagedAttention",
            OpKind::ScatterRows => "ScatterRows",
            OpKind::RopeRows => "RopeRows",
            OpKind::GeluMul => "GeluMul",
            OpKind::SoftCap => "SoftCap",
            OpKind::MoeFfn => "MoeFfn",
            OpKind::GatedAdd => "GatedAdd",
            OpKind::Sample => "Sample",
            OpKind::HeadLinear => "HeadLinear",
        }
    }
}

impl Op<'_> {
    /// The kind of this op.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Embedding { .. } => OpKind::Embedding,
            Op::RmsNorm { .. } => OpKind::RmsNorm,
            Op::Linear { .. } => OpKind::Linear,
            Op::Linears { .. } => OpKind::Linears,
            Op::Rope { .. } => OpKind::Rope,
            Op::CopyRows { .. } => OpKind::CopyRows,
            Op::Attention { .. } => OpKind::Attention,
            Op::SiluMul { .. } => OpKind::SiluMul,
            Op::Add { .. } => OpKind::Add,
            Op::Argmax { .. } => OpKind::Argmax,
            Op::LayerNorm { .. } => OpKind::LayerNorm,
            Op::Gelu { .. } => OpKind::Gelu,
            Op::Scale { .. } => OpKind::Scale,
            Op::Rope2d { .. } => OpKind::Rope2d,
            Op::PagedAttention { .. } => OpKind::PagedAttention,
            Op::ScatterRows { .. } => OpKind::ScatterRows,
            Op::RopeRows { .. } => OpKind::RopeRows,
            Op::GeluMul { .. } => OpKind::GeluMul,
            Op::SoftCap { .. } => OpKind::SoftCap,
            Op::MoeFfn { .. } => OpKind::MoeFfn,
            Op::GatedAdd { .. } => OpKind::GatedAdd,
            Op::Sample { .. } => OpKind::Sample,
            Op::HeadLinear { .. } => OpKind::HeadLinear,
        }
    }
}
