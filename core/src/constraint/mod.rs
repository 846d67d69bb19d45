//! Constrained decoding: a token may be sampled only if the bytes so far plus its bytes
//! stay a prefix of a word of a regular language (Willard & Louf 2023, Outlines; llama.cpp's
//! grammars; vLLM's guided decoding).
//!
//! A language is a [`Pattern`] (literals, character classes, sequences, alternatives,
//! bounded repetition), compiled once for a [`Vocabulary`], within a budget of memory and
//! time ([`Grammar::new`]): to regex-automata's Thompson NFA, then by our own subset
//! construction ([`dfa`]) to a DFA over UTF-8 bytes, whose states are then fitted to the
//! vocabulary ([`vocab`]). The DFA works on bytes, so a character that a byte-level
//! vocabulary spells with several tokens (each a piece of its UTF-8 encoding) can be
//! constrained. The vocabulary holds every token's bytes, sorted, so that
//! [`Constraint::mask`] walks them as a trie: each distinct prefix costs one DFA transition,
//! and a step costs at most the vocabulary's total bytes, whatever the pattern.
//!
//! A [`Constraint`] follows one sequence: its DFA state. Bounded repetitions make every
//! language finite, so a constrained reply always ends: [`Constraint::finished`] says when
//! the text is a whole word that no token can extend. A token may end only in a state from
//! which the vocabulary's tokens reach a whole word, so every state a reply reaches has a
//! token to continue (or is a whole word, where a stop token may end it); a language that
//! the vocabulary cannot write at all is refused when it compiles.

mod dfa;
mod vocab;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use regex_automata::nfa::thompson::{self, WhichCaptures};
use regex_syntax::hir::{Class, ClassUnicode, ClassUnicodeRange, Hir, Repetition};

use crate::{Error, Result};
use dfa::{Clock, Dfa, START};
pub use vocab::Vocabulary;
use vocab::{BLOCKED, ENDS};

/// A regular language over characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// Exactly this text.
    Literal(String),
    /// One character within one of these inclusive ranges.
    Class(Vec<(char, char)>),
    /// Each in turn.
    Seq(Vec<Pattern>),
    /// Any one of them.
    Alt(Vec<Pattern>),
    /// `min` to `max` repetitions.
    Repeat {
        /// The repeated pattern.
        item: Box<Pattern>,
        /// At least.
        min: usize,
        /// At most.
        max: usize,
    },
}

impl Pattern {
    /// Exactly `text`.
    pub fn literal(text: impl Into<String>) -> Pattern {
        Pattern::Literal(text.into())
    }

    /// `min` to `max` repetitions of `item`.
    pub fn repeat(item: Pattern, min: usize, max: usize) -> Pattern {
        Pattern::Repeat {
            item: Box::new(item),
            min,
            max,
        }
    }
}

/// Most nodes, literal characters and class ranges a pattern may have.
pub const MAX_PATTERN_SIZE: usize = 1 << 18;
/// Most heap bytes of the NFA (regex-automata's `nfa_size_limit`).
pub const MAX_NFA_BYTES: usize = 8 << 20;
/// Most heap bytes of the NFA state sets while determinizing.
pub const MAX_DETERMINIZE_BYTES: usize = 32 << 20;
/// Most heap bytes of the DFA: its transitions and each state's flags.
pub const MAX_DFA_BYTES: usize = 16 << 20;
/// Heap bytes a compilation may hold at once, at most about: the NFA, the state sets and
/// the DFA (fitting the DFA to a vocabulary takes at most about the DFA's bytes again, once
/// the NFA and the sets are freed).
pub const MAX_COMPILE_BYTES: usize = MAX_NFA_BYTES + MAX_DETERMINIZE_BYTES + MAX_DFA_BYTES;
/// The time limit of a compilation that a server gives (a second: a schema of the JSON
/// types compiles in milliseconds, and the slowest patterns within the size limits take
/// seconds).
pub const MAX_COMPILE_TIME: Duration = Duration::from_secs(1);

/// A pattern compiled to a DFA over UTF-8 bytes, anchored at the start of the reply, and
/// fitted to the vocabulary whose tokens write it.
#[derive(Debug, Clone)]
pub struct Grammar {
    dfa: Dfa,
    vocab: Arc<Vocabulary>,
    /// Each state's [`BLOCKED`] and [`ENDS`] flags.
    flags: Vec<u8>,
}

