//! .flm files (see `flm_core::flm_file` and docs/flm-format.md): the configuration and
//! tokenizer from the metadata, every tensor a zero-copy view. A tensor `<name>.perm` (i32)
//! is the input permutation of tensor `<name>` ([`flm_core::Data::input_perm`]), attached
//! to it on load.

use std::path::Path;

use flm_core::flm_file::FlmFile;
use flm_tokenizer::{Tokenizer, TokenizerSpec};

use super::{Checkpoint, Encoding, Format, SourceTensor};
use crate::tensor_names::TensorName;
use crate::{Error, ModelConfig, Result};

/// The name suffix of an input permutation stored beside its tensor.
pub(crate) const PERM_SUFFIX: &str = ".perm";

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
    let mut tensors = Vec::new();
    let mut perms = Vec::new();
    for info in file.tensors() {
        let (map, offset) = file.tensor_bytes(info);
        let tensor = SourceTensor::new(
            info.name.clone(),
            info.shape.clone(),
            Encoding::Native(info.dtype),
            map,
            offset,
            path,
        )?;
        match info.name.strip_suffix(PERM_SUFFIX) {
            Some(of) => perms.push((of.to_string(), tensor)),
            None => {
                info.name
                    .parse::<TensorName>()
                    .map_err(|e| Error::format(path, e))?;
                tensors.push(tensor);
            }
        }
    }
    for (of, perm) in perms {
        let Some(i) = tensors.iter().position(|t| t.name == of) else {
            return Err(Error::format(
                path,
                format!("{} is the input permutation of no tensor", perm.name),
            ));
        };
        tensors[i] = tensors[i].clone().with_input_perm(perm)?;
    }
    Ok(Checkpoint {
        format: Format::Flm,
        config,
        tensors,
        tokenizer,
        tokenizer_candidates: Vec::new(),
        ignored: Vec::new(),
    })
}
