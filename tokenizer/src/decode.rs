//! Decoding ids to text, whole or streamed, with SentencePiece's semantics
//! (`SentencePieceProcessor::Decode`, sentencepiece_processor.cc):
//!
//! - control pieces (`<s>`, `</s>`, special tokens) decode to nothing, the unknown piece
//!   to the unknown surface (" ⁇ " unless the model sets `unk_surface`);
//! - "▁" becomes a space; the first piece's leading "▁" is dropped when the model adds a
//!   dummy prefix (all of them while nothing has been output, if the model also removes
//!   extra whitespace);
//! - a run of byte pieces `<0xHH>` is decoded as UTF-8 with SentencePiece's rule: each
//!   byte that does not start a valid character becomes one U+FFFD;
//! - byte-level BPE pieces are raw bytes, decoded as UTF-8 with the rule of
//!   `from_utf8_lossy`: each maximal invalid subsequence becomes one U+FFFD.
//!
//! [`Tokenizer::decode`] is a [`StreamDecoder`] fed every id, so the streamed text
//! concatenates to exactly the decoded text. The stream holds back the bytes of a
//! character split over several byte pieces until the character is complete, or until it
//! can no longer become valid.

use crate::sentencepiece::SPACE_SYMBOL;
use crate::vocab::PieceKind;
use crate::{Error, Result, Tokenizer};

/// How a tokenizer turns pieces into text.
#[derive(Debug, Clone)]
pub(crate) struct DecodeOptions {
    /// Drop the "▁" that starts the first piece (add_dummy_prefix or
    /// remove_extra_whitespaces in SentencePiece).
    pub(crate) strip_bos_space: bool,
    /// Keep dropping leading "▁" while nothing has been output (remove_extra_whitespaces).
    pub(crate) strip_all_leading_spaces: bool,
    /// What the unknown piece decodes to.
    pub(crate) unk_surface: Box<[u8]>,
    /// Pieces are raw bytes, possibly parts of a character (byte-level BPE): every
    /// normal piece goes through the pending bytes, and "▁" means nothing special.
    pub(crate) byte_level: bool,
}

/// Incremental decoder returned by [`Tokenizer::stream_decoder`].
///
/// Follows SentencePiece's decoder (sentencepiece_processor.cc `Decode`): feeding ids one
/// at a time yields, concatenated, the same text as decoding them at once.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    /// Bytes of byte pieces that start a character not yet complete.
    pending: Vec<u8>,
    /// SentencePiece's `is_bos_ws`: a leading "▁" may still be dropped.
    is_bos_ws: bool,
    /// SentencePiece's `bos_ws_seen`: the previous piece had its "▁" dropped.
    bos_ws_seen: bool,
    /// Some text has been output.
    has_text: bool,
}

impl<'a> StreamDecoder<'a> {
    pub(crate) fn new(tok: &'a Tokenizer, at_start: bool) -> Self {
        StreamDecoder {
            tok,
            pending: Vec::new(),
            is_bos_ws: at_start,
            bos_ws_seen: false,
            has_text: !at_start,
        }
    }

