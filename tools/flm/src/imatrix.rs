//! `flm imatrix`: an importance matrix of a model over a calibration text, as
//! `llama-imatrix` gathers it, in either of its file forms (`flm_models::imatrix`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use flm_devices::CpuDevice;
use flm_models::eval::{self, Method};
use flm_models::imatrix::{self, ImatrixFormat};
use flm_models::session;

use crate::{progress, set_threads};

/// The file form of `--output`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FormatArg {
    /// llama.cpp's GGUF form (`llama-imatrix`'s default).
    Gguf,
    /// llama.cpp's legacy form (`--output-format dat`).
    Dat,
}

#[derive(Args)]
pub struct ImatrixArgs {
    /// Checkpoint: a llama2.c .bin, a Hugging Face directory, a .safetensors file beside
    /// its config.json, a GGUF or a .flm file.
    #[arg(short, long)]
    model: PathBuf,
    /// Tokenizer file; by default the one inside or beside the model.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Worker threads (default: one per core).
    #[arg(short, long)]
    threads: Option<usize>,
    /// The calibration text.
    #[arg(short, long)]
    file: PathBuf,
    /// Where to write the matrix.
    #[arg(short, long)]
    output: PathBuf,
    /// The file form (default: dat for a name ending in .dat, else gguf, as llama-imatrix).
    #[arg(long, value_enum)]
    output_format: Option<FormatArg>,
    /// Tokens per chunk (llama-imatrix's -c; default 512, at most the model's context).
    #[arg(short, long)]
    ctx: Option<usize>,
    /// Run only the first N chunks.
    #[arg(long, value_name = "N")]
    chunks: Option<usize>,
    /// Also gather the classifier's inputs (`output.weight`; not a classifier tied to the
    /// embedding table), as llama-imatrix --process-output.
    #[arg(long)]
    process_output: bool,
}

pub fn run(args: ImatrixArgs) -> Result<()> {
    set_threads(args.threads)?;
    if args.chunks == Some(0) {
        bail!("--chunks must be at least 1");
    }
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let context = args.ctx.unwrap_or(512);
    let (model, tokenizer) =
        session::load_model(&args.model, args.tokenizer.as_deref(), Some(context))
            .with_context(|| format!("cannot load the model {}", args.model.display()))?;
    let ctx = context.min(model.config().max_seq_len);
    let bos = tokenizer.add_bos().then(|| tokenizer.bos_id()).flatten();
    let tokens = tokenizer
        .encode(&text, tokenizer.add_bos())
        .context("cannot encode the text")?;
    let mut windows = eval::windows(&tokens, bos, ctx, Method::LlamaCpp)?;
    windows.truncate(args.chunks.unwrap_or(usize::MAX));
    let format = match args.output_format {
        Some(FormatArg::Gguf) => ImatrixFormat::Gguf,
        Some(FormatArg::Dat) => ImatrixFormat::Dat,
        None => ImatrixFormat::for_path(&args.output),
    };
    eprintln!(
        "{} chunks of {ctx} tokens of {}",
        windows.len(),
        args.file.display()
    );
    let bar = progress::bar(windows.len() as u64, "chunks")?;
    let matrix = imatrix::collect(
        &model,
        CpuDevice::new()?,
        &windows,
        (&args.file.display().to_string(), args.process_output),
        |done, _| bar.set_position(done as u64),
    )?;
    bar.finish_and_clear();
    matrix
        .write(&args.output, format)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    println!(
        "{} entries over {} chunks of {ctx} tokens written to {}",
        matrix.entries.len(),
        matrix.chunk_count,
        args.output.display()
    );
    Ok(())
}
