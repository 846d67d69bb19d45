//! A decode step captured once on a device and replayed ([`StepGraph`]): a CUDA graph on
//! the GPU (its launches recorded once, then launched as one unit), so that a step costs
//! one launch instead of one per op.
//!
//! A captured step is a fixed sequence of kernels over buffers whose addresses do not
//! change. What changes from one step to the next (the token ids, their positions and the
//! KV cache row they are stored at) is a [`StepInputs`]: the device keeps it in a small
//! buffer of its own memory, written by one upload before each replay, and the ops that
//! read it are the ones the model ran through [`crate::Executor::run_step`]
//! ([`crate::CheckedOp::follows_step`]). Inside a capture the device refuses, with an
//! error, anything that would bake in a value of this step or wait for the host: an op
//! with positions that does not follow the step, operands in host memory, a copy between
//! memories, an op on another device.
//!
//! Sampling on the device slots in after the logits: an op whose state (its RNG, the
//! previous ids) is in device memory and that writes the sampled ids to a device buffer
//! can be run inside the capture too, and only the ids then cross to the host after the
//! replay.

use std::any::Any;

use crate::{Error, Location, Result};

/// The values of one decode step that a replay of a captured step reads from device
/// memory: the step's token ids (one row each), the RoPE position of row 0 (row `i` is at
/// `start_pos + i`) and the KV cache row of row 0 (`start_pos` plus any prefix rows kept
/// before the sequence, such as a p-tuning prefix).
#[derive(Debug, Clone, Copy)]
pub struct StepInputs<'a> {
    /// One token id per row; their count is the step's batch size.
    pub tokens: &'a [u32],
    /// The RoPE position of row 0.
    pub start_pos: usize,
    /// The KV cache row that row 0's key and value are stored at, and that its attention
    /// reads up to.
    pub cache_row: usize,
}

impl StepInputs<'_> {
    /// The rows of the step (its batch size).
    pub fn batch(&self) -> usize {
        self.tokens.len()
    }

    /// The values as the `u32` words a device keeps them in: the token ids, the RoPE
    /// position of each row, then the KV cache row of row 0.
    ///
    /// Errors: [`Error::InvalidArgument`] for no tokens, or a position or row past `u32`.
    pub fn words(&self) -> Result<Vec<u32>> {
        if self.tokens.is_empty() {
            return Err(Error::InvalidArgument("a step of no tokens".into()));
        }
        let word = |v: usize| {
            u32::try_from(v).map_err(|_| Error::InvalidArgument(format!("step position {v}")))
        };
        let mut words = self.tokens.to_vec();
        for i in 0..self.tokens.len() {
            words.push(word(self.start_pos + i)?);
        }
        words.push(word(self.cache_row)?);
        Ok(words)
    }
}

/// What the ops of a captured step can take, so that a replay's inputs are checked on the
/// host as [`crate::Op::validate`] checks an op's (the replayed ops are not validated
/// again): the smallest embedding table, RoPE table and KV cache the captured ops use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBounds {
    /// Token ids are below this.
    pub vocab: usize,
    /// Positions are below this.
    pub positions: usize,
    /// KV cache rows are below this.
    pub cache_rows: usize,
}

impl StepBounds {
    /// No bound yet: a capture starts from it and lowers each bound to its ops'.
    pub const NONE: StepBounds = StepBounds {
        vocab: usize::MAX,
        positions: usize::MAX,
        cache_rows: usize::MAX,
    };

    /// Whether `step` fits: every id below `vocab`, its last row's position below
    /// `positions` and that row's cache row below `cache_rows`.
    ///
    /// Errors: [`Error::TokenOutOfRange`], [`Error::ContextOverflow`].
    pub fn check(&self, step: &StepInputs<'_>) -> Result<()> {
        if let Some(&id) = step.tokens.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(Error::TokenOutOfRange {
                id,
                vocab_size: self.vocab,
            });
        }
        for (end, max) in [
            (step.start_pos.saturating_add(step.batch()), self.positions),
            (step.cache_row.saturating_add(step.batch()), self.cache_rows),
        ] {
            if end > max {
                return Err(Error::ContextOverflow { needed: end, max });
            }
        }
        Ok(())
    }
}

/// A step as a device captured it ([`crate::BaseDevice::end_capture`]); only that device
/// can replay it.
pub trait CapturedStep: Send + Sync {
    /// The capture, for the device that made it to downcast.
    fn as_any(&self) -> &dyn Any;
}

/// A step captured on the device at [`StepGraph::location`] for [`StepGraph::batch`] rows,
/// replayed by [`crate::Executor::replay`].
///
/// It holds the addresses of the buffers the step's ops read and wrote when it was
/// captured: it is valid for as long as those tensors (weights, KV cache, activations) are
/// neither reallocated nor dropped, which the model that captured it guarantees by
/// dropping it with them.
pub struct StepGraph {
    location: Location,
    batch: usize,
    captured: Box<dyn CapturedStep>,
}

impl StepGraph {
    pub(crate) fn new(location: Location, batch: usize, captured: Box<dyn CapturedStep>) -> Self {
        StepGraph {
            location,
            batch,
            captured,
        }
    }

    /// The memory whose device captured it.
    pub fn location(&self) -> Location {
        self.location
    }

    /// The rows of every step it runs.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The device's capture.
    pub(crate) fn captured(&self) -> &dyn CapturedStep {
        &*self.captured
    }
}

impl std::fmt::Debug for StepGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StepGraph({} rows on {})", self.batch, self.location)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_tokens_then_positions_then_the_cache_row() {
        let step = StepInputs {
            tokens: &[7, 9, 11],
            start_pos: 4,
            cache_row: 6,
        };
        assert_eq!(step.batch(), 3);
        assert_eq!(step.words().unwrap(), [7, 9, 11, 4, 5, 6, 6]);
        let empty = StepInputs {
            tokens: &[],
            start_pos: 0,
            cache_row: 0,
        };
        assert!(matches!(empty.words(), Err(Error::InvalidArgument(_))));
        let far = StepInputs {
            tokens: &[1],
            start_pos: u32::MAX as usize + 1,
            cache_row: 0,
        };
        assert!(matches!(far.words(), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn a_replay_fits_the_bounds_of_the_captured_ops() {
        let bounds = StepBounds {
            vocab: 10,
            positions: 8,
            cache_rows: 12,
        };
        let step = |tokens: &'static [u32], start_pos, cache_row| StepInputs {
            tokens,
            start_pos,
            cache_row,
        };
        assert!(bounds.check(&step(&[9, 0], 6, 10)).is_ok());
        assert!(matches!(
            bounds.check(&step(&[3, 10], 0, 0)),
            Err(Error::TokenOutOfRange {
                id: 10,
                vocab_size: 10
            })
        ));
        assert!(matches!(
            bounds.check(&step(&[1, 2], 7, 0)),
            Err(Error::ContextOverflow { needed: 9, max: 8 })
        ));
        assert!(matches!(
            bounds.check(&step(&[1], 0, 12)),
            Err(Error::ContextOverflow {
                needed: 13,
                max: 12
            })
        ));
        assert!(StepBounds::NONE
            .check(&step(&[u32::MAX], 1 << 40, 1 << 40))
            .is_ok());
    }
}
