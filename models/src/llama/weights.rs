//! The weights of the Llama graph under flm's canonical tensor names.

use std::collections::HashMap;

use flm_core::{panels, Data, DataType, Expert, Location};

use crate::import::Checkpoint;
use crate::tensor_names::{canonical_tensors, LayerPart, TensorName};
use crate::{Error, ModelConfig, Result};

/// The canonical tensors of a model, loaded by name and taken out one at a time by the
/// graph's weight builder.
pub(crate) struct Tensors(HashMap<TensorName, Data>);

impl Tensors {
    /// Loads every tensor of [`canonical_tensors`]`(c)` with `load(name, shape)`.
    ///
    /// Errors: whatever `load` returns (a missing tensor, a shape mismatch).
    pub(crate) fn load(
        c: &ModelConfig,
        mut load: impl FnMut(TensorName, &[usize]) -> Result<Data>,
    ) -> Result<Tensors> {
        let tensors = canonical_tensors(c)
            .into_iter()
            .map(|(name, shape)| Ok((name, load(name, &shape)?)))
            .collect::<Result<_>>()?;
        Ok(Tensors(tensors))
    }

    /// Takes tensor `name` out, if the configuration has it.
    pub(crate) fn take_optional(&mut self, name: TensorName) -> Option<Data> {
        self.0.remove(&name)
    }

    /// Takes tensor `name` out.
    ///
    /// Errors: [`Error::Config`] when it was not loaded (or was taken already).
    pub(crate) fn take(&mut self, name: TensorName) -> Result<Data> {
        self.take_optional(name)
            .ok_or_else(|| Error::Config(format!("no tensor {name}")))
    }

    /// Builds each of `n_layers` layers with `build(l, tensors)`.
    ///
    /// Errors: the first error of `build`.
    pub(crate) fn layers<L>(
        &mut self,
        n_layers: usize,
        mut build: impl FnMut(usize, &mut Tensors) -> Result<L>,
    ) -> Result<Vec<L>> {
        (0..n_layers).map(|l| build(l, self)).collect()
    }
}

/// The weights of one transformer layer; matrices are `[out, in]` as `torch.nn.Linear`.
#[derive(Debug, Clone)]
pub struct LlamaLayer {
    /// Attention RMSNorm gain `[dim]`.
    pub attn_norm: Data,
    /// The projections to the queries, keys and values.
    pub attn: Attention,
    /// Output projection `[dim, n_heads·head_dim]`.
    pub wo: Data,
    /// Output projection bias `[dim]` (`ModelConfig::o_bias`: InternLM).
    pub bo: Option<Data>,
    /// Feed-forward RMSNorm gain `[dim]`.
    pub ffn_norm: Data,
    /// The feed-forward: dense, or routed experts.
    pub ffn: Ffn,
    /// RMSNorm gains `[dim]` of the attention output and of the feed-forward output,
    /// before their residual adds (`ModelConfig::post_norms`: Gemma 2 and 3).
    pub post_norms: Option<[Data; 2]>,
}

/// The projections of a layer's attention.
// The latent variant is boxed; the common one is read every step without an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Attention {
    /// Grouped-query attention: queries, keys and values each projected from the hidden
    /// state.
    Heads(QkvProjections),
    /// Multi-head latent attention ([`crate::MlaConfig`]).
    Latent(Box<LatentAttention>),
}

/// The projections of grouped-query attention.
#[derive(Debug, Clone)]
pub struct QkvProjections {
    /// Query projection `[n_heads·head_dim, dim]`.
    pub wq: Data,
    /// Key projection `[n_kv_heads·head_dim, dim]`.
    pub wk: Data,
    /// Value projection `[n_kv_heads·head_dim, dim]`.
    pub wv: Data,
    /// Query, key and value biases (`ModelConfig::qkv_bias`: ChatGLM2/3, GLM-4, InternLM).
    pub qkv_bias: Option<[Data; 3]>,
    /// RMSNorm gains `[head_dim]` applied to each query head and each key head before RoPE
    /// (`ModelConfig::qk_norm`: Qwen3).
    pub qk_norm: Option<[Data; 2]>,
    /// f32 `[n_heads]`: each query head's attention-sink logit (`ModelConfig::attn_sinks`:
    /// gpt-oss).
    pub sinks: Option<Data>,
}

