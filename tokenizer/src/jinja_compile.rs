//! The limits of compiling a chat template, checked before minijinja compiles it (the
//! limits of rendering it are `jinja_limits.rs`'s). A template comes with the model file,
//! and minijinja's compiler trusts it:
//!
//! - It folds constant expressions (`Expr::as_const`) with its own operators, unchecked:
//!   `'a' * 10**8` becomes a 100 MB string, a few dozen of them gigabytes, and
//!   `([1] * 10**12) ~ ''` the text of a lazy sequence of 10^12 items, which never ends.
//!   It folds a subexpression again for each operator above it that does not fold.
//! - It compiles an expression, and drops its tree, recursively, and parses a chain of
//!   operators (`x + 1 + 1 + ...`, `x|f|f|...`, `x.a.a...`) into a tree as deep as the
//!   chain is long: 8,000 terms, a 32 KB template, overflowed a 2 MiB stack in a debug
//!   build and aborted the process; with the folding above, compiling the chain also
//!   takes time quadratic in its length.
//!
//! So, in this order, each step bounding the next:
//!
//! 1. The source is at most [`MAX_TEMPLATE_SOURCE`] bytes.
//! 2. No tag (`{{ .. }}`, `{% .. %}`) has more than [`MAX_TAG_OPERATORS`] operators, and
//!    the template no more than [`MAX_TEMPLATE_OPERATORS`], counted on minijinja's token
//!    stream, before any tree is built. Opening brackets count too, so this bounds the
//!    depth of each tag's tree, and the time of compiling them all, quadratic in each
//!    tag's operators, to that of [`MAX_TEMPLATE_OPERATORS`] / [`MAX_TAG_OPERATORS`] tags
//!    at the limit.
//! 3. The tree is parsed as minijinja parses it and walked as its code generator walks it,
//!    folding each expression it would fold, as often, with minijinja's operators on
//!    constant operands; each operation that builds a string or a sequence is measured
//!    first, and refused if it would build a string of more than
//!    [`MAX_TEMPLATE_TEXT`] bytes, a sequence of more than [`MAX_TEMPLATE_ITEMS`] items,
//!    or more than [`MAX_TEMPLATE_TEXT`] bytes over the whole compile (a sequence counted
//!    as its items' `Value`s).
//!
//! A template that passes compiles in well under a second, with its constants taking at
//! most [`MAX_TEMPLATE_TEXT`] bytes (times in docs/benchmarks.md, "Hostile requests and
//! templates"); the errors are limits (`jinja_limits::is_over_limit`), so a template that
//! fails is refused when it is loaded. The real templates flm has met
//! have a few kilobytes and at most a few dozen operators in a tag, and fold a few bytes.
//! A template that minijinja cannot tokenise or parse is left to minijinja, whose error
//! names the place.

use minijinja::machinery::ast::{self, Expr, Spanned, Stmt};
use minijinja::machinery::{parse, tokenize, Token, WhitespaceConfig};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::ValueKind;
use minijinja::{Error, Value};

use crate::jinja_limits::{limit, text_len, MAX_TEMPLATE_ITEMS, MAX_TEMPLATE_TEXT};

/// The longest chat template source, in bytes (real ones have a few kilobytes, the
/// longest some tens).
pub const MAX_TEMPLATE_SOURCE: usize = 256 << 10;
/// The most operators one tag of a chat template may have: arithmetic, comparison, `~`,
/// `|`, `.`, `and`, `or`, `not`, `is`, `if`, `in`, and opening brackets (real templates
/// have a few dozen at most; Qwen3's has 16).
pub const MAX_TAG_OPERATORS: usize = 128;
/// The most operators a chat template may have in all (real ones have about one for every
/// 16 bytes of source: Qwen3's 4 KB has 260).
pub const MAX_TEMPLATE_OPERATORS: usize = 16_384;

/// The whitespace handling of the render environment (`jinja.rs`), so that the template
/// is parsed as minijinja will parse it.
fn whitespace() -> WhitespaceConfig {
    WhitespaceConfig {
        keep_trailing_newline: false,
        lstrip_blocks: true,
        trim_blocks: true,
    }
}

