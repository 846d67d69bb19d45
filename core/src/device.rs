//! The device interface.

use crate::{CheckedOp, Op, Result};

/// A compute device (FastLLM's `BaseDevice`): it says which ops it can run and runs them.
///
/// Devices are held by the [`crate::Executor`] in priority order. `supports` must be cheap
/// (it is asked once per op per step) and must only return true when `run` can handle the
/// op's dtypes and storage locations. `run` takes a [`CheckedOp`], so the shape and range
/// rules of [`Op::validate`] hold and are not checked again.
pub trait BaseDevice: Send + Sync {
    /// Short name for logs and the profiler ("cpu", "cuda").
    fn name(&self) -> &'static str;
    /// Whether this device can run `op` as given (dtypes, storage location).
    fn supports(&self, op: &Op<'_>) -> bool;
    /// Runs `op`, writing its output operand.
    fn run(&self, op: CheckedOp<'_>) -> Result<()>;
    /// Makes every later op batch-invariant: a row of an op's output gets the same bits
    /// whatever the other rows run with it, its position among them and the thread split
    /// (Thinking Machines Lab, "Defeating Nondeterminism in LLM Inference", 2025). The
    /// continuous-batching engine and speculative decoding need this so that a sequence's
    /// tokens do not depend on the batch. A device whose kernels are always invariant does
    /// nothing; one that gives up speed for it (the CPU's AMX decode) switches for good.
    fn require_batch_invariance(&self);
}
