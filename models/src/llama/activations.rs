//! The activations of a Llama forward pass and where they live: one set per memory the
//! model's layers are placed in ([`Placement::locations`]), allocated once for a number
//! of rows and reshaped for each chunk.

use flm_core::{
    AttentionOperands, AttentionParams, Data, DataType, DecoupledRope, Executor, Location,
};

use super::latent::LatentScratch;
use super::SharedLlama;
#[cfg(doc)]
use super::{Llama, SharedExpert};
#[cfg(doc)]
use crate::Placement;
use crate::{Error, ModelConfig, Result};

/// Activations for up to a fixed number of rows (tokens), allocated once.
pub(super) struct Activations {
    pub(super) x: Data,
    pub(super) xb: Data,
    pub(super) xb2: Data,
    pub(super) q: Data,
    pub(super) k: Data,
    pub(super) v: Data,
    pub(super) att: Data,
    /// The per-head norms' output (Qwen3), `[n · heads, head_dim]` of up to `q_dim` per row.
    pub(super) heads: Data,
    pub(super) gate: Data,
    pub(super) up: Data,
    pub(super) hidden: Data,
    pub(super) last: Data,
    pub(super) logits: Data,
    /// The routed experts' input and output `[n, dim]` in their memory, when it is not this
    /// one's ([`Placement::with_experts_on`]).
    pub(super) experts_io: Option<(Data, Data)>,
    /// The shared expert's activations, in the routed experts' memory (Qwen2-MoE).
    pub(super) shared: Option<SharedScratch>,
    /// i32 `[n]`: the token ids copied to a device's memory for the embedding, when the
    /// activations are there.
    pub(super) ids: Option<Data>,
    /// Multi-head latent attention's activations, when the model has it.
    pub(super) latent: Option<LatentScratch>,
}

/// What attention reads from and writes to a set of activations: the new rows of the
/// layer's two cache tensors, the queries (and their decoupled RoPE part) and the output.
pub(crate) struct AttentionIo<'a> {
    /// The rows of the keys and values, or of the latents and rotated keys.
    pub(crate) new_rows: [&'a Data; 2],
    pub(crate) q: &'a Data,
    /// With multi-head latent attention: the queries' rotated part, attending to the
    /// second cache tensor, while the first is both the keys' other part and the values.
    pub(crate) q_rope: Option<&'a Data>,
    /// Each query head's attention-sink logit (gpt-oss), set by the caller that has the
    /// layer's weights.
    pub(crate) sinks: Option<&'a Data>,
    pub(crate) output: &'a mut Data,
}

impl AttentionIo<'_> {
    /// The operands of attention over a layer's `cache`, its two tensors as
    /// [`AttentionIo::new_rows`] fills them.
    pub(super) fn operands<'a>(
        &'a mut self,
        (first, second): (&'a Data, &'a Data),
        params: AttentionParams,
    ) -> AttentionOperands<'a> {
        let (cache_v, rope) = match self.q_rope {
            Some(q) => (first, Some(DecoupledRope { q, cache: second })),
            None => (second, None),
        };
        AttentionOperands {
            q: self.q,
            cache_k: first,
            cache_v,
            rope,
            params,
            sinks: self.sinks,
            output: self.output,
        }
    }
}

/// The activations of a shared expert ([`SharedExpert`]) for up to a fixed number of rows.
pub(super) struct SharedScratch {
    /// `[n, shared_expert_dim]` each: the gate and up projections, and their SwiGLU.
    pub(super) gate: Data,
    pub(super) up: Data,
    pub(super) hidden: Data,
    /// `[n, dim]`: the down projection.
    pub(super) out: Data,
    /// `[n, 1]`: the gate's logit.
    pub(super) score: Data,
}

impl SharedScratch {
    /// The scratch of `c`'s shared expert, if it has one, each made by `zeros`.
    fn alloc(
        c: &ModelConfig,
        rows: usize,
        zeros: &dyn Fn(&[usize]) -> flm_core::Result<Data>,
    ) -> Result<Option<SharedScratch>> {
        let Some(d) = c.moe.as_ref().and_then(|m| m.shared_expert_dim) else {
            return Ok(None);
        };
        Ok(Some(SharedScratch {
            gate: zeros(&[rows, d])?,
            up: zeros(&[rows, d])?,
            hidden: zeros(&[rows, d])?,
            out: zeros(&[rows, c.dim])?,
            score: zeros(&[rows, 1])?,
        }))
    }

    /// Shapes the scratch for `n` rows.
    pub(super) fn set_rows(&mut self, n: usize) -> flm_core::Result<()> {
        for d in [
            &mut self.gate,
            &mut self.up,
            &mut self.hidden,
            &mut self.out,
        ] {
            let cols = d.cols();
            d.set_shape(&[n, cols])?;
        }
        self.score.set_shape(&[n, 1])
    }
}

impl Activations {
    /// Zeroed activations of `c`'s widths for `rows` rows in host memory.
    pub(super) fn new(c: &ModelConfig, rows: usize) -> Result<Activations> {
        Activations::alloc(c, rows, &|shape| Data::zeros(DataType::F32, shape))
    }

    /// As [`Activations::new`], in the memory of `at`, allocated by `exec`, with the
    /// experts' input and output in `experts` when the model has experts there.
    pub(super) fn on(
        exec: &Executor,
        (at, experts): (Location, Location),
        c: &ModelConfig,
        rows: usize,
    ) -> Result<Activations> {
        let mut s = Activations::alloc(c, rows, &|shape| exec.zeros(DataType::F32, shape, at))?;
        if at != Location::Host {
            s.ids = Some(exec.zeros(DataType::I32, &[rows], at)?);
        }
        if c.moe.is_some() && experts != at {
            let z = |shape: &[usize]| exec.zeros(DataType::F32, shape, experts);
            s.experts_io = Some((z(&[rows, c.dim])?, z(&[rows, c.dim])?));
            s.shared = SharedScratch::alloc(c, rows, &z)?;
        }
        Ok(s)
    }

