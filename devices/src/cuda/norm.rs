//! RMSNorm and LayerNorm on [`super::CudaDevice`] (`kernels/norm.cu`).

use cudarc::driver::PushKernelArg;
use flm_core::{Data, Error, Result};

use super::device::CudaDevice;
use super::kernels::{FloatWeight, Kernel};
use super::launch::{dev_err, grid, int};
use super::ROW_THREADS;

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
