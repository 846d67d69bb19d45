//! `flm run`'s output: the generation loop of [`Session`] streaming text (or ids) to
//! stdout, and the summary line.

use std::fmt;
use std::io::Write;
use std::ops::ControlFlow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use flm_core::Executor;
use flm_devices::CpuDevice;
use flm_models::session::{GenerateParams, Generation, Session, StopReason};

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
        write!(
            f,
            "prompt tokens: {} | generated tokens: {} | time to first token: {:.2} ms | \
             prefill: {} tokens/s | decode: {} tokens/s",
            g.prompt_tokens,
            g.generated,
            g.time_to_first_token.as_secs_f64() * 1e3,
            per_second(g.prompt_tokens, g.prefill),
            per_second(g.decode_steps, g.decode),
        )?;
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

/// Generates a continuation of `prompt` with `session` and streams it to stdout: the text,
/// or with `print_ids` the token ids, space-separated; then a newline.
///
/// Errors: those of [`Session::generate`], a closed stdout.
pub fn generate(
    session: &mut Session,
    prompt: &str,
    params: &GenerateParams,
    print_ids: bool,
) -> Result<Generation> {
    let exec = Executor::new(vec![Box::new(CpuDevice::new()?)]);
    let mut out = std::io::stdout().lock();
    let mut written = Ok(());
    let mut first = true;
    let generation = session.generate(&exec, prompt, params, |piece| {
        let result = match (print_ids, piece.id) {
            (true, Some(id)) => write!(out, "{}{id}", if first { "" } else { " " }),
            (true, None) => Ok(()),
            (false, _) => out.write_all(piece.text.as_bytes()),
        };
        first = false;
        written = result.and_then(|()| out.flush());
        if written.is_ok() {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(())
        }
    })?;
    written?;
    writeln!(out)?;
    if generation.stop == StopReason::ContextFull {
        let context = session.model().config().max_seq_len;
        eprintln!("note: the context of {context} tokens is full");
    }
    Ok(generation)
}
