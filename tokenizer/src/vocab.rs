//! Vocabulary entries shared by every file format.

/// What a piece is, following SentencePiece's `ModelProto.SentencePiece.Type`
/// (sentencepiece_model.proto). The readers of llama2.c and Hugging Face files map their
/// tokens onto the same kinds, so encoding and decoding treat all formats alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PieceKind {
    /// An ordinary piece: a merge target, decoded as its text.
    Normal,
    /// The unknown piece (`<unk>`); decoded as the unknown surface (" ⁇ ").
    Unknown,
    /// A control symbol (`<s>`, `</s>`, HF special tokens): decoded as nothing.
    Control,
    /// A user-defined symbol: matched whole in the input, never split or merged.
    UserDefined,
    /// An unused piece: a merge target that is split back into its parts
    /// (bpe_model.cc resegmentation).
    Unused,
    /// A byte-fallback piece `<0xHH>` standing for this raw byte.
    Byte(u8),
}

impl PieceKind {
    /// Pieces SentencePiece keeps in `pieces_` (model_interface.cc): the only ones BPE
    /// merges can produce. All others live in `reserved_id_map_`.
    pub(crate) fn is_merge_target(self) -> bool {
        matches!(
            self,
            PieceKind::Normal | PieceKind::UserDefined | PieceKind::Unused
        )
    }
}

/// One vocabulary entry.
#[derive(Debug, Clone)]
pub(crate) struct VocabEntry {
    /// The piece as SentencePiece writes it: "▁" (U+2581) stands for a space.
    pub(crate) bytes: Box<[u8]>,
    /// Merge priority for SentencePiece BPE: higher merges first.
    pub(crate) score: f32,
    pub(crate) kind: PieceKind,
}

/// Parses a byte-fallback piece name, exactly `<0xHH>` with upper-case hex digits, as
/// sentencepiece's `PieceToByte` (model_interface.cc) accepts it.
pub(crate) fn parse_byte_piece(piece: &[u8]) -> Option<u8> {
    let hex = piece.strip_prefix(b"<0x")?.strip_suffix(b">")?;
    if hex.len() != 2 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    Some(digit(hex[0])? * 16 + digit(hex[1])?)
}

/// The byte-fallback piece name for `b`, as sentencepiece's `ByteToPiece` writes it.
pub(crate) fn byte_piece(b: u8) -> String {
    format!("<0x{b:02X}>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_pieces_round_trip() {
        for b in 0..=255u8 {
            assert_eq!(parse_byte_piece(byte_piece(b).as_bytes()), Some(b));
        }
        assert_eq!(parse_byte_piece(b"<0x0a>"), None);
        assert_eq!(parse_byte_piece(b"<0x0>"), None);
        assert_eq!(parse_byte_piece(b"<0x0AB>"), None);
        assert_eq!(parse_byte_piece(b"0x0A"), None);
    }
}
