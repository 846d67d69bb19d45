//! One rank's part of a tensor-parallel Llama (Shoeybi et al. 2019, "Megatron-LM", §3;
//! TGI's `TensorParallelColumnLinear` / `TensorParallelRowLinear`).
//!
//! Rank `r` of `N` holds:
//! - **column-parallel** (rows of `[out, in]`): its query heads of `wq`, its key and value
//!   heads of `wk`/`wv` (with their biases and attention sinks), its rows of the
//!   feed-forward's gate and up projections, of the shared expert's, and of every routed
//!   expert's when the experts are split tensor-parallel (below);
//! - **row-parallel** (columns): the same heads' columns of `wo` and rows' columns of the
//!   down projections; each is followed by an all-reduce of its `[n, dim]` output, and a
//!   bias after it is kept by rank 0 alone (zeros elsewhere);
//! - **expert-parallel** (DeepSpeed-MoE, Rajbhandari et al. 2022; vLLM's and SGLang's
//!   `--enable-expert-parallel`): when the routed experts `E` of a layer divide among the
//!   ranks, whole experts `r·E/N..(r+1)·E/N`, none of them cut (so a quantised expert's
//!   width need not divide into blocks); every rank routes each token over all `E` experts
//!   with its copy of the router, computes the chosen ones it holds
//!   ([`flm_core::Op::MoeFfn`]'s `first_expert`), and the layer's all-reduce adds the
//!   ranks' parts. When they do not divide, each expert is split tensor-parallel as above;
//! - **replicated:** the norms, the embedding table and the router with its biases;
//! - **vocab-parallel head:** rows `⌊r·V/N⌋..⌊(r+1)·V/N⌋` of the classifier, the logits
//!   gathered after it.
//!
//! With fewer KV heads than ranks, `N / n_kv_heads` ranks share each KV head, each holding
//! a copy of it (as TGI and vLLM replicate them). A quantised row-parallel matrix is cut
//! between whole groups or blocks; a width that does not divide is an error that says so.

use std::sync::{Arc, Mutex};

use flm_core::comm::Communicator;
use flm_core::{Data, Expert};

use super::weights::{Attention, Ffn, LlamaLayer, LlamaWeights, QkvProjections, SharedExpert};
use crate::{Error, ModelConfig, Result};

/// What a rank of a tensor-parallel model adds to its [`super::SharedLlama`]: its
/// communicator, its rows of the classifier and the buffers its logits are gathered in.
pub(crate) struct TpShard {
    pub(crate) comm: Arc<dyn Communicator>,
    /// Rows [`vocab_part`] gives this rank of the classifier, in the CPU's layout.
    pub(crate) head: Data,
    /// The vocabulary, `V`.
    pub(crate) vocab: usize,
    /// This rank's logits padded to `[n, P]`, and every rank's gathered, `[N, n, P]`.
    pub(crate) gather: Mutex<(Vec<f32>, Vec<f32>)>,
}

/// The part `r` of `n` of `len`, or an error naming `what` when `n` does not divide it.
fn part(len: usize, r: usize, n: usize, what: &str) -> Result<(usize, usize)> {
    if !len.is_multiple_of(n) {
        return Err(Error::Config(format!(
            "{what} ({len}) does not divide among {n} tensor-parallel ranks"
        )));
    }
    Ok((r * len / n, (r + 1) * len / n))
}

/// Rows `⌊r·V/N⌋..⌊(r+1)·V/N⌋` of the vocabulary `V`: parts that differ by at most one row,
/// each at most `P = ⌈V/N⌉`, the length the ranks' logits are padded to for their gather.
///
/// Errors: [`Error::Config`] when a rank would get no rows (a vocabulary smaller than `N`).
pub(crate) fn vocab_part(vocab: usize, r: usize, n: usize) -> Result<(usize, usize)> {
    let (lo, hi) = (r * vocab / n, (r + 1) * vocab / n);
    if lo >= hi {
        return Err(Error::Config(format!(
            "the vocabulary ({vocab}) leaves a rank of {n} without rows of the classifier"
        )));
    }
    Ok((lo, hi))
}

