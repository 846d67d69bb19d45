//! Byte-level BPE, in two styles that share one merge loop:
//!
//! - OpenAI's `tiktoken` (`CoreBPE` in its `src/lib.rs`), as GLM-4 uses it: of the
//!   adjacent parts, the pair whose concatenation has the lowest rank merges first, until no
//!   concatenation is in the vocabulary; a token's rank is its id.
//! - GPT-2's (Radford et al. 2019, `encoder.py` of openai/gpt-2; `tokenizers`'
//!   `models/bpe`), as Llama 3, Qwen2, GLM-4's HF files and Mistral-Nemo use it: the pair
//!   of adjacent tokens listed first in `merges` merges first.
//!
//! The text is first cut at the added tokens (`tokenizers`' `AddedVocabulary`, shared with
//! `hf_bpe.rs`) and optionally NFC-normalised (Qwen2), then cut into pre-tokens by a regex
//! (`split.rs`: linear-time automata with the lookahead `\s+(?!\S)` these patterns
//! need emulated, whatever the text's length); the text between two matches is a
//! pre-token too, as `tokenizers`' `Split` with `Isolated`
//! behaviour (and llama.cpp's `unicode_regex_split`) keep it. Each pre-token's UTF-8
//! bytes are merged. GPT-2's byte-to-unicode spelling of the vocabulary is undone when the
//! files are read (`gpt2.rs`), so pieces are raw bytes.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use unicode_normalization::UnicodeNormalization;

use crate::fast_hash::{pair_key, FastMap};
use crate::hf_bpe::{AddedTokens, AddedTokensBuilder};
use crate::spec::ByteLevelBpeSpec;
use crate::split::Splitter;
use crate::vocab::{PieceKind, VocabEntry};
use crate::{Error, Result};

/// A byte-level BPE model ready to encode.
#[derive(Debug)]
pub(crate) struct ByteBpe {
    /// Token bytes to id, the NORMAL pieces only.
    ids: FastMap<Box<[u8]>, u32>,
    /// GPT-2 style: (left id, right id) as [`pair_key`] to (merge rank, merged id).
    /// `None`: tiktoken style.
    merges: Option<FastMap<u64, (u32, u32)>>,
    /// The id of each single byte; [`NO_ID`] where it is not a token (GPT-2 style only).
    byte_ids: Box<[u32; 256]>,
    /// The pre-tokeniser: [`ByteLevelBpeSpec::pre_split`]'s regexes, then its `pattern`.
    regexes: Vec<Splitter>,
    /// The added tokens matched in the raw text, then (`normalized`) in the normalised text.
    added_raw: AddedTokens,
    added_normalized: AddedTokens,
    /// The description this was built from, for [`crate::Tokenizer::spec`].
    pub(crate) spec: ByteLevelBpeSpec,
}

/// The id of a part that is no token: a single byte missing from a GPT-2-style vocabulary.
const NO_ID: u32 = u32::MAX;

/// `text` in Unicode normalisation form C if `nfc` (`tokenizers`' `NFC` normalizer, by
/// the unicode-normalization crate), else as it is.
fn normalize(nfc: bool, text: &str) -> Cow<'_, str> {
    if nfc {
        Cow::Owned(text.nfc().collect())
    } else {
        Cow::Borrowed(text)
    }
}

