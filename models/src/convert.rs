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
//! projection: about a third of a Llama's matrix weights. For the K-quants it is
//! llama.cpp's own `Q4_K_M`/`Q5_K_M` choice, with its fallback to Q5_0 (Q8_0 from Q6_K)
//! for rows that are not whole 256-value super-blocks, such as SmolLM2's 576 columns.
//! [`Recipe::Pure`] puts every matrix in the requested dtype (K-quant rows padded to whole
//! super-blocks), and [`Recipe::Keep`] leaves each in the dtype it loads as (a GGUF's
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
use crate::{Error, ModelConfig, Result};

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

/// Which matrices of a quantised conversion keep more bits than the requested dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipe {
    /// For the int4 dtypes, IQ4_NL, IQ4_XS and MXFP4: the classifier (or tied embedding),
    /// K/V projections and FFN down projection in int8. For the K-quants: llama.cpp's
    /// `Q4_K_M`/`Q5_K_M` choice (Q6_K for the classifier and some value and down
    /// projections), each matrix whose rows are not whole super-blocks in Q5_0 (Q8_0 for
    /// Q6_K).
    Mixed,
    /// Every matrix in the requested dtype.
    Pure,
    /// Every matrix in the dtype it loads as ([`crate::import::Encoding::load_dtype`]),
    /// whatever dtype is requested: f32, f16 and bf16 as stored, a GGUF's Q4_0 and Q4_1 as
    /// the int4 dtypes they are repacked to, its other ggml types as decoded at load.
    Keep,
}

/// The dtype tensor `name` of `shape` takes when a model of `config` is converted to
/// `dtype`.
pub fn target_dtype(
    dtype: DataType,
    recipe: Recipe,
    config: &ModelConfig,
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
    if recipe != Recipe::Mixed {
        return dtype;
    }
    if dtype.is_k_quant() {
        let cols = shape.last().copied().unwrap_or(0);
        return k_quant_fallback(k_quant_mix(dtype, config, name), cols);
    }
    if is_four_bit(dtype) && name.is_sensitive(config.tie_embeddings) {
        DataType::I8
    } else {
        dtype
    }
}

/// llama.cpp's choice for its `Q4_K_M` and `Q5_K_M` files (`llama_tensor_get_type`): Q6_K
/// for the classifier (the embedding table when tied), and for the value and feed-forward
/// down projections of the layers `use_more_bits` picks (the first and last eighth, and
/// every third between); `dtype` elsewhere. A Q6_K conversion is Q6_K throughout.
fn k_quant_mix(dtype: DataType, config: &ModelConfig, name: TensorName) -> DataType {
    let more_bits = |i: usize| {
        let n = config.n_layers;
        i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
    };
    let sensitive = match name {
        TensorName::Classifier => true,
        TensorName::Embedding => config.tie_embeddings,
        TensorName::Layer(i, LayerPart::Wv | LayerPart::WDown) => more_bits(i),
        _ => false,
    };
    if sensitive {
        DataType::Q6K
    } else {
        dtype
    }
}

/// The dtype a K-quant choice takes for rows of `cols` values: itself where they are whole
/// 256-value super-blocks, else llama.cpp's fallback at about the same bits (Q4_K and Q5_K
/// to Q5_0, Q6_K to Q8_0) instead of padding every row to the next super-block (576
/// columns would cost 768). llama.cpp falls back from Q5_K to Q5_1, which flm does not hold.
fn k_quant_fallback(dtype: DataType, cols: usize) -> DataType {
    if cols.is_multiple_of(flm_core::ggml::QK_K) {
        return dtype;
    }
    match dtype {
        DataType::Q6K => DataType::Q8_0,
        _ => DataType::Q5_0,
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
        let dt = match recipe {
            Recipe::Keep => target_dtype(
                source.encoding.load_dtype(),
                Recipe::Pure,
                &ckpt.config,
                name,
                shape,
            ),
            _ => target_dtype(dtype, recipe, &ckpt.config, name, shape),
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
