//! Teacher-forced evaluation: perplexity, KL divergence against a base model's saved
//! log-probabilities, and next-token agreement over a token stream.
//!
//! A stream is cut into windows ([`windows`]), each run from an empty KV cache in one
//! prefill with the logits of every position; within a window, the token at position `i`
//! is scored from the logits at `i − 1`, for the positions from
//! [`Window::scored_from`] on. Two ways of cutting ([`Method`]):
//!
//! - llama.cpp's `llama-perplexity` (`tools/perplexity/perplexity.cpp`, `perplexity`):
//!   consecutive chunks of `ctx` tokens of the stream as tokenized with BOS, a tail shorter
//!   than `ctx` dropped; when the tokenizer adds BOS, each chunk's first token is replaced
//!   by BOS; only the second half of each chunk is scored (targets `ctx/2 + 1 .. ctx`), so
//!   that every scored token has at least `ctx/2` tokens of context.
//! - the Hugging Face guide "Perplexity of fixed-length models": windows of `ctx` tokens
//!   that start every `stride` tokens, each scoring the tokens that no earlier window
//!   scored; when the tokenizer adds BOS, every window starts with it (then `ctx − 1`
//!   tokens of text), so that no window but the first begins mid-text without it.
//!
//! Perplexity is `exp(Σ −ln p(tᵢ | t<ᵢ) / N)` over the scored tokens, and its standard error
//! `ppl · sqrt((E[nll²] − E[nll]²) / (N − 1))`, as llama-perplexity prints it.

mod kld;
mod logits_file;

pub use kld::{Estimate, KlDivergence, KlSummary};
pub use logits_file::{LogProbReader, LogProbRow, LogProbWriter};

use flm_core::{argmax, Executor};

use crate::llama::Logits;
use crate::Model;
use crate::{Error, Result};

/// How [`windows`] cuts a token stream (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// llama.cpp's: chunks of `ctx` tokens, BOS first, the second half scored.
    LlamaCpp,
    /// The Hugging Face guide's sliding window: a window every `stride` tokens.
    Sliding {
        /// Tokens of text between the starts of two windows (1 to the text a window holds).
        stride: usize,
    },
}

/// One window of a teacher-forced evaluation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// The token ids run from an empty KV cache.
    pub tokens: Vec<u32>,
    /// The first position whose token is scored, from the logits of the position before;
    /// every later position is scored too. At least 1.
    pub scored_from: usize,
}

impl Window {
    /// Tokens this window scores.
    pub fn scored(&self) -> usize {
        self.tokens.len() - self.scored_from
    }
}

/// Cuts `tokens` into the windows of `method` (see the module docs).
///
/// `tokens` is the text as the tokenizer encodes it with its special tokens (BOS first
/// when it adds one); `bos` is the BOS id when the tokenizer adds one, `None` otherwise.
///
/// Errors: [`Error::Config`] for `ctx < 2` (4 for [`Method::LlamaCpp`], which scores half
/// a window) or a stride of 0 or longer than a window's text; [`Error::InvalidInput`] for a
/// stream too short to score any token, or, for [`Method::LlamaCpp`], shorter than two
/// chunks (llama-perplexity's rule).
pub fn windows(
    tokens: &[u32],
    bos: Option<u32>,
    ctx: usize,
    method: Method,
) -> Result<Vec<Window>> {
    match method {
        Method::LlamaCpp => {
            if ctx < 4 {
                return Err(Error::Config(format!(
                    "llama.cpp's perplexity scores the second half of each window: the window \
                     must hold at least 4 tokens, got {ctx}"
                )));
            }
            if tokens.len() < 2 * ctx {
                return Err(Error::InvalidInput(format!(
                    "the text is {} tokens long; llama.cpp's perplexity with windows of {ctx} \
                     needs at least {} (two windows): use a longer text or a smaller --ctx",
                    tokens.len(),
                    2 * ctx
                )));
            }
            Ok(tokens
                .chunks_exact(ctx)
                .map(|chunk| {
                    let mut tokens = chunk.to_vec();
                    if let Some(bos) = bos {
                        tokens[0] = bos;
                    }
                    Window {
                        tokens,
                        scored_from: ctx / 2 + 1,
                    }
                })
                .collect())
        }
        Method::Sliding { stride } => {
            let text = match (bos, tokens.first()) {
                (Some(b), Some(&first)) if first == b => &tokens[1..],
                _ => tokens,
            };
            let lead = usize::from(bos.is_some());
            if ctx < 2 {
                return Err(Error::Config(format!(
                    "the evaluation window must hold at least 2 tokens, got {ctx}"
                )));
            }
            let span = ctx - lead;
            if stride == 0 || stride > span {
                return Err(Error::Config(format!(
                    "the stride must be 1 to {span} tokens (the text a window of {ctx} holds), \
                     got {stride}"
                )));
            }
            let mut out = Vec::new();
            let (mut begin, mut scored_to) = (0, 0);
            loop {
                let end = (begin + span).min(text.len());
                // Text position `j` sits at window position `j − begin + lead`, and a
                // window's first position cannot be scored.
                let first = scored_to.max(begin + 1 - lead);
                if first < end {
                    let tokens: Vec<u32> = bos
                        .into_iter()
                        .chain(text[begin..end].iter().copied())
                        .collect();
                    out.push(Window {
                        tokens,
                        scored_from: first - begin + lead,
                    });
                }
                scored_to = end;
                if end == text.len() {
                    break;
                }
                begin += stride;
            }
            if out.is_empty() {
                return Err(Error::InvalidInput(
                    "the text is too short to score any token".into(),
                ));
            }
            Ok(out)
        }
    }
}