impl ByteBpe {
    /// Builds the lookups of `spec` over `pieces` (indexed by id) and compiles its pattern.
    ///
    /// Errors: [`Error::Invalid`] for a pattern that does not compile, a piece of another
    /// kind than NORMAL, CONTROL or USER_DEFINED, a NORMAL token listed twice, a missing
    /// single byte in the tiktoken style (there every byte must be a token, so that any
    /// text encodes; GPT-2-style vocabularies may lack some, as SmolLM's lacks 21, six
    /// control bytes and the bytes no UTF-8 text has, and such a byte is dropped from the
    /// text as `tokenizers`' BPE without an unknown token and llama.cpp drop it), a merge of non-NORMAL ids or
    /// whose concatenation is not a token, or an added token out of range.
    pub(crate) fn new(pieces: &[VocabEntry], spec: ByteLevelBpeSpec) -> Result<ByteBpe> {
        let regexes = (spec.pre_split.iter().chain([&spec.pattern]))
            .map(|pattern| Splitter::new(pattern))
            .collect::<Result<Vec<_>>>()?;
        let mut ids = FastMap::with_capacity_and_hasher(pieces.len(), Default::default());
        for (id, p) in (0u32..).zip(pieces) {
            match p.kind {
                PieceKind::Normal => {
                    if ids.insert(p.bytes.clone(), id).is_some() {
                        return Err(Error::Invalid(format!(
                            "byte-level BPE token {:?} is listed twice",
                            String::from_utf8_lossy(&p.bytes)
                        )));
                    }
                }
                PieceKind::Control | PieceKind::UserDefined => {}
                other => {
                    return Err(Error::Invalid(format!(
                        "byte-level BPE piece {id} is of kind {other:?} (only normal, special \
                         and added tokens exist there)"
                    )))
                }
            }
        }
        let missing = (0..=255u8).find(|b| !ids.contains_key(&[*b][..]));
        if let (Some(b), None) = (missing, &spec.merges) {
            return Err(Error::Invalid(format!(
                "byte-level BPE vocabulary lacks the single byte 0x{b:02X}"
            )));
        }
        let normal = |id: u32| {
            pieces
                .get(id as usize)
                .filter(|p| p.kind == PieceKind::Normal)
                .map(|p| &p.bytes[..])
        };
        let merges = match &spec.merges {
            None => None,
            Some(list) => {
                let mut map = FastMap::with_capacity_and_hasher(list.len(), Default::default());
                for (rank, &[l, r]) in (0u32..).zip(list) {
                    let (Some(a), Some(b)) = (normal(l), normal(r)) else {
                        return Err(Error::Invalid(format!(
                            "byte-level BPE merge {l} {r} names a token outside the vocabulary"
                        )));
                    };
                    let Some(&merged) = ids.get(&[a, b].concat()[..]) else {
                        return Err(Error::Invalid(format!(
                            "byte-level BPE merge {l} {r}: {:?} is not a token",
                            String::from_utf8_lossy(&[a, b].concat())
                        )));
                    };
                    // A pair listed twice keeps its last rank, as `tokenizers` does.
                    map.insert(pair_key(l, r), (rank, merged));
                }
                Some(map)
            }
        };
        let mut added = AddedTokensBuilder::new();
        for t in &spec.added_tokens {
            let p = pieces.get(t.id as usize).ok_or_else(|| {
                Error::Invalid(format!(
                    "byte-level BPE added token {} is out of range",
                    t.id
                ))
            })?;
            let content = std::str::from_utf8(&p.bytes)
                .ok()
                .filter(|c| !c.is_empty())
                .ok_or_else(|| {
                    Error::Invalid(format!("added token {} is not non-empty UTF-8", t.id))
                })?;
            let pattern = if t.normalized {
                normalize(spec.nfc, content)
            } else {
                Cow::Borrowed(content)
            };
            added.add(t, &pattern);
        }
        let (added_raw, added_normalized) = added.build();
        let byte_ids = Box::new(std::array::from_fn(|b| {
            ids.get(&[b as u8][..]).copied().unwrap_or(NO_ID)
        }));
        Ok(ByteBpe {
            ids,
            merges,
            byte_ids,
            regexes,
            added_raw,
            added_normalized,
            spec,
        })
    }

    /// Appends the ids of `text`, as `tokenizers`' `AddedVocabulary::extract_and_normalize`
    /// and BPE do: added tokens that are not `normalized` are cut out of the raw text, the
    /// other pieces are normalised (NFC if the spec says so), `normalized` added tokens are
    /// cut out of them, and the rest is pre-tokenised and merged. Errors
    /// ([`Error::Encode`]) only if a pattern outside `split.rs`'s linear-time subset makes
    /// fancy-regex give up.
    pub(crate) fn encode(&self, text: &str, ids: &mut Vec<u32>) -> Result<()> {
        let mut scratch = Scratch::default();
        for (added, a, b) in self.added_raw.find_matches(text) {
            if let Some(id) = added {
                ids.push(id);
                continue;
            }
            let part = normalize(self.spec.nfc, &text[a..b]);
            for (added, c, d) in self.added_normalized.find_matches(&part) {
                match added {
                    Some(id) => ids.push(id),
                    None => self.split(&self.regexes, &part[c..d], ids, &mut scratch)?,
                }
            }
        }
        Ok(())
    }

