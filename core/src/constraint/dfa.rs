//! The subset construction (Rabin & Scott 1959): regex-automata's Thompson NFA of a pattern
//! turned into a DFA over UTF-8 bytes, within a memory budget and a deadline.
//!
//! regex-automata's own dense DFA builder checks sizes but not the clock, and a small
//! pattern can take seconds to reach its size limits (`(\w{0,8}[a-z]){0,40}`: 11.8 s in a
//! release build, with sets of hundreds of NFA states for each of its thousands of DFA
//! states); here the clock is read as the work goes (every few thousand NFA states
//! visited), so a compilation ends within its time limit whatever the pattern. The DFA has no
//! look-arounds (a pattern has none) and no delayed matches: a state is accepting when the
//! bytes that led to it are a whole word.
//!
//! A DFA state is the set of the NFA's byte-consuming and match states that the bytes so
//! far reach (epsilon transitions followed), kept sorted so that equal sets are one state.
//! Bytes are grouped in the NFA's byte classes (bytes that no transition tells apart), so a
//! state has one row entry per class.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

use regex_automata::nfa::thompson::{State, Transition, NFA};
use regex_automata::util::primitives::StateID;

use super::{MAX_DETERMINIZE_BYTES, MAX_DFA_BYTES};
use crate::{Error, Result};

/// The dead state: the bytes have left the language. Its row leads to itself.
pub(super) const DEAD: u32 = 0;
/// The start state.
pub(super) const START: u32 = 1;

/// NFA states visited between two readings of the clock.
const CLOCK_EVERY: u64 = 4096;

/// Heap bytes per DFA state of the bookkeeping beside its set's elements: its offset, its
/// link in the hash chains and its share of the hash table.
const STATE_OVERHEAD: usize = 40;

/// A DFA over bytes: `next` rows of `stride` classes, state [`DEAD`] and [`START`] first.
#[derive(Debug, Clone)]
pub(super) struct Dfa {
    /// Each byte's class.
    classes: [u8; 256],
    /// Classes, the length of a row.
    stride: usize,
    /// `next[s * stride + c]`: the state after a byte of class `c` from state `s`.
    next: Vec<u32>,
    /// Whether the bytes that lead to a state are a whole word.
    accepting: Vec<bool>,
}

impl Dfa {
    /// States, the dead one included.
    pub(super) fn len(&self) -> usize {
        self.accepting.len()
    }

    /// The state after byte `b` from `state`.
    pub(super) fn next(&self, state: u32, b: u8) -> u32 {
        self.next[state as usize * self.stride + usize::from(self.classes[usize::from(b)])]
    }

    /// The states after one byte from `state`, one per class.
    pub(super) fn row(&self, state: u32) -> &[u32] {
        let at = state as usize * self.stride;
        &self.next[at..at + self.stride]
    }

    /// The classes of bytes, each byte's.
    pub(super) fn classes(&self) -> &[u8; 256] {
        &self.classes
    }

    /// Whether the bytes that lead to `state` are a whole word.
    pub(super) fn accepting(&self, state: u32) -> bool {
        self.accepting[state as usize]
    }

    /// Heap bytes.
    pub(super) fn memory_usage(&self) -> usize {
        self.next.len() * 4 + self.accepting.len()
    }
}

/// The time limit of a compilation, read every [`CLOCK_EVERY`] units of work.
pub(super) struct Clock {
    limit: Duration,
    deadline: Instant,
    work: u64,
}

impl Clock {
    /// A clock that fails `limit` from now.
    pub(super) fn new(limit: Duration) -> Clock {
        Clock {
            limit,
            deadline: Instant::now() + limit,
            work: 0,
        }
    }

    /// Counts `units` of work; past the deadline, an error naming the time limit.
    pub(super) fn tick(&mut self, units: u64) -> Result<()> {
        let before = self.work / CLOCK_EVERY;
        self.work += units;
        if self.work / CLOCK_EVERY != before {
            self.check()?;
        }
        Ok(())
    }

