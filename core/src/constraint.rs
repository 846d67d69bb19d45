//! Constrained decoding: a token may be sampled only if the bytes so far plus its bytes
//! stay a prefix of a word of a regular language (Willard & Louf 2023, Outlines; llama.cpp's
//! grammars; vLLM's guided decoding).
//!
//! A language is a [`Pattern`] (literals, character classes, sequences, alternatives,
//! bounded repetition), compiled once, within a budget ([`Grammar::new`]), into a DFA over
//! UTF-8 bytes (regex-automata's Thompson NFA, then its dense DFA). The DFA works on bytes,
//! so a character that a byte-level vocabulary spells with several tokens (each a piece of
//! its UTF-8 encoding) can be constrained. A [`Vocabulary`] holds every token's bytes, sorted,
//! so that [`Constraint::mask`] walks them as a trie: each distinct prefix costs one DFA
//! transition, and a step costs at most the vocabulary's total bytes, whatever the pattern.
//!
//! A [`Constraint`] follows one sequence: its DFA state. Bounded repetitions make every
//! language finite, so a constrained reply always ends: [`Constraint::finished`] says when
//! the text is a whole word that no byte can extend. Every sub-language of a compiled
//! pattern is non-empty, so from every live state some bytes reach a whole word; a
//! vocabulary that spells every byte therefore always has a token to continue.

use std::sync::Arc;

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::nfa::thompson::{self, WhichCaptures};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};
use regex_syntax::hir::{Class, ClassUnicode, ClassUnicodeRange, Hir, Repetition};

use crate::{Error, Result};

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

/// Most nodes, literal characters and class ranges a pattern may have.
pub const MAX_PATTERN_SIZE: usize = 1 << 18;
/// Most heap bytes of the NFA (regex-automata's `nfa_size_limit`).
pub const MAX_NFA_BYTES: usize = 8 << 20;
/// Most heap bytes used while determinizing (regex-automata's `determinize_size_limit`).
pub const MAX_DETERMINIZE_BYTES: usize = 32 << 20;
/// Most heap bytes of the DFA (regex-automata's `dfa_size_limit`).
pub const MAX_DFA_BYTES: usize = 16 << 20;

/// A pattern compiled to a DFA over UTF-8 bytes, anchored at the start of the reply.
#[derive(Debug, Clone)]
pub struct Grammar {
    dfa: dense::DFA<Vec<u32>>,
    start: StateID,
}

impl Grammar {
    /// Compiles `pattern`. The work and memory are bounded: at most [`MAX_PATTERN_SIZE`]
    /// pattern elements, then regex-automata's size limits ([`MAX_NFA_BYTES`],
    /// [`MAX_DETERMINIZE_BYTES`], [`MAX_DFA_BYTES`]), which it checks as it goes. A
    /// repetition of a repetition that can repeat any count in between (`(x{0,4}){0,8}`) is
    /// compiled as one (`x{0,32}`), the same language with far fewer states.
    ///
    /// Errors: [`Error::InvalidArgument`] naming the limit that a pattern exceeds, for a
    /// repetition with `min > max` or counts over 2^32, or for a pattern that matches
    /// nothing (an empty class that no alternative avoids).
    pub fn new(pattern: &Pattern) -> Result<Grammar> {
        let mut budget = MAX_PATTERN_SIZE;
        let hir = to_hir(pattern, &mut budget)?
            .ok_or_else(|| Error::InvalidArgument("the pattern matches no text".into()))?;
        let too_large = |e: &dyn std::fmt::Display| {
            Error::InvalidArgument(format!("the constraint is too large to compile: {e}"))
        };
        let nfa = thompson::Compiler::new()
            .configure(
                thompson::Config::new()
                    .nfa_size_limit(Some(MAX_NFA_BYTES))
                    .shrink(false)
                    .which_captures(WhichCaptures::None),
            )
            .build_from_hir(&hir)
            .map_err(|e| too_large(&e))?;
        drop(hir);
        let dfa = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .match_kind(MatchKind::All)
                    .start_kind(StartKind::Anchored)
                    .minimize(false)
                    .accelerate(false)
                    .dfa_size_limit(Some(MAX_DFA_BYTES))
                    .determinize_size_limit(Some(MAX_DETERMINIZE_BYTES)),
            )
            .build_from_nfa(&nfa)
            .map_err(|e| too_large(&e))?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| too_large(&e))?;
        Ok(Grammar { dfa, start })
    }

    /// Heap bytes of the DFA.
    pub fn memory_usage(&self) -> usize {
        self.dfa.memory_usage()
    }

    /// The state after `bytes` from `state`, `None` once they leave the language.
    fn run(&self, mut state: StateID, bytes: &[u8]) -> Option<StateID> {
        for &b in bytes {
            state = self.step(state, b)?;
        }
        Some(state)
    }

    /// The state after byte `b` from `state`, `None` if the bytes then leave the language.
    /// A DFA reports a match one byte late, so the byte after a whole word leads to a match
    /// state that is not dead even when nothing can follow; such a state is checked.
    fn step(&self, state: StateID, b: u8) -> Option<StateID> {
        let next = self.dfa.next_state(state, b);
        let live = !self.dfa.is_dead_state(next)
            && (!self.dfa.is_match_state(next) || self.accepting(next) || self.continues(next));
        live.then_some(next)
    }

    /// Whether some byte from `state` leads to a state that is not dead.
    fn continues(&self, state: StateID) -> bool {
        self.dfa
            .byte_classes()
            .representatives(..)
            .filter_map(|u| u.as_u8())
            .any(|b| !self.dfa.is_dead_state(self.dfa.next_state(state, b)))
    }

    /// Whether the bytes that led to `state` are a whole word (regex-automata's DFAs
    /// report a match one transition late, here the end-of-input one).
    fn accepting(&self, state: StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(state))
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

