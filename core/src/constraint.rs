//! Constrained decoding: a token may be sampled only if the text so far plus its text stays
//! a prefix of a word of a regular language (Willard & Louf 2023, Outlines; llama.cpp's
//! grammars; vLLM's guided decoding).
//!
//! A language is a [`Pattern`] (literals, character classes, sequences, alternatives,
//! bounded repetition), compiled once into a Thompson NFA ([`Nfa`]). A [`Constraint`]
//! follows one sequence: the set of NFA states its text can be in. For each step,
//! [`Constraint::mask`] sets to −∞ the logits of the tokens whose text would leave the
//! language, by running every token's text from the current set; [`Constraint::advance`]
//! takes the sampled token. Bounded repetitions make every language finite, so a
//! constrained reply always ends: [`Constraint::finished`] says when the text is a whole
//! word that no character can extend.

use std::sync::Arc;

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

/// Most NFA states a pattern may compile to.
const MAX_STATES: usize = 1 << 20;

#[derive(Debug, Clone)]
enum Edge {
    /// Consumes a character in one of the ranges and goes to the state.
    Char(Vec<(char, char)>, u32),
    /// Goes to the state without consuming.
    Empty(u32),
}

/// A Thompson NFA (Thompson 1968): states with character and empty edges, one start, one
/// accepting state.
#[derive(Debug, Clone)]
pub struct Nfa {
    edges: Vec<Vec<Edge>>,
    start: u32,
    accept: u32,
}

impl Nfa {
    /// Compiles `pattern`.
    ///
    /// Errors: [`Error::InvalidArgument`] for a repetition with `min > max` or a pattern of
    /// more than 2^20 states.
    pub fn new(pattern: &Pattern) -> Result<Nfa> {
        let mut nfa = Nfa {
            edges: Vec::new(),
            start: 0,
            accept: 0,
        };
        let start = nfa.state()?;
        let accept = nfa.state()?;
        nfa.build(pattern, start, accept)?;
        nfa.start = start;
        nfa.accept = accept;
        Ok(nfa)
    }

    fn state(&mut self) -> Result<u32> {
        if self.edges.len() >= MAX_STATES {
            return Err(Error::InvalidArgument(format!(
                "the constraint's pattern needs more than {MAX_STATES} states"
            )));
        }
        self.edges.push(Vec::new());
        Ok(self.edges.len() as u32 - 1)
    }

    /// Adds edges for `p` from `from` to `to`.
    fn build(&mut self, p: &Pattern, from: u32, to: u32) -> Result<()> {
        match p {
            Pattern::Literal(text) => {
                let mut at = from;
                let chars: Vec<char> = text.chars().collect();
                for (i, &c) in chars.iter().enumerate() {
                    let next = if i + 1 == chars.len() {
                        to
                    } else {
                        self.state()?
                    };
                    self.edges[at as usize].push(Edge::Char(vec![(c, c)], next));
                    at = next;
                }
                if chars.is_empty() {
                    self.edges[from as usize].push(Edge::Empty(to));
                }
            }
            Pattern::Class(ranges) => {
                self.edges[from as usize].push(Edge::Char(ranges.clone(), to));
            }
            Pattern::Seq(items) => {
                let mut at = from;
                for (i, item) in items.iter().enumerate() {
                    let next = if i + 1 == items.len() {
                        to
                    } else {
                        self.state()?
                    };
                    self.build(item, at, next)?;
                    at = next;
                }
                if items.is_empty() {
                    self.edges[from as usize].push(Edge::Empty(to));
                }
            }
            Pattern::Alt(items) => {
                for item in items {
                    self.build(item, from, to)?;
                }
            }
            Pattern::Repeat { item, min, max } => {
                if min > max {
                    return Err(Error::InvalidArgument(format!(
                        "a repetition of {min} to {max} times"
                    )));
                }
                let mut at = from;
                for i in 0..*max {
                    let next = self.state()?;
                    self.build(item, at, next)?;
                    if i >= *min {
                        self.edges[at as usize].push(Edge::Empty(to));
                    }
                    at = next;
                }
                self.edges[at as usize].push(Edge::Empty(to));
            }
        }
        Ok(())
    }

    /// `states` with every state reachable by empty edges added, sorted.
    fn closure(&self, mut states: Vec<u32>) -> Vec<u32> {
        let mut stack = states.clone();
        while let Some(s) = stack.pop() {
            for e in &self.edges[s as usize] {
                if let Edge::Empty(t) = e {
                    if !states.contains(t) {
                        states.push(*t);
                        stack.push(*t);
                    }
                }
            }
        }
        states.sort_unstable();
        states
    }

    /// The states after reading `c` from `states` (closed).
    fn step(&self, states: &[u32], c: char) -> Vec<u32> {
        let mut next = Vec::new();
        for &s in states {
            for e in &self.edges[s as usize] {
                if let Edge::Char(ranges, t) = e {
                    if ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) && !next.contains(t) {
                        next.push(*t);
                    }
                }
            }
        }
        self.closure(next)
    }

    /// The states after reading `text` from `states`; empty when it leaves the language.
    fn run(&self, states: &[u32], text: &str) -> Vec<u32> {
        let mut at = states.to_vec();
        for c in text.chars() {
            at = self.step(&at, c);
            if at.is_empty() {
                break;
            }
        }
        at
    }
}

