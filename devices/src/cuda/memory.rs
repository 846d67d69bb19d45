//! [`CudaBuffer`]: GPU memory as a [`flm_core::DeviceBuffer`], and the
//! [`flm_core::BaseDevice`] buffer management of [`super::CudaDevice`] (allocate, upload,
//! download) on the device's stream. Tensors are uploaded in the layout the kernels read
//! (`upload_tensor` in [`super::dispatch`]): int8/int4 ones repacked into the GPU GEMV
//! layout ([`crate::gemv_layout`], the .flm size), and unpacked again when downloaded.

use std::any::Any;
use std::fmt;

use cudarc::driver::CudaSlice;
use flm_core::{BaseDevice, DeviceBuffer, Error, Location, Result};

use super::device::CudaDevice;
use super::launch::dev_err;
use crate::gemv_layout::GemvLayout;

/// Bytes of GPU memory owned by a [`CudaDevice`], freed when dropped.
pub struct CudaBuffer {
    pub(super) bytes: CudaSlice<u8>,
    location: Location,
}

impl fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CudaBuffer({} bytes on {})",
            self.bytes.len(),
            self.location
        )
    }
}

impl DeviceBuffer for CudaBuffer {
    fn location(&self) -> Location {
        self.location
    }
    fn len(&self) -> usize {
        self.bytes.len()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The range `..len` of a buffer of `have` bytes, or a shape error.
fn fits(what: &'static str, len: usize, have: usize) -> Result<()> {
    if len <= have {
        Ok(())
    } else {
        Err(Error::Shape {
            op: what,
            msg: format!("{len} bytes for a buffer of {have}"),
        })
    }
}

impl CudaDevice {
    /// The error of a buffer of `at` handed to this GPU.
    fn foreign(&self, at: Location) -> Error {
        Error::Placement(format!("a buffer of {at} used on {}", self.location()))
    }

    /// `buffer` as one of this GPU's buffers.
    fn own<'b>(&self, buffer: &'b dyn DeviceBuffer) -> Result<&'b CudaBuffer> {
        buffer
            .as_any()
            .downcast_ref::<CudaBuffer>()
            .filter(|b| b.location == self.location())
            .ok_or_else(|| self.foreign(buffer.location()))
    }

    /// [`flm_core::BaseDevice::alloc`]: `bytes` zeroed bytes on this GPU.
    pub(super) fn alloc_buffer(&self, bytes: usize) -> Result<Box<dyn DeviceBuffer>> {
        Ok(Box::new(CudaBuffer {
            bytes: self.zeros::<u8>(bytes)?,
            location: self.location(),
        }))
    }

    /// [`flm_core::BaseDevice::upload`]: `src` into the start of `dst`, on the stream.
    pub(super) fn upload_bytes(&self, src: &[u8], dst: &mut dyn DeviceBuffer) -> Result<()> {
        let location = dst.location();
        let dst = dst
            .as_any_mut()
            .downcast_mut::<CudaBuffer>()
            .filter(|b| b.location == self.location())
            .ok_or_else(|| self.foreign(location))?;
        fits("upload", src.len(), dst.bytes.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.refuse_in_capture("a host upload")?;
        let mut view = dst.bytes.slice_mut(..src.len());
        self.stream.memcpy_htod(src, &mut view).map_err(dev_err)
    }

    /// [`flm_core::BaseDevice::download`]: the first `dst.len()` bytes of `src`, waiting
    /// for the stream.
    pub(super) fn download_bytes(&self, src: &dyn DeviceBuffer, dst: &mut [u8]) -> Result<()> {
        let src = self.own(src)?;
        fits("download", dst.len(), src.bytes.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.refuse_in_capture("a download")?;
        self.stream
            .memcpy_dtoh(&src.bytes.slice(..dst.len()), dst)
            .map_err(dev_err)?;
        self.stream.synchronize().map_err(dev_err)
    }

    /// The int8/int4 tensor of `layout` held by `src` (in that layout) as its .flm bytes,
    /// into `dst` ([`flm_core::BaseDevice::download_tensor`]).
    pub(super) fn download_packed(
        &self,
        layout: &GemvLayout,
        src: &dyn DeviceBuffer,
        dst: &mut [u8],
    ) -> Result<()> {
        let mut packed = vec![0u8; layout.bytes];
        self.download_bytes(src, &mut packed)?;
        layout.unpack(&packed, dst)
    }
}