/// The weights of multi-head latent attention ([`crate::MlaConfig`]; transformers'
/// `DeepseekV2Attention`), with `H` heads, `q_in` = `q_lora_rank` or `dim`.
#[derive(Debug, Clone)]
pub struct LatentAttention {
    /// The compressed query's projection `[q_lora_rank, dim]` (`q_a_proj`) and RMSNorm gain
    /// `[q_lora_rank]` (`q_a_layernorm`); `None`: the queries come from the hidden state.
    pub q_a: Option<[Data; 2]>,
    /// The queries' parts without RoPE `[H·qk_nope_head_dim, q_in]` and with it
    /// `[H·qk_rope_head_dim, q_in]`: the rows of `q_proj` (or `q_b_proj`) of each part.
    pub wq_nope: Data,
    /// See `wq_nope`.
    pub wq_rope: Data,
    /// The latent's projection `[kv_lora_rank, dim]` and the rotated key's
    /// `[qk_rope_head_dim, dim]`: the rows of `kv_a_proj_with_mqa`.
    pub wkv_a: Data,
    /// See `wkv_a`.
    pub wk_rope: Data,
    /// The latent's RMSNorm gain `[kv_lora_rank]` (`kv_a_layernorm`).
    pub kv_a_norm: Data,
    /// `kv_b_proj` `[H·(qk_nope_head_dim + head_dim), kv_lora_rank]`: each head's `W_UK_h`
    /// rows, then its `W_UV_h` rows.
    pub wkv_b: Data,
    /// Per head, `W_UK_hᵀ` `[kv_lora_rank, qk_nope_head_dim]`: folds the head's key
    /// up-projection into its query ([`flm_core::Op::HeadLinear`]). Derived from `wkv_b` at
    /// load, in its dtype.
    pub k_absorb: Vec<Data>,
    /// Per head, `W_UV_h` `[head_dim, kv_lora_rank]`: maps the head's attention over the
    /// latents to its value space. Derived from `wkv_b` at load.
    pub v_absorb: Vec<Data>,
}

impl LatentAttention {
    /// The weights, with `k_absorb` and `v_absorb` derived from `wkv_b` for `c`'s heads:
    /// in `wkv_b`'s dtype where it converts to it ([`Data::to_dtype`]), else in f32.
    ///
    /// Errors: a `wkv_b` whose values cannot be read on the host, or of the wrong size.
    #[allow(clippy::too_many_arguments)]
    fn new(
        c: &ModelConfig,
        q_a: Option<[Data; 2]>,
        [wq_nope, wq_rope]: [Data; 2],
        [wkv_a, wk_rope, kv_a_norm]: [Data; 3],
        wkv_b: Data,
    ) -> Result<LatentAttention> {
        let m = c
            .mla
            .as_ref()
            .ok_or_else(|| Error::Config("latent attention without an MLA configuration".into()))?;
        let (rank, nope, v) = (m.kv_lora_rank, m.qk_nope_head_dim, c.head_dim);
        let values = wkv_b.to_f32_vec()?;
        if values.len() != c.n_heads * (nope + v) * rank {
            return Err(Error::Config(format!(
                "kv_b_proj of shape {:?} for {} heads",
                wkv_b.shape(),
                c.n_heads
            )));
        }
        let dtype = wkv_b.dtype();
        let keep = |shape: &[usize], values: &[f32]| -> Result<Data> {
            let d = Data::from_f32(shape, values)?;
            Ok(d.to_dtype(dtype).unwrap_or(d))
        };
        let (mut k_absorb, mut v_absorb) = (Vec::new(), Vec::new());
        for head in values.chunks_exact((nope + v) * rank) {
            let (uk, uv) = head.split_at(nope * rank);
            // `uk` is `[nope, rank]`: its transpose `[rank, nope]`.
            let t: Vec<f32> = (0..rank * nope)
                .map(|i| uk[(i % nope) * rank + i / nope])
                .collect();
            k_absorb.push(keep(&[rank, nope], &t)?);
            v_absorb.push(keep(&[v, rank], uv)?);
        }
        Ok(LatentAttention {
            q_a,
            wq_nope,
            wq_rope,
            wkv_a,
            wk_rope,
            kv_a_norm,
            wkv_b,
            k_absorb,
            v_absorb,
        })
    }

