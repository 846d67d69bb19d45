//! Teacher-forced evaluation: perplexity and next-token predictions over a token stream.
//!
//! The stream is cut into non-overlapping windows of `ctx` tokens, each run from an empty
//! KV cache in one prefill with the logits of every position; within a window, token `i`
//! is scored from the logits at `i − 1` (so the first token of each window is not scored).
//! This is the fixed-window perplexity of the Hugging Face guide "Perplexity of
//! fixed-length models" with stride = ctx: `ppl = exp(Σ −log p(tᵢ | t<ᵢ) / N)`.

use flm_core::{argmax, Executor};

use crate::llama::Logits;
use crate::Model;
use crate::{Error, Result};

/// The result of [`teacher_forced`].
#[derive(Debug, Clone, PartialEq)]
pub struct TeacherForced {
    /// `Σ −ln p(tᵢ | t<ᵢ)` over the scored tokens, in nats.
    pub nll: f64,
    /// Number of scored tokens.
    pub scored: usize,
    /// The argmax prediction at each scored position, in stream order.
    pub predictions: Vec<u32>,
    /// The token each prediction is compared with.
    pub targets: Vec<u32>,
}

impl TeacherForced {
    /// `exp(nll / scored)`.
    pub fn perplexity(&self) -> f64 {
        (self.nll / self.scored.max(1) as f64).exp()
    }
}

/// Runs `tokens` through `model` in windows of `ctx` tokens (see the module docs), calling
/// `progress(done, windows, so_far)` after each window with the windows done, their
/// number and the result so far (its perplexity is the running figure that
/// llama-perplexity prints per chunk).
///
/// Errors: [`Error::Config`] for `ctx < 2` or beyond the model's context,
/// [`Error::InvalidInput`] for fewer than 2 tokens, model errors.
pub fn teacher_forced(
    model: &mut Model,
    exec: &Executor,
    tokens: &[u32],
    ctx: usize,
    mut progress: impl FnMut(usize, usize, &TeacherForced),
) -> Result<TeacherForced> {
    let max = model.config().max_seq_len;
    if ctx < 2 || ctx > max {
        return Err(Error::Config(format!(
            "the evaluation window must hold 2 to {max} tokens, got {ctx}"
        )));
    }
    if tokens.len() < 2 {
        return Err(Error::InvalidInput(
            "perplexity needs a text of at least 2 tokens".into(),
        ));
    }
    let vocab = model.config().vocab_size;
    let mut out = TeacherForced {
        nll: 0.0,
        scored: 0,
        predictions: Vec::new(),
        targets: Vec::new(),
    };
    let windows = tokens.chunks(ctx).filter(|w| w.len() >= 2).count();
    for (done, window) in tokens.chunks(ctx).filter(|w| w.len() >= 2).enumerate() {
        let logits = model.forward(exec, window, 0, Logits::All)?;
        for (row, &target) in logits.chunks_exact(vocab).zip(&window[1..]) {
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
            let log_sum = row
                .iter()
                .map(|&v| (v as f64 - max).exp())
                .sum::<f64>()
                .ln()
                + max;
            out.nll += log_sum - row[target as usize] as f64;
            out.scored += 1;
            out.predictions.push(argmax(row));
            out.targets.push(target);
        }
        progress(done + 1, windows, &out);
    }
    Ok(out)
}
