//! The Llama graph (Touvron et al. 2023), as llama2.c `run.c` computes it.
//!
//! Per layer, for the rows `x` of the tokens being processed:
//!
//! ```text
//! h   = x + Wo · Attention(RoPE(Wq · RMSNorm(x)), RoPE(Wk · RMSNorm(x)), Wv · RMSNorm(x))
//! out = h + W2 · (silu(W1 · RMSNorm(h)) ⊙ (W3 · RMSNorm(h)))
//! ```
//!
//! then a final RMSNorm and the classifier (the embedding table when tied). Attention is
//! causal, grouped-query (`n_kv_heads` ≤ `n_heads`), over a KV cache allocated once for the
//! whole context. A prompt is prefilled in chunks of up to [`PREFILL_CHUNK`] tokens, each
//! one pass of matrix × matrix products; decoding feeds one token per step.
//!
//! The model is split in two: [`LlamaModel`] holds what never changes (configuration,
//! weights, RoPE table) and is shared through an [`Arc`]; [`Llama`] adds what a sequence
//! being generated mutates (KV cache, activations). Several [`Llama`] instances over one
//! `Arc<LlamaModel>` generate independently, on different threads, with one copy of the
//! weights.

use std::sync::Arc;

use flm_core::{Data, DataType, Error as CoreError, Executor, KvCache, Op, RopeTable};

use crate::{Error, ModelConfig, Result};

/// Tokens processed per forward pass during prefill; bounds the activation memory.
pub const PREFILL_CHUNK: usize = 128;

/// The weights of one transformer layer; matrices are `[out, in]` as `torch.nn.Linear`.
#[derive(Debug, Clone)]
pub struct LlamaLayer {
    /// Attention RMSNorm gain `[dim]`.
    pub attn_norm: Data,
    /// Query projection `[n_heads·head_dim, dim]`.
    pub wq: Data,
    /// Key projection `[n_kv_heads·head_dim, dim]`.
    pub wk: Data,
    /// Value projection `[n_kv_heads·head_dim, dim]`.
    pub wv: Data,
    /// Output projection `[dim, n_heads·head_dim]`.
    pub wo: Data,
    /// Feed-forward RMSNorm gain `[dim]`.
    pub ffn_norm: Data,
    /// Gate projection W1 `[hidden_dim, dim]`.
    pub w_gate: Data,
    /// Down projection W2 `[dim, hidden_dim]`.
    pub w_down: Data,
    /// Up projection W3 `[hidden_dim, dim]`.
    pub w_up: Data,
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
}

/// The parts of a layer, in canonical order, as named in [`LlamaWeights::canonical_shapes`].
pub const LAYER_PARTS: [&str; 9] = [
    "attn_norm",
    "wq",
    "wk",
    "wv",
    "wo",
    "ffn_norm",
    "w_gate",
    "w_down",
    "w_up",
];

impl LlamaWeights {
    /// flm's canonical tensor names and their shapes for `config`: `embedding`,
    /// `layers.{l}.{part}` for each of [`LAYER_PARTS`], `final_norm`, then `classifier`
    /// unless the embeddings are tied. Every importer maps its checkpoint onto these names,
    /// and .flm files store them.
    pub fn canonical_shapes(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
        let (dim, hd, q_dim, kv_dim) = (c.dim, c.hidden_dim, c.q_dim(), c.kv_dim());
        let mut out = vec![("embedding".to_string(), vec![c.vocab_size, dim])];
        for l in 0..c.n_layers {
            let shapes = [
                vec![dim],
                vec![q_dim, dim],
                vec![kv_dim, dim],
                vec![kv_dim, dim],
                vec![dim, q_dim],
                vec![dim],
                vec![hd, dim],
                vec![dim, hd],
                vec![hd, dim],
            ];
            for (part, shape) in LAYER_PARTS.iter().zip(shapes) {
                out.push((format!("layers.{l}.{part}"), shape));
            }
        }
        out.push(("final_norm".to_string(), vec![dim]));
        if !c.tie_embeddings {
            out.push(("classifier".to_string(), vec![c.vocab_size, dim]));
        }
        out
    }