/// One sequence's progress through an [`Nfa`], with the texts of the vocabulary's tokens.
#[derive(Debug, Clone)]
pub struct Constraint {
    nfa: Arc<Nfa>,
    /// Each token's text; `None` for tokens that may never be sampled under a constraint
    /// (control tokens, pieces of a character).
    texts: Arc<Vec<Option<String>>>,
    states: Vec<u32>,
}

impl Constraint {
    /// At the start of `nfa`'s language, over a vocabulary whose token `i` reads
    /// `texts[i]`.
    pub fn new(nfa: Arc<Nfa>, texts: Arc<Vec<Option<String>>>) -> Constraint {
        let states = nfa.closure(vec![nfa.start]);
        Constraint { nfa, texts, states }
    }

    /// Whether the text so far is a whole word of the language.
    pub fn accepting(&self) -> bool {
        self.states.contains(&self.nfa.accept)
    }

    /// Whether the text so far is a whole word that no character can extend.
    pub fn finished(&self) -> bool {
        self.accepting()
            && self.states.iter().all(|&s| {
                self.nfa.edges[s as usize]
                    .iter()
                    .all(|e| matches!(e, Edge::Empty(_)))
            })
    }

    /// Sets to −∞ the logits of the tokens that may not come next: those without a text,
    /// or whose text leaves the language; the `stop` tokens stay only when the text is a
    /// whole word. Returns how many tokens remain.
    pub fn mask(&self, logits: &mut [f32], stop: &[u32]) -> usize {
        let accepting = self.accepting();
        let mut allowed = 0;
        for (id, logit) in logits.iter_mut().enumerate() {
            let ok = if stop.contains(&(id as u32)) {
                accepting
            } else {
                match self.texts.get(id).and_then(Option::as_deref) {
                    Some(text) => !self.nfa.run(&self.states, text).is_empty(),
                    None => false,
                }
            };
            if ok {
                allowed += 1;
            } else {
                *logit = f32::NEG_INFINITY;
            }
        }
        allowed
    }

    /// Takes token `id`.
    ///
    /// Errors: [`Error::InvalidArgument`] if its text leaves the language (or it has none).
    pub fn advance(&mut self, id: u32) -> Result<()> {
        let next = match self.texts.get(id as usize).and_then(Option::as_deref) {
            Some(text) => self.nfa.run(&self.states, text),
            None => Vec::new(),
        };
        if next.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "token {id} leaves the constraint's language"
            )));
        }
        self.states = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(s: &str) -> Pattern {
        Pattern::Literal(s.into())
    }

    /// `{"a":` then 1 to 3 digits, then `}`, or `null`.
    fn pattern() -> Pattern {
        Pattern::Alt(vec![
            Pattern::Seq(vec![
                lit("{\"a\":"),
                Pattern::Repeat {
                    item: Box::new(Pattern::Class(vec![('0', '9')])),
                    min: 1,
                    max: 3,
                },
                lit("}"),
            ]),
            lit("null"),
        ])
    }

    fn constraint(texts: &[&str]) -> Constraint {
        let nfa = Arc::new(Nfa::new(&pattern()).unwrap());
        let texts = texts
            .iter()
            .map(|t| (!t.is_empty()).then(|| t.to_string()))
            .collect();
        Constraint::new(nfa, Arc::new(texts))
    }

    #[test]
    fn words_and_prefixes_of_the_language() {
        let nfa = Nfa::new(&pattern()).unwrap();
        let start = nfa.closure(vec![nfa.start]);
        for word in ["{\"a\":1}", "{\"a\":123}", "null"] {
            assert!(nfa.run(&start, word).contains(&nfa.accept), "{word}");
        }
        for prefix in ["{\"a\":12", "nu", ""] {
            let s = nfa.run(&start, prefix);
            assert!(!s.is_empty() && !s.contains(&nfa.accept), "{prefix}");
        }
        for outside in ["{\"a\":}", "{\"a\":1234}", "nil", "null "] {
            assert!(nfa.run(&start, outside).is_empty(), "{outside}");
        }
        let bad = Pattern::Repeat {
            item: Box::new(lit("x")),
            min: 2,
            max: 1,
        };
        assert!(Nfa::new(&bad).is_err());
    }

    #[test]
    fn the_mask_keeps_the_tokens_that_stay_in_the_language() {
        // Token 5 stands for EOS (no text, a stop token); token 6 has no text.
        let texts = ["{\"a\":", "1", "12}", "null", "}", "", ""];
        let mut c = constraint(&texts);
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
        let mut c = constraint(&texts);
        c.advance(3).unwrap();
        assert!(c.finished());
    }
}
