//! The ChatGLM family (THUDM; Du et al. 2022, "GLM: General Language Model Pretraining with
//! Autoregressive Blank Infilling"), as THUDM's `modeling_chatglm.py` computes it.
//!
//! - **ChatGLM-6B** runs on its own graph, [`ChatGlm`]. Per layer, for rows `x`:
//!
//!   ```text
//!   a   = LayerNorm₁(x)
//!   h   = α·a + Wo·Attention(RoPE2d(Wq·a + bq), RoPE2d(Wk·a + bk), Wv·a + bv) + bo
//!   b   = LayerNorm₂(h)
//!   out = α·b + W_down·GELU(W_up·b + b_up) + b_down
//!   ```
//!
//!   with `α = sqrt(2·28)` (THUDM's `GLMBlock` is built without its `num_layers` argument,
//!   so its default of 28 applies to every configuration), GELU in its tanh approximation,
//!   and two-dimensional RoPE: the first half of each head rotates with the token's
//!   position, the second with its block position. The prompt is `… [gMASK] sop`; tokens
//!   before `sop` (the context) attend to each other in both directions (the prefix-LM
//!   mask), the rest causally. Positions: `i` in the context, then the position of
//!   `[gMASK]` (`[MASK]` without one); block positions: 0 in the context, then 1, 2, …
//!   (`get_position_ids`). The fused `query_key_value` weight interleaves q, k and v per
//!   head; the importer splits it into `wq`, `wk`, `wv`.
//! - **ChatGLM2-6B, ChatGLM3-6B and GLM-4-9B** are the Llama graph by configuration (see
//!   [`crate::llama`]): RMSNorm, multi-query attention with `multi_query_group_num` KV
//!   groups, q/k/v biases, RoPE in adjacent pairs on the first half of each head (base
//!   `10000 · rope_ratio`), and SwiGLU whose fused `dense_h_to_4h` holds the gate rows then
//!   the up rows. GLM-4 differs in its eps and tokenizer only.
//!
//! P-tuning v2 prefixes sit in the KV cache before the sequence, as in [`crate::llama`].
//!
//! As [`crate::llama`], the model is split in two: [`SharedChatGlm`] (configuration,
//! weights, RoPE table) is shared through an [`Arc`] by any number of [`ChatGlm`]
//! instances, each with its own KV cache, activations and sequence layout.

mod weights;

use std::sync::Arc;

pub use weights::{ChatGlmLayer, ChatGlmWeights};

use flm_core::{
    AttentionParams, Data, DataType, Executor, KvCache, KvDtype, Op, RopeStyle, RopeTable,
};

use crate::graph::{BatchedForward, Graph, Head, MemoryNeeds, SharedGraph};
use crate::llama::{cache_and_attend, check_forward, load_prefix, AttentionIo, Logits};
use crate::{Arch, Error, Model, ModelConfig, Placement, Result, SharedModel};

/// Activations, grown to the longest call seen.
struct GlmActivations {
    rows: usize,
    x: Data,
    xb: Data,
    xb2: Data,
    q: Data,
    k: Data,
    v: Data,
    att: Data,
    hidden: Data,
    out: Data,
}

impl GlmActivations {
    fn new(c: &ModelConfig, rows: usize) -> Result<GlmActivations> {
        let z = |cols: usize| Data::zeros(DataType::F32, &[rows, cols]);
        Ok(GlmActivations {
            rows,
            x: z(c.dim)?,
            xb: z(c.dim)?,
            xb2: z(c.dim)?,
            q: z(c.q_dim())?,
            k: z(c.kv_dim())?,
            v: z(c.kv_dim())?,
            att: z(c.q_dim())?,
            hidden: z(c.hidden_dim)?,
            out: z(c.vocab_size.max(c.dim))?,
        })
    }
}

/// The special tokens that place a ChatGLM-6B prompt.
#[derive(Debug, Clone, Copy)]
struct Marks {
    residual_alpha: f32,
    mask: u32,
    gmask: u32,
}

/// Where the context of the current sequence ends and its mask token sits, set by the call
/// at position 0.
#[derive(Debug, Clone, Copy)]
struct Layout {
    context_len: usize,
    mask_pos: usize,
}