/// `ln Σ exp(row)` in f64, from the row's maximum (a stable log-sum-exp).
fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    row.iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max
}

/// Perplexity and next-token agreement of a teacher-forced evaluation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TeacherForced {
    /// `Σ −ln p(tᵢ | t<ᵢ)` over the scored tokens, in nats.
    pub nll: f64,
    /// `Σ (−ln p(tᵢ | t<ᵢ))²`, for the standard error.
    pub nll_squared: f64,
    /// Number of scored tokens.
    pub scored: usize,
    /// The argmax prediction at each scored position, in stream order.
    pub predictions: Vec<u32>,
    /// The token each prediction is compared with.
    pub targets: Vec<u32>,
}

impl TeacherForced {
    /// Scores `target` under the logits `row` (`[vocab]` f32).
    pub fn add(&mut self, row: &[f32], target: u32) {
        let nll = log_sum_exp(row) - row[target as usize] as f64;
        self.nll += nll;
        self.nll_squared += nll * nll;
        self.scored += 1;
        self.predictions.push(argmax(row));
        self.targets.push(target);
    }

    /// `exp(nll / scored)`.
    pub fn perplexity(&self) -> f64 {
        (self.nll / self.scored.max(1) as f64).exp()
    }

    /// The standard error of [`TeacherForced::perplexity`] as llama-perplexity prints it
    /// ("PPL = x +/- e"): `ppl · sqrt((E[nll²] − E[nll]²) / (N − 1))`; 0 below 2 tokens.
    pub fn standard_error(&self) -> f64 {
        if self.scored < 2 {
            return 0.0;
        }
        let n = self.scored as f64;
        let mean = self.nll / n;
        let variance = (self.nll_squared / n - mean * mean).max(0.0);
        self.perplexity() * (variance / (n - 1.0)).sqrt()
    }
}

/// Runs each of `windows` through `model` from an empty KV cache and calls
/// `row(state, logits, target)` for each scored position, in order (`logits`: `[vocab]`
/// f32, the logits that predict `target`), then `window_done(state, done, windows)` after
/// each window.
///
/// Errors: [`Error::Config`] for a window longer than the model's context or shorter than
/// 2 tokens, [`Error::InvalidInput`] for no window, model errors, and those of the
/// callbacks.
pub fn score<S>(
    model: &mut Model,
    exec: &Executor,
    windows: &[Window],
    state: &mut S,
    mut row: impl FnMut(&mut S, &[f32], u32) -> Result<()>,
    mut window_done: impl FnMut(&mut S, usize, usize) -> Result<()>,
) -> Result<()> {
    let max = model.config().max_seq_len;
    if windows.is_empty() {
        return Err(Error::InvalidInput("no window to evaluate".into()));
    }
    if let Some(w) = windows
        .iter()
        .find(|w| w.tokens.len() < 2 || w.tokens.len() > max)
    {
        return Err(Error::Config(format!(
            "the evaluation window must hold 2 to {max} tokens, got {}",
            w.tokens.len()
        )));
    }
    let vocab = model.config().vocab_size;
    for (done, window) in windows.iter().enumerate() {
        let from = window.scored_from.max(1);
        let logits = model.forward(exec, &window.tokens, 0, Logits::All)?;
        let rows = logits.chunks_exact(vocab).skip(from - 1);
        for (logits, &target) in rows.zip(&window.tokens[from..]) {
            row(state, logits, target)?;
        }
        window_done(state, done + 1, windows.len())?;
    }
    Ok(())
}

/// Perplexity and next-token agreement over `windows` ([`score`]), calling
/// `progress(done, windows, so_far)` after each window with the result so far (its
/// perplexity is the running figure that llama-perplexity prints per chunk).
///
/// Errors: those of [`score`].
pub fn teacher_forced(
    model: &mut Model,
    exec: &Executor,
    windows: &[Window],
    mut progress: impl FnMut(usize, usize, &TeacherForced),
) -> Result<TeacherForced> {
    let mut out = TeacherForced::default();
    score(
        model,
        exec,
        windows,
        &mut out,
        |out, row, target| {
            out.add(row, target);
            Ok(())
        },
        |out, done, all| {
            progress(done, all, out);
            Ok(())
        },
    )?;
    Ok(out)
}