    /// Assembles the weights from `load(name, shape)`, called for each canonical tensor.
    ///
    /// Errors: whatever `load` returns (a missing tensor, a shape mismatch).
    pub fn from_tensors(
        c: &ModelConfig,
        mut load: impl FnMut(&str, &[usize]) -> Result<Data>,
    ) -> Result<LlamaWeights> {
        let mut tensors = LlamaWeights::canonical_shapes(c)
            .into_iter()
            .map(|(name, shape)| load(&name, &shape))
            .collect::<Result<Vec<_>>>()?
            .into_iter();
        let mut next = || {
            tensors
                .next()
                .ok_or_else(|| Error::Config("fewer tensors than the configuration needs".into()))
        };
        let embedding = next()?;
        let mut layers = Vec::with_capacity(c.n_layers);
        for _ in 0..c.n_layers {
            layers.push(LlamaLayer {
                attn_norm: next()?,
                wq: next()?,
                wk: next()?,
                wv: next()?,
                wo: next()?,
                ffn_norm: next()?,
                w_gate: next()?,
                w_down: next()?,
                w_up: next()?,
            });
        }
        let final_norm = next()?;
        let classifier = if c.tie_embeddings {
            None
        } else {
            Some(next()?)
        };
        Ok(LlamaWeights {
            embedding,
            layers,
            final_norm,
            classifier,
        })
    }
}

/// Which logits a forward pass computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (generation).
    Last,
    /// Every token's (teacher forcing, perplexity).
    All,
}

/// Activations, allocated once for [`PREFILL_CHUNK`] rows.
struct RunState {
    x: Data,
    xb: Data,
    xb2: Data,
    q: Data,
    k: Data,
    v: Data,
    att: Data,
    gate: Data,
    up: Data,
    hidden: Data,
    last: Data,
    logits: Data,
}

/// The immutable part of a Llama model: configuration, weights and RoPE table. It is
/// `Send + Sync`; share it with an [`Arc`] between [`Llama`] instances.
pub struct LlamaModel {
    config: ModelConfig,
    weights: LlamaWeights,
    rope: RopeTable,
}

/// A Llama model ready to run: the shared [`LlamaModel`] plus its own KV cache (for
/// `config.max_seq_len` positions) and activations.
pub struct Llama {
    model: Arc<LlamaModel>,
    kv: KvCache,
    state: RunState,
    /// Logits of every row of a multi-chunk [`Logits::All`] call.
    all_logits: Vec<f32>,
}

fn check_shape(name: &str, data: &Data, shape: &[usize]) -> Result<()> {
    if data.shape() == shape {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "tensor {name} has shape {:?}, the configuration implies {shape:?}",
            data.shape()
        )))
    }
}

