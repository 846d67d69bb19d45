//! Tensor parallelism from the command line: `--tp N` splits the model among N ranks of
//! this process, and a process started by `mpirun` is one rank of an MPI job
//! (docs/distributed.md). Rank 0 runs the command; every other rank serves its part of
//! each call rank 0 makes, then leaves the command without output.

use std::sync::Arc;

use anyhow::{ensure, Result};
use flm_core::comm::{launched_by_mpirun, Communicator};
use flm_models::llama::{LlamaWeights, SharedLlama};
use flm_models::tensor_parallel::{serve_rank, TensorParallel};
use flm_models::{ModelConfig, SharedModel};

use crate::device::Chosen;

/// What a process holds of a model after [`split`].
pub enum Part {
    /// The whole model is this process's to build (no `--tp`, no MPI job).
    Whole,
    /// Rank 0 of a tensor-parallel group: the model to run.
    Rank0(SharedModel),
    /// Another rank of an MPI job, which has served every call of rank 0: nothing is left
    /// to do.
    Served,
}

/// Whether the model is split: `--tp` above 1, or an MPI job of more than one rank.
pub fn wanted(tp: usize) -> Result<bool> {
    ensure!(tp > 0, "--tp must be at least 1");
    Ok(tp > 1 || launched_by_mpirun())
}

/// The model `config` with `weights` split as [`wanted`] says: among the ranks of the MPI
/// job this process belongs to (each process using `threads` threads), else among `tp`
/// ranks of this process sharing `threads`.
///
/// Errors: `--tp` with an MPI job, an flm built without the `mpi` feature under `mpirun`,
/// the MPI library's errors, and those of the split.
pub fn split(
    config: &ModelConfig,
    weights: &LlamaWeights,
    tp: usize,
    threads: usize,
    chosen: &Chosen,
) -> Result<Part> {
    if !wanted(tp)? {
        return Ok(Part::Whole);
    }
    if launched_by_mpirun() {
        ensure!(
            tp == 1,
            "under mpirun the ranks are its processes: leave out --tp {tp}"
        );
        return mpi(config, weights, threads, chosen);
    }
    Ok(Part::Rank0(chosen.split(config, weights, tp, threads)?))
}

/// This process's part of the model, as one rank of the group `comm` of processes: rank 0
/// keeps its part to run the command; every other rank serves its part of rank 0's calls.
fn mpi(
    config: &ModelConfig,
    weights: &LlamaWeights,
    threads: usize,
    chosen: &Chosen,
) -> Result<Part> {
    chosen.check_cpu()?;
    let comm = mpi_group()?;
    let part = SharedLlama::shard(config, weights, Arc::clone(&comm))
        .inspect_err(|e| comm.abort(&e.to_string()))?
        .with_kv_dtype(chosen.kv_dtype());
    if comm.rank() == 0 {
        return Ok(Part::Rank0(TensorParallel::over(
            config, part, comm, threads,
        )?));
    }
    serve_rank(Arc::new(part), &*comm, &chosen.exec)?;
    Ok(Part::Served)
}

/// This process's rank of its MPI job.
#[cfg(feature = "mpi")]
fn mpi_group() -> Result<Arc<dyn Communicator>> {
    Ok(Arc::new(flm_core::comm::MpiGroup::new()?))
}

#[cfg(not(feature = "mpi"))]
fn mpi_group() -> Result<Arc<dyn Communicator>> {
    anyhow::bail!(
        "this process was started by mpirun, and this flm was built without MPI: \
         cargo build --release -p flm-cli --features mpi"
    )
}
