//! Loading a model and finding its tokenizer.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use flm_models::import;
use flm_models::llama::Llama;
use flm_models::session;
use flm_tokenizer::Tokenizer;

use crate::ModelArgs;

/// Reads a tokenizer file of any supported kind.
pub fn tokenizer_file(path: &Path) -> Result<Tokenizer> {
    Tokenizer::from_file(path)
        .with_context(|| format!("cannot load the tokenizer {}", path.display()))
}

/// The tokenizer that belongs to the checkpoint at `model`.
pub fn tokenizer_beside(model: &Path) -> Result<Tokenizer> {
    let mut ckpt = import::load(model)
        .with_context(|| format!("cannot load the model {}", model.display()))?;
    Ok(ckpt.take_tokenizer(model)?)
}

/// Loads the model (one instance, with its KV cache) and its tokenizer, checking that they
/// agree ([`session::load_model`]).
pub fn model_and_tokenizer(args: &ModelArgs) -> Result<(Llama, Tokenizer)> {
    let (model, tokenizer) =
        session::load_model(&args.model, args.tokenizer.as_deref(), args.context)
            .with_context(|| format!("cannot load the model {}", args.model.display()))?;
    Ok((Llama::with_model(Arc::new(model))?, tokenizer))
}
