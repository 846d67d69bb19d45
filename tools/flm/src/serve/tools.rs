//! Tool calls in OpenAI's shape: the request's `tools` go to the model's chat template
//! ([`flm_tokenizer::Tokenizer::encode_chat_with_tools`]), and the reply's calls, written
//! in the Hermes format that Qwen2.5, Qwen3 and many fine-tunes use
//! (`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`) or, as Llama 3.1
//! answers, as a reply that is one JSON object `{"name": ..., "parameters": {...}}`, come
//! back as `tool_calls` with `finish_reason: "tool_calls"`. A forced call is written in
//! the Hermes format when the template mentions `<tool_call>`, else in Llama 3.1's.
//!
//! `tool_choice`: `none` (the reply is text, nothing is parsed), `auto` (the default: calls
//! are parsed where the model writes them), `required` or a named function: the reply is
//! constrained ([`flm_core::Constraint`]) to one call of one of the tools (or of the named
//! one), its arguments to the function's `parameters` schema as [`super::schema`] writes
//! schemas, so the call always parses and validates. A stream with tools parsed sends the
//! reply's text and calls in one delta at the end, since a call is known only when its
//! closing tag arrives.
//!
//! gpt-oss (a harmony vocabulary) calls a tool by a message of its own, addressed to
//! `functions.NAME` ([`flm_tokenizer::HarmonySplitter`] keeps it apart from the text), so
//! its reasoning and answer stream as they come and its calls follow in the last delta. A
//! call forced to one function (named, or `required` with one tool) is opened by the
//! prompt, which ends with the call's header ([`flm_tokenizer::HarmonyCall::json_header`]),
//! and the reply is constrained to the arguments alone; `required` among several tools is
//! forced in Llama 3.1's JSON, as for other templates without `<tool_call>`.

use flm_core::Pattern;
use flm_tokenizer::HarmonyCall;
use serde_json::{json, Value};

use super::error::ApiError;
use super::schema;

/// What `tool_choice` asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Text only.
    None,
    /// Text or calls, as the model writes.
    Auto,
    /// One call of any tool.
    Required,
    /// One call of this function.
    Named(String),
}

/// A request's checked tools.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    /// The `tools` array as given, for the template.
    pub list: Value,
    /// `tool_choice`.
    pub choice: Choice,
    /// Each function's name and `parameters` schema.
    functions: Vec<(String, Value)>,
    /// Forced calls in the Hermes format (else Llama 3.1's JSON).
    hermes: bool,
}

fn bad(param: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(Some(param), message)
}

/// Checks `tools` and `tool_choice`; `None` when the request has no tools.
///
/// Errors: 400 for a tool that is not `{"type": "function", "function": {"name", ...}}`
/// with a name of 1 to 64 letters, digits, `_` or `-`, `parameters` that are not an object,
/// two tools of one name, a `tool_choice` that is not `none`, `auto`, `required` or
/// `{"type": "function", "function": {"name": N}}`, a named tool that is not in `tools`,
/// `required` or a named tool without tools, and tools (with a `tool_choice` other than
/// `none`) that `template`, the model's chat template, never reads: they would be dropped
/// unseen. The template also tells the format of forced calls.
pub fn check(
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
    template: Option<&str>,
) -> Result<Option<Tools>, ApiError> {
    let list = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list.clone(),
        Some(_) => return Err(bad("tools", "tools must be an array")),
    };
    let mut functions = Vec::new();
    for tool in &list {
        let function = &tool["function"];
        if tool["type"] != "function" || !function.is_object() {
            return Err(bad(
                "tools",
                "each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
            ));
        }
        let name = function["name"].as_str().unwrap_or_default();
        let valid = (1..=64).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(bad(
                "tools",
                format!("a function name must be 1 to 64 letters, digits, _ or -, got {name:?}"),
            ));
        }
        if functions.iter().any(|(n, _)| n == name) {
            return Err(bad("tools", format!("two tools are named {name}")));
        }
        let parameters = match &function["parameters"] {
            Value::Null => json!({"type": "object", "properties": {}}),
            p @ Value::Object(_) => p.clone(),
            _ => {
                return Err(bad(
                    "tools",
                    format!("the parameters of {name} must be a schema"),
                ))
            }
        };
        functions.push((name.to_owned(), parameters));
    }
    let choice = match tool_choice {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) if s == "none" => Choice::None,
        Some(Value::String(s)) if s == "auto" => Choice::Auto,
        Some(Value::String(s)) if s == "required" => Choice::Required,
        Some(v) if v["type"] == "function" && v["function"]["name"].is_string() => {
            let name = v["function"]["name"].as_str().unwrap_or_default();
            if !functions.iter().any(|(n, _)| n == name) {
                return Err(bad(
                    "tool_choice",
                    format!("unknown tool `{name}`: it is not in tools"),
                ));
            }
            Choice::Named(name.to_owned())
        }
        Some(v) => {
            return Err(bad(
                "tool_choice",
                format!("tool_choice must be none, auto, required or a named function, got {v}"),
            ))
        }
    };
    if functions.is_empty() {
        if matches!(choice, Choice::Required | Choice::Named(_)) {
            return Err(bad(
                "tool_choice",
                "tool_choice asks for a call, but there are no tools",
            ));
        }
        return Ok(None);
    }
    if let Some(template) = template.filter(|_| !matches!(choice, Choice::None)) {
        if !flm_tokenizer::template_reads(template, "tools") {
            return Err(bad(
                "tools",
                "the model's chat template never reads `tools`, so the model would not see \
                 them: describe them in a message instead",
            ));
        }
    }
    Ok(Some(Tools {
        list: Value::Array(list),
        choice,
        functions,
        hermes: template.is_none_or(|t| t.contains("<tool_call>")),
    }))
}

