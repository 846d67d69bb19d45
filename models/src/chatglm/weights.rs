//! The weights of the ChatGLM-6B graph under flm's canonical tensor names.

use flm_core::Data;

use crate::import::Checkpoint;
use crate::llama::{cpu_layout, Tensors};
use crate::tensor_names::{canonical_tensors, LayerPart, TensorName};
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

impl ChatGlmWeights {
    /// The weights with every matrix in [`cpu_layout`].
    ///
    /// Errors: an allocation failure.
    pub(crate) fn in_cpu_layout(self) -> Result<ChatGlmWeights> {
        let layers = self
            .layers
            .into_iter()
            .map(|l| {
                Ok(ChatGlmLayer {
                    wq: cpu_layout(l.wq)?,
                    wk: cpu_layout(l.wk)?,
                    wv: cpu_layout(l.wv)?,
                    wo: cpu_layout(l.wo)?,
                    w_up: cpu_layout(l.w_up)?,
                    w_down: cpu_layout(l.w_down)?,
                    ..l
                })
            })
            .collect::<Result<_>>()?;
        Ok(ChatGlmWeights {
            embedding: cpu_layout(self.embedding)?,
            layers,
            classifier: self.classifier.map(cpu_layout).transpose()?,
            ..self
        })
    }

    /// Loads the weights of `ckpt`, as [`crate::llama::LlamaWeights::load`].
    ///
    /// Errors: as [`crate::llama::LlamaWeights::load`].
    pub fn load(ckpt: &Checkpoint) -> Result<ChatGlmWeights> {
        ChatGlmWeights::from_tensors(&ckpt.config, ckpt.loader())
    }

    /// Assembles the weights from `load(name, shape)`, called for each tensor of
    /// [`canonical_tensors`]`(c)`.
    ///
    /// Errors: whatever `load` returns.
    pub fn from_tensors(
        c: &ModelConfig,
        load: impl FnMut(TensorName, &[usize]) -> Result<Data>,
    ) -> Result<ChatGlmWeights> {
        use LayerPart::*;
        let mut tensors = Tensors::load(c, load)?;
        let prefix_kv = tensors.take_optional(TensorName::PrefixKv);
        let embedding = tensors.take(TensorName::Embedding)?;
        let layers = tensors.layers(c.n_layers, |l, t| {
            let mut part = |p| t.take(TensorName::Layer(l, p));
            Ok(ChatGlmLayer {
                attn_norm: part(AttnNorm)?,
                attn_norm_bias: part(AttnNormBias)?,
                wq: part(Wq)?,
                bq: part(Bq)?,
                wk: part(Wk)?,
                bk: part(Bk)?,
                wv: part(Wv)?,
                bv: part(Bv)?,
                wo: part(Wo)?,
                bo: part(Bo)?,
                ffn_norm: part(FfnNorm)?,
                ffn_norm_bias: part(FfnNormBias)?,
                w_up: part(WUp)?,
                b_up: part(BUp)?,
                w_down: part(WDown)?,
                b_down: part(BDown)?,
            })
        })?;
        Ok(ChatGlmWeights {
            embedding,
            layers,
            final_norm: tensors.take(TensorName::FinalNorm)?,
            final_norm_bias: tensors.take(TensorName::FinalNormBias)?,
            classifier: tensors.take_optional(TensorName::Classifier),
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
        crate::llama::check_all_shapes(present, canonical_tensors(c))
    }
}