/// minijinja's default delimiters (a unit struct while its `custom_syntax` is off).
#[allow(clippy::default_constructed_unit_structs)]
fn syntax() -> SyntaxConfig {
    SyntaxConfig::default()
}

/// Checks `source` against the limits of the module docs before minijinja compiles it.
///
/// Errors: a limit (with the `jinja_limits` cause) naming which.
pub(crate) fn check(source: &str) -> Result<(), Error> {
    if source.len() > MAX_TEMPLATE_SOURCE {
        return Err(limit(format!(
            "the template's source of {} bytes is past the limit of {MAX_TEMPLATE_SOURCE} bytes",
            source.len()
        )));
    }
    check_operators(source)?;
    let Ok(tree) = parse(source, "<string>", syntax(), whitespace()) else {
        return Ok(());
    };
    Folder { built: 0 }.stmt(&tree)
}

/// No tag has more than [`MAX_TAG_OPERATORS`] operators, and the template no more than
/// [`MAX_TEMPLATE_OPERATORS`].
fn check_operators(source: &str) -> Result<(), Error> {
    let (mut operators, mut total) = (0usize, 0usize);
    for token in tokenize(source, false, syntax(), whitespace()) {
        let Ok((token, span)) = token else {
            return Ok(());
        };
        match token {
            Token::VariableStart | Token::BlockStart => operators = 0,
            Token::Plus
            | Token::Minus
            | Token::Mul
            | Token::Div
            | Token::FloorDiv
            | Token::Pow
            | Token::Mod
            | Token::Dot
            | Token::Tilde
            | Token::Pipe
            | Token::Eq
            | Token::Ne
            | Token::Gt
            | Token::Gte
            | Token::Lt
            | Token::Lte
            | Token::BracketOpen
            | Token::ParenOpen
            | Token::BraceOpen
            | Token::Ident("and" | "or" | "not" | "is" | "if" | "in") => {
                operators += 1;
                total += 1;
            }
            _ => {}
        }
        if operators > MAX_TAG_OPERATORS {
            return Err(limit(format!(
                "the tag on line {} has more operators than the limit of {MAX_TAG_OPERATORS}",
                span.start_line
            )));
        }
        if total > MAX_TEMPLATE_OPERATORS {
            return Err(limit(format!(
                "the template has more operators than the limit of {MAX_TEMPLATE_OPERATORS}"
            )));
        }
    }
    Ok(())
}

fn is_sequence(value: &Value) -> bool {
    matches!(value.kind(), ValueKind::Seq | ValueKind::Iterable)
}

/// The number of items of a sequence (`usize::MAX` if it does not know it).
fn items(value: &Value) -> usize {
    value.len().unwrap_or(usize::MAX)
}

/// `value` as a constant node.
fn constant<'a>(value: Value) -> Expr<'a> {
    Expr::Const(Spanned::new(ast::Const { value }, Default::default()))
}

/// The walk of the tree, with what the folds have built so far, in bytes.
struct Folder {
    built: usize,
}

impl Folder {
    fn stmts(&mut self, stmts: &[Stmt]) -> Result<(), Error> {
        stmts.iter().try_for_each(|s| self.stmt(s))
    }

