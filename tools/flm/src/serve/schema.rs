//! `response_format`: structured output as a regular language of JSON texts (or of a
//! regular expression), which the engine enforces token by token
//! ([`flm_core::Constraint`]).
//!
//! `{"type": "regex", "regex": R}` (an extension, as vLLM's guided regex) is the texts
//! that R matches whole, parsed by `regex-syntax`; an unbounded repetition (`*`, `+`,
//! `{n,}`) stops after 64 more, so that every reply ends; anchors and look-arounds are
//! a 400. The language constrains the tokens' bytes as decoded mid-text, so a chat reply,
//! whose first SentencePiece space is dropped when shown, should not start with a space.
//!
//! `{"type": "json_object"}` is any JSON object up to a fixed size (keys and strings of at
//! most 16 characters, at most 4 members or items, nested 2 deep); `{"type": "json_schema",
//! "json_schema": {"schema": S}}` is the JSON texts that S accepts, written compactly with
//! the members of an object in the order of their names, every property present (as
//! Outlines writes a schema as a regular expression, Willard & Louf 2023). Strings hold
//! printable ASCII without escapes, at most `maxLength` (default 24, at most 256)
//! characters; integers at most 9 digits, numbers 4 decimals; arrays at most `maxItems`
//! (default `minItems` + 4, at most 16) items. So every reply ends, and parses and
//! validates against S.
//!
//! The supported keywords: `type` (one or a list), `properties`, `required` (each must be a
//! property), `items`, `minItems`, `maxItems`, `minLength`, `maxLength`, `enum`, `const`,
//! `anyOf`, `oneOf` (as `anyOf`: the alternatives of the schemas allowed are expected to be
//! disjoint), `minimum` of 0 or more on integers and numbers (no minus sign), and the
//! annotations (`title`, `description`, `$schema`, `default`, `examples`,
//! `additionalProperties`, which no reply uses). Anything else is a 400 naming it, as is a
//! schema that is not an object or a boolean.

use flm_core::Pattern;
use serde_json::Value;

use super::error::ApiError;

/// Keys and generic strings of `json_object`, at most.
const OBJECT_STRING: usize = 16;
/// Members of an object or items of an array of `json_object`, at most.
const OBJECT_ITEMS: usize = 4;
/// Nesting of `json_object` below the top object.
const OBJECT_DEPTH: usize = 2;
/// Default and largest `maxLength`.
const STRING_DEFAULT: usize = 24;
const STRING_MAX: usize = 256;
/// Largest `maxItems`.
const ITEMS_MAX: usize = 16;
/// Deepest nesting of schemas.
const DEPTH_MAX: usize = 16;

/// Keywords that describe and constrain nothing a reply of ours could break.
const ANNOTATIONS: [&str; 6] = [
    "title",
    "description",
    "$schema",
    "default",
    "examples",
    "additionalProperties",
];

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::invalid(Some("response_format"), message)
}

/// A JSON string of `min` to `max` printable ASCII characters, none a quote or backslash.
fn string(min: usize, max: usize) -> Pattern {
    let char = Pattern::Class(vec![(' ', '!'), ('#', '['), (']', '~')]);
    Pattern::Seq(vec![
        Pattern::literal("\""),
        Pattern::repeat(char, min, max),
        Pattern::literal("\""),
    ])
}

/// A JSON integer of at most 9 digits, without a minus sign if `non_negative`.
fn integer(non_negative: bool) -> Pattern {
    let digits = Pattern::Alt(vec![
        Pattern::literal("0"),
        Pattern::Seq(vec![
            Pattern::Class(vec![('1', '9')]),
            Pattern::repeat(Pattern::Class(vec![('0', '9')]), 0, 8),
        ]),
    ]);
    if non_negative {
        digits
    } else {
        Pattern::Seq(vec![Pattern::repeat(Pattern::literal("-"), 0, 1), digits])
    }
}

/// A JSON number: an integer with up to 4 decimals.
fn number(non_negative: bool) -> Pattern {
    let fraction = Pattern::Seq(vec![
        Pattern::literal("."),
        Pattern::repeat(Pattern::Class(vec![('0', '9')]), 1, 4),
    ]);
    Pattern::Seq(vec![integer(non_negative), Pattern::repeat(fraction, 0, 1)])
}

/// `open`, then `min` to `max` of `item` separated by commas, then `close`.
fn list(open: &str, item: Pattern, min: usize, max: usize, close: &str) -> Pattern {
    let rest = Pattern::repeat(
        Pattern::Seq(vec![Pattern::literal(","), item.clone()]),
        min.saturating_sub(1),
        max.saturating_sub(1),
    );
    let items = Pattern::Seq(vec![item, rest]);
    let body = if min == 0 {
        Pattern::repeat(items, 0, 1)
    } else {
        items
    };
    Pattern::Seq(vec![Pattern::literal(open), body, Pattern::literal(close)])
}

/// Any JSON object of `json_object`'s bounds, `depth` levels of nesting left below it.
fn object(depth: usize) -> Pattern {
    let member = Pattern::Seq(vec![
        string(0, OBJECT_STRING),
        Pattern::literal(":"),
        value(depth),
    ]);
    list("{", member, 0, OBJECT_ITEMS, "}")
}

