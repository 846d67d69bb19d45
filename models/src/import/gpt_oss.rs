//! gpt-oss's stacked experts in Hugging Face checkpoints (transformers' `GptOssExperts`),
//! split into flm's canonical per-expert tensors.
//!
//! transformers stores each layer's experts as four stacked tensors, applied as `x @ W`
//! (not transposed as `nn.Linear` weights are):
//!
//! - `mlp.experts.gate_up_proj` `[E, dim, 2·inner]` with gate and up interleaved on the last
//!   axis (column `2j` is gate `j`, `2j + 1` is up `j`), and `gate_up_proj_bias`
//!   `[E, 2·inner]`, interleaved too;
//! - `mlp.experts.down_proj` `[E, inner, dim]` and `down_proj_bias` `[E, dim]`.
//!
//! Expert `e`'s gate becomes `[inner, dim]` (the even columns of its block, transposed), its
//! up the odd ones, its down `[dim, inner]`; each is read from its own block of the stacked
//! tensor on load, in the stored dtype, and the biases in f32. The released checkpoints
//! hold the experts in MXFP4 (`*_blocks`, `*_scales`), which flm does not read yet.

use std::collections::HashMap;

use flm_core::{Data, DataType};

use super::source::{Assemble, SourceTensor};
use crate::tensor_names::{LayerPart, TensorName};
use crate::{Error, ModelConfig, Result};

/// Which slice of a stacked expert tensor an [`ExpertSlice`] reads.
#[derive(Debug, Clone, Copy)]
enum Slice {
    /// Every other column from `first` (0: gate, 1: up) of `[dim, 2·inner]`, transposed.
    GateUp { first: usize },
    /// `[inner, dim]` transposed.
    Down,
    /// Every other value from `first` of `[2·inner]`.
    GateUpBias { first: usize },
    /// `[dim]` as it is.
    DownBias,
}

/// One expert's tensor, read from its block of a stacked tensor.
#[derive(Debug)]
struct ExpertSlice {
    /// The expert's block `[1, ...]` of the stacked tensor.
    block: SourceTensor,
    slice: Slice,
    /// The loaded dtype: the stored one for a matrix, f32 for a bias.
    dtype: DataType,
}

impl Assemble for ExpertSlice {
    fn load(&self) -> Result<Data> {
        let v = self.block.load()?.to_f32_vec()?;
        let shape = &self.block.shape;
        let (values, out_shape): (Vec<f32>, Vec<usize>) = match self.slice {
            Slice::GateUp { first } => {
                let (dim, wide) = (shape[1], shape[2]);
                let inner = wide / 2;
                let out = (0..inner * dim)
                    .map(|i| v[(i % dim) * wide + 2 * (i / dim) + first])
                    .collect();
                (out, vec![inner, dim])
            }
            Slice::Down => {
                let (inner, dim) = (shape[1], shape[2]);
                let out = (0..dim * inner)
                    .map(|i| v[(i % inner) * dim + i / inner])
                    .collect();
                (out, vec![dim, inner])
            }
            Slice::GateUpBias { first } => {
                let out: Vec<f32> = v.iter().skip(first).step_by(2).copied().collect();
                let len = out.len();
                (out, vec![len])
            }
            Slice::DownBias => {
                let len = v.len();
                (v, vec![len])
            }
        };
        let data = Data::from_f32(&out_shape, &values)?;
        if self.dtype == DataType::F32 {
            Ok(data)
        } else {
            Ok(data.to_dtype(self.dtype)?)
        }
    }

    fn note(&self) -> Option<String> {
        None
    }

    fn release(&self) {
        self.block.release();
    }

    fn permuted(&self) -> bool {
        false
    }
}

/// The canonical tensors of every expert of `c`'s layers, from the stacked tensors of
/// `by_name` (removed from it); none for a model without expert biases.
///
/// Errors: [`Error::Config`] for a missing stacked tensor or one of another shape than
/// `c`'s experts.
pub(super) fn split(
    c: &ModelConfig,
    by_name: &mut HashMap<String, SourceTensor>,
) -> Result<HashMap<TensorName, SourceTensor>> {
    let mut out = HashMap::new();
    let Some(m) = c.moe.as_ref().filter(|m| m.expert_biases) else {
        return Ok(out);
    };
    let (n, dim, inner) = (m.n_experts, c.dim, m.expert_dim);
    for l in 0..c.n_layers {
        let mut take = |name: &str, shape: &[usize]| -> Result<SourceTensor> {
            let full = format!("model.layers.{l}.mlp.experts.{name}");
            let Some(t) = by_name.remove(&full) else {
                let mxfp4 = by_name.contains_key(&format!("{full}_blocks"));
                return Err(Error::Config(if mxfp4 {
                    format!(
                        "{full} is stored in MXFP4 ({full}_blocks), which flm does not read yet"
                    )
                } else {
                    format!("gpt_oss checkpoint without {full}")
                }));
            };
            if t.shape != shape {
                return Err(Error::Config(format!(
                    "{full} has shape {:?}, the configuration implies {shape:?}",
                    t.shape
                )));
            }
            Ok(t)
        };
        let parts = [
            (
                take("gate_up_proj", &[n, dim, 2 * inner])?,
                [
                    (LayerPart::WGate, Slice::GateUp { first: 0 }),
                    (LayerPart::WUp, Slice::GateUp { first: 1 }),
                ]
                .to_vec(),
            ),
            (
                take("gate_up_proj_bias", &[n, 2 * inner])?,
                [
                    (LayerPart::BGate, Slice::GateUpBias { first: 0 }),
                    (LayerPart::BUp, Slice::GateUpBias { first: 1 }),
                ]
                .to_vec(),
            ),
            (
                take("down_proj", &[n, inner, dim])?,
                [(LayerPart::WDown, Slice::Down)].to_vec(),
            ),
            (
                take("down_proj_bias", &[n, dim])?,
                [(LayerPart::BDown, Slice::DownBias)].to_vec(),
            ),
        ];
        for (stacked, slices) in parts {
            for e in 0..n {
                let expert = e..e + 1;
                let block = stacked.rows(format!("{}.{e}", stacked.name), vec![expert])?;
                for &(part, slice) in &slices {
                    let name = TensorName::Expert(l, e, part);
                    let (shape, dtype) = match slice {
                        Slice::GateUp { .. } => (vec![inner, dim], stacked.encoding.load_dtype()),
                        Slice::Down => (vec![dim, inner], stacked.encoding.load_dtype()),
                        Slice::GateUpBias { .. } => (vec![inner], DataType::F32),
                        Slice::DownBias => (vec![dim], DataType::F32),
                    };
                    let t = SourceTensor::assembled(
                        name.to_string(),
                        shape,
                        dtype,
                        stacked.file(),
                        std::sync::Arc::new(ExpertSlice {
                            block: block.clone(),
                            slice,
                            dtype,
                        }),
                    );
                    out.insert(name, t);
                }
            }
        }
    }
    Ok(out)
}