/// KL divergence of `model` from the base log-probabilities in `base`, over the text the
/// file holds, cut by llama.cpp's method with `bos` (the BOS id when the tokenizer adds
/// one) as `llama-perplexity --kl-divergence` does; `progress(done, windows)` after each
/// window.
///
/// Errors: [`Error::Config`] when the file's vocabulary is not the model's, those of
/// [`windows`], [`score`] and [`LogProbReader::next_row`].
pub fn kl_divergence(
    model: &mut Model,
    exec: &Executor,
    base: &mut LogProbReader,
    bos: Option<u32>,
    mut progress: impl FnMut(usize, usize),
) -> Result<KlSummary> {
    let vocab = model.config().vocab_size;
    if base.vocab() != vocab {
        return Err(Error::Config(format!(
            "the file holds log-probabilities over {} tokens and the model has {vocab}: KL \
             divergence needs models of one tokenizer",
            base.vocab()
        )));
    }
    let windows = windows(base.tokens(), bos, base.ctx(), Method::LlamaCpp)?;
    let mut row = LogProbRow::default();
    let mut kld = KlDivergence::default();
    score(
        model,
        exec,
        &windows,
        &mut kld,
        |kld, logits, target| {
            base.next_row(&mut row)?;
            kld.add(logits, &row, target);
            Ok(())
        },
        |_, done, all| {
            progress(done, all);
            Ok(())
        },
    )?;
    kld.summary()
        .ok_or_else(|| Error::InvalidInput("no position was scored".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: u32) -> Vec<u32> {
        (100..100 + n).collect()
    }

    #[test]
    fn llama_cpp_chunks_start_with_bos_and_score_their_second_half() {
        let mut tokens = vec![1];
        tokens.extend(ids(40));
        let w = windows(&tokens, Some(1), 16, Method::LlamaCpp).unwrap();
        // 41 tokens: two whole chunks, the tail of 9 dropped.
        assert_eq!(w.len(), 2);
        assert_eq!(w[0].tokens, tokens[..16]);
        assert_eq!(w[1].tokens[0], 1);
        assert_eq!(w[1].tokens[1..], tokens[17..32]);
        assert!(w.iter().all(|w| w.scored_from == 9 && w.scored() == 7));
        // Without BOS the chunks are the text itself.
        let w = windows(&ids(40), None, 16, Method::LlamaCpp).unwrap();
        assert_eq!(w[1].tokens, ids(40)[16..32]);
        let e = windows(&ids(31), None, 16, Method::LlamaCpp).unwrap_err();
        assert!(e.to_string().contains("at least 32"), "{e}");
        assert!(windows(&ids(40), None, 3, Method::LlamaCpp).is_err());
    }

    #[test]
    fn sliding_windows_score_every_token_once_with_bos_first() {
        let mut tokens = vec![1];
        tokens.extend(ids(40));
        for stride in [1, 5, 15] {
            let w = windows(&tokens, Some(1), 16, Method::Sliding { stride }).unwrap();
            let mut scored = Vec::new();
            for w in &w {
                assert_eq!(w.tokens[0], 1);
                assert!(w.tokens.len() <= 16 && w.scored_from >= 1);
                scored.extend_from_slice(&w.tokens[w.scored_from..]);
            }
            // Every text token is scored once, in order, the first from BOS alone.
            assert_eq!(scored, ids(40), "stride {stride}");
        }
        // Without BOS a window's first token has nothing to be predicted from: with windows
        // that do not overlap, as in the guide, those go unscored.
        let w = windows(&ids(40), None, 16, Method::Sliding { stride: 16 }).unwrap();
        let scored: Vec<u32> = w
            .iter()
            .flat_map(|w| w.tokens[w.scored_from..].to_vec())
            .collect();
        let want: Vec<u32> = ids(40)
            .into_iter()
            .filter(|t| !(t - 100).is_multiple_of(16))
            .collect();
        assert_eq!(scored, want);
        assert_eq!(w[1].tokens, ids(40)[16..32]);
        assert!(windows(&tokens, Some(1), 16, Method::Sliding { stride: 16 }).is_err());
        assert!(windows(&tokens, Some(1), 16, Method::Sliding { stride: 0 }).is_err());
        assert!(windows(&[1], Some(1), 16, Method::Sliding { stride: 4 }).is_err());
    }

    #[test]
    fn the_standard_error_is_llama_cpps() {
        let mut t = TeacherForced::default();
        // Rows whose target has probability 1/2 and 1/4: nll ln 2 and ln 4.
        t.add(&[0.0, 0.0], 0);
        t.add(&[0.0, 3f32.ln(), 0.0 - f32::INFINITY], 0);
        let (a, b) = (2f64.ln(), 4f64.ln());
        let mean = (a + b) / 2.0;
        let var = (a * a + b * b) / 2.0 - mean * mean;
        assert!((t.perplexity() - mean.exp()).abs() < 1e-6);
        assert!((t.standard_error() - mean.exp() * var.sqrt()).abs() < 1e-6);
    }
}
