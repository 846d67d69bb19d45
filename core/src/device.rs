//! The device interface.

use crate::{CapturedStep, CheckedOp, Data, DeviceBuffer, Error, Location, Op, Result, StepInputs};

/// A compute device (FastLLM's `BaseDevice`): it says which ops it can run and runs them,
/// and manages the buffers of its own memory, if it has any (allocate, upload, download).
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

    /// The memory its kernels read and write: [`Location::Host`] for the CPU, its own
    /// memory for an accelerator. The [`crate::Executor`] runs an op only on a device of
    /// the op's operands' location.
    fn location(&self) -> Location {
        Location::Host
    }

    /// Whether it also runs ops whose operands are in host memory, copying them in and
    /// out for each op. Only the CUDA device's per-op offload does, until its ops read
    /// buffers of its own memory; such copies are not in the executor's transfer record.
    fn runs_host_operands(&self) -> bool {
        false
    }

    /// Free bytes of this device's own memory, where it has any and can tell (for
    /// `--gpu-layers auto`); `None` by default.
    fn free_memory(&self) -> Option<u64> {
        None
    }

    /// A zeroed buffer of `bytes` bytes in this device's memory.
    ///
    /// Errors: [`Error::Unsupported`] for a device without memory of its own (the
    /// default); [`Error::Device`] when the device is out of memory.
    fn alloc(&self, bytes: usize) -> Result<Box<dyn DeviceBuffer>> {
        Err(Error::Unsupported(format!(
            "{} has no memory of its own to allocate {bytes} bytes in",
            self.name()
        )))
    }

    /// Copies `src` into the first `src.len()` bytes of `dst`, a buffer of this device.
    ///
    /// Errors: [`Error::Placement`] when `dst` is not this device's, [`Error::Shape`] when
    /// it is too short; [`Error::Unsupported`] by default.
    fn upload(&self, src: &[u8], dst: &mut dyn DeviceBuffer) -> Result<()> {
        let _ = (src, dst);
        Err(Error::Unsupported(format!("upload to {}", self.name())))
    }

    /// Copies the first `dst.len()` bytes of `src`, a buffer of this device, into `dst`.
    ///
    /// Errors: [`Error::Placement`] when `src` is not this device's, [`Error::Shape`] when
    /// it is too short; [`Error::Unsupported`] by default.
    fn download(&self, src: &dyn DeviceBuffer, dst: &mut [u8]) -> Result<()> {
        let _ = (src, dst);
        Err(Error::Unsupported(format!("download from {}", self.name())))
    }

    /// Copies `src`, a tensor in host memory, into `dst`, a buffer of this device, in the
    /// layout this device keeps tensors of its dtype in; the [`crate::Executor`] moves every
    /// tensor this way. The layout must have the size of the host bytes (their .flm
    /// layout, [`crate::DataType::byte_len`] bytes), so that a buffer of that size
    /// ([`crate::Executor::zeros`]) holds it. The default is [`BaseDevice::upload`], the
    /// bytes as they are; the CUDA device repacks int8/int4 matrices into the layout of its
    /// decode kernels.
    ///
    /// Errors: those of [`BaseDevice::upload`]; [`Error::Shape`] when `dst` has not the
    /// tensor's size; [`Error::ReadOnly`] when `src` is not in host memory.
    fn upload_tensor(&self, src: &Data, dst: &mut dyn DeviceBuffer) -> Result<()> {
        self.upload(src.bytes()?, dst)
    }

    /// Copies the tensor held by `src`, a buffer of this device written by
    /// [`BaseDevice::upload_tensor`] (or by this device's ops), into `dst`, a tensor of its
    /// dtype and shape in host memory: the inverse of [`BaseDevice::upload_tensor`]. The
    /// default is [`BaseDevice::download`].
    ///
    /// Errors: those of [`BaseDevice::download`]; [`Error::Shape`] when `src` has not the
    /// tensor's size; [`Error::ReadOnly`] when `dst` is not writable host memory.
    fn download_tensor(&self, src: &dyn DeviceBuffer, dst: &mut Data) -> Result<()> {
        self.download(src, dst.bytes_mut()?)
    }

    /// Whether it can capture a step ([`BaseDevice::begin_capture`]); false by default, so
    /// devices without graphs run every step op by op.
    fn supports_capture(&self) -> bool {
        false
    }

    /// Starts recording, instead of running, the ops it is given until
    /// [`BaseDevice::end_capture`] (the [`crate::Executor`] routes every op of the step to
    /// it), with `step` as the values of the ops that follow the step
    /// ([`CheckedOp::follows_step`]); see [`crate::StepGraph`] for what a capture refuses.
    ///
    /// Errors: [`Error::Unsupported`] by default; [`Error::Device`] when a capture is
    /// already under way or the device cannot start one.
    fn begin_capture(&self, step: &StepInputs<'_>) -> Result<()> {
        let _ = step;
        Err(Error::Unsupported(format!(
            "capturing a step on {}",
            self.name()
        )))
    }

    /// Ends the capture begun by [`BaseDevice::begin_capture`] and returns it, nothing
    /// having run yet. With `keep` false (an op of the step failed) it discards it.
    ///
    /// Errors: [`Error::Unsupported`] by default; [`Error::Device`] when no capture is
    /// under way or the device fails to build it.
    fn end_capture(&self, keep: bool) -> Result<Option<Box<dyn CapturedStep>>> {
        let _ = keep;
        Err(Error::Unsupported(format!(
            "capturing a step on {}",
            self.name()
        )))
    }

    /// Runs a step this device captured, with `step`'s token ids and positions: one upload
    /// of them, then the captured ops.
    ///
    /// Errors: [`Error::Unsupported`] by default; [`Error::InvalidArgument`] for a capture
    /// of another device or another batch size; [`Error::TokenOutOfRange`] or
    /// [`Error::ContextOverflow`] for inputs the captured ops cannot take; [`Error::Device`]
    /// when the launch fails.
    fn replay(&self, captured: &dyn CapturedStep, step: &StepInputs<'_>) -> Result<()> {
        let _ = (captured, step);
        Err(Error::Unsupported(format!(
            "replaying a step on {}",
            self.name()
        )))
    }
}
