//! A vocabulary's tokens as bytes, walked as a trie through a [`Dfa`], and the fit of a DFA
//! to a vocabulary: which states a token may end in, so that a reply constrained to the
//! language always has a token to continue with.
//!
//! A vocabulary may lack tokens a language needs: one without byte tokens cannot spell a
//! character that none of its tokens holds whole (`ÿ` is C3 BF in UTF-8), and one whose
//! tokens all hold two characters cannot end a word of odd length. A state is *good* when
//! the text there is a whole word, or when some token leads from it to a good state; the
//! good states are the largest set with that property (a greatest fixpoint, computed by
//! removing the states without a token into the set until none is left). A token may then
//! be sampled only if it ends in a good state, so that from every state a reply reaches
//! there is a token to continue, or the reply is a whole word. Where the start is not good,
//! no reply can be written, which [`super::Grammar::new`] reports.
//!
//! Most vocabularies spell every byte with a token of its own (byte-level BPE, SentencePiece
//! with byte fallback): then every state is good and one pass over the DFA's rows shows it.
//! Otherwise a state without a byte token into a good state looks for a longer token by a
//! walk of the vocabulary, and a state found not good makes the states that counted on it
//! look again.

use std::ops::ControlFlow;

use super::dfa::{Clock, Dfa, DEAD};
use crate::Result;

/// A state no token may end in: from it, no token leads to a good state.
pub(super) const BLOCKED: u8 = 1;
/// A state whose text is a whole word that no token extends to a good state.
pub(super) const ENDS: u8 = 2;

/// The bytes of a vocabulary's tokens, sorted so that [`super::Constraint::mask`] can walk
/// them as a trie.
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
    /// The tokens that start with byte `b` are `order[starts[b]..starts[b + 1]]`.
    starts: Vec<u32>,
    /// Whether a token spells byte `b` alone.
    spells: [bool; 256],
}

