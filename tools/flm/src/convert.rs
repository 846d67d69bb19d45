//! `flm convert`: any supported checkpoint into one .flm file, with a progress bar.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use flm_core::{DataType, Int4Form};
use flm_models::convert::{convert_with_imatrix, Recipe};
use flm_models::imatrix::ImportanceMatrix;
use flm_models::import;

use crate::load;

/// Weight types `flm convert` writes.
#[derive(Clone, Copy, ValueEnum)]
pub enum DtypeArg {
    /// 32-bit float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    Bf16,
    /// int8, one scale per output channel.
    Int8,
    /// int4, an f16 scale and minimum per group (see --group-size).
    Int4,
    /// int4, symmetric: an f16 scale per group and no minimum (ggml's Q4_0 at groups of 32).
    Int4Sym,
    /// int4 with an f16 scale and an integer zero point per group (GPTQ's and AWQ's
    /// asymmetric scheme).
    Int4Zp,
    /// ggml's Q4_K: super-blocks of 256 values, 4.5 bits per weight.
    #[value(name = "q4_k")]
    Q4K,
    /// ggml's Q5_K: super-blocks of 256 values, 5.5 bits per weight.
    #[value(name = "q5_k")]
    Q5K,
    /// ggml's Q6_K: super-blocks of 256 values, 6.56 bits per weight.
    #[value(name = "q6_k")]
    Q6K,
    /// ggml's Q5_0: blocks of 32 values, 5-bit codes and an f16 scale, 5.5 bits per weight.
    #[value(name = "q5_0")]
    Q5_0,
    /// ggml's IQ4_NL: blocks of 32 values, 16 non-linear levels, 4.5 bits per weight.
    #[value(name = "iq4_nl")]
    Iq4Nl,
    /// ggml's IQ4_XS: IQ4_NL's levels with 6-bit scales per 32 values in super-blocks of
    /// 256, 4.25 bits per weight.
    #[value(name = "iq4_xs")]
    Iq4Xs,
    /// MXFP4 (OCP Microscaling): 32 FP4 (E2M1) values under one power-of-two scale, 4.25
    /// bits per weight, rounded as ggml does (gpt-oss's experts).
    Mxfp4,
}

impl DtypeArg {
    /// The dtype, the int4 ones with `group` values per group (`flm convert` and `flm bench`
    /// read `--dtype` through this).
    ///
    /// # Errors
    /// A group size other than 32, 64 or 128 for an int4 dtype.
    pub fn with_group(self, group: usize) -> Result<DataType> {
        let form = match self {
            DtypeArg::F32 => return Ok(DataType::F32),
            DtypeArg::F16 => return Ok(DataType::F16),
            DtypeArg::Bf16 => return Ok(DataType::BF16),
            DtypeArg::Int8 => return Ok(DataType::I8),
            DtypeArg::Q4K => return Ok(DataType::Q4K),
            DtypeArg::Q5K => return Ok(DataType::Q5K),
            DtypeArg::Q6K => return Ok(DataType::Q6K),
            DtypeArg::Q5_0 => return Ok(DataType::Q5_0),
            DtypeArg::Iq4Nl => return Ok(DataType::IQ4NL),
            DtypeArg::Iq4Xs => return Ok(DataType::IQ4XS),
            DtypeArg::Mxfp4 => return Ok(DataType::MXFP4),
            DtypeArg::Int4 => Int4Form::Min,
            DtypeArg::Int4Sym => Int4Form::Symmetric,
            DtypeArg::Int4Zp => Int4Form::ZeroPoint,
        };
        DataType::int4(group, form)
            .with_context(|| format!("--group-size must be 32, 64 or 128, not {group}"))
    }
}