    /// An error naming the time limit if the deadline has passed.
    pub(super) fn check(&self) -> Result<()> {
        if Instant::now() > self.deadline {
            return Err(Error::InvalidArgument(format!(
                "the constraint did not compile within the time limit of {} s",
                self.limit.as_secs_f64()
            )));
        }
        Ok(())
    }
}

/// The epsilon closure of sets of NFA states, with the marks it reuses.
struct Closure {
    /// `marks[id] == generation`: NFA state `id` is in the closure being computed.
    marks: Vec<u32>,
    generation: u32,
    stack: Vec<StateID>,
}

impl Closure {
    fn new(nfa: &NFA) -> Closure {
        Closure {
            marks: vec![0; nfa.states().len()],
            generation: 0,
            stack: Vec::new(),
        }
    }

    /// The byte-consuming and match states reached from `roots` by epsilon transitions,
    /// sorted, into `out`.
    fn close(
        &mut self,
        nfa: &NFA,
        roots: &[StateID],
        out: &mut Vec<u32>,
        clock: &mut Clock,
    ) -> Result<()> {
        self.generation += 1;
        out.clear();
        self.stack.extend(roots.iter().rev());
        let mut visited = 0;
        while let Some(id) = self.stack.pop() {
            let mark = &mut self.marks[id.as_usize()];
            if *mark == self.generation {
                continue;
            }
            *mark = self.generation;
            visited += 1;
            match nfa.state(id) {
                State::ByteRange { .. }
                | State::Sparse(_)
                | State::Dense(_)
                | State::Match { .. } => out.push(id.as_u32()),
                State::Union { alternates } => self.stack.extend(alternates.iter().rev()),
                State::BinaryUnion { alt1, alt2 } => self.stack.extend([*alt2, *alt1]),
                State::Capture { next, .. } => self.stack.push(*next),
                // A pattern has no look-arounds; a failing state reaches nothing.
                State::Look { .. } | State::Fail => {}
            }
        }
        clock.tick(visited)?;
        out.sort_unstable();
        Ok(())
    }
}

/// The DFA states being built: their NFA sets, deduplicated through a hash table.
struct Sets {
    /// Every state's set, one after another.
    elements: Vec<u32>,
    /// State `s`'s set is `elements[starts[s]..starts[s + 1]]`.
    starts: Vec<u32>,
    /// The first state of each hash, then `chain[s]`: the next state of the same hash.
    table: HashMap<u64, u32>,
    chain: Vec<u32>,
    hasher: RandomState,
}

impl Sets {
    fn get(&self, s: u32) -> &[u32] {
        let s = s as usize;
        &self.elements[self.starts[s] as usize..self.starts[s + 1] as usize]
    }

    /// The state of `set`, and whether it is new.
    fn intern(&mut self, set: &[u32]) -> (u32, bool) {
        let hash = self.hasher.hash_one(set);
        let mut at = self.table.get(&hash).copied();
        while let Some(s) = at {
            if self.get(s) == set {
                return (s, false);
            }
            at = Some(self.chain[s as usize]).filter(|&n| n != u32::MAX);
        }
        let s = (self.starts.len() - 1) as u32;
        self.chain
            .push(self.table.insert(hash, s).unwrap_or(u32::MAX));
        self.elements.extend_from_slice(set);
        self.starts.push(self.elements.len() as u32);
        (s, true)
    }

    /// Heap bytes, roughly.
    fn memory_usage(&self) -> usize {
        self.elements.len() * 4 + self.chain.len() * STATE_OVERHEAD
    }
}

