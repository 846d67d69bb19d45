//! The row-wise and element-wise ops of [`super::CudaDevice`]: embedding, RMSNorm and
//! LayerNorm, SwiGLU, GELU, residual add, scale and argmax, over operands that passed
//! [`flm_core::Op::validate`].

use cudarc::driver::PushKernelArg;
use flm_core::{quant, Data, Error, Result};

use super::device::{dev_err, grid, int, CudaDevice};
use super::kernels::{FloatWeight, Kernel};

/// Threads of the one-block-per-row kernels.
const ROW_THREADS: u32 = 256;
/// Threads of the one-thread-per-element kernels.
const ELEM_THREADS: u32 = 256;

fn elem_grid(n: usize) -> Result<cudarc::driver::LaunchConfig> {
    grid((n.div_ceil(ELEM_THREADS as usize), 1, 1), ELEM_THREADS, 0)
}

/// [`flm_core::Op::Embedding`].
pub(super) fn embedding(
    dev: &CudaDevice,
    table: &Data,
    tokens: &[u32],
    output: &mut Data,
) -> Result<()> {
    let (vocab, dim) = (table.rows(), table.cols());
    if tokens.is_empty() {
        return Ok(());
    }
    let w = dev.weight(table)?;
    let ids = dev.upload(tokens)?;
    let mut out = dev.output(output)?;
    let bad = dev.zeros::<i32>(1)?;
    let (dim_i, vocab_u) = (int(dim)?, u32::try_from(vocab).unwrap_or(u32::MAX));
    let cfg = grid((tokens.len(), 1, 1), ROW_THREADS, 0)?;
    let launched = match FloatWeight::of(table.dtype()) {
        Some(kind) => {
            let f = dev.function(Kernel::Embedding(kind))?;
            let mut b = dev.stream.launch_builder(f);
            b.arg(w.slice())
                .arg(&ids)
                .arg(out.slice())
                .arg(&dim_i)
                .arg(&vocab_u)
                .arg(&bad);
            // SAFETY: the arguments match `embedding_<W>(const void*, const unsigned*,
            // float*, int, unsigned, int*)`; `out` holds tokens × dim floats, the table
            // vocab × dim values of W, and the kernel reads no token id >= vocab.
            unsafe { b.launch(cfg) }
        }
        None => {
            let row_bytes = quant::row_bytes(table.dtype(), dim).ok_or_else(|| Error::DType {
                op: "Embedding",
                msg: format!("{} table", table.dtype()),
            })?;
            let (row_bytes, padded) = (
                row_bytes as i64,
                int(quant::padded_cols(table.dtype(), dim))?,
            );
            let group = int(table.dtype().group_size().unwrap_or(0))?;
            let f = dev.function(Kernel::EmbeddingQuant)?;
            let mut b = dev.stream.launch_builder(f);
            b.arg(w.slice())
                .arg(&ids)
                .arg(out.slice())
                .arg(&dim_i)
                .arg(&vocab_u);
            let sym = i32::from(table.dtype().is_int4_symmetric());
            b.arg(&row_bytes)
                .arg(&padded)
                .arg(&group)
                .arg(&sym)
                .arg(&bad);
            // SAFETY: arguments as `embedding_quant`; the table is vocab rows of
            // `row_bytes` in the .flm layout of its dtype, and ids >= vocab are not read.
            unsafe { b.launch(cfg) }
        }
    };
    launched.map_err(dev_err)?;
    dev.check_flag(&bad, || {
        let id = tokens
            .iter()
            .copied()
            .find(|&t| t as usize >= vocab)
            .unwrap_or(0);
        Error::TokenOutOfRange {
            id,
            vocab_size: vocab,
        }
    })?;
    out.finish(dev)
}