    /// The canonical tensors, in [`canonical_tensors`]' order (without the derived ones).
    fn tensors(&self) -> Vec<&Data> {
        let mut out: Vec<&Data> = self.q_a.iter().flatten().collect();
        out.extend([
            &self.wq_nope,
            &self.wq_rope,
            &self.wkv_a,
            &self.wk_rope,
            &self.kv_a_norm,
            &self.wkv_b,
        ]);
        out
    }

    /// The weights with `f` applied to each tensor, the derived ones included.
    fn try_map(self, f: &mut impl FnMut(Data) -> Result<Data>) -> Result<LatentAttention> {
        let mut all = |v: Vec<Data>| v.into_iter().map(&mut *f).collect::<Result<Vec<_>>>();
        let k_absorb = all(self.k_absorb)?;
        let v_absorb = all(self.v_absorb)?;
        Ok(LatentAttention {
            q_a: match self.q_a {
                Some([a, n]) => Some([f(a)?, f(n)?]),
                None => None,
            },
            wq_nope: f(self.wq_nope)?,
            wq_rope: f(self.wq_rope)?,
            wkv_a: f(self.wkv_a)?,
            wk_rope: f(self.wk_rope)?,
            kv_a_norm: f(self.kv_a_norm)?,
            wkv_b: f(self.wkv_b)?,
            k_absorb,
            v_absorb,
        })
    }
}

/// The feed-forward of a layer.
#[derive(Debug, Clone)]
pub enum Ffn {
    /// The SwiGLU feed-forward.
    Dense {
        /// Gate projection W1 `[hidden_dim, dim]`.
        w_gate: Data,
        /// Down projection W2 `[dim, hidden_dim]`.
        w_down: Data,
        /// Up projection W3 `[hidden_dim, dim]`.
        w_up: Data,
    },
    /// Routed experts ([`crate::MoeConfig`], [`flm_core::Op::MoeFfn`]).
    Moe {
        /// Router `[n_experts, dim]`.
        router: Data,
        /// f32 `[n_experts]`: added to the scores to choose the experts (DeepSeek-V3).
        router_bias: Option<Data>,
        /// f32 `[n_experts]`: added to the router's logits (gpt-oss).
        router_logit_bias: Option<Data>,
        /// The experts `first_expert..first_expert + experts.len()` of the router's, each a
        /// SwiGLU of `expert_dim`: all of them, but in a rank's part of an expert-parallel
        /// model.
        experts: Vec<Expert>,
        /// The router's index of `experts[0]` ([`flm_core::Op::MoeFfn`]'s `first_expert`).
        first_expert: usize,
        /// The shared expert every token runs besides (Qwen2-MoE).
        shared: Option<Box<SharedExpert>>,
    },
}

/// A shared expert (transformers' `Qwen2MoeSparseMoeBlock`, DeepSeek's `shared_experts`): a
/// SwiGLU of `shared_expert_dim` that every token runs, its output added to the routed
/// experts', weighted by `σ(gate · x)` where it has a gate (Qwen2-MoE,
/// [`flm_core::Op::GatedAdd`]).
#[derive(Debug, Clone)]
pub struct SharedExpert {
    /// The SwiGLU: gate and up `[shared_expert_dim, dim]`, down `[dim, shared_expert_dim]`.
    pub ffn: Expert,
    /// The gate `[1, dim]` (`shared_expert_gate`), if any.
    pub gate: Option<Data>,
}

