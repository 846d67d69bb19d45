//! The C host program tests/c/flm_test.c, built by gcc against libflm.so and libflm.a:
//! greedy text byte for byte as `flm run --temperature 0` prints it (and as llama2.c's
//! reference, tests/data/stories260K/stories260K_reference.json), concurrent sessions,
//! the documented status of bad calls, no leak or invalid access under valgrind, and
//! 8 host threads × 8 generations in sessions of one model of every weight dtype, with
//! pools of 1, 2 and 4 workers (the `stress` mode; tests/concurrent_sessions.rs of
//! flm-tests is its Rust twin), and a chat turn through the chat calls as `flm chat` takes
//! it (the `chat` mode).
//!
//! Needs gcc. The valgrind test is skipped when valgrind is not installed, unless
//! `FLM_REQUIRE_VALGRIND=1` (CI sets it).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use flm_tests::greedy_run_args;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model() -> String {
    repo()
        .join("tests/data/stories260K/stories260K.bin")
        .display()
        .to_string()
}

/// The directory cargo builds libflm.{so,a} and the flm binary into (this test runs from
/// its `deps/` subdirectory).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// Builds libflm and the flm binary into [`target_dir`], once: `cargo test` builds the
/// libraries of this crate only under `deps/` with hashed names, and not the binary. The
/// whole workspace's libraries, binaries and tests are named, so that cargo resolves the
/// feature set `cargo test --workspace` resolved (dev-dependencies included: they enable
/// features of serde and syn) and finds every crate already compiled; a plain
/// `cargo build`, or `-p flm-capi -p flm-cli`, would resolve other features of shared
/// dependencies and compile them and everything above them again.
fn build() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = target_dir();
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .args([
                "build",
                "--quiet",
                "--workspace",
                "--lib",
                "--bins",
                "--tests",
            ])
            .arg("--target-dir")
            .arg(dir.parent().unwrap());
        if dir.ends_with("release") {
            cargo.arg("--release");
        }
        run(&mut cargo);
        dir
    })
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The C program `source` (relative to the repository) built as `name` against the
/// shared library, then against the static one, with every warning an error.
fn link_both(source: &str, name: &str) -> [PathBuf; 2] {
    let lib = build();
    let out = lib.join("c-test");
    std::fs::create_dir_all(&out).unwrap();
    let gcc = |exe: &Path, link: &[&str]| {
        let mut cmd = Command::new("gcc");
        cmd.args(["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-g", "-O1"])
            .args(["-Wall", "-Wextra", "-Werror", "-pthread"])
            .arg("-I")
            .arg(repo().join("include"))
            .arg(repo().join(source))
            .arg("-o")
            .arg(exe)
            .args(link);
        run(&mut cmd);
    };
    let shared = out.join(format!("{name}_shared"));
    let rpath = format!("-Wl,-rpath,{}", lib.display());
    let libdir = format!("-L{}", lib.display());
    gcc(&shared, &[&libdir, "-lflm", &rpath]);
    let fixed = out.join(format!("{name}_static"));
    let archive = lib.join("libflm.a").display().to_string();
    gcc(&fixed, &[&archive, "-lpthread", "-ldl", "-lm"]);
    [shared, fixed]
}

/// tests/c/flm_test.c linked against the shared library, then against the static one.
fn programs() -> &'static [PathBuf; 2] {
    static PROGRAMS: OnceLock<[PathBuf; 2]> = OnceLock::new();
    PROGRAMS.get_or_init(|| link_both("tests/c/flm_test.c", "flm_test"))
}

/// README.md's C example, examples/app.c, built as the README builds it: it prints the
/// greedy text that `flm run --temperature 0` prints.
#[test]
fn the_readme_example_prints_what_flm_run_prints() {
    let prompt = "Once upon a time";
    let want = flm_run(prompt, "40");
    for app in link_both("examples/app.c", "app") {
        let out = run(Command::new(&app).args([&model(), prompt, "40"]));
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(text.trim_end(), want.trim_end(), "{}", app.display());
    }
}

/// What `flm run --temperature 0` prints for `prompt`, from the flm binary of this
/// workspace.
fn flm_run(prompt: &str, max_tokens: &str) -> String {
    let model = model();
    let out =
        run(Command::new(build().join("flm")).args(greedy_run_args(&model, prompt, max_tokens)));
    String::from_utf8(out.stdout).unwrap()
}

fn reference(case: &str) -> String {
    let path = repo().join("tests/data/stories260K/stories260K_reference.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    json[case]["output_text"].as_str().unwrap().to_string()
}

#[test]
fn greedy_text_equals_flm_run_and_llama2c() {
    let cases = [
        ("", "200", reference("greedy_from_bos")),
        (
            "Once upon a time",
            "32",
            reference("greedy_prompt")
                .strip_prefix("Once upon a time")
                .unwrap()
                .to_string(),
        ),
    ];
    for (prompt, max_tokens, expected) in cases {
        let cli = flm_run(prompt, max_tokens);
        assert_eq!(cli, format!("{expected}\n"), "flm run, prompt {prompt:?}");
        for program in programs() {
            let out = run(Command::new(program).args(["generate", &model(), prompt, max_tokens]));
            assert_eq!(
                String::from_utf8(out.stdout).unwrap(),
                cli,
                "{}, prompt {prompt:?}",
                program.display()
            );
        }
    }
}

/// tests/data/hf-stories260K with Qwen3's chat template (tests/data/templates) in its
/// tokenizer_config.json, under the build directory.
fn chat_model() -> &'static str {
    static MODEL: OnceLock<String> = OnceLock::new();
    MODEL.get_or_init(|| {
        let to = build().join("c-test/chat-model");
        std::fs::create_dir_all(&to).unwrap();
        let from = repo().join("tests/data/hf-stories260K");
        for entry in std::fs::read_dir(&from).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
        }
        let template =
            std::fs::read_to_string(repo().join("tests/data/templates/Qwen-Qwen3-0.6B.jinja"))
                .unwrap();
        let config = to.join("tokenizer_config.json");
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
        json["chat_template"] = template.into();
        std::fs::write(&config, json.to_string()).unwrap();
        to.display().to_string()
    })
}