/// [`flm_core::Op::RmsNorm`] (`bias` `None`) or [`flm_core::Op::LayerNorm`].
pub(super) fn norm(
    dev: &CudaDevice,
    input: &Data,
    weight: &Data,
    bias: Option<&Data>,
    eps: f32,
    output: &mut Data,
) -> Result<()> {
    let name = if bias.is_some() {
        "LayerNorm"
    } else {
        "RmsNorm"
    };
    let dim = input.cols();
    if input.numel() == 0 {
        return Ok(());
    }
    let gain = FloatWeight::of(weight.dtype()).ok_or_else(|| Error::DType {
        op: name,
        msg: format!("{} gain", weight.dtype()),
    })?;
    let x = dev.input(input)?;
    let w = dev.weight(weight)?;
    let mut y = dev.output(output)?;
    let dim_i = int(dim)?;
    let cfg = grid((input.rows(), 1, 1), ROW_THREADS, 0)?;
    match bias {
        None => {
            let f = dev.function(Kernel::RmsNorm(gain))?;
            let mut b = dev.stream.launch_builder(f);
            b.arg(x.slice())
                .arg(w.slice())
                .arg(y.slice())
                .arg(&dim_i)
                .arg(&eps);
            // SAFETY: arguments as `rms_norm_<W>(const float*, const void*, float*, int,
            // float)`; x and y hold rows × dim floats, w dim values of W.
            unsafe { b.launch(cfg) }.map_err(dev_err)?;
        }
        Some(bias) => {
            let bias = dev.weight(bias)?;
            let f = dev.function(Kernel::LayerNorm(gain))?;
            let mut b = dev.stream.launch_builder(f);
            b.arg(x.slice())
                .arg(w.slice())
                .arg(bias.slice())
                .arg(y.slice())
                .arg(&dim_i)
                .arg(&eps);
            // SAFETY: as above, plus the shift: dim values of the gain's dtype.
            unsafe { b.launch(cfg) }.map_err(dev_err)?;
        }
    }
    y.finish(dev)
}

/// [`flm_core::Op::SiluMul`].
pub(super) fn silu_mul(dev: &CudaDevice, gate: &Data, up: &Data, output: &mut Data) -> Result<()> {
    let n = gate.numel();
    if n == 0 {
        return Ok(());
    }
    let (g, u) = (dev.input(gate)?, dev.input(up)?);
    let mut y = dev.output(output)?;
    let n_i = n as i64;
    let f = dev.function(Kernel::SiluMul)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(g.slice()).arg(u.slice()).arg(y.slice()).arg(&n_i);
    // SAFETY: three buffers of n floats, as `silu_mul(const float*, const float*, float*,
    // long)` reads and writes them.
    unsafe { b.launch(elem_grid(n)?) }.map_err(dev_err)?;
    y.finish(dev)
}

/// [`flm_core::Op::Add`].
pub(super) fn add(dev: &CudaDevice, x: &mut Data, y: &Data) -> Result<()> {
    let n = x.numel();
    if n == 0 {
        return Ok(());
    }
    let yd = dev.input(y)?;
    let mut xd = dev.in_out(x)?;
    let n_i = n as i64;
    let f = dev.function(Kernel::Add)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(xd.slice()).arg(yd.slice()).arg(&n_i);
    // SAFETY: two buffers of n floats, as `add(float*, const float*, long)` uses them.
    unsafe { b.launch(elem_grid(n)?) }.map_err(dev_err)?;
    xd.finish(dev)
}

/// [`flm_core::Op::CopyRows`] between tensors on this GPU (keys and values into a KV
/// cache that lives here): one device-to-device copy of `n_rows` f32 rows.
pub(super) fn copy_rows(
    dev: &CudaDevice,
    src: &Data,
    (src_row, n_rows): (usize, usize),
    dst: &mut Data,
    dst_row: usize,
) -> Result<()> {
    let row_bytes = src.cols() * 4;
    if n_rows == 0 || row_bytes == 0 {
        return Ok(());
    }
    let (from, len, to) = (src_row * row_bytes, n_rows * row_bytes, dst_row * row_bytes);
    let s = dev.input(src)?;
    let mut d = dev.in_out(dst)?;
    let view = s.slice().slice(from..from + len);
    let mut target = d.slice().slice_mut(to..to + len);
    dev.stream
        .memcpy_dtod(&view, &mut target)
        .map_err(dev_err)?;
    d.finish(dev)
}

/// The in-place element-wise ops.
pub(super) enum Unary {
    /// [`flm_core::Op::Gelu`].
    Gelu,
    /// [`flm_core::Op::Scale`].
    Scale(f32),
}

