//! The in-process backend: the ranks are threads of one process, and a collective is one
//! barrier over shared slots.
//!
//! Each rank writes its operand into its slot, waits at the barrier, then reads every slot.
//! The slots are double-buffered by the parity of the collective's number, so a rank that
//! leaves a collective early writes the next one's slot while the others still read this
//! one's; it cannot reach a third before they have all arrived at the second, which they do
//! only after reading. The barrier spins briefly (a rank per core answers within a
//! microsecond, where a futex wake costs tens), then yields and sleeps, so that more ranks
//! than cores still progress.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use super::{failed, Communicator};
use crate::Result;

/// Spins before the barrier starts yielding the core.
const SPINS: u32 = 4_000;
/// Yields before it starts sleeping.
const YIELDS: u32 = 20_000;
/// The sleep of a long wait.
const NAP: Duration = Duration::from_micros(50);

/// What the ranks of one group share.
struct Shared {
    n: usize,
    arrived: AtomicUsize,
    generation: AtomicU64,
    /// Per parity, per rank: the bytes of its operand.
    slots: [Vec<RwLock<Vec<u8>>>; 2],
    failed: AtomicBool,
    /// The first failure: its rank and why.
    failure: Mutex<Option<(usize, String)>>,
}

impl Shared {
    /// The error of the group's first failure.
    fn failure(&self) -> crate::Error {
        let f = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        match &*f {
            Some((rank, why)) => failed(*rank, why.clone()),
            None => failed(0, "the group ended"),
        }
    }

    fn fail(&self, rank: usize, why: &str) {
        let mut f = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        if f.is_none() {
            *f = Some((rank, why.to_string()));
        }
        self.failed.store(true, Ordering::Release);
    }

    /// Returns once all `n` ranks have called it, or with the failure of the group.
    fn wait(&self) -> Result<()> {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.store(generation + 1, Ordering::Release);
            return Ok(());
        }
        let mut turns = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            if self.failed.load(Ordering::Acquire) {
                return Err(self.failure());
            }
            turns = turns.saturating_add(1);
            if turns < SPINS {
                std::hint::spin_loop();
            } else if turns < YIELDS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(NAP);
            }
        }
        Ok(())
    }
}

/// One rank of a group of threads in one process (`--tp N`).
pub struct LocalGroup {
    shared: Arc<Shared>,
    rank: usize,
    /// Collectives this rank has entered: their parity picks the slots.
    calls: AtomicU64,
    /// Nanoseconds spent in collectives.
    waited: AtomicU64,
}

impl LocalGroup {
    /// The `n` ranks of a new group, rank `r` at index `r`; hand each to its thread.
    ///
    /// Errors: [`crate::Error::InvalidArgument`] for `n == 0`.
    pub fn new(n: usize) -> Result<Vec<LocalGroup>> {
        if n == 0 {
            return Err(crate::Error::InvalidArgument(
                "a group needs at least one rank".into(),
            ));
        }
        let slots = || (0..n).map(|_| RwLock::new(Vec::new())).collect();
        let shared = Arc::new(Shared {
            n,
            arrived: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            slots: [slots(), slots()],
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
        });
        Ok((0..n)
            .map(|rank| LocalGroup {
                shared: Arc::clone(&shared),
                rank,
                calls: AtomicU64::new(0),
                waited: AtomicU64::new(0),
            })
            .collect())
    }

    /// Writes `operand` to this rank's slot, waits for every rank, and returns `read` of
    /// all the slots in rank order.
    fn exchange<R>(&self, operand: &[u8], read: impl FnOnce(&[&[u8]]) -> R) -> Result<R> {
        let entered = self.deposit(operand)?;
        Ok(self.collect(entered, read))
    }

    /// The first half of [`LocalGroup::exchange`]: writes `operand` to this rank's slot and
    /// waits for every rank; returns when it started and the slots' parity.
    fn deposit(&self, operand: &[u8]) -> Result<(Instant, usize)> {
        let start = Instant::now();
        let s = &*self.shared;
        if s.failed.load(Ordering::Acquire) {
            return Err(s.failure());
        }
        let parity = (self.calls.fetch_add(1, Ordering::Relaxed) % 2) as usize;
        {
            let mut slot = s.slots[parity][self.rank]
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            slot.clear();
            slot.extend_from_slice(operand);
        }
        s.wait()?;
        Ok((start, parity))
    }

    /// The second half of [`LocalGroup::exchange`]: `read` of the slots `deposit` filled.
    fn collect<R>(&self, (start, parity): (Instant, usize), read: impl FnOnce(&[&[u8]]) -> R) -> R {
        let guards: Vec<_> = self.shared.slots[parity]
            .iter()
            .map(|slot| slot.read().unwrap_or_else(PoisonError::into_inner))
            .collect();
        let views: Vec<&[u8]> = guards.iter().map(|g| g.as_slice()).collect();
        let out = read(&views);
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.waited.fetch_add(nanos, Ordering::Relaxed);
        out
    }

    /// The error of a collective whose ranks passed operands of different lengths.
    fn mismatch(&self, what: &str, lens: impl Iterator<Item = usize>) -> crate::Error {
        let lens: Vec<usize> = lens.collect();
        failed(
            self.rank,
            format!("{what}: the ranks passed {lens:?} bytes, not one length"),
        )
    }
}

/// The f32 values of native-endian bytes.
fn floats(bytes: &[u8]) -> impl Iterator<Item = f32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

