//! A `flm convert` ended part-way by SIGKILL, SIGTERM or SIGINT (Ctrl-C) leaves nothing in
//! the output's folder and an existing output as it was, and a conversion removes the
//! partial files that older versions left.
//!
//! The conversion is of random weights at the shapes of a 44 MB f32 model, so that it takes
//! long enough to be caught part-way. Each kill waits until the output being written (found
//! among the process's open files in `/proc`) has reached a given share of the whole.
#![cfg(target_os = "linux")]

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::flm_command;
use flm_tests::{data, dir_names};

/// The Hugging Face config.json of the random model, written in `dir`.
fn config(dir: &Path) -> PathBuf {
    let path = dir.join("config.json");
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 384,
        "intermediate_size": 1024,
        "num_hidden_layers": 6,
        "num_attention_heads": 6,
        "num_key_value_heads": 6,
        "vocab_size": 512,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": false,
        "bos_token_id": 1,
        "eos_token_id": 2
    });
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

/// Starts `flm convert` of the random model into `output`, with SIGINT and SIGTERM at
/// their default action: a test run in the background of a shell inherits SIGINT ignored,
/// and flm rightly keeps an ignored signal ignored.
fn start(config: &Path, output: &Path) -> Child {
    let mut command = flm_command();
    // SAFETY: between fork and exec the closure only calls `signal`, which is
    // async-signal-safe, and allocates nothing.
    unsafe {
        command.pre_exec(|| {
            for signal in [libc::SIGINT, libc::SIGTERM] {
                libc::signal(signal, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    command
        .arg("convert")
        .arg("--random")
        .arg("--input")
        .arg(config)
        .arg("--tokenizer")
        .arg(data("stories260K/tok512.model"))
        .args(["--dtype", "f32", "--output"])
        .arg(output)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The size of the file `pid` has open in `dir` (named or not), if it has one.
fn open_output_size(pid: u32, dir: &Path) -> Option<u64> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    fds.flatten()
        .filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target.starts_with(dir)))
        .find_map(|fd| std::fs::metadata(fd.path()).ok().map(|m| m.len()))
}

/// Converts into `output`, sends `signal` once the output being written holds `at` bytes,
/// and waits for the process to end. A conversion that completed before the signal landed
/// (a loaded machine may deschedule this test between reading the size and sending it)
/// must have left its whole output; `reset` then puts the folder back as it was and the
/// attempt is repeated, up to 5 times.
fn interrupt(config: &Path, output: &Path, signal: &str, at: u64, reset: impl Fn()) {
    for _ in 0..5 {
        if signal_once(config, output, signal, at) {
            return;
        }
        let whole = std::fs::read(output).unwrap();
        assert!(
            whole.starts_with(b"\x89FLM"),
            "{signal}: completed, not whole"
        );
        reset();
    }
    panic!("{signal}: the conversion completed 5 times before the signal");
}

/// One attempt of [`interrupt`]: whether the signal ended the conversion.
fn signal_once(config: &Path, output: &Path, signal: &str, at: u64) -> bool {
    let dir = output.parent().unwrap();
    let mut child = start(config, output);
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the conversion ended before it wrote {at} bytes"
        );
        assert!(
            Instant::now() < deadline,
            "no output of {at} bytes in 300 s"
        );
        if open_output_size(child.id(), dir).is_some_and(|size| size >= at) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Sent from this process: spawning `kill` took longer than a fast machine needs to
    // write the rest of the file.
    let number = match signal {
        "KILL" => libc::SIGKILL,
        "TERM" => libc::SIGTERM,
        "INT" => libc::SIGINT,
        other => panic!("no signal {other}"),
    };
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: `kill` has no memory preconditions; `pid` is our child, not yet waited for.
    assert_eq!(unsafe { libc::kill(pid, number) }, 0, "kill -s {signal}");
    !child.wait().unwrap().success()
}

#[test]
fn an_interrupted_conversion_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let output = out_dir.join("model.flm");

    // A partial file as earlier versions of flm left them, then a whole conversion: the
    // output, and nothing else.
    std::fs::write(out_dir.join(".flm-partial-Ab12Cd"), vec![7u8; 1 << 20]).unwrap();
    assert!(start(&config, &output).wait().unwrap().success());
    assert_eq!(dir_names(&out_dir), ["model.flm"]);
    let whole = std::fs::read(&output).unwrap();
    assert!(whole.starts_with(b"\x89FLM"));
    let size = whole.len() as u64;
    assert!(size > 40 << 20, "{size} bytes");

    // Killed into an empty folder: nothing left.
    std::fs::remove_file(&output).unwrap();
    for (signal, share) in [("KILL", 0.0), ("TERM", 0.3), ("INT", 0.6), ("KILL", 0.9)] {
        let at = (size as f64 * share) as u64;
        interrupt(&config, &output, signal, at, || {
            std::fs::remove_file(&output).unwrap()
        });
        assert!(
            dir_names(&out_dir).is_empty(),
            "{signal} at {share}: {:?}",
            dir_names(&out_dir)
        );
    }

    // Killed while replacing an output: the old one stays as it was.
    std::fs::write(&output, b"the previous model").unwrap();
    for (signal, share) in [("KILL", 0.5), ("INT", 0.8)] {
        let at = (size as f64 * share) as u64;
        interrupt(&config, &output, signal, at, || {
            std::fs::write(&output, b"the previous model").unwrap()
        });
        assert_eq!(dir_names(&out_dir), ["model.flm"], "{signal} at {share}");
        assert_eq!(std::fs::read(&output).unwrap(), b"the previous model");
    }

    // And replaced by a whole conversion.
    assert!(start(&config, &output).wait().unwrap().success());
    assert_eq!(dir_names(&out_dir), ["model.flm"]);
    assert_eq!(std::fs::metadata(&output).unwrap().len(), size);
}
