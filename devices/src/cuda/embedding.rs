//! [`flm_core::Op::Embedding`] on [`super::CudaDevice`] (`kernels/embedding.cu`): float
//! tables as they are, int8/int4 ones in the GPU GEMV layout ([`crate::gemv_layout`]) they
//! have in GPU memory (a host table packed once, the copy a tied classifier reads too),
//! ones of ggml's blocks (K-quants, Q5_0, Q8_0, IQ4_NL, IQ4_XS, MXFP4) in their rows as they are.

use cudarc::driver::{CudaView, LaunchArgs, PushKernelArg};
use flm_core::{Data, Error, Result, TokenIds};

use super::dequant::QuantRows;
use super::device::CudaDevice;
use super::graph::Bound;
use super::kernels::{FloatWeight, Kernel};
use super::launch::{dev_err, grid, int};
use super::operand::Input;
use super::ROW_THREADS;
use crate::gemv_layout::GemvLayout;

/// The ids an embedding reads in GPU memory.
enum Ids<'a> {
    /// Copied in for the op, or a tensor of ids where it lives.
    Input(Input<'a>),
    /// The step's, in a captured step.
    Step(CudaView<'a, u32>),
}

/// Pushes the ids' device pointer as a kernel argument.
fn push_ids<'a>(b: &mut LaunchArgs<'a>, ids: &'a Ids<'_>) {
    match ids {
        Ids::Input(i) => b.arg(i.slice()),
        Ids::Step(v) => b.arg(v),
    };
}

/// [`flm_core::Op::Embedding`]: host ids are copied in for the op, a tensor of ids is read
/// where it lives. In a captured step, host ids must be the step's (`follows_step`) and
/// are read from its buffer; a tensor of ids is read where it lives, written before each
/// replay.
pub(super) fn embedding(
    dev: &CudaDevice,
    table: &Data,
    (tokens, follows_step): (TokenIds<'_>, bool),
    output: &mut Data,
) -> Result<()> {
    let (vocab, dim) = (table.rows(), table.cols());
    if tokens.is_empty() {
        return Ok(());
    }
    let dtype = table.dtype();
    let step = match tokens {
        TokenIds::Host(ids) => dev.step_words("Embedding", follows_step, |t, _, _| t == ids)?,
        TokenIds::Tensor(_) => None,
    };
    let ids = match (tokens, &step) {
        (TokenIds::Host(_), Some(s)) => {
            dev.bound(Bound::Vocab(vocab))?;
            Ids::Step(s.tokens())
        }
        (TokenIds::Host(ids), None) => Ids::Input(dev.input_bytes(bytemuck::cast_slice(ids))?),
        (TokenIds::Tensor(ids), _) => Ids::Input(dev.input(ids)?),
    };
    let mut out = dev.output(output)?;
    let bad = dev.zeros::<i32>(1)?;
    let (dim_i, vocab_u) = (int(dim)?, u32::try_from(vocab).unwrap_or(u32::MAX));
    let cfg = grid((tokens.len(), 1, 1), ROW_THREADS, 0)?;
    let launched = match FloatWeight::of(dtype) {
        Some(kind) => {
            let w = dev.weight(table)?;
            let f = dev.function(Kernel::Embedding(kind))?;
            let mut b = dev.stream.launch_builder(f);
            b.arg(w.slice());
            push_ids(&mut b, &ids);
            b.arg(out.slice()).arg(&dim_i).arg(&vocab_u).arg(&bad);
            // SAFETY: the arguments match `embedding_<W>(const void*, const unsigned*,
            // float*, int, unsigned, int*)`; `out` holds tokens × dim floats, the table
            // vocab × dim values of W, and the kernel reads no token id >= vocab.
            unsafe { b.launch(cfg) }
        }
        None => {
            // int8/int4 tables in the GPU GEMV layout (shared with a tied classifier's
            // Linear), ggml's blocks in their rows.
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
            b.arg(w.slice());
            push_ids(&mut b, &ids);
            b.arg(out.slice()).arg(&dim_i).arg(&vocab_u);
            rows.push(&mut b);
            b.arg(&bad);
            // SAFETY: arguments as `embedding_quant(const unsigned char*, const unsigned*,
            // float*, int, unsigned, long, int, int, int, int, long, int*)`; the table is
            // vocab rows of dim values as `rows` describes them (int8/int4 in the GPU GEMV
            // layout, ggml blocks in rows of row_bytes bytes), and ids >= vocab are not read.
            unsafe { b.launch(cfg) }
        }
    };
    launched.map_err(dev_err)?;
    let first_bad = |ids: &[u32]| ids.iter().copied().find(|&t| t as usize >= vocab);
    dev.check_flag(&bad, || {
        let id = match tokens {
            TokenIds::Host(ids) => first_bad(ids),
            // The error path only: the device's ids read back for the message.
            TokenIds::Tensor(_) => match &ids {
                Ids::Input(i) => (dev.stream.clone_dtoh(i.slice()).ok())
                    .and_then(|b| first_bad(bytemuck::cast_slice(&b))),
                Ids::Step(_) => None,
            },
        };
        Error::TokenOutOfRange {
            id: id.unwrap_or(u32::MAX),
            vocab_size: vocab,
        }
    })?;
    out.finish(dev)
}
