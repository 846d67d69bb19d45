//! gpt-oss's stacked experts in Hugging Face checkpoints (transformers' `GptOssExperts`),
//! split into flm's canonical per-expert tensors.
//!
//! transformers stores each layer's experts as four stacked tensors, applied as `x @ W`
//! (not transposed as `nn.Linear` weights are):
//!
//! - `mlp.experts.gate_up_proj` `[E, dim, 2·inner]` with gate and up interleaved on the last
//!   axis (column `2j` is gate `j`, `2j + 1` is up `j`), and `gate_up_proj_bias`
//!   `[E, 2·inner]`, interleaved too;
//! - `mlp.experts.down_proj` `[E, inner, dim]` and `down_proj_bias` `[E, dim]`.
//!
//! Expert `e`'s gate becomes `[inner, dim]` (the even columns of its block, transposed), its
//! up the odd ones, its down `[dim, inner]`; each is read from its own block of the stacked
//! tensor on load, in the stored dtype, and the biases in f32.
//!
//! The released checkpoints (openai/gpt-oss-20b, -120b; `quantization_config.quant_method`
//! "mxfp4") store the two matrices in MXFP4 instead, as the U8 tensors `gate_up_proj_blocks`
//! `[E, 2·inner, dim/32, 16]` and `gate_up_proj_scales` `[E, 2·inner, dim/32]`, and
//! `down_proj_blocks` `[E, dim, inner/32, 16]`, `down_proj_scales` `[E, dim, inner/32]`:
//! already `[out, in]` as `nn.Linear` orders them (transformers' `_convert_moe_packed_tensors`
//! transposes after decoding), gate and up interleaved on the `out` axis (row `2j` gate `j`).
//! Each block of 32 input values has a scale byte `s` (E8M0) and 16 bytes of E2M1 codes,
//! byte `i` holding value `2i` in its low nibble and `2i + 1` in its high one; value =
//! `FP4_VALUES[code] · 2^(s − 127)` (transformers' `integrations/mxfp4.py`). ggml's
//! `block_mxfp4` ([`DataType::MXFP4`]) has the same codes and the same exponent byte (its
//! levels are the E2M1 values doubled, its scale `2^(e − 128)`), with byte `i` holding values
//! `i` and `i + 16`; so each expert's matrix is repacked into it on load by moving nibbles,
//! losslessly, with no float round trip (the same move as llama.cpp's `GptOssModel.repack_mxfp4`).

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use flm_core::{Data, DataType};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use super::source::{Assemble, SourceTensor};
use super::{map_file, pytorch};
use crate::tensor_names::{LayerPart, TensorName};
use crate::{Error, ModelConfig, Result};

/// Which slice of a stacked expert tensor an [`ExpertSlice`] reads.
#[derive(Debug, Clone, Copy)]
enum Slice {
    /// Every other column from `first` (0: gate, 1: up) of `[dim, 2·inner]`, transposed.
    GateUp { first: usize },
    /// `[inner, dim]` transposed.
    Down,
    /// Every other value from `first` of `[2·inner]`.
    GateUpBias { first: usize },
    /// `[dim]` as it is.
    DownBias,
}
/// One expert's tensor, read from its block of a stacked tensor.
#[derive(Debug)]
struct ExpertSlice {
    /// The expert's block `[1, ...]` of the stacked tensor.
    block: SourceTensor,
    slice: Slice,
    /// The loaded dtype: the stored one for a matrix, f32 for a bias.
    dtype: DataType,
}

impl Assemble for ExpertSlice {
    fn load(&self) -> Result<Data> {
        let v = self.block.load()?.to_f32_vec()?;
        let shape = &self.block.shape;
        let (values, out_shape): (Vec<f32>, Vec<usize>) = match self.slice {
            Slice::GateUp { first } => {
                let (dim, wide) = (shape[1], shape[2]);
                let inner = wide / 2;
                let out = (0..inner * dim)
                    .map(|i| v[(i % dim) * wide + 2 * (i / dim) + first])
                    .collect();
                (out, vec![inner, dim])
            }
            Slice::Down => {
                let (inner, dim) = (shape[1], shape[2]);
                let out = (0..dim * inner)
                    .map(|i| v[(i % inner) * dim + i / inner])
                    .collect();
                (out, vec![dim, inner])
            }
            Slice::GateUpBias { first } => {
                let out: Vec<f32> = v.iter().skip(first).step_by(2).copied().collect();
                let len = out.len();
                (out, vec![len])
            }
            Slice::DownBias => {
                let len = v.len();
                (v, vec![len])
            }
        };
        let data = Data::from_f32(&out_shape, &values)?;
        if self.dtype == DataType::F32 {
            Ok(data)
        } else {
            Ok(data.to_dtype(self.dtype)?)
        }
    }

