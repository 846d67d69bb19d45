//! Jinja chat templates rendered with minijinja under the semantics of transformers'
//! `PreTrainedTokenizerBase.apply_chat_template` (`utils/chat_template_utils.py`): the
//! environment has `trim_blocks` and `lstrip_blocks` on, the template sees `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token` and `tools` (none unless given), and may call
//! `raise_exception(message)` and the filter `tojson` (Python's `json.dumps` with its default
//! separators `", "` and `": "` and `ensure_ascii=False`, as transformers defines it; keys in
//! the order they come, which serde_json sorts); Python string methods (`.strip()`, `.startswith()`...)
//! work through minijinja-contrib's `pycompat`.

use std::sync::Arc;

use minijinja::machinery::{self, Vm};
use minijinja::value::merge_maps;
use minijinja::{context, AutoEscape, Environment, ErrorKind, Value};

use crate::jinja_compile;
use crate::jinja_limits::{self, Budget};
use crate::{Error, Result, TemplateArgs, Tokenizer};

/// A Jinja chat template and where it came from (named in its errors).
#[derive(Debug, Clone)]
pub(crate) struct ChatTemplate {
    /// The template's source.
    pub(crate) text: String,
    /// Such as "GGUF metadata `tokenizer.chat_template`".
    pub(crate) origin: &'static str,
}

/// What a chat template is rendered for, the arguments of transformers'
/// `apply_chat_template(messages, tools=..., add_generation_prompt=..., **args)`: the
/// conversation (a list of [`crate::Message`]s, or of JSON messages with more fields, such as
/// `tool_calls`), the function list, whether the prompt ends where the assistant's reply
/// starts, and the keyword arguments.
pub(crate) struct Chat<'a, M> {
    pub(crate) messages: &'a [M],
    pub(crate) tools: Option<&'a serde_json::Value>,
    pub(crate) add_generation_prompt: bool,
    pub(crate) args: &'a TemplateArgs,
}

impl<'a, M> Chat<'a, M> {
    /// `messages` without tools.
    pub(crate) fn new(
        messages: &'a [M],
        add_generation_prompt: bool,
        args: &'a TemplateArgs,
    ) -> Self {
        Chat {
            messages,
            tools: None,
            add_generation_prompt,
            args,
        }
    }
}

/// Renders `template` for two sample conversations (system, user, assistant, user; and
/// user, assistant, user) with the generation prompt, under the budget of every request.
///
/// Errors: [`Error::Template`] naming the template's origin, for a syntax error or a
/// render past a limit. The template's own errors are accepted: it may refuse a
/// conversation (`raise_exception`, as Gemma's refuses system turns) or need keyword
/// arguments that only requests give.
pub(crate) fn check(tok: &Tokenizer, template: &ChatTemplate) -> Result<()> {
    use crate::Message;
    let turns = [
        Message::new("system", "You are a helpful assistant."),
        Message::new("user", "Hello."),
        Message::new("assistant", "Hello! How can I help?"),
        Message::new("user", "Tell me a story."),
    ];
    let none = TemplateArgs::new();
    for sample in [&turns[..], &turns[1..]] {
        match run(tok, &template.text, &Chat::new(sample, true, &none)) {
            Ok(_) | Err((_, Fatal(false))) => {}
            Err((e, Fatal(true))) => return Err(failure(template.origin, e)),
        }
    }
    Ok(())
}

/// Whether `template` reads the variable `name` anywhere (in a macro or block too): one of
/// the names minijinja finds undeclared in it. `false` for a template that does not
/// compile within the limits.
pub fn template_reads(template: &str, name: &str) -> bool {
    jinja_compile::check(template).is_ok()
        && Environment::new()
            .template_from_str(template)
            .is_ok_and(|t| t.undeclared_variables(false).contains(name))
}

/// Whether a render failed for a reason every conversation meets: the template does not
/// compile, or it ran past a limit.
struct Fatal(bool);

/// A minijinja error as [`Error::Template`], with its causes, naming the template.
fn failure(origin: &str, e: minijinja::Error) -> Error {
    let mut why = e.to_string();
    if e.kind() == ErrorKind::OutOfFuel {
        why += &format!(
            " (the limit of {} instructions a render)",
            jinja_limits::TEMPLATE_FUEL
        );
    }
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        why += &format!(": {s}");
        source = s.source();
    }
    Error::Template(format!("chat template ({origin}): {why}"))
}

/// The template variables that the conversation itself sets, which no keyword argument may
/// replace (transformers' `render_jinja_template` passes them by name beside `**kwargs`, so
/// Python refuses a duplicate).
const RESERVED: [&str; 3] = ["messages", "tools", "add_generation_prompt"];