/// The immutable part of a ChatGLM-6B model: configuration, special tokens, weights and
/// RoPE table. It is `Send + Sync`; share it with an [`Arc`] between [`ChatGlm`] instances.
pub struct SharedChatGlm {
    config: ModelConfig,
    marks: Marks,
    weights: ChatGlmWeights,
    rope: RopeTable,
    /// The element type of its instances' KV caches (in host memory).
    kv_dtype: KvDtype,
}

/// A ChatGLM-6B model ready to run (see the module docs): the shared [`SharedChatGlm`] plus
/// its own KV cache, activations and the layout of the sequence in its cache.
pub struct ChatGlm {
    model: Arc<SharedChatGlm>,
    kv: KvCache,
    state: GlmActivations,
    layout: Option<Layout>,
    positions: Vec<u32>,
    block_positions: Vec<u32>,
}

impl SharedChatGlm {
    /// Checks the configuration and the weights and builds the RoPE table.
    ///
    /// Errors: [`Error::Config`] if the configuration is not a valid ChatGLM-6B one or a
    /// weight's shape disagrees with it.
    pub fn new(config: ModelConfig, weights: ChatGlmWeights) -> Result<SharedChatGlm> {
        config.validate()?;
        let Arch::ChatGlm {
            residual_alpha,
            mask_token_id,
            gmask_token_id,
        } = config.arch
        else {
            return Err(Error::Config("not a ChatGLM-6B configuration".into()));
        };
        if config.n_kv_heads != config.n_heads || !config.head_dim.is_multiple_of(4) {
            return Err(Error::Config(format!(
                "ChatGLM-6B needs as many KV heads as heads and a head_dim divisible by 4, got \
                 {} KV heads for {} heads of {}",
                config.n_kv_heads, config.n_heads, config.head_dim
            )));
        }
        weights.check_shapes(&config)?;
        let half = config.head_dim / 2;
        let rope = RopeTable::new(
            RopeStyle::RotateHalf,
            half,
            half,
            config.rope_theta,
            config.max_seq_len,
        )?;
        Ok(SharedChatGlm {
            marks: Marks {
                residual_alpha,
                mask: mask_token_id,
                gmask: gmask_token_id,
            },
            config,
            weights: weights.in_cpu_layout()?,
            rope,
            kv_dtype: KvDtype::Auto,
        })
    }

    /// The weights.
    pub fn weights(&self) -> &ChatGlmWeights {
        &self.weights
    }
}

/// Why ChatGLM-6B's graph cannot be placed on a device.
fn host_only() -> Error {
    Error::Config("ChatGLM-6B's graph runs in host memory only; leave out --gpu-layers".into())
}

impl SharedGraph for SharedChatGlm {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn instance(self: Arc<Self>) -> Result<Model> {
        Ok(Model::from_graph(ChatGlm::with_model(self)?))
    }

    fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    fn with_kv_dtype(self: Arc<Self>, kv_dtype: KvDtype) -> Result<SharedModel> {
        let model = crate::graph::unshared(self)?;
        Ok(SharedChatGlm { kv_dtype, ..model }.into())
    }

    fn batch(self: Arc<Self>, _rows: usize) -> Result<Box<dyn BatchedForward>> {
        Err(Error::Config(
            "the serving engine runs the Llama graph; ChatGLM-6B (its prefix-LM mask needs \
             the whole context in one pass) cannot be batched: use a Session"
                .into(),
        ))
    }

    fn memory_needs(&self) -> Result<MemoryNeeds> {
        Err(host_only())
    }

    fn place(self: Arc<Self>, _exec: &Executor, _placement: Placement) -> Result<SharedModel> {
        Err(host_only())
    }
}

impl ChatGlm {
    /// Builds the model (see [`SharedChatGlm::new`]) and one instance of it.
    ///
    /// Errors: those of [`SharedChatGlm::new`] and [`ChatGlm::with_model`].
    pub fn new(config: ModelConfig, weights: ChatGlmWeights) -> Result<ChatGlm> {
        ChatGlm::with_model(Arc::new(SharedChatGlm::new(config, weights)?))
    }

