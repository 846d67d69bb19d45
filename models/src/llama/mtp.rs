//! Multi-token prediction (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §2.2) as a
//! draft for speculative decoding, the way vLLM and SGLang run DeepSeek-V3's and GLM-4.5's
//! prediction layers ([`MtpLayer`]).
//!
//! Prediction layer `j` at position `i` combines the model's final-normed hidden state
//! `h_i` with the embedding of the token at `i + 1`, runs its transformer layer at position
//! `i` over a KV cache of its own, and its logits draft the token at `i + 2`. The model's
//! hidden states come from its passes, kept per position ([`MtpState::keep`]) until a
//! prediction call reads them; drafting further than one token chains the layer on its own
//! output (vLLM's `previous_hidden_states` of a later speculative step).
//!
//! The layers run in host memory, with the model's host activations: a model placed on a
//! device has no kept hidden states ([`MtpState::new`] refuses it).

use flm_core::{Data, DataType, Executor, KvCache, Op, TokenIds};

use super::{block, finish, linear, rotate_and_attend, Activations, Head, Logits, SharedLlama};
use super::{check_forward, PREFILL_CHUNK};
#[cfg(doc)]
use crate::MtpLayer;
use crate::{Error, MtpInput, Result};

/// An instance's prediction-layer state.
pub(super) struct MtpState {
    /// One layer per prediction layer, for the whole context.
    kv: KvCache,
    /// The model's final-normed hidden states `[rows, dim]` of positions `hidden_start..`,
    /// row-major.
    hidden: Vec<f32>,
    hidden_start: usize,
    /// The output `[dim]` of the last row of the latest call, before its norm; empty
    /// before a call.
    previous: Vec<f32>,
    /// Where a call writes that output, swapped into `previous` when it succeeds.
    output: Vec<f32>,
    /// f32 `[PREFILL_CHUNK, dim]`: the hidden states a call reads.
    input: Data,
    /// f32 `[PREFILL_CHUNK, 2·dim]`: the normed embeddings and hidden states side by side.
    both: Data,
}

impl MtpState {
    /// The state of `model`'s prediction layers, with an empty KV cache.
    ///
    /// Errors: [`Error::Config`] for a model without prediction layers or placed on a
    /// device; an allocation failure.
    pub(super) fn new(model: &SharedLlama) -> Result<MtpState> {
        let c = &model.config;
        if model.weights.mtp.is_empty() {
            return Err(Error::Config(
                "this model has no multi-token-prediction layers (its checkpoint holds no \
                 weights for them)"
                    .into(),
            ));
        }
        if !model.placement.is_host() {
            return Err(Error::Config(
                "multi-token prediction runs on the CPU only: load the model without \
                 --gpu-layers"
                    .into(),
            ));
        }
        let rows = PREFILL_CHUNK.min(c.max_seq_len);
        Ok(MtpState {
            kv: KvCache::new(
                model.weights.mtp.len(),
                c.max_seq_len,
                c.kv_widths(),
                model.kv_dtype.on_host(),
            )?,
            hidden: Vec::new(),
            hidden_start: 0,
            previous: Vec::new(),
            output: Vec::new(),
            input: Data::zeros(DataType::F32, &[rows, c.dim])?,
            both: Data::zeros(DataType::F32, &[rows, 2 * c.dim])?,
        })
    }

    /// Keeps the final-normed hidden states of a pass over positions `pos..` whose last
    /// layer's output is in `s.x`, replacing those kept for these positions and later ones
    /// (the cache's rule: a pass overwrites what follows it).
    pub(super) fn keep(
        &mut self,
        exec: &Executor,
        model: &SharedLlama,
        s: &mut Activations,
        pos: usize,
    ) -> Result<()> {
        let dim = model.config.dim;
        s.xb.set_shape(&[s.x.rows(), dim])?;
        exec.run(Op::RmsNorm {
            input: &s.x,
            weight: &model.weights.final_norm,
            eps: model.config.norm_eps,
            output: &mut s.xb,
        })?;
        let end = self.hidden_start + self.hidden.len() / dim;
        if pos < self.hidden_start || pos > end {
            self.hidden.clear();
            self.hidden_start = pos;
        }
        self.hidden.truncate((pos - self.hidden_start) * dim);
        self.hidden.extend_from_slice(s.xb.as_f32()?);
        Ok(())
    }

