//! Multi-head latent attention in the Llama graph (DeepSeek-AI 2024, "DeepSeek-V2", §2.1;
//! [`crate::MlaConfig`]), in its absorbed form: per layer, from the normed hidden state `xb`
//!
//! ```text
//! q      = W_q · xb, or W_qb · RMSNorm(W_qa · xb)       split per head into q_nope, q_rope
//! c      = RMSNorm(W_kva · xb),  k_rope = W_krope · xb   (the cache holds c and k_rope)
//! q_lat  = W_UK_hᵀ · q_nope_h                           per head (Op::HeadLinear)
//! o_lat  = Attention(q_lat ‖ RoPE(q_rope); keys c ‖ RoPE(k_rope); values c)
//! att    = W_UV_h · o_lat_h                             per head, then W_o as usual
//! ```
//!
//! which is transformers' `DeepseekV2Attention` with its `kv_b_proj` multiplied into the
//! query and the output instead of into every cached latent: the scores and the outputs
//! are the same sums in another order, and the cache holds `kv_lora_rank + qk_rope_head_dim`
//! values per position instead of `n_heads · (qk_head_dim + v_head_dim)`.

use flm_core::{Data, Executor, LinearPart, Op};

use super::activations::Activations;
use super::LatentAttention;
use crate::{Error, ModelConfig, Result};

/// The activations of multi-head latent attention for up to a fixed number of rows.
pub(super) struct LatentScratch {
    /// The compressed query and its norm `[n, q_lora_rank]` each, with query compression.
    q_a: Option<[Data; 2]>,
    /// `[n, n_heads·qk_nope_head_dim]`.
    q_nope: Data,
    /// `[n, n_heads·qk_rope_head_dim]`: rotated in place, then attention's RoPE part.
    pub(super) q_rope: Data,
    /// `[n, kv_lora_rank]`: the latent before and after its norm (the new cache rows).
    latent_raw: Data,
    pub(super) latent: Data,
    /// `[n, qk_rope_head_dim]`: the shared key's rotated part (the new cache rows).
    pub(super) k_rope: Data,
    /// `[n, n_heads·kv_lora_rank]`: the absorbed queries, and attention's output over the
    /// latents.
    pub(super) q_latent: Data,
    pub(super) out_latent: Data,
}

impl LatentScratch {
    /// The scratch of `c`'s latent attention for `rows` rows, each tensor made by `zeros`;
    /// `None` without one.
    pub(super) fn alloc(
        c: &ModelConfig,
        rows: usize,
        zeros: &dyn Fn(&[usize]) -> flm_core::Result<Data>,
    ) -> Result<Option<LatentScratch>> {
        let Some(m) = &c.mla else {
            return Ok(None);
        };
        let z = |cols: usize| zeros(&[rows, cols]);
        let h = c.n_heads;
        Ok(Some(LatentScratch {
            q_a: m
                .q_lora_rank
                .map(|r| Ok::<_, flm_core::Error>([z(r)?, z(r)?]))
                .transpose()?,
            q_nope: z(h * m.qk_nope_head_dim)?,
            q_rope: z(h * m.qk_rope_head_dim)?,
            latent_raw: z(m.kv_lora_rank)?,
            latent: z(m.kv_lora_rank)?,
            k_rope: z(m.qk_rope_head_dim)?,
            q_latent: z(h * m.kv_lora_rank)?,
            out_latent: z(h * m.kv_lora_rank)?,
        }))
    }

    /// Shapes the scratch for `n` rows.
    pub(super) fn set_rows(&mut self, n: usize) -> flm_core::Result<()> {
        let parts = [
            &mut self.q_nope,
            &mut self.q_rope,
            &mut self.latent_raw,
            &mut self.latent,
            &mut self.k_rope,
            &mut self.q_latent,
            &mut self.out_latent,
        ];
        for d in parts.into_iter().chain(self.q_a.iter_mut().flatten()) {
            let cols = d.cols();
            d.set_shape(&[n, cols])?;
        }
        Ok(())
    }
}

/// The error of activations allocated without the scratch their model's configuration asks
/// for (a programming error of the graph, reported rather than a panic).
fn missing() -> Error {
    Error::State("latent attention without its activations".into())
}

/// From `s.xb`: the query parts, the normed latent and the rotated key (not yet rotated),
/// and the absorbed queries `q_latent` (see the module docs). Without query compression
/// the four projections of `xb` are one op, one fork and join in decode.
pub(super) fn project(
    exec: &Executor,
    c: &ModelConfig,
    a: &LatentAttention,
    s: &mut Activations,
) -> Result<()> {
    let Activations { xb, latent, .. } = s;
    let t = latent.as_mut().ok_or_else(missing)?;
    match (&a.q_a, &mut t.q_a) {
        (Some([w_qa, qa_norm]), Some([qa, qa_normed])) => {
            exec.run(Op::Linears {
                input: xb,
                parts: &mut [
                    LinearPart::new(w_qa, None, qa),
                    LinearPart::new(&a.wkv_a, None, &mut t.latent_raw),
                    LinearPart::new(&a.wk_rope, None, &mut t.k_rope),
                ],
            })?;
            exec.run(Op::RmsNorm {
                input: qa,
                weight: qa_norm,
                eps: c.norm_eps,
                output: qa_normed,
            })?;
            exec.run(Op::Linears {
                input: qa_normed,
                parts: &mut [
                    LinearPart::new(&a.wq_nope, None, &mut t.q_nope),
                    LinearPart::new(&a.wq_rope, None, &mut t.q_rope),
                ],
            })?;
        }
        (None, _) => exec.run(Op::Linears {
            input: xb,
            parts: &mut [
                LinearPart::new(&a.wq_nope, None, &mut t.q_nope),
                LinearPart::new(&a.wq_rope, None, &mut t.q_rope),
                LinearPart::new(&a.wkv_a, None, &mut t.latent_raw),
                LinearPart::new(&a.wk_rope, None, &mut t.k_rope),
            ],
        })?,
        (Some(_), None) => return Err(missing()),
    }
    exec.run(Op::RmsNorm {
        input: &t.latent_raw,
        weight: &a.kv_a_norm,
        eps: c.norm_eps,
        output: &mut t.latent,
    })?;
    exec.run(Op::HeadLinear {
        input: &t.q_nope,
        weights: &a.k_absorb,
        output: &mut t.q_latent,
    })?;
    Ok(())
}

/// Each head's output from its attention over the latents: `s.att = W_UV_h · o_lat_h`.
pub(super) fn values(exec: &Executor, a: &LatentAttention, s: &mut Activations) -> Result<()> {
    let Activations { latent, att, .. } = s;
    let t = latent.as_ref().ok_or_else(missing)?;
    exec.run(Op::HeadLinear {
        input: &t.out_latent,
        weights: &a.v_absorb,
        output: att,
    })?;
    Ok(())
}
