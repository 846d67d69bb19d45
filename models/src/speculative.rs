//! Speculative decoding: a small draft model proposes `K` tokens, the target model checks
//! them in one batched forward pass, and the tokens come out distributed exactly as if the
//! target had sampled them one by one.
//!
//! The math is Algorithm 1 of Leviathan, Kalman and Matias 2023, "Fast Inference from
//! Transformers via Speculative Decoding" (also Chen et al. 2023, "Accelerating Large
//! Language Model Decoding with Speculative Sampling"). With `q_i` the draft's distribution
//! at draft position `i` (after the same penalties, temperature, top-k and top-p as the
//! target's, [`Sampler::probabilities`]), `x_i ~ q_i` the drafted token and `p_i` the
//! target's distribution at that position from the verification pass:
//!
//! - `x_i` is accepted with probability `min(1, p_i(x_i) / q_i(x_i))`;
//! - at the first rejection, a token is drawn from the residual `norm(max(0, p_i − q_i))`
//!   and the round ends;
//! - when all `K` are accepted, one more token is drawn from `p_{K+1}`, which the same pass
//!   computed.
//!
//! Each round therefore yields between 1 and `K + 1` tokens for one target pass. For
//! greedy decoding (temperature 0) every distribution is one-hot at its argmax, and the rule
//! reduces to: accept while the target's argmax equals the draft token, then take the
//! target's token — the output of plain greedy decoding, provided the target gives a row
//! the same logits in the `K + 1`-row verification pass as in a one-row decode step. Where a
//! kernel reduces a multi-row product in another order, a near-tie between the two best
//! tokens could break differently; the tests find the same tokens as plain greedy decoding
//! with the stories260K f32 target, and the batch-invariant kernels make the logits
//! bit-identical for any number of rows, on which the exactness of
//! greedy speculative decoding rests in general.
//!
//! The verification pass overwrites KV-cache positions: the cache is positional, so the
//! keys and values of rejected tokens are simply overwritten by later passes. The draft's
//! cache holds the tokens it has run ([`Draft`] remembers which), and a round first runs the
//! draft over the tokens it has not seen (the target's correction, or the last accepted
//! token and the bonus token).
//!
//! The draft may also be the target's own multi-token-prediction layers ([`Draft::mtp`];
//! DeepSeek-V3, GLM-4.5), as vLLM and SGLang run them: a round first runs the prediction
//! layer over the positions the target has computed since the last round, each with the
//! target's hidden state there and the token after it, which drafts `x_1`; the layer then
//! drafts `x_2..x_K` on its own output ([`crate::MtpInput::Previous`]). The acceptance
//! rule is the same, so the output is the target's whatever the drafts.

use flm_core::{Executor, Sampler, SamplerConfig};
use flm_tokenizer::Tokenizer;

use crate::llama::Logits;
use crate::{Error, Model, MtpInput, Result};

/// Draft tokens per round when none is asked for.
pub const DEFAULT_DRAFT_TOKENS: usize = 4;

/// Mixed into the seed of the draft's random stream, so that it differs from the target's.
const DRAFT_SEED_SALT: u64 = 0x9e37_79b9_7f4a_7c15;

