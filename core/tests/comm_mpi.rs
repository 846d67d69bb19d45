//! The MPI backend ([`MpiGroup`]) under a real `mpirun`, which starts this test executable
//! once per rank: with `FLM_COMM_MPI_MODE` set, its test `rank` is that rank's program, and
//! the other tests start it (`mpirun --oversubscribe -np N <this executable> --exact rank`).
//!
//! Each rank checks its results against values this file computes on its own (not by a
//! backend) and on a mismatch ends the job through [`Communicator::abort`], which names it.
//! Needs `mpirun` on PATH (Debian: openmpi-bin); built only with the `mpi` feature.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Seek};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use flm_core::comm::{launched_by_mpirun, Communicator, MpiGroup};

/// What a rank runs: `check`, `kill`, `abort` or `latency`.
const MODE: &str = "FLM_COMM_MPI_MODE";
/// The number of ranks the test started.
const NP: &str = "FLM_COMM_MPI_NP";
/// Where the rank that kills itself writes when it does (nanoseconds since the epoch).
const KILL_AT: &str = "FLM_COMM_MPI_KILL_AT";

/// One `mpirun` at a time: the machine's cores are few and the latencies are measured.
static MPIRUN: Mutex<()> = Mutex::new(());

/// The program of one rank, when a test below started this executable under `mpirun`;
/// elsewhere it returns at once.
#[test]
fn rank() {
    let Ok(mode) = std::env::var(MODE) else {
        return;
    };
    let g = MpiGroup::new().expect("MPI initialises");
    match mode.as_str() {
        "check" => check(&g),
        "kill" => kill(&g),
        "abort" => abort(&g),
        "latency" => latency(&g),
        _ => g.abort(&format!("unknown {MODE} {mode:?}")),
    }
}

/// Ends the job, naming this rank, unless `ok`.
fn ensure(g: &MpiGroup, ok: bool, what: impl FnOnce() -> String) {
    if !ok {
        g.abort(&what());
    }
}

/// Element `i` of rank `rank`'s operand at step `step`: magnitudes from 1e-3 to 1e7 of
/// both signs, so that the order of a sum of three or more changes its bits.
fn operand(rank: usize, step: usize, i: usize) -> f32 {
    let k = (rank * 7919 + step * 104_729 + i * 31) % 1000;
    let scale = [1e-3, 1.0, 1e4, 1e7][(rank + i) % 4];
    (k as f32 - 500.0) * scale
}

