//! OpenAI's `.tiktoken` ranks files (GLM-4's `tokenizer.model`): one line per token,
//! `BASE64 RANK`, read as `tiktoken.load.load_tiktoken_bpe` reads them.

use base64::Engine;

use crate::vocab::{PieceKind, VocabEntry};
use crate::{Error, Result};

/// Parses a `.tiktoken` ranks file into pieces indexed by rank.
///
/// Errors: [`Error::NotATokenizer`] for a line that is not `BASE64 RANK`, and
/// [`Error::Invalid`] when the ranks are not exactly `0..n` (each once), which flm needs
/// because ranks are ids.
pub(crate) fn parse_ranks(text: &[u8]) -> Result<Vec<VocabEntry>> {
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
        pieces.push(VocabEntry {
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