    /// Cuts `text` with the first of `regexes` and each piece with the rest; merges the
    /// pieces the last one leaves.
    fn split(
        &self,
        regexes: &[Splitter],
        text: &str,
        ids: &mut Vec<u32>,
        scratch: &mut Scratch,
    ) -> Result<()> {
        let Some((regex, rest)) = regexes.split_first() else {
            self.word(text.as_bytes(), ids, scratch);
            return Ok(());
        };
        let mut last = 0;
        regex.for_each_match(text, |start, end| {
            if start > last {
                self.split(rest, &text[last..start], ids, scratch)?;
            }
            if end > start {
                self.split(rest, &text[start..end], ids, scratch)?;
            }
            last = end;
            Ok(())
        })?;
        if last < text.len() {
            self.split(rest, &text[last..], ids, scratch)?;
        }
        Ok(())
    }

    /// One pre-token: whole if it is a token and merges are ignored (tiktoken,
    /// `ignore_merges`), else merged.
    fn word(&self, piece: &[u8], ids: &mut Vec<u32>, scratch: &mut Scratch) {
        if piece.is_empty() {
            return;
        }
        if self.merges.is_none() || self.spec.ignore_merges {
            if let Some(&id) = self.ids.get(piece) {
                ids.push(id);
                return;
            }
        }
        if piece.len() <= SCAN_MAX {
            self.merge_by_scan(piece, ids, scratch);
        } else {
            self.merge(piece, ids);
        }
    }

    fn id(&self, bytes: &[u8]) -> Option<u32> {
        self.ids.get(bytes).copied()
    }

    /// The rank of merging adjacent parts of ids `left` and `right` whose concatenation is
    /// `joined`, and the merged id, if they merge: tiktoken, the id of `joined` for both;
    /// GPT-2, the pair's rank and result, looked up by ids without hashing the bytes.
    fn pair(&self, left: u32, right: u32, joined: &[u8]) -> Option<(u32, u32)> {
        match &self.merges {
            None => self.id(joined).map(|id| (id, id)),
            Some(m) => m.get(&pair_key(left, right)).copied(),
        }
    }

    /// [`ByteBpe::merge`] for a short pre-token, as tiktoken writes it: the parts in
    /// arrays, the rank of each adjacent pair beside them, and at each step a scan for
    /// the lowest rank, leftmost on ties. The same pair as the heap's at every step,
    /// without its allocations and stale entries, which cost more than the scan on the
    /// few bytes of a word.
    fn merge_by_scan(&self, piece: &[u8], ids: &mut Vec<u32>, scratch: &mut Scratch) {
        let Scratch {
            starts,
            parts,
            ranks,
        } = scratch;
        starts.clear();
        starts.extend(0..=piece.len());
        parts.clear();
        parts.extend(piece.iter().map(|&b| self.byte_ids[b as usize]));
        // ranks[i]: (rank, merged id) of parts i and i + 1.
        let rank = |parts: &[u32], starts: &[usize], i: usize| {
            self.pair(parts[i], parts[i + 1], &piece[starts[i]..starts[i + 2]])
        };
        ranks.clear();
        ranks.extend((0..parts.len().saturating_sub(1)).map(|i| rank(parts, starts, i)));
        loop {
            let mut best: Option<(u32, usize, u32)> = None;
            for (i, r) in ranks.iter().enumerate() {
                if let Some((rank, merged)) = *r {
                    if best.is_none_or(|(b, _, _)| rank < b) {
                        best = Some((rank, i, merged));
                    }
                }
            }
            let Some((_, i, merged)) = best else {
                break;
            };
            parts[i] = merged;
            parts.remove(i + 1);
            starts.remove(i + 1);
            ranks.remove(i);
            if i < ranks.len() {
                ranks[i] = rank(parts, starts, i);
            }
            if i > 0 {
                ranks[i - 1] = rank(parts, starts, i - 1);
            }
        }
        // A single byte that is not a token (GPT-2 style only, see `new`) is dropped.
        ids.extend(parts.iter().copied().filter(|&id| id != NO_ID));
    }

