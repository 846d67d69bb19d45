//! Conversion of any checkpoint [`import`](crate::import) reads into one .flm file.
//!
//! Matrices (every tensor of two or more dimensions: embedding, projections, classifier)
//! take the requested dtype; vectors (norm gains) stay f32, as FastLLM and llama.cpp keep
//! them. For int4, the [`Recipe::Mixed`] default keeps the tensors that 4 bits hurt most in
//! int8, as llama.cpp's Q4_K_M does with more bits (its `use_more_bits` for `attn_v` and
//! `ffn_down`, and Q6_K for the output layer): the classifier (the embedding table when
//! tied), the key and value projections, and the feed-forward down projection (the same
//! for IQ4_NL, IQ4_XS and MXFP4). With
//! grouped-query attention the K/V projections are small, so the cost is mostly the down
//! projection: about a third of a Llama's matrix weights. [`Recipe::Pure`] puts every
//! matrix in int4, and [`Recipe::Keep`] leaves each in the dtype it loads as (a GGUF's
//! Q4_0/Q4_1 in the int4 dtypes they are repacked to). Tensors are loaded, converted and
//! written one at a time, so the memory held is one converted tensor plus one row of
//! scratch, whatever the model's size. The file gets its name only when complete, so an
//! interrupted conversion leaves nothing behind (see
//! [`flm_core::flm_file::FlmWriter`]). A weight with an input permutation (act-order GPTQ,
//! [`flm_core::Data::input_perm`]) keeps its column order in any dtype, and the
//! permutation is written after it as `<name>.perm` (i32).
//!
//! With an importance matrix ([`convert_with_imatrix`], llama.cpp's `llama-quantize
//! --imatrix`), every quantised matrix that has an entry (by its GGUF name; an expert of a
//! stacked expert tensor by its index) is rounded to minimise the importance-weighted
//! squared error ([`flm_core::Data::to_dtype_weighted`]); the others, and every tensor
//! without the matrix, as before. A weight with an input permutation is not weighted: its
//! columns are not in the order the matrix was gathered in.

use std::path::Path;

use flm_core::flm_file::FlmWriter;
use flm_core::DataType;
use flm_tokenizer::Tokenizer;

use crate::imatrix::ImportanceMatrix;
use crate::import::{Checkpoint, PERM_SUFFIX};
use crate::tensor_names::{canonical_tensors, LayerPart, TensorName};
use crate::{Error, Result};

/// How far a conversion has come, reported after each tensor.
#[derive(Debug, Clone)]
pub struct Progress<'a> {
    /// The tensor just written.
    pub name: &'a str,
    /// Tensors written so far.
    pub tensors_done: usize,
    /// Tensors in all.
    pub tensors_total: usize,
    /// Output bytes written so far.
    pub bytes_done: u64,
    /// Output bytes in all.
    pub bytes_total: u64,
    /// Whether the tensor was rounded with its importance ([`convert_with_imatrix`]).
    pub weighted: bool,
}

/// Which matrices of a 4-bit conversion (int4, IQ4_NL, IQ4_XS, MXFP4) stay int8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    /// Classifier (or tied embedding), K/V projections and FFN down projection in int8.
    Mixed,
    /// Every matrix in the requested dtype.
    Pure,
    /// Every matrix in the dtype it loads as ([`crate::import::Encoding::load_dtype`]),
    /// whatever dtype is requested: f32, f16 and bf16 as stored, a GGUF's Q4_0 and Q4_1 as
    /// the int4 dtypes they are repacked to, its other ggml types as decoded at load.
    Keep,
}

/// The dtype tensor `name` of `shape` takes when the model is converted to `dtype`.
pub fn target_dtype(
    dtype: DataType,
    recipe: Recipe,
    tied: bool,
    name: TensorName,
    shape: &[usize],
) -> DataType {
    // The p-tuning prefix is keys and values, not a matrix that multiplies activations.
    if shape.len() < 2 || name == TensorName::PrefixKv {
        return DataType::F32;
    }
    // The router's rounding would change which experts run (llama.cpp's quantiser leaves
    // `ffn_gate_inp.weight` and `ffn_gate_inp_shexp.weight` unquantised too); it is a few
    // rows, and the shared expert's gate one.
    if matches!(
        name,
        TensorName::Layer(_, LayerPart::Router | LayerPart::SharedExpertGate)
    ) {
        return DataType::F32;
    }
    if is_four_bit(dtype) && recipe == Recipe::Mixed && name.is_sensitive(tied) {
        DataType::I8
    } else {
        dtype
    }
}

/// Whether [`Recipe::Mixed`] keeps the sensitive matrices of a conversion to `dtype` in
/// int8: the int4 dtypes, IQ4_NL, IQ4_XS and MXFP4.
fn is_four_bit(dtype: DataType) -> bool {
    dtype.group_size().is_some()
        || matches!(dtype, DataType::IQ4NL | DataType::IQ4XS | DataType::MXFP4)
}

