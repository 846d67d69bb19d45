//! GPTQ and AWQ checkpoints: Hugging Face directories whose linear layers are stored as
//! packed integer codes (`qweight`), zero points (`qzeros`), f16 scales (`scales`) and, for
//! GPTQ, the group of each input channel (`g_idx`), as TGI, vLLM and transformers load them.
//! The layouts are in [`super::gptq`] (AutoGPTQ/GPTQModel) and [`super::awq`] (AutoAWQ
//! GEMM); the scheme comes from `quantization_config` in `config.json`, else from
//! `quantize_config.json` (AutoGPTQ) or `quant_config.json` (AutoAWQ): [`super::quant_config`].
//!
//! Each packed linear becomes one tensor `<prefix>.weight` `[out, in]` whose values are
//! `w = scale · (q − zero)`, the weight the references dequantise, repacked where flm has a
//! dtype that holds those values exactly, and dequantised to f16 otherwise:
//!
//! - **int4-sym** when every zero point is 8 (GPTQ's symmetric schemes): `scale · (q − 8)`
//!   is flm's symmetric int4 with the same codes and scales.
//! - **int4-zp** otherwise (asymmetric: GPTQ's `sym=False`, every AWQ checkpoint): flm's
//!   int4 with an integer zero point per group, the same codes, scales and zero points, and
//!   `d · q + (−d · z)` equals `d · (q − z)` exactly in f32 (every term is an f16 times a
//!   4-bit integer). int4's f16 minimum would round `−d · z`, which needs up to 15
//!   significant bits.
//! - The group size is the largest of flm's (128, 64, 32) such that each run of that many
//!   input channels is in one group of the checkpoint. Without act-order a group of 128 is
//!   one flm group of 128 (or 2 of 64, 4 of 32, with the same scale and zero); per-channel
//!   schemes (`group_size` −1) take groups of 128.
//! - **Act-order** (`desc_act`): `g_idx` puts input channels of one group all over the row,
//!   so no run of 32 channels shares a scale. The weight's columns are permuted into group
//!   order (a stable sort of `g_idx`, as vLLM and ExLlama shuffle them), after which each
//!   group is a run of columns and the tensor repacks as above, exactly; the permutation
//!   rides on the weight ([`flm_core::Data::input_perm`], `<name>.perm` in a `.flm` file)
//!   and every device gathers the activations by it before the product
//!   (`x'[j] = x[perm[j]]`, so `W' x' = W x`). The cost is one gather of `in` values per
//!   input row and distinct permutation (q, k and v share one, as do gate and up), through
//!   cache: about 12 bytes per input channel against the `out / 2` bytes of weights each
//!   channel brings, under 1% of a TinyLlama layer's decode traffic, and below what the
//!   shared machine's noise lets `flm bench` resolve (docs/benchmarks.md). The file grows
//!   by 4 bytes per input channel and linear. Groups that are not runs of 32 channels even
//!   in group order (sizes not a multiple of 32) are dequantised to f16.
//! - 8-bit GPTQ is dequantised to f16 (flm's int8 has one scale per row, not per group).
//!
//! f16 dequantisation rounds the exact product `d · (q − z)` once, which is what the
//! references' own dequantisers compute in f16 (AutoAWQ's `dequantize_gemm`, GPTQModel's
//! `dequantize_weight`), so those values agree bit for bit too. Each kind of dequantised
//! tensor gets one line in [`super::Checkpoint::load_notes`].

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flm_core::quant::{int4_mins, nibble, padded_cols};
use flm_core::{Data, DataType, Int4Form};
use half::f16;
use memmap2::Mmap;
use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};

use super::quant_config::{scheme, Method, Scheme};
use super::source::Assemble;
use super::{awq, gptq, map_file, pytorch, SourceTensor};
use crate::{Error, Result};