/// Every collective with rank-dependent data, then each kind of disagreement, which must
/// be an error on every rank and leave the group usable.
fn check(g: &MpiGroup) {
    let (rank, n) = (g.rank(), g.world_size());
    let np: usize = std::env::var(NP)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    ensure(g, n == np && rank < n, || {
        format!("rank {rank} of {n}, not of {np}")
    });
    ensure(g, launched_by_mpirun() == (n > 1), || {
        "launched_by_mpirun() does not see mpirun".into()
    });

    // All-reduce: the sum in rank order, bit for bit, of lengths 0 to 4099.
    let mut order_matters = 0;
    for step in 0..40 {
        let len = [0, 1, 7, 2048, 4099][step % 5];
        let mut x: Vec<f32> = (0..len).map(|i| operand(rank, step, i)).collect();
        g.all_reduce_sum(&mut x).unwrap();
        for (i, got) in x.iter().enumerate() {
            let in_order = (1..n).fold(operand(0, step, i), |a, r| a + operand(r, step, i));
            let reversed = (0..n - 1)
                .rev()
                .fold(operand(n - 1, step, i), |a, r| a + operand(r, step, i));
            order_matters += usize::from(in_order.to_bits() != reversed.to_bits());
            ensure(g, got.to_bits() == in_order.to_bits(), || {
                format!("all-reduce step {step} element {i}: {got}, expected {in_order}")
            });
        }
    }
    // Else the data above would not show a sum in another order.
    ensure(g, n < 3 || order_matters > 0, || {
        "no element of the data has a sum that depends on the order".into()
    });

    // All-gather: every rank's operand in rank order.
    let local: Vec<f32> = (0..5).map(|i| operand(rank, 99, i)).collect();
    let mut all = vec![f32::NAN; 5 * n];
    g.all_gather(&local, &mut all).unwrap();
    for (j, got) in all.iter().enumerate() {
        let want = operand(j / 5, 99, j % 5);
        ensure(g, got.to_bits() == want.to_bits(), || {
            format!("all-gather element {j}: {got}, expected {want}")
        });
    }

    // Broadcast from every root.
    for root in 0..n {
        let pattern: Vec<u8> = (0..13 + root).map(|j| (root * 31 + j) as u8).collect();
        let mut bytes = if rank == root {
            pattern.clone()
        } else {
            vec![0xAA; pattern.len()]
        };
        g.broadcast(&mut bytes, root).unwrap();
        ensure(g, bytes == pattern, || {
            format!("broadcast from {root}: {bytes:?}")
        });
    }
    for _ in 0..3 {
        g.barrier().unwrap();
    }

    // Disagreements: the same error on every rank, and the group still works afterwards.
    let expect_err = |r: flm_core::Result<()>, what: &str, want: &str| {
        let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
        ensure(g, msg.contains(want), || {
            format!("{what}: expected an error with {want:?}, got {msg:?}")
        });
    };
    if n > 1 {
        let mut x = vec![1.0f32; 3 + rank];
        let lens = format!("{:?}", (0..n).map(|r| 3 + r).collect::<Vec<_>>());
        expect_err(
            g.all_reduce_sum(&mut x),
            "all-reduce of different lengths",
            &format!("all-reduce: the ranks passed {lens} elements, not one length"),
        );
        let mut bytes = vec![0u8; 4 + rank];
        expect_err(
            g.broadcast(&mut bytes, 0),
            "broadcast of different lengths",
            "not one length",
        );
    }
    let short = if rank == n - 1 { 5 * n - 1 } else { 5 * n };
    let mut out = vec![0.0; short];
    expect_err(
        g.all_gather(&local, &mut out),
        "all-gather into a short output",
        &format!(
            "rank {}: all-gather: its output is not world_size times its input",
            n - 1
        ),
    );
    expect_err(
        g.broadcast(&mut [0u8; 2], n),
        "broadcast from a rank that is not one",
        "broadcast: its root is not a rank",
    );
    let mut ones = vec![1.0f32; 9];
    g.all_reduce_sum(&mut ones).unwrap();
    ensure(g, ones.iter().all(|&v| v == n as f32), || {
        format!("all-reduce after the errors: {ones:?}")
    });

    let again = MpiGroup::new()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    ensure(g, again.contains("initialised before"), || {
        format!("a second MpiGroup: {again:?}")
    });
    ensure(g, g.time_in_collectives() > Duration::ZERO, || {
        "no time in collectives".into()
    });
    println!("rank {rank} of {n}: every check passed");
}

