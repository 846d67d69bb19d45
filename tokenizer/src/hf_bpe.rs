//! Encoding with a Hugging Face `tokenizers` BPE model of the SentencePiece kind, step
//! for step as `tokenizers` 0.2x does it:
//!
//! 1. added tokens that are not normalised are cut out of the raw text
//!    (`AddedVocabulary::extract_and_normalize`, leftmost-longest match, with
//!    `lstrip`/`rstrip`);
//! 2. every other piece is normalised (`Prepend`, `Replace`), then normalised added
//!    tokens are cut out of it;
//! 3. the `Metaspace` pre-tokenizer writes spaces as "▁", prepends one per its
//!    `prepend_scheme`, and optionally splits before every "▁";
//! 4. each word goes through `BPE::merge_word` (characters, byte fallback `<0xHH>`,
//!    fused unknowns) and `Word::merge_all`: a priority queue of the pairs listed in
//!    `merges`, lowest rank first, ties to the leftmost. O(n log n).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::decode::DecodeOptions;
use crate::fast_hash::FastMap;
use crate::spec::{AddedTokenSpec, SplitSpec};
use crate::trie::{Trie, TrieBuilder};
use crate::vocab::VocabEntry;
use crate::{Encoder, Tokenizer};

/// A normaliser step (`normalizers::Prepend`, `normalizers::Replace` with a string).
#[derive(Debug)]
pub(crate) enum NormOp {
    Prepend(String),
    Replace(String, String),
}

/// `PrependScheme` of the `Metaspace` pre-tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prepend {
    Always,
    First,
    Never,
}

/// The `Metaspace` pre-tokenizer.
#[derive(Debug)]
pub(crate) struct Metaspace {
    pub(crate) replacement: char,
    pub(crate) prepend: Prepend,
    pub(crate) split: bool,
}

/// One added token's matching options.
#[derive(Debug)]
pub(crate) struct AddedToken {
    pub(crate) id: u32,
    pub(crate) lstrip: bool,
    pub(crate) rstrip: bool,
}

/// A set of added tokens matched in text (leftmost-longest, like the `daachorse`
/// automaton `tokenizers` builds). The trie maps a pattern to an index in `tokens`.
#[derive(Debug)]
pub(crate) struct AddedTokens {
    pub(crate) trie: Trie,
    pub(crate) tokens: Vec<AddedToken>,
}

/// The added tokens of a model while they are read: those matched in the raw text and
/// those matched in the normalised text, each a trie of patterns and their tokens.
pub(crate) struct AddedTokensBuilder {
    raw: (TrieBuilder, Vec<AddedToken>),
    normalized: (TrieBuilder, Vec<AddedToken>),
}

impl AddedTokensBuilder {
    pub(crate) fn new() -> Self {
        AddedTokensBuilder {
            raw: (TrieBuilder::new(), Vec::new()),
            normalized: (TrieBuilder::new(), Vec::new()),
        }
    }

    /// Adds `t`, matched as `pattern` (its content, normalised when `t.normalized`). Of
    /// two tokens with one pattern in a set, the first keeps it, as in `tokenizers`.
    pub(crate) fn add(&mut self, t: &AddedTokenSpec, pattern: &str) {
        let (trie, tokens) = if t.normalized {
            &mut self.normalized
        } else {
            &mut self.raw
        };
        if trie
            .insert(pattern.as_bytes(), tokens.len() as u32)
            .is_none()
        {
            tokens.push(AddedToken {
                id: t.id,
                lstrip: t.lstrip,
                rstrip: t.rstrip,
            });
        }
    }

    /// The raw and the normalised sets.
    pub(crate) fn build(self) -> (AddedTokens, AddedTokens) {
        let set = |(trie, tokens): (TrieBuilder, Vec<AddedToken>)| AddedTokens {
            trie: trie.build(),
            tokens,
        };
        (set(self.raw), set(self.normalized))
    }
}

/// The encoder of a `tokenizer.json` BPE model.
#[derive(Debug)]
pub(crate) struct HfModel {
    /// `model.vocab`: token string to id.
    pub(crate) vocab: Trie,
    /// (left id, right id) -> (rank, merged id).
    pub(crate) merges: FastMap<(u32, u32), (u32, u32)>,
    pub(crate) unk: Option<u32>,
    pub(crate) fuse_unk: bool,
    /// `<0xHH>` ids when `byte_fallback` is on.
    pub(crate) byte_ids: Option<Box<[Option<u32>; 256]>>,
    pub(crate) ignore_merges: bool,
    pub(crate) added_raw: AddedTokens,
    pub(crate) added_normalized: AddedTokens,
    pub(crate) normalizer: Vec<NormOp>,
    pub(crate) metaspace: Option<Metaspace>,
    pub(crate) split: Option<SplitSpec>,
}