    /// A new instance of a shared model, with its own KV cache for `config.max_seq_len`
    /// positions (plus the p-tuning prefix, copied into it) and activations grown on demand.
    ///
    /// Errors: [`flm_core::Error::Shape`] (wrapped) if a buffer's size overflows.
    pub fn with_model(model: Arc<SharedChatGlm>) -> Result<ChatGlm> {
        let c = &model.config;
        let (positions, dtype) = (c.pre_seq_len + c.max_seq_len, model.kv_dtype.on_host());
        let mut kv = KvCache::new(c.n_layers, positions, c.kv_widths(), dtype)?;
        if let Some(prefix) = &model.weights.prefix_kv {
            load_prefix(&mut kv, prefix, c)?;
        }
        let state = GlmActivations::new(c, 1)?;
        Ok(ChatGlm {
            model,
            kv,
            state,
            layout: None,
            positions: Vec::new(),
            block_positions: Vec::new(),
        })
    }

    /// The shared model this instance runs.
    pub fn model(&self) -> &Arc<SharedChatGlm> {
        &self.model
    }

    /// The weights.
    pub fn weights(&self) -> &ChatGlmWeights {
        &self.model.weights
    }

    /// Sets the positions and block positions of `tokens` at `start_pos..`, and returns the
    /// cache rows every row sees (the context, when this call holds it).
    fn place(&mut self, tokens: &[u32], start_pos: usize) -> Result<usize> {
        if start_pos == 0 {
            let find = |id: u32| tokens.iter().position(|&t| t == id);
            let sop = self.model.config.bos_token_id.and_then(find);
            let mask = find(self.model.marks.gmask).or_else(|| find(self.model.marks.mask));
            let (Some(context_len), Some(mask_pos)) = (sop, mask) else {
                return Err(Error::InvalidInput(
                    "a ChatGLM-6B sequence starts with its prompt, which holds [gMASK] (or \
                     [MASK]) and then sop"
                        .into(),
                ));
            };
            self.layout = Some(Layout {
                context_len,
                mask_pos,
            });
        }
        let Some(layout) = self.layout else {
            return Err(Error::State(
                "a ChatGLM-6B sequence must start with a call at position 0".into(),
            ));
        };
        self.positions.clear();
        self.block_positions.clear();
        for p in start_pos..start_pos + tokens.len() {
            let (pos, block) = if p < layout.context_len {
                (p, 0)
            } else {
                (layout.mask_pos, p - layout.context_len + 1)
            };
            self.positions.push(pos as u32);
            self.block_positions.push(block as u32);
        }
        Ok(if start_pos == 0 {
            self.model.config.pre_seq_len + layout.context_len
        } else {
            0
        })
    }
}

/// The call at position 0 must hold the context: `[gMASK]` (or `[MASK]`) and then `sop`
/// (the config's `bos_token_id`), in one pass; [`Graph::run`] returns
/// [`Error::InvalidInput`] when it lacks them, and [`Error::State`] when a later call comes
/// before one at position 0.
impl Graph for ChatGlm {
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn shared(&self) -> SharedModel {
        SharedModel::from_graph(Arc::clone(&self.model) as Arc<dyn SharedGraph>)
    }

    fn continues_prefix(&self) -> bool {
        false
    }

