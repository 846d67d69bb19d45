//! `flm chat` driven through stdin on stories260K in a Hugging Face directory whose
//! `tokenizer_config.json` is given a Jinja `chat_template`.

#[path = "common/chat_model.rs"]
mod chat_model;
mod common;
#[path = "common/piped.rs"]
mod piped;

use std::io::Write;
use std::path::Path;

use chat_model::data;
use common::flm_command;

const TEMPLATE: &str = "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}\
User: {{ m.content }}\n{% elif m.role == 'system' %}{{ m.content }}\n{% else %}\
Bot: {{ m.content }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}Bot:{% endif %}";

/// [`chat_model::chat_model`] as the path string `flm` takes.
fn chat_model(dir: &Path, template: &str) -> String {
    chat_model::chat_model(dir, template)
        .to_str()
        .unwrap()
        .to_owned()
}

fn chat(model: &str, stdin: &str) -> (String, String) {
    chat_with(model, &[], stdin)
}

/// `flm chat` greedy with `--verbose` and `extra` arguments: stdout and stderr.
fn chat_with(model: &str, extra: &[&str], stdin: &str) -> (String, String) {
    let mut args = vec![
        "chat",
        "--model",
        model,
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        "--verbose",
    ];
    args.extend(extra);
    let out = piped::run(&args, stdin);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "flm chat failed: {stderr}");
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

/// The prompts `--verbose` printed, in order.
fn prompts(stderr: &str) -> Vec<String> {
    stderr
        .split("--- prompt (")
        .skip(1)
        .map(|p| {
            let body = p.split_once(")\n").unwrap().1;
            body.split_once("\n---\n").unwrap().0.to_owned()
        })
        .collect()
}

#[test]
fn two_turns_keep_the_history_and_match_a_fresh_run() {
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), TEMPLATE);
    let (stdout, stderr) = chat(&model, "Once upon a time\n\nThe end\n");
    let prompts = prompts(&stderr);
    assert_eq!(prompts.len(), 2, "{stderr}");
    assert_eq!(prompts[0], "<s>User: Once upon a time\nBot:");
    // The second prompt is the first turn, the reply as generated (printed on stdout
    // first), and the new turn.
    let first = prompts[1]
        .strip_prefix("<s>User: Once upon a time\nBot: ")
        .and_then(|p| p.strip_suffix("\nUser: The end\nBot:"))
        .unwrap_or_else(|| panic!("{:?}", prompts[1]));
    assert!(!first.trim().is_empty());
    let reply = stdout
        .strip_prefix(&format!("{first}\n"))
        .unwrap_or_else(|| panic!("{stdout:?} starts with {first:?}"));
    let second = &prompts[1];
    // The second reply reused the first turn's KV cache (it prefilled fewer tokens than
    // its prompt has); a fresh `flm run` on the same text gives the same continuation.
    let count = |after: &str| -> Vec<usize> {
        stderr
            .split(after)
            .skip(1)
            .map(|s| s.split([' ', ')']).next().unwrap().parse().unwrap())
            .collect()
    };
    let (lengths, totals) = (count("--- prompt ("), count("prompt tokens: "));
    // "prompt tokens: N (R reused from the KV cache)" when R > 0.
    let reused: Vec<usize> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("prompt tokens: "))
        .map(|l| match l.split_once(" (") {
            Some((_, r)) if r.contains("reused") => r.split(' ').next().unwrap().parse().unwrap(),
            _ => 0,
        })
        .collect();
    assert_eq!(totals, lengths);
    assert_eq!(reused[0], 0);
    assert!(totals[1] - reused[1] < lengths[1] - lengths[0], "{stderr}");
    let run = piped::run(
        &[
            "run",
            "--model",
            &model,
            "--prompt",
            &second["<s>".len()..],
            "--temperature",
            "0",
            "--max-tokens",
            "12",
        ],
        "",
    );
    assert!(run.status.success());
    assert_eq!(String::from_utf8(run.stdout).unwrap().trim_start(), reply);
}

