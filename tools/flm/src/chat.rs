//! `flm chat`: an interactive multi-turn chat in the terminal.
//!
//! Each line read from stdin is a user turn. The whole conversation (an optional system
//! message, then every user and assistant turn so far) is rendered with the model's own
//! prompt format ([`Tokenizer::encode_chat`]: ChatGLM's built-in formats, or the Jinja
//! `chat_template` of `tokenizer_config.json` / GGUF / .flm, given the `--template-arg`
//! keyword arguments), and the reply is generated
//! by one [`Session`] (the loop of `flm run`), streamed to stdout, and kept in the history.
//! The session keeps its KV cache between turns: only the tokens after the longest common
//! prefix of the new prompt and the cached sequence are prefilled (ChatGLM-6B excepted,
//! see [`flm_models::session`]).
//!
//! A turn whose prompt cannot be built (the template fails or refuses it, or the
//! conversation outgrows the context) prints its error and is dropped, and the chat goes
//! on, as an interactive user expects; the process still exits with status 1 at the end
//! when any turn failed, so that a script feeding stdin sees the failure.
//!
//! Ctrl-C during a reply stops it (what was generated stays in the conversation) and the
//! chat goes on; at the prompt it ends the chat, as in llama.cpp's CLI. At a terminal the
//! prompt line is edited with rustyline (arrow keys, Emacs bindings, Up and Down through
//! this chat's earlier lines); from a pipe, lines are read as they come.
//!
//! gpt-oss (a vocabulary with the harmony tokens) answers in channels: only its final
//! answer is printed and kept in the history; its analysis channel (reasoning) is hidden,
//! or with `--verbose` printed to stderr between `[analysis]` and `[/analysis]` lines.
//! `--template-arg reasoning_effort=high` (or `low`) sets its reasoning effort.
//!
//! Commands: `/reset` forgets the conversation, `/exit` or `/quit` (or end of input)
//! ends the session, `/help` (or `/?`) lists them; any other line of one word starting
//! with `/` is answered as an unknown command rather than sent to the model, as Ollama
//! does. A model without any chat template is refused with an error that points to
//! `flm run`.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use flm_models::session::Session;
use flm_tokenizer::{
    HarmonySplitter, HarmonyText, HarmonyTokens, Message, TemplateArgs, Tokenizer,
};

use crate::generate::{self, Prompt};
use crate::{load, set_threads, ModelArgs, SamplingArgs};

/// `flm chat` arguments.
#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// A system prompt: the first message of every conversation.
    #[arg(long)]
    system: Option<String>,
    /// Print each rendered prompt and the timings of each reply to stderr, and a reasoning
    /// model's hidden reasoning (gpt-oss's analysis channel), marked apart.
    #[arg(long)]
    verbose: bool,
    /// A keyword argument of the chat template, NAME=VALUE (repeatable), as transformers'
    /// `apply_chat_template(**kwargs)` passes it: e.g. `enable_thinking=false` turns Qwen3's
    /// thinking off. VALUE is read as JSON (`false`, `3`, `["a"]`), else as a string.
    #[arg(long = "template-arg", value_name = "NAME=VALUE", value_parser = template_arg)]
    template_args: Vec<(String, serde_json::Value)>,
}

/// Parses `NAME=VALUE` of `--template-arg`: VALUE as JSON, or as the string itself when it
/// is not JSON.
fn template_arg(arg: &str) -> std::result::Result<(String, serde_json::Value), String> {
    let (name, value) = arg
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=VALUE, got {arg:?}"))?;
    if name.is_empty() {
        return Err(format!("the argument name is empty in {arg:?}"));
    }
    let value = serde_json::from_str(value).unwrap_or_else(|_| value.into());
    Ok((name.to_owned(), value))
}

