//! The weights of the Llama graph under flm's canonical tensor names.

use std::collections::HashMap;

use flm_core::Data;

use crate::{Error, ModelConfig, Result};

/// The canonical tensors of a model, loaded by name and taken out one at a time by the
/// graph's weight builder.
pub(crate) struct Tensors(HashMap<String, Data>);

impl Tensors {
    /// Loads every `(name, shape)` of `shapes` with `load`.
    ///
    /// Errors: whatever `load` returns (a missing tensor, a shape mismatch).
    pub(crate) fn load(
        shapes: Vec<(String, Vec<usize>)>,
        mut load: impl FnMut(&str, &[usize]) -> Result<Data>,
    ) -> Result<Tensors> {
        let tensors = shapes
            .into_iter()
            .map(|(name, shape)| Ok((name.clone(), load(&name, &shape)?)))
            .collect::<Result<_>>()?;
        Ok(Tensors(tensors))
    }

    /// Takes tensor `name` out.
    ///
    /// Errors: [`Error::Config`] when it was not loaded (or was taken already).
    pub(crate) fn take(&mut self, name: &str) -> Result<Data> {
        self.0
            .remove(name)
            .ok_or_else(|| Error::Config(format!("no tensor {name}")))
    }
}

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
    /// Query, key and value biases (`ModelConfig::qkv_bias`: ChatGLM2/3, GLM-4, InternLM).
    pub qkv_bias: Option<[Data; 3]>,
    /// RMSNorm gains `[head_dim]` applied to each query head and each key head before RoPE
    /// (`ModelConfig::qk_norm`: Qwen3).
    pub qk_norm: Option<[Data; 2]>,
    /// Output projection bias `[dim]` (`ModelConfig::o_bias`: InternLM).
    pub bo: Option<Data>,
    /// Feed-forward RMSNorm gain `[dim]`.
    pub ffn_norm: Data,
    /// Gate projection W1 `[hidden_dim, dim]`.
    pub w_gate: Data,
    /// Down projection W2 `[dim, hidden_dim]`.
    pub w_down: Data,
    /// Up projection W3 `[hidden_dim, dim]`.
    pub w_up: Data,
}

impl LlamaLayer {
    /// Every tensor of the layer, in the order of [`LAYER_PARTS`].
    pub fn tensors(&self) -> Vec<&Data> {
        let mut out = vec![&self.attn_norm, &self.wq, &self.wk, &self.wv];
        out.extend(self.qkv_bias.iter().flatten());
        out.extend(self.qk_norm.iter().flatten());
        out.push(&self.wo);
        out.extend(&self.bo);
        out.extend([&self.ffn_norm, &self.w_gate, &self.w_down, &self.w_up]);
        out
    }

