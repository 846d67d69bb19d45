//! Linear layers: `y = x · Wᵀ + b`.
//!
//! Decode (`n == 1`) is a matrix × vector product bound by reading the weights once; prefill
//! (`n > 1`) reuses each widened weight row for all `n` input rows while it sits in L1.
//! Work is split over blocks of weight rows (output features).
//!
//! Quantised weights (int8, int4) are dotted against the input rows quantised to int8
//! blocks once per call, with integer inner products (`quant_dot.rs`).

use std::borrow::Cow;

use flm_core::quant::{self, ActBlock, BLOCK};
use flm_core::{Data, DataType, Result};
use rayon::prelude::*;

use super::quant_dot::{dot_i4, dot_i8};
use super::weights::{dot, Rows};
use super::{shape_err, PARALLEL_MIN_WORK};

/// How one output value is computed from a weight row and an input row.
enum RowDot<'a> {
    /// Float weights, widened to f32.
    Float(Rows<'a>),
    /// Quantised rows of `row_bytes` against `acts`: `blocks` activation blocks per input
    /// row.
    Quant {
        dtype: DataType,
        bytes: &'a [u8],
        row_bytes: usize,
        acts: Vec<ActBlock>,
        blocks: usize,
    },
}

impl<'a> RowDot<'a> {
    fn new(weight: &'a Data, x: &[f32], n: usize, k: usize) -> Result<RowDot<'a>> {
        let (dtype, bytes, row_bytes) = match Rows::new(weight)? {
            Rows::Quant {
                dtype,
                bytes,
                row_bytes,
            } => (dtype, bytes, row_bytes),
            rows => return Ok(RowDot::Float(rows)),
        };
        let blocks = quant::padded_cols(dtype, k) / BLOCK;
        let zero = ActBlock {
            d: 0.0,
            sum: 0,
            qs: [0; BLOCK],
        };
        let mut acts = Vec::with_capacity(n * blocks);
        let mut row = Vec::new();
        for xi in x.chunks_exact(k) {
            quant::quantize_activations(xi, &mut row);
            row.resize(blocks, zero);
            acts.extend_from_slice(&row);
        }
        Ok(RowDot::Quant {
            dtype,
            bytes,
            row_bytes,
            acts,
            blocks,
        })
    }
}

/// Output features per parallel task.
const ROWS_PER_TASK: usize = 16;

/// `output[n, m] = input[n, k] · weight[m, k]ᵀ + bias[m]` (see [`flm_core::Op::Linear`]).
pub(crate) fn linear(
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
    let w = RowDot::new(weight, x, n, k)?;
    let bias: Option<Cow<'_, [f32]>> = bias.map(|b| match b.as_f32() {
        Ok(v) => Cow::Borrowed(v),
        Err(_) => Cow::Owned(b.to_f32_vec()),
    });
    let bias = bias.as_deref();
    let out = output.as_f32_mut()?;

    // Each task fills `yt[j, i]` (the transposed output) for its block of rows j.
    let block = |j0: usize, yt: &mut [f32]| {
        let mut buf = Vec::new();
        for (dj, ys) in yt.chunks_exact_mut(n).enumerate() {
            let j = j0 + dj;
            let b = bias.map_or(0.0, |b| b[j]);
            match &w {
                RowDot::Float(rows) => {
                    let row = rows.row(j, k, &mut buf);
                    for (i, y) in ys.iter_mut().enumerate() {
                        *y = dot(&x[i * k..(i + 1) * k], row) + b;
                    }
                }
                RowDot::Quant {
                    dtype,
                    bytes,
                    row_bytes,
                    acts,
                    blocks,
                } => {
                    let row = &bytes[j * row_bytes..(j + 1) * row_bytes];
                    for (i, y) in ys.iter_mut().enumerate() {
                        let a = &acts[i * blocks..(i + 1) * blocks];
                        *y = b + match dtype.group_size() {
                            Some(g) => dot_i4(g, row, a),
                            None => dot_i8(row, a),
                        };
                    }
                }
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
