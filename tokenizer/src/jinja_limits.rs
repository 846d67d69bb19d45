//! The budget of one chat-template render: a template comes with the model file (GGUF
//! metadata, `tokenizer_config.json`), so it is untrusted code, and no template may run
//! for more than about a second or build gigabytes.
//!
//! - Time: minijinja's fuel ([`TEMPLATE_FUEL`] instructions per render), which stops
//!   nested loops and exponential macro recursion.
//! - Memory: every string and sequence a template can build passes a check that refuses
//!   it before it is allocated when it is longer than [`MAX_TEMPLATE_TEXT`] bytes or
//!   [`MAX_TEMPLATE_ITEMS`] items, or when the render has built [`MAX_TEMPLATE_BUILT`]
//!   bytes in all; what the template emits, captures included, is capped at
//!   [`MAX_TEMPLATE_TEXT`] bytes. minijinja has no hook on its operators, so the compiled
//!   template's `~`, `+` and `*` instructions are replaced, one for one, by calls of
//!   checked filters (named `~`, `+`, `*`, which no template can spell), and its raw-text
//!   instructions by a constant emitted through the checked formatter; the jump targets
//!   are moved to match. This uses minijinja's `unstable_machinery` (its compiler and VM),
//!   so the crate pins minijinja's version. The builtin filters and Python string methods
//!   that can make a result longer than their input (`indent`, `batch`, `slice`,
//!   `format`, `replace`, `join`, `list`, `split`, `string`, `pprint`, `escape`) are
//!   replaced by checked versions that measure the result first and then call the
//!   builtin.
//!
//! What compiling the template may cost (minijinja folds constant expressions while it
//! compiles, before any of this applies) is bounded before it is compiled, by
//! `jinja_compile.rs`.
//!
//! The limits are far above what real templates need: a long conversation renders to a
//! few hundred kilobytes in some thousands of instructions, and the text is capped at
//! 8 MiB, about two million tokens, more than any model's context.

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

use minijinja::machinery::{Instruction, Instructions};
use minijinja::value::{Rest, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Expression, State, Value};

/// The minijinja instructions one render may execute; about 0.1 s of a release build and
/// well under a second of a debug build.
pub const TEMPLATE_FUEL: u64 = 1_000_000;
/// The longest string, in bytes, a template may build, and the most it may emit in one
/// render (captured text included).
pub const MAX_TEMPLATE_TEXT: usize = 8 << 20;
/// The most items a sequence that a template builds may hold.
pub const MAX_TEMPLATE_ITEMS: usize = 1 << 20;
/// The most bytes of strings and sequences a template may build over one render, counted
/// as they are built (what is freed again is not given back): eight times the longest
/// output, which a real template builds about once or twice over, and small enough that a
/// server reserves it for every render it runs at once.
pub const MAX_TEMPLATE_BUILT: usize = 64 << 20;

/// What one render has built and emitted so far.
#[derive(Default)]
pub(crate) struct Budget {
    built: AtomicUsize,
    emitted: AtomicUsize,
}

/// The cause attached to every error of a limit, so that the load check tells them from
/// the template's own errors.
#[derive(Debug)]
struct OverLimit;

impl fmt::Display for OverLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the chat template's budget is spent")
    }
}

impl std::error::Error for OverLimit {}

/// An error of a limit, `what` saying which.
pub(crate) fn limit(what: String) -> Error {
    Error::new(ErrorKind::InvalidOperation, what).with_source(OverLimit)
}

/// Whether `e` is a limit of the budget: fuel, or one of the caps on what is built.
pub(crate) fn is_over_limit(e: &Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<OverLimit>() {
            return true;
        }
        source = s.source();
    }
    e.kind() == ErrorKind::OutOfFuel
}

/// Adds `n` to `counter` and says whether the total is past `max`.
fn past(counter: &AtomicUsize, n: usize, max: usize) -> bool {
    counter.fetch_add(n, Ordering::Relaxed).saturating_add(n) > max
}

impl Budget {
    fn charge(&self, bytes: usize) -> Result<(), Error> {
        if past(&self.built, bytes, MAX_TEMPLATE_BUILT) {
            return Err(limit(format!(
                "the template built more than the limit of {MAX_TEMPLATE_BUILT} bytes in one \
                 render"
            )));
        }
        Ok(())
    }

