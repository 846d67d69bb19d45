//! [`flm_core::Op::Embedding`] on [`super::CudaDevice`] (`kernels/embedding.cu`).

use cudarc::driver::PushKernelArg;
use flm_core::{quant, Data, Error, Result};

use super::device::{dev_err, grid, int, CudaDevice};
use super::graph::{Bound, StepWords};
use super::kernels::{int4_form_code, k_quant_code, FloatWeight, Kernel};
use super::ROW_THREADS;

/// [`flm_core::Op::Embedding`] of `tokens`, which in a captured step are read from the
/// step's buffer when the op follows the step (`follows_step`).
pub(super) fn embedding(
    dev: &CudaDevice,
    table: &Data,
    (tokens, follows_step): (&[u32], bool),
    output: &mut Data,
) -> Result<()> {
    let (vocab, dim) = (table.rows(), table.cols());
    if tokens.is_empty() {
        return Ok(());
    }
    let w = dev.weight(table)?;
    let step = dev.step_words("Embedding", follows_step, |t, _, _| t == tokens)?;
    let ids = dev.step_or_upload(step.as_ref(), StepWords::tokens, tokens)?;
    let ids = ids.view();
    dev.bound(Bound::Vocab(vocab))?;
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