/// Part `r` of `n` of a width `len` whose bounds fall on multiples of `unit` (the blocks of
/// the quantised matrix cut across it), as even as that allows.
///
/// Errors: [`Error::Config`] when a rank would get no part, naming `what`.
fn aligned_part(len: usize, r: usize, n: usize, unit: usize, what: &str) -> Result<(usize, usize)> {
    let bound = |k: usize| match k {
        k if k >= n => len,
        k => ((k * len / n + unit / 2) / unit * unit).min(len),
    };
    let (lo, hi) = (bound(r), bound(r + 1));
    if lo >= hi {
        return Err(Error::Config(format!(
            "{what} ({len}, in blocks of {unit}) does not divide among {n} tensor-parallel ranks"
        )));
    }
    Ok((lo, hi))
}

/// The block of `d`'s rows: the unit its columns can be cut in (1 for floats).
fn unit(d: &Data) -> usize {
    match d.dtype().is_quantized() {
        true => flm_core::quant::padded_cols(d.dtype(), 1),
        false => 1,
    }
}

/// The rank's heads: query heads `q` and key/value heads `kv`, as ranges.
struct Heads {
    q: (usize, usize),
    kv: (usize, usize),
}

/// How a rank holds the routed experts.
enum Experts {
    /// Expert parallelism: the whole experts `lo..hi`.
    Whole((usize, usize)),
    /// Tensor parallelism: the range `lo..hi` of each expert's width.
    Width((usize, usize)),
}

/// Rank `r` of `n`'s ranges of the model's widths.
pub(crate) struct Split {
    heads: Heads,
    /// Of the dense feed-forward width.
    ffn: (usize, usize),
    /// Of the routed experts.
    experts: Experts,
    /// Of the shared expert's width.
    shared: (usize, usize),
    /// Of the vocabulary.
    vocab: (usize, usize),
}

impl Split {
    /// The ranges of rank `r` of `n` for the model `c` with weights `w`: heads evenly, the
    /// routed experts evenly when their number divides (else their width), the
    /// feed-forward widths as evenly as the blocks of their down projections allow.
    ///
    /// Errors: [`Error::Config`] for what does not divide.
    pub(crate) fn new(c: &ModelConfig, w: &LlamaWeights, r: usize, n: usize) -> Result<Split> {
        let (mut dense, mut routed, mut shared) = (1, 1, 1);
        for lw in &w.layers {
            match &lw.ffn {
                Ffn::Dense { w_down, .. } => dense = dense.max(unit(w_down)),
                Ffn::Moe {
                    experts, shared: s, ..
                } => {
                    routed = experts
                        .iter()
                        .map(|e| unit(&e.down))
                        .fold(routed, usize::max);
                    if let Some(s) = s {
                        shared = shared.max(unit(&s.ffn.down));
                    }
                }
            }
        }
        let moe = c.moe.as_ref();
        let width = |d: usize, unit: usize, what: &str| match d {
            0 => Ok((0, 0)),
            d => aligned_part(d, r, n, unit, what),
        };
        let experts = match moe {
            Some(m) if m.n_experts.is_multiple_of(n) => {
                Experts::Whole(part(m.n_experts, r, n, "the experts")?)
            }
            m => Experts::Width(width(
                m.map_or(0, |m| m.expert_dim),
                routed,
                "the experts' width",
            )?),
        };
        Ok(Split {
            heads: heads(c, r, n)?,
            ffn: width(c.hidden_dim, dense, "the feed-forward width")?,
            experts,
            shared: width(
                moe.and_then(|m| m.shared_expert_dim).unwrap_or(0),
                shared,
                "the shared expert's width",
            )?,
            vocab: vocab_part(c.vocab_size, r, n)?,
        })
    }
}