    /// Feeds one generated id; returns the text that is now complete (possibly empty).
    ///
    /// A UTF-8 character split over several byte-fallback tokens (`<0xE2><0x96><0x81>`)
    /// is emitted whole, once complete; invalid sequences become U+FFFD. `at_start` (see
    /// [`Tokenizer::stream_decoder`]) means the ids before were only BOS, so the
    /// dummy-prefix space of the first piece is dropped (as SentencePiece decode and
    /// llama2.c run.c do).
    pub fn push(&mut self, id: u32) -> Result<String> {
        let pieces = &self.tok.pieces;
        let piece = pieces.get(id as usize).ok_or(Error::IdOutOfRange {
            id,
            vocab_size: pieces.len(),
        })?;
        let mut out = String::new();
        if let PieceKind::Byte(b) = piece.kind {
            self.pending.push(b);
            self.drain(false, &mut out);
        } else if self.tok.decoding.byte_level {
            if piece.kind != PieceKind::Control {
                self.pending.extend_from_slice(&piece.bytes);
                self.drain(false, &mut out);
            }
        } else {
            self.drain(true, &mut out);
            if self.bos_ws_seen || self.has_text || !out.is_empty() {
                self.is_bos_ws = false;
            }
            let opts = &self.tok.decoding;
            let (text, bos_ws_seen) = match piece.kind {
                PieceKind::Control => (Vec::new(), false),
                PieceKind::Unknown => (opts.unk_surface.to_vec(), false),
                _ => {
                    let mut text = &piece.bytes[..];
                    let mut seen = false;
                    if self.is_bos_ws && opts.strip_bos_space {
                        if let Some(rest) = text.strip_prefix(SPACE_SYMBOL) {
                            text = rest;
                            seen = !opts.strip_all_leading_spaces;
                        }
                    }
                    (replace_space_symbol(text), seen)
                }
            };
            self.bos_ws_seen = bos_ws_seen;
            decode_utf8(&text, true, &mut out);
        }
        self.has_text |= !out.is_empty();
        Ok(out)
    }

    /// Flushes what is left (incomplete bytes as U+FFFD, one per byte).
    pub fn finish(&mut self) -> String {
        let mut out = String::new();
        self.drain(true, &mut out);
        self.has_text |= !out.is_empty();
        out
    }

    /// Decodes the pending bytes that form complete (or hopeless) characters.
    fn drain(&mut self, at_end: bool, out: &mut String) {
        let used = if self.tok.decoding.byte_level {
            decode_utf8_lossy(&self.pending, at_end, out)
        } else {
            decode_utf8(&self.pending, at_end, out)
        };
        self.pending.drain(..used);
    }
}

impl Tokenizer {
    /// The bytes token `id` adds in the middle of a text, as [`StreamDecoder`] decodes it
    /// before UTF-8 is checked: a byte piece's byte, a byte-level piece's bytes, a
    /// SentencePiece piece with "▁" as a space, the unknown surface for the unknown piece.
    /// `None` for a control token, a token that adds nothing, or an id outside the
    /// vocabulary. A token may be part of a character only (structured output works on
    /// these bytes, so a character of several tokens can be constrained).
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let piece = self.pieces.get(id as usize)?;
        let bytes = match piece.kind {
            PieceKind::Control => return None,
            PieceKind::Byte(b) => vec![b],
            _ if self.decoding.byte_level => piece.bytes.to_vec(),
            PieceKind::Unknown => self.decoding.unk_surface.to_vec(),
            _ => replace_space_symbol(&piece.bytes),
        };
        (!bytes.is_empty()).then_some(bytes)
    }
}

/// Writes "▁" as a space.
fn replace_space_symbol(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.iter().position(|&b| b == SPACE_SYMBOL[0]) {
        out.extend_from_slice(&rest[..i]);
        if rest[i..].starts_with(SPACE_SYMBOL) {
            out.push(b' ');
            rest = &rest[i + SPACE_SYMBOL.len()..];
        } else {
            out.push(rest[i]);
            rest = &rest[i + 1..];
        }
    }
    out.extend_from_slice(rest);
    out
}

/// Decodes UTF-8 as SentencePiece does (`IsValidDecodeUTF8` in util.h): a byte that does
/// not start a valid character becomes one U+FFFD and decoding resumes at the next byte.
/// Unless `at_end`, an incomplete character that may still become valid is left undecoded.
/// Returns the number of bytes consumed.
pub(crate) fn decode_utf8(bytes: &[u8], at_end: bool, out: &mut String) -> usize {
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        let need = match rest[0] {
            0x00..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => 0,
        };
        if need > 0 && rest.len() >= need {
            if let Ok(s) = std::str::from_utf8(&rest[..need]) {
                out.push_str(s);
                i += need;
                continue;
            }
        } else if need > 0 && !at_end && may_become_valid(rest) {
            break;
        }
        out.push(char::REPLACEMENT_CHARACTER);
        i += 1;
    }
    i
}

