//! Loading a model and finding its tokenizer.

use std::path::Path;

use anyhow::{Context, Result};
use flm_models::{import, session, Model};
use flm_tokenizer::Tokenizer;

use crate::device::Chosen;
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

/// Loads the model (one instance, with its KV cache) and its tokenizer, checking that they
/// agree ([`session::load_model`]), with its layers where `--gpu-layers` puts them.
pub fn model_and_tokenizer(args: &ModelArgs, chosen: &Chosen) -> Result<(Model, Tokenizer)> {
    let (model, tokenizer) =
        session::load_model(&args.model, args.tokenizer.as_deref(), args.context)
            .with_context(|| format!("cannot load the model {}", args.model.display()))?;
    Ok((chosen.place(model)?.instance()?, tokenizer))
}
