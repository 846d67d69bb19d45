//! [`flm_core::Op::Embedding`] on [`super::CudaDevice`] (`kernels/embedding.cu`).

use cudarc::driver::{CudaView, LaunchArgs, PushKernelArg};
use flm_core::{quant, Data, Error, Result, TokenIds};

use super::device::{dev_err, grid, int, CudaDevice};
use super::graph::Bound;
use super::kernels::{int4_form_code, k_quant_code, FloatWeight, Kernel};
use super::operand::Input;
use super::ROW_THREADS;

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
    let w = dev.weight(table)?;
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
    let launched = match FloatWeight::of(table.dtype()) {
        Some(kind) => {
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
            b.arg(w.slice());
            push_ids(&mut b, &ids);
            b.arg(out.slice()).arg(&dim_i).arg(&vocab_u);
            let form = int4_form_code(table.dtype());
            let kq = k_quant_code(table.dtype());
            b.arg(&row_bytes)
                .arg(&padded)
                .arg(&group)
                .arg(&form)
                .arg(&kq)
                .arg(&bad);
            // SAFETY: arguments as `embedding_quant`; the table is vocab rows of
            // `row_bytes` in the .flm layout of its dtype (`kq` names a K-quant one), and
            // ids >= vocab are not read.
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
