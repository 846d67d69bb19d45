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
//! The same graph runs, by configuration ([`ModelConfig`]), the Llama-like families:
//! - ChatGLM2/3 and GLM-4 (THUDM): q/k/v biases, multi-query attention with KV groups,
//!   RoPE in adjacent pairs on the first half of each head (`rotary_dim = head_dim / 2`),
//!   SwiGLU (see [`crate::chatglm`] for the mapping of their fused tensors);
//! - Baichuan: W_pack split into q/k/v; Baichuan-13B replaces RoPE with ALiBi
//!   (Press et al. 2022);
//! - InternLM: q/k/v and output-projection biases;
//! - Llama 3 / 3.1: RoPE θ = 500000 and the llama3 frequency scaling
//!   ([`flm_core::RopeScaling`]);
//! - Mistral: sliding-window attention (each token sees the last `sliding_window`
//!   positions; the KV cache keeps them all);
//! - Qwen2: q/k/v biases, no output-projection bias;
//! - Mixtral and Qwen3-MoE: a mixture of experts (Shazeer et al. 2017) replaces the SwiGLU
//!   of their MoE layers ([`crate::MoeConfig`], [`Ffn::Moe`]): each token's router picks
//!   `top_k` SwiGLU experts and sums their outputs weighted by the routing probabilities
//!   ([`Op::MoeFfn`]); Qwen3-MoE's `mlp_only_layers` keep the dense feed-forward;
//!   Qwen2-MoE adds a shared expert that every token runs, weighted by a sigmoid gate
//!   ([`SharedExpert`], [`Op::GatedAdd`]);
//! - P-tuning v2 prefixes (Liu et al. 2022): `pre_seq_len` keys and values per layer sit in
//!   the KV cache before the sequence and are always attended; the tokens keep positions
//!   from 0, so cache row = `pre_seq_len` + position.
//!
//! The model is split in two: [`SharedLlama`] holds what never changes (configuration,
//! weights, RoPE table) and is shared through an [`Arc`]; [`Llama`] adds what a sequence
//! being generated mutates (KV cache, with the p-tuning prefix
//! copied in, and activations). Several [`Llama`] instances over one
//! `Arc<SharedLlama>` generate independently, on different threads, with one copy of the
//! weights.
//!
//! [`LlamaBatch`] runs the same layers over the rows of many sequences at once, each with
//! its own positions and block table in a paged KV cache (the serving engine's step); the
//! layer loop and the final head are shared with [`Graph::forward`].
//!
//! This file is the forward pass; where the model's parts run ([`SharedLlama::place`],
//! `placement.rs`) and the activations of each memory (`activations.rs`) are apart.

use std::sync::Arc;

use flm_core::comm::{all_reduce_data, Communicator};
use flm_core::{
    AttentionParams, Data, DataType, Error as CoreError, Executor, KvCache, KvDtype, LinearPart,
    Location, MoeRouting, Op, RopeTable, StepInputs, TokenIds,
};

pub use crate::graph::Logits;
use crate::graph::{BatchedForward, Graph, Head, MemoryNeeds, MtpInput, SharedGraph};
use crate::{Activation, Error, Model, ModelConfig, Placement, Result, SharedModel};

mod activations;
mod batch;
mod latent;
mod mtp;
mod placement;
mod shard;
mod step_graphs;
mod weights;

pub(crate) use activations::AttentionIo;
use activations::{host_output, output_state, placed_states, Activations, SharedScratch};

pub use batch::LlamaBatch;
use mtp::MtpState;
use shard::TpShard;
use step_graphs::{StepGraphs, StepPlan};

pub(crate) use weights::check_all_shapes;
pub(crate) use weights::{cpu_layout, Tensors};
pub use weights::{
    Attention, Ffn, LatentAttention, LlamaLayer, LlamaWeights, MtpLayer, QkvProjections,
    SharedExpert,
};

/// Tokens processed per forward pass during prefill; bounds the activation memory.
pub const PREFILL_CHUNK: usize = 128;

/// The immutable part of a Llama model: configuration, weights, RoPE table and where each
/// layer runs ([`Placement`]). It is `Send + Sync`; share it with an [`Arc`] between
/// [`Llama`] instances.
pub struct SharedLlama {
    config: ModelConfig,
    weights: LlamaWeights,
    rope: RopeTable,
    /// The RoPE of the sliding-window layers, where it differs (Gemma 3).
    rope_local: Option<RopeTable>,
    placement: Placement,
    /// The element type of its instances' KV caches.
    kv_dtype: KvDtype,
    /// This rank's part of a tensor-parallel group; `None` for a whole model.
    tp: Option<TpShard>,
}

/// A Llama model ready to run: the shared [`SharedLlama`] plus its own KV cache (for
/// `config.max_seq_len` positions) and activations, in the memories of the model's
/// [`Placement`].
pub struct Llama {
    model: Arc<SharedLlama>,
    /// `None` until the first forward pass of a model placed on a device, which allocates
    /// it there.
    kv: Option<KvCache>,
    /// The activations of each memory of [`Placement::locations`], in that order.
    states: Vec<Activations>,
    /// The logits (or hidden states) copied to the host, when the last layer is on a
    /// device.
    host_out: Option<Data>,
    /// Rows of every chunk of a multi-chunk [`Logits::All`] or hidden-state call.
    all_rows: Vec<f32>,
    /// The decode steps captured as step graphs (CUDA graphs), by batch size.
    graphs: StepGraphs,
    /// What the current call adds to its positions to read its RoPE rows
    /// ([`RopeTable::offset`]: LongRoPE's long factors once the sequence is longer than
    /// the pre-training context).
    rope_offset: usize,
    /// The prediction layers' KV cache and inputs, once [`Graph::keep_mtp_hidden`] asked
    /// for them.
    mtp: Option<MtpState>,
}