/// transformers' rendering of Qwen3's template for one user turn "Hello" with
/// `enable_thinking=False` (tests/data/templates/references.json).
fn qwen3_reference() -> String {
    let path = repo().join("tests/data/templates/references.json");
    let refs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let case = refs["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["template"] == "Qwen-Qwen3-0.6B.jinja"
                && c["kwargs"] == serde_json::json!({"enable_thinking": false})
                && c["messages"] == serde_json::json!([{"role": "user", "content": "Hello"}])
                && c["add_generation_prompt"] == true
        })
        .expect("the reference of Qwen3 with enable_thinking=False");
    case["text"].as_str().unwrap().to_string()
}

/// `flm chat` greedy, verbose, with `extra` arguments and `stdin`: stdout and stderr.
fn flm_chat(model: &str, extra: &[&str], stdin: &str) -> (String, String) {
    let mut child = Command::new(build().join("flm"))
        .args(["chat", "--model", model, "--temperature", "0", "--verbose"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "flm chat failed: {stderr}");
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

/// A host's chat turn (flm_apply_chat_template, flm_tokenize_chat, flm_generate_tokens with
/// the template argument enable_thinking=false) prints the prompt that transformers renders
/// and the prompt and reply of `flm chat --template-arg enable_thinking=false`.
#[test]
fn a_chat_turn_equals_flm_chat_and_transformers() {
    let (reply, cli_log) = flm_chat(
        chat_model(),
        &[
            "--max-tokens",
            "16",
            "--template-arg",
            "enable_thinking=false",
        ],
        "Hello\n",
    );
    assert!(reply.trim_end().len() > 1, "{reply:?}");
    let reference = qwen3_reference();
    for program in programs() {
        let out = run(Command::new(program).args([
            "chat",
            chat_model(),
            "Hello",
            r#"{"enable_thinking": false}"#,
            "16",
        ]));
        let prompt = String::from_utf8(out.stderr).unwrap();
        let text = prompt
            .split_once(" tokens)\n")
            .and_then(|(_, rest)| rest.strip_suffix("\n---\n"))
            .unwrap_or_else(|| panic!("{prompt:?}"));
        assert_eq!(text, reference, "{}", program.display());
        assert!(cli_log.contains(&prompt), "{prompt:?} not in {cli_log:?}");
        assert_eq!(String::from_utf8(out.stdout).unwrap(), reply);
    }
}

#[test]
fn concurrent_sessions_and_error_codes() {
    for program in programs() {
        let out = run(Command::new(program).args(["check", &model()]));
        assert_eq!(String::from_utf8(out.stdout).unwrap(), "ok\n");
    }
}

/// stories260K converted by `flm convert` into every weight dtype (every matrix in it),
/// with the llama2.c file itself (f32).
fn every_dtype() -> Vec<String> {
    let dir = build().join("c-test/stress-models");
    std::fs::create_dir_all(&dir).unwrap();
    let dtypes = [
        ("f32", None),
        ("f16", None),
        ("bf16", None),
        ("int8", None),
        ("int4", Some("32")),
        ("int4", Some("64")),
        ("int4", Some("128")),
        ("int4-sym", Some("32")),
        ("int4-sym", Some("64")),
        ("int4-sym", Some("128")),
    ];
    let mut models = vec![model()];
    for (dtype, group) in dtypes {
        let out = dir.join(format!("{dtype}-{}.flm", group.unwrap_or("all")));
        let mut cmd = Command::new(build().join("flm"));
        cmd.args(["convert", "--input", &model(), "--dtype", dtype, "--pure"])
            .arg("--output")
            .arg(&out);
        if let Some(g) = group {
            cmd.args(["--group-size", g]);
        }
        run(&mut cmd);
        models.push(out.display().to_string());
    }
    models
}

#[test]
fn eight_threads_of_sessions_over_one_model_generate_their_lone_text() {
    let program = &programs()[0];
    for model in every_dtype() {
        for pool in ["1", "2", "4"] {
            let out = run(Command::new(program).args(["stress", &model, pool, "8", "8"]));
            assert_eq!(
                String::from_utf8(out.stdout).unwrap(),
                "ok\n",
                "{model}, pool of {pool}"
            );
        }
    }
}

fn valgrind_present() -> bool {
    Command::new("valgrind").arg("--version").output().is_ok()
}

#[test]
fn valgrind_finds_no_leak_or_invalid_access() {
    if !valgrind_present() {
        assert!(
            std::env::var_os("FLM_REQUIRE_VALGRIND").is_none(),
            "FLM_REQUIRE_VALGRIND is set but valgrind is not installed"
        );
        eprintln!("valgrind is not installed: skipped");
        return;
    }
    let suppressions = repo().join("tests/c/valgrind.supp");
    for args in [
        vec!["generate", &model(), "Once upon a time", "32"],
        vec!["check", &model()],
        vec![
            "chat",
            chat_model(),
            "Hello",
            r#"{"enable_thinking": false}"#,
            "8",
        ],
    ] {
        run(Command::new("valgrind")
            .args(["--leak-check=full", "--show-leak-kinds=all"])
            .args(["--errors-for-leak-kinds=definite,indirect,possible"])
            .arg(format!("--suppressions={}", suppressions.display()))
            .args(["--error-exitcode=1", "--quiet"])
            .arg(&programs()[0])
            .args(&args));
    }
}