impl LlamaLayer {
    /// Every tensor of the layer, in canonical order ([`canonical_tensors`]).
    pub fn tensors(&self) -> Vec<&Data> {
        let mut out = vec![&self.attn_norm];
        match &self.attn {
            Attention::Heads(h) => {
                out.extend([&h.wq, &h.wk, &h.wv]);
                out.extend(h.qkv_bias.iter().flatten());
                out.extend(h.qk_norm.iter().flatten());
                out.extend(&h.sinks);
            }
            Attention::Latent(a) => out.extend(a.tensors()),
        }
        out.push(&self.wo);
        out.extend(&self.bo);
        out.push(&self.ffn_norm);
        match &self.ffn {
            Ffn::Dense {
                w_gate,
                w_down,
                w_up,
            } => out.extend([w_gate, w_down, w_up]),
            Ffn::Moe {
                router,
                router_bias,
                router_logit_bias,
                shared,
                ..
            } => {
                out.push(router);
                out.extend(router_bias);
                out.extend(router_logit_bias);
                if let Some(s) = shared {
                    out.extend([&s.ffn.gate, &s.ffn.down, &s.ffn.up]);
                    out.extend(&s.gate);
                }
            }
        }
        out.extend(self.post_norms.iter().flatten());
        if let Ffn::Moe { experts, .. } = &self.ffn {
            for e in experts {
                out.extend([&e.gate, &e.down, &e.up]);
                if let Some([b_gate, b_up, b_down]) = &e.biases {
                    out.extend([b_gate, b_down, b_up]);
                }
            }
        }
        out
    }

    /// The layer with `f(tensor, routed)` applied to each of its tensors (moving them to a
    /// device); `routed` is true for the router and the experts' matrices, the shared
    /// expert's included (it runs beside the routed ones).
    ///
    /// Errors: the first error of `f`.
    pub fn try_map(self, mut f: impl FnMut(Data, bool) -> Result<Data>) -> Result<LlamaLayer> {
        Ok(LlamaLayer {
            attn_norm: f(self.attn_norm, false)?,
            attn: match self.attn {
                Attention::Heads(h) => Attention::Heads(QkvProjections {
                    wq: f(h.wq, false)?,
                    wk: f(h.wk, false)?,
                    wv: f(h.wv, false)?,
                    qkv_bias: match h.qkv_bias {
                        Some([q, k, v]) => Some([f(q, false)?, f(k, false)?, f(v, false)?]),
                        None => None,
                    },
                    qk_norm: match h.qk_norm {
                        Some([q, k]) => Some([f(q, false)?, f(k, false)?]),
                        None => None,
                    },
                    sinks: h.sinks.map(|s| f(s, false)).transpose()?,
                }),
                Attention::Latent(a) => {
                    Attention::Latent(Box::new(a.try_map(&mut |d| f(d, false))?))
                }
            },
            wo: f(self.wo, false)?,
            bo: self.bo.map(|b| f(b, false)).transpose()?,
            ffn_norm: f(self.ffn_norm, false)?,
            ffn: match self.ffn {
                Ffn::Dense {
                    w_gate,
                    w_down,
                    w_up,
                } => Ffn::Dense {
                    w_gate: f(w_gate, false)?,
                    w_down: f(w_down, false)?,
                    w_up: f(w_up, false)?,
                },
                Ffn::Moe {
                    router,
                    router_bias,
                    router_logit_bias,
                    experts,
                    first_expert,
                    shared,
                } => {
                    let mut expert = |e: Expert| {
                        Ok::<_, Error>(Expert {
                            gate: f(e.gate, true)?,
                            up: f(e.up, true)?,
                            down: f(e.down, true)?,
                            biases: e
                                .biases
                                .map(|[g, u, d]| {
                                    Ok::<_, Error>([f(g, true)?, f(u, true)?, f(d, true)?])
                                })
                                .transpose()?,
                        })
                    };
                    Ffn::Moe {
                        experts: experts
                            .into_iter()
                            .map(&mut expert)
                            .collect::<Result<_>>()?,
                        first_expert,
                        shared: match shared {
                            Some(s) => {
                                let SharedExpert { ffn, gate } = *s;
                                Some(Box::new(SharedExpert {
                                    ffn: expert(ffn)?,
                                    gate: gate.map(|g| f(g, true)).transpose()?,
                                }))
                            }
                            None => None,
                        },
                        router: f(router, true)?,
                        router_bias: router_bias.map(|b| f(b, true)).transpose()?,
                        router_logit_bias: router_logit_bias.map(|b| f(b, true)).transpose()?,
                    }
                }
            },
            post_norms: match self.post_norms {
                Some([a, m]) => Some([f(a, false)?, f(m, false)?]),
                None => None,
            },
        })
    }
}