/// Fails unless the draft's and the target's tokenizers are the same vocabulary (the same
/// pieces for every id, the same BOS and EOS) and their models the same vocabulary size:
/// speculative decoding compares the two models' distributions token by token.
///
/// Errors: [`Error::Config`] naming the first difference.
pub fn check_same_vocabulary(
    target: &Model,
    target_tokenizer: &Tokenizer,
    draft: &Model,
    draft_tokenizer: &Tokenizer,
) -> Result<()> {
    let mismatch = |what: String| {
        Err(Error::Config(format!(
            "the draft model cannot serve this target: {what}; speculative decoding needs \
             both models to share one tokenizer"
        )))
    };
    let (tv, dv) = (target.config().vocab_size, draft.config().vocab_size);
    if tv != dv {
        return mismatch(format!("vocabularies of {tv} and {dv} tokens"));
    }
    let (tt, dt) = (target_tokenizer, draft_tokenizer);
    if tt.vocab_size() != dt.vocab_size() {
        return mismatch(format!(
            "tokenizers of {} and {} tokens",
            tt.vocab_size(),
            dt.vocab_size()
        ));
    }
    if (tt.bos_id(), tt.eos_id()) != (dt.bos_id(), dt.eos_id()) {
        return mismatch("different begin- or end-of-sequence tokens".into());
    }
    if let Some(id) = (0..tt.vocab_size() as u32).find(|&id| tt.piece(id) != dt.piece(id)) {
        return mismatch(format!("token {id} differs"));
    }
    Ok(())
}

/// The acceptance step of Algorithm 1 for one drafted token `x` drawn from `q`, against the
/// target's `p` (both dense over the vocabulary, summing to 1): draws `r ~ U[0, 1)` from
/// `sampler` and accepts when `r · q(x) < p(x)`, i.e. with probability
/// `min(1, p(x) / q(x))`. Returns `None` when accepted, else the token drawn from the
/// residual `norm(max(0, p − q))` (from `p` itself in the measure-zero case where rounding
/// leaves no residual mass). `residual` is scratch space.
///
/// Errors: [`Error::Core`] when `p` has no positive mass.
pub fn accept_or_resample(
    sampler: &mut Sampler,
    p: &[f32],
    q: &[f32],
    x: u32,
    residual: &mut Vec<f32>,
) -> Result<Option<u32>> {
    let (px, qx) = (p[x as usize], q[x as usize]);
    if sampler.uniform() * qx < px {
        return Ok(None);
    }
    residual.clear();
    residual.extend(p.iter().zip(q).map(|(p, q)| (p - q).max(0.0)));
    if residual.iter().any(|&r| r > 0.0) {
        Ok(Some(sampler.draw(residual)?))
    } else {
        Ok(Some(sampler.draw(p)?))
    }
}

/// Counts of proposed and accepted draft tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Verification rounds.
    pub rounds: usize,
    /// Draft tokens proposed.
    pub proposed: usize,
    /// Draft tokens the target accepted.
    pub accepted: usize,
}

impl DraftStats {
    /// `accepted / proposed`, or `None` before any proposal.
    pub fn acceptance_rate(&self) -> Option<f64> {
        (self.proposed > 0).then(|| self.accepted as f64 / self.proposed as f64)
    }
}

/// What proposes the draft tokens.
enum Proposer {
    /// A draft model instance; `cached`: the tokens at positions `0..cached.len()` of its
    /// KV cache.
    Model { model: Model, cached: Vec<u32> },
    /// The target's multi-token-prediction layers; `cached`: the sequence whose positions
    /// `0..cached.len() - 1` the layer's KV cache holds from the target's hidden states.
    Mtp { cached: Vec<u32> },
}

/// A draft, proposing up to `K` tokens per round: a draft model with its own KV cache
/// ([`Draft::new`]) or the target's own multi-token-prediction layers ([`Draft::mtp`]).
pub struct Draft {
    proposer: Proposer,
    tokens: usize,
    sampler: Sampler,
    stats: DraftStats,
    /// `q_1..q_K` of the current round, `[K][vocab]`.
    q: Vec<Vec<f32>>,
    p: Vec<f32>,
    residual: Vec<f32>,
    /// The sequence with the current round's draft tokens appended (their histories).
    sequence: Vec<u32>,
    out: Vec<u32>,
}

