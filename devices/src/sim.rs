//! [`SimDevice`]: a device with memory of its own on machines without an accelerator.
//!
//! Its buffers are host memory tagged with the device's [`Location`] (`sim:N`), which the
//! host may address ([`DeviceBuffer::host_view`]), and it runs the CPU kernels on them. It
//! exists so that everything above the kernels (where a model's weights, KV cache and
//! activations are placed, the copies at the boundary between devices, the executor's
//! transfer record) is exercised and checked token for token on every machine, as it runs
//! with a GPU beside the CPU.

use std::any::Any;

use flm_core::{BaseDevice, CheckedOp, Data, DataType, DeviceBuffer, Error, Location, Op, Result};

use crate::CpuDevice;

/// The CPU kernels over buffers of a memory of their own (see the module docs).
#[derive(Debug)]
pub struct SimDevice {
    cpu: CpuDevice,
    ordinal: u32,
}

impl SimDevice {
    /// Device `sim:ordinal`, with the CPU kernels of the level `FLM_CPU_ISA` names or the
    /// best this CPU has.
    ///
    /// Errors: those of [`CpuDevice::new`].
    pub fn new(ordinal: u32) -> Result<SimDevice> {
        Ok(SimDevice {
            cpu: CpuDevice::new()?,
            ordinal,
        })
    }
}

/// Bytes of a [`SimDevice`]'s memory: an aligned host allocation.
#[derive(Debug)]
struct SimBuffer {
    /// f32 words holding at least `len` bytes (64-byte aligned, as the CPU kernels like).
    words: Data,
    len: usize,
    location: Location,
}

impl DeviceBuffer for SimBuffer {
    fn location(&self) -> Location {
        self.location
    }
    fn len(&self) -> usize {
        self.len
    }
    fn host_view(&self) -> Option<&[u8]> {
        self.words.bytes().ok().map(|b| &b[..self.len])
    }
    fn host_view_mut(&mut self) -> Option<&mut [u8]> {
        let len = self.len;
        self.words.bytes_mut().ok().map(|b| &mut b[..len])
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl SimDevice {
    /// `buffer`'s bytes, when it is this device's.
    fn own<'b>(&self, buffer: &'b dyn DeviceBuffer) -> Result<&'b [u8]> {
        buffer
            .host_view()
            .filter(|_| buffer.location() == self.location())
            .ok_or_else(|| {
                Error::Placement(format!(
                    "a buffer of {} used on {}",
                    buffer.location(),
                    self.location()
                ))
            })
    }
}

fn too_short(what: &'static str, len: usize, have: usize) -> Error {
    Error::Shape {
        op: what,
        msg: format!("{len} bytes for a buffer of {have}"),
    }
}

impl BaseDevice for SimDevice {
    fn name(&self) -> &'static str {
        "sim"
    }

    /// The ops whose operands are all in its memory, as the CPU device would run them.
    fn supports(&self, op: &Op<'_>) -> bool {
        op.location().ok() == Some(self.location()) && self.cpu.supports(op)
    }

    fn run(&self, op: CheckedOp<'_>) -> Result<()> {
        self.cpu.run(op)
    }

    fn require_batch_invariance(&self) {
        self.cpu.require_batch_invariance();
    }

    fn location(&self) -> Location {
        Location::Device {
            name: "sim",
            ordinal: self.ordinal,
        }
    }

    fn alloc(&self, bytes: usize) -> Result<Box<dyn DeviceBuffer>> {
        Ok(Box::new(SimBuffer {
            words: Data::zeros(DataType::F32, &[bytes.div_ceil(4)])?,
            len: bytes,
            location: self.location(),
        }))
    }

    fn upload(&self, src: &[u8], dst: &mut dyn DeviceBuffer) -> Result<()> {
        let (location, have) = (dst.location(), dst.len());
        if location != self.location() {
            return Err(Error::Placement(format!(
                "a buffer of {location} used on {}",
                self.location()
            )));
        }
        let bytes = dst.host_view_mut().ok_or(Error::ReadOnly)?;
        bytes
            .get_mut(..src.len())
            .ok_or_else(|| too_short("upload", src.len(), have))?
            .copy_from_slice(src);
        Ok(())
    }

    fn download(&self, src: &dyn DeviceBuffer, dst: &mut [u8]) -> Result<()> {
        let bytes = self.own(src)?;
        dst.copy_from_slice(
            bytes
                .get(..dst.len())
                .ok_or_else(|| too_short("download", dst.len(), bytes.len()))?,
        );
        Ok(())
    }
}
