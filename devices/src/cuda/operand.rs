//! The operands of one op in this GPU's memory.
//!
//! A tensor that lives on this GPU ([`super::CudaBuffer`]) is read and written where it
//! is. A tensor in host memory (the per-op offload, [`flm_core::BaseDevice::runs_host_operands`])
//! is copied in for the op and, for an output, copied back after it; weights in host memory
//! are uploaded once and cached while their [`Data::id`] stays the same. The kernels take
//! raw device pointers, so every operand is a byte buffer here whatever its dtype.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use flm_core::{BaseDevice, Data, DeviceBuffer, Error, Result};

use super::device::CudaDevice;
use super::CudaBuffer;
use crate::gemv_layout::{packed_in_gpu_memory, GemvLayout};

/// An input's bytes in GPU memory.
pub(super) enum Input<'a> {
    /// The tensor's own buffer on this GPU.
    Resident(&'a CudaSlice<u8>),
    /// A weight uploaded once and cached.
    Cached(Arc<CudaSlice<u8>>),
    /// A copy uploaded for this op.
    Staged(CudaSlice<u8>),
}

impl Input<'_> {
    /// The device buffer.
    pub(super) fn slice(&self) -> &CudaSlice<u8> {
        match self {
            Input::Resident(s) => s,
            Input::Cached(s) => s,
            Input::Staged(s) => s,
        }
    }
}

/// An output's bytes in GPU memory.
pub(super) enum Output<'a> {
    /// The tensor's own buffer on this GPU, written in place.
    Resident(&'a mut CudaSlice<u8>),
    /// A buffer for this op, whose bytes [`Output::finish`] copies into the host tensor.
    Staged {
        buffer: CudaSlice<u8>,
        host: &'a mut [u8],
    },
}

impl Output<'_> {
    /// The device buffer.
    pub(super) fn slice(&mut self) -> &mut CudaSlice<u8> {
        match self {
            Output::Resident(s) => s,
            Output::Staged { buffer, .. } => buffer,
        }
    }

    /// Copies a staged output back to its host tensor, waiting for the stream; nothing for
    /// a resident one (it stays on the stream, ordered before the next op).
    pub(super) fn finish(self, dev: &CudaDevice) -> Result<()> {
        match self {
            Output::Resident(_) => Ok(()),
            Output::Staged { buffer, host } => dev.download(&buffer, host),
        }
    }
}

/// `data`'s buffer when it lives on `dev`; `None` for host memory.
fn resident<'a>(dev: &CudaDevice, data: &'a Data) -> Result<Option<&'a CudaSlice<u8>>> {
    match data.device_buffer() {
        None => Ok(None),
        Some(buffer) => buffer
            .as_any()
            .downcast_ref::<CudaBuffer>()
            .filter(|b| buffer.location() == dev.location() && !b.bytes.is_empty())
            .map(|b| Some(&b.bytes))
            .ok_or_else(|| placement(dev, data)),
    }
}

fn placement(dev: &CudaDevice, data: &Data) -> Error {
    Error::Placement(format!(
        "a {} tensor {:?} of {} on {}",
        data.dtype(),
        data.shape(),
        data.location(),
        dev.location()
    ))
}

impl CudaDevice {
    /// `data` as an input: its own buffer, or a copy of its host bytes.
    pub(super) fn input<'a>(&self, data: &'a Data) -> Result<Input<'a>> {
        match resident(self, data)? {
            Some(s) => Ok(Input::Resident(s)),
            None => self.input_bytes(data.bytes()?),
        }
    }

    /// Host bytes as an input: a copy uploaded for this op.
    pub(super) fn input_bytes(&self, bytes: &[u8]) -> Result<Input<'static>> {
        Ok(Input::Staged(self.upload(bytes)?))
    }

    /// A weight (linear weight, table, gain or bias) as an input: its own buffer, or its
    /// host bytes uploaded the first time and reused while `w.id()` is unchanged.
    pub(super) fn weight<'a>(&self, w: &'a Data) -> Result<Input<'a>> {
        if let Some(s) = resident(self, w)? {
            return Ok(Input::Resident(s));
        }
        Ok(Input::Cached(self.cached_weight(w)?))
    }

    /// A weight the kernels read in its GPU GEMV `layout` ([`crate::gemv_layout`]): its own
    /// buffer where that holds the layout (an int8/int4 tensor on this GPU, or f16/bf16 rows
    /// of a multiple of 8 values), else the packed copy of
    /// [`CudaDevice::packed_weight`], made once.
    pub(super) fn weight_in_layout<'a>(
        &self,
        w: &'a Data,
        layout: &GemvLayout,
    ) -> Result<Input<'a>> {
        let kept = layout.is_identity() || packed_in_gpu_memory(w.dtype());
        match resident(self, w)? {
            Some(s) if kept => Ok(Input::Resident(s)),
            _ if layout.is_identity() => self.weight(w),
            _ => Ok(Input::Cached(self.packed_weight(w, layout)?)),
        }
    }

    /// `data` as an output, its previous contents unread: its own buffer, or a zeroed
    /// buffer of its size copied back by [`Output::finish`].
    pub(super) fn output<'a>(&self, data: &'a mut Data) -> Result<Output<'a>> {
        self.writable(data, false)
    }

    /// `data` as an output that the op also reads (in place): its own buffer, or a copy of
    /// its host bytes, copied back by [`Output::finish`].
    pub(super) fn in_out<'a>(&self, data: &'a mut Data) -> Result<Output<'a>> {
        self.writable(data, true)
    }

    fn writable<'a>(&self, data: &'a mut Data, read: bool) -> Result<Output<'a>> {
        if data.device_buffer().is_some() {
            let location = self.location();
            let err = placement(self, data);
            let buffer = data
                .device_buffer_mut()?
                .as_any_mut()
                .downcast_mut::<CudaBuffer>()
                .filter(|b| b.location() == location)
                .ok_or(err)?;
            return Ok(Output::Resident(&mut buffer.bytes));
        }
        self.refuse_in_capture("an operand in host memory")?;
        let host = data.bytes_mut()?;
        let buffer = if read {
            self.upload(host)?
        } else {
            self.zeros::<u8>(host.len())?
        };
        Ok(Output::Staged { buffer, host })
    }
}