/// Adds the target of `t` to the bucket of each class of its bytes.
fn spread(t: &Transition, classes: &[u8; 256], buckets: &mut [Vec<StateID>]) {
    // Classes number the bytes in increasing order, so a range of bytes is a range of
    // classes (and the NFA's classes split at every transition's bounds).
    let (first, last) = (classes[usize::from(t.start)], classes[usize::from(t.end)]);
    for bucket in &mut buckets[usize::from(first)..=usize::from(last)] {
        bucket.push(t.next);
    }
}

/// The DFA of `nfa` from its anchored start.
///
/// Errors: [`Error::InvalidArgument`] naming the limit when the sets of the construction
/// exceed [`MAX_DETERMINIZE_BYTES`], the DFA [`MAX_DFA_BYTES`], or the work its `clock`.
pub(super) fn determinize(nfa: &NFA, clock: &mut Clock) -> Result<Dfa> {
    let too_large = |what: &str, limit: usize| {
        Error::InvalidArgument(format!(
            "the constraint is too large to compile: its {what} exceed the limit of {limit} bytes"
        ))
    };
    let mut classes = [0u8; 256];
    for b in 0..=255u8 {
        classes[usize::from(b)] = nfa.byte_classes().get(b);
    }
    let stride = usize::from(classes[255]) + 1;
    // One byte of each class.
    let mut representatives = vec![0u8; stride];
    for b in (0..=255u8).rev() {
        representatives[usize::from(classes[usize::from(b)])] = b;
    }
    let mut sets = Sets {
        elements: Vec::new(),
        starts: vec![0],
        table: HashMap::new(),
        chain: Vec::new(),
        hasher: RandomState::new(),
    };
    let mut closure = Closure::new(nfa);
    let mut set = Vec::new();
    sets.intern(&[]);
    closure.close(nfa, &[nfa.start_anchored()], &mut set, clock)?;
    sets.intern(&set);
    let is_match = |set: &[u32]| {
        set.iter()
            .any(|&id| matches!(nfa.state(StateID::must(id as usize)), State::Match { .. }))
    };
    let mut dfa = Dfa {
        classes,
        stride,
        next: vec![DEAD; 2 * stride],
        accepting: vec![false, is_match(&set)],
    };
    let mut buckets: Vec<Vec<StateID>> = vec![Vec::new(); stride];
    let mut pending = vec![START];
    while let Some(s) = pending.pop() {
        clock.check()?;
        for bucket in &mut buckets {
            bucket.clear();
        }
        for &id in sets.get(s) {
            match nfa.state(StateID::must(id as usize)) {
                State::ByteRange { trans } => spread(trans, &classes, &mut buckets),
                State::Sparse(sparse) => {
                    for t in sparse.transitions.iter() {
                        spread(t, &classes, &mut buckets);
                    }
                }
                State::Dense(dense) => {
                    for (bucket, &b) in buckets.iter_mut().zip(&representatives) {
                        let next = dense.transitions[usize::from(b)];
                        if next != StateID::ZERO {
                            bucket.push(next);
                        }
                    }
                }
                _ => {}
            }
        }
        clock.tick(sets.get(s).len() as u64)?;
        for (c, bucket) in buckets.iter().enumerate() {
            if bucket.is_empty() {
                continue;
            }
            closure.close(nfa, bucket, &mut set, clock)?;
            let (next, new) = sets.intern(&set);
            if new {
                // Its row, and its flags here and in the grammar.
                if (dfa.accepting.len() + 1) * (stride * 4 + 2) > MAX_DFA_BYTES {
                    return Err(too_large("states", MAX_DFA_BYTES));
                }
                if sets.memory_usage() > MAX_DETERMINIZE_BYTES {
                    return Err(too_large("NFA state sets", MAX_DETERMINIZE_BYTES));
                }
                dfa.next.resize(dfa.next.len() + stride, DEAD);
                dfa.accepting.push(is_match(&set));
                pending.push(next);
            }
            dfa.next[s as usize * stride + c] = next;
        }
    }
    dfa.next.shrink_to_fit();
    dfa.accepting.shrink_to_fit();
    Ok(dfa)
}