/// [`flm_core::Op::Gelu`] or [`flm_core::Op::Scale`], in place.
pub(super) fn unary(dev: &CudaDevice, x: &mut Data, op: Unary) -> Result<()> {
    let n = x.numel();
    if n == 0 {
        return Ok(());
    }
    let mut xd = dev.in_out(x)?;
    let n_i = n as i64;
    match op {
        Unary::Gelu => {
            let f = dev.function(Kernel::Gelu)?;
            let mut b = dev.stream.launch_builder(f);
            b.arg(xd.slice()).arg(&n_i);
            // SAFETY: n floats, as `gelu(float*, long)` uses them.
            unsafe { b.launch(elem_grid(n)?) }.map_err(dev_err)?;
        }
        Unary::Scale(alpha) => {
            let f = dev.function(Kernel::Scale)?;
            let mut b = dev.stream.launch_builder(f);
            b.arg(xd.slice()).arg(&alpha).arg(&n_i);
            // SAFETY: n floats, as `scale(float*, float, long)` uses them.
            unsafe { b.launch(elem_grid(n)?) }.map_err(dev_err)?;
        }
    }
    xd.finish(dev)
}

/// [`flm_core::Op::Argmax`]: only the ids come back to the host (the sampled id out).
pub(super) fn argmax(dev: &CudaDevice, input: &Data, output: &mut [u32]) -> Result<()> {
    if output.is_empty() {
        return Ok(());
    }
    let x = dev.input(input)?;
    let mut ids = dev.zeros::<u32>(output.len())?;
    let cols = int(input.cols())?;
    let f = dev.function(Kernel::ArgmaxRows)?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(x.slice()).arg(&cols).arg(&mut ids);
    // SAFETY: x holds rows × cols floats and ids one value per row, as
    // `argmax_rows(const float*, int, unsigned*)` uses them.
    unsafe { b.launch(grid((output.len(), 1, 1), ROW_THREADS, 0)?) }.map_err(dev_err)?;
    dev.download(&ids, output)
}

impl CudaDevice {
    /// The `k` largest values of each row of `logits` f32 `[n, cols]` and their indices,
    /// largest first, the smaller index first on ties, computed on the GPU so that only
    /// `n · k` ids and values cross to the host (for top-k sampling). Past a row's non-NaN
    /// values the ids are `u32::MAX` and the values −∞.
    ///
    /// Errors: [`Error::InvalidArgument`] unless `0 < k <= cols`; [`Error::DType`] for
    /// non-f32 logits; [`Error::Device`] when the launch fails.
    pub fn top_k(&self, logits: &Data, k: usize) -> Result<(Vec<u32>, Vec<f32>)> {
        let (n, cols) = (logits.rows(), logits.cols());
        if k == 0 || k > cols {
            return Err(Error::InvalidArgument(format!(
                "top-k of {k} from {cols} values"
            )));
        }
        let mut ids = vec![0u32; n * k];
        let mut values = vec![0f32; n * k];
        if n == 0 {
            return Ok((ids, values));
        }
        if logits.dtype() != flm_core::DataType::F32 {
            return Err(Error::DType {
                op: "top_k",
                msg: format!("{} logits", logits.dtype()),
            });
        }
        let x = self.input(logits)?;
        let (mut ids_d, mut values_d) = (self.zeros::<u32>(n * k)?, self.zeros::<f32>(n * k)?);
        let (cols_i, k_i) = (int(cols)?, int(k)?);
        let f = self.function(Kernel::TopKRows)?;
        let mut b = self.stream.launch_builder(f);
        b.arg(x.slice())
            .arg(&cols_i)
            .arg(&k_i)
            .arg(&mut ids_d)
            .arg(&mut values_d);
        // SAFETY: x holds n × cols floats, ids and values n × k entries each, as
        // `top_k_rows(const float*, int, int, unsigned*, float*)` uses them.
        unsafe { b.launch(grid((n, 1, 1), ROW_THREADS, 0)?) }.map_err(dev_err)?;
        self.download(&ids_d, &mut ids)?;
        self.download(&values_d, &mut values)?;
        Ok((ids, values))
    }
}
