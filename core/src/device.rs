//! The device interface.

use crate::{Op, Result};

/// A compute device (FastLLM's `BaseDevice`): it says which ops it can run and runs them.
///
/// Devices are held by the [`crate::Executor`] in priority order. `supports` must be cheap
/// (it is asked once per op per step) and must only return true when `run` can handle the
/// op's dtypes and storage locations; `run` still validates shapes and returns an error
/// rather than panicking on bad operands.
pub trait BaseDevice: Send + Sync {
    /// Short name for logs and the profiler ("cpu", "cuda").
    fn name(&self) -> &'static str;
    /// Whether this device can run `op` as given (dtypes, storage location).
    fn supports(&self, op: &Op<'_>) -> bool;
    /// Runs `op`, writing its output operand.
    fn run(&self, op: Op<'_>) -> Result<()>;
}
