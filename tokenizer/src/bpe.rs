//! SentencePiece BPE encoding, as `bpe::Model::SampleEncode` (bpe_model.cc, without
//! dropout) followed by the unknown-piece handling of
//! `SentencePieceProcessor::EncodeOptimized` (sentencepiece_processor.cc), both as of
//! sentencepiece 0.2.3, the release the test data was checked against.
//!
//! The normalised text is split into characters (user-defined symbols stay whole and are
//! frozen). Every adjacent pair whose concatenation is a piece goes into a priority queue
//! ordered by that piece's score, highest first, ties to the leftmost pair. The best pair
//! is merged, its stale neighbours are skipped when they surface, and the two new pairs
//! are queued. Each merge costs O(log n), so a text of n characters costs O(n log n).
//! When the vocabulary cannot join a word to the "▁" that starts the next one
//! (`SpModel::merges_within_words`, true of Llama's), no pair ever spans that point, so
//! the merges on either side never meet, and each word is merged with a queue of its own:
//! the same merges in the same order, but a queue that stays in the cache instead of one
//! with an entry per character of the text, whose cache misses made 1 MB of English
//! text take five times as long. A word of a few symbols is merged by a scan for the best
//! pair at each step instead (`Merger::merge_by_scan`), which picks the same pairs
//! without the queue's pushes, pops and stale entries.
//! Two symbols that spell pieces are looked up as a pair of ids (`SpModel::pairs`), not by
//! walking the trie along their concatenation.
//! UNUSED pieces are split back into the pairs that formed them; one that cannot be
//! split, like any symbol that is not a NORMAL/USER_DEFINED/UNUSED piece, is unknown.
//! Finally, unknown symbols become byte pieces `<0xHH>` (byte fallback) or one `<unk>`
//! per run.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::fast_hash::pair_key;
use crate::sentencepiece::{SpModel, SPACE_SYMBOL};
use crate::vocab::{PieceKind, VocabEntry};

/// No neighbour.
const NONE: usize = usize::MAX;

/// A symbol that spells no merge target.
const NO_ID: u32 = u32::MAX;

/// The most symbols of a word merged by [`Merger::merge_by_scan`]: past it, the scan's
/// quadratic steps cost more than the queue's.
const SCAN_MAX: usize = 24;

/// sentencepiece's `kMaxBpeResegmentDepth`: deeper UNUSED pieces are emitted as they are.
const MAX_RESEGMENT_DEPTH: u32 = 100;

/// A symbol of the word: `text[start..start + len]`, linked to its live neighbours, with
/// the id of the merge target it spells ([`NO_ID`] if none). A symbol merged into its
/// left neighbour has `len == 0`.
#[derive(Clone, Copy)]
struct Symbol {
    prev: usize,
    next: usize,
    start: usize,
    len: usize,
    id: u32,
    freeze: bool,
}

/// A queued merge of symbols `left` and `right` (`SymbolPair`) into piece `id`. `size`
/// is the merged length, used to recognise entries made stale by other merges.
struct Candidate {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
    id: u32,
}

impl Candidate {
    /// The score with -0.0 folded into 0.0, so the order is C++'s `<` on floats.
    fn key(&self) -> f32 {
        if self.score == 0.0 {
            0.0
        } else {
            self.score
        }
    }
}

impl Ord for Candidate {
    /// Higher score first; on a tie, the leftmost pair (`SymbolPairComparator`).
    fn cmp(&self, other: &Self) -> Ordering {
        self.key()
            .total_cmp(&other.key())
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Candidate {}

/// The merge state of one encode call: the symbols of the current word, its queue and the
/// output, all reused from word to word.
struct Merger<'a> {
    model: &'a SpModel,
    pieces: &'a [VocabEntry],
    text: &'a [u8],
    symbols: Vec<Symbol>,
    agenda: BinaryHeap<Candidate>,
    /// `rev_merge`: for an UNUSED piece id, the last (start, left length, total length)
    /// pair that produced it.
    rev_merge: HashMap<u32, (usize, usize, usize)>,
    /// The merge of each adjacent pair of the word, for [`Merger::merge_by_scan`].
    candidates: Vec<Option<(u32, f32)>>,
    /// The resegmenting stack: (start, length, depth) of the parts still to emit.
    stack: Vec<(usize, usize, u32)>,
    emitter: Emitter<'a>,
}

impl Merger<'_> {
    /// Appends the symbol `text[start..start + len]` to the current word.
    fn push(&mut self, start: usize, len: usize, freeze: bool) {
        let index = self.symbols.len();
        self.symbols.push(Symbol {
            prev: if index == 0 { NONE } else { index - 1 },
            next: index + 1,
            start,
            len,
            id: self
                .model
                .normal
                .get(&self.text[start..start + len])
                .unwrap_or(NO_ID),
            freeze,
        });
    }

