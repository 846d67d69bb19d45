//! `flm`: run, inspect and tokenize models from the command line.
//!
//! Every error is reported on stderr as one `error: …` line with its causes, and the
//! process exits with status 1; nothing the user passes makes it panic.

mod bench;
mod bench_batch;
mod bench_mtp;
mod bench_tp;
mod chat;
mod convert;
mod device;
mod generate;
mod imatrix;
mod load;
mod perplexity;
mod progress;
mod serve;
mod split;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use flm_core::SamplerConfig;
use flm_models::session::{GenerateParams, Session};
use flm_models::speculative::Draft;

/// flm: a portable LLM inference runtime.
#[derive(Parser)]
#[command(name = "flm", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a continuation of a prompt, streamed to stdout.
    Run(RunArgs),
    /// Interactive multi-turn chat in the terminal, with the model's chat template.
    Chat(chat::ChatArgs),
    /// Print the token ids of a text.
    Tokenize(TokenizeArgs),
    /// Convert a checkpoint (with its tokenizer) into one .flm file, optionally quantised.
    Convert(convert::ConvertArgs),
    /// Perplexity of a text file under the model, or its KL divergence from a base model's
    /// saved log-probabilities (llama-perplexity's methods and files).
    Perplexity(perplexity::PerplexityArgs),
    /// Gather an importance matrix over a calibration text (llama-imatrix's statistics and
    /// files), for `flm convert --imatrix`.
    Imatrix(imatrix::ImatrixArgs),
    /// Measures prefill and decode tokens/s (and decode bandwidth), like llama-bench.
    Bench(bench::BenchArgs),
    /// Serve the model over HTTP: OpenAI-compatible API and a chat page.
    Serve(serve::ServeArgs),
}

/// Where the model and its tokenizer are.
#[derive(Args, Clone)]
struct ModelArgs {
    /// Checkpoint: a llama2.c .bin, a Hugging Face directory, a .safetensors file beside
    /// its config.json, a GGUF or a .flm file (the format is detected from the bytes).
    #[arg(short, long)]
    model: PathBuf,
    /// Tokenizer file (SentencePiece .model, HF tokenizer.json, llama2.c tokenizer.bin or
    /// a GGUF file's metadata); by default the one inside or beside the model.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Worker threads (default: one per core); with --tp, shared equally by the ranks.
    #[arg(short, long)]
    threads: Option<usize>,
    /// Context length: positions the KV cache holds (default: the model's, at most 4096;
    /// never more than the model's).
    #[arg(short, long)]
    context: Option<usize>,
    /// Tensor parallelism on this machine: the model's heads and feed-forward rows split
    /// among N ranks, each a group of the threads with its own slice of the weights
    /// (docs/distributed.md). Llama-graph models, on the CPU.
    #[arg(long, default_value_t = 1)]
    tp: usize,
    #[command(flatten)]
    device: device::DeviceArgs,
}

impl ModelArgs {
    /// The executor of `--device` and the rest, for this model (its size picks
    /// `--activation-bits auto`).
    ///
    /// Errors: those of [`device::DeviceArgs::executor`], and a model file that cannot be
    /// read when its size is needed.
    fn executor(&self) -> Result<device::Chosen> {
        self.device.executor(|| load::weights(&self.model))
    }
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt; the continuation, not the prompt, is printed.
    #[arg(short, long)]
    prompt: String,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Print the generated token ids, space-separated, instead of text.
    #[arg(long)]
    ids: bool,
    /// Speculative decoding: a smaller model with the same tokenizer (a quantised copy of
    /// the model, say) drafts tokens that the model verifies in one pass; the output is
    /// distributed as without it (greedy: the same tokens).
    #[arg(long, group = "drafter")]
    draft_model: Option<PathBuf>,
    /// Speculative decoding with the model's own drafter: `mtp`, its multi-token-prediction
    /// layer (DeepSeek-V3, GLM-4.5; in the checkpoint's weights), on the CPU.
    #[arg(long, value_enum, group = "drafter")]
    draft: Option<DraftKind>,
    /// Tokens the draft proposes per verification pass.
    #[arg(long, default_value_t = flm_models::speculative::DEFAULT_DRAFT_TOKENS,
          requires = "drafter")]
    draft_tokens: usize,
}

/// A drafter that comes with the model.
#[derive(Clone, Copy, clap::ValueEnum)]
enum DraftKind {
    /// The multi-token-prediction layers.
    Mtp,
}

/// How tokens are chosen, and when generation stops.
#[derive(Args)]
struct SamplingArgs {
    /// Stop after this many generated tokens.
    #[arg(short = 'n', long, default_value_t = 256)]
    max_tokens: usize,
    /// Softmax temperature; 0 is greedy (argmax).
    #[arg(
        long,
        visible_alias = "temp",
        default_value_t = 0.8,
        allow_negative_numbers = true
    )]
    temperature: f32,
    /// Sample from the K most likely tokens only (0 disables).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Sample from the smallest set of tokens whose probability reaches P (1 disables).
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    top_p: f32,
    /// Repetition penalty over the prompt and the generated tokens (1 disables).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    repeat_penalty: f32,
    /// Random seed; the same seed gives the same sampled text (default: from the clock).
    #[arg(short, long)]
    seed: Option<u64>,
    /// Keep generating after an end-of-sequence token.
    #[arg(long)]
    ignore_eos: bool,
}

