//! [`flm_core::Op::Linear`] on [`super::CudaDevice`]: `output[n, out] = input[n, in] ·
//! weight[out, in]ᵀ (+ bias)`.
//!
//! - f16/bf16 weights with at most [`GEMV_MAX_ROWS`] input rows (decode), or any number once
//!   batch invariance was asked for, and int8/int4 weights with as many rows: the decode
//!   GEMV kernels of `kernels/gemv.cu` over the weight in its GPU layout
//!   ([`crate::gemv_layout`]: the layout int8/int4 weights in GPU memory are uploaded in,
//!   and a copy repacked once for host weights, cached beside the other uploads),
//!   [`GEMV_MAX_ROWS`] input rows per weight read. f16/bf16 products keep the activations
//!   f32, as on the CPU; int8/int4 ones quantise them to int8 blocks of 32 first, as the CPU
//!   does, and take integer dot products.
//! - f32 weights, and f16/bf16 ones with more rows (prefill): one cuBLAS `cublasGemmEx`
//!   (f16/bf16 operands after the activations are rounded to the weight's type, as
//!   transformers' f16 models round them; f32 accumulation and output,
//!   `CUBLAS_COMPUTE_32F`, so no TF32).
//! - int8, int4 and ggml-block weights with more than [`GEMV_MAX_ROWS`] rows (prefill),
//!   unless batch invariance was asked for: [`super::dequant`], the weight (int8/int4 in the
//!   GPU layout the decode kernels read, ggml's blocks in their rows) dequantised to f16 a
//!   chunk of rows at a time and multiplied by cuBLAS as the f16 weights are.
//! - Weights of ggml's blocks (the K-quants, Q5_0, Q8_0, IQ4_NL, IQ4_XS, MXFP4) with at most
//!   [`GEMV_MAX_ROWS`] rows or batch invariance asked for: the dequantise-GEMV kernels
//!   `qgemv_<type>` of `kernels/qgemv.cu`, reading ggml's rows as they are, f32 activations,
//!   one weight read per input row, each output row computed alone.
//! - A weight with an input permutation ([`flm_core::Data::input_perm`], act-order GPTQ):
//!   the `gather_cols` kernel first writes the gathered input into a buffer of the op, the
//!   permutation itself uploaded once like a weight.

use std::ffi::c_void;

