//! A decode step as a CUDA graph on [`CudaDevice`] ([`flm_core::StepGraph`]): the step's
//! launches are recorded once by stream capture (`cuStreamBeginCapture`, thread-local
//! mode) and replayed with `cuGraphLaunch`, so that a step costs one launch instead of
//! one per op (as llama.cpp's CUDA backend and vLLM do for decode).
//!
//! The step's inputs ([`StepInputs::words`]: token ids, RoPE positions, KV cache row) live
//! in one buffer of `u32` words that the ops following the step read
//! ([`flm_core::CheckedOp::follows_step`]): the embedding reads its ids there, RoPE its
//! positions (from a copy of the whole table on the GPU), the KV cache writes
//! (`copy_rows_at`) and attention their row; attention's grid covers the whole cache, its
//! chunks past the current position exiting at once. A replay checks the inputs on the host
//! against the bounds the captured ops recorded ([`StepBounds`]), writes the buffer with one
//! upload and launches the graph.
//!
//! Inside a capture nothing may wait for the host or bake in a value of this step: host
//! uploads and downloads, operands in host memory, and an op with positions that does not
//! follow the step are errors that end the capture (and name `--cuda-graph off`). Memory the
//! ops allocate for themselves comes from `cuMemAllocAsync`, which a capture records as
//! graph allocations; devices without stream-ordered allocation cannot capture.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice, CudaView};
use flm_core::{CapturedStep, Error, Result, StepBounds, StepInputs};

use super::device::CudaDevice;
use super::launch::dev_err;

/// The workaround every capture error names.
const WORKAROUND: &str = "run with --cuda-graph off to decode without CUDA graphs";

/// The step's inputs in GPU memory while a capture is under way.
pub(super) struct Capture {
    /// [`StepInputs::words`]: `batch` ids, `batch` positions, the cache row.
    words: Arc<CudaSlice<u32>>,
    tokens: Vec<u32>,
    start_pos: usize,
    cache_row: usize,
    bounds: StepBounds,
}

/// The step's inputs as an op that follows the step reads them in a capture.
pub(super) struct StepWords {
    words: Arc<CudaSlice<u32>>,
    batch: usize,
}

impl StepWords {
    /// The token ids, `[batch]`.
    pub fn tokens(&self) -> CudaView<'_, u32> {
        self.words.slice(..self.batch)
    }

    /// The RoPE position of each row, `[batch]`.
    pub fn positions(&self) -> CudaView<'_, u32> {
        self.words.slice(self.batch..2 * self.batch)
    }

    /// The KV cache row of row 0, `[1]`.
    pub fn cache_row(&self) -> CudaView<'_, u32> {
        self.words.slice(2 * self.batch..2 * self.batch + 1)
    }
}

/// `u32` words an op reads from device memory: the step's (in a capture) or its own.
pub(super) enum Words<'a> {
    /// A view of the step's buffer.
    Step(CudaView<'a, u32>),
    /// The op's own values, uploaded for it.
    Own(CudaSlice<u32>),
}

impl Words<'_> {
    /// The words, to pass to a kernel.
    pub fn view(&self) -> CudaView<'_, u32> {
        match self {
            Words::Step(v) => v.slice(..),
            Words::Own(s) => s.slice(..),
        }
    }
}

/// One bound an op of the step records ([`StepBounds`]).
pub(super) enum Bound {
    Vocab(usize),
    Positions(usize),
    CacheRows(usize),
}

/// A captured step: the instantiated graph and the buffer of its inputs.
struct Graph {
    graph: CudaGraph,
    words: Arc<CudaSlice<u32>>,
}

/// [`CapturedStep`] of [`CudaDevice`].
pub(super) struct CudaStep {
    graph: Mutex<Graph>,
    batch: usize,
    bounds: StepBounds,
    /// The [`CudaDevice::instance`] that captured it.
    device: u64,
}

// SAFETY: the graph's handles are only used under the mutex (CUDA graphs must not be used
// from two threads at once), and the device buffer and stream they refer to are owned by
// the value and its CudaDevice, which outlive it.
unsafe impl Send for CudaStep {}
// SAFETY: as for Send: every use of the handles goes through the mutex.
unsafe impl Sync for CudaStep {}

impl CapturedStep for CudaStep {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn capture_error(what: impl std::fmt::Display) -> Error {
    Error::Device(format!("CUDA graph capture: {what}; {WORKAROUND}"))
}

impl CudaDevice {
    /// Whether a capture is under way (then uploads, downloads and host operands fail).
    pub(super) fn capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }

    /// The error of `what` (an upload, a download, a host operand) inside a capture.
    pub(super) fn refuse_in_capture(&self, what: &str) -> Result<()> {
        if self.capturing() {
            Err(capture_error(format!("{what} inside a captured step")))
        } else {
            Ok(())
        }
    }