    /// `MaybeAddNewSymbolPair`: queues the merge of `left` and `right`, if any.
    fn maybe_add(&mut self, left: usize, right: usize) {
        if left == NONE || right == NONE {
            return;
        }
        let (l, r) = (self.symbols[left], self.symbols[right]);
        let Some((id, score)) = self.lookup(l, r) else {
            return;
        };
        let size = l.len + r.len;
        self.agenda.push(Candidate {
            score,
            left,
            right,
            size,
            id,
        });
        if !self.model.merges_within_words && self.pieces[id as usize].kind == PieceKind::Unused {
            self.rev_merge.insert(id, (l.start, l.len, size));
        }
    }

    /// The piece (id, score) that symbols `l` and `r` merge into, if they merge. Two
    /// symbols that spell pieces are looked up in the pair table (the same answer as
    /// looking their concatenation up, without walking it); a symbol that spells none
    /// makes the lookup by bytes.
    fn lookup(&self, l: Symbol, r: Symbol) -> Option<(u32, f32)> {
        if l.freeze || r.freeze {
            return None;
        }
        if l.id != NO_ID && r.id != NO_ID {
            return self.model.pairs.get(&pair_key(l.id, r.id)).copied();
        }
        (self
            .model
            .normal
            .get(&self.text[l.start..l.start + l.len + r.len]))
        .map(|id| (id, self.pieces[id as usize].score))
    }

    /// Whether no merge can join a symbol starting at `start` to the one before it (see
    /// the module docs).
    fn starts_a_word(&self, start: usize) -> bool {
        self.model.merges_within_words
            && self.text[start..].starts_with(SPACE_SYMBOL)
            && !self.text[..start].ends_with(SPACE_SYMBOL)
    }

    /// Merges the current word's symbols, emits them and starts the next word.
    fn flush(&mut self) {
        let n = self.symbols.len();
        if n == 0 {
            return;
        }
        if self.model.merges_within_words && n <= SCAN_MAX {
            self.merge_by_scan();
            for i in 0..self.symbols.len() {
                self.emit(self.symbols[i]);
            }
            self.symbols.clear();
            return;
        }
        self.symbols[n - 1].next = NONE;
        for i in 1..n {
            self.maybe_add(i - 1, i);
        }
        self.merge_queued();
        let mut index = 0;
        while index != NONE {
            let s = self.symbols[index];
            self.emit(s);
            index = s.next;
        }
        self.symbols.clear();
    }

    /// Merges the word's symbols, kept contiguous (their links unused), by scanning the
    /// merge of each adjacent pair for the best, highest score and leftmost on ties as
    /// the queue orders them, until no pair merges. The UNUSED pieces whose resegmenting
    /// needs the queue's order of pairs do not occur where words are merged apart.
    fn merge_by_scan(&mut self) {
        let mut candidates = std::mem::take(&mut self.candidates);
        candidates.clear();
        candidates.extend((self.symbols.windows(2)).map(|w| self.lookup(w[0], w[1])));
        loop {
            let mut best: Option<(usize, u32, f32)> = None;
            for (i, c) in candidates.iter().enumerate() {
                if let Some((id, score)) = *c {
                    let key = |score: f32| if score == 0.0 { 0.0 } else { score };
                    if best.is_none_or(|(_, _, b)| key(score).total_cmp(&key(b)).is_gt()) {
                        best = Some((i, id, score));
                    }
                }
            }
            let Some((i, id, _)) = best else {
                break;
            };
            let right = self.symbols.remove(i + 1);
            let merged = &mut self.symbols[i];
            merged.len += right.len;
            merged.id = id;
            candidates.remove(i);
            if i < candidates.len() {
                candidates[i] = self.lookup(self.symbols[i], self.symbols[i + 1]);
            }
            if i > 0 {
                candidates[i - 1] = self.lookup(self.symbols[i - 1], self.symbols[i]);
            }
        }
        self.candidates = candidates;
    }

