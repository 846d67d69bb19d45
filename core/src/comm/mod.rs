//! Collective communication between the ranks of a tensor-parallel model (Shoeybi et al.
//! 2019, "Megatron-LM"; TGI's `TensorParallelColumnLinear`/`RowLinear` over a process
//! group).
//!
//! A [`Communicator`] is one rank's end of a group of `world_size` ranks. Every rank calls
//! the same collectives in the same order with buffers of the same length; a collective
//! returns on every rank with the same bits. Backends:
//! - [`LocalGroup`]: the ranks are threads of one process (`--tp N`, and the tests);
//! - MPI (cargo feature `mpi`): ranks are the processes `mpirun` starts.
//!
//! A rank that fails calls [`Communicator::abort`]: every rank waiting in a collective, or
//! entering one later, returns [`Error::Collective`] naming it, so that a failure ends the
//! whole group instead of leaving the others waiting.

mod local;

use std::time::Duration;

pub use local::LocalGroup;

use crate::{Data, Error, Result};

/// One rank's end of a group of ranks that run one model together.
pub trait Communicator: Send + Sync {
    /// This rank, `0..world_size`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world_size(&self) -> usize;

    /// `x ← Σ_r x_r` element by element over the ranks, summed in rank order (`((x_0 + x_1)
    /// + x_2) + …`), so that every rank holds the same bits.
    ///
    /// Errors: [`Error::Collective`] when a rank failed or the lengths differ.
    fn all_reduce_sum(&self, x: &mut [f32]) -> Result<()>;

    /// `out ← [local_0, local_1, …]`: each rank's `local` (of one length on every rank) in
    /// rank order; `out.len()` is `world_size · local.len()`.
    ///
    /// Errors: [`Error::Collective`] when a rank failed or the lengths differ.
    fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<()>;

    /// Copies rank `root`'s `bytes` into every other rank's `bytes` (of the same length).
    ///
    /// Errors: [`Error::Collective`] when a rank failed, the lengths differ, or `root` is not
    /// a rank.
    fn broadcast(&self, bytes: &mut [u8], root: usize) -> Result<()>;

    /// Returns once every rank has called it.
    ///
    /// Errors: [`Error::Collective`] when a rank failed.
    fn barrier(&self) -> Result<()>;

    /// Ends the group because this rank failed (`why`): the collectives of every rank then
    /// return [`Error::Collective`] naming this rank. An MPI group ends the job.
    fn abort(&self, why: &str);

    /// The time this rank has spent inside collectives (waiting for the others included).
    fn time_in_collectives(&self) -> Duration;
}

/// [`Communicator::all_reduce_sum`] over an f32 host tensor.
///
/// Errors: [`Error::DType`] for another dtype or a tensor outside host memory; those of
/// the collective.
pub fn all_reduce_data(comm: &dyn Communicator, x: &mut Data) -> Result<()> {
    comm.all_reduce_sum(x.as_f32_mut()?)
}

/// The error of a collective that rank `rank` ended with `msg`.
pub(crate) fn failed(rank: usize, msg: impl Into<String>) -> Error {
    Error::Collective {
        rank,
        msg: msg.into(),
    }
}
