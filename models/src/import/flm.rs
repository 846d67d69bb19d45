//! .flm files (see `flm_core::flm_file` and docs/flm-format.md): the configuration and
//! tokenizer from the metadata, every tensor a zero-copy view.

use std::path::Path;

use flm_core::flm_file::FlmFile;
use flm_tokenizer::{Tokenizer, TokenizerSpec};

use super::{Checkpoint, Encoding, Format, SourceTensor};
use crate::tensor_names::TensorName;
use crate::{Error, ModelConfig, Result};

/// Loads a .flm file.
pub(super) fn load(path: &Path) -> Result<Checkpoint> {
    let file = FlmFile::open(path)?;
    let config: ModelConfig = serde_json::from_value(file.config().clone())
        .map_err(|e| Error::format(path, format!("invalid model configuration: {e}")))?;
    config
        .validate()
        .map_err(|e| Error::format(path, e.to_string()))?;
    let tokenizer = file
        .tokenizer()
        .map(|spec| {
            let spec: TokenizerSpec = serde_json::from_value(spec.clone())
                .map_err(|e| Error::format(path, format!("invalid tokenizer: {e}")))?;
            Tokenizer::from_spec(spec)
                .map_err(|e| Error::format(path, format!("invalid tokenizer: {e}")))
        })
        .transpose()?;
    let tensors = file
        .tensors()
        .iter()
        .map(|info| {
            info.name
                .parse::<TensorName>()
                .map_err(|e| Error::format(path, e))?;
            let (map, offset) = file.tensor_bytes(info);
            SourceTensor::new(
                info.name.clone(),
                info.shape.clone(),
                Encoding::Native(info.dtype),
                map,
                offset,
                path,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Checkpoint {
        format: Format::Flm,
        config,
        tensors,
        tokenizer,
        tokenizer_candidates: Vec::new(),
        ignored: Vec::new(),
    })
}
