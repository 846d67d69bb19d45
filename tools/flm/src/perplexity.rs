//! `flm perplexity`: perplexity of a text by llama.cpp's method or the Hugging Face
//! guide's sliding window, and KL divergence from a base model's saved log-probabilities
//! in llama-perplexity's file format (`flm_models::eval`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use flm_models::eval::{self, KlSummary, LogProbReader, LogProbWriter, Method};

use crate::{load, progress, set_threads, ModelArgs};

/// How the text is cut into windows.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MethodArg {
    /// llama-perplexity's: chunks of --ctx tokens, each starting with BOS, the second half
    /// of each scored (the figures on model cards and in llama.cpp's tables).
    LlamaCpp,
    /// The Hugging Face guide's sliding window: a window of --ctx tokens every --stride
    /// tokens, BOS first, scoring the tokens no earlier window scored.
    Sliding,
}

#[derive(Args)]
pub struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text file (not needed with --kl-divergence, whose file holds the text's ids).
    #[arg(short, long, required_unless_present = "kl_divergence")]
    file: Option<PathBuf>,
    /// Tokens per window (default: the model's context, at most 512; with
    /// --kl-divergence, the file's).
    #[arg(long)]
    ctx: Option<usize>,
    /// How the text is cut into windows.
    #[arg(long, value_enum, default_value = "llama-cpp")]
    method: MethodArg,
    /// Tokens between the starts of two windows, with --method sliding (default: half a
    /// window).
    #[arg(long)]
    stride: Option<usize>,
    /// Evaluate only the first N chunks, with --method llama-cpp (llama-perplexity's
    /// --chunks).
    #[arg(long, value_name = "N")]
    chunks: Option<usize>,
    /// Also save the model's log-probabilities at every scored position to FILE, in
    /// llama-perplexity's --kl-divergence-base format (llama.cpp's method only).
    #[arg(long, value_name = "FILE", conflicts_with = "kl_divergence")]
    save_logits: Option<PathBuf>,
    /// Compare the model with the base log-probabilities in FILE (from --save-logits or
    /// llama-perplexity --kl-divergence-base) on the text they hold: KL divergence,
    /// top-token agreement and the perplexity ratio.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["file", "method", "stride", "chunks"])]
    kl_divergence: Option<PathBuf>,
}

pub fn run(args: PerplexityArgs) -> Result<()> {
    set_threads(args.model.threads)?;
    let chosen = args.model.executor()?;
    let Some((mut model, tokenizer)) = load::model_and_tokenizer(&args.model, &chosen)? else {
        return Ok(());
    };
    let bos = tokenizer.add_bos().then(|| tokenizer.bos_id()).flatten();
    let exec = chosen.exec;
    let vocab = model.config().vocab_size;
    if let Some(base) = &args.kl_divergence {
        let mut reader = LogProbReader::open(base)?;
        if args.ctx.is_some_and(|c| c != reader.ctx()) {
            bail!(
                "{} was made with windows of {} tokens: leave out --ctx",
                base.display(),
                reader.ctx()
            );
        }
        let windows = reader.tokens().len() / reader.ctx();
        let bar = progress::bar(windows as u64, "windows")?;
        let summary = eval::kl_divergence(&mut model, &exec, &mut reader, bos, |done, _| {
            bar.set_position(done as u64)
        })
        .with_context(|| format!("KL divergence from {}", base.display()))?;
        bar.finish_and_clear();
        print_kld(&base.display().to_string(), windows, reader.ctx(), &summary);
        return Ok(());
    }
    let Some(file) = &args.file else {
        bail!("give the text with --file");
    };
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let tokens = tokenizer
        .encode(&text, tokenizer.add_bos())
        .context("cannot encode the text")?;
    let ctx = args
        .ctx
        .unwrap_or_else(|| model.config().max_seq_len.min(512));
    let (method, described) = match args.method {
        MethodArg::LlamaCpp => {
            if args.stride.is_some() {
                bail!("--stride is for --method sliding");
            }
            if args.chunks == Some(0) {
                bail!("--chunks must be at least 1");
            }
            (Method::LlamaCpp, format!("llama.cpp's method: chunks of {ctx} tokens, BOS first, the second half of each scored"))
        }
        MethodArg::Sliding => {
            if args.save_logits.is_some() || args.chunks.is_some() {
                bail!("--save-logits and --chunks are for --method llama-cpp");
            }
            let stride = args.stride.unwrap_or(ctx / 2);
            let first = if bos.is_some() { ", BOS first" } else { "" };
            (
                Method::Sliding { stride },
                format!("sliding windows of {ctx} tokens every {stride}{first}"),
            )
        }
    };
    let mut windows = eval::windows(&tokens, bos, ctx, method)?;
    windows.truncate(args.chunks.unwrap_or(usize::MAX));
    let mut writer = match &args.save_logits {
        Some(path) => {
            let whole = windows.len() * ctx;
            Some(LogProbWriter::create(path, ctx, vocab, &tokens[..whole])?)
        }
        None => None,
    };
    let start = std::time::Instant::now();
    // Drawn on stderr when it is a terminal: the running perplexity, window by window.
    let bar = progress::bar(windows.len() as u64, "windows")?;
    let mut result = eval::TeacherForced::default();
    eval::score(
        &mut model,
        &exec,
        &windows,
        &mut result,
        |result, logits, target| {
            result.add(logits, target);
            writer.as_mut().map_or(Ok(()), |w| w.add(logits))
        },
        |result, done, _| {
            bar.set_position(done as u64);
            bar.set_message(format!("perplexity {:.4}", result.perplexity()));
            Ok(())
        },
    )?;
    bar.finish_and_clear();
    if let Some(writer) = writer {
        writer.finish()?;
    }
    let secs = start.elapsed().as_secs_f64();
    let scanned: usize = windows.iter().map(|w| w.tokens.len()).sum();
    println!(
        "perplexity ({described}): PPL = {:.4} +/- {:.5} ({} tokens scored in {} windows, {:.1} tokens/s)",
        result.perplexity(),
        result.standard_error(),
        result.scored,
        windows.len(),
        scanned as f64 / secs
    );
    Ok(())
}

/// Prints the figures as llama-perplexity's final statistics name them.
fn print_kld(base: &str, windows: usize, ctx: usize, s: &KlSummary) {
    println!(
        "KL divergence from {base} ({} positions scored in {windows} chunks of {ctx} tokens, llama.cpp's method):",
        s.count
    );
    // llama-perplexity's labels, padded to its column.
    for (label, figure) in [
        ("Mean PPL(Q)", &s.ppl),
        ("Mean PPL(base)", &s.ppl_base),
        ("Mean PPL(Q)/PPL(base)", &s.ppl_ratio),
        ("Mean    KLD", &s.kld),
    ] {
        println!("{label:<22}: {:10.6} ± {:10.6}", figure.value, figure.error);
    }
    for (label, kld) in [
        ("Median  KLD", s.kld_median),
        ("99.0%   KLD", s.kld_p99),
        ("Maximum KLD", s.kld_max),
    ] {
        println!("{label:<22}: {kld:10.6}");
    }
    println!(
        "Same top p            : {:6.3} ± {:5.3} %",
        100.0 * s.same_top.value,
        100.0 * s.same_top.error
    );
    println!("RMS Δp                : {:6.3} %", 100.0 * s.rms_p_diff);
}
