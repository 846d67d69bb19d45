//! `flm bench --mtp-drafts K`: what a round of speculative decoding drafted by the model's
//! multi-token-prediction layer costs ([`flm_models::speculative`]): the target's
//! verification pass over `K + 1` rows, the `K` one-row passes of the layer, and a plain
//! decode step; and the speed-up over plain decoding that follows at an acceptance rate
//! `α`, with each draft accepted independently with probability `α` (Leviathan et al. 2023,
//! §3.1): a round yields `(1 − α^(K+1)) / (1 − α)` tokens.

use std::time::Instant;

use anyhow::{ensure, Result};
use flm_core::Executor;
use flm_models::llama::{Llama, Logits};
use flm_models::{Graph, MtpInput};

/// Mean seconds of each part of a round, over the repetitions.
pub struct RoundCosts {
    /// Drafts per round.
    pub drafts: usize,
    /// The target's pass over the last token and the drafts, `K + 1` rows.
    pub verify: f64,
    /// The prediction layer's `K` one-row passes together.
    pub draft: f64,
    /// One plain decode step.
    pub decode: f64,
}

impl RoundCosts {
    /// Decode's speed-up at acceptance rate `alpha` (in `[0, 1)`): tokens per round over
    /// the round's time, relative to one token per decode step.
    pub fn speed_up(&self, alpha: f64) -> f64 {
        let tokens = (1.0 - alpha.powi(self.drafts as i32 + 1)) / (1.0 - alpha);
        tokens * self.decode / (self.verify + self.draft)
    }
}

/// Measures [`RoundCosts`] after `prompt` (run first, at position 0), `reps` times after one
/// warm-up, rounds of `drafts` tokens at the positions after the prompt.
///
/// Errors: a model without prediction layers, and those of the passes.
pub fn costs(
    exec: &Executor,
    model: &mut Llama,
    prompt: &[u32],
    drafts: usize,
    reps: usize,
) -> Result<RoundCosts> {
    ensure!(
        model.mtp_layers() > 0,
        "--mtp-drafts measures the model's multi-token-prediction layer; this model has none"
    );
    ensure!(drafts > 0, "--mtp-drafts must be at least 1");
    // The layer reads the model's hidden state of the position before the token it gets.
    ensure!(
        prompt.len() >= 2,
        "--mtp-drafts needs --prompt-tokens of at least 2"
    );
    model.keep_mtp_hidden()?;
    let at = prompt.len();
    model.forward(exec, prompt, 0, Logits::Last)?;
    model.mtp_forward(exec, 0, &prompt[1..], 0, MtpInput::Model)?;
    let window: Vec<u32> = prompt.iter().cycle().take(drafts + 1).copied().collect();
    let mut sums = [0.0; 3];
    for rep in 0..=reps {
        let start = Instant::now();
        model.forward(exec, &window, at, Logits::All)?;
        let verify = start.elapsed().as_secs_f64();
        let start = Instant::now();
        model.mtp_forward(exec, 0, &window[1..2], at, MtpInput::Model)?;
        for (i, token) in window[2..].iter().enumerate() {
            model.mtp_forward(exec, 0, &[*token], at + 1 + i, MtpInput::Previous)?;
        }
        let draft = start.elapsed().as_secs_f64();
        let start = Instant::now();
        model.forward(exec, &window[..1], at, Logits::Last)?;
        let decode = start.elapsed().as_secs_f64();
        if rep > 0 {
            for (sum, t) in sums.iter_mut().zip([verify, draft, decode]) {
                *sum += t / reps as f64;
            }
        }
    }
    let [verify, draft, decode] = sums;
    Ok(RoundCosts {
        drafts,
        verify,
        draft,
        decode,
    })
}