impl Grammar {
    /// Compiles `pattern` for `vocab`. The work and memory are bounded: at most
    /// [`MAX_PATTERN_SIZE`] pattern elements, then [`MAX_NFA_BYTES`] (regex-automata checks
    /// it as it goes), [`MAX_DETERMINIZE_BYTES`] and [`MAX_DFA_BYTES`], and `time_limit`
    /// (read as the DFA is built and fitted). A repetition of a repetition that can repeat
    /// any count in between (`(x{0,4}){0,8}`) is compiled as one (`x{0,32}`), the same
    /// language with far fewer states.
    ///
    /// Errors: [`Error::InvalidArgument`] naming the limit that a pattern exceeds, for a
    /// repetition with `min > max` or counts over 2^32, for a pattern that matches nothing
    /// (an empty class that no alternative avoids), or for one whose words `vocab`'s tokens
    /// cannot write (a character it lacks the bytes of).
    pub fn new(pattern: &Pattern, vocab: Arc<Vocabulary>, time_limit: Duration) -> Result<Grammar> {
        let mut clock = Clock::new(time_limit);
        let mut budget = MAX_PATTERN_SIZE;
        let hir = to_hir(pattern, &mut budget)?
            .ok_or_else(|| Error::InvalidArgument("the pattern matches no text".into()))?;
        let nfa = thompson::Compiler::new()
            .configure(
                thompson::Config::new()
                    .nfa_size_limit(Some(MAX_NFA_BYTES))
                    .shrink(false)
                    .which_captures(WhichCaptures::None),
            )
            .build_from_hir(&hir)
            .map_err(|e| {
                Error::InvalidArgument(format!("the constraint is too large to compile: {e}"))
            })?;
        drop(hir);
        clock.check()?;
        let dfa = dfa::determinize(&nfa, &mut clock)?;
        drop(nfa);
        let flags = vocab::fit(&dfa, &vocab, &mut clock)?;
        if flags[START as usize] & BLOCKED != 0 {
            return Err(Error::InvalidArgument(
                "the model's tokens cannot write the constraint's language: its vocabulary \
                 lacks the bytes of some character every word needs"
                    .into(),
            ));
        }
        Ok(Grammar { dfa, vocab, flags })
    }

    /// Heap bytes of the DFA and its flags (the vocabulary is shared).
    pub fn memory_usage(&self) -> usize {
        self.dfa.memory_usage() + self.flags.len()
    }

    /// The state after `bytes` from `state`, `None` once they leave the language or end
    /// where no token may.
    fn run(&self, mut state: u32, bytes: &[u8]) -> Option<u32> {
        for &b in bytes {
            state = self.dfa.next(state, b);
        }
        (self.flags[state as usize] & BLOCKED == 0).then_some(state)
    }
}

/// Converts `p` to a HIR, `None` when its language is empty, spending one unit of `budget`
/// per node, literal character and class range.
fn to_hir(p: &Pattern, budget: &mut usize) -> Result<Option<Hir>> {
    let cost = match p {
        Pattern::Literal(text) => text.len(),
        Pattern::Class(ranges) => ranges.len(),
        _ => 1,
    };
    *budget = budget.checked_sub(cost.max(1)).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "the constraint's pattern exceeds the limit of {MAX_PATTERN_SIZE} elements \
             (nodes, literal bytes and class ranges)"
        ))
    })?;
    Ok(match p {
        Pattern::Literal(text) => Some(Hir::literal(text.as_bytes())),
        Pattern::Class(ranges) => {
            let class =
                ClassUnicode::new(ranges.iter().map(|&(a, b)| ClassUnicodeRange::new(a, b)));
            (!class.ranges().is_empty()).then(|| Hir::class(Class::Unicode(class)))
        }
        Pattern::Seq(items) => {
            let mut hirs = Vec::with_capacity(items.len());
            for item in items {
                match to_hir(item, budget)? {
                    Some(h) => hirs.push(h),
                    None => return Ok(None),
                }
            }
            Some(Hir::concat(hirs))
        }
        Pattern::Alt(items) => {
            let mut hirs = Vec::with_capacity(items.len());
            for item in items {
                hirs.extend(to_hir(item, budget)?);
            }
            (!hirs.is_empty()).then(|| Hir::alternation(hirs))
        }
        Pattern::Repeat { item, min, max } => {
            let (item, min, max) = flatten(item, *min, *max)?;
            match to_hir(item, budget)? {
                Some(sub) => Some(Hir::repetition(Repetition {
                    min,
                    max: Some(max),
                    greedy: true,
                    sub: Box::new(sub),
                })),
                None if min == 0 => Some(Hir::empty()),
                None => None,
            }
        }
    })
}