impl Tools {
    /// The one function a call is forced to: the named tool, or the only tool with
    /// `required`; `None` for `auto`, `none` and `required` among several tools.
    pub fn forced(&self) -> Option<&str> {
        match &self.choice {
            Choice::Named(name) => Some(name),
            Choice::Required if self.functions.len() == 1 => Some(&self.functions[0].0),
            _ => None,
        }
    }

    /// Whether a call is forced among several tools (`required`): harmony cannot open it
    /// in the prompt, so it is written as text (Llama 3.1's JSON) and parsed from it.
    pub fn required_among_several(&self) -> bool {
        self.choice == Choice::Required && self.functions.len() > 1
    }

    /// The language of function `name`'s arguments, its `parameters` schema's.
    ///
    /// Errors: 400 about `tools` for `parameters` that [`super::schema`] does not support.
    pub fn arguments(&self, name: &str) -> Result<Pattern, ApiError> {
        let parameters = self
            .functions
            .iter()
            .find(|(n, _)| n == name)
            .map_or(&Value::Null, |(_, p)| p);
        arguments(name, parameters)
    }

    /// The language of the reply for `required` or a named tool: one call in the Hermes
    /// format; `None` otherwise.
    ///
    /// Errors: those of [`Tools::arguments`].
    pub fn pattern(&self) -> Result<Option<Pattern>, ApiError> {
        let chosen: Vec<&(String, Value)> = match &self.choice {
            Choice::None | Choice::Auto => return Ok(None),
            Choice::Required => self.functions.iter().collect(),
            Choice::Named(name) => self.functions.iter().filter(|(n, _)| n == name).collect(),
        };
        let calls = chosen
            .into_iter()
            .map(|(name, parameters)| {
                let arguments = arguments(name, parameters)?;
                let (head, tail) = if self.hermes {
                    let head = format!("<tool_call>\n{{\"name\": {}, \"arguments\": ", json!(name));
                    (head, "}\n</tool_call>")
                } else {
                    (
                        format!("{{\"name\": {}, \"parameters\": ", json!(name)),
                        "}",
                    )
                };
                Ok(Pattern::Seq(vec![
                    Pattern::Literal(head),
                    arguments,
                    Pattern::Literal(tail.into()),
                ]))
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        Ok(Some(Pattern::Alt(calls)))
    }

    /// The reply `text` as content (what is outside the calls, trimmed; `None` when empty)
    /// and calls (OpenAI's `tool_calls` objects, ids `{id}-{i}`); all text with `none`.
    /// A `<tool_call>` block that is not a JSON object with a `name` stays in the content;
    /// without blocks, a reply that is one JSON object naming one of the tools is a call.
    pub fn parse(&self, text: &str, id: &str) -> (Option<String>, Vec<Value>) {
        if self.choice == Choice::None {
            return (Some(text.to_owned()), Vec::new());
        }
        let (open, close) = ("<tool_call>", "</tool_call>");
        let (mut content, mut calls, mut rest) = (String::new(), Vec::new(), text);
        while let Some(start) = rest.find(open) {
            let after = &rest[start + open.len()..];
            let Some(end) = after.find(close) else {
                break;
            };
            match call(
                after[..end].trim(),
                &format!("{id}-{}", calls.len()),
                |_| true,
            ) {
                Some(call) => {
                    content.push_str(&rest[..start]);
                    calls.push(call);
                }
                None => content.push_str(&rest[..start + open.len() + end + close.len()]),
            }
            rest = &after[end + close.len()..];
        }
        content.push_str(rest);
        let content = content.trim();
        if calls.is_empty() {
            let known = |name: &str| self.functions.iter().any(|(n, _)| n == name);
            if let Some(call) = call(content, &format!("{id}-0"), known) {
                return (None, vec![call]);
            }
        }
        ((!content.is_empty()).then(|| content.to_owned()), calls)
    }

    /// OpenAI's `tool_calls` objects (ids `{id}-{i}`) of a harmony reply's `calls`: those
    /// addressed to `functions.NAME` for one of the request's tools, their arguments as the
    /// model wrote them; none with `tool_choice: none`. A call to anything else (gpt-oss's
    /// built-in `browser` and `python` tools, which the server does not offer) is dropped.
    pub fn harmony_calls(&self, calls: &[HarmonyCall], id: &str) -> Vec<Value> {
        if self.choice == Choice::None {
            return Vec::new();
        }
        calls
            .iter()
            .filter_map(|c| Some((c.recipient.strip_prefix("functions.")?, c)))
            .filter(|(name, _)| self.functions.iter().any(|(n, _)| n == name))
            .enumerate()
            .map(|(i, (name, c))| {
                json!({
                    "id": format!("{id}-{i}"),
                    "type": "function",
                    "function": {"name": name, "arguments": c.arguments.trim()},
                })
            })
            .collect()
    }
}

/// The language of the arguments of function `name`, whose `parameters` schema it is.
///
/// Errors: 400 about `tools` for `parameters` that [`super::schema`] does not support.
fn arguments(name: &str, parameters: &Value) -> Result<Pattern, ApiError> {
    schema::pattern(parameters).map_err(|mut e| {
        e.param = Some("tools");
        e.message = format!("the parameters of {name}: {}", e.message);
        e
    })
}

/// The `tool_calls` object `id` of `text`, a JSON object with a `name` that `accept`s and
/// its `arguments` (or Llama 3.1's `parameters`), if it is one.
fn call(text: &str, id: &str, accept: impl Fn(&str) -> bool) -> Option<Value> {
    let call: Value = serde_json::from_str(text).ok()?;
    let name = call["name"].as_str().filter(|n| accept(n))?;
    let arguments = match &call["arguments"] {
        Value::Null => &call["parameters"],
        a => a,
    };
    let arguments = match arguments {
        Value::String(s) => s.clone(),
        Value::Null => "{}".into(),
        a => a.to_string(),
    };
    Some(json!({
        "id": id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "parameters":
            {"type": "object", "properties": {"city": {"type": "string"}}}}}])
    }