impl Draft {
    /// A draft proposing `tokens` (`K`) tokens per round with `model` (an instance of its
    /// own, empty KV cache).
    ///
    /// Errors: [`Error::InvalidInput`] for `K = 0`; [`Error::Config`] for a ChatGLM-6B
    /// draft, whose passes cannot continue a cached prefix ([`crate::Graph::continues_prefix`]).
    pub fn new(model: Model, tokens: usize) -> Result<Draft> {
        if !model.continues_prefix() {
            return Err(Error::Config(
                "a ChatGLM-6B model cannot be a draft model: it cannot continue a cached \
                 sequence"
                    .into(),
            ));
        }
        let cached = Vec::new();
        Draft::with(Proposer::Model { model, cached }, tokens)
    }

    /// A draft proposing `tokens` (`K`) tokens per round with the target's
    /// multi-token-prediction layers: give it to a session of a model that has them
    /// ([`crate::session::Session::set_draft`]).
    ///
    /// Errors: [`Error::InvalidInput`] for `K = 0`.
    pub fn mtp(tokens: usize) -> Result<Draft> {
        let cached = Vec::new();
        Draft::with(Proposer::Mtp { cached }, tokens)
    }

    fn with(proposer: Proposer, tokens: usize) -> Result<Draft> {
        if tokens == 0 {
            return Err(Error::InvalidInput(
                "the draft must propose at least 1 token per round".into(),
            ));
        }
        Ok(Draft {
            proposer,
            tokens,
            sampler: Sampler::new(SamplerConfig::default())?,
            stats: DraftStats::default(),
            q: Vec::new(),
            p: Vec::new(),
            residual: Vec::new(),
            sequence: Vec::new(),
            out: Vec::new(),
        })
    }

    /// The draft model instance; `None` for the target's prediction layers.
    pub fn model(&self) -> Option<&Model> {
        match &self.proposer {
            Proposer::Model { model, .. } => Some(model),
            Proposer::Mtp { .. } => None,
        }
    }

    /// Tokens proposed per round (`K`).
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Starts a generation with the target's sampling parameters: the draft samples with
    /// the same ones from its own random stream (the seed mixed with a constant), and the
    /// counts start at 0.
    ///
    /// Errors: invalid sampling parameters.
    pub fn start(&mut self, config: &SamplerConfig) -> Result<()> {
        self.sampler = Sampler::new(SamplerConfig {
            seed: config.seed ^ DRAFT_SEED_SALT,
            ..config.clone()
        })?;
        self.stats = DraftStats::default();
        Ok(())
    }

    /// The counts since [`Draft::start`].
    pub fn stats(&self) -> DraftStats {
        self.stats
    }