#[derive(Args)]
pub struct ConvertArgs {
    /// The checkpoint to convert (any format `flm run` reads); with --random, a Hugging
    /// Face config.json.
    #[arg(long)]
    input: PathBuf,
    /// Synthesise random weights at the shapes of the config.json given as --input (for
    /// benchmarks and load tests); needs --tokenizer.
    #[arg(long)]
    random: bool,
    /// The .flm file to write (atomically: it gets its name only when complete).
    #[arg(long)]
    output: PathBuf,
    /// Weight type of the matrices; norms stay f32. By default each matrix keeps the type
    /// it loads as: f32/f16/bf16 as stored, a GGUF's Q4_0 and Q4_1 as int4-sym-g32 and
    /// int4-g32 (the same values), its other ggml types as decoded at load.
    #[arg(long, value_enum)]
    dtype: Option<DtypeArg>,
    /// Values per int4 group: 32, 64 or 128.
    #[arg(long)]
    group_size: Option<usize>,
    /// Put every matrix in the --dtype. By default, for int4, int4-sym, int4-zp, iq4_nl,
    /// iq4_xs and mxfp4 the classifier, the K/V projections and the FFN down projection
    /// stay int8; for q4_k and q5_k the classifier and some value and down projections are
    /// q6_k (llama.cpp's Q4_K_M/Q5_K_M choice), and the K-quants put rows that are not
    /// whole 256-value super-blocks in q5_0 (q8_0 for q6_k) where --pure pads them.
    #[arg(long)]
    pure: bool,
    /// Tokenizer file to embed (default: the one inside or beside the input).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// An importance matrix (`flm imatrix`, or llama-imatrix's GGUF or .dat file): each
    /// quantised matrix it has an entry for is rounded to minimise the error weighted by
    /// its input columns' importance, as llama-quantize --imatrix does.
    #[arg(long, value_name = "FILE", requires = "dtype")]
    imatrix: Option<PathBuf>,
}

/// The requested dtype; `None` when none is (each matrix keeps its own).
fn dtype(args: &ConvertArgs) -> Result<Option<DataType>> {
    let Some(requested) = args.dtype else {
        if args.group_size.is_some() || args.pure {
            bail!("--group-size and --pure need --dtype");
        }
        return Ok(None);
    };
    let int4 = matches!(
        requested,
        DtypeArg::Int4 | DtypeArg::Int4Sym | DtypeArg::Int4Zp
    );
    if !int4 && args.group_size.is_some() {
        bail!("--group-size applies to --dtype int4, int4-sym and int4-zp only");
    }
    requested
        .with_group(args.group_size.unwrap_or(32))
        .map(Some)
}

/// Runs `flm convert`.
pub fn run(args: ConvertArgs) -> Result<()> {
    let dtype = dtype(&args)?;
    let mut ckpt = if args.random {
        import::random(&args.input, 0)
    } else {
        import::load(&args.input)
    }
    .with_context(|| format!("cannot load the model {}", args.input.display()))?;
    let tokenizer = match &args.tokenizer {
        Some(path) => load::tokenizer_file(path)?,
        None => ckpt.take_tokenizer(&args.input)?,
    };
    flm_models::session::check_vocab(&tokenizer, ckpt.config.vocab_size)?;
    let bar = crate::progress::bar(0, "tensors")?;
    let recipe = match (dtype, args.pure) {
        (None, _) => Recipe::Keep,
        (Some(_), true) => Recipe::Pure,
        (Some(_), false) => Recipe::Mixed,
    };
    let target = dtype.unwrap_or(DataType::F32);
    let imatrix = args
        .imatrix
        .as_deref()
        .map(|path| {
            ImportanceMatrix::read(path)
                .with_context(|| format!("cannot read the importance matrix {}", path.display()))
        })
        .transpose()?;
    let mut weighted = 0;
    convert_with_imatrix(
        &ckpt,
        &tokenizer,
        &args.output,
        (target, recipe),
        imatrix.as_ref(),
        |p| {
            weighted += usize::from(p.weighted);
            bar.set_length(p.tensors_total as u64);
            bar.set_position(p.tensors_done as u64);
            bar.set_message(format!(
                "{} / {} ({})",
                indicatif::HumanBytes(p.bytes_done),
                indicatif::HumanBytes(p.bytes_total),
                p.name
            ));
        },
    )
    .with_context(|| format!("cannot convert {}", args.input.display()))?;
    bar.finish();
    let size = std::fs::metadata(&args.output)
        .map(|m| m.len())
        .unwrap_or(0);
    let types = dtype.map_or("each matrix's own type".into(), |d| d.to_string());
    if let Some(m) = &imatrix {
        eprintln!(
            "{weighted} matrices rounded with their importance ({} entries in the matrix)",
            m.entries.len()
        );
    }
    eprintln!(
        "wrote {} ({types}, {})",
        args.output.display(),
        indicatif::HumanBytes(size)
    );
    Ok(())
}
