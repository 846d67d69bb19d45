//! Jinja chat templates rendered with minijinja under the semantics of transformers'
//! `PreTrainedTokenizerBase.apply_chat_template` (`utils/chat_template_utils.py`): the
//! environment has `trim_blocks` and `lstrip_blocks` on, the template sees `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token` and `tools` (none unless given), and may call
//! `raise_exception(message)`, `strftime_now(format)` (the host's local date and time, as
//! Python's, or the time fixed by [`Tokenizer::set_template_time`]; `strftime.rs`) and the filter `tojson` (Python's `json.dumps` with its default
//! separators `", "` and `": "` and `ensure_ascii=False`, as transformers defines it, and its
//! keyword arguments `ensure_ascii`, `indent`, `separators` and `sort_keys`); Python string
//! methods (`.strip()`, `.startswith()`...) work through minijinja-contrib's `pycompat`.
//! JSON objects (tool schemas, tool-call arguments) keep their keys in the order they were
//! written, as Python dicts do (serde_json's and minijinja's `preserve_order`): a template
//! that prints a tool with `tojson` writes it as transformers does.

use std::sync::Arc;

use minijinja::machinery::{self, Vm};
use minijinja::value::{merge_maps, Kwargs};
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
    let now = tok.template_time.unwrap_or_else(|| {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let utc = since.map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        utc.saturating_add(crate::strftime::local_offset(utc))
    });
    env.add_function("strftime_now", move |format: String| {
        crate::strftime::strftime(&format, now)
    });
    jinja_limits::install(&mut env, &budget);
    let json_budget = Arc::clone(&budget);
    env.add_filter("tojson", move |value: Value, kwargs: Kwargs| {
        tojson(&json_budget, value, kwargs)
    });
    let token = |id: Option<u32>| {
        id.and_then(|id| tok.piece(id))
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default()
    };
    let messages = serde_json::to_value(chat.messages)
        .map(alias_reasoning_fields)
        .map_err(|e| {
            let e = minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string());
            (e, Fatal(false))
        })?;
    // The last map that holds a name gives its value.
    let ctx = merge_maps([
        context! {
            bos_token => token(tok.bos_id()),
            eos_token => token(tok.eos_id()),
        },
        Value::from_serialize(chat.args),
        context! {
            messages => messages,
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

/// The names of a message's reasoning, as transformers reads them (`_REASONING_FIELDS`).
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// transformers' `_alias_reasoning_fields`: a message with reasoning under any of
/// [`REASONING_FIELDS`] (the first that is not null) gets it as `thinking` (which gpt-oss's
/// template reads; placed first unless the message has that key) and as
/// `reasoning_content`, so that OpenAI-style `reasoning_content` reaches every template.
fn alias_reasoning_fields(mut messages: serde_json::Value) -> serde_json::Value {
    let Some(list) = messages.as_array_mut() else {
        return messages;
    };
    for message in list {
        let Some(map) = message.as_object_mut() else {
            continue;
        };
        let reasoning = REASONING_FIELDS
            .iter()
            .find_map(|k| map.get(*k).filter(|v| !v.is_null()))
            .cloned();
        if let Some(reasoning) = reasoning {
            // {"thinking": reasoning, **message, "reasoning_content": reasoning}
            let mut aliased = serde_json::Map::new();
            aliased.insert("thinking".into(), reasoning.clone());
            aliased.extend(std::mem::take(map));
            aliased.insert("reasoning_content".into(), reasoning);
            *map = aliased;
        }
    }
    messages
}

/// How transformers' `tojson` filter writes JSON: Python's `json.dumps` with the filter's
/// keyword arguments (`ensure_ascii`, `indent`, `separators`, `sort_keys`).
struct PythonFormatter {
    /// Between items: `", "`, or `","` when indenting.
    item_separator: String,
    /// After keys: `": "`.
    key_separator: String,
    /// The indentation of one level (`indent`: that many spaces, or the string given);
    /// `None`: all on one line.
    indent: Option<String>,
    /// How deep the value being written is.
    depth: usize,
    /// Whether the container being closed had items (an empty one stays `[]`, `{}`).
    has_items: bool,
    /// Characters outside ASCII as `\uXXXX` escapes (UTF-16 surrogate pairs above the
    /// Basic Multilingual Plane).
    ensure_ascii: bool,
}

impl PythonFormatter {
    /// A new line and the indentation of the current depth, when indenting.
    fn line<W: ?Sized + std::io::Write>(&self, writer: &mut W) -> std::io::Result<()> {
        match &self.indent {
            Some(unit) => {
                writer.write_all(b"\n")?;
                (0..self.depth).try_for_each(|_| writer.write_all(unit.as_bytes()))
            }
            None => Ok(()),
        }
    }

    fn open<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        c: &[u8],
    ) -> std::io::Result<()> {
        self.depth += 1;
        self.has_items = false;
        writer.write_all(c)
    }

    fn close<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        c: &[u8],
    ) -> std::io::Result<()> {
        self.depth -= 1;
        if self.has_items {
            self.line(writer)?;
        }
        self.has_items = true;
        writer.write_all(c)
    }

    fn item<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if !first {
            writer.write_all(self.item_separator.as_bytes())?;
        }
        self.has_items = true;
        self.line(writer)
    }
}

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.open(writer, b"[")
    }

    fn end_array<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.close(writer, b"]")
    }

    fn begin_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.open(writer, b"{")
    }

    fn end_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.close(writer, b"}")
    }

    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(writer, first)
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(self.key_separator.as_bytes())
    }

    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        if !self.ensure_ascii {
            return writer.write_all(fragment.as_bytes());
        }
        for c in fragment.chars() {
            if c.is_ascii() {
                writer.write_all(&[c as u8])?;
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(writer, "\\u{unit:04x}")?;
                }
            }
        }
        Ok(())
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