    fn stmt(&mut self, stmt: &Stmt) -> Result<(), Error> {
        match stmt {
            Stmt::Template(t) => self.stmts(&t.children),
            Stmt::EmitExpr(e) => self.expr(&e.expr),
            Stmt::ForLoop(f) => {
                self.expr(&f.target)?;
                self.expr(&f.iter)?;
                self.exprs(&f.filter_expr)?;
                self.stmts(&f.body)?;
                self.stmts(&f.else_body)
            }
            Stmt::IfCond(i) => {
                self.expr(&i.expr)?;
                self.stmts(&i.true_body)?;
                self.stmts(&i.false_body)
            }
            Stmt::WithBlock(w) => {
                for (target, value) in &w.assignments {
                    self.expr(target)?;
                    self.expr(value)?;
                }
                self.stmts(&w.body)
            }
            Stmt::Set(s) => {
                self.expr(&s.target)?;
                self.expr(&s.expr)
            }
            Stmt::SetBlock(s) => {
                self.expr(&s.target)?;
                self.exprs(&s.filter)?;
                self.stmts(&s.body)
            }
            Stmt::AutoEscape(a) => {
                self.expr(&a.enabled)?;
                self.stmts(&a.body)
            }
            Stmt::FilterBlock(f) => {
                self.expr(&f.filter)?;
                self.stmts(&f.body)
            }
            Stmt::Block(b) => self.stmts(&b.body),
            Stmt::Import(i) => {
                self.expr(&i.expr)?;
                self.expr(&i.name)
            }
            Stmt::FromImport(i) => {
                self.expr(&i.expr)?;
                for (name, alias) in &i.names {
                    self.expr(name)?;
                    self.exprs(alias)?;
                }
                Ok(())
            }
            Stmt::Extends(e) => self.expr(&e.name),
            Stmt::Include(i) => self.expr(&i.name),
            Stmt::Macro(m) => self.macro_decl(m),
            Stmt::CallBlock(c) => {
                self.call(&c.call)?;
                self.macro_decl(&c.macro_decl)
            }
            Stmt::Do(d) => self.call(&d.call),
            // Raw text, and `break` and `continue` where minijinja's `loop_controls` is on:
            // no expression.
            _ => Ok(()),
        }
    }

    fn macro_decl(&mut self, m: &ast::Macro) -> Result<(), Error> {
        m.args.iter().try_for_each(|e| self.expr(e))?;
        m.defaults.iter().try_for_each(|e| self.expr(e))?;
        self.stmts(&m.body)
    }

    fn call(&mut self, c: &ast::Call) -> Result<(), Error> {
        self.expr(&c.expr)?;
        self.args(&c.args)
    }

    fn args(&mut self, args: &[ast::CallArg]) -> Result<(), Error> {
        args.iter().try_for_each(|a| match a {
            ast::CallArg::Pos(e)
            | ast::CallArg::Kwarg(_, e)
            | ast::CallArg::PosSplat(e)
            | ast::CallArg::KwargSplat(e) => self.expr(e),
        })
    }

