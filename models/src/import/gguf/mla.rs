//! DeepSeek's multi-head latent attention in GGUF files (`deepseek2`), as llama.cpp's
//! converter writes it (`DeepseekV2Model`): one KV head, `attention.key_length` the latent
//! plus the rotated key, `key_length_mla` and `value_length_mla` the heads' own widths
//! (absent from files written before llama.cpp's absorbed MLA, whose `key_length` and
//! `value_length` are those widths), `q_lora_rank` where the query is compressed,
//! `kv_lora_rank`, and `rope.dimension_count` the rotated part. The query (`attn_q`, or
//! `attn_q_b`) and the latent with the rotated key (`attn_kv_a_mqa`) are read as row views
//! of flm's parts; `kv_b_proj` is `attn_kv_b` in older files, and in newer ones is split
//! into `attn_k_b` `[n_head, kv_lora, nope]` (each head's rows transposed) and `attn_v_b`
//! `[n_head, v, kv_lora]`, put back together on load ([`SplitKvB`]).

use std::ops::Range;

use flm_core::{Data, DataType};

use super::super::source::Assemble;
use super::super::SourceTensor;
use crate::tensor_names::{LayerPart, TensorName};
use crate::{MlaConfig, ModelConfig, Result};

/// Where a canonical tensor of multi-head latent attention is in a GGUF file.
pub(super) enum Source {
    /// Rows of one file tensor.
    Rows {
        file: String,
        ranges: Vec<Range<usize>>,
    },
    /// `kv_b_proj` from the split `attn_k_b` and `attn_v_b`.
    Split { k_b: String, v_b: String },
}

impl Source {
    /// The file tensors it reads.
    pub(super) fn files(&self) -> Vec<&str> {
        match self {
            Source::Rows { file, .. } => vec![file],
            Source::Split { k_b, v_b } => vec![k_b, v_b],
        }
    }

    /// The canonical tensor `name` of `shape` from the file tensors of [`Source::files`],
    /// each whole, in that order.
    pub(super) fn build(
        self,
        name: TensorName,
        shape: Vec<usize>,
        c: &ModelConfig,
        mut whole: Vec<SourceTensor>,
    ) -> Result<SourceTensor> {
        match self {
            Source::Rows { ranges, .. } => whole.remove(0).rows(name.to_string(), ranges),
            Source::Split { .. } => {
                let (v_b, k_b) = (whole.remove(1), whole.remove(0));
                let file = k_b.file().to_path_buf();
                let parts = SplitKvB {
                    k_b,
                    v_b,
                    heads: c.n_heads,
                    v: c.head_dim,
                };
                let dtype = DataType::F32;
                let name = name.to_string();
                Ok(SourceTensor::assembled(
                    name,
                    shape,
                    dtype,
                    &file,
                    std::sync::Arc::new(parts),
                ))
            }
        }
    }
}

/// Where canonical tensor `canonical` is in a file whose tensors are named by `has`, for a
/// model with multi-head latent attention; `None` for the tensors read whole as their
/// GGUF names say.
pub(super) fn source(
    canonical: TensorName,
    c: &ModelConfig,
    has: &dyn Fn(&str) -> bool,
) -> Option<Source> {
    let m: &MlaConfig = c.mla.as_ref()?;
    let TensorName::Layer(l, part) = canonical else {
        return None;
    };
    let q = if m.q_lora_rank.is_some() {
        "attn_q_b"
    } else {
        "attn_q"
    };
    let rows = |file: &str, ranges| Source::Rows {
        file: format!("blk.{l}.{file}.weight"),
        ranges,
    };
    let ([nope, rope], [latent, rotated]) = (m.query_rows(c.n_heads), m.kv_a_rows());
    Some(match part {
        LayerPart::QNope => rows(q, nope),
        LayerPart::QRope => rows(q, rope),
        LayerPart::KvA => rows("attn_kv_a_mqa", vec![latent]),
        LayerPart::KRope => rows("attn_kv_a_mqa", vec![rotated]),
        LayerPart::KvB if !has(&format!("blk.{l}.attn_kv_b.weight")) => Source::Split {
            k_b: format!("blk.{l}.attn_k_b.weight"),
            v_b: format!("blk.{l}.attn_v_b.weight"),
        },
        _ => return None,
    })
}

/// `kv_b_proj` `[n_head·(nope + v), kv_lora]` (each head's `W_UK_h` rows, then its `W_UV_h`
/// rows) put back together from llama.cpp's `attn_k_b` (`W_UK_hᵀ` per head) and `attn_v_b`,
/// in f32.
#[derive(Debug)]
struct SplitKvB {
    /// `[n_head·kv_lora, nope]` as the file's `[n_head, kv_lora, nope]` reads in rows.
    k_b: SourceTensor,
    /// `[n_head·v, kv_lora]`.
    v_b: SourceTensor,
    heads: usize,
    v: usize,
}

impl Assemble for SplitKvB {
    fn load(&self) -> Result<Data> {
        let (k_b, v_b) = (
            self.k_b.load()?.to_f32_vec()?,
            self.v_b.load()?.to_f32_vec()?,
        );
        let nope = self.k_b.shape.last().copied().unwrap_or(0);
        let rank = self.v_b.shape.last().copied().unwrap_or(0);
        let mut out = Vec::with_capacity(self.heads * (nope + self.v) * rank);
        for (uk_t, uv) in k_b
            .chunks_exact(rank * nope)
            .zip(v_b.chunks_exact(self.v * rank))
        {
            // `uk_t` is `[rank, nope]`: its transpose's rows, then the value rows.
            out.extend((0..nope * rank).map(|i| uk_t[(i % rank) * nope + i / rank]));
            out.extend_from_slice(uv);
        }
        Ok(Data::from_f32(&[self.heads * (nope + self.v), rank], &out)?)
    }

    fn note(&self) -> Option<String> {
        Some("kv_b_proj is put back together from attn_k_b and attn_v_b in f32".into())
    }

    fn release(&self) {
        self.k_b.release();
        self.v_b.release();
    }

    fn permuted(&self) -> bool {
        false
    }
}