fn heads(c: &ModelConfig, r: usize, n: usize) -> Result<Heads> {
    let q = part(c.n_heads, r, n, "the attention heads")?;
    let kv = if c.n_kv_heads.is_multiple_of(n) {
        part(c.n_kv_heads, r, n, "the KV heads")?
    } else if n.is_multiple_of(c.n_kv_heads) {
        // `n / n_kv_heads` ranks share each KV head: rank r's query heads all read head
        // `r / (n / n_kv_heads)`, as `n_heads / n_kv_heads` is a multiple of their count.
        let h = r / (n / c.n_kv_heads);
        (h, h + 1)
    } else {
        return Err(Error::Config(format!(
            "{} KV heads do not divide among {n} tensor-parallel ranks, nor do the ranks \
             among them",
            c.n_kv_heads
        )));
    };
    Ok(Heads { q, kv })
}

/// The configuration a rank with the ranges `split` runs: its heads and its feed-forward
/// widths.
///
/// Errors: [`Error::Config`] for what the tensor-parallel split does not cover (multi-head
/// latent attention, ALiBi, a p-tuning prefix, prediction layers).
pub(crate) fn local_config(c: &ModelConfig, split: &Split) -> Result<ModelConfig> {
    let unsupported = [
        (c.mla.is_some(), "multi-head latent attention"),
        (c.alibi, "ALiBi"),
        (c.pre_seq_len > 0, "a p-tuning prefix"),
        (c.mtp_layers > 0, "multi-token-prediction layers"),
    ];
    if let Some((_, what)) = unsupported.iter().find(|(has, _)| *has) {
        return Err(Error::Config(format!(
            "tensor parallelism does not split {what} yet"
        )));
    }
    let (h, width) = (&split.heads, |(lo, hi): (usize, usize)| hi - lo);
    let mut local = c.clone();
    local.n_heads = width(h.q);
    local.n_kv_heads = width(h.kv);
    local.hidden_dim = width(split.ffn);
    // The rank's classifier rows are apart ([`TpShard::head`]).
    local.tie_embeddings = true;
    if let Some(m) = &mut local.moe {
        // The router still scores all `n_experts`; a rank of whole experts keeps their width.
        if let Experts::Width(w) = split.experts {
            m.expert_dim = width(w);
        }
        if let Some(d) = &mut m.shared_expert_dim {
            *d = width(split.shared);
        }
    }
    Ok(local)
}

/// Rank `r`'s rows `lo..hi` of `d` (`[out, in]`, or a vector).
fn rows(d: &Data, (lo, hi): (usize, usize)) -> Result<Data> {
    Ok(d.row_range(lo, hi)?)
}

/// Rank `r`'s columns `lo..hi` of `d`.
fn cols(d: &Data, (lo, hi): (usize, usize)) -> Result<Data> {
    Ok(d.col_range(lo, hi)?)
}

/// `(lo·k, hi·k)`.
fn times((lo, hi): (usize, usize), k: usize) -> (usize, usize) {
    (lo * k, hi * k)
}

/// A bias added after an all-reduce: rank 0's is the bias, the others' zeros.
fn reduced_bias(b: &Data, r: usize) -> Result<Data> {
    if r == 0 {
        return Ok(b.clone());
    }
    Ok(Data::zeros(b.dtype(), b.shape())?)
}

/// A gated feed-forward's part: rows `f` of gate and up, columns `f` of down.
fn expert(e: &Expert, f: (usize, usize), r: usize) -> Result<Expert> {
    Ok(Expert {
        gate: rows(&e.gate, f)?,
        up: rows(&e.up, f)?,
        down: cols(&e.down, f)?,
        biases: match &e.biases {
            Some([g, u, d]) => Some([rows(g, f)?, rows(u, f)?, reduced_bias(d, r)?]),
            None => None,
        },
    })
}