/// Applies the normaliser steps in order (`Prepend` only to non-empty text).
pub(crate) fn normalize(ops: &[NormOp], s: &str) -> String {
    let mut s = s.to_owned();
    for op in ops {
        match op {
            NormOp::Prepend(p) if !s.is_empty() => s.insert_str(0, p),
            NormOp::Prepend(_) => {}
            NormOp::Replace(from, to) => s = s.replace(from.as_str(), to),
        }
    }
    s
}

/// A piece of the input on its way through the pipeline.
enum Split {
    Token(u32),
    /// Text, and whether it starts at offset 0 of the original input.
    Text(String, bool),
}

impl AddedTokens {
    /// `AddedVocabulary::find_matches`: (token id or None, byte range) covering `s`.
    pub(crate) fn find_matches(&self, s: &str) -> Vec<(Option<u32>, usize, usize)> {
        let b = s.as_bytes();
        let mut splits = Vec::new();
        let mut start_offset = 0;
        let mut pos = 0;
        while pos < b.len() && !self.trie.is_empty() {
            let Some((len, index)) = self.trie.longest_prefix(&b[pos..]) else {
                pos += 1;
                continue;
            };
            let tok = &self.tokens[index as usize];
            let (mut start, mut stop) = (pos, pos + len);
            if tok.lstrip {
                start = s[..start].trim_end().len();
            }
            // Never overlap the previous match (tokenizers would slice twice).
            start = start.max(start_offset);
            if tok.rstrip {
                stop = s.len() - s[stop..].trim_start().len();
            }
            if start_offset < start {
                splits.push((None, start_offset, start));
            }
            splits.push((Some(tok.id), start, stop));
            start_offset = stop;
            pos = stop.max(pos + len);
        }
        if start_offset < b.len() {
            splits.push((None, start_offset, b.len()));
        }
        splits
    }
}

impl HfModel {
    /// The tokenizer around this model. Its decoder drops the first piece's "▁" when the
    /// normaliser or pre-tokenizer prepends one (the `Metaspace`/`Strip` decoders).
    pub(crate) fn into_tokenizer(
        self,
        pieces: Vec<VocabEntry>,
        bos: Option<u32>,
        eos: Option<u32>,
    ) -> Tokenizer {
        let strip_bos_space = self
            .normalizer
            .iter()
            .any(|op| matches!(op, NormOp::Prepend(p) if p == "\u{2581}"))
            || self
                .metaspace
                .as_ref()
                .is_some_and(|m| m.prepend != Prepend::Never);
        Tokenizer {
            pieces,
            bos,
            eos,
            encoder: Encoder::HuggingFace(self),
            decoding: DecodeOptions {
                strip_bos_space,
                strip_all_leading_spaces: false,
                unk_surface: crate::spec::default_unk_surface().into(),
                byte_level: false,
            },
            add_bos: true,
            chat_template: None,
            prefix: None,
            chat_format: None,
            template_time: None,
        }
    }

    /// Encodes `text`, appending ids.
    pub(crate) fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let mut splits = Vec::new();
        for (id, a, b) in self.added_raw.find_matches(text) {
            match id {
                Some(id) => splits.push(Split::Token(id)),
                None => {
                    let normalized = normalize(&self.normalizer, &text[a..b]);
                    for (id, c, d) in self.added_normalized.find_matches(&normalized) {
                        splits.push(match id {
                            Some(id) => Split::Token(id),
                            None => Split::Text(normalized[c..d].to_owned(), a == 0 && c == 0),
                        });
                    }
                }
            }
        }
        for split in splits {
            match split {
                Split::Token(id) => out.push(id),
                Split::Text(s, at_start) => match &self.metaspace {
                    None => match &self.split {
                        None => self.tokenize_word(&s, out),
                        Some(split) => {
                            for piece in split.pieces(&s) {
                                self.tokenize_word(piece, out);
                            }
                        }
                    },
                    Some(m) => {
                        let s = m.pre_tokenize(&s, at_start);
                        if m.split {
                            let mut start = 0;
                            for (i, _) in s.match_indices(m.replacement).filter(|&(i, _)| i > 0) {
                                self.tokenize_word(&s[start..i], out);
                                start = i;
                            }
                            self.tokenize_word(&s[start..], out);
                        } else {
                            self.tokenize_word(&s, out);
                        }
                    }
                },
            }
        }
    }

    /// `BPE::tokenize` of one word: `merge_word` then `Word::merge_all`.
    fn tokenize_word(&self, w: &str, out: &mut Vec<u32>) {
        if w.is_empty() {
            return;
        }
        if self.ignore_merges {
            if let Some(id) = self.vocab.get(w.as_bytes()) {
                out.push(id);
                return;
            }
        }
        let mut word = Word::default();
        let mut unk: Option<(u32, usize)> = None;
        for (i, c) in w.char_indices() {
            let s = &w[i..i + c.len_utf8()];
            if let Some(id) = self.vocab.get(s.as_bytes()) {
                if let Some((unk_id, unk_len)) = unk.take() {
                    word.add(unk_id, unk_len);
                }
                word.add(id, s.len());
                continue;
            }
            if let Some(bytes) = &self.byte_ids {
                let ids: Option<Vec<u32>> = s.bytes().map(|b| bytes[b as usize]).collect();
                if let Some(ids) = ids {
                    for id in ids {
                        word.add(id, 1);
                    }
                    continue;
                }
            }
            if let Some(unk_id) = self.unk {
                unk = match unk {
                    Some((id, len)) if self.fuse_unk => Some((id, len + s.len())),
                    Some((id, len)) => {
                        word.add(id, len);
                        Some((unk_id, s.len()))
                    }
                    None => Some((unk_id, s.len())),
                };
            }
        }
        if let Some((unk_id, unk_len)) = unk {
            word.add(unk_id, unk_len);
        }
        word.merge_all(&self.merges);
        out.extend(word.symbols.iter().filter(|s| s.len != 0).map(|s| s.id));
    }
}

