//! [`NcclGroup`] on the GPUs present: ranks as threads over a [`LocalGroup`] bootstrap (one
//! GPU per rank, as NCCL requires), the host collectives against values the test computes
//! (the all-reduce bit for bit against the sum in rank order), the device all-reduce, and
//! lengths that differ between ranks, an operand on another GPU and an abort, each an
//! error on every rank. Each test runs the group sizes the GPUs allow (up to
//! [`MOST_RANKS`]) and skips with a message when there are too few GPUs or no `libnccl`
//! (cudarc loads it as `libnccl.so`: see [`flm_devices::cuda::nccl::available`]), so the
//! suite passes on machines without them. The start's errors, which need neither, are
//! checked everywhere.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use flm_core::comm::{Communicator, LocalGroup};
use flm_core::Error;
use flm_devices::cuda::{nccl, probe, NcclGroup};

/// The largest group the tests run.
const MOST_RANKS: usize = 4;

/// How many GPUs (ordinals 0, 1, …, up to [`MOST_RANKS`]) answer, or `None` after a line
/// saying why the test skips: no `libnccl`, or fewer than `least` GPUs.
fn gpus(least: usize) -> Option<usize> {
    if !nccl::available() {
        eprintln!(
            "skipped: libnccl.so not found (install libnccl-dev, or link libnccl.so to the \
             nvidia-nccl wheel's libnccl.so.2 in a directory on LD_LIBRARY_PATH)"
        );
        return None;
    }
    let count = (0..MOST_RANKS).take_while(|&o| probe(o).is_ok()).count();
    if count < least {
        eprintln!("skipped: needs {least} GPU(s), one per rank as NCCL requires; found {count}");
        return None;
    }
    Some(count)
}