/// The bytes of a vocabulary's tokens, sorted so that [`Constraint::mask`] can walk them as
/// a trie.
#[derive(Debug, Clone)]
pub struct Vocabulary {
    /// Every token's bytes, one after another.
    bytes: Vec<u8>,
    /// Token `i`'s bytes are `bytes[spans[i].0..spans[i].1]`; empty for a token that may
    /// never be sampled under a constraint.
    spans: Vec<(u32, u32)>,
    /// The tokens with bytes, in the order of their bytes.
    order: Vec<u32>,
    /// `shared[j]`: the length of the prefix that token `order[j]` shares with the one
    /// before it.
    shared: Vec<u32>,
}

impl Vocabulary {
    /// A vocabulary whose token `i` adds `tokens[i]` to a text (its UTF-8 bytes, possibly
    /// part of a character); `None` or empty for tokens that may never be sampled under a
    /// constraint (control tokens).
    pub fn new(tokens: &[Option<Vec<u8>>]) -> Vocabulary {
        let mut bytes = Vec::new();
        let mut spans = Vec::with_capacity(tokens.len());
        for t in tokens {
            let start = bytes.len() as u32;
            bytes.extend_from_slice(t.as_deref().unwrap_or_default());
            spans.push((start, bytes.len() as u32));
        }
        let of = |id: u32| {
            let (a, b) = spans[id as usize];
            &bytes[a as usize..b as usize]
        };
        let mut order: Vec<u32> = (0..tokens.len() as u32)
            .filter(|&id| !of(id).is_empty())
            .collect();
        order.sort_by(|&a, &b| of(a).cmp(of(b)));
        let shared = (0..order.len())
            .map(|j| match j.checked_sub(1) {
                Some(prev) => {
                    let (a, b) = (of(order[prev]), of(order[j]));
                    a.iter().zip(b).take_while(|(x, y)| x == y).count() as u32
                }
                None => 0,
            })
            .collect();
        Vocabulary {
            bytes,
            spans,
            order,
            shared,
        }
    }

    /// Token `id`'s bytes, empty if it has none.
    fn of(&self, id: u32) -> &[u8] {
        match self.spans.get(id as usize) {
            Some(&(a, b)) => &self.bytes[a as usize..b as usize],
            None => &[],
        }
    }
}

/// One sequence's progress through a [`Grammar`], over a [`Vocabulary`].
#[derive(Debug, Clone)]
pub struct Constraint {
    grammar: Arc<Grammar>,
    vocab: Arc<Vocabulary>,
    state: StateID,
}

impl Constraint {
    /// At the start of `grammar`'s language, over `vocab`.
    pub fn new(grammar: Arc<Grammar>, vocab: Arc<Vocabulary>) -> Constraint {
        let state = grammar.start;
        Constraint {
            grammar,
            vocab,
            state,
        }
    }

