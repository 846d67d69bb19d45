//! [`flm_core::Op::Linear`] on [`super::CudaDevice`]: `output[n, out] = input[n, in] ·
//! weight[out, in]ᵀ (+ bias)`.
//!
//! - f16 and bf16 weights with at most [`GEMV_MAX_ROWS`] input rows (decode), or any
//!   number once batch invariance was asked for: the `gemv_f16`/`gemv_bf16` kernels, f32
//!   activations as on the CPU.
//! - f32 weights, and f16/bf16 ones with more rows (prefill): one cuBLAS `cublasGemmEx`
//!   (f16/bf16 operands after the activations are rounded to the weight's type, as
//!   transformers' f16 models round them; f32 accumulation and output,
//!   `CUBLAS_COMPUTE_32F`, so no TF32).
//! - int8, int4 and K-quant weights with at most [`GEMV_MAX_ROWS`] input rows, or any
//!   number once batch invariance was asked for: the dequantise-GEMV kernels of
//!   `kernels/qgemv.cu`, reading the weights quantised, in the .flm row layout (ggml's for
//!   the K-quants).
//! - int8, int4 and K-quant weights with more rows (prefill): [`super::dequant`], the
//!   weight dequantised to f16 a chunk of rows at a time and multiplied by cuBLAS as the
//!   f16 weights are.
//! - A weight with an input permutation ([`flm_core::Data::input_perm`], act-order GPTQ):
//!   the `gather_cols` kernel first writes the gathered input into a buffer of the op, the
//!   permutation itself uploaded once like a weight.

use std::ffi::c_void;

