//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong while loading a tokenizer file, encoding or decoding.
///
/// Loading never panics: malformed bytes of any kind end up in one of these variants.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file that was being read.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// The bytes are none of the formats this crate reads (SentencePiece `.model`,
    /// llama2.c `tokenizer.bin`, Hugging Face `tokenizer.json`, tiktoken ranks).
    #[error("not a tokenizer file: {0}")]
    NotATokenizer(String),
    /// The bytes start like a tokenizer file of a known format but end too early.
    #[error("truncated {0}")]
    Truncated(String),
    /// The file is of a known format but its content is inconsistent (duplicate pieces,
    /// a missing unknown piece, a merge naming a token that is not in the vocabulary...).
    #[error("invalid tokenizer: {0}")]
    Invalid(String),
    /// The file is well formed but uses a feature this crate does not implement (Unigram
    /// models, precompiled normalisation rules, byte-level BPE...).
    #[error("unsupported tokenizer: {0}")]
    Unsupported(String),
    /// A token id outside the vocabulary was given to the decoder.
    #[error("token id {id} out of range for vocabulary of {vocab_size}")]
    IdOutOfRange {
        /// The offending id.
        id: u32,
        /// The number of tokens in the vocabulary.
        vocab_size: usize,
    },
    /// A chat prompt cannot be built: no template, a role the format does not know, or a
    /// Jinja template that fails to render (or calls `raise_exception`).
    #[error("{0}")]
    Template(String),
    /// A text could not be tokenised: the pre-tokeniser's regex engine gave up on it
    /// (only fancy-regex, which runs the rare patterns outside the linear-time subset of
    /// `split.rs`, has such limits).
    #[error("cannot tokenise the text: {0}")]
    Encode(String),
    /// `encode(.., add_bos = true)` on a tokenizer that has no BOS token.
    #[error("the tokenizer has no BOS token, but one was requested")]
    NoBos,
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
