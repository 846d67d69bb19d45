//! The MPI backend: the ranks are the processes of `mpirun -np N`, over `MPI_COMM_WORLD`
//! (the `mpi` crate, rsmpi).
//!
//! Every collective starts with the exchange of [`super::header`]: each rank all-gathers
//! a header, and every rank checks the same headers, so that a mismatch is the same
//! [`Error::Collective`](crate::Error::Collective) on every rank and never reaches MPI,
//! which would truncate, read past a buffer or wait forever. The sum of an all-reduce is
//! an all-gather then a sum in rank order on every rank, since `MPI_Allreduce` leaves its
//! order of operations to the implementation and the bits must be those of
//! [`LocalGroup`](super::LocalGroup).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use mpi::environment::{Threading, Universe};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Root as _};

use super::header::{agree, name, Header, ALL_GATHER, ALL_REDUCE, BARRIER, BROADCAST};
use super::{failed, launch_from, Communicator};
use crate::Result;

/// [`agree`], then MPI's own limit: its counts are C ints, and an all-gather receives
/// world_size of them at once.
fn agree_mpi(headers: &[Header], me: usize) -> Result<usize> {
    let len = agree(headers, me)?;
    if (len as u64).saturating_mul(headers.len() as u64) <= i32::MAX as u64 {
        return Ok(len);
    }
    let what = name(headers[me][0]);
    Err(failed(
        me,
        format!("{what}: {len} elements per rank is more than one MPI call moves"),
    ))
}

/// What the collectives reuse from one call to the next.
#[derive(Default)]
struct Scratch {
    /// Every rank's header, rank after rank.
    headers: Vec<Header>,
    /// Every rank's operand, rank after rank.
    gathered: Vec<f32>,
}

/// This process's rank of the MPI job (`mpirun -np N`), over `MPI_COMM_WORLD`.
///
/// One per process: MPI is initialised by [`MpiGroup::new`] and finalised when the group is
/// dropped, which must happen on the thread that created it (MPI's rule for its "main
/// thread"). The collectives may be called from any thread: a lock keeps them one at a
/// time, as `MPI_THREAD_SERIALIZED` requires.
pub struct MpiGroup {
    rank: usize,
    n: usize,
    /// Held during a collective; its scratch buffers.
    scratch: Mutex<Scratch>,
    /// Nanoseconds spent in collectives.
    waited: AtomicU64,
    /// MPI stays initialised while this lives.
    _universe: Universe,
}

impl MpiGroup {
    /// Initialises MPI (`MPI_Init_thread` with `MPI_THREAD_SERIALIZED`) and returns this
    /// process's rank of `MPI_COMM_WORLD`; a process not started by `mpirun` is a group of
    /// one.
    ///
    /// Errors: [`crate::Error::Collective`] when MPI was initialised before in this process
    /// (by another `MpiGroup` included, even one since dropped) or the library does not
    /// allow calls from more than one thread. An MPI library that cannot start at all ends
    /// the process itself, as MPI's default error handler does.
    pub fn new() -> Result<MpiGroup> {
        let env_rank = launch_from(|name| std::env::var(name).ok()).map_or(0, |(rank, _)| rank);
        let (universe, threading) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| {
                failed(
                    env_rank,
                    "MPI was initialised before in this process (one MpiGroup per process)",
                )
            })?;
        if !matches!(threading, Threading::Serialized | Threading::Multiple) {
            return Err(failed(
                env_rank,
                format!(
                    "the MPI library provides {threading:?} threading, not the Serialized \
                     that calls from the engine's threads need"
                ),
            ));
        }
        let world = universe.world();
        // MPI ranks and sizes are non-negative C ints.
        let (rank, n) = (world.rank() as usize, world.size() as usize);
        Ok(MpiGroup {
            rank,
            n,
            scratch: Mutex::new(Scratch::default()),
            waited: AtomicU64::new(0),
            _universe: universe,
        })
    }

    /// Runs collective `kind` under the lock: all-gathers the headers, agrees on the length
    /// (see [`agree_mpi`]), then `body(world, len, scratch)` moves the data.
    fn collective<R>(
        &self,
        kind: u64,
        len: usize,
        root: usize,
        invalid: bool,
        body: impl FnOnce(&SimpleCommunicator, usize, &mut Scratch) -> R,
    ) -> Result<R> {
        let start = Instant::now();
        let mut scratch = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        let world = SimpleCommunicator::world();
        let header: Header = [kind, len as u64, root as u64, u64::from(invalid)];
        scratch.headers.resize(self.n, [0; 4]);
        world.all_gather_into(&header[..], scratch.headers.as_flattened_mut());
        let agreed =
            agree_mpi(&scratch.headers, self.rank).map(|len| body(&world, len, &mut scratch));
        drop(scratch);
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.waited.fetch_add(nanos, Ordering::Relaxed);
        agreed
    }
}

impl Communicator for MpiGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.n
    }

    fn all_reduce_sum(&self, x: &mut [f32]) -> Result<()> {
        self.collective(ALL_REDUCE, x.len(), 0, false, |world, len, scratch| {
            scratch.gathered.resize(self.n * len, 0.0);
            world.all_gather_into(&*x, &mut scratch.gathered[..]);
            // Rank 0's operand, then each other rank's added in rank order, as LocalGroup.
            let mut ranks = scratch.gathered.chunks_exact(len.max(1));
            if let Some(first) = ranks.next() {
                x.copy_from_slice(first);
            }
            for operand in ranks {
                for (a, v) in x.iter_mut().zip(operand) {
                    *a += v;
                }
            }
        })
    }

    fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<()> {
        let invalid = out.len() != self.n * local.len();
        self.collective(ALL_GATHER, local.len(), 0, invalid, |world, _, _| {
            world.all_gather_into(local, out);
        })
    }

    fn broadcast(&self, bytes: &mut [u8], root: usize) -> Result<()> {
        let invalid = root >= self.n;
        self.collective(BROADCAST, bytes.len(), root, invalid, |world, _, _| {
            // `agree` checked that root is a rank, so it fits MPI's C int.
            world.process_at_rank(root as i32).broadcast_into(bytes);
        })
    }

    fn barrier(&self) -> Result<()> {
        // The header exchange is the barrier: no rank holds every rank's header before
        // every rank has sent its own.
        self.collective(BARRIER, 0, 0, false, |_, _, _| ())
    }

    /// Prints `rank R: why` to stderr and ends the whole job (`MPI_Abort` on
    /// `MPI_COMM_WORLD`); the lock is not taken, since a collective in progress on another
    /// thread may be the one that never returns.
    fn abort(&self, why: &str) {
        eprintln!("rank {}: {why}", self.rank);
        SimpleCommunicator::world().abort(1)
    }

    fn time_in_collectives(&self) -> Duration {
        Duration::from_nanos(self.waited.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_than_one_mpi_call_moves_is_an_error() {
        assert_eq!(agree_mpi(&[[BROADCAST, 7, 0, 0]; 3], 1).unwrap(), 7);
        let huge = [[BROADCAST, 1 << 30, 0, 0]; 2];
        assert_eq!(
            agree_mpi(&huge, 0).unwrap_err().to_string(),
            "rank 0: broadcast: 1073741824 elements per rank is more than one MPI call moves"
        );
    }
}