    fn note(&self) -> Option<String> {
        None
    }

    fn release(&self) {
        self.block.release();
    }

    fn permuted(&self) -> bool {
        false
    }
}

/// Values per MXFP4 block (one scale byte each).
const BLOCK: usize = 32;

/// A U8 tensor of a safetensors file (an MXFP4 `_blocks` or `_scales`), not yet read.
#[derive(Debug)]
struct U8Tensor {
    name: String,
    shape: Vec<usize>,
    map: Arc<Mmap>,
    /// Where its bytes start in `map`; `shape`'s product of them lie inside it.
    offset: usize,
    file: PathBuf,
}

impl U8Tensor {
    /// `len` bytes from `start` of the tensor's bytes, or an error when they lie past its end.
    fn range(&self, start: usize, len: usize) -> Result<&[u8]> {
        let numel: usize = self.shape.iter().product();
        start
            .checked_add(len)
            .filter(|&end| end <= numel)
            .and_then(|end| self.map.get(self.offset + start..self.offset + end))
            .ok_or_else(|| {
                Error::format(
                    &self.file,
                    format!("tensor {}: bytes {start}..+{len} past its end", self.name),
                )
            })
    }

    /// As [`SourceTensor::release`], for `len` bytes from `start` of the tensor.
    fn release(&self, start: usize, len: usize) {
        #[cfg(unix)]
        if self.range(start, len).is_ok() {
            // SAFETY: as in `SourceTensor::release`: `map_file` maps the file read-only and
            // shared, so dropping pages only discards this process's copies, and a later
            // read faults the unchanged bytes back in; the range lies inside the map
            // (checked just above). The advice is best effort, so its result is ignored.
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    self.offset + start,
                    len,
                )
            };
        }
    }
}

/// transformers' MXFP4 expert tensors of a gpt-oss checkpoint: every U8 tensor of its
/// safetensors files whose name ends in `_blocks` or `_scales`, by name. Empty for a
/// checkpoint with unquantised experts.
#[derive(Debug, Default)]
pub(super) struct Mxfp4Parts {
    parts: HashMap<String, Arc<U8Tensor>>,
}

impl Mxfp4Parts {
    /// The MXFP4 parts of the safetensors files among `files` (PyTorch `torch.save` files
    /// are skipped: transformers saves MXFP4 weights as safetensors only).
    ///
    /// Errors: [`Error::Format`] for an unreadable header or a tensor whose bytes do not
    /// fit its shape or the file.
    pub(super) fn read(files: &[PathBuf]) -> Result<Mxfp4Parts> {
        let mut parts = HashMap::new();
        for file in files {
            let map = map_file(file)?;
            if pytorch::is_torch_save(&map) {
                continue;
            }
            let (header_len, metadata) = SafeTensors::read_metadata(&map)
                .map_err(|e| Error::format(file, format!("invalid safetensors file: {e}")))?;
            for (name, info) in metadata.tensors() {
                if info.dtype != Dtype::U8
                    || !(name.ends_with("_blocks") || name.ends_with("_scales"))
                {
                    continue;
                }
                let (start, end) = info.data_offsets;
                let numel = info.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
                let offset = (8 + header_len)
                    .checked_add(start)
                    .filter(|&o| match end.checked_sub(start) {
                        Some(len) => {
                            numel == Some(len) && o.checked_add(len).is_some_and(|e| e <= map.len())
                        }
                        None => false,
                    })
                    .ok_or_else(|| {
                        let msg = format!(
                            "tensor {name}: its byte range does not fit its shape or the file"
                        );
                        Error::format(file, msg)
                    })?;
                let bytes = U8Tensor {
                    name: name.clone(),
                    shape: info.shape.clone(),
                    map: Arc::clone(&map),
                    offset,
                    file: file.clone(),
                };
                parts.insert(name, Arc::new(bytes));
            }
        }
        Ok(Mxfp4Parts { parts })
    }

    /// Whether `name` is one of these parts (so not a tensor of flm's usual dtypes).
    pub(super) fn consumes(&self, name: &str) -> bool {
        self.parts.contains_key(name)
    }

    /// The names of the parts [`split`] did not use, sorted.
    pub(super) fn unused(self) -> Vec<String> {
        let mut names: Vec<String> = self.parts.into_keys().collect();
        names.sort();
        names
    }
}

