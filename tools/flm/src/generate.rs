//! The output of `flm run` and `flm chat`: the generation loop of [`Session`] streaming
//! text (or ids) to stdout, and the summary line.

use std::fmt;
use std::io::Write;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use flm_core::Executor;
use flm_models::session::{GenerateParams, Generation, Piece, Session, StopReason};

/// Resident memory of this process in MiB (Linux `/proc/self/status` VmRSS), if known.
pub fn resident_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The summary line of a generation, for stderr.
pub struct Summary(pub Generation);

fn per_second(tokens: usize, time: Duration) -> String {
    if tokens == 0 || time.is_zero() {
        "n/a".to_string()
    } else {
        format!("{:.1}", tokens as f64 / time.as_secs_f64())
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = &self.0;
        let prefilled = g.prompt_tokens - g.reused_tokens;
        write!(f, "prompt tokens: {}", g.prompt_tokens)?;
        if g.reused_tokens > 0 {
            write!(f, " ({} reused from the KV cache)", g.reused_tokens)?;
        }
        write!(
            f,
            " | generated tokens: {} | time to first token: {:.2} ms | \
             prefill: {} tokens/s | decode: {} tokens/s",
            g.generated,
            g.time_to_first_token.as_secs_f64() * 1e3,
            per_second(prefilled, g.prefill),
            per_second(g.decode_steps, g.decode),
        )?;
        if let Some(draft) = &g.draft {
            write!(
                f,
                " | draft acceptance: {} ({} of {} proposed, {} rounds)",
                draft
                    .acceptance_rate()
                    .map_or("n/a".to_string(), |r| format!("{:.1}%", r * 100.0)),
                draft.accepted,
                draft.proposed,
                draft.rounds,
            )?;
        }
        if let Some(rss) = resident_mib() {
            write!(f, " | resident memory: {rss:.0} MiB")?;
        }
        Ok(())
    }
}

/// A seed from the clock, for runs without `--seed`.
pub fn clock_seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// What to generate from.
pub enum Prompt<'a> {
    /// A text, encoded with BOS ([`Session::generate`]).
    Text(&'a str),
    /// Token ids from position 0, decoded as the start of a text when `at_start`
    /// ([`Session::generate_tokens`]).
    Tokens {
        /// The ids.
        ids: Vec<u32>,
        /// Decode the output as the start of a text.
        at_start: bool,
    },
}

/// Generates a continuation of `prompt` with `session` on `exec` and streams it to stdout:
/// the text, or with `print_ids` the token ids, space-separated; then a newline. Stops
/// early, as a callback that breaks does, once `interrupt` (if any) is set (`flm chat`'s
/// Ctrl-C). Returns the counts and the generated ids.
///
/// Errors: those of [`Session::generate`], a closed stdout.
pub fn generate(
    session: &mut Session,
    exec: &Executor,
    prompt: Prompt<'_>,
    params: &GenerateParams,
    print_ids: bool,
    interrupt: Option<&AtomicBool>,
) -> Result<(Generation, Vec<u32>)> {
    let mut out = std::io::stdout().lock();
    let mut written = Ok(());
    let mut first = true;
    let mut ids = Vec::new();
    let on_piece = |piece: Piece<'_>| {
        ids.extend(piece.id);
        let result = match (print_ids, piece.id) {
            (true, Some(id)) => write!(out, "{}{id}", if first { "" } else { " " }),
            (true, None) => Ok(()),
            (false, _) => out.write_all(piece.text.as_bytes()),
        };
        first = false;
        written = result.and_then(|()| out.flush());
        let interrupted = interrupt.is_some_and(|i| i.load(Ordering::Relaxed));
        if written.is_ok() && !interrupted {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(())
        }
    };
    let generation = match prompt {
        Prompt::Text(text) => session.generate(exec, text, params, on_piece)?,
        Prompt::Tokens { ids, at_start } => {
            session.generate_tokens(exec, ids, at_start, params, on_piece)?
        }
    };
    written?;
    writeln!(out)?;
    if generation.stop == StopReason::ContextFull {
        let context = session.model().config().max_seq_len;
        eprintln!("note: the context of {context} tokens is full");
    }
    Ok((generation, ids))
}