/// Checks the arguments of a forward pass before anything is computed.
///
/// Errors: no tokens, a token id outside the vocabulary, or `start_pos + tokens.len()`
/// beyond the context length.
pub(crate) fn check_forward(config: &ModelConfig, tokens: &[u32], start_pos: usize) -> Result<()> {
    let vocab_size = config.vocab_size;
    if tokens.is_empty() {
        return Err(Error::InvalidInput(
            "forward needs at least one token".into(),
        ));
    }
    if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab_size) {
        return Err(CoreError::TokenOutOfRange { id, vocab_size }.into());
    }
    let needed = start_pos.saturating_add(tokens.len());
    if needed > config.max_seq_len {
        return Err(CoreError::ContextOverflow {
            needed,
            max: config.max_seq_len,
        }
        .into());
    }
    Ok(())
}

impl SharedLlama {
    /// Checks the weights against the configuration and builds the RoPE table.
    ///
    /// Errors: [`Error::Config`] if the configuration is invalid or a weight's shape
    /// disagrees with it.
    pub fn new(config: ModelConfig, weights: LlamaWeights) -> Result<SharedLlama> {
        SharedLlama::build(config, weights, None)
    }

    /// Rank `comm.rank()`'s part of the model split among `comm.world_size()` ranks by
    /// tensor parallelism (see `shard.rs`): its heads, feed-forward rows and classifier
    /// rows, and its whole routed experts where their number divides among the ranks
    /// (expert parallelism), else its rows of each, with the all-reduces and the logits'
    /// gather that join the ranks' parts. Every rank of the group builds its part from the
    /// same configuration and weights.
    ///
    /// Errors: those of [`SharedLlama::new`]; [`Error::Config`] for a model the split does
    /// not cover (multi-head latent attention, ALiBi, a p-tuning prefix, prediction layers)
    /// or whose heads, widths, vocabulary or quantised blocks do not divide among the ranks.
    pub fn shard(
        config: &ModelConfig,
        weights: &LlamaWeights,
        comm: Arc<dyn flm_core::comm::Communicator>,
    ) -> Result<SharedLlama> {
        config.validate()?;
        weights.check_shapes(config)?;
        let (r, n) = (comm.rank(), comm.world_size());
        let split = shard::Split::new(config, weights, r, n)?;
        let local = shard::local_config(config, &split)?;
        let (weights, head) = shard::weights(weights, config, &split, r)?;
        let tp = TpShard {
            comm,
            head: weights::cpu_layout(head)?,
            vocab: config.vocab_size,
            gather: Default::default(),
        };
        SharedLlama::build(local, weights, Some(tp))
    }

    /// The model from checked weights: norms shifted where the configuration says, the
    /// CPU's layout, the RoPE tables.
    fn build(
        config: ModelConfig,
        weights: LlamaWeights,
        tp: Option<TpShard>,
    ) -> Result<SharedLlama> {
        config.validate()?;
        match tp {
            None => weights.check_shapes(&config)?,
            // A rank of an expert-parallel model holds a part of each layer's experts.
            Some(_) => weights.check_part_shapes(&config)?,
        }
        let weights = if config.norm_unit_offset {
            weights.with_unit_offset_norms()?
        } else {
            weights
        }
        .in_cpu_layout()?;
        let c = &config;
        let rope = RopeTable::scaled(
            c.rope_style,
            c.rope_head_dim(),
            c.rotary_dim(),
            c.rope_theta,
            c.rope_scaling.as_ref(),
            c.max_seq_len,
        )?;
        let rope_local = c
            .rope_local_theta
            .map(|theta| {
                let (dim, rot) = (c.rope_head_dim(), c.rotary_dim());
                RopeTable::new(c.rope_style, dim, rot, theta, c.max_seq_len)
            })
            .transpose()?;
        let placement = Placement::host(config.n_layers);
        Ok(SharedLlama {
            config,
            weights,
            rope,
            rope_local,
            placement,
            kv_dtype: KvDtype::Auto,
            tp,
        })
    }

    /// The model with its instances' KV caches of `kv_dtype` (in each layer's memory, see
    /// [`KvDtype::dtype_at`]); [`KvDtype::Auto`] until set.
    pub fn with_kv_dtype(self, kv_dtype: KvDtype) -> SharedLlama {
        SharedLlama { kv_dtype, ..self }
    }

    /// The element type of its KV caches.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// The RoPE table of layer `l`: the local one for a sliding-window layer where the
    /// model has one (Gemma 3), else the global one.
    fn rope_of(&self, l: usize) -> &RopeTable {
        match (&self.rope_local, self.config.layer_window(l)) {
            (Some(local), Some(_)) => local,
            _ => &self.rope,
        }
    }

