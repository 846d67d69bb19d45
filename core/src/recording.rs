//! [`RecordingDevice`]: a device that captures a decode step by recording its ops, the
//! stand-in with which the step-graph machinery ([`crate::Executor::capture`],
//! [`crate::StepGraph`], the graphs' capture plans) is tested on machines without a GPU.
//! Built for this crate's tests and with the `testing` feature.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::{
    BaseDevice, CapturedStep, CheckedOp, Data, DeviceBuffer, Location, Op, OpKind, Result,
    StepInputs,
};

/// An op as a capture saw it: its kind, and whether it follows the step
/// ([`CheckedOp::follows_step`]).
pub type RecordedOp = (OpKind, bool);

/// What a [`RecordingDevice`] was asked to do.
#[derive(Debug, Default)]
pub struct RecordLog {
    recording: Mutex<Option<Vec<RecordedOp>>>,
    captures: Mutex<Vec<Vec<RecordedOp>>>,
    kept: Mutex<Vec<bool>>,
    replays: Mutex<Vec<Vec<u32>>>,
}

/// Locks `m`, whose holders never panic while holding it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl RecordLog {
    /// The ops of each capture that ended, in order.
    pub fn captures(&self) -> Vec<Vec<RecordedOp>> {
        lock(&self.captures).clone()
    }

    /// For each capture that ended, whether it was kept.
    pub fn kept(&self) -> Vec<bool> {
        lock(&self.kept).clone()
    }

    /// The step words ([`StepInputs::words`]) of each replay, in order.
    pub fn replays(&self) -> Vec<Vec<u32>> {
        lock(&self.replays).clone()
    }
}

/// The step a [`RecordingDevice`] captured: its ops.
#[derive(Debug)]
pub struct RecordedStep(pub Vec<RecordedOp>);

impl CapturedStep for RecordedStep {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// `inner` (its ops, memory and location) that captures: between
/// [`BaseDevice::begin_capture`] and [`BaseDevice::end_capture`] it records each op it is
/// given instead of running it, and a replay records the step's words. The log is shared
/// with whoever holds [`RecordingDevice::log`].
pub struct RecordingDevice<D> {
    inner: D,
    log: Arc<RecordLog>,
}

impl<D: BaseDevice> RecordingDevice<D> {
    /// `inner`, capturing by recording.
    pub fn new(inner: D) -> RecordingDevice<D> {
        RecordingDevice {
            inner,
            log: Arc::default(),
        }
    }

    /// What it was asked to do.
    pub fn log(&self) -> Arc<RecordLog> {
        Arc::clone(&self.log)
    }
}

impl<D: BaseDevice> BaseDevice for RecordingDevice<D> {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn supports(&self, op: &Op<'_>) -> bool {
        self.inner.supports(op)
    }
    fn run(&self, op: CheckedOp<'_>) -> Result<()> {
        if let Some(ops) = lock(&self.log.recording).as_mut() {
            ops.push((op.op().kind(), op.follows_step()));
            return Ok(());
        }
        self.inner.run(op)
    }
    fn require_batch_invariance(&self) {
        self.inner.require_batch_invariance();
    }
    fn location(&self) -> Location {
        self.inner.location()
    }
    fn runs_host_operands(&self) -> bool {
        self.inner.runs_host_operands()
    }
    fn free_memory(&self) -> Option<u64> {
        self.inner.free_memory()
    }
    fn alloc(&self, bytes: usize) -> Result<Box<dyn DeviceBuffer>> {
        self.inner.alloc(bytes)
    }
    fn upload(&self, src: &[u8], dst: &mut dyn DeviceBuffer) -> Result<()> {
        self.inner.upload(src, dst)
    }
    fn download(&self, src: &dyn DeviceBuffer, dst: &mut [u8]) -> Result<()> {
        self.inner.download(src, dst)
    }
    fn upload_tensor(&self, src: &Data, dst: &mut dyn DeviceBuffer) -> Result<()> {
        self.inner.upload_tensor(src, dst)
    }
    fn download_tensor(&self, src: &dyn DeviceBuffer, dst: &mut Data) -> Result<()> {
        self.inner.download_tensor(src, dst)
    }
    fn supports_capture(&self) -> bool {
        true
    }
    fn begin_capture(&self, _: &StepInputs<'_>) -> Result<()> {
        *lock(&self.log.recording) = Some(Vec::new());
        Ok(())
    }
    fn end_capture(&self, keep: bool) -> Result<Option<Box<dyn CapturedStep>>> {
        let ops = lock(&self.log.recording).take().unwrap_or_default();
        lock(&self.log.captures).push(ops.clone());
        lock(&self.log.kept).push(keep);
        Ok(keep.then(|| Box::new(RecordedStep(ops)) as Box<dyn CapturedStep>))
    }
    fn replay(&self, captured: &dyn CapturedStep, step: &StepInputs<'_>) -> Result<()> {
        if captured.as_any().downcast_ref::<RecordedStep>().is_none() {
            return Err(crate::Error::InvalidArgument(
                "a step captured by another device".into(),
            ));
        }
        lock(&self.log.replays).push(step.words()?);
        Ok(())
    }
}
