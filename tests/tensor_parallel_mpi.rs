//! Tensor parallelism over the processes of an MPI job (issue 52): `mpirun --oversubscribe
//! -np 2` starts this executable once per rank; with `FLM_TP_MPI` set, its test `rank` is
//! that rank's program. Each rank builds its part of every case of
//! [`flm_tests::tensor_parallel::checkpoints`] over [`MpiGroup`]; rank 0 runs the split
//! model and the whole one and ends the job, naming the case, unless the logits agree
//! within 1e-4 and the greedy tokens are equal; the other rank serves its part.
//! Needs `mpirun` on PATH (Debian: openmpi-bin); built only with the `mpi` feature.

use std::process::Command;
use std::sync::Arc;

use flm_core::comm::{Communicator, MpiGroup};
use flm_models::llama::{LlamaWeights, SharedLlama};
use flm_models::tensor_parallel::{serve_rank, TensorParallel};
use flm_models::SharedModel;
use flm_tests::cpu_executor;
use flm_tests::tensor_parallel::{checkpoints, mismatch, prompt, run};

/// Set in the ranks' environment by the test that starts them.
const MODE: &str = "FLM_TP_MPI";

/// One rank's program, under `mpirun`; elsewhere it returns at once.
#[test]
fn rank() {
    if std::env::var(MODE).is_err() {
        return;
    }
    let comm: Arc<dyn Communicator> = Arc::new(MpiGroup::new().expect("MPI initialises"));
    let dir = tempfile::tempdir().unwrap();
    for (name, ckpt) in checkpoints(dir.path()) {
        let weights = LlamaWeights::load(&ckpt).unwrap();
        let part =
            SharedLlama::shard(&ckpt.config, &weights, Arc::clone(&comm)).unwrap_or_else(|e| {
                comm.abort(&format!("{name}: {e}"));
                unreachable!("the job ends")
            });
        if comm.rank() != 0 {
            serve_rank(Arc::new(part), &*comm, &cpu_executor()).unwrap();
            continue;
        }
        let tokens = prompt(ckpt.config.vocab_size);
        let whole = run(&SharedModel::new(&ckpt).unwrap(), &tokens);
        let model = TensorParallel::over(&ckpt.config, part, Arc::clone(&comm), 1).unwrap();
        let split = run(&model, &tokens);
        // Rank 0's end stops the other ranks' loop for this case.
        drop(model);
        if let Some(why) = mismatch(&whole, &split) {
            comm.abort(&format!("{name}: {why}"));
        }
        println!("{name}: as one process");
    }
}

#[test]
fn every_case_matches_one_process_on_2_processes() {
    let open_mpi = Command::new("mpirun")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("Open MPI"))
        .expect("mpirun (Debian: openmpi-bin) must be on PATH");
    let mut cmd = Command::new("timeout");
    cmd.args(["300", "mpirun"]);
    if open_mpi {
        cmd.arg("--oversubscribe")
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    }
    let out = cmd
        .args(["-np", "2"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "rank", "--nocapture", "--test-threads=1"])
        .env(MODE, "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let report = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(out.status.success(), "{}\n{report}", out.status);
    let dir = tempfile::tempdir().unwrap();
    for (name, _) in checkpoints(dir.path()) {
        let line = format!("{name}: as one process");
        assert!(stdout.contains(&line), "no {line:?}\n{report}");
    }
}
