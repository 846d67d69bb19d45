//! Loading a model and finding its tokenizer.

use std::path::Path;

use anyhow::{ensure, Context, Result};
use flm_models::llama::LlamaWeights;
use flm_models::{import, session, Arch, Model, SharedModel};
use flm_tokenizer::Tokenizer;

use crate::device::Chosen;
use crate::split::{self, Part};
use crate::ModelArgs;

/// Reads a tokenizer file of any supported kind (with the `tokenizer_config.json` beside
/// it, if any), or the tokenizer in a GGUF file's metadata.
pub fn tokenizer_file(path: &Path) -> Result<Tokenizer> {
    import::load_tokenizer_file(path)
        .with_context(|| format!("cannot load the tokenizer {}", path.display()))
}

/// The tokenizer that belongs to the checkpoint at `model`.
pub fn tokenizer_beside(model: &Path) -> Result<Tokenizer> {
    let mut ckpt = import::load(model)
        .with_context(|| format!("cannot load the model {}", model.display()))?;
    Ok(ckpt.take_tokenizer(model)?)
}

/// The number of weights of the checkpoint at `model` (its header only).
pub fn weights(model: &Path) -> Result<u64> {
    let ckpt = import::load(model)
        .with_context(|| format!("cannot load the model {}", model.display()))?;
    Ok(ckpt.parameter_count())
}

/// Loads the model (one instance, with its KV cache) and its tokenizer ([`shared_model`]).
/// `None` on a rank other than 0 of an MPI job, once it has served every call of rank 0.
pub fn model_and_tokenizer(
    args: &ModelArgs,
    chosen: &Chosen,
) -> Result<Option<(Model, Tokenizer)>> {
    shared_model(args, chosen)?
        .map(|(model, tokenizer)| Ok((model.instance()?, tokenizer)))
        .transpose()
}

/// Loads the model and its tokenizer, checking that they agree ([`session::load_model`]),
/// with its layers where `--gpu-layers` puts them, or split among `--tp` ranks or the
/// ranks of an MPI job ([`split::split`]). `None` on a rank other than 0 of an MPI job,
/// once it has served every call of rank 0.
pub fn shared_model(args: &ModelArgs, chosen: &Chosen) -> Result<Option<(SharedModel, Tokenizer)>> {
    if split::wanted(args.tp)? {
        let (ckpt, tokenizer) =
            session::load_checkpoint(&args.model, args.tokenizer.as_deref(), args.context)
                .with_context(|| format!("cannot load the model {}", args.model.display()))?;
        ensure!(
            ckpt.config.arch == Arch::Llama,
            "tensor parallelism splits Llama-graph models, and this is ChatGLM-6B"
        );
        let weights = LlamaWeights::load(&ckpt)?;
        let threads = args.threads.unwrap_or_else(rayon::current_num_threads);
        return Ok(
            match split::split(&ckpt.config, &weights, args.tp, threads, chosen)? {
                Part::Rank0(model) => Some((model, tokenizer)),
                Part::Served => None,
                Part::Whole => Some((chosen.place(SharedModel::new(&ckpt)?)?, tokenizer)),
            },
        );
    }
    let (model, tokenizer) =
        session::load_model(&args.model, args.tokenizer.as_deref(), args.context)
            .with_context(|| format!("cannot load the model {}", args.model.display()))?;
    Ok(Some((chosen.place(model)?, tokenizer)))
}
