//! Collective communication between the ranks of a tensor-parallel model (Shoeybi et al.
//! 2019, "Megatron-LM"; TGI's `TensorParallelColumnLinear`/`RowLinear` over a process
//! group).
//!
//! A [`Communicator`] is one rank's end of a group of `world_size` ranks. Every rank calls
//! the same collectives in the same order with buffers of the same length; a collective
//! returns on every rank with the same bits. Backends:
//! - [`LocalGroup`]: the ranks are threads of one process (`--tp N`, and the tests);
//! - `MpiGroup` (cargo feature `mpi`): the ranks are the processes `mpirun` starts
//!   ([`launched_by_mpirun`] tells, without MPI, whether this process is one of them);
//! - `flm_devices::cuda::NcclGroup` (cargo feature `cuda` of flm-devices): one GPU per
//!   rank, over NCCL, started through another group (MPI or local).
//!
//! The backends whose ranks do not share memory open every collective with the exchange of
//! [`header`], so that ranks that disagree all return the same error instead of waiting.
//!
//! A rank that fails calls [`Communicator::abort`]: every rank waiting in a collective, or
//! entering one later, returns [`Error::Collective`] naming it, so that a failure ends the
//! whole group instead of leaving the others waiting.

pub mod header;
mod local;
#[cfg(feature = "mpi")]
mod mpi;

use std::time::Duration;

pub use local::LocalGroup;
#[cfg(feature = "mpi")]
pub use mpi::MpiGroup;

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

/// Whether this process is one rank of an MPI job of more than one rank, as its launcher's
/// environment says; MPI is not initialised, so this works without the `mpi` feature too.
///
/// Open MPI's `mpirun` sets `OMPI_COMM_WORLD_SIZE`; MPICH's Hydra, Intel MPI and Slurm's
/// PMI set `PMI_SIZE`. A PMIx launcher that sets only `PMIX_RANK` gives no world size:
/// there only the ranks other than 0 are known to have company.
pub fn launched_by_mpirun() -> bool {
    launch_from(|name| std::env::var(name).ok()).is_some_and(|(rank, size)| match size {
        Some(size) => size > 1,
        None => rank > 0,
    })
}

/// This process's rank and, where the launcher gives it, the world size, from the
/// environment variables `get` reads; `None` when no MPI launcher set them.
pub(crate) fn launch_from(get: impl Fn(&str) -> Option<String>) -> Option<(usize, Option<usize>)> {
    let number = |name: &str| get(name).and_then(|v| v.trim().parse::<usize>().ok());
    [
        ("OMPI_COMM_WORLD_RANK", Some("OMPI_COMM_WORLD_SIZE")),
        ("PMI_RANK", Some("PMI_SIZE")),
        ("PMIX_RANK", None),
    ]
    .into_iter()
    .find_map(|(rank, size)| Some((number(rank)?, size.and_then(number))))
}

#[cfg(test)]
mod tests {
    use super::launch_from;

    fn launch(vars: &[(&str, &str)]) -> Option<(usize, Option<usize>)> {
        launch_from(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn the_launchers_environment_gives_rank_and_size() {
        assert_eq!(launch(&[]), None);
        let ompi = [("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "3")];
        assert_eq!(launch(&ompi), Some((1, Some(3))));
        assert_eq!(
            launch(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]),
            Some((0, Some(2)))
        );
        assert_eq!(launch(&[("PMIX_RANK", "2")]), Some((2, None)));
        assert_eq!(launch(&[("PMI_RANK", "x")]), None);
    }
}