/// One expert's matrix `[rows, cols]` from transformers' stacked MXFP4 `_blocks`
/// `[E, out, cols/32, 16]` and `_scales` `[E, out, cols/32]`: the expert's rows `first`,
/// `first + step`, ... of `out`, as ggml's `block_mxfp4` rows ([`DataType::MXFP4`]).
#[derive(Debug)]
struct Mxfp4Expert {
    blocks: Arc<U8Tensor>,
    scales: Arc<U8Tensor>,
    expert: usize,
    first: usize,
    step: usize,
    rows: usize,
    cols: usize,
}

impl Mxfp4Expert {
    /// The expert's range of the scales (one byte a block); its blocks' range is 16 times
    /// that.
    fn scale_range(&self) -> Range<usize> {
        let out = self.blocks.shape[1];
        let per_expert = out * (self.cols / BLOCK);
        self.expert * per_expert..(self.expert + 1) * per_expert
    }
}

impl Assemble for Mxfp4Expert {
    fn load(&self) -> Result<Data> {
        let groups = self.cols / BLOCK;
        let range = self.scale_range();
        let scales = self.scales.range(range.start, range.len())?;
        let blocks = self.blocks.range(16 * range.start, 16 * range.len())?;
        let mut out = Vec::with_capacity(self.rows * groups * 17);
        for r in 0..self.rows {
            let row = (self.first + r * self.step) * groups;
            for g in row..row + groups {
                out.push(scales[g]);
                out.extend_from_slice(&ggml_nibbles(&blocks[16 * g..16 * g + 16]));
            }
        }
        Ok(Data::from_bytes(
            DataType::MXFP4,
            &[self.rows, self.cols],
            &out,
        )?)
    }

    fn note(&self) -> Option<String> {
        None
    }

    fn release(&self) {
        let range = self.scale_range();
        self.scales.release(range.start, range.len());
        self.blocks.release(16 * range.start, 16 * range.len());
    }

    fn permuted(&self) -> bool {
        false
    }
}

/// The 16 code bytes of one MXFP4 block in transformers' order (byte `i`: value `2i` low,
/// `2i + 1` high) in ggml's (byte `i`: value `i` low, `i + 16` high).
fn ggml_nibbles(hf: &[u8]) -> [u8; 16] {
    let code = |j: usize| (hf[j / 2] >> (4 * (j % 2))) & 0x0F;
    std::array::from_fn(|i| code(i) | code(i + 16) << 4)
}

/// The canonical tensors of every expert of `c`'s layers, from the stacked tensors of
/// `by_name` and, for matrices stored in MXFP4, of `mxfp4` (both removed from them); none
/// for a model without expert biases.
///
/// Errors: [`Error::Config`] for a missing stacked tensor (an MXFP4 one without its
/// blocks or scales) or one of another shape than `c`'s experts.
pub(super) fn split(
    c: &ModelConfig,
    by_name: &mut HashMap<String, SourceTensor>,
    mxfp4: &mut Mxfp4Parts,
) -> Result<HashMap<TensorName, SourceTensor>> {
    let mut out = HashMap::new();
    let Some(m) = c.moe.as_ref().filter(|m| m.expert_biases) else {
        return Ok(out);
    };
    let (n, dim, inner) = (m.n_experts, c.dim, m.expert_dim);
    for l in 0..c.n_layers {
        let full = |name: &str| format!("model.layers.{l}.mlp.experts.{name}");
        // Each matrix: as stored (f32, f16, bf16) or in MXFP4, with its rows `[out, in]`.
        let matrices = [
            (
                "gate_up_proj",
                [n, dim, 2 * inner],
                [2 * inner, dim],
                [
                    (LayerPart::WGate, Slice::GateUp { first: 0 }),
                    (LayerPart::WUp, Slice::GateUp { first: 1 }),
                ]
                .to_vec(),
            ),
            (
                "down_proj",
                [n, inner, dim],
                [dim, inner],
                [(LayerPart::WDown, Slice::Down)].to_vec(),
            ),
        ];
        for (name, shape, [rows, cols], slices) in matrices {
            let name = full(name);
            if let Some(stacked) = by_name.remove(&name) {
                check_shape(&stacked.name, &stacked.shape, &shape)?;
                expert_slices(&stacked, n, inner, dim, l, &slices, &mut out)?;
                continue;
            }
            let (blocks, scales) = mxfp4_parts(mxfp4, &name, [n, rows, cols])?;
            for (part, slice) in slices {
                let (first, step) = match slice {
                    Slice::GateUp { first } => (first, 2),
                    _ => (0, 1),
                };
                for e in 0..n {
                    let expert = Mxfp4Expert {
                        blocks: Arc::clone(&blocks),
                        scales: Arc::clone(&scales),
                        expert: e,
                        first,
                        step,
                        rows: rows / step,
                        cols,
                    };
                    let canonical = TensorName::Expert(l, e, part);
                    let t = SourceTensor::assembled(
                        canonical.to_string(),
                        vec![rows / step, cols],
                        DataType::MXFP4,
                        &blocks.file,
                        Arc::new(expert),
                    );
                    out.insert(canonical, t);
                }
            }
        }
        let biases = [
            (
                "gate_up_proj_bias",
                [n, 2 * inner],
                [
                    (LayerPart::BGate, Slice::GateUpBias { first: 0 }),
                    (LayerPart::BUp, Slice::GateUpBias { first: 1 }),
                ]
                .to_vec(),
            ),
            (
                "down_proj_bias",
                [n, dim],
                [(LayerPart::BDown, Slice::DownBias)].to_vec(),
            ),
        ];
        for (name, shape, slices) in biases {
            let name = full(name);
            let stacked = by_name
                .remove(&name)
                .ok_or_else(|| Error::Config(format!("gpt_oss checkpoint without {name}")))?;
            check_shape(&stacked.name, &stacked.shape, &shape)?;
            expert_slices(&stacked, n, inner, dim, l, &slices, &mut out)?;
        }
    }
    Ok(out)
}