impl Communicator for LocalGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.n
    }

    fn all_reduce_sum(&self, x: &mut [f32]) -> Result<()> {
        let len = std::mem::size_of_val(x);
        let entered = self.deposit(bytemuck::cast_slice(x))?;
        self.collect(entered, |slots| {
            if slots.iter().any(|s| s.len() != len) {
                return Err(self.mismatch("all-reduce", slots.iter().map(|s| s.len())));
            }
            for (a, v) in x.iter_mut().zip(floats(slots[0])) {
                *a = v;
            }
            for slot in &slots[1..] {
                for (a, v) in x.iter_mut().zip(floats(slot)) {
                    *a += v;
                }
            }
            Ok(())
        })
    }

    fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<()> {
        let n = self.shared.n;
        if out.len() != n * local.len() {
            self.abort("all-gather: the output is not world_size times the input");
            return Err(self.shared.failure());
        }
        let bytes: &[u8] = bytemuck::cast_slice(local);
        self.exchange(bytes, |slots| {
            if slots.iter().any(|s| s.len() != bytes.len()) {
                return Err(self.mismatch("all-gather", slots.iter().map(|s| s.len())));
            }
            for (dst, slot) in out.chunks_exact_mut(local.len().max(1)).zip(slots) {
                for (d, v) in dst.iter_mut().zip(floats(slot)) {
                    *d = v;
                }
            }
            Ok(())
        })?
    }

    fn broadcast(&self, bytes: &mut [u8], root: usize) -> Result<()> {
        if root >= self.shared.n {
            self.abort(&format!("broadcast from rank {root}, which is not one"));
            return Err(self.shared.failure());
        }
        let operand = if self.rank == root {
            bytes.to_vec()
        } else {
            Vec::new()
        };
        let len = bytes.len();
        self.exchange(&operand, |slots| {
            let from = slots[root];
            if from.len() != len {
                return Err(failed(
                    self.rank,
                    format!(
                        "broadcast: rank {root} sent {} bytes, rank {} expected {len}",
                        from.len(),
                        self.rank
                    ),
                ));
            }
            bytes.copy_from_slice(from);
            Ok(())
        })?
    }

    fn barrier(&self) -> Result<()> {
        self.exchange(&[], |_| ())
    }

    fn abort(&self, why: &str) {
        self.shared.fail(self.rank, why);
    }

    fn time_in_collectives(&self) -> Duration {
        Duration::from_nanos(self.waited.load(Ordering::Relaxed))
    }
}

impl Drop for LocalGroup {
    /// A rank that goes away ends the group, so that no other rank waits for it forever.
    fn drop(&mut self) {
        self.shared.fail(self.rank, "left the group");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f(rank)` on a thread per rank of a group of `n` and returns their results in
    /// rank order.
    fn on_ranks<R: Send>(n: usize, f: impl Fn(&LocalGroup) -> R + Sync) -> Vec<R> {
        let group = LocalGroup::new(n).unwrap();
        std::thread::scope(|s| {
            let handles: Vec<_> = group.iter().map(|g| s.spawn(|| f(g))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn all_reduce_sums_in_rank_order_with_the_same_bits_everywhere() {
        for n in [1, 2, 3, 4] {
            let out = on_ranks(n, |g| {
                let mut results = Vec::new();
                for step in 0..50 {
                    let r = g.rank() as f32;
                    let mut x: Vec<f32> =
                        (0..7).map(|i| 0.1 * r + i as f32 + step as f32).collect();
                    g.all_reduce_sum(&mut x).unwrap();
                    results.push(x);
                }
                results
            });
            for step in 0..50 {
                let expect: Vec<f32> = (0..7)
                    .map(|i| {
                        (0..n).fold(0.0f32, |acc, r| {
                            let v = 0.1 * r as f32 + i as f32 + step as f32;
                            if r == 0 {
                                v
                            } else {
                                acc + v
                            }
                        })
                    })
                    .collect();
                for rank in &out {
                    assert_eq!(rank[step], expect, "n {n} step {step}");
                }
            }
        }
    }

    #[test]
    fn gather_broadcast_and_barrier() {
        let out = on_ranks(3, |g| {
            let local = [g.rank() as f32; 2];
            let mut all = [0.0; 6];
            g.all_gather(&local, &mut all).unwrap();
            let mut bytes = if g.rank() == 1 { *b"flm!" } else { [0; 4] };
            g.broadcast(&mut bytes, 1).unwrap();
            g.barrier().unwrap();
            (all, bytes)
        });
        for (all, bytes) in out {
            assert_eq!(all, [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]);
            assert_eq!(&bytes, b"flm!");
        }
    }

    #[test]
    fn a_failed_rank_ends_the_others_collectives_with_its_name() {
        let out = on_ranks(3, |g| {
            if g.rank() == 2 {
                g.abort("out of memory");
                return None;
            }
            let mut x = [1.0f32; 4];
            Some(g.all_reduce_sum(&mut x).unwrap_err().to_string())
        });
        for msg in out.into_iter().flatten() {
            assert_eq!(msg, "rank 2: out of memory");
        }
    }

    #[test]
    fn different_lengths_are_an_error_on_every_rank() {
        let out = on_ranks(2, |g| {
            let mut x = vec![1.0f32; 3 + g.rank()];
            g.all_reduce_sum(&mut x).unwrap_err().to_string()
        });
        for msg in out {
            assert!(msg.contains("not one length"), "{msg}");
        }
    }

    #[test]
    fn a_rank_that_leaves_ends_the_group() {
        let mut group = LocalGroup::new(2).unwrap();
        drop(group.pop());
        let e = group[0].barrier().unwrap_err().to_string();
        assert_eq!(e, "rank 1: left the group");
    }
}