    /// Merges the queued pairs, best first, queueing the new pairs they make.
    fn merge_queued(&mut self) {
        while let Some(top) = self.agenda.pop() {
            let (l, r) = (self.symbols[top.left], self.symbols[top.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != top.size {
                continue;
            }
            let merged = &mut self.symbols[top.left];
            merged.len = top.size;
            merged.next = r.next;
            merged.id = top.id;
            if r.next != NONE {
                self.symbols[r.next].prev = top.left;
            }
            self.symbols[top.right].len = 0;
            self.maybe_add(l.prev, top.left);
            self.maybe_add(top.left, r.next);
        }
    }

    /// Emits a merged symbol: `resegment` of an UNUSED piece, with an explicit stack
    /// (right part pushed first); a symbol that is not a NORMAL/USER_DEFINED/UNUSED piece
    /// is unknown.
    fn emit(&mut self, s: Symbol) {
        let w = &self.text[s.start..s.start + s.len];
        if s.id == NO_ID || self.pieces[s.id as usize].kind != PieceKind::Unused {
            self.emitter.emit(w, (s.id != NO_ID).then_some(s.id));
            return;
        }
        self.stack.push((s.start, s.len, 0));
        while let Some((start, len, depth)) = self.stack.pop() {
            let w = &self.text[start..start + len];
            let id = self.model.normal.get(w);
            match id {
                Some(id)
                    if depth <= MAX_RESEGMENT_DEPTH
                        && self.pieces[id as usize].kind == PieceKind::Unused =>
                {
                    match self.rev_merge.get(&id) {
                        Some(&(s, l, total)) => {
                            self.stack.push((s + l, total - l, depth + 1));
                            self.stack.push((s, l, depth + 1));
                        }
                        None => self.emitter.emit(w, None),
                    }
                }
                _ => self.emitter.emit(w, id),
            }
        }
    }
}

impl SpModel {
    /// Encodes an already normalised text (see [`SpModel::normalize`]), appending ids.
    /// The text is cut into words as it is split into symbols, and each word is merged and
    /// emitted before the next is read.
    pub(crate) fn encode_normalized(&self, pieces: &[VocabEntry], text: &[u8], out: &mut Vec<u32>) {
        let mut merger = Merger {
            model: self,
            pieces,
            text,
            symbols: Vec::new(),
            agenda: BinaryHeap::new(),
            rev_merge: HashMap::new(),
            candidates: Vec::new(),
            stack: Vec::new(),
            emitter: Emitter {
                model: self,
                out,
                prev_unk: false,
            },
        };
        let mut pos = 0;
        while pos < text.len() {
            let (len, freeze) = self.prefix_match(&text[pos..]);
            if pos > 0 && merger.starts_a_word(pos) {
                merger.flush();
            }
            merger.push(pos, len, freeze);
            pos += len;
        }
        merger.flush();
    }
}

/// The id output of `PopulateSentencePieceText`.
struct Emitter<'a> {
    model: &'a SpModel,
    out: &'a mut Vec<u32>,
    prev_unk: bool,
}

impl Emitter<'_> {
    /// Emits a symbol; `None` is unknown. Unknown symbols become byte pieces with byte
    /// fallback; without it, a run of them becomes a single `<unk>`.
    fn emit(&mut self, piece: &[u8], id: Option<u32>) {
        match (id, &self.model.byte_ids) {
            (Some(id), _) => self.out.push(id),
            (None, Some(bytes)) => self.out.extend(piece.iter().map(|&b| bytes[b as usize])),
            (None, None) if self.prev_unk => {}
            (None, None) => self.out.extend(self.model.unk_id),
        }
        self.prev_unk = id.is_none();
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use crate::{Encoder, Tokenizer};

    /// Llama's vocabulary merges word by word; random texts (words, runs of spaces,
    /// typed "▁", punctuation, digits, other scripts, byte-fallback characters) get the
    /// same ids as with one queue over the whole text.
    #[test]
    fn merging_word_by_word_changes_nothing() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/data/tokenizer/tokenizer.model"
        );
        let tok = Tokenizer::from_file(std::path::Path::new(path)).unwrap();
        let Encoder::SentencePiece(model) = &tok.encoder else {
            panic!("not SentencePiece");
        };
        assert!(model.merges_within_words);
        let mut whole = model.clone();
        whole.merges_within_words = false;
        let words = [
            "the",
            "The",
            "ing",
            "tion",
            "a",
            "I",
            "don't",
            "▁",
            "▁▁",
            " ",
            "  ",
            "   ",
            "\n",
            "\t",
            ".",
            ",",
            "!?",
            "1",
            "2023",
            "中文",
            "日本語",
            "é",
            "😀",
            "\u{301}",
            "ab",
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(48);
        for _ in 0..2000 {
            let text: String = (0..rng.random_range(0..24))
                .map(|_| words[rng.random_range(0..words.len())])
                .collect();
            let normalized = model.normalize(&text);
            let (mut a, mut b) = (Vec::new(), Vec::new());
            model.encode_normalized(&tok.pieces, &normalized, &mut a);
            whole.encode_normalized(&tok.pieces, &normalized, &mut b);
            assert_eq!(a, b, "{text:?}");
        }
    }
}