/// The channels and groups of a packed linear.
#[derive(Debug, Clone, Copy)]
pub(super) struct Geometry {
    /// Input channels (the weight's columns).
    pub inputs: usize,
    /// Output channels (the weight's rows).
    pub outputs: usize,
    /// Groups of input channels with a scale and zero point each.
    pub groups: usize,
}

/// `shape` as the two dimensions of a matrix, or a message naming `what`.
pub(super) fn matrix(what: &str, shape: &[usize]) -> std::result::Result<[usize; 2], String> {
    <[usize; 2]>::try_from(shape)
        .map_err(|_| format!("{what} has shape {shape:?}, not two dimensions"))
}

/// A tensor of a mapped safetensors file.
#[derive(Debug, Clone)]
struct Stored {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    map: Arc<Mmap>,
    offset: usize,
    len: usize,
    file: PathBuf,
}

impl Stored {
    fn bytes(&self) -> &[u8] {
        &self.map[self.offset..self.offset + self.len]
    }

    fn bytes_of(&self, dtype: Dtype) -> Result<&[u8]> {
        if self.dtype != dtype {
            return Err(Error::format(
                &self.file,
                format!(
                    "{} has dtype {:?}, expected {dtype:?}",
                    self.name, self.dtype
                ),
            ));
        }
        Ok(self.bytes())
    }

    /// Little-endian 32-bit words of an int32 tensor.
    fn words(&self) -> Result<Vec<u32>> {
        let bytes = self.bytes_of(Dtype::I32)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    fn f16s(&self) -> Result<Vec<f16>> {
        let bytes = self.bytes_of(Dtype::F16)?;
        Ok(bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]))
            .collect())
    }

    fn release(&self) {
        #[cfg(unix)]
        // SAFETY: as in `SourceTensor::release`: a read-only shared file mapping, a range
        // inside it (checked when the tensor was listed); a later read faults the same
        // bytes back in from the file.
        let _ = unsafe {
            self.map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                self.offset,
                self.len,
            )
        };
    }
}

/// Why a packed tensor is dequantised rather than repacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    EightBit,
    ActOrder,
}

/// What loading makes of a packed tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Repacked without loss into this int4 dtype.
    Int4(DataType),
    /// Dequantised to f16.
    F16(Why),
}

/// The zero points `[groups][out]`, scales `[groups][out]` and group of each input
/// channel of a packed linear.
struct Params {
    zeros: Vec<u8>,
    scales: Vec<f16>,
    g_idx: Vec<u32>,
}

impl Params {
    /// Puts the input channels in the order `perm` (column `j` becomes channel `perm[j]`).
    fn permute(&mut self, perm: &[u32]) {
        self.g_idx = perm.iter().map(|&c| self.g_idx[c as usize]).collect();
    }
}

/// One packed linear, read on load.
#[derive(Debug)]
struct PackedLinear {
    scheme: Scheme,
    geometry: Geometry,
    qweight: Stored,
    qzeros: Stored,
    scales: Stored,
    g_idx: Option<Stored>,
    plan: Plan,
    /// For a repacked act-order linear: the input channels in group order (a
    /// stable sort of `g_idx`), column `j` of the loaded weight being channel `perm[j]`.
    perm: Option<Vec<u32>>,
}

impl PackedLinear {
    /// Checks the shapes and decides the [`Plan`] (reading the zero points, scales and
    /// `g_idx`, not the codes).
    fn new(
        scheme: Scheme,
        qweight: Stored,
        qzeros: Stored,
        scales: Stored,
        g_idx: Option<Stored>,
    ) -> Result<PackedLinear> {
        let geometry = match scheme.method {
            Method::Gptq { .. } => gptq::geometry(
                scheme.bits,
                &qweight.shape,
                &qzeros.shape,
                &scales.shape,
                g_idx.as_ref().map(|g| g.shape.iter().product()),
            ),
            Method::Awq => awq::geometry(&qweight.shape, &qzeros.shape, &scales.shape),
        }
        .map_err(|msg| Error::format(&qweight.file, format!("{}: {msg}", qweight.name)))?;
        let mut linear = PackedLinear {
            scheme,
            geometry,
            qweight,
            qzeros,
            scales,
            g_idx,
            plan: Plan::F16(Why::EightBit),
            perm: None,
        };
        let mut params = linear.params()?;
        let perm = group_order(&params.g_idx);
        if let Some(perm) = &perm {
            params.permute(perm);
        }
        linear.plan = linear.plan(&params);
        // Every repacked plan keeps group order; f16 keeps the checkpoint's column order.
        if !matches!(linear.plan, Plan::F16(_)) {
            linear.perm = perm;
        }
        Ok(linear)
    }