/// Decodes UTF-8 as byte-level tokenizers do (`tokenizers`' `ByteLevel` decoder with
/// `String::from_utf8_lossy`, tiktoken with Python's `errors="replace"`): each maximal
/// invalid subsequence (Unicode 3.9, "U+FFFD substitution of maximal subparts") becomes one
/// U+FFFD. Unless `at_end`, an incomplete character that may still become valid is left
/// undecoded. Returns the number of bytes consumed.
fn decode_utf8_lossy(bytes: &[u8], at_end: bool, out: &mut String) -> usize {
    let mut used = 0;
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        used += chunk.valid().len();
        let bad = chunk.invalid();
        if bad.is_empty() {
            continue;
        }
        if !at_end && used + bad.len() == bytes.len() && may_become_valid(bad) {
            break;
        }
        out.push(char::REPLACEMENT_CHARACTER);
        used += bad.len();
    }
    used
}

/// Whether `p`, shorter than the character its first byte announces, is the start of a
/// valid UTF-8 sequence (Unicode table 3-7: no overlong forms, surrogates or code points
/// past U+10FFFF).
fn may_become_valid(p: &[u8]) -> bool {
    let lead = p[0];
    if matches!(lead, 0xc0 | 0xc1 | 0xf5..=0xf7) {
        return false;
    }
    p.iter().enumerate().skip(1).all(|(i, &b)| {
        let range = match (i, lead) {
            (1, 0xe0) => 0xa0..=0xbf,
            (1, 0xed) => 0x80..=0x9f,
            (1, 0xf0) => 0x90..=0xbf,
            (1, 0xf4) => 0x80..=0x8f,
            _ => 0x80..=0xbf,
        };
        range.contains(&b)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sp(bytes: &[u8]) -> String {
        let mut s = String::new();
        assert_eq!(decode_utf8(bytes, true, &mut s), bytes.len());
        s
    }

    #[test]
    fn per_byte_replacement() {
        assert_eq!(sp(b"abc"), "abc");
        assert_eq!(sp("é🦙".as_bytes()), "é🦙");
        // A truncated 3-byte character: one U+FFFD per byte, as SentencePiece does.
        assert_eq!(sp(b"\xe2\x96A"), "\u{fffd}\u{fffd}A");
        assert_eq!(sp(b"\xc0\x80"), "\u{fffd}\u{fffd}");
        assert_eq!(sp(b"\xed\xa0\x80"), "\u{fffd}\u{fffd}\u{fffd}");
        assert_eq!(sp(b"\xff"), "\u{fffd}");
        assert_eq!(sp("\u{fffd}".as_bytes()), "\u{fffd}");
    }

    #[test]
    fn incomplete_characters_wait() {
        let mut s = String::new();
        assert_eq!(decode_utf8(b"a\xf0\x9f\xa6", false, &mut s), 1);
        assert_eq!(s, "a");
        // Hopeless prefixes are replaced at once.
        let mut s = String::new();
        assert_eq!(decode_utf8(b"\xe0\x80", false, &mut s), 2);
        assert_eq!(s, "\u{fffd}\u{fffd}");
        let mut s = String::new();
        assert_eq!(decode_utf8(b"\xf4\x90", false, &mut s), 2);
        assert_eq!(s, "\u{fffd}\u{fffd}");
    }

    #[test]
    fn prefixes_of_valid_characters_are_viable() {
        for c in [
            '\u{80}',
            '\u{800}',
            '\u{d7ff}',
            '\u{e000}',
            '\u{10000}',
            '\u{10ffff}',
        ] {
            let mut buf = [0; 4];
            let b = c.encode_utf8(&mut buf).as_bytes();
            for n in 1..b.len() {
                assert!(may_become_valid(&b[..n]), "{c:?} {n}");
            }
        }
    }

    #[test]
    fn space_symbol() {
        assert_eq!(replace_space_symbol("▁a▁▁b".as_bytes()), b" a  b");
        assert_eq!(replace_space_symbol(b"\xe2\x96"), b"\xe2\x96");
    }
}