    /// How layer `l`'s queries see the cache rows: the configuration's heads, scale, ALiBi
    /// and soft-capping, and the layer's sliding window.
    fn attention_params(&self, l: usize) -> AttentionParams {
        let c = &self.config;
        AttentionParams {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            scale: c.attention_scale(),
            alibi: c.alibi,
            softcap: c.attn_softcap,
            bidirectional: 0,
            sliding_window: c.layer_window(l),
        }
    }

    /// Layer `l`'s attention-sink logits, if it has them (gpt-oss).
    fn sinks(&self, l: usize) -> Option<&Data> {
        match &self.weights.layers.get(l)?.attn {
            Attention::Heads(h) => h.sinks.as_ref(),
            Attention::Latent(_) => None,
        }
    }

    /// The weights.
    pub fn weights(&self) -> &LlamaWeights {
        &self.weights
    }
}

impl SharedGraph for SharedLlama {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn instance(self: Arc<Self>) -> Result<Model> {
        Ok(Model::from_graph(Llama::with_model(self)?))
    }

    fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    fn with_kv_dtype(self: Arc<Self>, kv_dtype: KvDtype) -> Result<SharedModel> {
        Ok(crate::graph::unshared(self)?.with_kv_dtype(kv_dtype).into())
    }

    fn batch(self: Arc<Self>, rows: usize) -> Result<Box<dyn BatchedForward>> {
        Ok(Box::new(LlamaBatch::new(self, rows)?))
    }

    fn memory_needs(&self) -> Result<MemoryNeeds> {
        Ok(SharedLlama::memory_needs(self))
    }

    fn placement(&self) -> Option<&Placement> {
        Some(&self.placement)
    }

    fn place(self: Arc<Self>, exec: &Executor, placement: Placement) -> Result<SharedModel> {
        let model = crate::graph::unshared(self).map_err(|_| {
            Error::State("a model is placed before any instance of it is made".into())
        })?;
        Ok(SharedLlama::place(model, exec, placement)?.into())
    }
}

impl Llama {
    /// Builds the model (see [`SharedLlama::new`]) and one instance of it.
    ///
    /// Errors: those of [`SharedLlama::new`] and [`Llama::with_model`].
    pub fn new(config: ModelConfig, weights: LlamaWeights) -> Result<Llama> {
        Llama::with_model(Arc::new(SharedLlama::new(config, weights)?))
    }

    /// A new instance of a shared model, with its own KV cache for `config.max_seq_len`
    /// positions (plus the p-tuning prefix, which is copied into it; the rest zeroed) and its
    /// own activations (for [`PREFILL_CHUNK`] rows).
    ///
    /// Errors: [`flm_core::Error::Shape`] (wrapped) if a buffer's size overflows.
    /// For a model placed on a device ([`SharedLlama::place`]) the KV cache and
    /// activations are allocated by the executor of the first forward pass.
    pub fn with_model(model: Arc<SharedLlama>) -> Result<Llama> {
        let (mut kv, mut states) = (None, Vec::new());
        if model.placement.is_host() {
            kv = Some(host_kv(&model, model.kv_dtype.on_host())?);
            let c = &model.config;
            states.push(Activations::new(c, PREFILL_CHUNK.min(c.max_seq_len))?);
        }
        Ok(Llama {
            model,
            kv,
            states,
            host_out: None,
            all_rows: Vec::new(),
            graphs: StepGraphs::default(),
            rope_offset: 0,
            mtp: None,
        })
    }

    /// Allocates the KV cache and activations of a placed model in their memories, once.
    fn allocate(&mut self, exec: &Executor) -> Result<()> {
        if self.kv.is_some() {
            return Ok(());
        }
        let model = &*self.model;
        let (c, layers) = (&model.config, model.placement.layers());
        let max_seq = c.pre_seq_len + c.max_seq_len;
        let kv = if model.weights.prefix_kv.is_some() {
            // One dtype for the layers: that of the first layer's memory.
            let dtype = model
                .kv_dtype
                .dtype_at(layers.first().copied().unwrap_or(Location::Host));
            host_kv(model, dtype)?.place(exec, layers, "load: p-tuning prefix")?
        } else {
            KvCache::placed(exec, layers, max_seq, c.kv_widths(), model.kv_dtype)?
        };
        self.states = placed_states(exec, model, PREFILL_CHUNK.min(c.max_seq_len))?;
        self.kv = Some(kv);
        Ok(())
    }

    /// The element type of each layer's KV cache (empty until the first forward pass of a
    /// model placed on a device allocates it).
    pub fn kv_dtypes(&self) -> Vec<DataType> {
        self.kv.as_ref().map_or_else(Vec::new, KvCache::dtypes)
    }

    /// The shared model this instance runs.
    pub fn model(&self) -> &Arc<SharedLlama> {
        &self.model
    }

    /// The weights.
    pub fn weights(&self) -> &LlamaWeights {
        &self.model.weights
    }
}

impl Graph for Llama {
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn shared(&self) -> SharedModel {
        SharedModel::from_graph(Arc::clone(&self.model) as Arc<dyn SharedGraph>)
    }

