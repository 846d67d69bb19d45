//! The one error type of flm-models.

use std::path::{Path, PathBuf};

/// Errors raised while importing or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error from a tensor op or the run state.
    #[error(transparent)]
    Core(#[from] flm_core::Error),
    /// A file could not be opened, mapped or read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A checkpoint is malformed (truncated, corrupted, inconsistent) or of an unknown kind.
    #[error("{}: {msg}", path.display())]
    Format {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// A configuration is invalid: a missing or inconsistent hyper-parameter of a model,
    /// weights that disagree with it, or an option the model cannot take (a placement, a
    /// budget, a graph that cannot be batched).
    #[error("invalid model configuration: {0}")]
    Config(String),
    /// An operation is invalid in the object's current state, whatever its files and
    /// options: a step out of order (a KV cache not allocated yet, no forward pass run yet,
    /// a ChatGLM-6B sequence not started at position 0), or a change that must come before
    /// any instance of a model is made. A caller's mistake or a bug of flm, never a
    /// malformed file.
    #[error("invalid in the current state: {0}")]
    State(String),
    /// A tokenizer error (a token id outside the vocabulary, an unsupported feature).
    #[error(transparent)]
    Tokenizer(#[from] flm_tokenizer::Error),
    /// A prompt that leaves no position of the context to generate into.
    #[error(
        "the prompt is {tokens} tokens long but the model's context holds {context} tokens \
         (including at least one to generate): shorten the prompt"
    )]
    PromptTooLong {
        /// Tokens of the prompt, BOS included.
        tokens: usize,
        /// Positions of the context.
        context: usize,
    },
    /// A request is invalid (an empty encoded prompt, a context of 0).
    #[error("{0}")]
    InvalidInput(String),
    /// The serving engine's queue is full: try again later.
    #[error("the engine's queue is full ({waiting} requests waiting): try again later")]
    QueueFull {
        /// Requests waiting.
        waiting: usize,
    },
    /// The serving engine's scheduler thread has stopped.
    #[error("the engine has stopped")]
    EngineStopped,
}

/// Result type of flm-models.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn format(path: impl Into<PathBuf>, msg: impl Into<String>) -> Error {
        Error::Format {
            path: path.into(),
            msg: msg.into(),
        }
    }

    /// This error, raised while reading the checkpoint at `path`, as the file's fault: an
    /// error of flm-core there (a tensor whose shape or dtype does not fit the model, a
    /// byte range past the end) means the file is malformed ([`Error::Format`]), and
    /// flm-core's I/O and format errors become this crate's.
    pub(crate) fn in_file(self, path: &Path) -> Error {
        match self {
            Error::Core(flm_core::Error::Io { path, source }) => Error::Io { path, source },
            Error::Core(flm_core::Error::Format { path, msg }) => Error::Format { path, msg },
            Error::Core(e) => Error::format(path, e.to_string()),
            e => e,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