impl Metaspace {
    /// `Metaspace::pre_tokenize` before splitting: spaces become the replacement, which is
    /// also prepended unless the text already starts with it.
    fn pre_tokenize(&self, s: &str, at_start: bool) -> String {
        let mut s = s.replace(' ', self.replacement.encode_utf8(&mut [0; 4]));
        let prepend = match self.prepend {
            Prepend::Always => true,
            Prepend::First => at_start,
            Prepend::Never => false,
        };
        if prepend && !s.is_empty() && !s.starts_with(self.replacement) {
            s.insert(0, self.replacement);
        }
        s
    }
}

/// `bpe::word::Symbol`.
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: isize,
    next: isize,
    len: usize,
}

/// `bpe::word::Word`.
#[derive(Default)]
struct Word {
    symbols: Vec<Symbol>,
}

/// `bpe::word::Merge`: lowest rank first, then leftmost.
struct Merge {
    pos: usize,
    rank: u32,
    new_id: u32,
}

impl Ord for Merge {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.pos.cmp(&self.pos))
    }
}

impl PartialEq for Merge {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Merge {}

impl PartialOrd for Merge {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Word {
    fn add(&mut self, id: u32, len: usize) {
        let n = self.symbols.len() as isize;
        if let Some(last) = self.symbols.last_mut() {
            last.next = n;
        }
        self.symbols.push(Symbol {
            id,
            prev: n - 1,
            next: -1,
            len,
        });
    }

    /// `Word::merge_all` without dropout. A queued merge is stale when the pair now at
    /// its position no longer merges into the same id.
    fn merge_all(&mut self, merges: &FastMap<(u32, u32), (u32, u32)>) {
        let mut queue: BinaryHeap<Merge> = self
            .symbols
            .windows(2)
            .enumerate()
            .filter_map(|(pos, w)| {
                let &(rank, new_id) = merges.get(&(w[0].id, w[1].id))?;
                Some(Merge { pos, rank, new_id })
            })
            .collect();
        while let Some(top) = queue.pop() {
            let cur = self.symbols[top.pos];
            if cur.len == 0 || cur.next == -1 {
                continue;
            }
            let next_pos = cur.next as usize;
            let right = self.symbols[next_pos];
            match merges.get(&(cur.id, right.id)) {
                Some(&(_, new_id)) if new_id == top.new_id => {}
                _ => continue,
            }
            let merged = Symbol {
                id: top.new_id,
                prev: cur.prev,
                next: right.next,
                len: cur.len + right.len,
            };
            self.symbols[top.pos] = merged;
            self.symbols[next_pos].len = 0;
            if right.next > -1 {
                self.symbols[right.next as usize].prev = top.pos as isize;
            }
            if merged.prev >= 0 {
                let prev = merged.prev as usize;
                if let Some(&(rank, new_id)) = merges.get(&(self.symbols[prev].id, merged.id)) {
                    queue.push(Merge {
                        pos: prev,
                        rank,
                        new_id,
                    });
                }
            }
            if merged.next >= 0 {
                let next = self.symbols[merged.next as usize];
                if let Some(&(rank, new_id)) = merges.get(&(merged.id, next.id)) {
                    queue.push(Merge {
                        pos: top.pos,
                        rank,
                        new_id,
                    });
                }
            }
        }
    }
}