    /// Tools are refused when the template never reads `tools` (but for
    /// `tool_choice: none`), and kept when it reads them anywhere, a macro included.
    #[test]
    fn tools_a_template_never_reads_are_refused() {
        let plain = "{% for m in messages %}{{ m.content }}{% endfor %}";
        let e = check(Some(&weather()), None, Some(plain)).unwrap_err();
        assert_eq!(e.param, Some("tools"));
        assert!(e.message.contains("never reads `tools`"), "{}", e.message);
        assert!(check(Some(&weather()), Some(&json!("none")), Some(plain)).is_ok());
        let in_macro = "{% macro show(t) %}{{ t | tojson }}{% endmacro %}\
                        {% if tools %}{{ show(tools) }}{% endif %}{{ messages[0].content }}";
        for template in ["{{ tools }}", in_macro] {
            assert!(check(Some(&weather()), None, Some(template))
                .unwrap()
                .is_some());
        }
    }

    #[test]
    fn calls_are_parsed_from_the_hermes_format() {
        let tools = check(Some(&weather()), None, None).unwrap().unwrap();
        let text = "Let me see.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
                    {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>oops</tool_call>";
        let (content, calls) = tools.parse(text, "call");
        assert_eq!(
            content.as_deref(),
            Some("Let me see.\n\n<tool_call>oops</tool_call>")
        );
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0]["id"], "call-0");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert_eq!(calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
        assert_eq!(
            tools.parse("plain", "c"),
            (Some("plain".into()), Vec::new())
        );
        // Llama 3.1's format: the whole reply is the call.
        let llama = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}";
        let (content, calls) = tools.parse(llama, "c");
        assert_eq!(content, None);
        assert_eq!(calls[0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
        let unknown = "{\"name\": \"get_news\", \"parameters\": {}}";
        assert_eq!(tools.parse(unknown, "c").1, Vec::<Value>::new());
        let llama_tools = check(
            Some(&weather()),
            Some(&json!("required")),
            Some("{{ tools }}"),
        );
        let forced = llama_tools.unwrap().unwrap().pattern().unwrap().unwrap();
        let Pattern::Alt(calls) = forced else {
            panic!("{forced:?}")
        };
        assert!(matches!(&calls[0], Pattern::Seq(p)
            if p[0] == Pattern::Literal("{\"name\": \"get_weather\", \"parameters\": ".into())));
    }

    /// gpt-oss's calls: those to `functions.NAME` of a requested tool, numbered in order;
    /// calls to its built-in tools, or to tools not requested, are not OpenAI calls.
    #[test]
    fn harmony_calls_are_the_requested_functions() {
        let call = |recipient: &str, arguments: &str| HarmonyCall {
            recipient: recipient.into(),
            channel: "commentary".into(),
            constrain: "json".into(),
            arguments: arguments.into(),
        };
        let calls = [
            call("browser.search", "{\"query\": \"x\"}"),
            call("functions.get_weather", " {\"city\": \"Paris\"}\n"),
            call("functions.get_news", "{}"),
            call("functions.get_weather", "{\"city\": \"Oslo\"}"),
        ];
        let auto = check(Some(&weather()), None, Some("{{ tools }}"))
            .unwrap()
            .unwrap();
        let out = auto.harmony_calls(&calls, "c");
        assert_eq!(
            out,
            [
                json!({"id": "c-0", "type": "function", "function":
                    {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}),
                json!({"id": "c-1", "type": "function", "function":
                    {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}),
            ]
        );
        let none = check(Some(&weather()), Some(&json!("none")), None);
        assert!(none.unwrap().unwrap().harmony_calls(&calls, "c").is_empty());
    }

    /// A call is forced to one function when named, or `required` with one tool; among
    /// several it is written as text.
    #[test]
    fn the_forced_function() {
        let two = json!([weather()[0], {"type": "function", "function": {"name": "get_time"}}]);
        let named = json!({"type": "function", "function": {"name": "get_time"}});
        let forced = |tools: &Value, choice: Value| {
            let t = check(Some(tools), Some(&choice), None).unwrap().unwrap();
            (t.forced().map(str::to_owned), t.required_among_several())
        };
        assert_eq!(forced(&two, named), (Some("get_time".into()), false));
        assert_eq!(forced(&two, json!("required")), (None, true));
        assert_eq!(
            forced(&weather(), json!("required")),
            (Some("get_weather".into()), false)
        );
        assert_eq!(forced(&two, json!("auto")), (None, false));
    }

    /// 5,000 tools, one call required, once stalled the server. The
    /// language compiles within the budget of [`flm_core::Grammar`], or is refused naming it.
    #[test]
    fn thousands_of_required_tools_compile_within_the_budget() {
        let many: Vec<Value> = (0..5000)
            .map(|i| {
                json!({"type": "function", "function": {"name": format!("tool_{i}"),
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
            })
            .collect();
        let tools = check(Some(&Value::Array(many)), Some(&json!("required")), None);
        let pattern = tools.unwrap().unwrap().pattern().unwrap().unwrap();
        let bytes: Vec<_> = (0..=255u8).map(|b| Some(vec![b])).collect();
        let bytes = std::sync::Arc::new(flm_core::Vocabulary::new(&bytes));
        if let Err(e) = flm_core::Grammar::new(&pattern, bytes, flm_core::MAX_COMPILE_TIME) {
            assert!(e.to_string().contains("limit"), "{e}");
        }
    }

    #[test]
    fn bad_tools_and_choices_are_400s() {
        let bad_tools = [
            json!("x"),
            json!([{"type": "function"}]),
            json!([{"type": "function", "function": {"name": "a b"}}]),
            json!([{"type": "function", "function": {"name": "f", "parameters": 3}}]),
            json!([{"type": "function", "function": {"name": "f"}},
                   {"type": "function", "function": {"name": "f"}}]),
        ];
        for tools in bad_tools {
            let e = check(Some(&tools), None, None).unwrap_err();
            assert_eq!(
                (e.status.as_u16(), e.param),
                (400, Some("tools")),
                "{tools}"
            );
        }
        let named = json!({"type": "function", "function": {"name": "other"}});
        for choice in [json!("sometimes"), named] {
            let e = check(Some(&weather()), Some(&choice), None).unwrap_err();
            assert_eq!(e.param, Some("tool_choice"), "{choice}");
        }
        let e = check(None, Some(&json!("required")), None).unwrap_err();
        assert_eq!(e.param, Some("tool_choice"));
        assert_eq!(check(None, None, None), Ok(None));
        let required = check(Some(&weather()), Some(&json!("required")), None)
            .unwrap()
            .unwrap();
        assert!(required.pattern().unwrap().is_some());
    }
}