/// What a line of input asks for.
enum Input<'a> {
    Exit,
    Reset,
    Help,
    Unknown(&'a str),
    Skip,
    User(&'a str),
}

/// Set while a reply is generated: Ctrl-C then stops the reply rather than the chat.
static REPLYING: AtomicBool = AtomicBool::new(false);
/// Set by Ctrl-C during a reply; the reply's generation stops at its next token.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Ctrl-C (SIGINT): stops the reply being generated, or ends the chat at the prompt with
/// the shell's status for it, 130.
fn on_interrupt() {
    if REPLYING.load(Ordering::SeqCst) {
        INTERRUPTED.store(true, Ordering::SeqCst);
    } else {
        eprintln!();
        std::process::exit(130);
    }
}

/// Where the user's lines come from: an editor at a terminal, or stdin as it is.
enum Lines {
    Terminal(rustyline::DefaultEditor),
    Piped(std::io::Stdin),
}

impl Lines {
    fn new() -> Result<Lines> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Ok(Lines::Piped(stdin));
        }
        // The prompt goes to the terminal itself, not to stdout, which holds the replies.
        let config = rustyline::Config::builder()
            .behavior(rustyline::Behavior::PreferTerm)
            .auto_add_history(true)
            .build();
        let editor =
            rustyline::DefaultEditor::with_config(config).context("cannot set up line editing")?;
        Ok(Lines::Terminal(editor))
    }

    /// The next line, `None` at the end of input (Ctrl-D). Ctrl-C at the prompt ends the
    /// process with status 130 (the editor reads it as a key, not as a signal).
    fn next(&mut self) -> Result<Option<String>> {
        match self {
            Lines::Piped(stdin) => {
                let mut line = String::new();
                let read = stdin.lock().read_line(&mut line);
                Ok((read.context("cannot read stdin")? > 0).then_some(line))
            }
            Lines::Terminal(editor) => match editor.readline("> ") {
                Ok(line) => Ok(Some(line)),
                Err(rustyline::error::ReadlineError::Eof) => Ok(None),
                Err(rustyline::error::ReadlineError::Interrupted) => {
                    eprintln!();
                    std::process::exit(130)
                }
                Err(e) => Err(e).context("cannot read the terminal"),
            },
        }
    }
}

/// The commands, as `/help` prints them.
const HELP: &str = "/reset       forget the conversation\n\
                    /exit /quit  end the chat (so does end of input, Ctrl-D)\n\
                    /help /?     this list";

fn parse(line: &str) -> Input<'_> {
    let text = line.trim_end_matches(['\n', '\r']);
    match text.trim() {
        "" => Input::Skip,
        "/exit" | "/quit" => Input::Exit,
        "/reset" => Input::Reset,
        "/help" | "/?" => Input::Help,
        word if word.starts_with('/') && !word.contains(char::is_whitespace) => {
            Input::Unknown(word)
        }
        _ => Input::User(text),
    }
}

/// Runs the chat until `/exit` or the end of stdin.
///
/// Errors: a model or tokenizer that cannot be loaded, a model without a chat template,
/// invalid sampling settings, and I/O errors. A turn that cannot be rendered (a template
/// that raises an error) or no longer fits in the context is reported and dropped, and
/// the chat goes on.
pub fn run(args: ChatArgs) -> Result<()> {
    let template_args: TemplateArgs = args.template_args.iter().cloned().collect();
    flm_tokenizer::check_template_args(&template_args)?;
    args.sampling.check()?;
    // The tokenizer alone says whether the model can chat: refuse before the weights load.
    let (tokenizer, from) = match &args.model.tokenizer {
        Some(path) => (load::tokenizer_file(path)?, path),
        None => (
            load::tokenizer_beside(&args.model.model)?,
            &args.model.model,
        ),
    };
    if !tokenizer.can_chat() {
        bail!(
            "{} has no chat template (no chat_template in tokenizer_config.json or in the \
             file, and no built-in format): use `flm run --prompt` for plain completion",
            from.display()
        );
    }
    set_threads(args.model.threads)?;
    let chosen = args.model.executor()?;
    let Some((model, tokenizer)) = load::model_and_tokenizer(&args.model, &chosen)? else {
        return Ok(());
    };
    let context = model.config().max_seq_len;
    ctrlc::set_handler(on_interrupt).context("cannot handle Ctrl-C")?;
    eprintln!(
        "{}: {} layers, context of {context} tokens; /help lists the commands",
        args.model.model.display(),
        model.config().n_layers
    );
    let params = args.sampling.params(tokenizer.chat_stop_ids());
    let mut session = Session::new(model, Arc::new(tokenizer))?;
    let tokenizer = Arc::clone(session.tokenizer());
    let exec = chosen.exec;
    let harmony = tokenizer.harmony_tokens();
    let start: Vec<Message> = args
        .system
        .iter()
        .map(|s| Message::new("system", s.as_str()))
        .collect();
    let mut messages = start.clone();
    let mut lines = Lines::new()?;
    let mut failed = 0usize;
    for turn in 0u64.. {
        let Some(line) = lines.next()? else {
            break;
        };
        let text = match parse(&line) {
            Input::Exit => break,
            Input::Skip => continue,
            Input::Reset => {
                messages = start.clone();
                eprintln!("(conversation cleared)");
                continue;
            }
            Input::Help => {
                eprintln!("{HELP}");
                continue;
            }
            Input::Unknown(word) => {
                eprintln!("unknown command {word}: /help lists the commands");
                continue;
            }
            Input::User(text) => text,
        };
        messages.push(Message::new("user", text));
        let prompt = match prompt_for(&tokenizer, &messages, &template_args, context) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("error: {e:#}");
                messages.pop();
                failed += 1;
                continue;
            }
        };
        if args.verbose {
            eprintln!(
                "--- prompt ({} tokens)\n{}\n---",
                prompt.ids.len(),
                prompt.text
            );
        }
        let mut params = params.clone();
        params.sampler.seed = params.sampler.seed.wrapping_add(turn);
        let prompt = Prompt::Tokens {
            ids: prompt.ids,
            at_start: true,
        };
        INTERRUPTED.store(false, Ordering::SeqCst);
        REPLYING.store(true, Ordering::SeqCst);
        let result = match harmony {
            Some(tokens) => {
                harmony_reply(&mut session, &exec, prompt, &params, tokens, args.verbose)
            }
            None => generate::generate(
                &mut session,
                &exec,
                prompt,
                &params,
                false,
                Some(&INTERRUPTED),
            )
            .and_then(|(generation, reply)| {
                let text = tokenizer
                    .decode(&reply)
                    .context("cannot decode the reply")?;
                Ok((generation, tokenizer.chat_reply_content(&text).to_owned()))
            }),
        };
        REPLYING.store(false, Ordering::SeqCst);
        let (generation, content) = result?;
        if INTERRUPTED.load(Ordering::SeqCst) {
            eprintln!("(reply interrupted)");
        }
        if args.verbose {
            eprintln!("{}", generate::Summary(generation));
        }
        messages.push(Message::new("assistant", content));
    }
    if failed > 0 {
        bail!("{failed} chat turn(s) failed (their errors are above)");
    }
    Ok(())
}

