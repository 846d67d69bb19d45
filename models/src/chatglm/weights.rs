//! The weights of the ChatGLM-6B graph under flm's canonical tensor names.

use flm_core::Data;

use crate::llama::Tensors;
use crate::{Error, ModelConfig, Result};

/// The weights of one ChatGLM-6B layer; matrices are `[out, in]` as `torch.nn.Linear`.
#[derive(Debug, Clone)]
pub struct ChatGlmLayer {
    /// Attention LayerNorm gain `[dim]`.
    pub attn_norm: Data,
    /// Attention LayerNorm shift `[dim]`.
    pub attn_norm_bias: Data,
    /// Query projection `[dim, dim]` (de-interleaved from `query_key_value`).
    pub wq: Data,
    /// Query bias `[dim]`.
    pub bq: Data,
    /// Key projection `[dim, dim]`.
    pub wk: Data,
    /// Key bias `[dim]`.
    pub bk: Data,
    /// Value projection `[dim, dim]`.
    pub wv: Data,
    /// Value bias `[dim]`.
    pub bv: Data,
    /// Output projection `dense` `[dim, dim]`.
    pub wo: Data,
    /// Output bias `[dim]`.
    pub bo: Data,
    /// Feed-forward LayerNorm gain `[dim]`.
    pub ffn_norm: Data,
    /// Feed-forward LayerNorm shift `[dim]`.
    pub ffn_norm_bias: Data,
    /// `dense_h_to_4h` `[hidden_dim, dim]`.
    pub w_up: Data,
    /// Its bias `[hidden_dim]`.
    pub b_up: Data,
    /// `dense_4h_to_h` `[dim, hidden_dim]`.
    pub w_down: Data,
    /// Its bias `[dim]`.
    pub b_down: Data,
}

/// All weights of a ChatGLM-6B model.
#[derive(Debug, Clone)]
pub struct ChatGlmWeights {
    /// Token embedding table `[vocab_size, dim]`.
    pub embedding: Data,
    /// The layers, first to last.
    pub layers: Vec<ChatGlmLayer>,
    /// Final LayerNorm gain `[dim]`.
    pub final_norm: Data,
    /// Final LayerNorm shift `[dim]`.
    pub final_norm_bias: Data,
    /// Classifier `[vocab_size, dim]`; `None` when tied to the embedding table.
    pub classifier: Option<Data>,
    /// P-tuning v2 prefix `[pre_seq_len, n_layers·2·dim]`, as
    /// [`crate::llama::LlamaWeights::prefix_kv`].
    pub prefix_kv: Option<Data>,
}

/// The parts of a layer, in canonical order.
const LAYER_PARTS: [&str; 16] = [
    "attn_norm",
    "attn_norm_bias",
    "wq",
    "bq",
    "wk",
    "bk",
    "wv",
    "bv",
    "wo",
    "bo",
    "ffn_norm",
    "ffn_norm_bias",
    "w_up",
    "b_up",
    "w_down",
    "b_down",
];

impl ChatGlmWeights {
    /// flm's canonical tensor names and shapes for a ChatGLM-6B `config`: `prefix_kv` when
    /// `pre_seq_len > 0`, `embedding`, `layers.{l}.{part}`, `final_norm`,
    /// `final_norm_bias`, then `classifier` unless tied.
    pub fn canonical_shapes(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
        let (dim, hd) = (c.dim, c.hidden_dim);
        let mut out = Vec::new();
        if c.pre_seq_len > 0 {
            let width = c.n_layers * 2 * c.kv_dim();
            out.push(("prefix_kv".to_string(), vec![c.pre_seq_len, width]));
        }
        out.push(("embedding".to_string(), vec![c.vocab_size, dim]));
        for l in 0..c.n_layers {
            let shapes = [
                vec![dim],
                vec![dim],
                vec![c.q_dim(), dim],
                vec![c.q_dim()],
                vec![c.kv_dim(), dim],
                vec![c.kv_dim()],
                vec![c.kv_dim(), dim],
                vec![c.kv_dim()],
                vec![dim, c.q_dim()],
                vec![dim],
                vec![dim],
                vec![dim],
                vec![hd, dim],
                vec![hd],
                vec![dim, hd],
                vec![dim],
            ];
            for (part, shape) in LAYER_PARTS.iter().zip(shapes) {
                out.push((format!("layers.{l}.{part}"), shape));
            }
        }
        out.push(("final_norm".to_string(), vec![dim]));
        out.push(("final_norm_bias".to_string(), vec![dim]));
        if !c.tie_embeddings {
            out.push(("classifier".to_string(), vec![c.vocab_size, dim]));
        }
        out
    }

    /// Assembles the weights from `load(name, shape)`, called for each canonical tensor.
    ///
    /// Errors: whatever `load` returns.
    pub fn from_tensors(
        c: &ModelConfig,
        load: impl FnMut(&str, &[usize]) -> Result<Data>,
    ) -> Result<ChatGlmWeights> {
        let mut tensors = Tensors::load(ChatGlmWeights::canonical_shapes(c), load)?;
        let mut take = |name: &str| tensors.take(name);
        let prefix_kv = (c.pre_seq_len > 0).then(|| take("prefix_kv")).transpose()?;
        let embedding = take("embedding")?;
        let mut layers = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            let mut part = |p: &str| take(&format!("layers.{l}.{p}"));
            layers.push(ChatGlmLayer {
                attn_norm: part("attn_norm")?,
                attn_norm_bias: part("attn_norm_bias")?,
                wq: part("wq")?,
                bq: part("bq")?,
                wk: part("wk")?,
                bk: part("bk")?,
                wv: part("wv")?,
                bv: part("bv")?,
                wo: part("wo")?,
                bo: part("bo")?,
                ffn_norm: part("ffn_norm")?,
                ffn_norm_bias: part("ffn_norm_bias")?,
                w_up: part("w_up")?,
                b_up: part("b_up")?,
                w_down: part("w_down")?,
                b_down: part("b_down")?,
            });
        }
        Ok(ChatGlmWeights {
            embedding,
            layers,
            final_norm: take("final_norm")?,
            final_norm_bias: take("final_norm_bias")?,
            classifier: (!c.tie_embeddings)
                .then(|| take("classifier"))
                .transpose()?,
            prefix_kv,
        })
    }

    /// Checks every tensor's shape against `c`'s canonical shapes.
    ///
    /// Errors: [`Error::Config`] naming the first tensor whose shape disagrees.
    pub fn check_shapes(&self, c: &ModelConfig) -> Result<()> {
        if self.layers.len() != c.n_layers {
            return Err(Error::Config(format!(
                "{} layers of weights for n_layers = {}",
                self.layers.len(),
                c.n_layers
            )));
        }
        let mut present: Vec<&Data> = Vec::new();
        present.extend(&self.prefix_kv);
        present.push(&self.embedding);
        for w in &self.layers {
            present.extend([
                &w.attn_norm,
                &w.attn_norm_bias,
                &w.wq,
                &w.bq,
                &w.wk,
                &w.bk,
                &w.wv,
                &w.bv,
                &w.wo,
                &w.bo,
                &w.ffn_norm,
                &w.ffn_norm_bias,
                &w.w_up,
                &w.b_up,
                &w.w_down,
                &w.b_down,
            ]);
        }
        present.extend([&self.final_norm, &self.final_norm_bias]);
        present.extend(&self.classifier);
        crate::llama::check_all_shapes(present, ChatGlmWeights::canonical_shapes(c))
    }
}