    /// One round of speculative decoding after `tokens` (the whole sequence, `L` tokens, of
    /// which the first `prompt_len` are the prompt; the presence and frequency penalties
    /// count the others):
    /// the draft proposes `k` tokens, the target runs `[tokens[L-1], x_1..x_k]` at position
    /// `L - 1` in one pass with every row's logits, and the acceptance rule (see the module
    /// docs) with `sampler` (the target's) picks the tokens returned: the accepted drafts
    /// and one token drawn by the target, `1..=k+1` tokens. `k` is `K`, shrunk so that
    /// neither model's passes run past its context and at most `max_new` tokens come out.
    ///
    /// The caller keeps the target's KV cache valid for `tokens[..L-1]`; afterwards it is
    /// valid for `tokens` and every returned token but the last.
    ///
    /// Errors: [`Error::InvalidInput`] for an empty sequence or `max_new = 0`; those of
    /// the models' forward passes (a sequence that fills the target's context included) and
    /// of the sampler. After an error the draft's KV cache is taken as empty.
    pub fn round(
        &mut self,
        exec: &Executor,
        target: &mut Model,
        tokens: &[u32],
        prompt_len: usize,
        sampler: &mut Sampler,
        max_new: usize,
    ) -> Result<&[u32]> {
        let len = tokens.len();
        if len == 0 || max_new == 0 || prompt_len > len {
            return Err(Error::InvalidInput(
                "a speculative round needs a sequence and room for a token".into(),
            ));
        }
        let target_room = target.config().max_seq_len.saturating_sub(len);
        let draft_room = match &self.proposer {
            Proposer::Model { model, .. } => (model.config().max_seq_len + 1).saturating_sub(len),
            // The prediction layers read the hidden state of the position before the last.
            Proposer::Mtp { .. } if len < 2 => 0,
            Proposer::Mtp { .. } => target_room,
        };
        let k = self
            .tokens
            .min(max_new - 1)
            .min(target_room)
            .min(draft_room);
        self.propose(exec, target, tokens, prompt_len, k)?;
        // The last token of the sequence and the drafts: `k + 1` rows of logits.
        let window = &self.sequence[len - 1..];
        let rows = target.forward(exec, window, len - 1, Logits::All)?;
        let vocab = rows.len() / window.len();
        self.out.clear();
        for (i, row) in rows.chunks_exact(vocab).enumerate() {
            let history = &self.sequence[..len + i];
            let output = &history[prompt_len..];
            sampler.probabilities(row, history, output, &mut self.p)?;
            let Some(&x) = self.sequence.get(len + i) else {
                self.out.push(sampler.draw(&self.p)?);
                break;
            };
            match accept_or_resample(sampler, &self.p, &self.q[i], x, &mut self.residual)? {
                None => self.out.push(x),
                Some(t) => {
                    self.out.push(t);
                    break;
                }
            }
        }
        self.stats.rounds += 1;
        self.stats.proposed += k;
        self.stats.accepted += self.out.len() - 1;
        Ok(&self.out)
    }

    /// Runs the draft over the tokens of `tokens` not in its cache and `k - 1` of its own
    /// proposals, drawing `x_1..x_k` into `self.sequence[L..]` and their distributions into
    /// `self.q`.
    fn propose(
        &mut self,
        exec: &Executor,
        target: &mut Model,
        tokens: &[u32],
        prompt_len: usize,
        k: usize,
    ) -> Result<()> {
        let len = tokens.len();
        let Draft {
            proposer,
            sampler,
            q,
            sequence,
            ..
        } = self;
        sequence.clear();
        sequence.extend_from_slice(tokens);
        if k == 0 {
            return Ok(());
        }
        q.resize_with(k, Vec::new);
        // Until the passes succeed, the cache holds an unknown sequence.
        let mut logits = match proposer {
            Proposer::Model { model, cached } => {
                let reused = common_prefix(cached, tokens).min(len - 1);
                cached.clear();
                model.forward(exec, &tokens[reused..], reused, Logits::Last)?
            }
            Proposer::Mtp { cached } => {
                // Position `i` reads the token at `i + 1`: the last has none yet.
                let done = common_prefix(cached, tokens).saturating_sub(1).min(len - 2);
                cached.clear();
                let next = &tokens[done + 1..];
                target.mtp_forward(exec, 0, next, done, MtpInput::Model)?
            }
        };
        for i in 0..k {
            let q = &mut q[i];
            let output = &sequence[prompt_len..];
            sampler.probabilities(logits, sequence, output, q)?;
            let x = sampler.draw(q)?;
            sequence.push(x);
            if i + 1 < k {
                logits = match proposer {
                    Proposer::Model { model, .. } => {
                        model.forward(exec, &[x], len + i, Logits::Last)?
                    }
                    // Drafting on from the draft at `L - 1 + i`: one layer, chained (the
                    // models ship one).
                    Proposer::Mtp { .. } => {
                        target.mtp_forward(exec, 0, &[x], len - 1 + i, MtpInput::Previous)?
                    }
                };
            }
        }
        match proposer {
            Proposer::Model { cached, .. } => cached.extend_from_slice(&sequence[..len + k - 1]),
            Proposer::Mtp { cached } => cached.extend_from_slice(tokens),
        }
        Ok(())
    }
}

/// The length of the longest common prefix of `a` and `b`.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests;