/// Generates a harmony reply (gpt-oss): its final answer (and any text outside a channel)
/// streamed to stdout, its analysis channel hidden, or with `verbose` streamed to stderr
/// between `[analysis]` and `[/analysis]` lines, so that stdout holds the answer alone.
/// Returns the counts and the answer, which the history keeps (the harmony template drops
/// earlier turns' analysis anyway). A tool call the model makes is not answered: it ends
/// the reply, and with `verbose` is shown on stderr.
///
/// Errors: those of [`Session::generate_tokens`], an id outside the vocabulary, a closed
/// stdout.
fn harmony_reply(
    session: &mut Session,
    exec: &flm_core::Executor,
    prompt: generate::Prompt<'_>,
    params: &flm_models::session::GenerateParams,
    tokens: HarmonyTokens,
    verbose: bool,
) -> Result<(flm_models::session::Generation, String)> {
    let generate::Prompt::Tokens { ids, at_start } = prompt else {
        bail!("a harmony chat prompt is made of token ids");
    };
    let tokenizer = Arc::clone(session.tokenizer());
    let mut splitter = HarmonySplitter::new(&tokenizer, tokens);
    let mut out = std::io::stdout().lock();
    let (mut content, mut in_analysis) = (String::new(), false);
    let mut failed: Result<()> = Ok(());
    let mut show = |text: HarmonyText, out: &mut std::io::StdoutLock<'_>| -> Result<()> {
        if verbose && !text.reasoning.is_empty() {
            if !in_analysis {
                eprintln!("[analysis]");
                in_analysis = true;
            }
            eprint!("{}", text.reasoning);
        }
        if !text.content.is_empty() {
            if in_analysis {
                eprintln!("\n[/analysis]");
                in_analysis = false;
            }
            out.write_all(text.content.as_bytes())?;
            out.flush()?;
            content += &text.content;
        }
        Ok(())
    };
    let generation = session.generate_tokens(exec, ids, at_start, params, |piece| {
        let step = piece
            .id
            .map(|id| splitter.push(id).map_err(anyhow::Error::from))
            .transpose()
            .and_then(|text| text.map_or(Ok(()), |text| show(text, &mut out)));
        if let Err(e) = step {
            failed = Err(e);
        }
        if failed.is_ok() && !INTERRUPTED.load(Ordering::Relaxed) {
            std::ops::ControlFlow::Continue(())
        } else {
            std::ops::ControlFlow::Break(())
        }
    })?;
    failed?;
    let (rest, calls) = splitter.finish();
    show(rest, &mut out)?;
    if in_analysis {
        eprintln!("\n[/analysis]");
    }
    writeln!(out)?;
    if verbose {
        for call in calls {
            eprintln!(
                "[call {} ({})] {}",
                call.recipient, call.constrain, call.arguments
            );
        }
    }
    Ok((generation, content))
}

/// The prompt for `messages` with the template's keyword arguments `args`, if it leaves
/// room for a reply in the context.
fn prompt_for(
    tokenizer: &Tokenizer,
    messages: &[Message],
    args: &TemplateArgs,
    context: usize,
) -> Result<flm_tokenizer::ChatPrompt> {
    let prompt = tokenizer
        .encode_chat_with_args(messages, true, args)
        .context("cannot build the chat prompt")?;
    if prompt.ids.len() >= context {
        bail!(
            "the conversation is {} tokens long but the context holds {context}: /reset to \
             start over (or raise --context)",
            prompt.ids.len()
        );
    }
    if prompt.ids.is_empty() {
        bail!("the chat template rendered an empty prompt");
    }
    Ok(prompt)
}
