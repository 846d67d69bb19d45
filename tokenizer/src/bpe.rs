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
//! text take five times as long.
//! UNUSED pieces are split back into the pairs that formed them; one that cannot be
//! split, like any symbol that is not a NORMAL/USER_DEFINED/UNUSED piece, is unknown.
//! Finally, unknown symbols become byte pieces `<0xHH>` (byte fallback) or one `<unk>`
//! per run.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::sentencepiece::{SpModel, SPACE_SYMBOL};
use crate::vocab::{PieceKind, VocabEntry};

/// No neighbour.
const NONE: usize = usize::MAX;

/// sentencepiece's `kMaxBpeResegmentDepth`: deeper UNUSED pieces are emitted as they are.
const MAX_RESEGMENT_DEPTH: u32 = 100;

/// A symbol of the text: `text[start..start + len]`, linked to its live neighbours.
/// A symbol merged into its left neighbour has `len == 0`.
#[derive(Clone, Copy)]
struct Symbol {
    prev: usize,
    next: usize,
    start: usize,
    len: usize,
    freeze: bool,
}

/// A queued merge of symbols `left` and `right` (`SymbolPair`). `size` is the merged
/// length, used to recognise entries made stale by other merges.
struct Candidate {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
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

/// The merge state of one encode call.
struct Merger<'a> {
    model: &'a SpModel,
    pieces: &'a [VocabEntry],
    text: &'a [u8],
    symbols: Vec<Symbol>,
    agenda: BinaryHeap<Candidate>,
    /// `rev_merge`: for an UNUSED piece id, the last (start, left length, total length)
    /// pair that produced it.
    rev_merge: HashMap<u32, (usize, usize, usize)>,
}

impl Merger<'_> {
    /// `MaybeAddNewSymbolPair`.
    fn maybe_add(&mut self, left: usize, right: usize) {
        if left == NONE || right == NONE {
            return;
        }
        let (l, r) = (self.symbols[left], self.symbols[right]);
        if l.freeze || r.freeze {
            return;
        }
        let size = l.len + r.len;
        let Some(id) = self.model.normal.get(&self.text[l.start..l.start + size]) else {
            return;
        };
        let piece = &self.pieces[id as usize];
        self.agenda.push(Candidate {
            score: piece.score,
            left,
            right,
            size,
        });
        if piece.kind == PieceKind::Unused {
            self.rev_merge.insert(id, (l.start, l.len, size));
        }
    }

    /// Whether no merge can join symbol `i` to the one before it (see the module docs).
    fn starts_a_word(&self, i: usize) -> bool {
        let start = self.symbols[i].start;
        self.model.merges_within_words
            && self.text[start..].starts_with(SPACE_SYMBOL)
            && !self.text[..start].ends_with(SPACE_SYMBOL)
    }

    /// The main loop: merge the best pair until no pair is a piece, word by word where
    /// the vocabulary allows.
    fn merge_all(&mut self) {
        let n = self.symbols.len();
        let mut word = 0;
        while word < n {
            let mut end = word + 1;
            while end < n && !self.starts_a_word(end) {
                end += 1;
            }
            for i in word + 1..end {
                self.maybe_add(i - 1, i);
            }
            self.merge_queued();
            word = end;
        }
    }

    /// Merges the queued pairs, best first, queueing the new pairs they make.
    fn merge_queued(&mut self) {
        while let Some(top) = self.agenda.pop() {
            let (l, r) = (self.symbols[top.left], self.symbols[top.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != top.size {
                continue;
            }
            self.symbols[top.left].len = top.size;
            self.symbols[top.left].next = r.next;
            if r.next != NONE {
                self.symbols[r.next].prev = top.left;
            }
            self.symbols[top.right].len = 0;
            self.maybe_add(l.prev, top.left);
            self.maybe_add(top.left, r.next);
        }
    }
}

impl SpModel {
    /// Encodes an already normalised text (see [`SpModel::normalize`]), appending ids.
    pub(crate) fn encode_normalized(&self, pieces: &[VocabEntry], text: &[u8], out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut symbols = Vec::with_capacity(text.len());
        let mut pos = 0;
        while pos < text.len() {
            let (len, freeze) = self.prefix_match(&text[pos..]);
            let index = symbols.len();
            symbols.push(Symbol {
                prev: if index == 0 { NONE } else { index - 1 },
                next: if pos + len == text.len() {
                    NONE
                } else {
                    index + 1
                },
                start: pos,
                len,
                freeze,
            });
            pos += len;
        }
        let mut merger = Merger {
            model: self,
            pieces,
            text,
            symbols,
            agenda: BinaryHeap::new(),
            rev_merge: HashMap::new(),
        };
        merger.merge_all();

        let mut emitter = Emitter {
            model: self,
            out,
            prev_unk: false,
        };
        let mut stack = Vec::new();
        let mut index = 0;
        while index != NONE {
            let s = merger.symbols[index];
            // `resegment`, with an explicit stack (right part pushed first). A symbol
            // that is not a NORMAL/USER_DEFINED/UNUSED piece is unknown.
            stack.push((s.start, s.len, 0));
            while let Some((start, len, depth)) = stack.pop() {
                let w = &text[start..start + len];
                let id = self.normal.get(w);
                match id {
                    Some(id)
                        if depth <= MAX_RESEGMENT_DEPTH
                            && pieces[id as usize].kind == PieceKind::Unused =>
                    {
                        match merger.rev_merge.get(&id) {
                            Some(&(s, l, total)) => {
                                stack.push((s + l, total - l, depth + 1));
                                stack.push((s, l, depth + 1));
                            }
                            None => emitter.emit(w, None),
                        }
                    }
                    _ => emitter.emit(w, id),
                }
            }
            index = s.next;
        }
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