    /// A string of `len` bytes is about to be built.
    pub(crate) fn text(&self, len: usize) -> Result<(), Error> {
        if len > MAX_TEMPLATE_TEXT {
            return Err(limit(format!(
                "a string of {len} bytes is past the limit of {MAX_TEMPLATE_TEXT} bytes"
            )));
        }
        self.charge(len)
    }

    /// A sequence of `n` items is about to be built.
    fn items(&self, n: usize) -> Result<(), Error> {
        if n > MAX_TEMPLATE_ITEMS {
            return Err(limit(format!(
                "a sequence of {n} items is past the limit of {MAX_TEMPLATE_ITEMS} items"
            )));
        }
        self.charge(n.saturating_mul(std::mem::size_of::<Value>()))
    }

    /// `len` more bytes are about to be emitted.
    fn emit(&self, len: usize) -> Result<(), Error> {
        if past(&self.emitted, len, MAX_TEMPLATE_TEXT) {
            return Err(limit(format!(
                "the output is past the limit of {MAX_TEMPLATE_TEXT} bytes"
            )));
        }
        Ok(())
    }
}

/// Counts the bytes written to it, and fails past [`MAX_TEMPLATE_TEXT`].
struct Count(usize);

impl fmt::Write for Count {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0 = self.0.saturating_add(s.len());
        if self.0 > MAX_TEMPLATE_TEXT {
            return Err(fmt::Error);
        }
        Ok(())
    }
}

/// The length of `value`'s text (as `{{ value }}` writes it), measured without building it;
/// strings give their length, anything else fails past [`MAX_TEMPLATE_TEXT`].
pub(crate) fn text_len(value: &Value) -> Result<usize, Error> {
    if let Some(s) = value.as_str() {
        return Ok(s.len());
    }
    let mut count = Count(0);
    write!(count, "{value}").map_err(|_| {
        limit(format!(
            "a {} whose text is past the limit of {MAX_TEMPLATE_TEXT} bytes",
            value.kind()
        ))
    })?;
    Ok(count.0)
}

/// The number of items of `value` (characters of a string), counted up to one past
/// [`MAX_TEMPLATE_ITEMS`].
fn item_count(value: &Value) -> usize {
    if let Some(s) = value.as_str() {
        return s.chars().count();
    }
    match value.len() {
        Some(n) => n,
        None => value
            .try_iter()
            .map_or(0, |it| it.take(MAX_TEMPLATE_ITEMS + 1).count()),
    }
}

fn is_sequence(value: &Value) -> bool {
    matches!(value.kind(), ValueKind::Seq | ValueKind::Iterable)
}

/// minijinja's own `a + b` and `a * b`, for the operands whose result is no larger than
/// they are (numbers), or whose size was checked first.
fn builtin_op(source: &'static str, a: &Value, b: &Value) -> Result<Value, Error> {
    static ENV: LazyLock<Environment<'static>> = LazyLock::new(Environment::new);
    static ADD: LazyLock<Result<Expression<'static, 'static>, Error>> =
        LazyLock::new(|| ENV.compile_expression("a + b"));
    static MUL: LazyLock<Result<Expression<'static, 'static>, Error>> =
        LazyLock::new(|| ENV.compile_expression("a * b"));
    let expr = if source == "+" { &*ADD } else { &*MUL };
    match expr {
        Ok(expr) => expr.eval(minijinja::context! { a => a, b => b }),
        Err(e) => Err(Error::new(ErrorKind::InvalidOperation, e.to_string())),
    }
}

/// `a ~ b`.
fn concat(budget: &Budget, a: &Value, b: &Value) -> Result<Value, Error> {
    let len = text_len(a)?.saturating_add(text_len(b)?);
    budget.text(len)?;
    let mut text = String::with_capacity(len);
    write!(text, "{a}{b}").map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))?;
    Ok(Value::from(text))
}

/// `a + b`: strings and sequences are measured first.
fn add(budget: &Budget, a: &Value, b: &Value) -> Result<Value, Error> {
    if let (Some(x), Some(y)) = (a.as_str(), b.as_str()) {
        budget.text(x.len().saturating_add(y.len()))?;
    } else if is_sequence(a) && is_sequence(b) {
        budget.items(item_count(a).saturating_add(item_count(b)))?;
    }
    builtin_op("+", a, b)
}

