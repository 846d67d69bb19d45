//! The fuzz targets of `flm serve`, with the harness of `tests/fuzz.rs`:
//!
//! - the HTTP request bodies (seeds: `tests/fuzz/http/`): bytes parsed as the JSON of a
//!   chat or completion request, checked and rendered to token ids as the routes do. No
//!   input may panic.
//! - the structured output compiler (seeds: `tests/fuzz/schema/` and the schemas
//!   of the probe that once stalled the server): bytes read as a response_format's JSON or
//!   else as a regex, and as the choices of a generated JSON schema and regex, each through the
//!   validation and compilation of the routes. No input may panic or take more than its
//!   budget, and a compiled constraint never reaches a state without an allowed token.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flm_core::{Constraint, Grammar, Vocabulary, MAX_COMPILE_TIME, MAX_DFA_BYTES};
use flm_tests::fuzz::{corpus, fuzz};
use flm_tokenizer::Tokenizer;
use serde_json::{json, Value};

use super::openai::{ChatRequest, CompletionRequest};
use super::{params, prompt, schema};

#[test]
fn request_bodies() {
    let tokenizer =
        Tokenizer::from_file(&flm_tests::data("hf-stories260K/tokenizer.json")).unwrap();
    let findings = std::env::temp_dir().join("flm-fuzz-findings");
    fuzz("http", &corpus("http"), &findings, |body| {
        if let Ok(request) = serde_json::from_slice::<ChatRequest>(body) {
            let _ = params::check(&request.sampling, "m", 0);
            if let Ok(args) = prompt::template_args(request.chat_template_kwargs.as_ref()) {
                let _ = prompt::chat(&tokenizer, &request.messages, None, &args);
            }
        }
        if let Ok(request) = serde_json::from_slice::<CompletionRequest>(body) {
            let _ = params::check(&request.sampling, "m", 0);
            let _ = params::check_completion(&request);
            let _ = prompt::completion(&tokenizer, &request.prompt);
        }
    });
}

/// Reads choices from the input's bytes, 0 once they run out.
struct Choices<'a>(std::slice::Iter<'a, u8>);

impl Choices<'_> {
    /// A choice in `0..n`.
    fn pick(&mut self, n: u8) -> u8 {
        self.0.next().map_or(0, |b| b % n)
    }

    /// A JSON schema, `depth` levels from the top.
    fn schema(&mut self, depth: u8) -> Value {
        let max = u64::from(self.pick(40));
        let deeper = depth < 4;
        match self.pick(11) {
            0 => json!({"type": "string", "minLength": max / 4, "maxLength": max}),
            1 => json!({"type": "integer", "minimum": 0}),
            2 => json!({"type": ["number", "null", "boolean"]}),
            3 if deeper => json!({"type": "array", "items": self.schema(depth + 1),
                                  "minItems": max / 8, "maxItems": max / 3}),
            4 if deeper => {
                let count = self.pick(4);
                let properties: serde_json::Map<String, Value> = (0..count)
                    .map(|i| (format!("p{i}ÿ"), self.schema(depth + 1)))
                    .collect();
                json!({"type": "object", "properties": properties})
            }
            5 => {
                let values: Vec<String> = (0..=max).map(|i| format!("v{i}é")).collect();
                json!({"enum": values})
            }
            6 => json!({"const": self.regex(0)}),
            7 if deeper => json!({"anyOf": [self.schema(depth + 1), self.schema(depth + 1)]}),
            8 => json!({"type": vec!["string"; max as usize * 100 + 1]}),
            9 => json!(true),
            _ => json!({"type": "object"}),
        }
    }

    /// A regex, `depth` levels of groups deep.
    fn regex(&mut self, depth: u8) -> String {
        const ATOMS: [&str; 8] = ["a", ".", "\\w", "\\p{L}", "[a-c]", "ÿ", "\\xff", "(a|b)"];
        const OPERATORS: [&str; 8] = ["", "*", "+", "?", "{0,64}", "{3}", "{2,5}", "{1000}"];
        let mut out = String::new();
        for _ in 0..=self.pick(3) {
            let atom = if depth < 3 && self.pick(3) == 0 {
                format!("({})", self.regex(depth + 1))
            } else {
                ATOMS[usize::from(self.pick(8))].to_owned()
            };
            out.push_str(&atom);
            out.push_str(OPERATORS[usize::from(self.pick(8))]);
            if self.pick(5) == 0 {
                out.push('|');
            }
        }
        out
    }
}

/// Validates and compiles `format` as the routes do; when it compiles, walks the
/// constraint over a vocabulary of the 256 bytes (and an end token, 256) for up to 64
/// steps, checking that every state has a token to continue.
fn compile_and_walk(format: &Value, bytes: &Arc<Vocabulary>) {
    let start = Instant::now();
    let Ok(Some(pattern)) = schema::response_format(Some(format)) else {
        return;
    };
    let grammar = Grammar::new(&pattern, Arc::clone(bytes), MAX_COMPILE_TIME);
    // The time limit, and generously for what comes before the clock is read (the schema,
    // the NFA within its size limit) in a debug build on a loaded machine.
    assert!(
        start.elapsed() < MAX_COMPILE_TIME + Duration::from_secs(10),
        "{format}"
    );
    let Ok(grammar) = grammar else {
        return;
    };
    assert!(grammar.memory_usage() <= MAX_DFA_BYTES);
    let mut constraint = Constraint::new(Arc::new(grammar));
    for step in 0..64 {
        let mut logits = vec![0.0; 257];
        let allowed = constraint.mask(&mut logits, &[256]);
        assert!(allowed > 0, "no token after {step} steps of {format}");
        let (next, _) = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .nth(step * 31 % allowed)
            .unwrap_or_else(|| panic!("{format}"));
        if next == 256 {
            break;
        }
        constraint.advance(next as u32).unwrap();
    }
}

#[test]
fn response_formats() {
    let bytes: Vec<Option<Vec<u8>>> = (0..=255u8).map(|b| Some(vec![b])).chain([None]).collect();
    let bytes = Arc::new(Vocabulary::new(&bytes));
    let probe = [
        json!({"type": "json_schema", "json_schema": {"schema": {"type": vec!["string"; 10_000]}}}),
        json!({"type": "json_schema", "json_schema": {"schema": {
            "enum": (0..20_000).map(|i| format!("value {i}")).collect::<Vec<_>>()}}}),
    ];
    let mut seeds: Vec<Vec<u8>> = probe.iter().map(|p| p.to_string().into_bytes()).collect();
    seeds.extend(corpus("schema"));
    let findings = std::env::temp_dir().join("flm-fuzz-findings");
    fuzz("schema", &seeds, &findings, |input| {
        let mut formats = Vec::new();
        if let Ok(format) = serde_json::from_slice::<Value>(input) {
            formats.push(format);
        } else if let Ok(text) = std::str::from_utf8(input) {
            formats.push(json!({"type": "regex", "regex": text}));
        }
        let mut choices = Choices(input.iter());
        formats.push(json!({"type": "json_schema", "json_schema": {"schema": choices.schema(0)}}));
        formats.push(json!({"type": "regex", "regex": choices.regex(0)}));
        for format in &formats {
            compile_and_walk(format, &bytes);
        }
    });
}