use cudarc::cublas::sys::{cublasComputeType_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use flm_core::{quant, Data, DataType, Error, Result};

use super::dequant::quantized_gemm;
use super::device::CudaDevice;
use super::kernels::{
    int4_form_code, GemvTile, GemvWeight, GgmlBlocks, Kernel, GEMV_MAX_ROWS, GEMV_WARPS, QGEMV_ROWS,
};
use super::launch::{arg_or_null, dev_err, grid, int};
use super::operand::Input;
use crate::gemv_layout::{packed_in_gpu_memory, GemvLayout};

/// [`flm_core::Op::Linear`].
///
/// Errors: [`Error::DType`] for a weight dtype without a kernel; [`Error::Device`] when a launch or cuBLAS fails.
pub(super) fn linear(
    dev: &CudaDevice,
    input: &Data,
    weight: &Data,
    bias: Option<&Data>,
    output: &mut Data,
) -> Result<()> {
    if input.rows() == 0 || weight.rows() == 0 {
        return Ok(());
    }
    let x = dev.input(input)?;
    let bias_d = bias.map(|b| dev.weight(b)).transpose()?;
    let mut out = dev.output(output)?;
    product(
        dev,
        x.slice(),
        weight,
        bias_d.as_ref().map(Input::slice),
        out.slice(),
        input.rows(),
    )?;
    out.finish(dev)
}

/// `y[n, m] = x[n, k] · weight[m, k]ᵀ (+ bias[m])` on f32 buffers in this GPU's memory, by
/// the kernels the module docs list for the weight's dtype and `n`.
///
/// Errors: as [`linear`].
pub(super) fn product(
    dev: &CudaDevice,
    x: &CudaSlice<u8>,
    weight: &Data,
    bias: Option<&CudaSlice<u8>>,
    y: &mut CudaSlice<u8>,
    n: usize,
) -> Result<()> {
    let (k, m) = (weight.cols(), weight.rows());
    let gathered = match weight.input_perm() {
        Some(perm) => Some(gather_cols(dev, x, dev.weight(perm)?.slice(), (n, k))?),
        None => None,
    };
    let x = gathered.as_ref().unwrap_or(x);
    if let Some((w, layout)) = gemv_weight(dev, weight, n)? {
        if n <= GEMV_MAX_ROWS || dev.batch_invariant() {
            return gemv(dev, x, w.slice(), &layout, bias, y, n);
        }
        quantized_gemm(
            dev,
            x,
            w.slice(),
            (layout.dtype, Some(&layout)),
            y,
            (n, k, m),
        )?;
        return add_bias(dev, y, bias, (n, m));
    }
    let w = dev.weight(weight)?;
    let w = w.slice();
    match weight.dtype() {
        DataType::F32 => gemm(dev, x, w, cudaDataType::CUDA_R_32F, y, (n, k, m), (0, m))?,
        DataType::F16 => {
            let xh = convert(dev, x, n * k, Kernel::F32ToF16Rows)?;
            gemm(dev, &xh, w, cudaDataType::CUDA_R_16F, y, (n, k, m), (0, m))?;
        }
        DataType::BF16 => {
            let xh = convert(dev, x, n * k, Kernel::F32ToBf16Rows)?;
            gemm(dev, &xh, w, cudaDataType::CUDA_R_16BF, y, (n, k, m), (0, m))?;
        }
        dtype => match GgmlBlocks::of(dtype) {
            Some(blocks) if n <= GEMV_MAX_ROWS || dev.batch_invariant() => {
                return qgemv_ggml(dev, x, w, (dtype, blocks), bias, y, (n, k, m));
            }
            Some(_) => quantized_gemm(dev, x, w, (dtype, None), y, (n, k, m))?,
            None => {
                return Err(Error::DType {
                    op: "Linear",
                    msg: format!("{dtype} weights on cuda"),
                })
            }
        },
    }
    add_bias(dev, y, bias, (n, m))
}

/// `y[r, o] += bias[o]` for the `n × m` output of a cuBLAS product, when there is a bias.
fn add_bias(
    dev: &CudaDevice,
    y: &mut CudaSlice<u8>,
    bias: Option<&CudaSlice<u8>>,
    (n, m): (usize, usize),
) -> Result<()> {
    let Some(bias) = bias else { return Ok(()) };
    let total = (n * m) as i64;
    let m_i = int(m)?;
    let f = dev.function(Kernel::AddBias)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(&mut *y).arg(bias).arg(&m_i).arg(&total);
    // SAFETY: y holds n × m floats and the bias m floats, as `add_bias(float*, const
    // float*, int, long)` uses them.
    unsafe { b.launch(grid(((n * m).div_ceil(256), 1, 1), 256, 0)?) }.map_err(dev_err)?;
    Ok(())
}

/// The `n` rows of `k` f32 activations of `x` with their columns gathered by the i32
/// permutation `perm`: `out[r, j] = x[r, perm[j]]` ([`flm_core::Data::input_perm`]).
fn gather_cols(
    dev: &CudaDevice,
    x: &CudaSlice<u8>,
    perm: &CudaSlice<u8>,
    (n, k): (usize, usize),
) -> Result<CudaSlice<u8>> {
    let mut out = dev.zeros::<u8>(4 * n * k)?;
    let (k_i, total) = (int(k)?, (n * k) as i64);
    let f = dev.function(Kernel::GatherCols)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(x).arg(perm).arg(&mut out).arg(&k_i).arg(&total);
    // SAFETY: x and out hold n × k floats and perm k ints (its shape checked when it was
    // attached to the weight; the kernel reads x only at indices in 0..k), as
    // `gather_cols(const float*, const int*, float*, int, long)` uses them.
    unsafe { b.launch(grid(((n * k).div_ceil(256), 1, 1), 256, 0)?) }.map_err(dev_err)?;
    Ok(out)
}

/// The `len` f32 activations of `x` rounded to f16 or bf16 by the conversion kernel
/// `kernel`.
pub(super) fn convert(
    dev: &CudaDevice,
    x: &CudaSlice<u8>,
    len: usize,
    kernel: Kernel,
) -> Result<CudaSlice<u16>> {
    let mut out = dev.zeros::<u16>(len)?;
    let n = len as i64;
    let f = dev.function(kernel)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(x).arg(&mut out).arg(&n);
    // SAFETY: x holds n floats and out n 16-bit values, as the conversion kernels use them.
    unsafe { b.launch(grid((len.div_ceil(256), 1, 1), 256, 0)?) }.map_err(dev_err)?;
    Ok(out)
}

/// `y[:, col0..col0 + m] = x[n, k] · w[m, k]ᵀ` with cuBLAS, `x` and `w` of `dtype`, `y`
/// a row-major f32 matrix of `n` rows of `ldy` values (`col0 + m <= ldy`). cuBLAS is
/// column-major: the row-major `w` is a `k × m` column-major matrix (transposed in the
/// call), the row-major `x` is `k × n`, and `y`'s columns `col0..col0 + m` are the `m × n`
/// column-major matrix that starts `col0` values in, with leading dimension `ldy`.
pub(super) fn gemm<X, W>(
    dev: &CudaDevice,
    x: &CudaSlice<X>,
    w: &CudaSlice<W>,
    dtype: cudaDataType,
    y: &mut CudaSlice<u8>,
    (n, k, m): (usize, usize, usize),
    (col0, ldy): (usize, usize),
) -> Result<()> {
    let (n_i, k_i, m_i, ldy_i) = (int(n)?, int(k)?, int(m)?, int(ldy)?);
    let (alpha, beta) = (1.0f32, 0.0f32);
    let (a, _a) = w.device_ptr(&dev.stream);
    let (b, _b) = x.device_ptr(&dev.stream);
    let (c, _c) = y.device_ptr_mut(&dev.stream);
    let c = c + 4 * col0 as u64;
    // SAFETY: a, b and c are live device buffers of m × k and n × k values of `dtype` and
    // n × ldy floats, c offset by col0 < ldy - m + 1 values (the shapes were checked by
    // `linear` and the callers), alpha and beta are host f32 values as CUBLAS_COMPUTE_32F
    // expects, and the handle runs on the device's stream, after the kernels that wrote
    // a and b.
    unsafe {
        cudarc::cublas::result::gemm_ex(
            *dev.blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            m_i,
            n_i,
            k_i,
            (&alpha as *const f32).cast::<c_void>(),
            a as *const c_void,
            dtype,
            k_i,
            b as *const c_void,
            dtype,
            k_i,
            (&beta as *const f32).cast::<c_void>(),
            c as *mut c_void,
            cudaDataType::CUDA_R_32F,
            ldy_i,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cudarc::cublas::sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| Error::Device(format!("cublasGemmEx: {e}")))
}

/// The weight of a Linear with `n` input rows in its GPU GEMV layout, where the op reads it
/// so (see the module docs): f16/bf16 weights for the decode GEMV kernels (up to
/// [`GEMV_MAX_ROWS`] rows or batch invariance asked for), and int8/int4 ones whatever the
/// rows (the prefill dequantises the same layout). A weight already in that layout (an
/// int8/int4 weight in GPU memory) is read where it is.
fn gemv_weight<'a>(
    dev: &CudaDevice,
    weight: &'a Data,
    n: usize,
) -> Result<Option<(Input<'a>, GemvLayout)>> {
    let dtype = weight.dtype();
    let float = matches!(dtype, DataType::F16 | DataType::BF16);
    let decode = n <= GEMV_MAX_ROWS || dev.batch_invariant();
    if !(packed_in_gpu_memory(dtype) || float && decode) {
        return Ok(None);
    }
    let layout = GemvLayout::for_shape(dtype, weight.shape())?;
    Ok(Some((dev.weight_in_layout(weight, &layout)?, layout)))
}

/// The decode GEMV kernels of `kernels/gemv.cu`: `y[n, m] = x[n, k] · ŵᵀ (+ bias)` for the
/// weight `w` in its GPU `layout`; one warp per output row, [`GEMV_WARPS`] rows per block,
/// one grid row per [`GemvTile`] of input rows (up to [`GEMV_MAX_ROWS`]).
fn gemv(
    dev: &CudaDevice,
    x: &CudaSlice<u8>,
    w: &CudaSlice<u8>,
    layout: &GemvLayout,
    bias: Option<&CudaSlice<u8>>,
    y: &mut CudaSlice<u8>,
    n: usize,
) -> Result<()> {
    let (k, ld, m) = (layout.cols, layout.ld, layout.rows);
    let (n_i, ld_i, m_i) = (int(n)?, int(ld)?, int(m)?);
    let tile = GemvTile::for_rows(n);
    let cfg = grid(
        (m.div_ceil(GEMV_WARPS), n.div_ceil(tile.rows()), 1),
        32 * GEMV_WARPS as u32,
        0,
    )?;
    if let Some(weight) = match layout.dtype {
        DataType::F16 => Some(GemvWeight::F16),
        DataType::BF16 => Some(GemvWeight::Bf16),
        _ => None,
    } {
        let kernel = Kernel::Gemv(weight, tile);
        let padded = (ld != k)
            .then(|| pad_cols(dev, x, (n, k, ld)))
            .transpose()?;
        let f = dev.function(kernel)?;
        let mut b = dev.stream.launch_builder(f);
        b.arg(w).arg(padded.as_ref().unwrap_or(x));
        arg_or_null(&mut b, bias);
        b.arg(y).arg(&n_i).arg(&ld_i).arg(&m_i);
        // SAFETY: w holds m rows of ld 16-bit values (ld % 8 == 0, rows 16-byte aligned in a
        // buffer that is), the activations n rows of ld floats, y n × m floats, the bias m
        // floats or null, as `gemv_f16_<rows>`/`gemv_bf16_<rows>` read them.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        return Ok(());
    }
    let (xq, xs) = quantize_rows(dev, x, (n, k, ld))?;
    let weight = if layout.dtype == DataType::I8 {
        GemvWeight::Int8
    } else {
        GemvWeight::Int4
    };
    let f = dev.function(Kernel::Gemv(weight, tile))?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(w).arg(&xq).arg(&xs);
    arg_or_null(&mut b, bias);
    b.arg(y).arg(&n_i).arg(&ld_i).arg(&m_i);
    let group = int(layout.dtype.group_size().unwrap_or(0))?;
    let form = int4_form_code(layout.dtype);
    if layout.dtype != DataType::I8 {
        b.arg(&group).arg(&form);
    }
    // SAFETY: w is the packed layout of an m × k int8 or int4 weight (codes of m rows of
    // ld values, then the scales or group parameters at layout.params_offset =
    // m · ld (int8) or m · ld / 2 (int4)), xq n × ld int8 codes and xs n × ld / 32 float
    // pairs, y n × m floats, the bias m floats or null, as `gemv_q8_<rows>`/`gemv_q4_<rows>`
    // read them.
    unsafe { b.launch(cfg) }.map_err(dev_err)?;
    Ok(())
}

/// The activations `x[n, k]` quantised to int8 in blocks of 32 for `gemv_q8`/`gemv_q4`: the
/// codes `[n, ld]` (zero past `k`) and the f32 pairs `(a, a · Σq)` per block.
fn quantize_rows(
    dev: &CudaDevice,
    x: &CudaSlice<u8>,
    (n, k, ld): (usize, usize, usize),
) -> Result<(CudaSlice<u8>, CudaSlice<f32>)> {
    let blocks = n * ld / 32;
    let mut xq = dev.zeros::<u8>(n * ld)?;
    let mut xs = dev.zeros::<f32>(2 * blocks)?;
    let (n_i, k_i, ld_i) = (int(n)?, int(k)?, int(ld)?);
    let f = dev.function(Kernel::QuantizeQ8Rows)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(x)
        .arg(&mut xq)
        .arg(&mut xs)
        .arg(&n_i)
        .arg(&k_i)
        .arg(&ld_i);
    // SAFETY: x holds n × k floats, xq n × ld bytes and xs 2 · n · ld / 32 floats (ld a
    // multiple of 32), one warp per block of 32 (8 per block of 256 threads), as
    // `quantize_q8_rows` uses them.
    unsafe { b.launch(grid((blocks.div_ceil(8), 1, 1), 256, 0)?) }.map_err(dev_err)?;
    Ok((xq, xs))
}

/// `x[n, k]` with zero columns up to `ld`: the activations of an f16/bf16 weight whose rows
/// were padded.
fn pad_cols(
    dev: &CudaDevice,
    x: &CudaSlice<u8>,
    (n, k, ld): (usize, usize, usize),
) -> Result<CudaSlice<u8>> {
    let mut out = dev.zeros::<u8>(4 * n * ld)?;
    let (k_i, ld_i, total) = (int(k)?, int(ld)?, (n * ld) as i64);
    let f = dev.function(Kernel::PadColsF32)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(x).arg(&mut out).arg(&k_i).arg(&ld_i).arg(&total);
    // SAFETY: x holds n × k floats and out n × ld, as `pad_cols_f32` uses them.
    unsafe { b.launch(grid(((n * ld).div_ceil(256), 1, 1), 256, 0)?) }.map_err(dev_err)?;
    Ok(out)
}

/// The dequantise-GEMV kernel `qgemv_<type>` for a weight `w` of `dtype`, in rows of ggml's
/// `blocks` (`y[n, m] = x[n, k] · ŵ[m, k]ᵀ (+ bias)`, all f32): one warp per output row,
/// [`QGEMV_ROWS`] rows per block, one grid row per input row.
///
/// Errors: [`Error::InvalidArgument`] for sizes beyond the kernel's integers;
/// [`Error::Device`] when the launch fails.
fn qgemv_ggml(
    dev: &CudaDevice,
    x: &CudaSlice<u8>,
    w: &CudaSlice<u8>,
    (dtype, blocks): (DataType, GgmlBlocks),
    bias: Option<&CudaSlice<u8>>,
    y: &mut CudaSlice<u8>,
    (n, k, m): (usize, usize, usize),
) -> Result<()> {
    let (k_i, m_i) = (int(k)?, int(m)?);
    let row_bytes = quant::row_bytes(dtype, k)
        .and_then(|b| i64::try_from(b).ok())
        .ok_or_else(|| Error::InvalidArgument(format!("{dtype} rows of {k} values")))?;
    let cfg = grid((m.div_ceil(QGEMV_ROWS), n, 1), 32 * QGEMV_ROWS as u32, 0)?;
    let f = dev.function(Kernel::QgemvGgml(blocks))?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(w).arg(x);
    arg_or_null(&mut b, bias);
    b.arg(y).arg(&k_i).arg(&m_i).arg(&row_bytes);
    // SAFETY: w is m rows of row_bytes bytes, each the ggml blocks of `dtype` for k values
    // padded to whole blocks (the kernel reads only the blocks of runs that start below k,
    // and activations below k), x n × k floats, y
    // n × m floats, the bias m floats or null, as `qgemv_<type>(const unsigned char*,
    // const float*, const float*, float*, int, int, long)` reads them.
    unsafe { b.launch(cfg) }.map_err(dev_err)?;
    Ok(())
}