    fn run(
        &mut self,
        exec: &Executor,
        tokens: &[u32],
        start_pos: usize,
        head: Head,
    ) -> Result<&[f32]> {
        self.begin(exec, tokens, start_pos)?;
        if let Some(at) = self.step_graph_memory(exec, tokens, head) {
            self.decode_step(exec, at, tokens, start_pos)?;
            return host_output(&self.model, &self.states, &mut self.host_out, exec);
        }
        let chunk = PREFILL_CHUNK.min(self.config().max_seq_len);
        let parts = tokens.len().div_ceil(chunk);
        if head == Head::Logits(Logits::Last) || parts == 1 {
            for (c, part) in tokens.chunks(chunk).enumerate().take(parts - 1) {
                let last = Head::Logits(Logits::Last);
                self.forward_chunk(exec, part, start_pos + c * chunk, last)?;
            }
            let last = (parts - 1) * chunk;
            self.forward_chunk(exec, &tokens[last..], start_pos + last, head)?;
            return host_output(&self.model, &self.states, &mut self.host_out, exec);
        }
        self.all_rows.clear();
        for (c, part) in tokens.chunks(chunk).enumerate() {
            self.forward_chunk(exec, part, start_pos + c * chunk, head)?;
            let rows = host_output(&self.model, &self.states, &mut self.host_out, exec)?;
            self.all_rows.extend_from_slice(rows);
        }
        Ok(&self.all_rows)
    }

    fn logits_location(&self) -> Location {
        self.model.placement.output()
    }

    fn mtp_layers(&self) -> usize {
        self.model.weights.mtp.len()
    }

    fn keep_mtp_hidden(&mut self) -> Result<()> {
        if self.mtp.is_none() {
            self.mtp = Some(MtpState::new(&self.model)?);
        }
        Ok(())
    }

    fn mtp_forward(
        &mut self,
        exec: &Executor,
        layer: usize,
        tokens: &[u32],
        start_pos: usize,
        input: MtpInput,
    ) -> Result<&[f32]> {
        let mtp = self.mtp.as_mut().ok_or_else(|| {
            Error::State("multi-token prediction before its hidden states were kept".into())
        })?;
        mtp.forward(
            exec,
            &self.model,
            &mut self.states,
            layer,
            tokens,
            start_pos,
            input,
        )
    }

    fn forward_resident(
        &mut self,
        exec: &Executor,
        tokens: &[u32],
        start_pos: usize,
    ) -> Result<&Data> {
        self.begin(exec, tokens, start_pos)?;
        let last = Head::Logits(Logits::Last);
        if let Some(at) = self.step_graph_memory(exec, tokens, last) {
            self.decode_step(exec, at, tokens, start_pos)?;
            return Ok(&output_state(&self.model, &self.states)?.logits);
        }
        let chunk = PREFILL_CHUNK.min(self.config().max_seq_len);
        for (c, part) in tokens.chunks(chunk).enumerate() {
            self.forward_chunk(exec, part, start_pos + c * chunk, last)?;
        }
        Ok(&output_state(&self.model, &self.states)?.logits)
    }
}

impl Llama {
    /// Checks a call over `tokens` from `start_pos`, allocates what a placed model has not
    /// yet, and chooses the call's RoPE rows from its sequence length (positions
    /// `0..start_pos + tokens.len()`, as transformers chooses LongRoPE's per forward pass).
    fn begin(&mut self, exec: &Executor, tokens: &[u32], start_pos: usize) -> Result<()> {
        check_forward(self.config(), tokens, start_pos)?;
        self.allocate(exec)?;
        self.rope_offset = self.model.rope.offset(start_pos + tokens.len());
        Ok(())
    }

    /// The memory whose device runs this call as a step graph: a decode step (one token,
    /// the last logits) of a model whose every layer, KV cache and activations are in one
    /// device's memory, where that device captures ([`Executor::can_capture`]); `None`
    /// otherwise (op by op). ALiBi models run op by op (their slopes are uploaded per op),
    /// and so do LongRoPE models whose RoPE rows switch with the sequence length (a
    /// captured step reads its position from device memory, without the offset).
    fn step_graph_memory(&self, exec: &Executor, tokens: &[u32], head: Head) -> Option<Location> {
        let (c, p) = (&self.model.config, &self.model.placement);
        let [at] = p.locations()[..] else {
            return None;
        };
        let experts_here = (0..c.n_layers).all(|l| p.experts(l) == at);
        let decode = tokens.len() == 1 && head == Head::Logits(Logits::Last);
        let fixed_rope = !self.model.rope.switches();
        let plain = !c.alibi && fixed_rope;
        (decode && at != Location::Host && experts_here && plain && exec.can_capture(at))
            .then_some(at)
    }

