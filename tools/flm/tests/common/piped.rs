//! `flm` with its standard streams piped, for the tests that type into `flm chat`.

use std::io::Write;
use std::process::{Child, Output, Stdio};

use crate::common::flm_command;

/// `flm args` started with its stdin, stdout and stderr piped.
pub fn spawn(args: &[&str]) -> Child {
    flm_command()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("flm starts")
}

/// `flm args` given `stdin` as its whole input, run to its exit.
pub fn run(args: &[&str], stdin: &str) -> Output {
    let mut child = spawn(args);
    // flm may exit (on an error) before reading its input.
    match child.stdin.take().unwrap().write_all(stdin.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.unwrap(),
    }
    child.wait_with_output().expect("flm runs")
}