    /// The activations, each made by `zeros` from its shape.
    fn alloc(
        c: &ModelConfig,
        rows: usize,
        zeros: &dyn Fn(&[usize]) -> flm_core::Result<Data>,
    ) -> Result<Activations> {
        let (dim, hd, q_dim, kv_dim) = (c.dim, c.hidden_dim, c.q_dim(), c.kv_dim());
        let z = |cols: usize| zeros(&[rows, cols]);
        Ok(Activations {
            x: z(dim)?,
            xb: z(dim)?,
            xb2: z(dim)?,
            q: z(q_dim)?,
            k: z(kv_dim)?,
            v: z(kv_dim)?,
            att: z(q_dim)?,
            heads: z(q_dim)?,
            gate: z(hd)?,
            up: z(hd)?,
            hidden: z(hd)?,
            last: z(dim)?,
            logits: z(c.vocab_size.max(dim))?,
            experts_io: None,
            shared: SharedScratch::alloc(c, rows, zeros)?,
            ids: None,
            latent: LatentScratch::alloc(c, rows, zeros)?,
        })
    }

    /// The rows RoPE rotates and their heads: the queries and the keys, or with multi-head
    /// latent attention their rotated parts.
    pub(super) fn rotated(&mut self, c: &ModelConfig) -> [(&mut Data, usize); 2] {
        match &mut self.latent {
            Some(t) => [(&mut t.q_rope, c.n_heads), (&mut t.k_rope, 1)],
            None => [(&mut self.q, c.n_heads), (&mut self.k, c.n_kv_heads)],
        }
    }

    /// What the layer's attention reads and writes here.
    pub(super) fn attention_io(&mut self) -> AttentionIo<'_> {
        match &mut self.latent {
            Some(t) => AttentionIo {
                new_rows: [&t.latent, &t.k_rope],
                q: &t.q_latent,
                q_rope: Some(&t.q_rope),
                sinks: None,
                output: &mut t.out_latent,
            },
            None => AttentionIo {
                new_rows: [&self.k, &self.v],
                q: &self.q,
                q_rope: None,
                sinks: None,
                output: &mut self.att,
            },
        }
    }

    /// Shapes the per-token activations for `n` rows (at most the rows allocated).
    pub(super) fn set_rows(&mut self, c: &ModelConfig, n: usize) -> Result<()> {
        for (data, cols) in [
            (&mut self.x, c.dim),
            (&mut self.xb, c.dim),
            (&mut self.xb2, c.dim),
            (&mut self.q, c.q_dim()),
            (&mut self.k, c.kv_dim()),
            (&mut self.v, c.kv_dim()),
            (&mut self.att, c.q_dim()),
            (&mut self.gate, c.hidden_dim),
            (&mut self.up, c.hidden_dim),
            (&mut self.hidden, c.hidden_dim),
        ] {
            data.set_shape(&[n, cols])?;
        }
        if let Some((x, y)) = &mut self.experts_io {
            x.set_shape(&[n, c.dim])?;
            y.set_shape(&[n, c.dim])?;
        }
        if let Some(shared) = &mut self.shared {
            shared.set_rows(n)?;
        }
        if let Some(latent) = &mut self.latent {
            latent.set_rows(n)?;
        }
        Ok(())
    }
}

/// The activations of the last layer's memory (`states` as [`Llama`] holds them).
///
/// Errors: [`Error::State`] before the first forward pass.
pub(super) fn output_state<'a>(
    model: &SharedLlama,
    states: &'a [Activations],
) -> Result<&'a Activations> {
    let output = model.placement.output();
    let memory = model
        .placement
        .locations()
        .iter()
        .position(|&m| m == output);
    memory
        .and_then(|i| states.get(i))
        .ok_or_else(|| Error::State("no forward pass has run".into()))
}

/// Activations for `rows` rows in each memory of `model`'s [`Placement::locations`], in
/// that order, allocated there by `exec`.
pub(super) fn placed_states(
    exec: &Executor,
    model: &SharedLlama,
    rows: usize,
) -> Result<Vec<Activations>> {
    let (c, p) = (&model.config, &model.placement);
    p.locations()
        .into_iter()
        .map(|at| {
            // Each memory's layers have their experts in one memory.
            let experts = (0..c.n_layers)
                .find(|&l| p.layer(l) == at)
                .map_or(at, |l| p.experts(l));
            Activations::on(exec, (at, experts), c, rows)
        })
        .collect()
}

/// The last chunk's logits (or hidden states) in host memory: those of the activations of
/// the last layer's memory (`states` as [`Llama`] holds them), copied into `host_out` first
/// when that memory is a device's.
pub(super) fn host_output<'a>(
    model: &SharedLlama,
    states: &'a [Activations],
    host_out: &'a mut Option<Data>,
    exec: &Executor,
) -> Result<&'a [f32]> {
    let out = &output_state(model, states)?.logits;
    if out.location() == Location::Host {
        return Ok(out.as_f32()?);
    }
    let mut host = match host_out.take() {
        Some(h) => h,
        None => Data::zeros(DataType::F32, out.shape())?,
    };
    // The buffer keeps its capacity: it grows only for a chunk longer than any before.
    if host.set_shape(out.shape()).is_err() {
        host = Data::zeros(DataType::F32, out.shape())?;
    }
    let host = host_out.insert(host);
    exec.copy_into(out, host, "logits to host")?;
    Ok(host.as_f32()?)
}