#[test]
fn reset_help_exit_and_a_system_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), TEMPLATE);
    let out = piped::run(
        &[
            "chat",
            "--model",
            &model,
            "--system",
            "Be kind.",
            "--max-tokens",
            "4",
            "--seed",
            "1",
            "--verbose",
        ],
        "Hi\n/reset\n/help\n/nonsense\nHello\n/exit\nnever read\n",
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    // The banner names the model; /help and an unknown command are answered, not sent.
    assert!(stderr.contains(&format!("{model}: 5 layers")), "{stderr}");
    assert!(
        stderr.contains("/reset       forget the conversation"),
        "{stderr}"
    );
    assert!(stderr.contains("unknown command /nonsense"), "{stderr}");
    let prompts = prompts(&stderr);
    assert_eq!(
        prompts,
        [
            "<s>Be kind.\nUser: Hi\nBot:",
            "<s>Be kind.\nUser: Hello\nBot:"
        ]
    );
    assert!(stderr.contains("(conversation cleared)"));
}

#[test]
fn the_template_travels_in_the_flm_file() {
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), TEMPLATE);
    let flm_file = dir.path().join("m.flm");
    let flm_file = flm_file.to_str().unwrap();
    let args = [
        "convert", "--input", &model, "--output", flm_file, "--dtype", "f32",
    ];
    assert!(piped::run(&args, "").status.success());
    let (from_dir, _) = chat(&model, "Once upon a time\n");
    let (from_flm, stderr) = chat(flm_file, "Once upon a time\n");
    assert_eq!(prompts(&stderr), ["<s>User: Once upon a time\nBot:"]);
    assert_eq!(from_flm, from_dir);
}

#[test]
fn models_without_a_template_and_failing_templates() {
    let model = data("hf-stories260K");
    let out = piped::run(&["chat", "--model", model.to_str().unwrap()], "Hi\n");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("has no chat template"), "{stderr}");
    assert!(!stderr.contains("panicked"));
    // Refused before the weights are read: a model path that does not exist is not opened.
    let tokenizer = model.join("tokenizer.json");
    let args = ["chat", "--model", "/nonexistent", "--tokenizer"];
    let out = piped::run(
        &[&args[..], &[tokenizer.to_str().unwrap()]].concat(),
        "Hi\n",
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("tokenizer.json has no chat template"),
        "{stderr}"
    );

    // A template that refuses the turn: the error is reported and the chat goes on, and
    // the exit status says that a turn failed.
    let dir = tempfile::tempdir().unwrap();
    let template = "{% if messages[-1].content == 'bad' %}\
                    {{ raise_exception('no bad words') }}{% endif %}{{ TEMPLATE }}";
    let model = chat_model(dir.path(), &template.replace("{{ TEMPLATE }}", TEMPLATE));
    let args = [
        "chat",
        "--model",
        &model,
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        "--verbose",
    ];
    let out = piped::run(&args, "bad\nOnce upon a time\n");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no bad words"), "{stderr}");
    assert!(stderr.contains("1 chat turn(s) failed"), "{stderr}");
    assert_eq!(prompts(&stderr), ["<s>User: Once upon a time\nBot:"]);
    assert_eq!(String::from_utf8(out.stdout).unwrap().lines().count(), 1);
    // Every turn failing is a failure too; turns that all succeed exit 0 (`chat` checks).
    let out = piped::run(&args, "bad\nbad\n");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("2 chat turn(s) failed"));
    chat(&model, "Once upon a time\n");
}