    /// One decode step through its step graph ([`StepGraphs`]): op by op the first time,
    /// captured the second, replayed after; the logits are left in the activations, as
    /// [`Llama::forward_chunk`] leaves them. The capture ends at the logits: a sampling op
    /// that keeps its state and writes its ids in device memory belongs inside the capture
    /// closure, after `forward_chunk`, so that only the ids cross after a replay.
    ///
    /// Errors: those of the step's ops, and a capture or replay that fails (the error
    /// names `--cuda-graph off`, which runs every step op by op).
    fn decode_step(
        &mut self,
        exec: &Executor,
        at: Location,
        tokens: &[u32],
        start_pos: usize,
    ) -> Result<()> {
        let head = Head::Logits(Logits::Last);
        let step = StepInputs {
            tokens,
            start_pos,
            cache_row: self.model.config.pre_seq_len + start_pos,
        };
        let plan = self.graphs.plan(tokens.len());
        if !matches!(plan, StepPlan::Eager) {
            // The captured embedding reads the ids where a step copies them.
            let memory = self.model.placement.layer(0);
            let first = (self.model.placement.locations().iter()).position(|&m| m == memory);
            if let Some(ids) = first.and_then(|i| self.states[i].ids.as_mut()) {
                stage_ids(exec, tokens, ids)?;
            }
        }
        match plan {
            StepPlan::Eager => self.forward_chunk(exec, tokens, start_pos, head),
            StepPlan::Capture => {
                let graph = exec.capture(at, &step, || {
                    self.forward_chunk(exec, tokens, start_pos, head)
                })?;
                self.graphs.insert(graph);
                Ok(())
            }
            StepPlan::Replay(graph) => {
                exec.replay(graph, &step)?;
                // The logits' shape is host metadata that an op-by-op call in between
                // (a prefill of all logits) may have changed.
                let c = &self.model.config;
                for s in &mut self.states {
                    s.logits.set_shape(&[tokens.len(), c.vocab_size])?;
                }
                Ok(())
            }
        }
    }

    /// The batch sizes whose decode step has been captured as a step graph.
    pub fn captured_steps(&self) -> Vec<usize> {
        self.graphs.captured()
    }

    fn forward_chunk(
        &mut self,
        exec: &Executor,
        tokens: &[u32],
        pos: usize,
        head: Head,
    ) -> Result<()> {
        let model = &*self.model;
        let c = &model.config;
        let n = tokens.len();
        for s in &mut self.states {
            s.set_rows(c, n)?;
        }
        // The p-tuning prefix fills the cache rows before position 0.
        let (row, rope_offset) = (c.pre_seq_len + pos, self.rope_offset);
        let kv = self
            .kv
            .as_mut()
            .ok_or_else(|| Error::State("the KV cache is not allocated".into()))?;
        let s = run_layers(exec, model, tokens, &mut self.states, |l, s| {
            rotate_and_attend(exec, model, l, s, kv.layer_mut(l), pos + rope_offset, row)
        })?;
        finish(exec, model, s, head, &[n - 1], &model.weights.final_norm)?;
        if let Some(mtp) = &mut self.mtp {
            mtp.keep(exec, model, s, pos)?;
        }
        Ok(())
    }
}

/// Layer `l`'s RoPE on the rows of `s` (at positions from `rope_pos`, the table's offset
/// included) and its attention through its `cache` at cache row `row`
/// ([`cache_and_attend`]): what a single sequence's pass does between the projections.
fn rotate_and_attend(
    exec: &Executor,
    model: &SharedLlama,
    l: usize,
    s: &mut Activations,
    cache: (&mut Data, &mut Data),
    rope_pos: usize,
    row: usize,
) -> flm_core::Result<()> {
    let c = &model.config;
    if !c.alibi {
        for (x, n_heads) in s.rotated(c) {
            exec.run_step(Op::Rope {
                x,
                table: model.rope_of(l),
                n_heads,
                start_pos: rope_pos,
            })?;
        }
    }
    let mut io = s.attention_io();
    io.sinks = model.sinks(l);
    cache_and_attend(exec, cache, io, row, model.attention_params(l))
}

/// Stores `io`'s new rows of the layer's two cache tensors (`cache`) at `row`, then attends
/// its queries (positions `row..row + n`) over the cache rows up to theirs as `params`
/// says, into its output.
///
/// Errors: those of [`Op::CopyRows`] and [`Op::Attention`].
pub(crate) fn cache_and_attend(
    exec: &Executor,
    (first, second): (&mut Data, &mut Data),
    mut io: AttentionIo<'_>,
    row: usize,
    params: AttentionParams,
) -> std::result::Result<(), CoreError> {
    let n_rows = io.new_rows[0].rows();
    for (src, dst) in io.new_rows.into_iter().zip([&mut *first, &mut *second]) {
        exec.run_step(Op::CopyRows {
            src: (src, 0),
            dst: (dst, row),
            n_rows,
        })?;
    }
    exec.run_step(Op::Attention {
        operands: io.operands((first, second), params),
        start_pos: row,
    })
}

/// Runs `linear` as [`Op::Linear`].
fn linear(
    exec: &Executor,
    input: &Data,
    weight: &Data,
    bias: Option<&Data>,
    output: &mut Data,
) -> flm_core::Result<()> {
    exec.run(Op::Linear {
        input,
        weight,
        bias,
        output,
    })
}