/// All weights of a Llama model.
#[derive(Debug, Clone)]
pub struct LlamaWeights {
    /// Token embedding table `[vocab_size, dim]`.
    pub embedding: Data,
    /// The layers, first to last.
    pub layers: Vec<LlamaLayer>,
    /// Final RMSNorm gain `[dim]`.
    pub final_norm: Data,
    /// Classifier `[vocab_size, dim]`; `None` when tied to the embedding table.
    pub classifier: Option<Data>,
    /// P-tuning v2 prefix (Liu et al. 2022) `[pre_seq_len, n_layers·2·kv_dim]`: for each
    /// prefix position, layer 0's key row and value row, then layer 1's, ... (the row
    /// layout of THUDM's `prefix_encoder.embedding.weight`); keys are stored as attended,
    /// without RoPE. `None` when `pre_seq_len` is 0.
    pub prefix_kv: Option<Data>,
    /// The multi-token-prediction layers ([`ModelConfig::mtp_layers`]), first to last.
    pub mtp: Vec<MtpLayer>,
}

/// A multi-token-prediction layer (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §2.2;
/// vLLM's `DeepSeekMultiTokenPredictorLayer`). With `h_i` the hidden state at position `i`
/// (the model's after its final norm, or this layer's own output when it drafts on from its
/// last draft) and `t_{i+1}` the token after position `i`, it computes
/// `x = projection · [RMSNorm(E t_{i+1}) · embed_norm ; RMSNorm(h_i) · hidden_norm]`, runs
/// `layer` over `x` at position `i` with a KV cache of its own, and draws `t_{i+2}` from
/// the model's classifier over `RMSNorm(output) · head_norm`. The embedding table and the
/// classifier are the model's (the checkpoints' copies are equal to them).
#[derive(Debug, Clone)]
pub struct MtpLayer {
    /// `enorm` `[dim]`.
    pub embed_norm: Data,
    /// `hnorm` `[dim]`.
    pub hidden_norm: Data,
    /// `eh_proj` `[dim, 2·dim]`.
    pub projection: Data,
    /// `shared_head.norm` `[dim]`.
    pub head_norm: Data,
    /// The transformer layer (`mtp_block`), of the model's kind.
    pub layer: LlamaLayer,
}

impl MtpLayer {
    /// Every tensor, in canonical order ([`canonical_tensors`]).
    pub fn tensors(&self) -> Vec<&Data> {
        let mut out = vec![
            &self.embed_norm,
            &self.hidden_norm,
            &self.projection,
            &self.head_norm,
        ];
        out.extend(self.layer.tensors());
        out
    }

    /// The layer with `f(tensor, routed)` applied to each tensor (see
    /// [`LlamaLayer::try_map`]).
    ///
    /// Errors: the first error of `f`.
    pub fn try_map(self, mut f: impl FnMut(Data, bool) -> Result<Data>) -> Result<MtpLayer> {
        Ok(MtpLayer {
            embed_norm: f(self.embed_norm, false)?,
            hidden_norm: f(self.hidden_norm, false)?,
            projection: f(self.projection, false)?,
            head_norm: f(self.head_norm, false)?,
            layer: self.layer.try_map(f)?,
        })
    }
}

impl LlamaWeights {
    /// Loads the weights of `ckpt` (zero-copy where the encoding allows).
    ///
    /// Errors: [`Error::Config`] for a missing tensor, [`Error::Format`] for one whose
    /// shape disagrees with the configuration or cannot be decoded.
    pub fn load(ckpt: &Checkpoint) -> Result<LlamaWeights> {
        LlamaWeights::from_tensors(&ckpt.config, ckpt.loader())
    }

