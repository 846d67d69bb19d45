//! Loading a model and finding its tokenizer.

use std::path::Path;

use anyhow::{bail, Context, Result};
use flm_models::import::{self, Checkpoint};
use flm_models::Model;
use flm_tokenizer::Tokenizer;

use crate::ModelArgs;

/// Default context length when `--context` is not given: enough for chat and long
/// prompts, without allocating the KV cache of a 128k-context model.
const DEFAULT_CONTEXT: usize = 4096;

/// Reads a tokenizer file of any supported kind (with the `tokenizer_config.json` beside
/// it, if any).
pub fn tokenizer_file(path: &Path) -> Result<Tokenizer> {
    Tokenizer::from_file_with_hf_config(path)
        .with_context(|| format!("cannot load the tokenizer {}", path.display()))
}

fn checkpoint(path: &Path) -> Result<Checkpoint> {
    import::load(path).with_context(|| format!("cannot load the model {}", path.display()))
}

/// The tokenizer that belongs to the checkpoint at `model`.
pub fn tokenizer_beside(model: &Path) -> Result<Tokenizer> {
    Ok(checkpoint(model)?.take_tokenizer(model)?)
}

/// Fails unless every token id of `tokenizer` is inside the model's vocabulary.
pub fn check_vocab(tokenizer: &Tokenizer, model_vocab: usize) -> Result<()> {
    if tokenizer.vocab_size() > model_vocab {
        bail!(
            "the tokenizer has {} tokens but the model's vocabulary has {model_vocab}: they do \
             not belong together",
            tokenizer.vocab_size(),
        );
    }
    Ok(())
}

/// Loads the model and its tokenizer and checks that they agree.
pub fn model_and_tokenizer(args: &ModelArgs) -> Result<(Model, Tokenizer)> {
    let mut ckpt = checkpoint(&args.model)?;
    let tokenizer = match &args.tokenizer {
        Some(path) => tokenizer_file(path)?,
        None => ckpt.take_tokenizer(&args.model)?,
    };
    check_vocab(&tokenizer, ckpt.config.vocab_size)?;
    let positions = args.context.unwrap_or(DEFAULT_CONTEXT);
    if positions == 0 {
        bail!("--context must be at least 1");
    }
    ckpt.config.max_seq_len = ckpt.config.max_seq_len.min(positions);
    let context = || format!("cannot build the model {}", args.model.display());
    let model = ckpt.model().with_context(context)?;
    Ok((model, tokenizer))
}
