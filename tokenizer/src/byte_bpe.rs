//! Byte-level BPE in the style of OpenAI's `tiktoken` (`CoreBPE` in its `src/lib.rs`), as
//! GLM-4 uses it: the text is cut into pre-tokens by a regex (fancy-regex, which has the
//! lookahead `\s+(?!\S)` these patterns need), and each pre-token's UTF-8 bytes are merged
//! pairwise, always the adjacent pair whose concatenation has the lowest rank, until no
//! concatenation is in the vocabulary. A token's rank is its id.
//!
//! The vocabulary file is tiktoken's `.tiktoken` format (GLM-4's `tokenizer.model`): one
//! line per token, `BASE64 RANK`, read as `tiktoken.load.load_tiktoken_bpe` reads it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use base64::Engine;
use fancy_regex::Regex;

use crate::vocab::{Piece, PieceKind};
use crate::{Error, Result};

/// A byte-level BPE model ready to encode.
#[derive(Debug)]
pub(crate) struct ByteBpe {
    /// Token bytes to rank (= id), the NORMAL pieces only.
    ranks: HashMap<Box<[u8]>, u32>,
    /// The pre-tokeniser.
    regex: Regex,
    /// Its source, for [`crate::Tokenizer::spec`].
    pub(crate) pattern: String,
}

impl ByteBpe {
    /// Builds the rank table from the NORMAL pieces (rank = id) and compiles `pattern`.
    ///
    /// Errors: [`Error::Invalid`] for a pattern that does not compile, a piece of another
    /// kind than NORMAL or CONTROL, a token listed twice, or a missing single byte (every
    /// byte must be a token, so that any text encodes).
    pub(crate) fn new(pieces: &[Piece], pattern: &str) -> Result<ByteBpe> {
        let regex = Regex::new(pattern)
            .map_err(|e| Error::Invalid(format!("byte-level BPE pattern {pattern:?}: {e}")))?;
        let mut ranks = HashMap::with_capacity(pieces.len());
        for (id, p) in (0u32..).zip(pieces) {
            match p.kind {
                PieceKind::Normal => {
                    if ranks.insert(p.bytes.clone(), id).is_some() {
                        return Err(Error::Invalid(format!(
                            "byte-level BPE token {:?} is listed twice",
                            String::from_utf8_lossy(&p.bytes)
                        )));
                    }
                }
                PieceKind::Control => {}
                other => {
                    return Err(Error::Invalid(format!(
                        "byte-level BPE piece {id} is of kind {other:?} (only normal tokens \
                         and special tokens exist there)"
                    )))
                }
            }
        }
        if let Some(b) = (0..=255u8).find(|b| !ranks.contains_key(&[*b][..])) {
            return Err(Error::Invalid(format!(
                "byte-level BPE vocabulary lacks the single byte 0x{b:02X}"
            )));
        }
        Ok(ByteBpe {
            ranks,
            regex,
            pattern: pattern.to_owned(),
        })
    }

    /// Appends the ids of `text` (tiktoken's `encode_ordinary`: special tokens written in
    /// the text are ordinary text). Errors only if the regex engine gives up (fancy-regex's
    /// backtracking limit).
    pub(crate) fn encode(&self, text: &str, ids: &mut Vec<u32>) -> Result<()> {
        for m in self.regex.find_iter(text) {
            let m = m.map_err(|e| Error::Invalid(format!("pre-tokenising the text: {e}")))?;
            let piece = m.as_str().as_bytes();
            match self.ranks.get(piece) {
                Some(&id) => ids.push(id),
                None => self.merge(piece, ids),
            }
        }
        Ok(())
    }

    fn rank(&self, bytes: &[u8]) -> Option<u32> {
        self.ranks.get(bytes).copied()
    }

    /// tiktoken's `byte_pair_merge`: of the current parts (single bytes at first), merge
    /// the adjacent pair whose concatenation has the lowest rank, the leftmost on ties,
    /// until no concatenation is a token; then emit each part's id.
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
        let mut alive = vec![true; n];
        let mut heap = BinaryHeap::new();
        // A candidate: the part at `i` with its right neighbour, ending at `end`.
        let push = |heap: &mut BinaryHeap<Reverse<(u32, usize, usize)>>, i: usize, end: usize| {
            if let Some(rank) = self.rank(&piece[i..end]) {
                heap.push(Reverse((rank, i, end)));
            }
        };
        for i in 0..n.saturating_sub(1) {
            push(&mut heap, i, i + 2);
        }
        while let Some(Reverse((_, i, end))) = heap.pop() {
            let j = next[i];
            if !alive[i] || j >= n || next[j] != end {
                continue;
            }
            alive[j] = false;
            next[i] = end;
            if end < n {
                prev[end] = i;
                push(&mut heap, i, next[end]);
            }
            if i > 0 {
                push(&mut heap, prev[i], end);
            }
        }
        let mut i = 0;
        while i < n {
            // Every single byte is a token (checked in `new`), and merged parts are
            // tokens by construction.
            ids.extend(self.rank(&piece[i..next[i]]));
            i = next[i];
        }
    }
}