impl LlamaModel {
    /// Checks the weights against the configuration and builds the RoPE table.
    ///
    /// Errors: [`Error::Config`] if the configuration is invalid or a weight's shape
    /// disagrees with it.
    pub fn new(config: ModelConfig, weights: LlamaWeights) -> Result<LlamaModel> {
        config.validate()?;
        let c = &config;
        let (dim, hd, q_dim, kv_dim) = (c.dim, c.hidden_dim, c.q_dim(), c.kv_dim());
        check_shape("embedding", &weights.embedding, &[c.vocab_size, dim])?;
        check_shape("final_norm", &weights.final_norm, &[dim])?;
        if let Some(cls) = &weights.classifier {
            check_shape("classifier", cls, &[c.vocab_size, dim])?;
        }
        if weights.layers.len() != c.n_layers {
            return Err(Error::Config(format!(
                "{} layers of weights for n_layers = {}",
                weights.layers.len(),
                c.n_layers
            )));
        }
        for (l, w) in weights.layers.iter().enumerate() {
            let expected: [(&str, &Data, &[usize]); 9] = [
                ("attn_norm", &w.attn_norm, &[dim]),
                ("wq", &w.wq, &[q_dim, dim]),
                ("wk", &w.wk, &[kv_dim, dim]),
                ("wv", &w.wv, &[kv_dim, dim]),
                ("wo", &w.wo, &[dim, q_dim]),
                ("ffn_norm", &w.ffn_norm, &[dim]),
                ("w_gate", &w.w_gate, &[hd, dim]),
                ("w_down", &w.w_down, &[dim, hd]),
                ("w_up", &w.w_up, &[hd, dim]),
            ];
            for (name, data, shape) in expected {
                check_shape(&format!("layers.{l}.{name}"), data, shape)?;
            }
        }
        let rope = RopeTable::new(
            c.rope_style,
            c.head_dim,
            c.head_dim,
            c.rope_theta,
            c.max_seq_len,
        )?;
        Ok(LlamaModel {
            config,
            weights,
            rope,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The weights.
    pub fn weights(&self) -> &LlamaWeights {
        &self.weights
    }
}

impl Llama {
    /// Builds the model (see [`LlamaModel::new`]) and one instance of it.
    ///
    /// Errors: those of [`LlamaModel::new`] and [`Llama::with_model`].
    pub fn new(config: ModelConfig, weights: LlamaWeights) -> Result<Llama> {
        Llama::with_model(Arc::new(LlamaModel::new(config, weights)?))
    }

    /// A new instance of a shared model, with its own zeroed KV cache for
    /// `config.max_seq_len` positions and its own activations (for [`PREFILL_CHUNK`] rows).
    ///
    /// Errors: [`flm_core::Error::Shape`] (wrapped) if a buffer's size overflows.
    pub fn with_model(model: Arc<LlamaModel>) -> Result<Llama> {
        let c = &model.config;
        let (dim, hd, q_dim, kv_dim) = (c.dim, c.hidden_dim, c.q_dim(), c.kv_dim());
        let kv = KvCache::new(c.n_layers, c.max_seq_len, kv_dim)?;
        let rows = PREFILL_CHUNK.min(c.max_seq_len);
        let z = |cols: usize| Data::zeros(DataType::F32, &[rows, cols]);
        let state = RunState {
            x: z(dim)?,
            xb: z(dim)?,
            xb2: z(dim)?,
            q: z(q_dim)?,
            k: z(kv_dim)?,
            v: z(kv_dim)?,
            att: z(q_dim)?,
            gate: z(hd)?,
            up: z(hd)?,
            hidden: z(hd)?,
            last: Data::zeros(DataType::F32, &[1, dim])?,
            logits: z(c.vocab_size)?,
        };
        Ok(Llama {
            model,
            kv,
            state,
            all_logits: Vec::new(),
        })
    }

    /// The shared model this instance runs.
    pub fn model(&self) -> &Arc<LlamaModel> {
        &self.model
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    /// The weights.
    pub fn weights(&self) -> &LlamaWeights {
        &self.model.weights
    }

    /// Runs `tokens` at positions `start_pos..start_pos + tokens.len()`, reading keys and
    /// values of positions `< start_pos` from the KV cache (written by earlier calls) and
    /// storing the new ones. Returns the logits: `[vocab_size]` for [`Logits::Last`],
    /// `[tokens.len() · vocab_size]` (row-major) for [`Logits::All`], borrowed from buffers the
    /// model reuses, so that decoding allocates nothing per token.
    ///
    /// Errors: a token id outside the vocabulary, no tokens, or `start_pos + tokens.len()`
    /// beyond the context length (nothing is computed in those cases); device errors.
    pub fn forward(
        &mut self,
        exec: &Executor,
        tokens: &[u32],
        start_pos: usize,
        logits: Logits,
    ) -> Result<&[f32]> {
        let max_seq_len = self.config().max_seq_len;
        let vocab_size = self.config().vocab_size;
        if tokens.is_empty() {
            return Err(Error::Config("forward needs at least one token".into()));
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(CoreError::TokenOutOfRange { id, vocab_size }.into());
        }
        let needed = start_pos.saturating_add(tokens.len());
        if needed > max_seq_len {
            return Err(CoreError::ContextOverflow {
                needed,
                max: max_seq_len,
            }
            .into());
        }
        let chunk = PREFILL_CHUNK.min(max_seq_len);
        let parts = tokens.len().div_ceil(chunk);
        if logits == Logits::Last || parts == 1 {
            for (c, part) in tokens.chunks(chunk).enumerate().take(parts - 1) {
                self.forward_chunk(exec, part, start_pos + c * chunk, Logits::Last)?;
            }
            let last = (parts - 1) * chunk;
            self.forward_chunk(exec, &tokens[last..], start_pos + last, logits)?;
            return Ok(self.state.logits.as_f32()?);
        }
        self.all_logits.clear();
        for (c, part) in tokens.chunks(chunk).enumerate() {
            self.forward_chunk(exec, part, start_pos + c * chunk, Logits::All)?;
            self.all_logits
                .extend_from_slice(self.state.logits.as_f32()?);
        }
        Ok(&self.all_logits)
    }

    fn forward_chunk(
        &mut self,
        exec: &Executor,
        tokens: &[u32],
        pos: usize,
        logits: Logits,
    ) -> Result<()> {
        let c = &self.model.config;
        let w = &self.model.weights;
        let s = &mut self.state;
        let n = tokens.len();
        for (data, cols) in [
            (&mut s.x, c.dim),
            (&mut s.xb, c.dim),
            (&mut s.xb2, c.dim),
            (&mut s.q, c.q_dim()),
            (&mut s.k, c.kv_dim()),
            (&mut s.v, c.kv_dim()),
            (&mut s.att, c.q_dim()),
            (&mut s.gate, c.hidden_dim),
            (&mut s.up, c.hidden_dim),
            (&mut s.hidden, c.hidden_dim),
        ] {
            data.set_shape(&[n, cols])?;
        }
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        let linear = |input: &Data, weight: &Data, output: &mut Data| {
            exec.run(Op::Linear {
                input,
                weight,
                bias: None,
                output,
            })
        };

        exec.run(Op::Embedding {
            table: &w.embedding,
            tokens,
            output: &mut s.x,
        })?;
        for (l, lw) in w.layers.iter().enumerate() {
            // Attention block.
            exec.run(Op::RmsNorm {
                input: &s.x,
                weight: &lw.attn_norm,
                eps: c.norm_eps,
                output: &mut s.xb,
            })?;
            linear(&s.xb, &lw.wq, &mut s.q)?;
            linear(&s.xb, &lw.wk, &mut s.k)?;
            linear(&s.xb, &lw.wv, &mut s.v)?;
            for (x, n_heads) in [(&mut s.q, c.n_heads), (&mut s.k, c.n_kv_heads)] {
                exec.run(Op::Rope {
                    x,
                    table: &self.model.rope,
                    n_heads,
                    start_pos: pos,
                })?;
            }
            let (cache_k, cache_v) = self.kv.layer_mut(l);
            for (src, dst) in [(&s.k, &mut *cache_k), (&s.v, &mut *cache_v)] {
                exec.run(Op::CopyRows {
                    src,
                    src_row: 0,
                    n_rows: n,
                    dst,
                    dst_row: pos,
                })?;
            }
            exec.run(Op::Attention {
                q: &s.q,
                cache_k,
                cache_v,
                start_pos: pos,
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                scale,
                output: &mut s.att,
            })?;
            linear(&s.att, &lw.wo, &mut s.xb2)?;
            exec.run(Op::Add {
                x: &mut s.x,
                y: &s.xb2,
            })?;
            // Feed-forward block.
            exec.run(Op::RmsNorm {
                input: &s.x,
                weight: &lw.ffn_norm,
                eps: c.norm_eps,
                output: &mut s.xb,
            })?;
            linear(&s.xb, &lw.w_gate, &mut s.gate)?;
            linear(&s.xb, &lw.w_up, &mut s.up)?;
            exec.run(Op::SiluMul {
                gate: &s.gate,
                up: &s.up,
                output: &mut s.hidden,
            })?;
            linear(&s.hidden, &lw.w_down, &mut s.xb2)?;
            exec.run(Op::Add {
                x: &mut s.x,
                y: &s.xb2,
            })?;
        }
        let classifier = w.classifier.as_ref().unwrap_or(&w.embedding);
        let final_input = match logits {
            Logits::All => &s.x,
            Logits::Last => {
                exec.run(Op::CopyRows {
                    src: &s.x,
                    src_row: n - 1,
                    n_rows: 1,
                    dst: &mut s.last,
                    dst_row: 0,
                })?;
                &s.last
            }
        };
        let rows = final_input.rows();
        s.xb.set_shape(&[rows, c.dim])?;
        exec.run(Op::RmsNorm {
            input: final_input,
            weight: &w.final_norm,
            eps: c.norm_eps,
            output: &mut s.xb,
        })?;
        s.logits.set_shape(&[rows, c.vocab_size])?;
        linear(&s.xb, classifier, &mut s.logits).map_err(Error::from)
    }
}
