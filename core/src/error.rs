//! The one error type of flm-core.

/// Errors raised by flm-core and by the devices that run its ops.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Two tensors of an op disagree on their shapes, or a shape is invalid.
    #[error("shape error in {op}: {msg}")]
    Shape {
        /// The op or constructor that found the problem.
        op: &'static str,
        /// What disagrees.
        msg: String,
    },
    /// A tensor has a dtype the op (or accessor) cannot handle.
    #[error("dtype error in {op}: {msg}")]
    DType {
        /// The op or accessor that found the problem.
        op: &'static str,
        /// What was expected and what was found.
        msg: String,
    },
    /// A byte range does not fit in the buffer it is supposed to be read from.
    #[error("out of bounds: {0}")]
    OutOfBounds(String),
    /// A token id is not in the vocabulary.
    #[error("token id {id} is out of range for a vocabulary of {vocab_size}")]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// More positions were asked for than the KV cache holds.
    #[error("context length exceeded: {needed} positions needed, the context holds {max}")]
    ContextOverflow {
        /// Positions the request needs.
        needed: usize,
        /// The context length (KV cache capacity).
        max: usize,
    },
    /// No device of the executor supports this op with these dtypes.
    #[error("no device supports op {0}")]
    Unsupported(String),
    /// A read-only tensor was written to: one borrowed from a mapped file, or a device
    /// buffer shared with a clone.
    #[error(
        "tensor is read-only (borrowed from a mapped file, or a device buffer shared with a clone)"
    )]
    ReadOnly,
    /// A tensor is not where it is needed: an op's operands in the memory of two devices,
    /// or the host reading device memory. Copies between devices are never made silently.
    #[error("placement error: {0}")]
    Placement(String),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file is malformed (truncated, corrupted, of a newer version).
    #[error("{}: {msg}", path.display())]
    Format {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// An invalid argument (sampling parameters, sizes).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A device failed: a driver, runtime or compiler call of an accelerator (CUDA) returned
    /// an error, or a kernel reported bad input it was given.
    #[error("device error: {0}")]
    Device(String),
    /// A collective of a tensor-parallel group ([`crate::comm`]) could not complete: a rank
    /// failed or left, or the ranks disagree.
    #[error("rank {rank}: {msg}")]
    Collective {
        /// The rank that failed (or, for a disagreement, the rank that found it).
        rank: usize,
        /// What happened.
        msg: String,
    },
}

/// Result type of flm-core.
pub type Result<T> = std::result::Result<T, Error>;
