//! The generation loop of `flm run` and `flm chat`: prefill the prompt in one pass, then
//! sample and feed one token per decode step, streaming the text (or ids) to stdout.

use std::fmt;
use std::io::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use flm_core::{Executor, Sampler, SamplerConfig};
use flm_devices::CpuDevice;
use flm_models::llama::Logits;
use flm_models::Model;
use flm_tokenizer::Tokenizer;

/// What to generate and how to print it.
pub struct Options {
    /// Stop after this many generated tokens.
    pub max_tokens: usize,
    /// Do not stop at end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Print ids instead of text.
    pub print_ids: bool,
    /// Tokens that end the generation besides the model's EOS (a chat format's).
    pub stop: Vec<u32>,
}

/// Token ids to continue.
pub struct Prompt {
    /// The whole sequence, from position 0.
    pub tokens: Vec<u32>,
    /// How many leading tokens already have their K/V in the model's cache (from the
    /// previous turn of a chat); only the rest is prefilled. Must be below `tokens.len()`.
    pub cached: usize,
    /// Decode the output as the start of a text (drop its dummy-prefix space).
    pub at_start: bool,
}

/// What a generation produced.
pub struct Generation {
    /// Counts and timings.
    pub stats: Stats,
    /// The generated ids (without a final stop token).
    pub generated: Vec<u32>,
    /// The ids whose K/V are in the model's cache now, from position 0.
    pub cached: Vec<u32>,
}

/// Resident memory of this process in MiB (Linux `/proc/self/status` VmRSS), if known.
pub fn resident_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Counts and timings of one generation.
pub struct Stats {
    /// Prompt tokens prefilled (those of a chat's previous turns that were still in the
    /// KV cache are not counted).
    prompt_tokens: usize,
    generated: usize,
    /// From the start of the prefill to the first sampled token.
    time_to_first_token: Duration,
    prefill: Duration,
    /// The decode steps after the first token.
    decode: Duration,
    /// Number of those steps.
    decode_steps: usize,
}

fn per_second(tokens: usize, time: Duration) -> String {
    if tokens == 0 || time.is_zero() {
        "n/a".to_string()
    } else {
        format!("{:.1}", tokens as f64 / time.as_secs_f64())
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "prompt tokens: {} | generated tokens: {} | time to first token: {:.2} ms | \
             prefill: {} tokens/s | decode: {} tokens/s",
            self.prompt_tokens,
            self.generated,
            self.time_to_first_token.as_secs_f64() * 1e3,
            per_second(self.prompt_tokens, self.prefill),
            per_second(self.decode_steps, self.decode),
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

/// Generates a continuation of `prompt` and streams it to stdout.
///
/// Errors: a prompt that does not fit in the context (it must leave room for one token),
/// invalid sampling parameters, model errors, a closed stdout.
pub fn generate(
    model: &mut Model,
    tokenizer: &Tokenizer,
    prompt: &str,
    sampler: SamplerConfig,
    options: &Options,
) -> Result<Stats> {
    let tokens = tokenizer
        .encode(prompt, true)
        .context("cannot encode the prompt")?;
    if tokens.is_empty() {
        bail!("the prompt is empty and the tokenizer has no begin-of-sequence token");
    }
    let at_start = tokens == tokenizer.prefix();
    let prompt = Prompt {
        tokens,
        cached: 0,
        at_start,
    };
    Ok(generate_ids(model, tokenizer, prompt, sampler, options)?.stats)
}

/// Continues `prompt` (ids), streaming the generated text (or ids) to stdout.
///
/// Errors: as [`generate`].
pub fn generate_ids(
    model: &mut Model,
    tokenizer: &Tokenizer,
    prompt: Prompt,
    sampler: SamplerConfig,
    options: &Options,
) -> Result<Generation> {
    let exec = Executor::new(vec![Box::new(CpuDevice::new()?)]);
    let mut sampler = Sampler::new(sampler)?;
    let Prompt {
        mut tokens,
        cached,
        at_start,
    } = prompt;
    if cached >= tokens.len() {
        bail!(
            "nothing to prefill: {cached} of {} tokens are cached",
            tokens.len()
        );
    }
    let context = model.config().max_seq_len;
    if tokens.len() >= context {
        bail!(
            "the prompt is {} tokens long but the model's context holds {context} tokens \
             (including at least one to generate): shorten the prompt",
            tokens.len()
        );
    }
    let mut eos = model.config().eos_token_ids.clone();
    eos.extend(tokenizer.eos_id());
    eos.extend(&options.stop);
    let prompt_tokens = tokens.len();
    let mut decoder = tokenizer.stream_decoder(at_start);
    let mut out = std::io::stdout().lock();

    let start = Instant::now();
    let mut logits = model.forward(&exec, &tokens[cached..], cached, Logits::Last)?;
    let mut in_cache = tokens.len();
    let prefill = start.elapsed();
    let mut time_to_first_token = prefill;
    let mut decode = Duration::ZERO;
    let mut decode_steps = 0;
    let mut generated = 0;
    while generated < options.max_tokens {
        let next = sampler.sample(logits, &tokens)?;
        if generated == 0 {
            time_to_first_token = start.elapsed();
        }
        if !options.ignore_eos && eos.contains(&next) {
            break;
        }
        generated += 1;
        tokens.push(next);
        if options.print_ids {
            let sep = if generated == 1 { "" } else { " " };
            write!(out, "{sep}{next}")?;
        } else {
            out.write_all(decoder.push(next)?.as_bytes())?;
        }
        out.flush()?;
        if generated == options.max_tokens {
            break;
        }
        if tokens.len() >= context {
            eprintln!("note: the context of {context} tokens is full");
            break;
        }
        let step = Instant::now();
        logits = model.forward(&exec, &[next], tokens.len() - 1, Logits::Last)?;
        in_cache = tokens.len();
        decode += step.elapsed();
        decode_steps += 1;
    }
    if !options.print_ids {
        out.write_all(decoder.finish().as_bytes())?;
    }
    writeln!(out)?;
    let stats = Stats {
        prompt_tokens: prompt_tokens - cached,
        generated,
        time_to_first_token,
        prefill,
        decode,
        decode_steps,
    };
    let generated = tokens[prompt_tokens..].to_vec();
    tokens.truncate(in_cache);
    Ok(Generation {
        stats,
        generated,
        cached: tokens,
    })
}