/// `item{min,max}` as `inner{a*min, b*max}` while `item` is `inner{a,b}` and every count in
/// between is reachable (the ranges `[k*a, k*b]` for `k` in `min..=max` overlap or touch),
/// or `min == max`.
fn flatten(item: &Pattern, min: usize, max: usize) -> Result<(&Pattern, u32, u32)> {
    let count = |n: usize| {
        u32::try_from(n).map_err(|_| {
            Error::InvalidArgument(format!("a repetition of {n} times (at most 2^32 - 1)"))
        })
    };
    if min > max {
        return Err(Error::InvalidArgument(format!(
            "a repetition of {min} to {max} times"
        )));
    }
    let (mut item, mut min, mut max) = (item, count(min)?, count(max)?);
    while let Pattern::Repeat {
        item: inner,
        min: a,
        max: b,
    } = item
    {
        let (a, b) = (count(*a)?, count(*b)?);
        // [k*a, k*b] touches [(k+1)*a, (k+1)*b] when k*(b-a) + 1 >= a, so for every k
        // from `min` on when it does for `min`.
        let joined = a <= b
            && (min == max || a <= 1 || u64::from(min) * u64::from(b - a) + 1 >= u64::from(a));
        let (lo, hi) = (u64::from(min) * u64::from(a), u64::from(max) * u64::from(b));
        if !joined || hi > u64::from(u32::MAX) {
            break;
        }
        (item, min, max) = (inner, lo as u32, hi as u32);
    }
    Ok((item, min, max))
}

/// One sequence's progress through a [`Grammar`], over its [`Vocabulary`].
#[derive(Debug, Clone)]
pub struct Constraint {
    grammar: Arc<Grammar>,
    state: u32,
}

impl Constraint {
    /// At the start of `grammar`'s language.
    pub fn new(grammar: Arc<Grammar>) -> Constraint {
        Constraint {
            grammar,
            state: START,
        }
    }

    /// Heap bytes of its grammar ([`Grammar::memory_usage`]), shared with its clones.
    pub fn memory_usage(&self) -> usize {
        self.grammar.memory_usage()
    }

    /// Whether the text so far is a whole word of the language.
    pub fn accepting(&self) -> bool {
        self.grammar.dfa.accepting(self.state)
    }

    /// Whether the text so far is a whole word that no token can extend.
    pub fn finished(&self) -> bool {
        self.grammar.flags[self.state as usize] & ENDS != 0
    }

    /// Sets to −∞ the logits of the tokens that may not come next: those without bytes,
    /// or whose bytes leave the language or end where no token could follow; the `stop`
    /// tokens stay only when the text is a whole word. Returns how many tokens remain: at
    /// least one unless the text is a whole word and `stop` is empty. Costs at most one DFA
    /// transition per byte of the vocabulary, fewer where tokens share a prefix or a dead
    /// one.
    pub fn mask(&self, logits: &mut [f32], stop: &[u32]) -> usize {
        let mut allowed = vec![false; logits.len()];
        let g = &self.grammar;
        g.vocab.walk(&g.dfa, self.state, |id, end| {
            if g.flags[end as usize] & BLOCKED == 0 {
                if let Some(a) = allowed.get_mut(id as usize) {
                    *a = true;
                }
            }
            ControlFlow::<()>::Continue(())
        });
        let accepting = self.accepting();
        for &s in stop {
            if let Some(a) = allowed.get_mut(s as usize) {
                *a = accepting;
            }
        }
        let mut count = 0;
        for (logit, ok) in logits.iter_mut().zip(allowed) {
            if ok {
                count += 1;
            } else {
                *logit = f32::NEG_INFINITY;
            }
        }
        count
    }

    /// Takes token `id`.
    ///
    /// Errors: [`Error::InvalidArgument`] if its bytes leave the language or end where no
    /// token may (or it has none).
    pub fn advance(&mut self, id: u32) -> Result<()> {
        let bytes = self.grammar.vocab.of(id);
        let next = (!bytes.is_empty())
            .then(|| self.grammar.run(self.state, bytes))
            .flatten()
            .ok_or_else(|| {
                Error::InvalidArgument(format!("token {id} leaves the constraint's language"))
            })?;
        self.state = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