/// Writes `ckpt` with its `tokenizer` to `output` as a .flm file, matrices in `dtype`
/// (4-bit dtypes following `recipe`; with [`Recipe::Keep`], each in the dtype it loads as). `progress` is called after each tensor.
///
/// Errors: a tensor missing from the checkpoint or of the wrong shape, a read or write
/// error (the destination is then untouched).
pub fn convert(
    ckpt: &Checkpoint,
    tokenizer: &Tokenizer,
    output: &Path,
    dtype: DataType,
    recipe: Recipe,
    progress: impl FnMut(&Progress<'_>),
) -> Result<()> {
    convert_with_imatrix(ckpt, tokenizer, output, (dtype, recipe), None, progress)
}

/// [`convert`], with the quantised matrices that `imatrix` has an entry for rounded with
/// their importance (see the module docs).
///
/// Errors: those of [`convert`], and [`Error::Config`] for an entry whose columns are not
/// its weight's.
pub fn convert_with_imatrix(
    ckpt: &Checkpoint,
    tokenizer: &Tokenizer,
    output: &Path,
    (dtype, recipe): (DataType, Recipe),
    imatrix: Option<&ImportanceMatrix>,
    mut progress: impl FnMut(&Progress<'_>),
) -> Result<()> {
    let canonical = canonical_tensors(&ckpt.config);
    let index = ckpt.sources();
    let sources = canonical
        .iter()
        .map(|(name, shape)| index.get(*name, shape))
        .collect::<Result<Vec<_>>>()?;
    let mut plan: Vec<(String, DataType, Vec<usize>)> = Vec::with_capacity(canonical.len());
    for (&(name, ref shape), source) in canonical.iter().zip(&sources) {
        let tied = ckpt.config.tie_embeddings;
        let dt = match recipe {
            Recipe::Keep => target_dtype(
                source.encoding.load_dtype(),
                Recipe::Pure,
                tied,
                name,
                shape,
            ),
            _ => target_dtype(dtype, recipe, tied, name, shape),
        };
        plan.push((name.to_string(), dt, shape.clone()));
        // The permutation follows its weight, as the reader expects (`<name>.perm`).
        if source.has_input_perm() {
            let cols = shape.last().copied().unwrap_or(0);
            plan.push((format!("{name}{PERM_SUFFIX}"), DataType::I32, vec![cols]));
        }
    }
    let config = serde_json::to_value(&ckpt.config)
        .map_err(|e| Error::Config(format!("configuration does not serialise: {e}")))?;
    let spec = serde_json::to_value(tokenizer.spec())
        .map_err(|e| Error::Config(format!("tokenizer does not serialise: {e}")))?;
    let mut writer = FlmWriter::create(output, config, Some(spec), &plan)?;
    let bytes_total: u64 = plan
        .iter()
        .map(|(_, dt, shape)| dt.byte_len(shape).unwrap_or(0) as u64)
        .sum();
    let mut bytes_done = 0;
    let mut planned = plan.iter().enumerate();
    for (source, &(canonical_name, _)) in sources.into_iter().zip(&canonical) {
        let data = source.load()?;
        let mismatch = || Error::Config("the tensors loaded disagree with the plan".into());
        let (i, (name, dt, shape)) = planned.next().ok_or_else(mismatch)?;
        let importance = match imatrix {
            Some(m) if dt.is_quantized() && data.input_perm().is_none() => {
                importance_of(m, canonical_name, data.cols())?
            }
            _ => None,
        };
        if let Some(importance) = &importance {
            writer.write_tensor(&data.to_dtype_weighted(*dt, importance)?)?;
        } else if data.dtype() == *dt {
            writer.write_tensor(&data)?;
        } else {
            writer.write_tensor(&data.to_dtype(*dt)?)?;
        }
        bytes_done += dt.byte_len(shape).unwrap_or(0) as u64;
        let mut last = (i, name);
        if let Some(perm) = data.input_perm() {
            let (i, (name, dt, shape)) = planned.next().ok_or_else(mismatch)?;
            writer.write_tensor(perm)?;
            bytes_done += dt.byte_len(shape).unwrap_or(0) as u64;
            last = (i, name);
        }
        drop(data);
        source.release();
        progress(&Progress {
            name: last.1,
            tensors_done: last.0 + 1,
            tensors_total: plan.len(),
            bytes_done,
            bytes_total,
            weighted: importance.is_some(),
        });
    }
    writer.finish()?;
    Ok(())
}

/// The importance of the input columns of the weight `name` in `m`: its entry by GGUF name,
/// or an expert's matrix of its stacked expert tensor's entry.
///
/// Errors: [`Error::Config`] for an entry of another column count.
fn importance_of(m: &ImportanceMatrix, name: TensorName, cols: usize) -> Result<Option<Vec<f32>>> {
    if let Some(v) = name
        .gguf()
        .map(|g| m.importance(&g, 0, cols))
        .transpose()?
        .flatten()
    {
        return Ok(Some(v));
    }
    match name.gguf_stacked() {
        Some((stacked, expert)) => m.importance(&stacked, expert, cols),
        None => Ok(None),
    }
}