/// `a * b`: a repeated string or sequence is measured first.
fn mul(budget: &Budget, a: &Value, b: &Value) -> Result<Value, Error> {
    for (x, n) in [(a, b), (b, a)] {
        let Some(n) = n.as_usize() else { continue };
        if let Some(s) = x.as_str() {
            budget.text(s.len().saturating_mul(n))?;
        } else if is_sequence(x) {
            budget.items(item_count(x).saturating_mul(n))?;
        }
    }
    builtin_op("*", a, b)
}

/// The positional arguments of a call and its keyword arguments (the last argument when
/// it is a keyword map).
fn split_kwargs(args: &[Value]) -> (&[Value], Option<&Value>) {
    match args.split_last() {
        Some((last, rest)) if last.is_kwargs() => (rest, Some(last)),
        _ => (args, None),
    }
}

/// Argument `pos` (0 = the first after the subject), or keyword `name`.
fn arg(args: &[Value], pos: usize, name: &str) -> Option<Value> {
    let (positional, kwargs) = split_kwargs(args);
    positional.get(pos).cloned().or_else(|| {
        kwargs
            .and_then(|k| k.get_attr(name).ok())
            .filter(|v| !v.is_undefined())
    })
}

fn arg_usize(args: &[Value], pos: usize, name: &str) -> usize {
    arg(args, pos, name).and_then(|v| v.as_usize()).unwrap_or(0)
}

/// The text of `value` (as `{{ value }}` writes it), refused before it is built when it is
/// longer than [`MAX_TEMPLATE_TEXT`].
fn text_of(value: &Value) -> Result<Cow<'_, str>, Error> {
    match value.as_str() {
        Some(s) => Ok(Cow::Borrowed(s)),
        None => {
            text_len(value)?;
            Ok(Cow::Owned(value.to_string()))
        }
    }
}

/// A check of a filter or method: the subject (the filtered value, or the method's
/// receiver) and the other arguments.
type Check = fn(&Budget, &Value, &[Value]) -> Result<(), Error>;

/// `indent(width)`: each line gains `width` bytes.
fn check_indent(budget: &Budget, s: &Value, args: &[Value]) -> Result<(), Error> {
    let s = text_of(s)?;
    let lines = s.matches('\n').count() + 1;
    budget.text(
        lines
            .saturating_mul(arg_usize(args, 0, "width"))
            .saturating_add(s.len()),
    )
}

/// `batch(count, fill_with)` and `slice(count, fill_with)`: up to `count` more items.
fn check_chunks(budget: &Budget, s: &Value, args: &[Value]) -> Result<(), Error> {
    budget.items(item_count(s).saturating_add(arg_usize(args, 0, "count")))
}

/// `format` (`%` or `{}` style): the text, padding up to the sum of the numbers written in
/// the specifiers, and each argument once per placeholder.
fn check_format(budget: &Budget, s: &Value, args: &[Value]) -> Result<(), Error> {
    let s = text_of(s)?;
    let padding = s
        .split(|c: char| !c.is_ascii_digit())
        .filter(|d| !d.is_empty())
        .map(|d| d.parse::<usize>().unwrap_or(usize::MAX))
        .fold(0usize, usize::saturating_add);
    let placeholders = s.matches(['%', '{']).count() + 1;
    let mut args_len = 0usize;
    for a in split_kwargs(args).0 {
        args_len = args_len.saturating_add(text_len(a)?);
    }
    budget.text(
        s.len()
            .saturating_add(padding)
            .saturating_add(placeholders.saturating_mul(args_len)),
    )
}

/// `replace(old, new)`: each occurrence of `old` becomes `new`.
fn check_replace(budget: &Budget, s: &Value, args: &[Value]) -> Result<(), Error> {
    let s = text_of(s)?;
    let old = match arg(args, 0, "old") {
        Some(v) => text_of(&v)?.into_owned(),
        None => String::new(),
    };
    let new_len = match arg(args, 1, "new") {
        Some(v) => text_len(&v)?,
        None => 0,
    };
    let found = if old.is_empty() {
        s.chars().count() + 1
    } else {
        s.matches(old.as_str()).count()
    };
    budget.text(found.saturating_mul(new_len).saturating_add(s.len()))
}

/// `join(separator)` of the items of `s`.
fn check_join(budget: &Budget, s: &Value, args: &[Value]) -> Result<(), Error> {
    let sep = match arg(args, 0, "d") {
        Some(v) => text_len(&v)?,
        None => 0,
    };
    let mut len = 0usize;
    for item in s.try_iter()? {
        len = len.saturating_add(text_len(&item)?).saturating_add(sep);
        if len > MAX_TEMPLATE_TEXT {
            break;
        }
    }
    budget.text(len)
}