impl SamplingArgs {
    /// Checks the values by the sampler's rules ([`SamplerConfig::check`]), so that a bad
    /// one is refused before a model loads.
    fn check(&self) -> Result<()> {
        Ok(self.params(Vec::new()).sampler.check()?)
    }

    /// The generation parameters, with the seed from the clock unless `--seed`, stopping
    /// also at the tokens `stop`.
    fn params(&self, stop: Vec<u32>) -> GenerateParams {
        GenerateParams {
            sampler: SamplerConfig {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                repeat_penalty: self.repeat_penalty,
                seed: self.seed.unwrap_or_else(generate::clock_seed),
                ..SamplerConfig::default()
            },
            max_tokens: self.max_tokens,
            ignore_eos: self.ignore_eos,
            stop,
        }
    }
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["model", "tokenizer"])))]
struct TokenizeArgs {
    /// A checkpoint whose tokenizer is used (see `flm run --model`).
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// A tokenizer file.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// The text to encode.
    #[arg(long)]
    text: String,
    /// Do not prepend the begin-of-sequence token (by default it is prepended where the
    /// tokenizer asks for it: all but GGUF files whose `add_bos_token` is false and
    /// byte-level tokenizer.json files without it in their post-processor).
    #[arg(long)]
    no_bos: bool,
}

fn set_threads(threads: Option<usize>) -> Result<()> {
    if let Some(n) = threads {
        anyhow::ensure!(n > 0, "--threads must be at least 1");
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("cannot start the thread pool")?;
    }
    Ok(())
}

fn run(args: RunArgs) -> Result<()> {
    args.sampling.check()?;
    set_threads(args.model.threads)?;
    let chosen = args.model.executor()?;
    let start = std::time::Instant::now();
    if args.draft_model.is_some() || args.draft.is_some() {
        anyhow::ensure!(
            !split::wanted(args.model.tp)?,
            "speculative decoding does not run on a tensor-parallel model yet"
        );
    }
    let Some((model, tokenizer)) = load::model_and_tokenizer(&args.model, &chosen)? else {
        return Ok(());
    };
    let rss =
        generate::resident_mib().map_or(String::new(), |m| format!(", resident memory {m:.0} MiB"));
    eprintln!(
        "loaded {} in {:.1} ms{rss}",
        args.model.model.display(),
        start.elapsed().as_secs_f64() * 1e3
    );
    let params = args.sampling.params(Vec::new());
    let mut session = Session::new(model, Arc::new(tokenizer))?;
    if let Some(path) = &args.draft_model {
        let draft_args = ModelArgs {
            model: path.clone(),
            ..args.model.clone()
        };
        let (draft, draft_tokenizer) =
            load::model_and_tokenizer(&draft_args, &chosen)?.context("the draft model is whole")?;
        let draft = Draft::new(draft, args.draft_tokens)?;
        session
            .set_draft(draft, Some(&draft_tokenizer))
            .with_context(|| format!("cannot use {} as the draft model", path.display()))?;
        eprintln!(
            "draft model {}, {} tokens per round",
            path.display(),
            args.draft_tokens
        );
    }
    if let Some(DraftKind::Mtp) = args.draft {
        session
            .set_draft(Draft::mtp(args.draft_tokens)?, None)
            .context("cannot draft with the model's multi-token-prediction layers")?;
        eprintln!(
            "draft: the model's multi-token-prediction layer, {} tokens per round",
            args.draft_tokens
        );
    }
    let exec = chosen.exec;
    let prompt = generate::Prompt::Text(&args.prompt);
    let (generation, _) = generate::generate(&mut session, &exec, prompt, &params, args.ids, None)?;
    eprintln!("{}", generate::Summary(generation));
    Ok(())
}

fn tokenize(args: TokenizeArgs) -> Result<()> {
    let tokenizer = match (&args.tokenizer, &args.model) {
        (Some(path), _) => load::tokenizer_file(path)?,
        (None, Some(model)) => load::tokenizer_beside(model)?,
        (None, None) => anyhow::bail!("pass --model or --tokenizer"),
    };
    let ids = tokenizer
        .encode(&args.text, !args.no_bos && tokenizer.add_bos())
        .context("cannot encode the text")?;
    let line: Vec<String> = ids.iter().map(u32::to_string).collect();
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", line.join(" "))?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(args),
        Command::Chat(args) => chat::run(args),
        Command::Tokenize(args) => tokenize(args),
        Command::Convert(args) => convert::run(args),
        Command::Perplexity(args) => perplexity::run(args),
        Command::Imatrix(args) => imatrix::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Serve(args) => serve::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", message(&e));
            ExitCode::FAILURE
        }
    }
}

/// `e` and its causes joined by `: `, as anyhow's `{:#}` prints them, but with a cause left
/// out where the message already ends with it: flm's I/O errors print their OS error after
/// the path, and also give it as their source.
fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.is_empty() {
            out = text;
        } else if !out.ends_with(&text) {
            out = format!("{out}: {text}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap's own check of the command line: no two arguments of a command share a name or
    /// a short flag, every `requires` and group names an argument.
    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