    /// The layer with `f` applied to each of its tensors (moving them to a device).
    ///
    /// Errors: the first error of `f`.
    pub fn try_map(self, mut f: impl FnMut(Data) -> Result<Data>) -> Result<LlamaLayer> {
        Ok(LlamaLayer {
            attn_norm: f(self.attn_norm)?,
            wq: f(self.wq)?,
            wk: f(self.wk)?,
            wv: f(self.wv)?,
            wo: f(self.wo)?,
            qkv_bias: match self.qkv_bias {
                Some([q, k, v]) => Some([f(q)?, f(k)?, f(v)?]),
                None => None,
            },
            qk_norm: match self.qk_norm {
                Some([q, k]) => Some([f(q)?, f(k)?]),
                None => None,
            },
            bo: self.bo.map(&mut f).transpose()?,
            ffn_norm: f(self.ffn_norm)?,
            w_gate: f(self.w_gate)?,
            w_down: f(self.w_down)?,
            w_up: f(self.w_up)?,
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
}

/// The parts of a layer, in canonical order, as named in [`LlamaWeights::canonical_shapes`]:
/// the biases and the q/k norms appear only when the configuration has them.
pub const LAYER_PARTS: [&str; 15] = [
    "attn_norm",
    "wq",
    "wk",
    "wv",
    "bq",
    "bk",
    "bv",
    "q_norm",
    "k_norm",
    "wo",
    "bo",
    "ffn_norm",
    "w_gate",
    "w_down",
    "w_up",
];

impl LlamaWeights {
    /// flm's canonical tensor names and their shapes for `config`: `prefix_kv` when
    /// `pre_seq_len > 0`, `embedding`, `layers.{l}.{part}` for each of [`LAYER_PARTS`] the
    /// configuration has, `final_norm`, then `classifier` unless the embeddings are tied.
    /// Every importer maps its checkpoint onto these names, and .flm files store them.
    pub fn canonical_shapes(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
        let (dim, hd, q_dim, kv_dim) = (c.dim, c.hidden_dim, c.q_dim(), c.kv_dim());
        let mut out = Vec::new();
        if c.pre_seq_len > 0 {
            let width = c.n_layers * 2 * kv_dim;
            out.push(("prefix_kv".to_string(), vec![c.pre_seq_len, width]));
        }
        out.push(("embedding".to_string(), vec![c.vocab_size, dim]));
        for l in 0..c.n_layers {
            let shapes = [
                Some(vec![dim]),
                Some(vec![q_dim, dim]),
                Some(vec![kv_dim, dim]),
                Some(vec![kv_dim, dim]),
                c.qkv_bias.then(|| vec![q_dim]),
                c.qkv_bias.then(|| vec![kv_dim]),
                c.qkv_bias.then(|| vec![kv_dim]),
                c.qk_norm.then(|| vec![c.head_dim]),
                c.qk_norm.then(|| vec![c.head_dim]),
                Some(vec![dim, q_dim]),
                c.o_bias.then(|| vec![dim]),
                Some(vec![dim]),
                Some(vec![hd, dim]),
                Some(vec![dim, hd]),
                Some(vec![hd, dim]),
            ];
            for (part, shape) in LAYER_PARTS.iter().zip(shapes) {
                if let Some(shape) = shape {
                    out.push((format!("layers.{l}.{part}"), shape));
                }
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
        load: impl FnMut(&str, &[usize]) -> Result<Data>,
    ) -> Result<LlamaWeights> {
        let mut tensors = Tensors::load(LlamaWeights::canonical_shapes(c), load)?;
        let mut take = |name: &str| tensors.take(name);
        let prefix_kv = (c.pre_seq_len > 0).then(|| take("prefix_kv")).transpose()?;
        let embedding = take("embedding")?;
        let mut layers = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            let mut part = |p: &str| take(&format!("layers.{l}.{p}"));
            layers.push(LlamaLayer {
                attn_norm: part("attn_norm")?,
                wq: part("wq")?,
                wk: part("wk")?,
                wv: part("wv")?,
                qkv_bias: if c.qkv_bias {
                    Some([part("bq")?, part("bk")?, part("bv")?])
                } else {
                    None
                },
                qk_norm: if c.qk_norm {
                    Some([part("q_norm")?, part("k_norm")?])
                } else {
                    None
                },
                wo: part("wo")?,
                bo: c.o_bias.then(|| part("bo")).transpose()?,
                ffn_norm: part("ffn_norm")?,
                w_gate: part("w_gate")?,
                w_down: part("w_down")?,
                w_up: part("w_up")?,
            });
        }
        let final_norm = take("final_norm")?;
        let classifier = (!c.tie_embeddings)
            .then(|| take("classifier"))
            .transpose()?;
        Ok(LlamaWeights {
            embedding,
            layers,
            final_norm,
            classifier,
            prefix_kv,
        })
    }

    /// Checks every tensor's shape against `c`'s canonical shapes.
    ///
    /// Errors: [`Error::Config`] naming the first tensor whose shape disagrees.
    pub fn check_shapes(&self, c: &ModelConfig) -> Result<()> {
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
        for w in &self.layers {
            present.extend(w.tensors());
        }
        present.push(&self.final_norm);
        present.extend(&self.classifier);
        check_all_shapes(present, LlamaWeights::canonical_shapes(c))
    }
}

/// Checks that the tensors `present` have the canonical `expected` shapes, in order.
///
/// Errors: [`Error::Config`] on a different count or the first shape that disagrees.
pub(crate) fn check_all_shapes(
    present: Vec<&Data>,
    expected: Vec<(String, Vec<usize>)>,
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