/// transformers' `tojson` filter (see the module docs), within the render's budget:
/// `tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)` as
/// keyword arguments (GLM-4.5's template writes `tool | tojson(ensure_ascii=False)`).
/// Keys come in the order the value has them (see the module docs), or sorted with
/// `sort_keys`.
fn tojson(
    budget: &Budget,
    value: Value,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let bad =
        |why: String| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {why}"));
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_str(), i64::try_from(v.clone())) {
            (Some(s), _) => Some(s.to_owned()),
            (None, Ok(n)) => Some(" ".repeat(usize::try_from(n).unwrap_or(0).min(64))),
            _ => return Err(bad(format!("indent {v} is not a number or a string"))),
        },
    };
    let (item_separator, key_separator) = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let pair: Vec<String> = v
                .try_iter()
                .map_err(|_| bad(format!("separators {v} is not a pair of strings")))?
                .map(|s| s.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| bad(format!("separators {v} is not a pair of strings")))?;
            match <[String; 2]>::try_from(pair) {
                Ok([item, key]) => (item, key),
                Err(_) => return Err(bad(format!("separators {v} is not a pair of strings"))),
            }
        }
        // Python's defaults: ", " between items, or "," when indenting; ": " after keys.
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    kwargs.assert_all_used()?;
    let formatter = PythonFormatter {
        item_separator,
        key_separator,
        indent,
        depth: 0,
        has_items: false,
        ensure_ascii,
    };
    let mut out = CappedWriter(Vec::new());
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    if sort_keys {
        let mut json = serde_json::to_value(&value).map_err(|e| bad(e.to_string()))?;
        sort_keys_of(&mut json);
        serde::Serialize::serialize(&json, &mut ser)
    } else {
        serde::Serialize::serialize(&value, &mut ser)
    }
    .map_err(|e| bad(e.to_string()))?;
    budget.text(out.0.len())?;
    let text = String::from_utf8(out.0)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(Value::from_safe_string(text))
}

/// Sorts the keys of every object in `value`, as `json.dumps(sort_keys=True)` does.
fn sort_keys_of(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            map.sort_keys();
            map.values_mut().for_each(sort_keys_of);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(sort_keys_of),
        _ => {}
    }
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
        // As Python's json.dumps(..., ensure_ascii=False) writes it, keys in their order.
        assert_eq!(
            render(&t, "{{ tools[0] | tojson }}", &with).unwrap(),
            r#"{"type": "function", "function": {"name": "g"}}"#
        );
        assert_eq!(
            render(&t, "{{ ['é', 1.5, none] | tojson }}", &without).unwrap(),
            r#"["é", 1.5, null]"#
        );
    }

    /// transformers' `tojson` keyword arguments; the expected text is what its Jinja
    /// environment renders (transformers 5.25, jinja2 3.1.6) for the same template.
    #[test]
    fn tojson_takes_pythons_keyword_arguments() {
        let t = tok("");
        let template = "{% set v = {'b': [1, 'é😀', {}], 'a': {'x': none, 'y': []}, 'c': 'q\"\\n'} %}{{ v | tojson }}|{{ v | tojson(ensure_ascii=True) }}|{{ v | tojson(indent=2) }}|{{ v | tojson(separators=(',', ':')) }}|{{ v | tojson(sort_keys=True, indent='\t') }}";
        let expected = "{\"b\": [1, \"é😀\", {}], \"a\": {\"x\": null, \"y\": []}, \"c\": \"q\\\"\\n\"}|{\"b\": [1, \"\\u00e9\\ud83d\\ude00\", {}], \"a\": {\"x\": null, \"y\": []}, \"c\": \"q\\\"\\n\"}|{\n  \"b\": [\n    1,\n    \"é😀\",\n    {}\n  ],\n  \"a\": {\n    \"x\": null,\n    \"y\": []\n  },\n  \"c\": \"q\\\"\\n\"\n}|{\"b\":[1,\"é😀\",{}],\"a\":{\"x\":null,\"y\":[]},\"c\":\"q\\\"\\n\"}|{\n\t\"a\": {\n\t\t\"x\": null,\n\t\t\"y\": []\n\t},\n\t\"b\": [\n\t\t1,\n\t\t\"é😀\",\n\t\t{}\n\t],\n\t\"c\": \"q\\\"\\n\"\n}";
        let msgs = [Message::new("user", "hi")];
        assert_eq!(
            render(&t, template, &Chat::new(&msgs, false, &none())).unwrap(),
            expected
        );
        let err = render(
            &t,
            "{{ 1 | tojson(colour=1) }}",
            &Chat::new(&msgs, false, &none()),
        );
        assert!(err.is_err());
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