/// Runs `f(group)` on a thread per rank of an NCCL group of `n` ranks, rank `r` on GPU
/// `r` over a [`LocalGroup`], and returns the results in rank order.
fn on_ranks<R: Send>(n: usize, f: impl Fn(&NcclGroup) -> R + Sync) -> Vec<R> {
    let ranks = LocalGroup::new(n).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .enumerate()
            .map(|(ordinal, rank)| {
                let f = &f;
                s.spawn(move || {
                    let group = NcclGroup::over(Arc::new(rank), ordinal)
                        .unwrap_or_else(|e| panic!("rank {ordinal} starts: {e}"));
                    f(&group)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Rank `rank`'s operand of step `step`: magnitudes from 1e-3 to 1e3, so that the order
/// of the sum shows in its bits.
fn operand(rank: usize, step: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let scale = [1e-3f32, 1.0, 1e3][(i + rank + step) % 3];
            scale
                * (1.0 + 0.37 * rank as f32 + 0.011 * i as f32)
                * if i % 2 == 0 { 1.0 } else { -1.0 }
        })
        .collect()
}

#[test]
fn all_reduce_sums_in_rank_order_with_the_same_bits_everywhere() {
    let Some(count) = gpus(1) else { return };
    // Growing, shrinking and empty lengths: the staging buffers grow and are reused.
    let lens = [7usize, 1, 4099, 0, 33, 70_001];
    for n in 1..=count {
        let out = on_ranks(n, |g| {
            lens.iter()
                .enumerate()
                .map(|(step, &len)| {
                    let mut x = operand(g.rank(), step, len);
                    g.all_reduce_sum(&mut x).unwrap();
                    x
                })
                .collect::<Vec<_>>()
        });
        for (step, &len) in lens.iter().enumerate() {
            let mut expect = operand(0, step, len);
            for r in 1..n {
                for (e, v) in expect.iter_mut().zip(operand(r, step, len)) {
                    *e += v;
                }
            }
            for (rank, results) in out.iter().enumerate() {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&results[step]),
                    bits(&expect),
                    "n {n} rank {rank} step {step}"
                );
            }
        }
    }
}

#[test]
fn gather_broadcast_and_barrier() {
    let Some(count) = gpus(1) else { return };
    for n in 1..=count {
        let root = n - 1;
        let out = on_ranks(n, |g| {
            let local = [g.rank() as f32, -(g.rank() as f32) - 0.5];
            let mut all = vec![0.0; 2 * n];
            g.all_gather(&local, &mut all).unwrap();
            let mut bytes: Vec<u8> = if g.rank() == root {
                (0..1000).map(|i| (i * 7 % 251) as u8).collect()
            } else {
                vec![0; 1000]
            };
            g.broadcast(&mut bytes, root).unwrap();
            g.barrier().unwrap();
            assert!(g.time_in_collectives() > std::time::Duration::ZERO);
            (all, bytes)
        });
        let expect: Vec<f32> = (0..n).flat_map(|r| [r as f32, -(r as f32) - 0.5]).collect();
        let sent: Vec<u8> = (0..1000).map(|i| (i * 7 % 251) as u8).collect();
        for (all, bytes) in out {
            assert_eq!(all, expect, "n {n}");
            assert_eq!(bytes, sent, "n {n}");
        }
    }
}

#[test]
fn the_device_all_reduce_sums_gpu_memory_in_place() {
    let Some(count) = gpus(1) else { return };
    for n in 1..=count {
        let out = on_ranks(n, |g| {
            let host: Vec<f32> = (0..513).map(|i| (g.rank() * 1000 + i) as f32).collect();
            // On the group's stream, and on another, which the group's then waits for.
            let ours = g.stream();
            let mut x = ours.clone_htod(&host).unwrap();
            g.all_reduce_sum_device(&mut x).unwrap();
            let other = ours.context().new_stream().unwrap();
            let mut y = other.clone_htod(&host).unwrap();
            g.all_reduce_sum_device(&mut y).unwrap();
            (ours.clone_dtoh(&x).unwrap(), other.clone_dtoh(&y).unwrap())
        });
        // Integers below 2^24 sum exactly in any order.
        let expect: Vec<f32> = (0..513)
            .map(|i| (0..n).map(|r| (r * 1000 + i) as f32).sum())
            .collect();
        for (x, y) in out {
            assert_eq!(x, expect, "n {n}");
            assert_eq!(y, expect, "n {n}");
        }
    }
}

#[test]
fn different_lengths_are_an_error_on_every_rank_and_the_group_goes_on() {
    if gpus(2).is_none() {
        return;
    }
    let out = on_ranks(2, |g| {
        let mut x = vec![1.0f32; 3 + g.rank()];
        let reduce = g.all_reduce_sum(&mut x).unwrap_err().to_string();
        let mut bytes = vec![0u8; 4 + g.rank()];
        let broadcast = g.broadcast(&mut bytes, 0).unwrap_err().to_string();
        let mut all = vec![0.0; 3];
        let gather = g.all_gather(&[1.0], &mut all).unwrap_err().to_string();
        // Rank 0's operand on rank 1's GPU.
        let mut z = if g.rank() == 0 {
            let (gpu1, _) = probe(1).unwrap();
            gpu1.default_stream().clone_htod(&[1.0f32; 3]).unwrap()
        } else {
            g.stream().clone_htod(&[1.0f32; 3]).unwrap()
        };
        let device = g.all_reduce_sum_device(&mut z).unwrap_err().to_string();
        let mut y = vec![2.0f32; 5];
        g.all_reduce_sum(&mut y).unwrap();
        (reduce, broadcast, gather, device, y)
    });
    for (reduce, broadcast, gather, device, y) in out {
        assert!(
            reduce.contains("[3, 4] elements, not one length"),
            "{reduce}"
        );
        assert!(
            broadcast.contains("[4, 5] elements, not one length"),
            "{broadcast}"
        );
        assert_eq!(
            gather,
            "rank 0: all-gather: its output is not world_size times its input"
        );
        assert_eq!(
            device,
            "rank 0: device all-reduce: its operand is not on the group's GPU"
        );
        assert_eq!(y, vec![4.0; 5]);
    }
}

#[test]
fn an_aborted_rank_ends_every_ranks_collectives_with_its_name() {
    if gpus(2).is_none() {
        return;
    }
    let out = on_ranks(2, |g| {
        if g.rank() == 1 {
            g.abort("out of memory");
        }
        let mut x = [1.0f32; 4];
        let first = g.all_reduce_sum(&mut x).unwrap_err().to_string();
        let later = g.barrier().unwrap_err().to_string();
        (first, later)
    });
    for (first, later) in out {
        assert_eq!(first, "rank 1: out of memory");
        assert_eq!(later, "rank 1: out of memory");
    }
}

#[test]
fn a_group_started_in_one_process_runs_on_a_thread_per_rank() {
    let Some(count) = gpus(2) else { return };
    let ordinals: Vec<usize> = (0..count).collect();
    let groups = NcclGroup::in_process(&ordinals).unwrap();
    // Each thread owns its rank, so that the ranks are dropped concurrently too.
    let out: Vec<Vec<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .into_iter()
            .map(|g| {
                s.spawn(move || {
                    let mut x = operand(g.rank(), 0, 9);
                    g.all_reduce_sum(&mut x).unwrap();
                    x
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut expect = operand(0, 0, 9);
    for r in 1..count {
        for (e, v) in expect.iter_mut().zip(operand(r, 0, 9)) {
            *e += v;
        }
    }
    for x in out {
        assert_eq!(x, expect);
    }
}

#[test]
fn a_start_that_cannot_happen_is_an_error_not_a_panic() {
    // No machine has GPU 4096: without libnccl or a GPU the start fails earlier, as well.
    let rank = LocalGroup::new(1).unwrap().pop().unwrap();
    match NcclGroup::over(Arc::new(rank), 4096) {
        Err(Error::Collective { rank: 0, msg }) => eprintln!("as expected: {msg}"),
        Err(e) => panic!("not a collective's error: {e}"),
        Ok(_) => panic!("GPU 4096 started"),
    }
    assert!(matches!(
        NcclGroup::in_process(&[]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        NcclGroup::in_process(&[0, 0]),
        Err(Error::InvalidArgument(_))
    ));
}