    fn exprs<'e, 's: 'e>(
        &mut self,
        exprs: impl IntoIterator<Item = &'e Expr<'s>>,
    ) -> Result<(), Error> {
        exprs.into_iter().try_for_each(|e| self.expr(e))
    }

    /// As minijinja's `compile_expr`: folds `expr` if it can, else its parts.
    fn expr(&mut self, expr: &Expr) -> Result<(), Error> {
        if self.fold(expr)?.is_some() {
            return Ok(());
        }
        match expr {
            Expr::Var(_) | Expr::Const(_) => Ok(()),
            Expr::Slice(s) => {
                self.expr(&s.expr)?;
                self.exprs([&s.start, &s.stop, &s.step].into_iter().flatten())
            }
            Expr::UnaryOp(u) => self.expr(&u.expr),
            Expr::BinOp(b) => {
                self.expr(&b.left)?;
                self.expr(&b.right)
            }
            Expr::Compare(c) => {
                self.expr(&c.expr)?;
                c.ops.iter().try_for_each(|op| self.expr(&op.expr))
            }
            Expr::IfExpr(i) => {
                self.expr(&i.test_expr)?;
                self.expr(&i.true_expr)?;
                self.exprs(&i.false_expr)
            }
            Expr::Filter(f) => {
                self.exprs(&f.expr)?;
                self.args(&f.args)
            }
            Expr::Test(t) => {
                self.expr(&t.expr)?;
                self.args(&t.args)
            }
            Expr::GetAttr(g) => self.expr(&g.expr),
            Expr::GetItem(g) => {
                self.expr(&g.expr)?;
                self.expr(&g.subscript_expr)
            }
            Expr::Call(c) => self.call(c),
            Expr::List(l) => self.exprs(&l.items),
            Expr::Map(m) => {
                self.exprs(&m.keys)?;
                self.exprs(&m.values)
            }
        }
    }

    /// What minijinja's `Expr::as_const` folds `expr` to, computed as it computes it (the
    /// same operands, in the same order, by minijinja on constant nodes), each operation
    /// measured first ([`Folder::measure`]).
    fn fold(&mut self, expr: &Expr) -> Result<Option<Value>, Error> {
        match expr {
            // Literals: as long as their source.
            Expr::Const(_) | Expr::List(_) | Expr::Map(_) => Ok(expr.as_const()),
            Expr::UnaryOp(u) => {
                let Some(value) = self.fold(&u.expr)? else {
                    return Ok(None);
                };
                // The kind is not `Copy`.
                let op = if matches!(u.op, ast::UnaryOpKind::Not) {
                    ast::UnaryOpKind::Not
                } else {
                    ast::UnaryOpKind::Neg
                };
                let node = ast::UnaryOp {
                    op,
                    expr: constant(value),
                };
                Ok(Expr::UnaryOp(Spanned::new(node, u.span())).as_const())
            }
            Expr::BinOp(b) => {
                let (left, right) = (self.fold(&b.left)?, self.fold(&b.right)?);
                let (Some(left), Some(right)) = (left, right) else {
                    return Ok(None);
                };
                self.measure(b.op, &left, &right)?;
                let node = ast::BinOp {
                    op: b.op,
                    left: constant(left),
                    right: constant(right),
                };
                Ok(Expr::BinOp(Spanned::new(node, b.span())).as_const())
            }
            Expr::Compare(c) => {
                let Some(mut left) = self.fold(&c.expr)? else {
                    return Ok(None);
                };
                for op in &c.ops {
                    let Some(right) = self.fold(&op.expr)? else {
                        return Ok(None);
                    };
                    let node = ast::Compare {
                        expr: constant(left),
                        ops: vec![ast::CompareOp {
                            op: op.op,
                            expr: constant(right.clone()),
                        }],
                    };
                    match Expr::Compare(Spanned::new(node, c.span())).as_const() {
                        None => return Ok(None),
                        Some(holds) if !holds.is_true() => return Ok(Some(Value::from(false))),
                        Some(_) => {}
                    }
                    left = right;
                }
                Ok(Some(Value::from(true)))
            }
            _ => Ok(None),
        }
    }

    /// Refuses `left op right` if it would build a string or a sequence past the limits
    /// (comparisons and arithmetic build neither; their cost is bounded by the operands',
    /// which were measured when they were built), and counts what it builds.
    fn measure(&mut self, op: ast::BinOpKind, left: &Value, right: &Value) -> Result<(), Error> {
        use ast::BinOpKind::{Add, Concat, Mul};
        let (bytes, count) = match op {
            Add => match (left.as_str(), right.as_str()) {
                (Some(a), Some(b)) => (a.len().saturating_add(b.len()), 0),
                _ if is_sequence(left) && is_sequence(right) => {
                    (0, items(left).saturating_add(items(right)))
                }
                _ => return Ok(()),
            },
            // minijinja repeats the string operand (the left one if both are), else the
            // sequence operand, `n` times.
            Mul => {
                let (x, n) = if left.as_str().is_some() {
                    (left, right)
                } else if right.as_str().is_some() || !is_sequence(left) {
                    (right, left)
                } else {
                    (left, right)
                };
                let Some(n) = n.as_usize() else {
                    return Ok(());
                };
                match x.as_str() {
                    Some(s) => (s.len().saturating_mul(n), 0),
                    None if is_sequence(x) => (0, items(x).saturating_mul(n)),
                    None => return Ok(()),
                }
            }
            Concat => (text_len(left)?.saturating_add(text_len(right)?), 0),
            _ => return Ok(()),
        };
        if bytes > MAX_TEMPLATE_TEXT {
            return Err(limit(format!(
                "a constant expression folds to a string of {bytes} bytes, past the limit of \
                 {MAX_TEMPLATE_TEXT} bytes"
            )));
        }
        if count > MAX_TEMPLATE_ITEMS {
            return Err(limit(format!(
                "a constant expression folds to a sequence of {count} items, past the limit \
                 of {MAX_TEMPLATE_ITEMS} items"
            )));
        }
        let size = bytes.saturating_add(count.saturating_mul(std::mem::size_of::<Value>()));
        self.built = self.built.saturating_add(size);
        if self.built > MAX_TEMPLATE_TEXT {
            return Err(limit(format!(
                "the template's constant expressions fold to more than the limit of \
                 {MAX_TEMPLATE_TEXT} bytes in all"
            )));
        }
        Ok(())
    }
}