/// `--template-arg`: Qwen3's template with `enable_thinking=false` renders as transformers'
/// `apply_chat_template(..., enable_thinking=False)` (tests/data/templates/references.json);
/// values are JSON or else strings; malformed and reserved names are refused.
#[test]
fn template_args_reach_the_template() {
    let refs: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data("templates/references.json")).unwrap()).unwrap();
    let case = refs["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["kwargs"] == serde_json::json!({"enable_thinking": false})
                && c["messages"] == serde_json::json!([{"role": "user", "content": "Hello"}])
                && c["add_generation_prompt"] == true
        })
        .expect("the reference of Qwen3 with enable_thinking=False");
    let qwen3 = std::fs::read_to_string(data("templates/Qwen-Qwen3-0.6B.jinja")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), &qwen3);
    let off = ["--template-arg", "enable_thinking=false"];
    let (_, stderr) = chat_with(&model, &off, "Hello\n");
    assert_eq!(prompts(&stderr), [case["text"].as_str().unwrap()]);
    let (_, stderr) = chat(&model, "Hello\n");
    assert!(!prompts(&stderr)[0].contains("<think>"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(
        dir.path(),
        &format!("{{{{ who }}}}|{{{{ n + 1 }}}}|{TEMPLATE}"),
    );
    let extra = ["--template-arg", "who=Bob", "--template-arg", "n=3"];
    let (_, stderr) = chat_with(&model, &extra, "Hi\n");
    assert_eq!(prompts(&stderr), ["Bob|4|<s>User: Hi\nBot:"]);
    for (arg, why) in [
        ("enable_thinking", "expected NAME=VALUE"),
        ("=1", "name is empty"),
        ("messages=[]", "`messages`"),
    ] {
        let out = piped::run(&["chat", "--model", &model, "--template-arg", arg], "Hi\n");
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            !out.status.success() && stderr.contains(why),
            "{arg}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// A ChatGLM2 `tokenizer.model` with the `tokenizer_config.json` of THUDM's checkpoints
/// beside it is the ChatGLM tokenizer: `[gMASK] sop` first, then SentencePiece's ids
/// (chatglm.cpp's `Pipeline.ChatGLM2` case).
#[test]
fn tokenize_with_a_chatglm_tokenizer_config() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tokenizer.model");
    std::fs::copy(data("chatglm/tokenizers/chatglm2_tokenizer.model"), &model).unwrap();
    let config = r#"{"tokenizer_class": "ChatGLMTokenizer", "remove_space": false}"#;
    std::fs::write(dir.path().join("tokenizer_config.json"), config).unwrap();
    let args = [
        "tokenize",
        "--tokenizer",
        model.to_str().unwrap(),
        "--text",
        "你好",
    ];
    let out = piped::run(&args, "");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "64790 64792 36474 54591\n"
    );
    std::fs::write(dir.path().join("tokenizer_config.json"), "{").unwrap();
    let out = piped::run(&args, "");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("tokenizer_config.json"), "{stderr}");
}

/// `flm chat` started greedy, with `--verbose` and no cap on the reply but the context,
/// its three pipes open.
fn spawn_chat(model: &str) -> std::process::Child {
    piped::spawn(&[
        "chat",
        "--model",
        model,
        "--temperature",
        "0",
        "--verbose",
        "--max-tokens",
        "100000",
        "--ignore-eos",
    ])
}

fn interrupt(child: &std::process::Child) {
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
}

/// Ctrl-C during a reply stops the reply (a whole one fills the context, so one that stops
/// short was interrupted), keeps what was generated in the conversation, and the chat goes
/// on to the next turn.
#[test]
fn ctrl_c_stops_the_reply_not_the_chat() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), TEMPLATE);
    let mut child = spawn_chat(&model);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    stdin.write_all(b"Once upon a time\n").unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    interrupt(&child);
    stdin.write_all(b"The end\n/exit\n").unwrap();
    drop(stdin);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // The first turn's log, up to the second turn's prompt.
    let first_turn = stderr.split("--- prompt (").nth(1).unwrap();
    assert!(first_turn.contains("(reply interrupted)"), "{stderr}");
    assert!(!first_turn.contains("is full"), "{stderr}");
    let stdout = String::from_utf8([first.to_vec(), rest].concat()).unwrap();
    let prompts = prompts(&stderr);
    assert_eq!(prompts.len(), 2, "{stderr}");
    // The second prompt holds the first turn, the reply as far as it went (stdout begins
    // with it; the second reply follows), and the new turn.
    let kept = prompts[1]
        .strip_prefix("<s>User: Once upon a time\nBot: ")
        .and_then(|p| p.strip_suffix("\nUser: The end\nBot:"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(!kept.trim().is_empty(), "{stderr}");
    assert!(
        stdout.trim_start().starts_with(kept.trim()),
        "{stdout}\n{stderr}"
    );
}

/// Ctrl-C at the prompt ends the chat with the shell's status for it.
#[test]
fn ctrl_c_at_the_prompt_ends_the_chat() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), TEMPLATE);
    let mut child = spawn_chat(&model);
    // Held open: `wait` would close it, and the end of input also ends the chat.
    let _stdin = child.stdin.take();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut banner = String::new();
    stderr.read_line(&mut banner).unwrap();
    assert!(banner.contains("/help lists the commands"), "{banner}");
    interrupt(&child);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
}