/// `list`: one item per item (or character) of the value.
fn check_list(budget: &Budget, s: &Value, _: &[Value]) -> Result<(), Error> {
    budget.items(item_count(s))
}

/// `split(separator)` and `splitlines()`: one item per piece.
fn check_split(budget: &Budget, s: &Value, args: &[Value]) -> Result<(), Error> {
    let text = text_of(s)?;
    let n = match arg(args, 0, "split").and_then(|v| v.as_str().map(str::to_owned)) {
        Some(sep) if !sep.is_empty() => text.matches(sep.as_str()).count() + 1,
        _ => text.split_whitespace().count() + text.lines().count(),
    };
    budget.items(n)
}

/// `escape`: each of `&<>"'/` becomes an entity of up to 6 bytes.
fn check_escape(budget: &Budget, s: &Value, _: &[Value]) -> Result<(), Error> {
    let text = text_of(s)?;
    let special = text.matches(['&', '<', '>', '"', '\'', '/']).count();
    budget.text(special.saturating_mul(5).saturating_add(text.len()))
}

/// `string`: the value's text.
fn check_string(budget: &Budget, s: &Value, _: &[Value]) -> Result<(), Error> {
    budget.text(text_len(s)?)
}

/// `pprint`: the value's debug text.
fn check_pprint(budget: &Budget, s: &Value, _: &[Value]) -> Result<(), Error> {
    let mut count = Count(0);
    write!(count, "{s:#?}").map_err(|_| {
        limit(format!(
            "pprint of a value past the limit of {MAX_TEMPLATE_TEXT} bytes"
        ))
    })?;
    budget.text(count.0)
}

/// Replaces the builtin filter `name` by `check`, then the builtin.
fn guard_filter(
    env: &mut Environment,
    budget: &Arc<Budget>,
    name: &'static str,
    builtin: Value,
    check: Check,
) {
    let budget = Arc::clone(budget);
    env.add_filter(
        name,
        move |state: &State, args: Rest<Value>| -> Result<Value, Error> {
            if let Some((subject, rest)) = args.split_first() {
                check(&budget, subject, rest)?;
            }
            builtin.call(state, &args)
        },
    );
}