    /// Of the current parts (single bytes at first), merge the adjacent pair of lowest
    /// rank, the leftmost on ties, until no pair merges; then emit each part's id
    /// (tiktoken's `byte_pair_merge`, `tokenizers`' `Word::merge_all`).
    ///
    /// tiktoken rescans every pair after each merge (quadratic in the pre-token's
    /// length); this keeps the candidate pairs in a min-heap ordered by (rank, position)
    /// and drops entries made stale by a merge when they surface, which picks the same
    /// pair at every step in O(n log n) (compared with the rescan on random inputs in the
    /// tests below).
    fn merge(&self, piece: &[u8], ids: &mut Vec<u32>) {
        let n = piece.len();
        // Parts are linked by their start offsets: next[i] is where the part at i ends.
        let mut next: Vec<usize> = (1..=n).collect();
        // prev[i] is where the part before the one at i starts (unused for i = 0).
        let mut prev: Vec<usize> = (0..n).map(|i| i.saturating_sub(1)).collect();
        // part[i] is the id of the part at i (NO_ID for a byte that is no token).
        let mut part: Vec<u32> = piece.iter().map(|&b| self.byte_ids[b as usize]).collect();
        let mut alive = vec![true; n];
        let mut heap = BinaryHeap::new();
        // A candidate: the part at `i`, ending at `j`, with its right neighbour ending at
        // `end`, and the id they merge into. A part only grows, so (i, end) with the same
        // `j` still between them identifies the same pair when it surfaces.
        let push = |heap: &mut BinaryHeap<Reverse<(u32, usize, usize, u32)>>,
                    part: &[u32],
                    i: usize,
                    j: usize,
                    end: usize| {
            if let Some((rank, merged)) = self.pair(part[i], part[j], &piece[i..end]) {
                heap.push(Reverse((rank, i, end, merged)));
            }
        };
        for i in 0..n.saturating_sub(1) {
            push(&mut heap, &part, i, i + 1, i + 2);
        }
        while let Some(Reverse((_, i, end, merged))) = heap.pop() {
            let j = next[i];
            if !alive[i] || j >= n || next[j] != end {
                continue;
            }
            alive[j] = false;
            next[i] = end;
            part[i] = merged;
            if end < n {
                prev[end] = i;
                push(&mut heap, &part, i, end, next[end]);
            }
            if i > 0 {
                push(&mut heap, &part, prev[i], i, end);
            }
        }
        let mut i = 0;
        while i < n {
            // A single byte that is not a token (GPT-2 style only, see `new`) is dropped.
            if part[i] != NO_ID {
                ids.push(part[i]);
            }
            i = next[i];
        }
    }
}

/// The longest pre-token merged by [`ByteBpe::merge_by_scan`]: past it, the scan's
/// quadratic steps cost more than the heap's.
const SCAN_MAX: usize = 32;

/// The buffers of [`ByteBpe::merge_by_scan`], kept for the whole text of one encode call.
#[derive(Default)]
struct Scratch {
    /// The start offset of each part, and the pre-token's length last.
    starts: Vec<usize>,
    /// The id of each part ([`NO_ID`] for a byte that is no token).
    parts: Vec<u32>,
    /// The rank and merged id of each adjacent pair that merges.
    ranks: Vec<Option<(u32, u32)>>,
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;

    /// tiktoken's `byte_pair_merge` as written there: rescan every pair after each merge.
    fn rescan(bpe: &ByteBpe, piece: &[u8]) -> Vec<u32> {
        let mut bounds: Vec<usize> = (0..=piece.len()).collect();
        let id = |a: usize, b: usize| bpe.id(&piece[a..b]).unwrap();
        while let Some((_, i)) = (0..bounds.len().saturating_sub(2))
            .filter_map(|i| {
                let (a, b, c) = (bounds[i], bounds[i + 1], bounds[i + 2]);
                let (rank, _) = bpe.pair(id(a, b), id(b, c), &piece[a..c])?;
                Some((rank, i))
            })
            .min()
        {
            bounds.remove(i + 1);
        }
        bounds
            .windows(2)
            .map(|w| bpe.id(&piece[w[0]..w[1]]).unwrap())
            .collect()
    }