    /// [`crate::Graph::mtp_forward`] with `states`, the model's host activations.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward<'s>(
        &mut self,
        exec: &Executor,
        model: &SharedLlama,
        states: &'s mut [Activations],
        layer: usize,
        tokens: &[u32],
        start_pos: usize,
        input: MtpInput,
    ) -> Result<&'s [f32]> {
        let c = &model.config;
        check_forward(c, tokens, start_pos)?;
        if layer >= model.weights.mtp.len() {
            return Err(Error::InvalidInput(format!(
                "prediction layer {layer} of {}",
                model.weights.mtp.len()
            )));
        }
        let [s] = states else {
            return Err(Error::State(
                "multi-token prediction needs the activations of a model in host memory".into(),
            ));
        };
        let (dim, n) = (c.dim, tokens.len());
        let (tokens, start_pos) = match input {
            // Positions read by an earlier call are not kept: skipped, their cache rows keep
            // what that call stored (a new prompt that differs from the old one there).
            MtpInput::Model if start_pos < self.hidden_start => {
                let skip = (self.hidden_start - start_pos).min(n - 1);
                (&tokens[skip..], start_pos + skip)
            }
            _ => (tokens, start_pos),
        };
        let n = tokens.len();
        // The rows read are taken out of `self` for the call, and put back or reused after
        // it, so that a warm call allocates nothing.
        let (source, first) = match input {
            MtpInput::Model => {
                let rows = self.hidden.len() / dim;
                match start_pos.checked_sub(self.hidden_start) {
                    Some(f) if f + n <= rows => (std::mem::take(&mut self.hidden), f),
                    _ => {
                        return Err(Error::State(format!(
                            "the model's hidden states of positions {start_pos}..{} are not \
                             kept (positions {}..{} are)",
                            start_pos + n,
                            self.hidden_start,
                            self.hidden_start + rows
                        )))
                    }
                }
            }
            MtpInput::Previous if n == 1 && !self.previous.is_empty() => {
                (std::mem::take(&mut self.previous), 0)
            }
            MtpInput::Previous => {
                return Err(Error::State(
                    "chaining a prediction layer takes one row, after a call".into(),
                ))
            }
        };
        let chunk = self.input.rows();
        let result = tokens.chunks(chunk).enumerate().try_for_each(|(k, part)| {
            let at = (first + k * chunk) * dim;
            let rows = &source[at..at + part.len() * dim];
            self.chunk(exec, model, s, layer, part, start_pos + k * chunk, rows)
        });
        match (input, result.is_ok()) {
            (MtpInput::Model, ok) => {
                self.hidden = source;
                if ok {
                    // The positions read are no longer needed: later calls start after them.
                    self.hidden
                        .drain(..(start_pos + n - self.hidden_start) * dim);
                    self.hidden_start = start_pos + n;
                    std::mem::swap(&mut self.previous, &mut self.output);
                }
            }
            (MtpInput::Previous, true) => {
                self.previous = std::mem::replace(&mut self.output, source);
            }
            (MtpInput::Previous, false) => self.previous = source,
        }
        result?;
        Ok(s.logits.as_f32()?)
    }

    /// One chunk of [`MtpState::forward`]: `tokens` at positions `pos..` with the hidden
    /// states `hidden` `[tokens.len() · dim]`; leaves the last row's logits in `s.logits`
    /// and its output in `self.output`.
    #[allow(clippy::too_many_arguments)]
    fn chunk(
        &mut self,
        exec: &Executor,
        model: &SharedLlama,
        s: &mut Activations,
        layer: usize,
        tokens: &[u32],
        pos: usize,
        hidden: &[f32],
    ) -> Result<()> {
        let (c, w) = (&model.config, &model.weights);
        let p = &w.mtp[layer];
        let (n, dim, eps) = (tokens.len(), c.dim, c.norm_eps);
        s.set_rows(c, n)?;
        exec.run(Op::Embedding {
            table: &w.embedding,
            tokens: TokenIds::Host(tokens),
            output: &mut s.x,
        })?;
        if let Some(alpha) = c.embed_scale {
            exec.run(Op::Scale { x: &mut s.x, alpha })?;
        }
        exec.run(Op::RmsNorm {
            input: &s.x,
            weight: &p.embed_norm,
            eps,
            output: &mut s.xb,
        })?;
        self.input.set_shape(&[n, dim])?;
        self.input.as_f32_mut()?.copy_from_slice(hidden);
        exec.run(Op::RmsNorm {
            input: &self.input,
            weight: &p.hidden_norm,
            eps,
            output: &mut s.xb2,
        })?;
        // Row i of `[n, 2·dim]` is rows 2i and 2i + 1 of the same bytes as `[2n, dim]`.
        self.both.set_shape(&[2 * n, dim])?;
        for i in 0..n {
            for (src, half) in [(&s.xb, 0), (&s.xb2, 1)] {
                exec.run(Op::CopyRows {
                    src: (src, i),
                    dst: (&mut self.both, 2 * i + half),
                    n_rows: 1,
                })?;
            }
        }
        self.both.set_shape(&[n, 2 * dim])?;
        linear(exec, &self.both, &p.projection, None, &mut s.x)?;
        let l = c.n_layers + layer;
        let rope_pos = pos + model.rope.offset(pos + n);
        let kv = &mut self.kv;
        block(exec, c, l, &p.layer, None, s, &mut |l, s| {
            rotate_and_attend(exec, model, l, s, kv.layer_mut(layer), rope_pos, pos)
        })?;
        let out = s.x.as_f32()?;
        self.output.clear();
        self.output.extend_from_slice(&out[(n - 1) * dim..n * dim]);
        finish(
            exec,
            model,
            s,
            Head::Logits(Logits::Last),
            &[n - 1],
            &p.head_norm,
        )
    }
}