/// Any JSON value of `json_object`'s bounds.
fn value(depth: usize) -> Pattern {
    let mut alternatives = vec![
        string(0, OBJECT_STRING),
        number(false),
        Pattern::literal("true"),
        Pattern::literal("false"),
        Pattern::literal("null"),
    ];
    if depth > 0 {
        alternatives.push(object(depth - 1));
        alternatives.push(list("[", value(depth - 1), 0, OBJECT_ITEMS, "]"));
    }
    Pattern::Alt(alternatives)
}

/// The pattern of `response_format`, or `None` for plain text.
///
/// Errors: 400 about `response_format` for an unknown type, a `json_schema` without a
/// schema, or a schema using what is not supported (see the module docs).
pub fn response_format(format: Option<&Value>) -> Result<Option<Pattern>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format["type"].as_str() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(object(OBJECT_DEPTH))),
        Some("regex") => {
            let text = format["regex"]
                .as_str()
                .ok_or_else(|| bad("a regex response_format needs \"regex\": a string"))?;
            regex(text).map(Some)
        }
        Some("json_schema") => {
            let schema = format["json_schema"]
                .get("schema")
                .ok_or_else(|| bad("json_schema needs a schema: {\"json_schema\": {\"name\": ..., \"schema\": {...}}}"))?;
            pattern(schema).map(Some)
        }
        _ => Err(bad(format!(
            "response_format.type must be text, json_object, json_schema or regex, got {}",
            format["type"]
        ))),
    }
}

/// Repetitions an unbounded regex repetition allows beyond its minimum.
const REGEX_UNBOUNDED: u32 = 64;

/// The texts `regex` matches whole (see the module docs).
fn regex(regex: &str) -> Result<Pattern, ApiError> {
    let hir = regex_syntax::Parser::new()
        .parse(regex)
        .map_err(|e| bad(format!("the regex does not parse: {e}")))?;
    from_hir(&hir)
}

fn from_hir(hir: &regex_syntax::hir::Hir) -> Result<Pattern, ApiError> {
    use regex_syntax::hir::{Class, HirKind};
    Ok(match hir.kind() {
        HirKind::Empty => Pattern::literal(""),
        HirKind::Literal(l) => Pattern::literal(
            std::str::from_utf8(&l.0)
                .map_err(|_| bad("the regex matches bytes that are not UTF-8"))?,
        ),
        HirKind::Class(Class::Unicode(c)) => {
            Pattern::Class(c.ranges().iter().map(|r| (r.start(), r.end())).collect())
        }
        HirKind::Class(Class::Bytes(_)) => {
            return Err(bad("byte classes are not supported in a regex"))
        }
        HirKind::Look(_) => {
            return Err(bad(
                "anchors and look-arounds are not supported: the regex matches the whole reply",
            ))
        }
        HirKind::Repetition(r) => {
            let max = r.max.unwrap_or(r.min.saturating_add(REGEX_UNBOUNDED));
            Pattern::repeat(from_hir(&r.sub)?, r.min as usize, max as usize)
        }
        HirKind::Capture(c) => from_hir(&c.sub)?,
        HirKind::Concat(items) => {
            Pattern::Seq(items.iter().map(from_hir).collect::<Result<_, _>>()?)
        }
        HirKind::Alternation(items) => {
            Pattern::Alt(items.iter().map(from_hir).collect::<Result<_, _>>()?)
        }
    })
}

/// The JSON texts `schema` accepts, within our bounds (see the module docs).
///
/// Errors: 400 about `response_format` for a schema using what is not supported.
pub fn pattern(schema: &Value) -> Result<Pattern, ApiError> {
    from_schema(schema, 0)
}

/// The JSON texts `schema` accepts, within our bounds, `depth` schemas deep.
fn from_schema(schema: &Value, depth: usize) -> Result<Pattern, ApiError> {
    if depth > DEPTH_MAX {
        return Err(bad(format!("schemas nested more than {DEPTH_MAX} deep")));
    }
    let s = match schema {
        Value::Bool(true) => return Ok(value(OBJECT_DEPTH)),
        Value::Object(s) => s,
        other => {
            return Err(bad(format!(
                "a schema must be an object or true, got {other}"
            )))
        }
    };
    if let Some(key) = s.keys().find(|k| {
        !ANNOTATIONS.contains(&k.as_str())
            && ![
                "type",
                "properties",
                "required",
                "items",
                "minItems",
                "maxItems",
                "minLength",
                "maxLength",
                "enum",
                "const",
                "anyOf",
                "oneOf",
                "minimum",
            ]
            .contains(&k.as_str())
    }) {
        return Err(bad(format!("the schema keyword `{key}` is not supported")));
    }
    if let Some(c) = s.get("const") {
        return Ok(Pattern::literal(c.to_string()));
    }
    if let Some(values) = s.get("enum") {
        let values = values
            .as_array()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| bad("enum must be a non-empty array"))?;
        return Ok(Pattern::Alt(
            values
                .iter()
                .map(|v| Pattern::literal(v.to_string()))
                .collect(),
        ));
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(options) = s.get(key) {
            let options = options
                .as_array()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| bad(format!("{key} must be a non-empty array")))?;
            let patterns = options.iter().map(|o| from_schema(o, depth + 1));
            return Ok(Pattern::Alt(patterns.collect::<Result<_, _>>()?));
        }
    }
    let types: Vec<&str> = match s.get("type") {
        None => return Ok(value(OBJECT_DEPTH)),
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        Some(other) => return Err(bad(format!("type must be a string or a list, got {other}"))),
    };
    // A type named twice adds nothing but a copy of its pattern.
    let mut seen = std::collections::HashSet::new();
    let patterns = types
        .iter()
        .filter(|t| seen.insert(**t))
        .map(|t| of_type(s, t, depth))
        .collect::<Result<Vec<_>, _>>()?;
    if patterns.is_empty() {
        return Err(bad("type names no type"));
    }
    Ok(Pattern::Alt(patterns))
}