/// Parses a `.tiktoken` ranks file into pieces indexed by rank.
///
/// Errors: [`Error::NotATokenizer`] for a line that is not `BASE64 RANK`, and
/// [`Error::Invalid`] when the ranks are not exactly `0..n` (each once), which flm needs
/// because ranks are ids.
pub(crate) fn parse_ranks(text: &[u8]) -> Result<Vec<Piece>> {
    let mut ranked: Vec<(usize, Vec<u8>)> = Vec::new();
    for (n, line) in text.split(|&b| b == b'\n').enumerate() {
        let line = line.trim_ascii();
        if line.is_empty() {
            continue;
        }
        let bad = || {
            Error::NotATokenizer(format!(
                "tiktoken ranks: line {} is not `BASE64 RANK`",
                n + 1
            ))
        };
        let mut fields = line
            .split(|b| b.is_ascii_whitespace())
            .filter(|f| !f.is_empty());
        let (Some(token), Some(rank), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(bad());
        };
        let token = base64::engine::general_purpose::STANDARD
            .decode(token)
            .map_err(|_| bad())?;
        let rank: usize = std::str::from_utf8(rank)
            .ok()
            .and_then(|r| r.parse().ok())
            .ok_or_else(bad)?;
        ranked.push((rank, token));
    }
    if ranked.is_empty() {
        return Err(Error::NotATokenizer("tiktoken ranks: no tokens".into()));
    }
    // Ranks are ids: they must be 0..n, each once (checked without allocating by rank,
    // so a huge rank in a damaged file costs nothing).
    ranked.sort_unstable_by_key(|(rank, _)| *rank);
    let mut pieces = Vec::with_capacity(ranked.len());
    for (expected, (rank, token)) in ranked.into_iter().enumerate() {
        if rank != expected {
            return Err(Error::Invalid(if rank < expected {
                format!("tiktoken rank {rank} is given twice")
            } else {
                format!("tiktoken ranks skip rank {expected}")
            }));
        }
        pieces.push(Piece {
            bytes: token.into(),
            score: 0.0,
            kind: PieceKind::Normal,
        });
    }
    Ok(pieces)
}

/// Whether `bytes` start like a `.tiktoken` ranks file: a first line of base64 characters,
/// one space and digits.
pub(crate) fn looks_like_ranks(bytes: &[u8]) -> bool {
    let line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Some(space) = line.iter().position(|&b| b == b' ') else {
        return false;
    };
    let (token, rank) = (&line[..space], &line[space + 1..]);
    !token.is_empty()
        && token
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
        && !rank.is_empty()
        && rank.iter().all(u8::is_ascii_digit)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// tiktoken's `byte_pair_merge` as written there: rescan every pair after each merge.
    fn rescan(bpe: &ByteBpe, piece: &[u8]) -> Vec<u32> {
        let mut bounds: Vec<usize> = (0..=piece.len()).collect();
        while let Some((_, i)) = (0..bounds.len().saturating_sub(2))
            .filter_map(|i| Some((bpe.rank(&piece[bounds[i]..bounds[i + 2]])?, i)))
            .min()
        {
            bounds.remove(i + 1);
        }
        bounds
            .windows(2)
            .map(|w| bpe.rank(&piece[w[0]..w[1]]).unwrap())
            .collect()
    }

    #[test]
    fn heap_merge_equals_the_rescan_on_random_pieces() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        // The 256 bytes, then random merges over a 4-letter alphabet (overlapping,
        // repeated letters and ranks out of length order included).
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        while tokens.len() < 256 + 60 {
            let len = rng.random_range(2..6);
            let t: Vec<u8> = (0..len).map(|_| b"abcd"[rng.random_range(0..4)]).collect();
            if !tokens.contains(&t) {
                tokens.push(t);
            }
        }
        let pieces: Vec<Piece> = tokens
            .into_iter()
            .map(|t| Piece {
                bytes: t.into(),
                score: 0.0,
                kind: PieceKind::Normal,
            })
            .collect();
        let bpe = ByteBpe::new(&pieces, ".+").unwrap();
        for _ in 0..2000 {
            let len = rng.random_range(0..40);
            let piece: Vec<u8> = (0..len).map(|_| b"abcd"[rng.random_range(0..4)]).collect();
            let mut ids = Vec::new();
            bpe.merge(&piece, &mut ids);
            assert_eq!(
                ids,
                rescan(&bpe, &piece),
                "{:?}",
                String::from_utf8_lossy(&piece)
            );
        }
    }

    #[test]
    fn long_pre_tokens_are_not_quadratic() {
        let pieces: Vec<Piece> = (0..=255u8)
            .map(|b| Piece {
                bytes: vec![b].into(),
                score: 0.0,
                kind: PieceKind::Normal,
            })
            .collect();
        let bpe = ByteBpe::new(&pieces, crate::chatglm::GLM4_PATTERN).unwrap();
        for text in ["x".repeat(200_000), format!("a{}b", " ".repeat(200_000))] {
            let mut ids = Vec::new();
            bpe.encode(&text, &mut ids).unwrap();
            assert_eq!(ids.len(), text.len());
        }
    }
}