    fn capture_slot(&self) -> Result<std::sync::MutexGuard<'_, Option<Capture>>> {
        self.capture
            .lock()
            .map_err(|_| Error::Device("CUDA graph state poisoned".into()))
    }

    /// For an op of kind `op` (one with token ids or positions) in a capture, the step's
    /// inputs on the GPU after checking the op's own values against them with `matches`
    /// (given the step's tokens, RoPE position of row 0 and cache row); `None` outside a
    /// capture, where the op uses its own values.
    ///
    /// Errors: [`Error::Device`] in a capture for an op that does not follow the step or
    /// whose values are not the step's.
    pub(super) fn step_words(
        &self,
        op: &str,
        follows_step: bool,
        matches: impl FnOnce(&[u32], usize, usize) -> bool,
    ) -> Result<Option<StepWords>> {
        if !self.capturing() {
            return Ok(None);
        }
        let slot = self.capture_slot()?;
        let Some(c) = slot.as_ref() else {
            return Ok(None);
        };
        if !follows_step {
            return Err(capture_error(format!(
                "{op} with token ids or positions of its own (not the step's)"
            )));
        }
        if !matches(&c.tokens, c.start_pos, c.cache_row) {
            return Err(capture_error(format!(
                "{op} at other tokens or positions than the step's"
            )));
        }
        Ok(Some(StepWords {
            words: Arc::clone(&c.words),
            batch: c.tokens.len(),
        }))
    }

    /// The words `pick` takes from the step's inputs in a capture (`step`), else `own`
    /// uploaded.
    pub(super) fn step_or_upload<'s>(
        &self,
        step: Option<&'s StepWords>,
        pick: for<'w> fn(&'w StepWords) -> CudaView<'w, u32>,
        own: &[u32],
    ) -> Result<Words<'s>> {
        match step {
            Some(s) => Ok(Words::Step(pick(s))),
            None => Ok(Words::Own(self.upload(own)?)),
        }
    }

    /// Records a bound of the ops being captured (nothing outside a capture).
    pub(super) fn bound(&self, bound: Bound) -> Result<()> {
        if !self.capturing() {
            return Ok(());
        }
        if let Some(c) = self.capture_slot()?.as_mut() {
            let b = &mut c.bounds;
            match bound {
                Bound::Vocab(v) => b.vocab = b.vocab.min(v),
                Bound::Positions(v) => b.positions = b.positions.min(v),
                Bound::CacheRows(v) => b.cache_rows = b.cache_rows.min(v),
            }
        }
        Ok(())
    }

    /// [`flm_core::BaseDevice::begin_capture`].
    pub(super) fn begin_step_capture(&self, step: &StepInputs<'_>) -> Result<()> {
        if !self.stream.context().has_async_alloc() {
            return Err(capture_error(
                "this GPU or driver has no stream-ordered allocation (cuMemAllocAsync)",
            ));
        }
        let mut slot = self.capture_slot()?;
        if slot.is_some() {
            return Err(capture_error("a capture is already under way"));
        }
        let words = Arc::new(self.upload(&step.words()?)?);
        // The capture must not record work queued before it.
        self.stream.synchronize().map_err(dev_err)?;
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(capture_error)?;
        *slot = Some(Capture {
            words,
            tokens: step.tokens.to_vec(),
            start_pos: step.start_pos,
            cache_row: step.cache_row,
            bounds: StepBounds::NONE,
        });
        self.capturing.store(true, Ordering::Release);
        Ok(())
    }

    /// [`flm_core::BaseDevice::end_capture`].
    pub(super) fn end_step_capture(&self, keep: bool) -> Result<Option<Box<dyn CapturedStep>>> {
        let mut slot = self.capture_slot()?;
        let capture = slot
            .take()
            .ok_or_else(|| capture_error("no capture is under way"))?;
        self.capturing.store(false, Ordering::Release);
        let graph = self
            .stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(capture_error)?;
        if !keep {
            return Ok(None);
        }
        let graph = graph.ok_or_else(|| capture_error("the step recorded nothing"))?;
        Ok(Some(Box::new(CudaStep {
            graph: Mutex::new(Graph {
                graph,
                words: capture.words,
            }),
            batch: capture.tokens.len(),
            bounds: capture.bounds,
            device: self.instance,
        })))
    }

    /// [`flm_core::BaseDevice::replay`].
    pub(super) fn replay_step(
        &self,
        captured: &dyn CapturedStep,
        step: &StepInputs<'_>,
    ) -> Result<()> {
        let g = captured
            .as_any()
            .downcast_ref::<CudaStep>()
            .filter(|g| g.device == self.instance)
            .ok_or_else(|| {
                Error::InvalidArgument("a step captured by another device replayed on cuda".into())
            })?;
        if step.batch() != g.batch {
            return Err(Error::InvalidArgument(format!(
                "a step of {} rows replayed on a graph of {}",
                step.batch(),
                g.batch
            )));
        }
        g.bounds.check(step)?;
        self.refuse_in_capture("replaying a step")?;
        let words = step.words()?;
        let mut graph = g
            .graph
            .lock()
            .map_err(|_| Error::Device("CUDA graph poisoned".into()))?;
        let Graph { graph, words: buf } = &mut *graph;
        let buf = Arc::get_mut(buf)
            .ok_or_else(|| Error::Device("the step's input buffer is shared".into()))?;
        self.stream.memcpy_htod(&words, buf).map_err(dev_err)?;
        graph.launch().map_err(|e| {
            Error::Device(format!(
                "launching the step's CUDA graph: {e}; {WORKAROUND}"
            ))
        })
    }
}
