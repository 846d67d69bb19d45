//! Where a Llama model's parts run: moving its weights to the memories of a
//! [`Placement`], and the bytes each part needs there for [`Placement::fit`].

use flm_core::{Data, Executor, Location};

use super::{Ffn, LlamaLayer, LlamaWeights, SharedLlama, PREFILL_CHUNK};
use crate::graph::MemoryNeeds;
use crate::{Error, Placement, Result};
#[cfg(doc)]
use flm_core::KvDtype;

impl SharedLlama {
    /// The model with its weights moved by `exec` to the memories of `placement` (recorded
    /// as `"load: weights"`): each layer's to its layer's, the embedding table to the first
    /// layer's, the final norm and the classifier to the last layer's (a tied classifier
    /// gets a copy of the table there when the two differ).
    ///
    /// Errors: [`Error::Config`] for a placement of another number of layers, a p-tuning
    /// prefix on a device, or a tensor-parallel rank on one; the allocation and copy
    /// errors.
    pub fn place(self, exec: &Executor, placement: Placement) -> Result<SharedLlama> {
        placement.check(self.config.n_layers)?;
        if self.tp.is_some() && !placement.is_host() {
            return Err(Error::Config(
                "a tensor-parallel rank runs in host memory (NCCL placement is not built yet)"
                    .into(),
            ));
        }
        let move_to = |d: Data, at: Location| -> Result<Data> {
            if d.location() == at {
                Ok(d)
            } else {
                Ok(exec.to_device(&d, at, "load: weights")?)
            }
        };
        let w = self.weights;
        let (input, output) = (placement.input(), placement.output());
        let classifier = match w.classifier {
            Some(c) => Some(move_to(c, output)?),
            None if input != output => {
                Some(exec.to_device(&w.embedding, output, "load: weights")?)
            }
            None => None,
        };
        let layers = w
            .layers
            .into_iter()
            .enumerate()
            .map(|(l, lw)| {
                lw.try_map(|d, routed| {
                    let at = if routed {
                        placement.experts(l)
                    } else {
                        placement.layer(l)
                    };
                    move_to(d, at)
                })
            })
            .collect::<Result<_>>()?;
        let weights = LlamaWeights {
            embedding: move_to(w.embedding, input)?,
            layers,
            final_norm: move_to(w.final_norm, output)?,
            classifier,
            prefix_kv: w.prefix_kv,
            // The prediction layers draft in host memory ([`crate::speculative`]).
            mtp: w.mtp,
        };
        Ok(SharedLlama {
            weights,
            placement,
            ..self
        })
    }

    /// Where each layer runs.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The bytes each part of the model needs in the memory it is placed in, for
    /// [`Placement::fit`]: each layer's weights and KV cache (the whole context, of the
    /// element type [`KvDtype::on_device`] gives, the memory being a device's) and the
    /// share of its routed experts, the input side (the embedding table, and one set of
    /// activations for [`PREFILL_CHUNK`] rows), and the head (the final norm and an untied
    /// classifier).
    pub fn memory_needs(&self) -> MemoryNeeds {
        let (c, w) = (&self.config, &self.weights);
        let f32_bytes = |n: usize| (n as u64).saturating_mul(4);
        let kv = ((c.pre_seq_len + c.max_seq_len).saturating_mul(c.kv_values_per_position())
            as u64)
            .saturating_mul(self.kv_dtype.on_device().size_of() as u64);
        let layers = w
            .layers
            .iter()
            .map(|lw| {
                kv + lw
                    .tensors()
                    .iter()
                    .map(|d| d.size_bytes() as u64)
                    .sum::<u64>()
            })
            .collect();
        let rows = PREFILL_CHUNK.min(c.max_seq_len);
        let widths = 5 * c.dim + 3 * c.q_dim() + 2 * c.kv_dim() + 3 * c.hidden_dim;
        let activations = f32_bytes(rows * (widths + c.vocab_size.max(c.dim)));
        let input = w.embedding.size_bytes() as u64 + activations;
        let head =
            (w.final_norm.size_bytes() + w.classifier.as_ref().map_or(0, Data::size_bytes)) as u64;
        MemoryNeeds {
            layers,
            routed: w.layers.iter().map(routed_bytes).collect(),
            input,
            head,
        }
    }
}

/// Bytes of a layer's router and experts, the shared one included (0 for a dense
/// feed-forward).
fn routed_bytes(lw: &LlamaLayer) -> u64 {
    match &lw.ffn {
        Ffn::Moe {
            router,
            router_bias,
            router_logit_bias,
            experts,
            shared,
            ..
        } => experts
            .iter()
            .chain(shared.iter().map(|s| &s.ffn))
            .flat_map(|e| {
                [&e.gate, &e.up, &e.down]
                    .into_iter()
                    .chain(e.biases.iter().flatten())
            })
            .chain([router])
            .chain(router_bias)
            .chain(router_logit_bias)
            .chain(shared.iter().filter_map(|s| s.gate.as_ref()))
            .map(|d| d.size_bytes() as u64)
            .sum(),
        Ffn::Dense { .. } => 0,
    }
}
