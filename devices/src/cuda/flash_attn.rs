//! The FlashAttention-2 prefill kernels of `kernels/flash_attn.cu` (Dao 2023): the
//! tensor-core path of [`flm_core::Op::Attention`] that [`super::attention`] takes for
//! many query rows (see its module docs for when).

use cudarc::driver::{CudaSlice, PushKernelArg};
use flm_core::Result;

use super::attention::{Operands, Scalars};
use super::device::CudaDevice;
use super::kernels::{FlashHeadDim, Kernel, KvType, FLASH_ROWS, FLASH_THREADS};
use super::launch::{arg_or_null, dev_err, grid, int};

/// Writes `out[n, n_heads × head_dim]` (f32) for the `n` query rows of `ops.q` with the
/// `flash_attn_<kv>_d<dim>` kernel of the cache's element type: a block per [`FLASH_ROWS`] rows and head.
///
/// Errors: [`flm_core::Error::Device`] when the launch fails.
pub(super) fn flash_attention(
    dev: &CudaDevice,
    (dim, kv): (FlashHeadDim, KvType),
    ops: &Operands<'_>,
    sc: &Scalars,
    n: usize,
    out: &mut CudaSlice<u8>,
) -> Result<()> {
    let n_i = int(n)?;
    let f = dev.function(Kernel::FlashAttn(dim, kv))?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(ops.q)
        .arg(ops.k)
        .arg(ops.v)
        .arg(ops.start)
        .arg(&n_i)
        .arg(&sc.n_heads)
        .arg(&sc.n_kv_heads)
        .arg(&sc.scale)
        .arg(&sc.softcap);
    arg_or_null(&mut b, ops.slopes);
    b.arg(&sc.bidirectional).arg(&sc.window).arg(out);
    // SAFETY: arguments as `flash_attn_<kv>_d<head_dim>`; q and out hold n × n_heads ×
    // head_dim floats, k and v the cache rows of n_kv_heads × head_dim elements of `kv` that the rows see
    // (the caller's contract, [`Operands`]), the slopes n_heads floats or null; the
    // kernel's shared memory is static (35,840 bytes at head_dim 128).
    unsafe {
        b.launch(grid(
            (n.div_ceil(FLASH_ROWS), sc.n_heads as usize, 1),
            FLASH_THREADS,
            0,
        )?)
    }
    .map_err(dev_err)?;
    Ok(())
}