/// All-reduces in a loop; rank 1 kills itself (SIGKILL) in the middle, having written the
/// time to `$FLM_COMM_MPI_KILL_AT`.
fn kill(g: &MpiGroup) {
    for step in 0..100_000 {
        if step == 100 && g.rank() == 1 {
            let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
            std::fs::write(std::env::var(KILL_AT).unwrap(), at.as_nanos().to_string()).unwrap();
            // SAFETY: kill(2) with this process's own id.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let mut x = [step as f32; 64];
        g.all_reduce_sum(&mut x).unwrap();
    }
}

/// Rank 1 aborts while the others wait in an all-reduce.
fn abort(g: &MpiGroup) {
    g.barrier().unwrap();
    if g.rank() == 1 {
        g.abort("deliberately, in the test");
    }
    let mut x = [1.0f32; 4];
    g.all_reduce_sum(&mut x).unwrap();
}

/// Rank 0 prints the median, 10th and 90th percentile of 2,000 calls of an all-reduce of
/// 2,048 f32 (TinyLlama's hidden size) and of a barrier.
fn latency(g: &MpiGroup) {
    let mut x = vec![g.rank() as f32; 2048];
    time(g, "all_reduce_sum of 2048 f32", &mut || {
        g.all_reduce_sum(&mut x).unwrap()
    });
    time(g, "barrier", &mut || g.barrier().unwrap());
}

/// Times 2,000 calls of `call` after 200 to warm up; rank 0 prints the percentiles.
fn time(g: &MpiGroup, what: &str, call: &mut dyn FnMut()) {
    for _ in 0..200 {
        call();
    }
    let mut micros: Vec<f64> = (0..2000)
        .map(|_| {
            let start = Instant::now();
            call();
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    micros.sort_by(f64::total_cmp);
    if g.rank() == 0 {
        println!(
            "latency: {what} on {} ranks: median {:.1} µs (p10 {:.1}, p90 {:.1})",
            g.world_size(),
            micros[1000],
            micros[200],
            micros[1800]
        );
    }
}

/// What an `mpirun` ended with.
struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    /// When it was seen to have ended (polled every 10 ms).
    ended: SystemTime,
}

/// Whether `mpirun` is Open MPI's, which needs `--oversubscribe` for more ranks than cores
/// and two variables to run as root.
fn open_mpi() -> bool {
    Command::new("mpirun")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("Open MPI"))
        .expect("mpirun (Debian: openmpi-bin) must be on PATH")
}

/// Runs `mode` on `np` ranks of this executable under `mpirun` with the variables `env`;
/// fails the test (after ending it) if it runs past `limit`.
fn mpirun(np: usize, mode: &str, env: &[(&str, &OsStr)], limit: Duration) -> Run {
    let _one = MPIRUN.lock().unwrap_or_else(PoisonError::into_inner);
    let (mut out, mut err) = (tempfile::tempfile().unwrap(), tempfile::tempfile().unwrap());
    let mut cmd = Command::new("mpirun");
    if open_mpi() {
        cmd.arg("--oversubscribe")
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    }
    cmd.args(["-np", &np.to_string()])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "rank", "--nocapture", "--test-threads=1"])
        .env(MODE, mode)
        .env(NP, np.to_string())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap());
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > limit {
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let ended = SystemTime::now();
    let read = |f: &mut File| {
        let mut s = String::new();
        f.rewind().unwrap();
        f.read_to_string(&mut s).unwrap();
        s
    };
    let Some(status) = status else {
        // SIGTERM lets mpirun end its ranks; SIGKILL if it does not within 5 s.
        // SAFETY: kill(2) of the child this test started.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let term = Instant::now();
        while child.try_wait().unwrap().is_none() && term.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "mpirun -np {np} ({mode}) ran past {limit:?}\nstdout:\n{}\nstderr:\n{}",
            read(&mut out),
            read(&mut err)
        );
    };
    Run {
        status,
        stdout: read(&mut out),
        stderr: read(&mut err),
        ended,
    }
}

/// Runs the checks on `np` ranks and asserts that every rank passed them.
fn check_on(np: usize) {
    let run = mpirun(np, "check", &[], Duration::from_secs(120));
    let report = format!("stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(run.status.success(), "{}\n{report}", run.status);
    for r in 0..np {
        let line = format!("rank {r} of {np}: every check passed");
        assert!(run.stdout.contains(&line), "no {line:?}\n{report}");
    }
}

#[test]
fn collectives_on_two_ranks() {
    check_on(2);
}

#[test]
fn collectives_on_three_ranks() {
    check_on(3);
}

#[test]
fn a_killed_rank_ends_the_job_within_30_s() {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("killed_at");
    let run = mpirun(
        2,
        "kill",
        &[(KILL_AT, at.as_os_str())],
        Duration::from_secs(30),
    );
    let report = format!("stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(!run.status.success(), "{}\n{report}", run.status);
    assert!(
        run.stderr.to_lowercase().contains("rank 1"),
        "stderr names no rank 1\n{report}"
    );
    let killed: u128 = std::fs::read_to_string(&at).unwrap().parse().unwrap();
    let ended = run.ended.duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let after = Duration::from_nanos(ended.saturating_sub(killed) as u64);
    eprintln!(
        "the job ended {:.2} s after rank 1's SIGKILL ({}); mpirun's stderr:\n{}",
        after.as_secs_f64(),
        run.status,
        run.stderr
    );
}

#[test]
fn an_aborting_rank_ends_the_job_naming_itself() {
    let run = mpirun(3, "abort", &[], Duration::from_secs(30));
    let report = format!("stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(!run.status.success(), "{}\n{report}", run.status);
    assert!(
        run.stderr.contains("rank 1: deliberately, in the test"),
        "{report}"
    );
}

/// Prints the latencies (visible with `--nocapture`).
#[test]
fn latency_on_two_ranks() {
    let run = mpirun(2, "latency", &[], Duration::from_secs(120));
    assert!(run.status.success(), "{}\n{}", run.status, run.stderr);
    // The lines rank 0 printed, without libtest's words before them.
    for line in run.stdout.lines() {
        if let Some((_, figures)) = line.split_once("latency: ") {
            eprintln!("{figures}");
        }
    }
}