/// Installs the budget on `env`: fuel, the checked operators and formatter, the checked
/// filters, and minijinja-contrib's Python string methods behind their checks.
pub(crate) fn install(env: &mut Environment, budget: &Arc<Budget>) {
    env.set_fuel(Some(TEMPLATE_FUEL));
    type Op = fn(&Budget, &Value, &Value) -> Result<Value, Error>;
    for (name, op) in [("~", concat as Op), ("+", add), ("*", mul)] {
        let budget = Arc::clone(budget);
        env.add_filter(name, move |a: &Value, b: &Value| op(&budget, a, b));
    }
    let emitted = Arc::clone(budget);
    env.set_formatter(move |out, state, value| {
        emitted.emit(text_len(value)?)?;
        minijinja::escape_formatter(out, state, value)
    });
    use minijinja::filters as f;
    let filters: [(&'static str, Value, Check); 12] = [
        ("indent", Value::from_function(f::indent), check_indent),
        ("batch", Value::from_function(f::batch), check_chunks),
        ("slice", Value::from_function(f::slice), check_chunks),
        ("format", Value::from_function(f::format), check_format),
        ("replace", Value::from_function(f::replace), check_replace),
        ("join", Value::from_function(f::join), check_join),
        ("list", Value::from_function(f::list), check_list),
        ("split", Value::from_function(f::split), check_split),
        ("string", Value::from_function(f::string), check_string),
        ("pprint", Value::from_function(f::pprint), check_pprint),
        ("escape", Value::from_function(f::escape), check_escape),
        ("e", Value::from_function(f::escape), check_escape),
    ];
    for (name, builtin, check) in filters {
        guard_filter(env, budget, name, builtin, check);
    }
    let methods = Arc::clone(budget);
    env.set_unknown_method_callback(move |state, value, method, args| {
        if value.as_str().is_some() {
            match method {
                "replace" => check_replace(&methods, value, args)?,
                "format" => check_format(&methods, value, args)?,
                "split" | "splitlines" => check_split(&methods, value, args)?,
                "join" => {
                    if let Some(items) = args.first() {
                        check_join(&methods, items, std::slice::from_ref(value))?;
                    }
                }
                // Case mapping and stripping build a string about as long as the receiver.
                "upper" | "lower" | "title" | "capitalize" | "strip" | "lstrip" | "rstrip" => {
                    methods.text(text_len(value)?)?
                }
                _ => {}
            }
        }
        minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
    });
}

/// Checks a constant of the compiled template, which the compiler may have folded from
/// constant operands (`'a' * 10**8`, a lazy `[1] * 10**12`) without passing the checked
/// operators: strings of at most [`MAX_TEMPLATE_TEXT`] bytes, and at most
/// [`MAX_TEMPLATE_ITEMS`] items in all, counted through nested sequences and maps before
/// anything is rendered (a lazy sequence is walked no further than the limit). What the
/// compiler folds is bounded before it compiles (`jinja_compile.rs`); this check remains
/// for the constants themselves, and as a second line.
fn check_const(value: &Value, items: &mut usize) -> Result<(), Error> {
    if let Some(s) = value.as_str() {
        if s.len() > MAX_TEMPLATE_TEXT {
            return Err(limit(format!(
                "a constant string of {} bytes is past the limit of {MAX_TEMPLATE_TEXT} bytes",
                s.len()
            )));
        }
        return Ok(());
    }
    if !matches!(
        value.kind(),
        ValueKind::Seq | ValueKind::Iterable | ValueKind::Map
    ) {
        return Ok(());
    }
    for item in value.try_iter()? {
        *items += 1;
        if *items > MAX_TEMPLATE_ITEMS {
            return Err(limit(format!(
                "a constant with items past the limit of {MAX_TEMPLATE_ITEMS} items"
            )));
        }
        check_const(&item, items)?;
        if value.kind() == ValueKind::Map {
            check_const(&value.get_item(&item)?, items)?;
        }
    }
    Ok(())
}

/// `instructions` with the operators and raw text routed through the checks (see the
/// module docs): `~`, `+`, `*` become the filters of those names, one for one, and each
/// raw text becomes a constant and an emit, so the jumps are moved to the new positions.
///
/// Errors: a constant past the limits ([`check_const`]).
pub(crate) fn bounded<'s>(instructions: &Instructions<'s>) -> Result<Instructions<'s>, Error> {
    let mut const_items = 0;
    let n = instructions.len() as u32;
    let raw = |i: u32| matches!(instructions.get(i), Some(Instruction::EmitRaw(_)));
    let mut at = Vec::with_capacity(n as usize + 1);
    let mut next = 0u32;
    for i in 0..n {
        at.push(next);
        next += if raw(i) { 2 } else { 1 };
    }
    at.push(next);
    let to = |target: u32| at.get(target as usize).copied().unwrap_or(next);
    let mut out = Instructions::new(instructions.name(), instructions.source());
    for i in 0..n {
        let Some(instr) = instructions.get(i) else {
            continue;
        };
        let moved = match instr.clone() {
            Instruction::Jump(t) => vec![Instruction::Jump(to(t))],
            Instruction::JumpIfFalse(t) => vec![Instruction::JumpIfFalse(to(t))],
            Instruction::JumpIfFalseOrPop(t) => vec![Instruction::JumpIfFalseOrPop(to(t))],
            Instruction::JumpIfTrueOrPop(t) => vec![Instruction::JumpIfTrueOrPop(to(t))],
            Instruction::Iterate(t) => vec![Instruction::Iterate(to(t))],
            Instruction::BuildMacro(name, t, flags) => {
                vec![Instruction::BuildMacro(name, to(t), flags)]
            }
            Instruction::StringConcat => vec![Instruction::ApplyFilter("~", Some(2), !0)],
            Instruction::Add => vec![Instruction::ApplyFilter("+", Some(2), !0)],
            Instruction::Mul => vec![Instruction::ApplyFilter("*", Some(2), !0)],
            Instruction::LoadConst(value) => {
                check_const(&value, &mut const_items)?;
                vec![Instruction::LoadConst(value)]
            }
            Instruction::EmitRaw(text) => vec![
                Instruction::LoadConst(Value::from_safe_string(text.to_owned())),
                Instruction::Emit,
            ],
            other => vec![other],
        };
        for instr in moved {
            match (instructions.get_span(i), instructions.get_line(i)) {
                (Some(span), _) => out.add_with_span(instr, span),
                (None, Some(line)) => out.add_with_line(instr, line.try_into().unwrap_or(0)),
                (None, None) => out.add(instr),
            };
        }
    }
    Ok(out)
}