    fn error(&self, msg: String) -> Error {
        Error::format(&self.qweight.file, format!("{}: {msg}", self.qweight.name))
    }

    fn params(&self) -> Result<Params> {
        let g = &self.geometry;
        let words = self.qzeros.words()?;
        let zeros = match self.scheme.method {
            Method::Gptq { v1 } => gptq::zeros(self.scheme.bits, &words, g, v1),
            Method::Awq => awq::zeros(&words, g),
        };
        let g_idx = match &self.g_idx {
            Some(stored) => {
                let g_idx: Vec<u32> = stored
                    .bytes_of(Dtype::I32)?
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                if let Some(bad) = g_idx.iter().find(|&&i| i as usize >= g.groups) {
                    return Err(
                        self.error(format!("g_idx names group {} of {}", *bad as i32, g.groups))
                    );
                }
                g_idx
            }
            None => {
                let size = self.scheme.group_size.unwrap_or(g.inputs);
                if g.inputs.div_ceil(size) != g.groups {
                    return Err(self.error(format!(
                        "{} groups for {} input channels in groups of {size}",
                        g.groups, g.inputs
                    )));
                }
                (0..g.inputs).map(|c| (c / size) as u32).collect()
            }
        };
        Ok(Params {
            zeros,
            scales: self.scales.f16s()?,
            g_idx,
        })
    }

    /// The plan for the weight whose input channel `c` is in group `p.g_idx[c]` (sorted
    /// into group order already for an act-order linear).
    fn plan(&self, p: &Params) -> Plan {
        if self.scheme.bits != 4 {
            return Plan::F16(Why::EightBit);
        }
        let contiguous = |size: usize| {
            p.g_idx
                .chunks(size)
                .all(|run| run.iter().all(|&g| g == run[0]))
        };
        let Some(size) = [128, 64, 32].into_iter().find(|&s| contiguous(s)) else {
            return Plan::F16(Why::ActOrder);
        };
        let form = if p.zeros.iter().all(|&z| z == 8) {
            Int4Form::Symmetric
        } else {
            Int4Form::ZeroPoint
        };
        Plan::Int4(DataType::int4(size, form).expect("groups of 32, 64 or 128"))
    }

    fn dtype(&self) -> DataType {
        match self.plan {
            Plan::Int4(dtype) => dtype,
            Plan::F16(_) => DataType::F16,
        }
    }