impl Vocabulary {
    /// A vocabulary whose token `i` adds `tokens[i]` to a text (its UTF-8 bytes, possibly
    /// part of a character); `None` or empty for tokens that may never be sampled under a
    /// constraint (control tokens).
    pub fn new(tokens: &[Option<Vec<u8>>]) -> Vocabulary {
        let mut bytes = Vec::new();
        let mut spans = Vec::with_capacity(tokens.len());
        let mut spells = [false; 256];
        for t in tokens {
            let start = bytes.len() as u32;
            let t = t.as_deref().unwrap_or_default();
            if let [b] = t {
                spells[usize::from(*b)] = true;
            }
            bytes.extend_from_slice(t);
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
        let starts = (0..=256)
            .map(|b| order.partition_point(|&id| usize::from(of(id)[0]) < b) as u32)
            .collect();
        Vocabulary {
            bytes,
            spans,
            order,
            shared,
            starts,
            spells,
        }
    }

    /// Token `id`'s bytes, empty if it has none.
    pub(super) fn of(&self, id: u32) -> &[u8] {
        match self.spans.get(id as usize) {
            Some(&(a, b)) => &self.bytes[a as usize..b as usize],
            None => &[],
        }
    }

    /// Calls `visit(id, end)` for each token whose bytes stay in `dfa`'s language from
    /// `state`, `end` the state after them, in the order of their bytes, until it breaks.
    /// Costs at most one DFA transition per byte of the tokens whose first byte stays in
    /// the language, fewer where they share a prefix or a dead one.
    pub(super) fn walk<B>(
        &self,
        dfa: &Dfa,
        state: u32,
        mut visit: impl FnMut(u32, u32) -> ControlFlow<B>,
    ) -> Option<B> {
        // states[k]: the state after the current token's first k bytes; the first `k + 1`
        // entries belong to it, and the last of them may be dead.
        let mut states = Vec::with_capacity(32);
        for (b, group) in self.starts.windows(2).enumerate() {
            let (from, to) = (group[0] as usize, group[1] as usize);
            if from == to || dfa.next(state, b as u8) == DEAD {
                continue;
            }
            states.clear();
            states.push(state);
            for j in from..to {
                let (id, shared) = (self.order[j], self.shared[j]);
                let bytes = self.of(id);
                let mut k = (shared as usize).min(states.len() - 1);
                states.truncate(k + 1);
                while k < bytes.len() && states[k] != DEAD {
                    states.push(dfa.next(states[k], bytes[k]));
                    k += 1;
                }
                if k == bytes.len() && states[k] != DEAD {
                    if let ControlFlow::Break(b) = visit(id, states[k]) {
                        return Some(b);
                    }
                }
            }
        }
        None
    }
}

/// The flags ([`BLOCKED`], [`ENDS`]) of each state of `dfa` over `vocab` (see the module
/// docs). Takes one pass over the DFA's rows when `vocab` spells the bytes the language
/// needs; else up to 17 bytes per state and a walk of the vocabulary per state that lacks
/// a byte token, within the time of `clock`.
pub(super) fn fit(dfa: &Dfa, vocab: &Vocabulary, clock: &mut Clock) -> Result<Vec<u8>> {
    let n = dfa.len();
    let classes = dfa.classes();
    let stride = dfa.row(DEAD).len();
    // The classes of bytes that a token spells alone.
    let mut single = vec![false; stride];
    for b in 0..256 {
        single[usize::from(classes[b])] |= vocab.spells[b];
    }
    // A state that a byte token leads to from `s`, among those `good` says.
    let by_byte = |s: u32, good: &dyn Fn(u32) -> bool| {
        dfa.row(s)
            .iter()
            .zip(&single)
            .find(|&(&x, &spelled)| spelled && x != DEAD && good(x))
            .map(|(&x, _)| x)
    };
    let mut flags = vec![0u8; n];
    flags[DEAD as usize] = BLOCKED;
    // Are all live states good? They are when each one that is not a whole word has a
    // byte token to a live state.
    let mut lacking = Vec::new();
    for s in 1..n as u32 {
        clock.tick(stride as u64)?;
        if by_byte(s, &|_| true).is_none() {
            lacking.push(s);
        }
    }
    if lacking.iter().all(|&s| dfa.accepting(s)) {
        for s in lacking {
            clock.check()?;
            if vocab.walk(dfa, s, |_, _| ControlFlow::Break(())).is_none() {
                flags[s as usize] = ENDS;
            }
        }
        return Ok(flags);
    }
    // The largest good set: every live state to start with, then removing those without a
    // token into it. A state's `witness` is the good state a token leads to; the states
    // relying on a witness are a list (`first`, then `after`), looked at again when their
    // witness turns out not good.
    const NONE: u32 = u32::MAX;
    let mut good: Vec<bool> = (0..n).map(|s| s != DEAD as usize).collect();
    let mut witness = vec![NONE; n];
    let mut first = vec![NONE; n];
    let mut after = vec![NONE; n];
    let mut queue: Vec<u32> = (1..n as u32).rev().collect();
    while let Some(s) = queue.pop() {
        clock.check()?;
        let found = by_byte(s, &|x| good[x as usize]).or_else(|| {
            vocab.walk(dfa, s, |_, x| match good[x as usize] {
                true => ControlFlow::Break(x),
                false => ControlFlow::Continue(()),
            })
        });
        let i = s as usize;
        match found {
            Some(x) => {
                witness[i] = x;
                after[i] = std::mem::replace(&mut first[x as usize], s);
            }
            None => {
                witness[i] = NONE;
                if !dfa.accepting(s) {
                    good[i] = false;
                    let mut d = std::mem::replace(&mut first[i], NONE);
                    while d != NONE {
                        if witness[d as usize] == s {
                            queue.push(d);
                        }
                        d = after[d as usize];
                    }
                }
            }
        }
    }
    for s in 1..n {
        flags[s] = match (good[s], witness[s]) {
            (false, _) => BLOCKED,
            (true, NONE) => ENDS,
            (true, _) => 0,
        };
    }
    Ok(flags)
}
