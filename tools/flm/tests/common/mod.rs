//! Helpers shared by the CLI tests.

use std::process::Command;

/// The `flm` binary as a command, started through `FLM_TEST_RUNNER` when that is set: the
/// emulator of a cross-built binary (`.ci/run` sets `qemu-aarch64 -cpu cortex-a72`, say, as
/// it sets cargo's runner for the test executables themselves).
pub fn flm_command() -> Command {
    let bin = env!("CARGO_BIN_EXE_flm");
    let runner = std::env::var("FLM_TEST_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    match words.next() {
        Some(program) => {
            let mut cmd = Command::new(program);
            cmd.args(words).arg(bin);
            cmd
        }
        None => Command::new(bin),
    }
}