/// Checks that `args` names none of the variables the conversation sets (`messages`,
/// `tools`, `add_generation_prompt`).
///
/// Errors: [`Error::Template`] naming the first such argument.
pub fn check_template_args(args: &TemplateArgs) -> Result<()> {
    match RESERVED.iter().find(|name| args.contains_key(**name)) {
        Some(name) => Err(Error::Template(format!(
            "the chat template argument `{name}` is set by the request itself and cannot be \
             given as a keyword argument"
        ))),
        None => Ok(()),
    }
}

/// Renders `template` for `chat`, within the budget of `jinja_limits.rs` (fuel, and caps on
/// the strings and sequences built and on the output).
///
/// Errors: [`Error::Template`] naming the template's origin, for an argument named as a
/// reserved variable ([`check_template_args`]), and with minijinja's message for a syntax
/// error, an undefined function, a `raise_exception` call (the template's message), and a
/// render past a limit (which limit).
pub(crate) fn render<M: serde::Serialize>(
    tok: &Tokenizer,
    template: &str,
    chat: &Chat<'_, M>,
) -> Result<String> {
    check_template_args(chat.args)?;
    run(tok, template, chat).map_err(|(e, _)| {
        let origin = tok.chat_template.as_ref().map_or("given", |t| t.origin);
        failure(origin, e)
    })
}

/// [`render`] without the argument check, its error told apart by whether it is
/// [`Fatal`].
fn run<M: serde::Serialize>(
    tok: &Tokenizer,
    template: &str,
    chat: &Chat<'_, M>,
) -> std::result::Result<String, (minijinja::Error, Fatal)> {
    let budget = Arc::new(Budget::default());
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.add_function(
        "raise_exception",
        |message: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
        },
    );
    jinja_limits::install(&mut env, &budget);
    let json_budget = Arc::clone(&budget);
    env.add_filter("tojson", move |value: Value| tojson(&json_budget, value));
    let token = |id: Option<u32>| {
        id.and_then(|id| tok.piece(id))
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default()
    };
    // The last map that holds a name gives its value.
    let ctx = merge_maps([
        context! {
            bos_token => token(tok.bos_id()),
            eos_token => token(tok.eos_id()),
        },
        Value::from_serialize(chat.args),
        context! {
            messages => chat.messages,
            tools => chat.tools,
            add_generation_prompt => chat.add_generation_prompt,
        },
    ]);
    let fatal = |e| (e, Fatal(true));
    jinja_compile::check(template).map_err(fatal)?;
    let compiled = env.template_from_str(template).map_err(fatal)?;
    let compiled = machinery::get_compiled_template(&compiled);
    let instructions = jinja_limits::bounded(&compiled.instructions).map_err(fatal)?;
    let blocks = compiled
        .blocks
        .iter()
        .map(|(name, block)| Ok((*name, jinja_limits::bounded(block)?)))
        .collect::<std::result::Result<_, minijinja::Error>>()
        .map_err(fatal)?;
    let mut text = String::new();
    Vm::new(&env)
        .eval(
            &instructions,
            ctx,
            &blocks,
            &mut machinery::make_string_output(&mut text),
            AutoEscape::None,
        )
        .map_err(|e| {
            let over = jinja_limits::is_over_limit(&e);
            (e, Fatal(over))
        })?;
    Ok(text)
}

/// Python's `json.dumps` separators: `", "` between items, `": "` after keys.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.begin_array_value(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