    fn normal(tokens: Vec<Vec<u8>>) -> Vec<VocabEntry> {
        tokens
            .into_iter()
            .map(|t| VocabEntry {
                bytes: t.into(),
                score: 0.0,
                kind: PieceKind::Normal,
            })
            .collect()
    }

    fn spec(pattern: &str, merges: Option<Vec<[u32; 2]>>) -> ByteLevelBpeSpec {
        ByteLevelBpeSpec {
            pattern: pattern.into(),
            pre_split: Vec::new(),
            merges,
            ignore_merges: false,
            nfc: false,
            added_tokens: Vec::new(),
        }
    }

    fn check_against_rescan(bpe: &ByteBpe, rng: &mut rand::rngs::StdRng) {
        for _ in 0..2000 {
            let len = rng.random_range(0..40);
            let piece: Vec<u8> = (0..len).map(|_| b"abcd"[rng.random_range(0..4)]).collect();
            let (mut ids, mut scanned) = (Vec::new(), Vec::new());
            bpe.merge(&piece, &mut ids);
            bpe.merge_by_scan(&piece, &mut scanned, &mut Scratch::default());
            let text = String::from_utf8_lossy(&piece);
            assert_eq!(ids, rescan(bpe, &piece), "{text:?}");
            assert_eq!(scanned, ids, "{text:?}");
        }
    }

    #[test]
    fn heap_merge_equals_the_rescan_on_random_pieces() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        // The 256 bytes, then random tokens over a 4-letter alphabet (overlapping,
        // repeated letters and ranks out of length order included).
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        while tokens.len() < 256 + 60 {
            let len = rng.random_range(2..6);
            let t: Vec<u8> = (0..len).map(|_| b"abcd"[rng.random_range(0..4)]).collect();
            if !tokens.contains(&t) {
                tokens.push(t);
            }
        }
        let bpe = ByteBpe::new(&normal(tokens), spec(".+", None)).unwrap();
        check_against_rescan(&bpe, &mut rng);
    }

    #[test]
    fn heap_merge_by_pair_rank_equals_the_rescan() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        // GPT-2 style: each merge joins two existing tokens; ranks are then shuffled, so
        // a token may also be the concatenation of a pair that is not a merge.
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        let letters: Vec<u32> = b"abcd".iter().map(|&b| b as u32).collect();
        let mut usable = letters.clone();
        let mut merges = Vec::new();
        while merges.len() < 80 {
            let l = usable[rng.random_range(0..usable.len())];
            let r = usable[rng.random_range(0..usable.len())];
            let joined = [&tokens[l as usize][..], &tokens[r as usize][..]].concat();
            if joined.len() > 6 || merges.contains(&[l, r]) {
                continue;
            }
            if !tokens.contains(&joined) {
                tokens.push(joined);
                usable.push(tokens.len() as u32 - 1);
            }
            merges.push([l, r]);
        }
        for i in (1..merges.len()).rev() {
            merges.swap(i, rng.random_range(0..=i));
        }
        let bpe = ByteBpe::new(&normal(tokens), spec(".+", Some(merges))).unwrap();
        check_against_rescan(&bpe, &mut rng);
    }

    #[test]
    fn long_pre_tokens_are_not_quadratic() {
        let pieces = normal((0..=255u8).map(|b| vec![b]).collect());
        let bpe = ByteBpe::new(&pieces, spec(crate::gpt2::LLAMA3_PATTERN, None)).unwrap();
        for text in ["x".repeat(200_000), format!("a{}b", " ".repeat(200_000))] {
            let mut ids = Vec::new();
            bpe.encode(&text, &mut ids).unwrap();
            assert_eq!(ids.len(), text.len());
        }
    }

    #[test]
    fn text_between_matches_is_a_pre_token() {
        let pieces = normal((0..=255u8).map(|b| vec![b]).collect());
        let bpe = ByteBpe::new(&pieces, spec("b", None)).unwrap();
        let mut ids = Vec::new();
        bpe.encode("abc", &mut ids).unwrap();
        assert_eq!(ids, [b'a' as u32, b'b' as u32, b'c' as u32]);
    }
}