/// Errors: [`Error::Config`] unless the tensor `name` has `shape` `want`.
fn check_shape(name: &str, shape: &[usize], want: &[usize]) -> Result<()> {
    if shape != want {
        return Err(Error::Config(format!(
            "{name} has shape {shape:?}, the configuration implies {want:?}"
        )));
    }
    Ok(())
}

/// Every expert's `slices` of the stacked tensor `stacked` of layer `l`, into `out`.
fn expert_slices(
    stacked: &SourceTensor,
    n: usize,
    inner: usize,
    dim: usize,
    l: usize,
    slices: &[(LayerPart, Slice)],
    out: &mut HashMap<TensorName, SourceTensor>,
) -> Result<()> {
    for e in 0..n {
        let expert = e..e + 1;
        let block = stacked.rows(format!("{}.{e}", stacked.name), vec![expert])?;
        for &(part, slice) in slices {
            let name = TensorName::Expert(l, e, part);
            let (shape, dtype) = match slice {
                Slice::GateUp { .. } => (vec![inner, dim], stacked.encoding.load_dtype()),
                Slice::Down => (vec![dim, inner], stacked.encoding.load_dtype()),
                Slice::GateUpBias { .. } => (vec![inner], DataType::F32),
                Slice::DownBias => (vec![dim], DataType::F32),
            };
            let t = SourceTensor::assembled(
                name.to_string(),
                shape,
                dtype,
                stacked.file(),
                Arc::new(ExpertSlice {
                    block: block.clone(),
                    slice,
                    dtype,
                }),
            );
            out.insert(name, t);
        }
    }
    Ok(())
}

/// The `_blocks` `[n, rows, cols/32, 16]` and `_scales` `[n, rows, cols/32]` of the
/// stacked matrix `name` in MXFP4, removed from `mxfp4`.
///
/// Errors: [`Error::Config`] when the checkpoint has neither `name` nor its blocks, only
/// one of blocks and scales, or either of another shape; or when `cols` is not a whole
/// number of 32-value blocks.
fn mxfp4_parts(
    mxfp4: &mut Mxfp4Parts,
    name: &str,
    [n, rows, cols]: [usize; 3],
) -> Result<(Arc<U8Tensor>, Arc<U8Tensor>)> {
    let (blocks_name, scales_name) = (format!("{name}_blocks"), format!("{name}_scales"));
    let (blocks, scales) = match (
        mxfp4.parts.remove(&blocks_name),
        mxfp4.parts.remove(&scales_name),
    ) {
        (Some(b), Some(s)) => (b, s),
        (None, None) => {
            return Err(Error::Config(format!(
                "gpt_oss checkpoint without {name} (or {blocks_name} and {scales_name})"
            )))
        }
        (Some(_), None) => {
            return Err(Error::Config(format!(
                "{blocks_name} without {scales_name}"
            )))
        }
        (None, Some(_)) => {
            return Err(Error::Config(format!(
                "{scales_name} without {blocks_name}"
            )))
        }
    };
    if cols % BLOCK != 0 {
        return Err(Error::Config(format!(
            "{blocks_name}: rows of {cols} values are not whole MXFP4 blocks of {BLOCK}"
        )));
    }
    check_shape(&blocks.name, &blocks.shape, &[n, rows, cols / BLOCK, 16])?;
    check_shape(&scales.name, &scales.shape, &[n, rows, cols / BLOCK])?;
    Ok((blocks, scales))
}