    /// Whether the text so far is a whole word of the language.
    pub fn accepting(&self) -> bool {
        self.grammar.accepting(self.state)
    }

    /// Whether the text so far is a whole word that no byte can extend.
    pub fn finished(&self) -> bool {
        let g = &self.grammar;
        self.accepting()
            && g.dfa
                .byte_classes()
                .representatives(..)
                .filter_map(|u| u.as_u8())
                .all(|b| g.step(self.state, b).is_none())
    }

    /// Sets to −∞ the logits of the tokens that may not come next: those without bytes,
    /// or whose bytes leave the language; the `stop` tokens stay only when the text is a
    /// whole word. Returns how many tokens remain. Costs at most one DFA transition per
    /// byte of the vocabulary, fewer where tokens share a prefix or a dead one.
    pub fn mask(&self, logits: &mut [f32], stop: &[u32]) -> usize {
        let mut allowed = vec![false; logits.len()];
        let vocab = &self.vocab;
        // states[k]: the state after the current token's first k bytes; the first `valid`
        // entries belong to it, and the last of them may be dead.
        let mut states: Vec<Option<StateID>> = vec![Some(self.state)];
        for (&id, &shared) in vocab.order.iter().zip(&vocab.shared) {
            let bytes = vocab.of(id);
            let mut k = (shared as usize).min(states.len() - 1);
            states.truncate(k + 1);
            while k < bytes.len() {
                let Some(state) = states[k] else { break };
                states.push(self.grammar.step(state, bytes[k]));
                k += 1;
            }
            if k == bytes.len() && states[k].is_some() {
                if let Some(a) = allowed.get_mut(id as usize) {
                    *a = true;
                }
            }
        }
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
    /// Errors: [`Error::InvalidArgument`] if its bytes leave the language (or it has none).
    pub fn advance(&mut self, id: u32) -> Result<()> {
        let bytes = self.vocab.of(id);
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
mod tests {
    use super::*;

    fn lit(s: &str) -> Pattern {
        Pattern::Literal(s.into())
    }

    fn repeat(item: Pattern, min: usize, max: usize) -> Pattern {
        Pattern::Repeat {
            item: Box::new(item),
            min,
            max,
        }
    }

    /// `{"a":` then 1 to 3 digits, then `}`, or `null`.
    fn pattern() -> Pattern {
        Pattern::Alt(vec![
            Pattern::Seq(vec![
                lit("{\"a\":"),
                repeat(Pattern::Class(vec![('0', '9')]), 1, 3),
                lit("}"),
            ]),
            lit("null"),
        ])
    }

    fn vocab(texts: &[&[u8]]) -> Arc<Vocabulary> {
        let tokens: Vec<_> = texts
            .iter()
            .map(|t| (!t.is_empty()).then(|| t.to_vec()))
            .collect();
        Arc::new(Vocabulary::new(&tokens))
    }

    /// The state after `text`, if it stays in the language, and whether it is a whole word.
    fn run(g: &Grammar, text: &str) -> Option<bool> {
        g.run(g.start, text.as_bytes()).map(|s| g.accepting(s))
    }

    #[test]
    fn words_and_prefixes_of_the_language() {
        let g = Grammar::new(&pattern()).unwrap();
        for word in ["{\"a\":1}", "{\"a\":123}", "null"] {
            assert_eq!(run(&g, word), Some(true), "{word}");
        }
        for prefix in ["{\"a\":12", "nu", ""] {
            assert_eq!(run(&g, prefix), Some(false), "{prefix}");
        }
        for outside in ["{\"a\":}", "{\"a\":1234}", "nil", "null "] {
            assert_eq!(run(&g, outside), None, "{outside}");
        }
        assert!(Grammar::new(&repeat(lit("x"), 2, 1)).is_err());
    }

    #[test]
    fn the_mask_keeps_the_tokens_that_stay_in_the_language() {
        // Token 5 stands for EOS (no bytes, a stop token); token 6 has no bytes.
        let texts: [&[u8]; 7] = [b"{\"a\":", b"1", b"12}", b"null", b"}", b"", b""];
        let g = Arc::new(Grammar::new(&pattern()).unwrap());
        let mut c = Constraint::new(Arc::clone(&g), vocab(&texts));
        let mut logits = [0.0; 7];
        assert_eq!(c.mask(&mut logits, &[5]), 2);
        assert_eq!(
            logits.map(f32::is_finite),
            [true, false, false, true, false, false, false]
        );
        c.advance(0).unwrap();
        assert!(c.advance(4).is_err(), "no digit yet");
        c.advance(1).unwrap();
        let mut logits = [0.0; 7];
        assert_eq!(c.mask(&mut logits, &[5]), 3, "{logits:?}");
        assert!([1, 2, 4].iter().all(|&i| logits[i].is_finite()));
        c.advance(2).unwrap();
        assert!(c.accepting() && c.finished());
        let mut logits = [0.0; 7];
        assert_eq!(c.mask(&mut logits, &[5]), 1);
        assert!(logits[5].is_finite());
        let mut c = Constraint::new(g, vocab(&texts));
        c.advance(3).unwrap();
        assert!(c.finished());
    }

    #[test]
    fn a_character_spelled_by_byte_tokens_is_allowed() {
        // "ÿ" is C3 BF in UTF-8: a byte-level vocabulary spells it with two tokens.
        let g = Arc::new(Grammar::new(&lit("ÿ")).unwrap());
        let mut c = Constraint::new(g, vocab(&[b"\xc3", b"\xbf", b"y", "ÿ".as_bytes()]));
        let mut logits = [0.0; 4];
        assert_eq!(c.mask(&mut logits, &[]), 2);
        assert_eq!(logits.map(f32::is_finite), [true, false, false, true]);
        c.advance(0).unwrap();
        assert_eq!(c.mask(&mut [0.0; 4], &[]), 1);
        c.advance(1).unwrap();
        assert!(c.finished());
    }

    #[test]
    fn nested_repetitions_compile_as_one() {
        // (.{0,64}){0,64} is .{0,4096}; ((a|b){0,64}){0,64}c likewise.
        let any = Pattern::Class(vec![('\0', char::MAX)]);
        let g = Grammar::new(&repeat(repeat(any, 0, 64), 0, 64)).unwrap();
        assert_eq!(run(&g, &"é".repeat(4096)), Some(true));
        assert_eq!(run(&g, &"é".repeat(4097)), None);
        let ab = Pattern::Class(vec![('a', 'b')]);
        let p = Pattern::Seq(vec![repeat(repeat(ab, 0, 64), 0, 64), lit("c")]);
        let g = Grammar::new(&p).unwrap();
        assert_eq!(run(&g, &format!("{}c", "ab".repeat(2048))), Some(true));
        // x{2,3}{2}: 4, 5 or 6 x's; x{3}{1,2}: 3 or 6, not 4.
        let g = Grammar::new(&repeat(repeat(lit("x"), 3, 3), 1, 2)).unwrap();
        assert_eq!(run(&g, "xxxx"), Some(false));
        assert_eq!(run(&g, "xxxxxx"), Some(true));
        let g = Grammar::new(&repeat(repeat(lit("x"), 2, 3), 2, 2)).unwrap();
        assert_eq!(run(&g, "xxxxx"), Some(true));
        assert_eq!(run(&g, "xxx"), Some(false));
    }

    #[test]
    fn patterns_over_the_budget_are_refused_with_the_limit() {
        let letter = Pattern::Class(vec![('A', 'Z'), ('a', 'z'), ('À', 'ɏ'), ('Ա', 'և')]);
        let e = Grammar::new(&repeat(letter, 200_000, 200_000)).unwrap_err();
        assert!(e.to_string().contains("limit"), "{e}");
        let many = Pattern::Alt(vec![lit("x"); MAX_PATTERN_SIZE]);
        let e = Grammar::new(&many).unwrap_err();
        assert!(e.to_string().contains(&MAX_PATTERN_SIZE.to_string()), "{e}");
        let nothing = Pattern::Seq(vec![lit("a"), Pattern::Class(Vec::new())]);
        assert!(Grammar::new(&nothing).is_err());
        let optional = Pattern::Alt(vec![lit("a"), Pattern::Class(Vec::new())]);
        assert_eq!(run(&Grammar::new(&optional).unwrap(), "a"), Some(true));
    }
}
