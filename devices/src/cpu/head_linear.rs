//! One Linear per head ([`flm_core::Op::HeadLinear`]): multi-head latent attention's
//! absorbed projections (DeepSeek-V2, §2.1.2).
//!
//! Each head's columns of the input are gathered into a contiguous matrix, multiplied by
//! the head's weight with the Linear kernels (so every level and batch shape gives the
//! bits of [`flm_core::Op::Linear`]), and the product is written to the head's columns of
//! the output. The heads run as one parallel loop: a head's matrix is small (64K weights
//! in DeepSeek-V2-Lite), and a fork and join of the threads per head cost more than its
//! product in decode. The matrices live in a per-thread scratch that only grows, so a warm
//! decode step allocates nothing.

use std::cell::Cell;

use flm_core::{Data, Result};
use rayon::prelude::*;

use super::linear;
use super::qlinear::LinearLevel;
use super::scratch::{self, tensor};

/// Per head, the gathered input `[n, in]` and the product `[n, out]`.
#[derive(Default)]
struct Scratch {
    heads: Vec<(Option<Data>, Option<Data>)>,
}

thread_local! {
    static SCRATCH: Cell<Scratch> = Cell::new(Scratch::default());
}

/// `output[:, h·out..(h + 1)·out] = input[:, h·in..(h + 1)·in] · weights[h]ᵀ` for every
/// head `h` (shapes checked by the contract).
pub(crate) fn head_linear(
    level: LinearLevel,
    input: &Data,
    weights: &[Data],
    output: &mut Data,
) -> Result<()> {
    let Some(first) = weights.first() else {
        return Ok(());
    };
    let (n, k, m) = (input.rows(), first.cols(), first.rows());
    let (width_in, width_out) = (input.cols(), output.cols());
    scratch::with(&SCRATCH, |s| {
        let src = input.as_f32()?;
        s.heads.resize_with(weights.len(), Default::default);
        s.heads
            .par_iter_mut()
            .zip(weights)
            .enumerate()
            .try_for_each(|(h, ((x, y), w))| {
                let x = tensor(x, &[n, k])?;
                for (dst, row) in x
                    .as_f32_mut()?
                    .chunks_exact_mut(k)
                    .zip(src.chunks_exact(width_in))
                {
                    dst.copy_from_slice(&row[h * k..][..k]);
                }
                linear::linear(level, x, w, None, tensor(y, &[n, m])?)
            })?;
        let out = output.as_f32_mut()?;
        for (h, (_, y)) in s.heads.iter().enumerate() {
            let y = y
                .as_ref()
                .map(Data::as_f32)
                .transpose()?
                .unwrap_or_default();
            for (row, y) in out.chunks_exact_mut(width_out).zip(y.chunks_exact(m)) {
                row[h * m..][..m].copy_from_slice(y);
            }
        }
        Ok(())
    })
}