/// `flm chat` at a terminal (a pseudo-terminal): the prompt line is edited (Up recalls the
/// last line, Ctrl-E moves to its end), Ctrl-C mid-reply stops the reply and the next turn
/// follows, Ctrl-D at the prompt ends the chat with status 0, and Ctrl-C at the prompt
/// with status 130.
#[cfg(unix)]
#[test]
fn at_a_terminal_lines_are_edited_and_ctrl_c_stops_only_the_reply() {
    use expectrl::process::unix::WaitStatus;
    use expectrl::{ControlCode, Eof, Expect, Session};
    let dir = tempfile::tempdir().unwrap();
    let model = chat_model(dir.path(), TEMPLATE);
    let start = || {
        let mut command = flm_command();
        command.args(["chat", "--model", &model, "--temperature", "0", "--verbose"]);
        command.args(["--max-tokens", "100000", "--ignore-eos"]);
        let mut chat = Session::spawn(command).expect("flm chat in a pseudo-terminal");
        chat.set_expect_timeout(Some(std::time::Duration::from_secs(120)));
        chat.expect("/help lists the commands").unwrap();
        chat.expect("> ").unwrap();
        chat
    };
    let mut chat = start();
    chat.send_line("Once upon a time").unwrap();
    // The prompt's log comes first, then the reply, which Ctrl-C stops.
    chat.expect("Bot:\r\n---").unwrap();
    chat.send(ControlCode::EndOfText).unwrap();
    chat.expect("(reply interrupted)").unwrap();
    chat.expect("> ").unwrap();
    // Up: the last line again; Ctrl-E and more text at its end.
    chat.send("\x1b[A").unwrap();
    chat.send("\x05, the end\r").unwrap();
    chat.expect("User: Once upon a time, the end\r\nBot:")
        .unwrap();
    chat.send(ControlCode::EndOfText).unwrap();
    chat.expect("> ").unwrap();
    chat.send(ControlCode::EndOfTransmission).unwrap();
    chat.expect(Eof).unwrap();
    assert!(matches!(
        chat.get_process().wait().unwrap(),
        WaitStatus::Exited(_, 0)
    ));
    let mut chat = start();
    chat.send(ControlCode::EndOfText).unwrap();
    chat.expect(Eof).unwrap();
    assert!(matches!(
        chat.get_process().wait().unwrap(),
        WaitStatus::Exited(_, 130)
    ));
}

/// With no `--activation-bits` (auto: 16 bits for a model this small), SmolLM2-135M's
/// greedy replies are transformers' (tests/data/smollm2/smollm2_reference.json: the ids it
/// generated, decoded by the file's tokenizer), where int8 activations begin "What is the
/// capital of France?" in French. Runs where FLM_SMOLLM2_GGUF names the GGUF (.ci/run).
#[test]
fn smollm2_answers_as_transformers_by_default() {
    let Some(gguf) = std::env::var_os("FLM_SMOLLM2_GGUF") else {
        eprintln!("skipped: FLM_SMOLLM2_GGUF is not set (see .ci/run)");
        return;
    };
    let gguf = Path::new(&gguf);
    let reference: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data("smollm2/smollm2_reference.json")).unwrap())
            .unwrap();
    let tokenizer = flm_models::import::load_tokenizer_file(gguf).unwrap();
    let model = gguf.to_str().unwrap();
    for case in reference["greedy"].as_array().unwrap() {
        let ids: Vec<u32> = serde_json::from_value(case["output_ids"].clone()).unwrap();
        // The reference stops at its 8th token or at the end-of-turn token (id 2).
        let reply: Vec<u32> = ids.iter().copied().take_while(|&id| id != 2).collect();
        let want = tokenizer.decode(&reply).unwrap();
        let question = format!("{}\n", case["question"].as_str().unwrap());
        let out = piped::run(
            &["chat", "--model", model, "--temperature", "0", "-n", "8"],
            &question,
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(stdout.trim(), want.trim(), "{question}");
    }
}