/// The embedding and every transformer block over the rows of `tokens` (`states` shaped
/// for them, one per memory of the model's [`Placement::locations`]): per layer, in the
/// state `s` of its memory, the projections of the whole batch of rows, then
/// `attend(layer, s)`, which applies RoPE to `s.q`/`s.k`, stores `s.k`/`s.v` in the KV
/// cache and writes `s.att` from `s.q`, then the output projection, the residuals and the
/// SwiGLU feed-forward. At a boundary between two memories the residual stream `x` is
/// copied across. Returns the last layer's state, whose `x` holds its output.
fn run_layers<'s>(
    exec: &Executor,
    model: &SharedLlama,
    tokens: &[u32],
    states: &'s mut [Activations],
    mut attend: impl FnMut(usize, &mut Activations) -> flm_core::Result<()>,
) -> Result<&'s mut Activations> {
    let (c, w) = (&model.config, &model.weights);
    let locations = model.placement.locations();
    if states.len() != locations.len() {
        return Err(Error::State(format!(
            "{} activation sets for {} memories",
            states.len(),
            locations.len()
        )));
    }
    let memory = |l: usize| {
        let at = model.placement.layer(l);
        locations.iter().position(|&m| m == at).unwrap_or(0)
    };
    let Activations { x, ids, .. } = &mut states[memory(0)];
    let tokens = match ids {
        Some(ids) => {
            // Inside a captured step they were copied before the capture (decode_step).
            if !exec.capturing() {
                stage_ids(exec, tokens, ids)?;
            }
            TokenIds::Tensor(ids)
        }
        None => TokenIds::Host(tokens),
    };
    exec.run_step(Op::Embedding {
        table: &w.embedding,
        tokens,
        output: x,
    })?;
    if let Some(alpha) = c.embed_scale {
        exec.run(Op::Scale { x, alpha })?;
    }
    for (l, lw) in w.layers.iter().enumerate() {
        let (before, here) = (memory(l.saturating_sub(1)), memory(l));
        if before != here {
            let (from, to) = pair_mut(states, before, here);
            exec.copy_into(&from.x, &mut to.x, "layer boundary: activations")?;
        }
        let comm = model.tp.as_ref().map(|tp| &*tp.comm);
        block(exec, c, l, lw, comm, &mut states[here], &mut attend)?;
    }
    let last = memory(c.n_layers.saturating_sub(1));
    Ok(&mut states[last])
}

/// Transformer layer `l` (`lw`) over the rows of `s.x`, in place: the attention block, with
/// `attend(l, s)` between the projections and the output projection, then the feed-forward
/// block, each behind its norm and added to the residual stream. A tensor-parallel rank
/// (`comm`) sums the ranks' parts of each block's output before its residual add.
fn block(
    exec: &Executor,
    c: &ModelConfig,
    l: usize,
    lw: &LlamaLayer,
    comm: Option<&dyn Communicator>,
    s: &mut Activations,
    attend: &mut impl FnMut(usize, &mut Activations) -> flm_core::Result<()>,
) -> Result<()> {
    // Attention block.
    pre_norm(exec, s, &lw.attn_norm, c.norm_eps)?;
    match &lw.attn {
        Attention::Heads(h) => {
            let [bq, bk, bv] = match &h.qkv_bias {
                Some([q, k, v]) => [Some(q), Some(k), Some(v)],
                None => [None; 3],
            };
            // Q, K and V (and below gate and up) as one op: one fork and join in decode.
            exec.run(Op::Linears {
                input: &s.xb,
                parts: &mut [
                    LinearPart::new(&h.wq, bq, &mut s.q),
                    LinearPart::new(&h.wk, bk, &mut s.k),
                    LinearPart::new(&h.wv, bv, &mut s.v),
                ],
            })?;
            if let Some([q_norm, k_norm]) = &h.qk_norm {
                head_norm(exec, &mut s.q, q_norm, c, &mut s.heads)?;
                head_norm(exec, &mut s.k, k_norm, c, &mut s.heads)?;
            }
            attend(l, s)?;
        }
        Attention::Latent(a) => {
            latent::project(exec, c, a, s)?;
            attend(l, s)?;
            latent::values(exec, a, s)?;
        }
    }
    linear(exec, &s.att, &lw.wo, lw.bo.as_ref(), &mut s.xb2)?;
    if let Some(comm) = comm {
        all_reduce_data(comm, &mut s.xb2)?;
    }
    residual(
        exec,
        s,
        lw.post_norms.as_ref().map(|[attn, _]| attn),
        c.norm_eps,
    )?;
    // Feed-forward block.
    pre_norm(exec, s, &lw.ffn_norm, c.norm_eps)?;
    feed_forward(exec, c, l, &lw.ffn, s)?;
    if let Some(comm) = comm {
        all_reduce_data(comm, &mut s.xb2)?;
    }
    residual(
        exec,
        s,
        lw.post_norms.as_ref().map(|[_, ffn]| ffn),
        c.norm_eps,
    )?;
    Ok(())
}