    /// Writes row `o` of the loaded tensor into `row` (zeroed) from the row's `codes`
    /// (one per input channel). int4: each flm group takes the codes, scale and zero point
    /// of the checkpoint group of its first channel (the same for all of them, by the
    /// plan), and padding columns the zero point as code, so that they are 0. f16:
    /// `f16(d · (q − z))`, the product exact in f32 and rounded once.
    fn write_row(&self, o: usize, codes: &[u8], p: &Params, row: &mut [u8]) {
        let Geometry {
            inputs, outputs, ..
        } = self.geometry;
        let Plan::Int4(dtype) = self.plan else {
            for (c, out) in row.chunks_exact_mut(2).enumerate() {
                let group = p.g_idx[c] as usize * outputs + o;
                let w = p.scales[group].to_f32() * (codes[c] as f32 - p.zeros[group] as f32);
                out.copy_from_slice(&f16::from_f32(w).to_le_bytes());
            }
            return;
        };
        let size = dtype.group_size().unwrap_or(32);
        let kp = padded_cols(dtype, inputs);
        let mins = int4_mins(dtype, kp).offset;
        for j in 0..kp / size {
            let group = p.g_idx[j * size] as usize * outputs + o;
            let (d, z) = (p.scales[group], p.zeros[group]);
            for i in j * size..(j + 1) * size {
                let q = codes.get(i).copied().unwrap_or(z);
                let (byte, shift) = nibble(i);
                row[byte] |= q << shift;
            }
            row[kp / 2 + 2 * j..kp / 2 + 2 * j + 2].copy_from_slice(&d.to_le_bytes());
            if !dtype.is_int4_symmetric() {
                let z = f16::from_f32(f32::from(z)).to_le_bytes();
                row[mins + 2 * j..mins + 2 * j + 2].copy_from_slice(&z);
            }
        }
    }
}

/// The input channels in group order, a stable sort of `g_idx` (vLLM's and ExLlama's
/// act-order shuffle), when `g_idx` is not sorted already; `None` when it is.
fn group_order(g_idx: &[u32]) -> Option<Vec<u32>> {
    if g_idx.is_sorted() {
        return None;
    }
    let mut perm: Vec<u32> = (0..g_idx.len() as u32).collect();
    perm.sort_by_key(|&c| g_idx[c as usize]);
    Some(perm)
}

impl Assemble for PackedLinear {
    fn load(&self) -> Result<Data> {
        let mut p = self.params()?;
        if let Some(perm) = &self.perm {
            p.permute(perm);
        }
        let words = self.qweight.words()?;
        let g = self.geometry;
        let mut data = Data::zeros(self.dtype(), &[g.outputs, g.inputs])?;
        if data.size_bytes() == 0 {
            return Ok(data);
        }
        let row_len = data.size_bytes() / g.outputs;
        // Rows are independent: one per task, each with its codes unpacked into a buffer.
        data.bytes_mut()?
            .par_chunks_exact_mut(row_len)
            .enumerate()
            .for_each_init(
                || (vec![0u8; g.inputs], vec![0u8; g.inputs]),
                |(codes, sorted), (o, row)| {
                    match self.scheme.method {
                        Method::Gptq { .. } => {
                            gptq::row_codes(self.scheme.bits, &words, &g, o, codes)
                        }
                        Method::Awq => awq::row_codes(&words, &g, o, codes),
                    }
                    match &self.perm {
                        Some(perm) => {
                            for (s, &c) in sorted.iter_mut().zip(perm) {
                                *s = codes[c as usize];
                            }
                            self.write_row(o, sorted, &p, row);
                        }
                        None => self.write_row(o, codes, &p, row),
                    }
                },
            );
        match &self.perm {
            Some(perm) => {
                let bytes: Vec<u8> = perm.iter().flat_map(|c| c.to_le_bytes()).collect();
                Ok(data.with_input_perm(Data::from_bytes(DataType::I32, &[g.inputs], &bytes)?)?)
            }
            None => Ok(data),
        }
    }

    fn permuted(&self) -> bool {
        self.perm.is_some()
    }

    fn note(&self) -> Option<String> {
        let Plan::F16(why) = self.plan else {
            return None;
        };
        let why = match why {
            Why::EightBit => "8-bit codes in groups (flm's int8 has one scale per row)",
            Why::ActOrder => {
                "act-order groups that are not runs of 32 input channels even in group order"
            }
        };
        let group = self.scheme.group_size.unwrap_or(self.geometry.inputs) as f64;
        let bits = self.scheme.bits as f64 + (16.0 + self.scheme.bits as f64) / group;
        Some(format!(
            "{} {}-bit with {why} are dequantised to f16 (the reference's own f16 values): \
             16 bits/weight instead of {bits:.2}",
            self.scheme.name(),
            self.scheme.bits
        ))
    }