/// A size keyword `key` of `s`, at most `cap`, else `default`.
fn size(
    s: &serde_json::Map<String, Value>,
    key: &str,
    default: usize,
    cap: usize,
) -> Result<usize, ApiError> {
    match s.get(key) {
        None => Ok(default.min(cap)),
        Some(v) => match v.as_u64() {
            Some(n) if n as usize <= cap => Ok(n as usize),
            _ => Err(bad(format!(
                "{key} must be an integer from 0 to {cap}, got {v}"
            ))),
        },
    }
}

/// The texts of type `t` that schema `s` accepts.
fn of_type(s: &serde_json::Map<String, Value>, t: &str, depth: usize) -> Result<Pattern, ApiError> {
    let non_negative = match s.get("minimum") {
        None => false,
        Some(m) if m.as_f64() == Some(0.0) => true,
        Some(m) => {
            return Err(bad(format!(
                "minimum is supported as 0 only (no minus sign), got {m}"
            )))
        }
    };
    Ok(match t {
        "string" => {
            let min = size(s, "minLength", 0, STRING_MAX)?;
            let max = size(s, "maxLength", STRING_DEFAULT.max(min), STRING_MAX)?;
            if min > max {
                return Err(bad("minLength is above maxLength"));
            }
            string(min, max)
        }
        "integer" => integer(non_negative),
        "number" => number(non_negative),
        "boolean" => Pattern::Alt(vec![Pattern::literal("true"), Pattern::literal("false")]),
        "null" => Pattern::literal("null"),
        "array" => {
            let min = size(s, "minItems", 0, ITEMS_MAX)?;
            let max = size(s, "maxItems", min + 4, ITEMS_MAX)?;
            if min > max {
                return Err(bad("minItems is above maxItems"));
            }
            let item = match s.get("items") {
                Some(items) => from_schema(items, depth + 1)?,
                None => value(OBJECT_DEPTH.min(1)),
            };
            list("[", item, min, max, "]")
        }
        "object" => {
            let Some(properties) = s.get("properties") else {
                return Ok(object(OBJECT_DEPTH));
            };
            let properties = properties
                .as_object()
                .ok_or_else(|| bad("properties must be an object"))?;
            if let Some(required) = s.get("required") {
                let required = required
                    .as_array()
                    .ok_or_else(|| bad("required must be an array"))?;
                if let Some(missing) = required
                    .iter()
                    .find(|r| r.as_str().is_none_or(|r| !properties.contains_key(r)))
                {
                    return Err(bad(format!(
                        "required names {missing}, which is not in properties"
                    )));
                }
            }
            let mut parts = vec![Pattern::literal("{")];
            for (i, (name, sub)) in properties.iter().enumerate() {
                let comma = if i == 0 { "" } else { "," };
                parts.push(Pattern::literal(format!(
                    "{comma}{}:",
                    Value::String(name.clone())
                )));
                parts.push(from_schema(sub, depth + 1)?);
            }
            parts.push(Pattern::literal("}"));
            Pattern::Seq(parts)
        }
        other => return Err(bad(format!("unknown type `{other}`"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unsupported_and_bad_schemas_are_400s() {
        for format in [
            json!({"type": "xml"}),
            json!({"type": "json_schema", "json_schema": {"name": "x"}}),
            json!({"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}}),
            json!({"type": "json_schema", "json_schema": {"schema": {"$ref": "#/a"}}}),
            json!({"type": "json_schema", "json_schema": {"schema": {"type": "object",
                "properties": {"a": {"type": "string"}}, "required": ["b"]}}}),
            json!({"type": "json_schema", "json_schema": {"schema": {"type": "string",
                "maxLength": 100000}}}),
            json!({"type": "json_schema", "json_schema": {"schema": 3}}),
            json!({"type": "regex", "regex": "(unclosed"}),
            json!({"type": "regex", "regex": "^a$"}),
            json!({"type": "regex"}),
        ] {
            let e = response_format(Some(&format)).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param), (400, Some("response_format")));
            assert!(!e.message.is_empty());
        }
        assert_eq!(response_format(None), Ok(None));
        assert_eq!(response_format(Some(&json!({"type": "text"}))), Ok(None));
    }
}