/// Rank `r`'s part (`split`) of layer `lw` of the model `c`.
fn layer(c: &ModelConfig, lw: &LlamaLayer, split: &Split, r: usize) -> Result<LlamaLayer> {
    let h = &split.heads;
    let (q, kv) = (times(h.q, c.head_dim), times(h.kv, c.head_dim));
    let attn = match &lw.attn {
        Attention::Heads(a) => Attention::Heads(QkvProjections {
            wq: rows(&a.wq, q)?,
            wk: rows(&a.wk, kv)?,
            wv: rows(&a.wv, kv)?,
            qkv_bias: match &a.qkv_bias {
                Some([bq, bk, bv]) => Some([rows(bq, q)?, rows(bk, kv)?, rows(bv, kv)?]),
                None => None,
            },
            qk_norm: a.qk_norm.clone(),
            sinks: a.sinks.as_ref().map(|s| rows(s, h.q)).transpose()?,
        }),
        Attention::Latent(_) => {
            return Err(Error::Config(
                "tensor parallelism does not split multi-head latent attention yet".into(),
            ))
        }
    };
    let ffn = match &lw.ffn {
        Ffn::Dense {
            w_gate,
            w_down,
            w_up,
        } => Ffn::Dense {
            w_gate: rows(w_gate, split.ffn)?,
            w_down: cols(w_down, split.ffn)?,
            w_up: rows(w_up, split.ffn)?,
        },
        Ffn::Moe {
            router,
            router_bias,
            router_logit_bias,
            experts,
            shared,
            ..
        } => {
            // Split by width even beside whole experts: every rank runs an equal share of it.
            let shared = match shared {
                Some(s) => Some(Box::new(SharedExpert {
                    ffn: expert(&s.ffn, split.shared, r)?,
                    gate: s.gate.clone(),
                })),
                None => None,
            };
            // The layer holds all its experts ([`super::SharedLlama::shard`] checks it).
            let (experts, first_expert) = match split.experts {
                Experts::Whole((lo, hi)) => {
                    let held = experts.get(lo..hi).ok_or_else(|| {
                        Error::Config(format!(
                            "experts {lo}..{hi} of a layer of {}",
                            experts.len()
                        ))
                    })?;
                    (held.to_vec(), lo)
                }
                Experts::Width(f) => (
                    experts
                        .iter()
                        .map(|e| expert(e, f, r))
                        .collect::<Result<_>>()?,
                    0,
                ),
            };
            Ffn::Moe {
                router: router.clone(),
                router_bias: router_bias.clone(),
                router_logit_bias: router_logit_bias.clone(),
                experts,
                first_expert,
                shared,
            }
        }
    };
    Ok(LlamaLayer {
        attn_norm: lw.attn_norm.clone(),
        attn,
        wo: cols(&lw.wo, q)?,
        bo: lw.bo.as_ref().map(|b| reduced_bias(b, r)).transpose()?,
        ffn_norm: lw.ffn_norm.clone(),
        ffn,
        post_norms: lw.post_norms.clone(),
    })
}

/// Rank `r`'s weights (its ranges `split`) of the model `c` and its rows of the
/// classifier.
///
/// Errors: [`Error::Config`] for a quantised matrix whose columns cannot be cut at the
/// rank's bounds.
pub(crate) fn weights(
    w: &LlamaWeights,
    c: &ModelConfig,
    split: &Split,
    r: usize,
) -> Result<(LlamaWeights, Data)> {
    let classifier = w.classifier.as_ref().unwrap_or(&w.embedding);
    let head = rows(classifier, split.vocab)?;
    let layers = w
        .layers
        .iter()
        .map(|lw| layer(c, lw, split, r))
        .collect::<Result<_>>()
        .map_err(|e| match e {
            Error::Core(e) => Error::Config(format!(
                "the weights do not split among the tensor-parallel ranks: {e}"
            )),
            e => e,
        })?;
    let local = LlamaWeights {
        embedding: w.embedding.clone(),
        layers,
        final_norm: w.final_norm.clone(),
        classifier: None,
        prefix_kv: None,
        mtp: Vec::new(),
    };
    Ok((local, head))
}
