//! The latency of the in-process backend's collectives (`LocalGroup`) between 2 ranks on two
//! threads: an all-reduce of one hidden state of TinyLlama (2048 f32), which a
//! tensor-parallel decode step runs twice per layer, and a barrier.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use flm_core::comm::{Communicator, LocalGroup};

/// Times `iters` calls of `op` on rank 0 while rank 1 makes as many on its own thread.
fn paired(c: &mut Criterion, name: &str, op: fn(&LocalGroup)) {
    let mut ranks = LocalGroup::new(2).expect("two ranks");
    let partner = ranks.pop().expect("rank 1");
    let rank0 = ranks.pop().expect("rank 0");
    let (tx, rx) = mpsc::channel::<u64>();
    let worker = std::thread::spawn(move || {
        for iters in rx {
            for _ in 0..iters {
                op(&partner);
            }
        }
    });
    c.bench_function(name, |b| {
        b.iter_custom(|iters| {
            tx.send(iters).expect("rank 1 runs");
            let start = Instant::now();
            for _ in 0..iters {
                op(&rank0);
            }
            start.elapsed()
        })
    });
    drop(tx);
    worker.join().expect("rank 1 ends");
}

fn collectives(c: &mut Criterion) {
    paired(c, "local_all_reduce_2048_f32_2_ranks", |g| {
        let mut x = vec![1.0f32; 2048];
        g.all_reduce_sum(&mut x).expect("all-reduce");
    });
    paired(c, "local_barrier_2_ranks", |g| {
        g.barrier().expect("barrier")
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3));
    targets = collectives
}
criterion_main!(benches);