use cudarc::cublas::sys::{cublasComputeType_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use flm_core::{quant, Data, DataType, Error, Result};

use super::dequant::quantized_gemm;
use super::device::{arg_or_null, dev_err, grid, int, CudaDevice};
use super::kernels::{int4_form_code, k_quant_code, Kernel, QGEMV_ROWS};

/// Input rows up to which f16/bf16 weights go through the GEMV kernels rather than cuBLAS.
pub const GEMV_MAX_ROWS: usize = 8;

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
    let (n, k, m) = (input.rows(), input.cols(), weight.rows());
    if n == 0 || m == 0 {
        return Ok(());
    }
    let x = dev.input(input)?;
    let gathered = match weight.input_perm() {
        Some(perm) => Some(gather_cols(
            dev,
            x.slice(),
            dev.weight(perm)?.slice(),
            (n, k),
        )?),
        None => None,
    };
    let w = dev.weight(weight)?;
    let bias_d = bias.map(|b| dev.weight(b)).transpose()?;
    let bias_s = bias_d.as_ref().map(|b| b.slice());
    let mut out = dev.output(output)?;
    let (x, w, y) = (
        gathered.as_ref().unwrap_or(x.slice()),
        w.slice(),
        out.slice(),
    );
    match weight.dtype() {
        DataType::F32 => gemm(dev, x, w, cudaDataType::CUDA_R_32F, y, (n, k, m), (0, m))?,
        DataType::F16 | DataType::BF16 if n <= GEMV_MAX_ROWS || dev.batch_invariant() => {
            gemv_half(dev, x, w, weight.dtype(), bias_s, y, (n, k, m))?;
            return out.finish(dev);
        }
        DataType::F16 => {
            let xh = convert(dev, x, n * k, Kernel::F32ToF16Rows)?;
            gemm(dev, &xh, w, cudaDataType::CUDA_R_16F, y, (n, k, m), (0, m))?;
        }
        DataType::BF16 => {
            let xh = convert(dev, x, n * k, Kernel::F32ToBf16Rows)?;
            gemm(dev, &xh, w, cudaDataType::CUDA_R_16BF, y, (n, k, m), (0, m))?;
        }
        dtype if dtype.is_quantized() && n > GEMV_MAX_ROWS && !dev.batch_invariant() => {
            quantized_gemm(dev, x, w, dtype, y, (n, k, m))?;
        }
        dtype if dtype.is_quantized() => {
            qgemv(dev, x, w, weight.dtype(), bias_s, y, (n, k, m))?;
            return out.finish(dev);
        }
        dtype => {
            return Err(Error::DType {
                op: "Linear",
                msg: format!("{dtype} weights on cuda"),
            })
        }
    }
    if let Some(bias) = bias_s {
        let total = (n * m) as i64;
        let m_i = int(m)?;
        let f = dev.function(Kernel::AddBias)?;
        let mut b = dev.stream.launch_builder(f);
        b.arg(&mut *y).arg(bias).arg(&m_i).arg(&total);
        // SAFETY: y holds n × m floats and the bias m floats, as `add_bias(float*, const
        // float*, int, long)` uses them.
        unsafe { b.launch(grid(((n * m).div_ceil(256), 1, 1), 256, 0)?) }.map_err(dev_err)?;
    }
    out.finish(dev)
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

/// The f16/bf16 GEMV kernels: one warp per output row, [`QGEMV_ROWS`] rows per block, one
/// grid row per input row.
fn gemv_half(
    dev: &CudaDevice,
    x: &CudaSlice<u8>,
    w: &CudaSlice<u8>,
    dtype: DataType,
    bias: Option<&CudaSlice<u8>>,
    y: &mut CudaSlice<u8>,
    (n, k, m): (usize, usize, usize),
) -> Result<()> {
    let (k_i, m_i) = (int(k)?, int(m)?);
    let kernel = if dtype == DataType::F16 {
        Kernel::GemvF16
    } else {
        Kernel::GemvBf16
    };
    let f = dev.function(kernel)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(w).arg(x);
    arg_or_null(&mut b, bias);
    b.arg(y).arg(&k_i).arg(&m_i);
    // SAFETY: w holds m × k 16-bit values (a row is 16-byte aligned when k % 8 == 0, the
    // only case the kernel loads 8 at a time), x n × k floats, y n × m floats, the bias m
    // floats or null, as `gemv_f16`/`gemv_bf16` use them.
    unsafe {
        b.launch(grid(
            (m.div_ceil(QGEMV_ROWS), n, 1),
            32 * QGEMV_ROWS as u32,
            0,
        )?)
    }
    .map_err(dev_err)?;
    Ok(())
}

/// The dequantise-GEMV kernels: one warp per output row, [`QGEMV_ROWS`] rows per block,
/// one grid row per input row.
fn qgemv(
    dev: &CudaDevice,
    x: &CudaSlice<u8>,
    w: &CudaSlice<u8>,
    dtype: DataType,
    bias: Option<&CudaSlice<u8>>,
    y: &mut CudaSlice<u8>,
    (n, k, m): (usize, usize, usize),
) -> Result<()> {
    let (k_i, m_i, padded) = (int(k)?, int(m)?, int(quant::padded_cols(dtype, k))?);
    let cfg = grid((m.div_ceil(QGEMV_ROWS), n, 1), 32 * QGEMV_ROWS as u32, 0)?;
    if dtype.is_k_quant() {
        let (blocks, kq) = (
            int(quant::padded_cols(dtype, k) / 256)?,
            k_quant_code(dtype),
        );
        let f = dev.function(Kernel::QgemvK)?;
        let mut b = dev.stream.launch_builder(f);
        b.arg(w).arg(x);
        arg_or_null(&mut b, bias);
        b.arg(y).arg(&k_i).arg(&m_i).arg(&blocks).arg(&kq);
        // SAFETY: w is m rows of `blocks` super-blocks of the K-quant `dtype` (ggml's bytes,
        // flm_core::kquant), x n × k floats, y n × m floats, the bias m floats or null, as
        // `qgemv_k` reads them.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        return Ok(());
    }
    match dtype.group_size() {
        None => {
            let f = dev.function(Kernel::QgemvI8)?;
            let mut b = dev.stream.launch_builder(f);
            b.arg(w).arg(x);
            arg_or_null(&mut b, bias);
            b.arg(y).arg(&k_i).arg(&m_i).arg(&padded);
            // SAFETY: w is m rows of 4 + padded bytes (the .flm int8 layout), x n × k
            // floats, y n × m floats, the bias m floats or null, as `qgemv_i8` reads them.
            unsafe { b.launch(cfg) }.map_err(dev_err)?;
        }
        Some(group) => {
            let group_i = int(group)?;
            let f = dev.function(Kernel::QgemvI4)?;
            let mut b = dev.stream.launch_builder(f);
            b.arg(w).arg(x);
            arg_or_null(&mut b, bias);
            let form = int4_form_code(dtype);
            b.arg(y)
                .arg(&k_i)
                .arg(&m_i)
                .arg(&padded)
                .arg(&group_i)
                .arg(&form);
            // SAFETY: w is m rows of padded / group groups of group / 2 + 4 bytes (2 if
            // `form` is 1; the .flm int4 layouts), x n × k floats, y n × m floats, the bias m
            // floats or null.
            unsafe { b.launch(cfg) }.map_err(dev_err)?;
        }
    }
    Ok(())
}
