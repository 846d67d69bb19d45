//! [`flm_core::Op::Embedding`] on [`super::CudaDevice`] (`kernels/embedding.cu`): float
//! tables as they are, int8/int4 ones in the GPU GEMV layout ([`crate::gemv_layout`]) they
//! have in GPU memory (a host table packed once, the copy a tied classifier reads too),
//! K-quant ones in ggml's rows.

use cudarc::driver::PushKernelArg;
use flm_core::{Data, Error, Result, TokenIds};

use super::dequant::QuantRows;
use super::device::{dev_err, grid, int, CudaDevice};
use super::kernels::{FloatWeight, Kernel};
use super::ROW_THREADS;
use crate::gemv_layout::GemvLayout;

/// [`flm_core::Op::Embedding`]: host ids are copied in for the op, a tensor of ids is read
/// where it lives.
pub(super) fn embedding(
    dev: &CudaDevice,
    table: &Data,
    tokens: TokenIds<'_>,
    output: &mut Data,
) -> Result<()> {
    let (vocab, dim) = (table.rows(), table.cols());
    if tokens.is_empty() {
        return Ok(());
    }
    let dtype = table.dtype();
    let ids = match tokens {
        TokenIds::Host(ids) => dev.input_bytes(bytemuck::cast_slice(ids))?,
        TokenIds::Tensor(ids) => dev.input(ids)?,
    };
    let ids = ids.slice();
    let mut out = dev.output(output)?;
    let bad = dev.zeros::<i32>(1)?;
    let (dim_i, vocab_u) = (int(dim)?, u32::try_from(vocab).unwrap_or(u32::MAX));
    let cfg = grid((tokens.len(), 1, 1), ROW_THREADS, 0)?;
    let launched = match FloatWeight::of(dtype) {
        Some(kind) => {
            let w = dev.weight(table)?;
            let f = dev.function(Kernel::Embedding(kind))?;
            let mut b = dev.stream.launch_builder(f);
            b.arg(w.slice())
                .arg(ids)
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
            // int8/int4 tables in the GPU GEMV layout (shared with a tied classifier's
            // Linear), K-quant ones in ggml's rows.
            let layout = GemvLayout::in_gpu_memory(dtype, table.shape())?;
            let w = match &layout {
                Some(l) => dev.weight_in_layout(table, l)?,
                None => dev.weight(table)?,
            };
            let rows = QuantRows::new(dtype, dim, layout.as_ref()).map_err(|_| Error::DType {
                op: "Embedding",
                msg: format!("{dtype} table"),
            })?;
            let f = dev.function(Kernel::EmbeddingQuant)?;
            let mut b = dev.stream.launch_builder(f);
            b.arg(w.slice())
                .arg(ids)
                .arg(out.slice())
                .arg(&dim_i)
                .arg(&vocab_u);
            rows.push(&mut b);
            b.arg(&bad);
            // SAFETY: arguments as `embedding_quant(const unsigned char*, const unsigned*,
            // float*, int, unsigned, long, int, int, int, int, long, int*)`; the table is
            // vocab rows of dim values as `rows` describes them (int8/int4 in the GPU GEMV
            // layout, K-quants in ggml's rows), and ids >= vocab are not read.
            unsafe { b.launch(cfg) }
        }
    };
    launched.map_err(dev_err)?;
    let first_bad = |ids: &[u32]| ids.iter().copied().find(|&t| t as usize >= vocab);
    dev.check_flag(&bad, || {
        let id = match tokens {
            TokenIds::Host(ids) => first_bad(ids),
            // The error path only: the device's ids read back for the message.
            TokenIds::Tensor(_) => dev
                .stream
                .clone_dtoh(ids)
                .ok()
                .and_then(|b| first_bad(bytemuck::cast_slice(&b))),
        };
        Error::TokenOutOfRange {
            id: id.unwrap_or(u32::MAX),
            vocab_size: vocab,
        }
    })?;
    out.finish(dev)
}
