//! Linear layers: `y = x · Wᵀ + b`.
//!
//! Decode (`n == 1`) is a matrix × vector product bound by reading the weights once; prefill
//! (`n > 1`) reuses each widened weight row for all `n` input rows while it sits in L1.
//! Work is split over blocks of weight rows (output features).
//!
//! Quantised weights (int8, int4) go to the integer kernels of `qlinear`.

use std::borrow::Cow;

use flm_core::{quant, Data, Result};
use rayon::prelude::*;

use super::qlinear::{self, QuantWeight};
use super::weights::{dot, Rows};
use super::{shape_err, Isa, PARALLEL_MIN_WORK};

/// Output features per parallel task.
const ROWS_PER_TASK: usize = 16;

/// `output[n, m] = input[n, k] · weight[m, k]ᵀ + bias[m]` (see [`flm_core::Op::Linear`]).
pub(crate) fn linear(
    isa: Isa,
    input: &Data,
    weight: &Data,
    bias: Option<&Data>,
    output: &mut Data,
) -> Result<()> {
    let (n, k) = (input.rows(), input.cols());
    let m = weight.rows();
    if weight.cols() != k
        || output.rows() != n
        || output.cols() != m
        || bias.is_some_and(|b| b.numel() != m)
        || k == 0
    {
        return Err(shape_err(
            "Linear",
            format!(
                "input {:?}, weight {:?}, bias {:?}, output {:?}",
                input.shape(),
                weight.shape(),
                bias.map(|b| b.shape().to_vec()),
                output.shape()
            ),
        ));
    }
    if n == 0 {
        // Nothing to compute (and `chunks_exact(n)` below needs `n > 0`).
        return Ok(());
    }
    let x = input.as_f32()?;
    let bias: Option<Cow<'_, [f32]>> = bias.map(|b| match b.as_f32() {
        Ok(v) => Cow::Borrowed(v),
        Err(_) => Cow::Owned(b.to_f32_vec()),
    });
    let bias = bias.as_deref();
    let out = output.as_f32_mut()?;
    let rows = match Rows::new(weight)? {
        Rows::Quant {
            dtype,
            bytes,
            row_bytes,
        } => {
            let w = QuantWeight {
                dtype,
                bytes,
                row_bytes,
                kp: quant::padded_cols(dtype, k),
            };
            return qlinear::linear(isa, &w, x, n, k, bias, out);
        }
        rows => rows,
    };

    // Each task fills `yt[j, i]` (the transposed output) for its block of rows j.
    let block = |j0: usize, yt: &mut [f32]| {
        let mut buf = Vec::new();
        for (dj, ys) in yt.chunks_exact_mut(n).enumerate() {
            let j = j0 + dj;
            let b = bias.map_or(0.0, |b| b[j]);
            let row = rows.row(j, k, &mut buf);
            for (i, y) in ys.iter_mut().enumerate() {
                *y = dot(&x[i * k..(i + 1) * k], row) + b;
            }
        }
    };
    let parallel = n * m * k >= PARALLEL_MIN_WORK;
    if n == 1 {
        if parallel {
            out.par_chunks_mut(ROWS_PER_TASK)
                .enumerate()
                .for_each(|(t, yt)| block(t * ROWS_PER_TASK, yt));
        } else {
            block(0, out);
        }
        return Ok(());
    }
    let mut yt = vec![0.0f32; m * n];
    if parallel {
        yt.par_chunks_mut(ROWS_PER_TASK * n)
            .enumerate()
            .for_each(|(t, yt)| block(t * ROWS_PER_TASK, yt));
    } else {
        block(0, &mut yt);
    }
    for (j, ys) in yt.chunks_exact(n).enumerate() {
        for (i, y) in ys.iter().enumerate() {
            out[i * m + j] = *y;
        }
    }
    Ok(())
}