    fn run(
        &mut self,
        exec: &Executor,
        tokens: &[u32],
        start_pos: usize,
        head: Head,
    ) -> Result<&[f32]> {
        check_forward(self.config(), tokens, start_pos)?;
        let bidirectional = self.place(tokens, start_pos)?;
        let n = tokens.len();
        if n > self.state.rows {
            self.state = GlmActivations::new(&self.model.config, n)?;
        }
        let c = &self.model.config;
        let w = &self.model.weights;
        let s = &mut self.state;
        for (data, cols) in [
            (&mut s.x, c.dim),
            (&mut s.xb, c.dim),
            (&mut s.xb2, c.dim),
            (&mut s.q, c.q_dim()),
            (&mut s.k, c.kv_dim()),
            (&mut s.v, c.kv_dim()),
            (&mut s.att, c.q_dim()),
            (&mut s.hidden, c.hidden_dim),
        ] {
            data.set_shape(&[n, cols])?;
        }
        let row = c.pre_seq_len + start_pos;
        let alpha = self.model.marks.residual_alpha;
        let linear = |input: &Data, weight: &Data, bias: &Data, output: &mut Data| {
            exec.run(Op::Linear {
                input,
                weight,
                bias: Some(bias),
                output,
            })
        };
        let layer_norm = |input: &Data, (weight, bias): (&Data, &Data), output: &mut Data| {
            exec.run(Op::LayerNorm {
                input,
                weight,
                bias,
                eps: c.norm_eps,
                output,
            })
        };
        // GLM's scaled residual: `into = α·b + into`, with `b` (the block's normed input)
        // scaled in place.
        let scaled_residual = |b: &mut Data, into: &mut Data| {
            exec.run(Op::Scale { x: b, alpha })?;
            exec.run(Op::Add { x: into, y: b })
        };

        exec.run(Op::Embedding {
            table: &w.embedding,
            tokens: tokens.into(),
            output: &mut s.x,
        })?;
        for (l, lw) in w.layers.iter().enumerate() {
            // Attention block: xb2 = α·a + attention(a), a = LayerNorm₁(x).
            layer_norm(&s.x, (&lw.attn_norm, &lw.attn_norm_bias), &mut s.xb)?;
            linear(&s.xb, &lw.wq, &lw.bq, &mut s.q)?;
            linear(&s.xb, &lw.wk, &lw.bk, &mut s.k)?;
            linear(&s.xb, &lw.wv, &lw.bv, &mut s.v)?;
            for x in [&mut s.q, &mut s.k] {
                exec.run(Op::Rope2d {
                    x,
                    table: &self.model.rope,
                    n_heads: c.n_heads,
                    positions: &self.positions,
                    block_positions: &self.block_positions,
                })?;
            }
            let params = AttentionParams {
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                scale: 1.0 / (c.head_dim as f32).sqrt(),
                alibi: false,
                softcap: None,
                bidirectional,
                sliding_window: None,
            };
            let io = AttentionIo {
                new_rows: [&s.k, &s.v],
                q: &s.q,
                q_rope: None,
                sinks: None,
                output: &mut s.att,
            };
            cache_and_attend(exec, self.kv.layer_mut(l), io, row, params)?;
            linear(&s.att, &lw.wo, &lw.bo, &mut s.xb2)?;
            scaled_residual(&mut s.xb, &mut s.xb2)?;
            // Feed-forward block: x = α·b + MLP(b), b = LayerNorm₂(xb2).
            layer_norm(&s.xb2, (&lw.ffn_norm, &lw.ffn_norm_bias), &mut s.xb)?;
            linear(&s.xb, &lw.w_up, &lw.b_up, &mut s.hidden)?;
            exec.run(Op::Gelu { x: &mut s.hidden })?;
            linear(&s.hidden, &lw.w_down, &lw.b_down, &mut s.x)?;
            scaled_residual(&mut s.xb, &mut s.x)?;
        }
        let first = match head {
            Head::Logits(Logits::Last) => n - 1,
            _ => 0,
        };
        let rows = n - first;
        s.xb2.set_shape(&[rows, c.dim])?;
        exec.run(Op::CopyRows {
            src: (&s.x, first),
            dst: (&mut s.xb2, 0),
            n_rows: rows,
        })?;
        let normed = if head == Head::Hidden {
            &mut s.out
        } else {
            &mut s.xb
        };
        normed.set_shape(&[rows, c.dim])?;
        layer_norm(&s.xb2, (&w.final_norm, &w.final_norm_bias), normed)?;
        if head != Head::Hidden {
            let classifier = w.classifier.as_ref().unwrap_or(&w.embedding);
            s.out.set_shape(&[rows, c.vocab_size])?;
            exec.run(Op::Linear {
                input: &s.xb,
                weight: classifier,
                bias: None,
                output: &mut s.out,
            })?;
        }
        Ok(s.out.as_f32()?)
    }
}