/// The feed-forward of layer `l` from `s.xb` into `s.xb2`: the gated
/// `W2 · (act(W1 · xb) ⊙ (W3 · xb))` (SwiGLU or GeGLU), or the routed experts
/// ([`Op::MoeFfn`]) plus the shared expert where the layer has one.
fn feed_forward(
    exec: &Executor,
    c: &ModelConfig,
    l: usize,
    ffn: &Ffn,
    s: &mut Activations,
) -> Result<()> {
    match ffn {
        Ffn::Dense {
            w_gate,
            w_down,
            w_up,
        } => {
            exec.run(Op::Linears {
                input: &s.xb,
                parts: &mut [
                    LinearPart::new(w_gate, None, &mut s.gate),
                    LinearPart::new(w_up, None, &mut s.up),
                ],
            })?;
            let (gate, up, output) = (&s.gate, &s.up, &mut s.hidden);
            exec.run(match c.activation {
                Activation::Silu => Op::SiluMul { gate, up, output },
                Activation::GeluTanh => Op::GeluMul { gate, up, output },
            })?;
            linear(exec, &s.hidden, w_down, None, &mut s.xb2)?;
        }
        Ffn::Moe {
            router,
            router_bias,
            router_logit_bias,
            experts,
            first_expert,
            shared,
        } => {
            let m = c.moe_layer(l).ok_or_else(|| {
                Error::Config(format!("layer {l} has experts but no MoE configuration"))
            })?;
            let (input, output) = match &mut s.experts_io {
                Some((x, y)) => {
                    exec.copy_into(&s.xb, x, "experts: activations")?;
                    (&*x, y)
                }
                None => (&s.xb, &mut s.xb2),
            };
            exec.run(Op::MoeFfn {
                input,
                router,
                experts,
                first_expert: *first_expert,
                routing: MoeRouting {
                    top_k: m.top_k,
                    scoring: m.scoring,
                    groups: m.groups,
                    choice_bias: router_bias.as_ref(),
                    logit_bias: router_logit_bias.as_ref(),
                    renormalize: m.renormalize,
                    scale: m.routed_scale,
                },
                activation: m.activation,
                output,
            })?;
            if let (Some(e), Some(scratch)) = (shared, &mut s.shared) {
                shared_expert(exec, e, input, output, scratch)?;
            }
            if let Some((_, y)) = &s.experts_io {
                exec.copy_into(y, &mut s.xb2, "experts: activations")?;
            }
        }
    }
    Ok(())
}

/// Qwen2-MoE's shared expert `e` over the rows of `input`, added to the routed experts'
/// `output`: `output += σ(gate · x) · W2 · (silu(W1 · x) ⊙ (W3 · x))` (transformers'
/// `Qwen2MoeSparseMoeBlock`).
fn shared_expert(
    exec: &Executor,
    e: &SharedExpert,
    input: &Data,
    output: &mut Data,
    t: &mut SharedScratch,
) -> flm_core::Result<()> {
    let mut up = [
        LinearPart::new(&e.ffn.gate, None, &mut t.gate),
        LinearPart::new(&e.ffn.up, None, &mut t.up),
    ];
    match &e.gate {
        Some(gate) => {
            let [g, u] = up;
            exec.run(Op::Linears {
                input,
                parts: &mut [g, u, LinearPart::new(gate, None, &mut t.score)],
            })?
        }
        None => exec.run(Op::Linears {
            input,
            parts: &mut up,
        })?,
    }
    exec.run(Op::SiluMul {
        gate: &t.gate,
        up: &t.up,
        output: &mut t.hidden,
    })?;
    linear(exec, &t.hidden, &e.ffn.down, None, &mut t.out)?;
    match e.gate {
        Some(_) => exec.run(Op::GatedAdd {
            x: output,
            y: &t.out,
            gate: &t.score,
        }),
        None => exec.run(Op::Add {
            x: output,
            y: &t.out,
        }),
    }
}

/// A block's input norm: `xb = RMSNorm(x) · weight`.
fn pre_norm(exec: &Executor, s: &mut Activations, weight: &Data, eps: f32) -> flm_core::Result<()> {
    exec.run(Op::RmsNorm {
        input: &s.x,
        weight,
        eps,
        output: &mut s.xb,
    })
}

/// The residual add of a block's output `s.xb2` to `s.x`, through the block's post-norm
/// (Gemma 2 and 3) when it has one: `x += RMSNorm(xb2)` (the norm written to `s.xb`).
fn residual(
    exec: &Executor,
    s: &mut Activations,
    post_norm: Option<&Data>,
    eps: f32,
) -> flm_core::Result<()> {
    let y = match post_norm {
        Some(weight) => {
            exec.run(Op::RmsNorm {
                input: &s.xb2,
                weight,
                eps,
                output: &mut s.xb,
            })?;
            &s.xb
        }
        None => &s.xb2,
    };
    exec.run(Op::Add { x: &mut s.x, y })
}

/// RMSNorm over each head of `x` `[n, heads · head_dim]`, in place through `scratch`
/// (Qwen3's `q_norm` / `k_norm`, transformers' `Qwen3Attention`: normed per head, then
/// rotated).
fn head_norm(
    exec: &Executor,
    x: &mut Data,
    weight: &Data,
    c: &ModelConfig,
    scratch: &mut Data,
) -> flm_core::Result<()> {
    let (n, cols) = (x.rows(), x.cols());
    let heads = n * cols / c.head_dim;
    x.set_shape(&[heads, c.head_dim])?;
    scratch.set_shape(&[heads, c.head_dim])?;
    exec.run(Op::RmsNorm {
        input: x,
        weight,
        eps: c.norm_eps,
        output: scratch,
    })?;
    exec.run(Op::CopyRows {
        src: (scratch, 0),
        dst: (x, 0),
        n_rows: heads,
    })?;
    x.set_shape(&[n, cols])
}

/// Copies the step's token ids into `ids`, the i32 tensor in the memory of the embedding
/// table that [`Op::Embedding`] reads them from.
fn stage_ids(exec: &Executor, tokens: &[u32], ids: &mut Data) -> flm_core::Result<()> {
    ids.set_shape(&[tokens.len()])?;
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let host = Data::from_bytes(DataType::I32, &[tokens.len()], &bytes)?;
    exec.copy_into(&host, ids, "token ids to device")
}