    fn release(&self) {
        for part in [&self.qweight, &self.qzeros, &self.scales] {
            part.release();
        }
        if let Some(g_idx) = &self.g_idx {
            g_idx.release();
        }
    }
}

/// The packed linears of a checkpoint, as `<prefix>.weight` tensors.
pub(super) struct Packed {
    /// One tensor per packed linear, under its Hugging Face name `<prefix>.weight`.
    pub tensors: Vec<SourceTensor>,
    consumed: HashSet<String>,
}

impl Packed {
    /// Whether the stored tensor `name` is a part of a packed linear.
    pub fn consumes(&self, name: &str) -> bool {
        self.consumed.contains(name)
    }
}

const PARTS: [&str; 4] = ["qweight", "qzeros", "scales", "g_idx"];

/// The packed linears of the checkpoint in `dir` (`config` its `config.json`, `files` its
/// weight files), or `None` if its configuration names no quantisation.
///
/// Errors: [`Error::Format`] for an unsupported scheme, a packed linear with a part missing
/// or of the wrong dtype or shape, or weights in a PyTorch file; [`Error::Io`] if a file
/// cannot be read.
pub(super) fn read(dir: &Path, config: &Path, files: &[PathBuf]) -> Result<Option<Packed>> {
    let Some(scheme) = scheme(dir, config)? else {
        return Ok(None);
    };
    let mut stored: HashMap<String, Stored> = HashMap::new();
    for file in files {
        let map = map_file(file)?;
        if pytorch::is_torch_save(&map) {
            return Err(Error::format(
                file,
                "GPTQ and AWQ weights are read from safetensors files only",
            ));
        }
        let (header_len, metadata) = SafeTensors::read_metadata(&map)
            .map_err(|e| Error::format(file, format!("invalid safetensors file: {e}")))?;
        for (name, info) in metadata.tensors() {
            if !PARTS.iter().any(|p| name.ends_with(&format!(".{p}"))) {
                continue;
            }
            let (start, end) = info.data_offsets;
            let offset = 8 + header_len + start;
            let numel: usize = info.shape.iter().product();
            if end < start
                || numel.checked_mul(info.dtype.bitsize()) != Some(8 * (end - start))
                || offset + (end - start) > map.len()
            {
                return Err(Error::format(
                    file,
                    format!("tensor {name}: its byte range does not fit its shape or the file"),
                ));
            }
            stored.insert(
                name.clone(),
                Stored {
                    name,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    map: Arc::clone(&map),
                    offset,
                    len: end - start,
                    file: file.clone(),
                },
            );
        }
    }
    let mut prefixes: Vec<String> = stored
        .keys()
        .filter_map(|n| n.strip_suffix(".qweight").map(String::from))
        .collect();
    prefixes.sort();
    let mut consumed = HashSet::new();
    let mut tensors = Vec::with_capacity(prefixes.len());
    for prefix in prefixes {
        let part = |p: &str| stored.get(&format!("{prefix}.{p}")).cloned();
        let need = |p: &str| {
            part(p)
                .ok_or_else(|| Error::format(dir, format!("{prefix}.qweight has no {prefix}.{p}")))
        };
        let linear = PackedLinear::new(
            scheme,
            need("qweight")?,
            need("qzeros")?,
            need("scales")?,
            part("g_idx"),
        )?;
        consumed.extend(PARTS.iter().map(|p| format!("{prefix}.{p}")));
        let g = linear.geometry;
        let file = linear.qweight.file.clone();
        tensors.push(SourceTensor::assembled(
            format!("{prefix}.weight"),
            vec![g.outputs, g.inputs],
            linear.dtype(),
            &file,
            Arc::new(linear),
        ));
    }
    Ok(Some(Packed { tensors, consumed }))
}