/// Fails once more than [`jinja_limits::MAX_TEMPLATE_TEXT`] bytes are written, so that
/// `tojson` refuses a huge value before building its text.
struct CappedWriter(Vec<u8>);

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > jinja_limits::MAX_TEMPLATE_TEXT {
            return Err(std::io::Error::other(format!(
                "the JSON text is past the limit of {} bytes",
                jinja_limits::MAX_TEMPLATE_TEXT
            )));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// transformers' `tojson` filter (see the module docs), within the render's budget.
fn tojson(budget: &Budget, value: Value) -> std::result::Result<Value, minijinja::Error> {
    let mut out = CappedWriter(Vec::new());
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
    serde::Serialize::serialize(&value, &mut ser)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    budget.text(out.0.len())?;
    let text = String::from_utf8(out.0)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(Value::from_safe_string(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::Message;

    #[test]
    fn tools_and_json_messages_reach_the_template() {
        let template = "{% for t in tools %}{{ t.function.name }};{% endfor %}\
                        {{ messages[0].tool_calls[0].function.name }}";
        let t = tok(template);
        let messages = [serde_json::json!({"role": "assistant", "content": null,
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]})];
        let tools = serde_json::json!([{"type": "function", "function": {"name": "g"}},
            {"type": "function", "function": {"name": "h"}}]);
        let none = none();
        let without = Chat::new(&messages, false, &none);
        let with = Chat {
            tools: Some(&tools),
            ..Chat::new(&messages, false, &none)
        };
        assert_eq!(render(&t, template, &with).unwrap(), "g;h;f");
        assert_eq!(render(&t, "{{ tools is none }}", &without).unwrap(), "True");
        // As Python's json.dumps(..., ensure_ascii=False) writes it.
        assert_eq!(
            render(&t, "{{ tools[0] | tojson }}", &with).unwrap(),
            r#"{"function": {"name": "g"}, "type": "function"}"#
        );
        assert_eq!(
            render(&t, "{{ ['é', 1.5, none] | tojson }}", &without).unwrap(),
            r#"["é", 1.5, null]"#
        );
    }

    fn tok(template: &str) -> Tokenizer {
        let pieces = ["<unk>", "<s>", "</s>", "\u{2581}a"];
        let spec = crate::TokenizerSpec {
            kind: crate::TokenizerKind::SentencePieceBpe(crate::SentencePieceSpec {
                add_dummy_prefix: true,
                remove_extra_whitespaces: false,
                escape_whitespaces: true,
                unk_surface: b" ? ".to_vec(),
            }),
            pieces: pieces.iter().map(|p| p.as_bytes().to_vec()).collect(),
            scores: vec![0.0; 4],
            types: [2, 3, 3, 1]
                .map(|t| crate::PieceType::try_from(t).unwrap())
                .to_vec(),
            byte_fallback: false,
            unk_id: Some(0),
            bos_id: Some(1),
            eos_id: Some(2),
            add_bos: true,
            chat_template: None,
            prefix: None,
            chat_format: None,
        };
        // Set without the load check, so that broken templates reach `render`.
        let mut tok = Tokenizer::from_spec(spec).unwrap();
        tok.chat_template = Some(ChatTemplate {
            text: template.into(),
            origin: "test",
        });
        tok
    }

    fn render_one(template: &str, messages: &[Message], gen: bool) -> Result<String> {
        let t = tok(template);
        render(
            &t,
            t.chat_template().unwrap(),
            &Chat::new(messages, gen, &none()),
        )
    }

    fn none() -> TemplateArgs {
        TemplateArgs::new()
    }

    fn args(json: serde_json::Value) -> TemplateArgs {
        json.as_object().unwrap().clone()
    }

    #[test]
    fn keyword_arguments_reach_the_template_and_override_the_special_tokens() {
        let t = tok("");
        let msgs = [Message::new("user", "hi")];
        let template = "{{ bos_token }}|{{ flag }}|{{ n + 1 }}|{{ names | join(',') }}|\
                        {{ opts.depth }}|{{ messages[0].content }}|{{ missing is defined }}";
        let given = args(
            serde_json::json!({"flag": false, "n": 2, "names": ["a", "b"],
            "opts": {"depth": 3}, "bos_token": "[BOS]"}),
        );
        assert_eq!(
            render(&t, template, &Chat::new(&msgs, true, &given)).unwrap(),
            "[BOS]|False|3|a,b|3|hi|False"
        );
        assert_eq!(
            render(&t, "{{ bos_token }}", &Chat::new(&msgs, true, &none())).unwrap(),
            "<s>"
        );
    }

    #[test]
    fn keyword_arguments_may_not_replace_the_conversation() {
        let t = tok("");
        let msgs = [Message::new("user", "hi")];
        for name in RESERVED {
            let given = args(serde_json::json!({ name: [] }));
            let err = render(&t, "{{ messages }}", &Chat::new(&msgs, true, &given)).unwrap_err();
            assert!(err.to_string().contains(&format!("`{name}`")), "{err}");
        }
    }

    /// Expected strings: what Python's jinja2 3.1.6 renders for the same template and
    /// variables in transformers' environment (`trim_blocks`, `lstrip_blocks`).
    #[test]
    fn hf_semantics() {
        let msgs = [Message::new("system", " sys "), Message::new("user", "hi")];
        let t = "{{ bos_token }}{% for m in messages %}\n    {% if m.role == 'user' %}\n\
                 [U]{{ m['content'] }}{{ eos_token }}\n    {% else %}\n[{{ m.role|upper }}]\
                 {{ m.content.strip() }}\n    {% endif %}\n{% endfor %}\
                 {% if add_generation_prompt %}[A]{% endif %}";
        assert_eq!(
            render_one(t, &msgs, true).unwrap(),
            "<s>[SYSTEM]sys\n[U]hi</s>\n[A]"
        );
        assert_eq!(
            render_one(t, &msgs, false).unwrap(),
            "<s>[SYSTEM]sys\n[U]hi</s>\n"
        );
    }

    #[test]
    fn raise_exception_and_syntax_errors_are_errors() {
        let t = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must \
                 start with the user') }}{% endif %}ok";
        let msgs = [Message::new("assistant", "x")];
        let err = render_one(t, &msgs, true).unwrap_err().to_string();
        assert!(
            err.contains("Conversation must start with the user"),
            "{err}"
        );
        assert_eq!(
            render_one(t, &[Message::new("user", "x")], true).unwrap(),
            "ok"
        );
        assert!(render_one("{% for %}", &msgs, true).is_err());
        assert!(render_one("{{ undefined_function() }}", &msgs, true).is_err());
    }
}