/// `(&items[a], &mut items[b])` for `a != b`.
fn pair_mut<T>(items: &mut [T], a: usize, b: usize) -> (&T, &mut T) {
    if a < b {
        let (lo, hi) = items.split_at_mut(b);
        (&lo[a], &mut hi[0])
    } else {
        let (lo, hi) = items.split_at_mut(a);
        (&hi[0], &mut lo[b])
    }
}

/// A host KV cache of `dtype` for `model`, with its p-tuning prefix copied in.
fn host_kv(model: &SharedLlama, dtype: DataType) -> Result<KvCache> {
    let c = &model.config;
    let mut kv = KvCache::new(
        c.n_layers,
        c.pre_seq_len + c.max_seq_len,
        c.kv_widths(),
        dtype,
    )?;
    if let Some(prefix) = &model.weights.prefix_kv {
        load_prefix(&mut kv, prefix, c)?;
    }
    Ok(kv)
}

/// The final norm (`norm`: the model's, or a prediction layer's) and the classifier (the
/// embedding table when tied) into `s.logits`:
/// over every row of `s.x` for [`Logits::All`] (`s.logits` then holds the normed hidden
/// states for [`Head::Hidden`]), or over the rows `last_rows` of `s.x`, in that order, for
/// [`Logits::Last`].
fn finish(
    exec: &Executor,
    model: &SharedLlama,
    s: &mut Activations,
    head: Head,
    last_rows: &[usize],
    norm: &Data,
) -> Result<()> {
    let (c, w) = (&model.config, &model.weights);
    let classifier = match &model.tp {
        Some(tp) => &tp.head,
        None => w.classifier.as_ref().unwrap_or(&w.embedding),
    };
    let final_input = match head {
        Head::Logits(Logits::All) | Head::Hidden => &s.x,
        Head::Logits(Logits::Last) => {
            s.last.set_shape(&[last_rows.len(), c.dim])?;
            for (dst_row, &src_row) in last_rows.iter().enumerate() {
                exec.run(Op::CopyRows {
                    src: (&s.x, src_row),
                    dst: (&mut s.last, dst_row),
                    n_rows: 1,
                })?;
            }
            &s.last
        }
    };
    let rows = final_input.rows();
    let normed = if head == Head::Hidden {
        &mut s.logits
    } else {
        &mut s.xb
    };
    normed.set_shape(&[rows, c.dim])?;
    exec.run(Op::RmsNorm {
        input: final_input,
        weight: norm,
        eps: c.norm_eps,
        output: normed,
    })?;
    if head == Head::Hidden {
        return Ok(());
    }
    s.logits.set_shape(&[rows, classifier.rows()])?;
    linear(exec, &s.xb, classifier, None, &mut s.logits)?;
    if let Some(tp) = &model.tp {
        gather_logits(tp, &mut s.logits, rows)?;
    }
    if let Some(cap) = c.final_softcap {
        exec.run(Op::SoftCap {
            x: &mut s.logits,
            cap,
        })?;
    }
    Ok(())
}

/// Joins the ranks' logits (this rank's `[rows, V_r]` in `logits`, its rows of the
/// vocabulary by [`shard::vocab_part`], `V_r` at most `P = ⌈V/N⌉`) into every rank's
/// `logits` `[rows, V]`: row `i` is rank 0's row `i`, then rank 1's, and so on.
fn gather_logits(tp: &TpShard, logits: &mut Data, rows: usize) -> Result<()> {
    let n = tp.comm.world_size();
    let (mine, p) = (logits.cols(), tp.vocab.div_ceil(n));
    let mut buffers = tp
        .gather
        .lock()
        .map_err(|_| Error::State("a rank's logits buffers are poisoned".into()))?;
    let (padded, gathered) = &mut *buffers;
    padded.resize(rows * p, 0.0);
    for (dst, src) in padded
        .chunks_exact_mut(p)
        .zip(logits.as_f32()?.chunks_exact(mine))
    {
        dst[..mine].copy_from_slice(src);
    }
    gathered.resize(n * rows * p, 0.0);
    tp.comm.all_gather(padded, gathered)?;
    logits.set_shape(&[rows, tp.vocab])?;
    let out = logits.as_f32_mut()?;
    for (r, rank) in gathered.chunks_exact(rows * p).enumerate() {
        let (lo, hi) = shard::vocab_part(tp.vocab, r, n)?;
        for (i, row) in rank.chunks_exact(p).enumerate() {
            out[i * tp.vocab + lo..][..hi - lo].copy_from_slice(&row[..hi - lo]);
        }
    }
    Ok(())
}

/// Copies the p-tuning prefix `[pre_seq_len, n_layers·2·kv_dim]` into cache rows
/// `0..pre_seq_len` of every layer.
pub(crate) fn load_prefix(kv: &mut KvCache, prefix: &Data, c: &ModelConfig) -> Result<()> {
    let kv_dim = c.kv_dim();
    let values = prefix.to_f32_vec()?;
    for (p, row) in values.chunks_exact(c.n_layers * 2 * kv_dim).enumerate() {
        for (l, pair) in row.chunks_exact(2 * kv_dim).enumerate() {
            let (k, v) = kv.layer_mut(l);
            k.write_f32(p * kv_dim, &pair[..kv_dim])?;
            v.write_f32(p * kv_dim, &pair[kv_dim..])?;
        }
    }
    Ok(())
}