    /// Assembles the weights from `load(name, shape)`, called for each tensor of
    /// [`canonical_tensors`]`(c)`.
    ///
    /// Errors: whatever `load` returns (a missing tensor, a shape mismatch).
    pub fn from_tensors(
        c: &ModelConfig,
        load: impl FnMut(TensorName, &[usize]) -> Result<Data>,
    ) -> Result<LlamaWeights> {
        use LayerPart::*;
        let mut tensors = Tensors::load(c, load)?;
        let prefix_kv = tensors.take_optional(TensorName::PrefixKv);
        let embedding = tensors.take(TensorName::Embedding)?;
        let layers = tensors.layers(c.n_layers, |l, t| layer(c, l, t))?;
        let mtp = (c.n_layers..c.n_layers + c.mtp_layers)
            .map(|l| {
                let mut own = |p| tensors.take(TensorName::Layer(l, p));
                Ok(MtpLayer {
                    embed_norm: own(MtpEmbedNorm)?,
                    hidden_norm: own(MtpHiddenNorm)?,
                    projection: own(MtpProjection)?,
                    head_norm: own(MtpHeadNorm)?,
                    layer: layer(c, l, &mut tensors)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(LlamaWeights {
            embedding,
            layers,
            final_norm: tensors.take(TensorName::FinalNorm)?,
            classifier: tensors.take_optional(TensorName::Classifier),
            prefix_kv,
            mtp,
        })
    }

    /// The weights with every RMSNorm gain `w` replaced by `1 + w` in f32 (Gemma's
    /// `GemmaRMSNorm`, `output * (1.0 + self.weight.float())`): the norms, the q/k norms
    /// and the post-norms of each layer, and the final norm.
    ///
    /// Errors: a gain in a dtype that cannot be read as f32 (a device buffer).
    /// The weights with every tensor in [`cpu_layout`].
    ///
    /// Errors: an allocation failure.
    pub(crate) fn in_cpu_layout(self) -> Result<LlamaWeights> {
        Ok(LlamaWeights {
            embedding: cpu_layout(self.embedding)?,
            layers: self
                .layers
                .into_iter()
                .map(|l| l.try_map(|d, _| cpu_layout(d)))
                .collect::<Result<_>>()?,
            final_norm: self.final_norm,
            classifier: self.classifier.map(cpu_layout).transpose()?,
            prefix_kv: self.prefix_kv,
            mtp: self
                .mtp
                .into_iter()
                .map(|m| m.try_map(|d, _| cpu_layout(d)))
                .collect::<Result<_>>()?,
        })
    }

    pub(crate) fn with_unit_offset_norms(mut self) -> Result<LlamaWeights> {
        let shift = |d: &mut Data| -> Result<()> {
            let values: Vec<f32> = d.to_f32_vec()?.iter().map(|w| 1.0 + w).collect();
            *d = Data::from_f32(d.shape(), &values)?;
            Ok(())
        };
        for l in &mut self.layers {
            shift(&mut l.attn_norm)?;
            shift(&mut l.ffn_norm)?;
            if let Attention::Heads(QkvProjections {
                qk_norm: Some(norms),
                ..
            }) = &mut l.attn
            {
                norms.iter_mut().try_for_each(shift)?;
            }
            for d in l.post_norms.iter_mut().flatten() {
                shift(d)?;
            }
        }
        shift(&mut self.final_norm)?;
        Ok(self)
    }

    /// Checks every tensor's shape against `c`'s canonical shapes, each mixture-of-experts
    /// layer holding all its experts.
    ///
    /// Errors: [`Error::Config`] naming the first tensor whose shape disagrees, or a layer
    /// that holds a part of its experts.
    pub fn check_shapes(&self, c: &ModelConfig) -> Result<()> {
        self.check_expert_runs(c, true)?;
        check_all_shapes(self.present(c)?, canonical_tensors(c))
    }

    /// [`LlamaWeights::check_shapes`] for a rank's part of an expert-parallel model: each
    /// mixture-of-experts layer may hold a nonempty run of its experts (`first_expert..`),
    /// whose tensors are checked.
    ///
    /// Errors: [`Error::Config`] naming the first tensor whose shape disagrees, or a run
    /// outside the layer's experts.
    pub(crate) fn check_part_shapes(&self, c: &ModelConfig) -> Result<()> {
        self.check_expert_runs(c, false)?;
        let held = |l: usize, e: usize| match self.layers.get(l).map(|lw| &lw.ffn) {
            Some(Ffn::Moe {
                experts,
                first_expert,
                ..
            }) => (*first_expert..first_expert.saturating_add(experts.len())).contains(&e),
            _ => true,
        };
        let expected = canonical_tensors(c)
            .into_iter()
            .filter(|(name, _)| match *name {
                TensorName::Expert(l, e, _) => held(l, e),
                _ => true,
            })
            .collect();
        check_all_shapes(self.present(c)?, expected)
    }

    /// Checks that each mixture-of-experts layer holds a nonempty run of the experts of
    /// `c`, all of them if `whole`.
    ///
    /// Errors: [`Error::Config`] naming the first layer that does not.
    fn check_expert_runs(&self, c: &ModelConfig, whole: bool) -> Result<()> {
        for (l, lw) in self.layers.iter().enumerate() {
            let (
                Ffn::Moe {
                    experts,
                    first_expert,
                    ..
                },
                Some(m),
            ) = (&lw.ffn, c.moe_layer(l))
            else {
                continue;
            };
            let (first, len) = (*first_expert, experts.len());
            let fits = match whole {
                true => first == 0 && len == m.n_experts,
                false => len > 0 && first.checked_add(len).is_some_and(|end| end <= m.n_experts),
            };
            if !fits {
                return Err(Error::Config(format!(
                    "layer {l} holds experts {first}..{first}+{len} of its {}",
                    m.n_experts
                )));
            }
        }
        Ok(())
    }

    /// Every tensor with its canonical name ([`canonical_tensors`]), the derived ones (the
    /// absorbed matrices of multi-head latent attention) left out.
    ///
    /// Errors: [`Error::Config`] when the weights do not have `c`'s tensors.
    pub fn named_tensors(&self, c: &ModelConfig) -> Result<Vec<(TensorName, &Data)>> {
        let present = self.present(c)?;
        let names = canonical_tensors(c);
        if present.len() != names.len() {
            return Err(Error::Config(format!(
                "{} weight tensors for a configuration of {}",
                present.len(),
                names.len()
            )));
        }
        Ok(names.into_iter().map(|(n, _)| n).zip(present).collect())
    }

    /// The tensors in [`canonical_tensors`]' order.
    ///
    /// Errors: [`Error::Config`] for another number of layers or prediction layers than
    /// `c`'s.
    fn present(&self, c: &ModelConfig) -> Result<Vec<&Data>> {
        let mut present: Vec<&Data> = Vec::new();
        present.extend(&self.prefix_kv);
        present.push(&self.embedding);
        if self.layers.len() != c.n_layers {
            return Err(Error::Config(format!(
                "{} layers of weights for n_layers = {}",
                self.layers.len(),
                c.n_layers
            )));
        }
        if self.mtp.len() != c.mtp_layers {
            return Err(Error::Config(format!(
                "{} prediction layers of weights for mtp_layers = {}",
                self.mtp.len(),
                c.mtp_layers
            )));
        }
        for w in &self.layers {
            present.extend(w.tensors());
        }
        for m in &self.mtp {
            present.extend(m.tensors());
        }
        present.push(&self.final_norm);
        present.extend(&self.classifier);
        Ok(present)
    }
}

/// Layer `l` of the Llama graph, its tensors taken out of `t`.
///
/// Errors: a tensor missing from `t`; a `kv_b_proj` of the wrong size.
fn layer(c: &ModelConfig, l: usize, t: &mut Tensors) -> Result<LlamaLayer> {
    use LayerPart::*;
    let mut part = |p| t.take(TensorName::Layer(l, p));
    let post_norms = c
        .post_norms
        .then(|| Ok::<_, Error>([part(PostAttnNorm)?, part(PostFfnNorm)?]))
        .transpose()?;
    let attn = match &c.mla {
        Some(m) => Attention::Latent(Box::new(LatentAttention::new(
            c,
            m.q_lora_rank
                .map(|_| Ok::<_, Error>([part(QA)?, part(QANorm)?]))
                .transpose()?,
            [part(QNope)?, part(QRope)?],
            [part(KvA)?, part(KRope)?, part(KvANorm)?],
            part(KvB)?,
        )?)),
        None => Attention::Heads(QkvProjections {
            wq: part(Wq)?,
            wk: part(Wk)?,
            wv: part(Wv)?,
            qkv_bias: c
                .qkv_bias
                .then(|| Ok::<_, Error>([part(Bq)?, part(Bk)?, part(Bv)?]))
                .transpose()?,
            qk_norm: c
                .qk_norm
                .then(|| Ok::<_, Error>([part(QNorm)?, part(KNorm)?]))
                .transpose()?,
            // The attention op reads the sinks in f32, whatever the checkpoint's dtype.
            sinks: c
                .attn_sinks
                .then(|| Ok::<_, Error>(part(Sinks)?.to_dtype(DataType::F32)?))
                .transpose()?,
        }),
    };
    Ok(LlamaLayer {
        attn_norm: part(AttnNorm)?,
        attn,
        wo: part(Wo)?,
        bo: c.o_bias.then(|| part(Bo)).transpose()?,
        ffn_norm: part(FfnNorm)?,
        ffn: match c.moe_layer(l) {
            None => Ffn::Dense {
                w_gate: part(WGate)?,
                w_down: part(WDown)?,
                w_up: part(WUp)?,
            },
            Some(m) => Ffn::Moe {
                router: part(Router)?,
                // The op reads the bias in f32, whatever the checkpoint's dtype.
                router_bias: m
                    .choice_bias
                    .then(|| Ok::<_, Error>(part(RouterBias)?.to_dtype(DataType::F32)?))
                    .transpose()?,
                router_logit_bias: m
                    .logit_bias
                    .then(|| Ok::<_, Error>(part(RouterLogitBias)?.to_dtype(DataType::F32)?))
                    .transpose()?,
                shared: m
                    .shared_expert_dim
                    .map(|_| {
                        Ok::<_, Error>(Box::new(SharedExpert {
                            ffn: Expert {
                                gate: part(SharedWGate)?,
                                up: part(SharedWUp)?,
                                down: part(SharedWDown)?,
                                biases: None,
                            },
                            gate: m
                                .shared_expert_gated
                                .then(|| part(SharedExpertGate))
                                .transpose()?,
                        }))
                    })
                    .transpose()?,
                experts: (0..m.n_experts)
                    .map(|e| {
                        let mut part = |p| t.take(TensorName::Expert(l, e, p));
                        let (gate, down, up) = (part(WGate)?, part(WDown)?, part(WUp)?);
                        let mut bias = |p| Ok::<_, Error>(part(p)?.to_dtype(DataType::F32)?);
                        let biases = m
                            .expert_biases
                            .then(|| Ok::<_, Error>([bias(BGate)?, bias(BUp)?, bias(BDown)?]))
                            .transpose()?;
                        Ok(Expert {
                            gate,
                            up,
                            down,
                            biases,
                        })
                    })
                    .collect::<Result<_>>()?,
                first_expert: 0,
            },
        },
        post_norms,
    })
}

/// Checks that the tensors `present` have the canonical `expected` shapes, in order.
///
/// Errors: [`Error::Config`] on a different count or the first shape that disagrees.
pub(crate) fn check_all_shapes(
    present: Vec<&Data>,
    expected: Vec<(TensorName, Vec<usize>)>,
) -> Result<()> {
    if present.len() != expected.len() {
        return Err(Error::Config(format!(
            "{} weight tensors for a configuration of {}",
            present.len(),
            expected.len()
        )));
    }
    for (data, (name, shape)) in present.into_iter().zip(expected) {
        if data.shape() != shape {
            return Err(Error::Config(format!(
                "tensor {name} has shape {:?}, the configuration implies {shape:?}",
                data.shape()
            )));
        }
    }
    Ok(())
}

/// `d` in the layout the CPU kernels read, packed once at load rather than per call: the
/// matrices in host memory of the dtypes this build reads in panels
/// ([`flm_core::panels::has_panels`]); every other tensor as it is.
/// Moving a packed tensor to a device unpacks it ([`flm_core::Executor::to_device`]).
///
/// Errors: an allocation failure.
pub(crate) fn cpu_layout(d: Data) -> Result<Data> {
    if panels::has_panels(d.dtype()) && d.shape().len() >= 2 && d.location() == Location::Host {
        Ok(d.to_panels()?)
    } else {
        Ok(d)
    }
}
