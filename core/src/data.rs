//! [`Data`]: flm's tensor type.
//!
//! A `Data` has a dtype, a shape, row-major strides and its bytes, which are either owned (a
//! 64-byte aligned heap buffer, for activations and converted weights; from 2 MiB up, an
//! anonymous mapping backed by transparent huge pages where the OS has them), borrowed from
//! a memory-mapped file (zero-copy weights), or in a buffer of device memory
//! ([`DeviceBuffer`]). The host reads only host bytes: moving data between devices is
//! always explicit ([`crate::Executor::to_device`], [`crate::Executor::to_host`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use memmap2::Mmap;
use rayon::prelude::*;

#[cfg(unix)]
use crate::pages::{HugeBuffer, HUGE_PAGE_BYTES};
use crate::panels::{self, Layout};
use crate::{quant, DataType, DeviceBuffer, Error, Location, Result};

mod slice;

/// One 64-byte aligned chunk of an owned buffer: the alignment lets SIMD kernels use aligned
/// loads and keeps rows on cache-line boundaries.
#[repr(C, align(64))]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Chunk([u8; 64]);

/// Where the bytes of a [`Data`] live.
#[derive(Clone)]
enum Storage {
    /// Heap memory owned by the tensor; its capacity may exceed the current shape.
    Owned(Vec<Chunk>),
    /// A buffer of [`HUGE_PAGE_BYTES`] or more, owned by the tensor, on huge pages where the
    /// OS gives them (weights, KV caches); its capacity may exceed the current shape.
    #[cfg(unix)]
    Huge(HugeBuffer),
    /// A read-only range of a memory-mapped file.
    Mapped {
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
    },
    /// Memory owned by a device. Clones share the buffer, and a shared buffer is
    /// read-only ([`Data::device_buffer_mut`]).
    Device(Arc<dyn DeviceBuffer>),
}

impl Storage {
    /// `len` zero bytes: a [`Storage::Huge`] buffer from [`HUGE_PAGE_BYTES`] up (on the heap
    /// if the OS refuses the mapping), else a heap buffer. `None` if memory is exhausted.
    fn zeroed(len: usize) -> Option<Storage> {
        #[cfg(unix)]
        if len >= HUGE_PAGE_BYTES {
            if let Some(buffer) = HugeBuffer::zeroed(len) {
                return Some(Storage::Huge(buffer));
            }
        }
        bytemuck::allocation::try_zeroed_vec(len.div_ceil(64))
            .ok()
            .map(Storage::Owned)
    }
}

/// A tensor: dtype, shape, strides (in elements) and storage.
///
/// All tensors created by flm are contiguous and row-major; the typed accessors
/// ([`Data::as_f32`] and friends) return the elements in that order.
pub struct Data {
    dtype: DataType,
    shape: Vec<usize>,
    strides: Vec<usize>,
    storage: Storage,
    id: u64,
    input_perm: Option<Arc<Data>>,
    layout: Layout,
}

/// The source of [`Data::id`]s.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

impl Clone for Data {
    /// A copy with its own [`Data::id`] (an owned copy can be changed apart from the
    /// original).
    fn clone(&self) -> Data {
        Data {
            dtype: self.dtype,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            storage: self.storage.clone(),
            id: next_id(),
            input_perm: self.input_perm.clone(),
            layout: self.layout,
        }
    }
}

fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = Vec::new();
    set_row_major_strides(shape, &mut strides);
    strides
}

/// Overwrites `strides` with the row-major strides of `shape`, in place (no allocation
/// once `strides` has held as many dimensions).
fn set_row_major_strides(shape: &[usize], strides: &mut Vec<usize>) {
    strides.clear();
    strides.resize(shape.len(), 1);
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
}

fn byte_len(dtype: DataType, shape: &[usize]) -> Result<usize> {
    dtype.byte_len(shape).ok_or_else(|| Error::Shape {
        op: "Data",
        msg: format!("{dtype} shape {shape:?} overflows"),
    })
}

impl Data {
    /// A zero-filled owned tensor of `shape`.
    ///
    /// The memory comes zeroed from the allocator; the allocation fails with an error
    /// rather than aborting the process.
    ///
    /// Errors: [`Error::Shape`] if the byte size overflows `usize`;
    /// [`Error::InvalidArgument`] if the memory cannot be allocated.
    pub fn zeros(dtype: DataType, shape: &[usize]) -> Result<Data> {
        let len = byte_len(dtype, shape)?;
        let storage = Storage::zeroed(len).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "cannot allocate {len} bytes for a {dtype} tensor of shape {shape:?}"
            ))
        })?;
        Ok(Data {
            dtype,
            shape: shape.to_vec(),
            strides: row_major_strides(shape),
            storage,
            id: next_id(),
            input_perm: None,
            layout: Layout::Rows,
        })
    }

    /// Copies `bytes` (little-endian elements of `dtype`) into a new owned tensor.
    ///
    /// Errors: [`Error::Shape`] if `bytes.len()` is not the size of `shape`.
    pub fn from_bytes(dtype: DataType, shape: &[usize], bytes: &[u8]) -> Result<Data> {
        let mut data = Data::zeros(dtype, shape)?;
        if bytes.len() != data.size_bytes() {
            return Err(Error::Shape {
                op: "Data::from_bytes",
                msg: format!(
                    "{} bytes given for {dtype} shape {shape:?} ({} bytes)",
                    bytes.len(),
                    data.size_bytes()
                ),
            });
        }
        data.bytes_mut()?.copy_from_slice(bytes);
        Ok(data)
    }

    /// A new owned f32 tensor holding `values`.
    ///
    /// Errors: [`Error::Shape`] if `values.len()` is not the element count of `shape`.
    pub fn from_f32(shape: &[usize], values: &[f32]) -> Result<Data> {
        Data::from_bytes(DataType::F32, shape, bytemuck::cast_slice(values))
    }

    /// A zero-copy view of `map[offset..]` as a tensor of `dtype` and `shape`.
    ///
    /// If the bytes are not aligned to the element size (possible in files whose tensors are
    /// packed back to back), they are copied into an owned, aligned buffer instead.
    ///
    /// Errors: [`Error::OutOfBounds`] if the tensor does not fit inside the mapping.
    pub fn from_mmap(
        map: &Arc<Mmap>,
        offset: usize,
        dtype: DataType,
        shape: &[usize],
    ) -> Result<Data> {
        let len = byte_len(dtype, shape)?;
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= map.len())
            .ok_or_else(|| {
                Error::OutOfBounds(format!(
                    "tensor of {len} bytes at offset {offset} exceeds the file size {}",
                    map.len()
                ))
            })?;
        let bytes = &map[offset..end];
        if !(bytes.as_ptr() as usize).is_multiple_of(dtype.size_of().max(1)) {
            return Data::from_bytes(dtype, shape, bytes);
        }
        Ok(Data {
            dtype,
            shape: shape.to_vec(),
            strides: row_major_strides(shape),
            storage: Storage::Mapped {
                map: Arc::clone(map),
                offset,
                len,
            },
            id: next_id(),
            input_perm: None,
            layout: Layout::Rows,
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The shape, outermost dimension first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Row-major strides in elements, one per dimension.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Size of the elements (or quantised blocks) in bytes.
    pub fn size_bytes(&self) -> usize {
        self.dtype.byte_len(&self.shape).unwrap_or(0)
    }

    /// Length of the last dimension (1 for a scalar).
    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Product of all dimensions but the last: the number of rows of the tensor seen as a
    /// matrix `[rows, cols]`.
    pub fn rows(&self) -> usize {
        self.shape[..self.shape.len().saturating_sub(1)]
            .iter()
            .product()
    }

    /// A process-unique identity of the tensor's current contents: new for every tensor
    /// made or cloned, and renewed by every mutable access ([`Data::bytes_mut`] and the
    /// typed `_mut` accessors) and reshape. Two reads that see the same id see the same
    /// bytes, so a device can upload an immutable weight once and reuse its copy for as long
    /// as the id stays the same.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether the bytes are borrowed from a memory-mapped file.
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped { .. })
    }

    /// A tensor of `dtype` and `shape` whose bytes are the first of `buffer`, device memory
    /// allocated by [`crate::BaseDevice::alloc`] (its contents as they are).
    ///
    /// Errors: [`Error::Shape`] if the tensor needs more bytes than the buffer holds.
    pub fn from_device(
        dtype: DataType,
        shape: &[usize],
        buffer: Box<dyn DeviceBuffer>,
    ) -> Result<Data> {
        let len = byte_len(dtype, shape)?;
        if len > buffer.len() {
            return Err(Error::Shape {
                op: "Data::from_device",
                msg: format!(
                    "{dtype} shape {shape:?} needs {len} bytes, the buffer holds {}",
                    buffer.len()
                ),
            });
        }
        Ok(Data {
            dtype,
            shape: shape.to_vec(),
            strides: row_major_strides(shape),
            storage: Storage::Device(Arc::from(buffer)),
            id: next_id(),
            input_perm: None,
            layout: Layout::Rows,
        })
    }

    /// The permutation of this weight's input channels, if it has one: an i32 tensor
    /// `[cols]` in the same memory as the weight, with column `j` of the weight multiplying
    /// input channel `perm[j]`. [`crate::Op::Linear`] then computes
    /// `output = input[:, perm] · weightᵀ`, which equals `input · W₀ᵀ` for the unpermuted
    /// weight `W₀[:, perm[j]] = weight[:, j]`. Act-order GPTQ checkpoints get one: sorting a
    /// weight's input channels by group makes each group a run of columns, which flm's
    /// group-wise int4 holds exactly (GPTQModel's `desc_act`, vLLM's `g_idx` sort).
    pub fn input_perm(&self) -> Option<&Data> {
        self.input_perm.as_deref()
    }

    /// This tensor with `perm` as its input permutation ([`Data::input_perm`]).
    ///
    /// Errors: [`Error::DType`] unless `perm` is i32; [`Error::Shape`] unless it has one
    /// value per column; [`Error::Placement`] if it is in another memory than the tensor;
    /// [`Error::InvalidArgument`] (where the host can read `perm`) if its values are not a
    /// permutation of `0..cols` (one out of range or repeated).
    pub fn with_input_perm(mut self, perm: Data) -> Result<Data> {
        perm.check_dtype(DataType::I32, "Data::with_input_perm")?;
        let cols = self.cols();
        if perm.shape() != [cols] {
            return Err(Error::Shape {
                op: "Data::with_input_perm",
                msg: format!("permutation {:?} for {:?}", perm.shape(), self.shape),
            });
        }
        if perm.location() != self.location() {
            return Err(Error::Placement(format!(
                "a permutation in {} for a tensor in {}",
                perm.location(),
                self.location()
            )));
        }
        // Device memory the host cannot read is checked where it was made (moved there).
        if let Ok(values) = perm.as_i32() {
            let mut seen = vec![false; cols];
            for (j, &p) in values.iter().enumerate() {
                match usize::try_from(p).ok().filter(|&p| p < cols) {
                    Some(p) if !seen[p] => seen[p] = true,
                    _ => {
                        return Err(Error::InvalidArgument(format!(
                            "input permutation of {:?}: value {p} at {j} is out of range \
                             0..{cols} or repeated, so it is not a permutation",
                            self.shape
                        )))
                    }
                }
            }
        }
        self.input_perm = Some(Arc::new(perm));
        Ok(self)
    }

    /// Where the bytes are: host memory, or the memory of the device that owns them.
    pub fn location(&self) -> Location {
        match &self.storage {
            Storage::Device(buffer) => buffer.location(),
            _ => Location::Host,
        }
    }

    /// The device buffer holding the bytes; `None` for a tensor in host memory.
    pub fn device_buffer(&self) -> Option<&dyn DeviceBuffer> {
        match &self.storage {
            Storage::Device(buffer) => Some(&**buffer),
            _ => None,
        }
    }

    /// The device buffer holding the bytes, for the device to write them (a new
    /// [`Data::id`]).
    ///
    /// Errors: [`Error::Placement`] for a tensor in host memory; [`Error::ReadOnly`] when
    /// a clone shares the buffer.
    pub fn device_buffer_mut(&mut self) -> Result<&mut dyn DeviceBuffer> {
        self.id = next_id();
        match &mut self.storage {
            Storage::Device(buffer) => match Arc::get_mut(buffer) {
                Some(buffer) => Ok(buffer),
                None => Err(Error::ReadOnly),
            },
            _ => Err(Error::Placement(format!(
                "{} tensor {:?} is in host memory, not a device's",
                self.dtype, self.shape
            ))),
        }
    }

    /// The error of a host access to device memory.
    fn not_on_host(&self) -> Error {
        Error::Placement(format!(
            "{} tensor {:?} is in {} memory; copy it to the host first (Executor::to_host)",
            self.dtype,
            self.shape,
            self.location()
        ))
    }

    /// Changes the shape without moving data, as long as the new shape fits in the storage
    /// (an owned tensor keeps its capacity, so activations allocated for the longest prefill
    /// chunk can be reshaped for shorter ones). It allocates nothing when the tensor has had
    /// as many dimensions before.
    ///
    /// Errors: [`Error::Shape`] if the new shape needs more bytes than the storage holds.
    pub fn set_shape(&mut self, shape: &[usize]) -> Result<()> {
        let len = byte_len(self.dtype, shape)?;
        // Panels are cut along the last two dimensions, which must stay.
        let matrix = |shape: &[usize]| shape.len().checked_sub(2).map(|at| shape[at..].to_vec());
        if self.layout == Layout::Panels && matrix(shape) != matrix(&self.shape) {
            return Err(Error::Shape {
                op: "Data::set_shape",
                msg: format!("panels of {:?} cannot take the shape {shape:?}", self.shape),
            });
        }
        let capacity = match &self.storage {
            Storage::Owned(chunks) => chunks.len() * 64,
            #[cfg(unix)]
            Storage::Huge(buffer) => buffer.len(),
            Storage::Mapped { len, .. } => *len,
            Storage::Device(buffer) => buffer.len(),
        };
        if len > capacity {
            return Err(Error::Shape {
                op: "Data::set_shape",
                msg: format!("shape {shape:?} needs {len} bytes, storage holds {capacity}"),
            });
        }
        if let Storage::Mapped { len: mapped, .. } = &mut self.storage {
            *mapped = len;
        }
        // In place, so that reshaping a scratch tensor allocates nothing.
        self.shape.clear();
        self.shape.extend_from_slice(shape);
        set_row_major_strides(shape, &mut self.strides);
        self.id = next_id();
        Ok(())
    }

    /// The elements as little-endian bytes.
    ///
    /// Errors: [`Error::Placement`] for a tensor in device memory the host cannot address
    /// ([`DeviceBuffer::host_view`]).
    pub fn bytes(&self) -> Result<&[u8]> {
        let len = self.size_bytes();
        match &self.storage {
            Storage::Owned(chunks) => Ok(&bytemuck::cast_slice(chunks)[..len]),
            #[cfg(unix)]
            Storage::Huge(buffer) => Ok(&buffer[..len]),
            Storage::Mapped { map, offset, .. } => Ok(&map[*offset..*offset + len]),
            Storage::Device(buffer) => match buffer.host_view() {
                Some(bytes) => Ok(&bytes[..len]),
                None => Err(self.not_on_host()),
            },
        }
    }

    /// The elements as mutable bytes.
    ///
    /// Errors: [`Error::ReadOnly`] for a tensor borrowed from a mapped file or a device
    /// buffer shared with a clone; [`Error::Placement`] for one in device memory the host
    /// cannot address.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        let len = self.size_bytes();
        if self
            .device_buffer()
            .is_some_and(|b| b.host_view().is_none())
        {
            return Err(self.not_on_host());
        }
        self.id = next_id();
        match &mut self.storage {
            Storage::Owned(chunks) => Ok(&mut bytemuck::cast_slice_mut(chunks)[..len]),
            #[cfg(unix)]
            Storage::Huge(buffer) => Ok(&mut buffer[..len]),
            Storage::Mapped { .. } => Err(Error::ReadOnly),
            Storage::Device(buffer) => Arc::get_mut(buffer)
                .and_then(|b| b.host_view_mut())
                .map(|bytes| &mut bytes[..len])
                .ok_or(Error::ReadOnly),
        }
    }

    fn check_dtype(&self, dtype: DataType, op: &'static str) -> Result<()> {
        if self.dtype == dtype {
            Ok(())
        } else {
            Err(Error::DType {
                op,
                msg: format!("expected {dtype}, found {}", self.dtype),
            })
        }
    }

    /// The elements as `f32`. Errors: [`Error::DType`] unless the dtype is F32.
    pub fn as_f32(&self) -> Result<&[f32]> {
        self.check_dtype(DataType::F32, "Data::as_f32")?;
        Ok(bytemuck::cast_slice(self.bytes()?))
    }

    /// The elements as mutable `f32`.
    ///
    /// Errors: [`Error::DType`] unless the dtype is F32; [`Error::ReadOnly`] if mapped.
    pub fn as_f32_mut(&mut self) -> Result<&mut [f32]> {
        self.check_dtype(DataType::F32, "Data::as_f32_mut")?;
        Ok(bytemuck::cast_slice_mut(self.bytes_mut()?))
    }

    /// The elements as `f16`. Errors: [`Error::DType`] unless the dtype is F16.
    pub fn as_f16(&self) -> Result<&[f16]> {
        self.check_dtype(DataType::F16, "Data::as_f16")?;
        Ok(bytemuck::cast_slice(self.bytes()?))
    }

    /// The elements as mutable `f16`.
    ///
    /// Errors: [`Error::DType`] unless the dtype is F16; [`Error::ReadOnly`] if mapped.
    pub fn as_f16_mut(&mut self) -> Result<&mut [f16]> {
        self.check_dtype(DataType::F16, "Data::as_f16_mut")?;
        Ok(bytemuck::cast_slice_mut(self.bytes_mut()?))
    }

    /// Writes `values` at elements `at..at + values.len()` of an f32 or f16 tensor, each value
    /// rounded to the nearest f16 (ties to even, `half`'s slice conversion: F16C's
    /// `vcvtps2ph` where the CPU has it) for an f16 one: how keys and values enter a KV cache.
    ///
    /// Errors: [`Error::DType`] for another dtype; [`Error::ReadOnly`] if mapped;
    /// [`Error::OutOfBounds`] if the elements are outside the tensor.
    pub fn write_f32(&mut self, at: usize, values: &[f32]) -> Result<()> {
        let len = self.numel();
        let end = at.checked_add(values.len()).filter(|&e| e <= len);
        let Some(end) = end else {
            return Err(Error::OutOfBounds(format!(
                "writing {} values at {at} of a tensor of {len}",
                values.len()
            )));
        };
        if self.dtype == DataType::F16 {
            self.as_f16_mut()?[at..end].convert_from_f32_slice(values);
        } else {
            self.as_f32_mut()?[at..end].copy_from_slice(values);
        }
        Ok(())
    }

    /// The elements as `bf16`. Errors: [`Error::DType`] unless the dtype is BF16.
    pub fn as_bf16(&self) -> Result<&[bf16]> {
        self.check_dtype(DataType::BF16, "Data::as_bf16")?;
        Ok(bytemuck::cast_slice(self.bytes()?))
    }

    /// The elements as `i32`. Errors: [`Error::DType`] unless the dtype is I32.
    pub fn as_i32(&self) -> Result<&[i32]> {
        self.check_dtype(DataType::I32, "Data::as_i32")?;
        Ok(bytemuck::cast_slice(self.bytes()?))
    }

    /// How the rows lie in the bytes: [`Layout::Rows`] for every tensor but those made by
    /// [`Data::to_panels`].
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// An owned copy with the rows of each trailing matrix `[m, cols]` in the CPU kernels'
    /// panels ([`crate::panels`]): the same dtype, shape, size and values, and the same
    /// [`Data::input_perm`]. Packed on the rayon pool, one matrix per task. A tensor in
    /// panels already is cloned. The pages of a mapped tensor are released after it
    /// (`Data::release_mapped_pages`), so that the file's copy does not stay resident
    /// beside the packed one.
    ///
    /// Errors: [`Error::DType`] for a dtype without panels ([`panels::has_panels`]);
    /// [`Error::Shape`] for fewer than two dimensions; [`Error::Placement`] for a tensor in
    /// device memory; [`Error::InvalidArgument`] if memory is exhausted.
    pub fn to_panels(&self) -> Result<Data> {
        if self.layout == Layout::Panels {
            return Ok(self.clone());
        }
        let &[.., m, cols] = self.shape.as_slice() else {
            return Err(Error::Shape {
                op: "Data::to_panels",
                msg: format!("shape {:?} has no rows of columns", self.shape),
            });
        };
        let mut out = Data::zeros(self.dtype, &self.shape)?;
        out.input_perm = self.input_perm.clone();
        let matrix = m * quant::row_bytes(self.dtype, cols).unwrap_or(0);
        let src = self.bytes()?;
        if matrix > 0 {
            out.bytes_mut()?
                .par_chunks_mut(matrix)
                .zip(src.par_chunks(matrix))
                .try_for_each(|(dst, src)| panels::pack(self.dtype, src, m, cols, dst))?;
        } else {
            panels::pack(self.dtype, src, m, cols, out.bytes_mut()?)?;
        }
        out.layout = Layout::Panels;
        // The packed copy is what the kernels read from now on.
        self.release_mapped_pages();
        Ok(out)
    }

    /// Tells the OS that this process no longer needs the pages of a tensor mapped from a
    /// file (`madvise(MADV_DONTNEED)`), once an owned copy of it has been made: they leave
    /// the process's resident memory, and a later read of the mapping (another view of the
    /// same bytes) faults them back in from the page cache, unchanged. Nothing for other
    /// storage, or on targets without `madvise`.
    pub(crate) fn release_mapped_pages(&self) {
        #[cfg(unix)]
        if let Storage::Mapped { map, offset, len } = &self.storage {
            // SAFETY: the files flm maps are shared read-only mappings (`Mmap::map`), so
            // MADV_DONTNEED only drops this process's page-table entries: every reference
            // into the mapping still reads the file's bytes, refaulted on access. Failure
            // changes nothing but the resident memory, so it is ignored.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, *offset, *len)
            };
        }
    }

    /// An owned copy in [`Layout::Rows`]: the inverse of [`Data::to_panels`]; a tensor in
    /// rows already is cloned.
    ///
    /// Errors: those of [`Data::to_panels`].
    pub fn to_rows(&self) -> Result<Data> {
        if self.layout == Layout::Rows {
            return Ok(self.clone());
        }
        let mut out = Data::zeros(self.dtype, &self.shape)?;
        out.input_perm = self.input_perm.clone();
        let row_bytes = quant::row_bytes(self.dtype, self.cols()).unwrap_or(0);
        let (m, cols, src) = (self.shape[self.shape.len() - 2], self.cols(), self.bytes()?);
        for (j, dst) in out.bytes_mut()?.chunks_exact_mut(row_bytes).enumerate() {
            panels::row(self.dtype, src, m, cols, j, dst)?;
        }
        Ok(out)
    }

    /// Writes row `r` of the tensor seen as `[rows, cols]` into `out` (`cols` values) as
    /// f32: a copy for f32, exact widening from f16/bf16, dequantisation (see
    /// [`crate::quant`]) from int8/int4.
    ///
    /// Errors: [`Error::OutOfBounds`] if `r >= rows` or `out.len() != cols`.
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) -> Result<()> {
        let cols = self.cols();
        if r >= self.rows() || out.len() != cols {
            return Err(Error::OutOfBounds(format!(
                "row {r} of {} values from {:?}",
                out.len(),
                self.shape
            )));
        }
        let bytes = self.bytes()?;
        match self.dtype {
            DataType::F32 => out.copy_from_slice(&bytemuck::cast_slice(bytes)[r * cols..][..cols]),
            DataType::F16 => {
                let src: &[f16] = bytemuck::cast_slice(bytes);
                out.iter_mut()
                    .zip(&src[r * cols..][..cols])
                    .for_each(|(o, v)| *o = v.to_f32());
            }
            DataType::BF16 => {
                let src: &[bf16] = bytemuck::cast_slice(bytes);
                out.iter_mut()
                    .zip(&src[r * cols..][..cols])
                    .for_each(|(o, v)| *o = v.to_f32());
            }
            DataType::I32 => {
                let src: &[i32] = bytemuck::cast_slice(bytes);
                out.iter_mut()
                    .zip(&src[r * cols..][..cols])
                    .for_each(|(o, &v)| *o = v as f32);
            }
            dtype => {
                let row_bytes = quant::row_bytes(dtype, cols).unwrap_or(0);
                if self.layout == Layout::Panels {
                    let m = self.shape[self.shape.len() - 2];
                    panels::dequantize_row(dtype, bytes, m, cols, r, out)?;
                } else {
                    quant::dequantize_row(dtype, &bytes[r * row_bytes..][..row_bytes], out);
                }
            }
        }
        Ok(())
    }

    /// Copies the elements into a `Vec<f32>` (see [`Data::row_to_f32`]).
    ///
    /// Errors: [`Error::Placement`] for a tensor in device memory.
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        let cols = self.cols();
        let mut out = vec![0.0; self.numel()];
        if cols > 0 {
            for (r, row) in out.chunks_exact_mut(cols).enumerate() {
                self.row_to_f32(r, row)?;
            }
        }
        Ok(out)
    }

    /// A new owned tensor with the same shape and values converted to `dtype`, row by row
    /// on the rayon pool (so converting a mapped tensor needs one row of f32 scratch per
    /// thread): round-to-nearest-even when narrowing floats (as `half` does), quantisation
    /// per [`crate::quant`] for the quantised dtypes (rows are the last dimension). The columns keep
    /// their order, and so the tensor keeps its [`Data::input_perm`].
    ///
    /// Errors: [`Error::DType`] for i32 (indices, not values).
    pub fn to_dtype(&self, dtype: DataType) -> Result<Data> {
        if dtype == DataType::I32 {
            return Err(Error::DType {
                op: "Data::to_dtype",
                msg: format!("{} to i32", self.dtype),
            });
        }
        self.convert(dtype, None)
    }

    /// [`Data::to_dtype`]'s conversion, its quantised rows fitted with `importance` where
    /// given ([`quant::quantize_row_weighted`]).
    fn convert(&self, dtype: DataType, importance: Option<&[f32]>) -> Result<Data> {
        let mut out = Data::zeros(dtype, &self.shape)?;
        out.input_perm = self.input_perm.clone();
        let cols = self.cols();
        let out_row = dtype.byte_len(&[cols]).unwrap_or(0);
        if cols == 0 || out_row == 0 {
            return Ok(out);
        }
        out.bytes_mut()?
            .par_chunks_mut(out_row)
            .enumerate()
            .try_for_each_init(
                || vec![0.0f32; cols],
                |row, (r, dst)| {
                    self.row_to_f32(r, row)?;
                    match dtype {
                        DataType::F32 => dst.copy_from_slice(bytemuck::cast_slice(row)),
                        DataType::F16 => {
                            let dst: &mut [f16] = bytemuck::cast_slice_mut(dst);
                            dst.iter_mut()
                                .zip(row.iter())
                                .for_each(|(d, v)| *d = f16::from_f32(*v));
                        }
                        DataType::BF16 => {
                            let dst: &mut [bf16] = bytemuck::cast_slice_mut(dst);
                            dst.iter_mut()
                                .zip(row.iter())
                                .for_each(|(d, v)| *d = bf16::from_f32(*v));
                        }
                        dtype => quant::quantize_row_weighted(dtype, row, importance, dst),
                    }
                    Ok(())
                },
            )?;
        Ok(out)
    }

    /// A new owned matrix `[rows, cols]` of `dtype` (a quantised dtype) from this 2-D tensor
    /// of any dtype that holds values, as [`Data::to_dtype`] makes it, with each quantised
    /// block fitted to minimise the squared error weighted by `importance` (llama.cpp's
    /// imatrix: one non-negative weight per input column, the mean of `x_j²` over
    /// calibration activations, applied to every row), per
    /// [`quant::quantize_row_weighted`] (the block weights and searches of llama.cpp's
    /// `ggml-quants.c`: `quantize_row_q4_K_impl`, `quantize_row_q5_K_impl`,
    /// `quantize_row_q6_K_impl`, `make_qkx3_quants`, `make_qx_quants`, `make_qp_quants`,
    /// `quantize_row_iq4_nl_impl`). Q8_0, MXFP4 and the float dtypes ignore importance, so
    /// for them this is [`Data::to_dtype`].
    ///
    /// Errors: [`Error::Shape`] if the tensor is not 2-D; [`Error::InvalidArgument`] if
    /// `importance` is not of `cols` values or holds a negative or non-finite one;
    /// [`Error::DType`] for i32 (as [`Data::to_dtype`]).
    pub fn to_dtype_weighted(&self, dtype: DataType, importance: &[f32]) -> Result<Data> {
        const OP: &str = "Data::to_dtype_weighted";
        if self.shape.len() != 2 {
            return Err(Error::Shape {
                op: OP,
                msg: format!("a 2-D tensor, not {:?}", self.shape),
            });
        }
        let cols = self.cols();
        if importance.len() != cols {
            return Err(Error::InvalidArgument(format!(
                "{OP}: {} importance values for {cols} columns",
                importance.len()
            )));
        }
        if let Some((j, v)) = importance
            .iter()
            .enumerate()
            .find(|(_, v)| !(v.is_finite() && **v >= 0.0))
        {
            return Err(Error::InvalidArgument(format!(
                "{OP}: importance {v} of column {j} is not a finite non-negative number"
            )));
        }
        if dtype == DataType::I32 {
            return self.to_dtype(dtype);
        }
        self.convert(dtype, Some(importance))
    }
}

impl std::fmt::Debug for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Data")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("mapped", &self.is_mapped())
            .field("location", &self.location())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_are_aligned_and_reshapable() {
        let mut d = Data::zeros(DataType::F32, &[4, 3]).unwrap();
        assert_eq!(d.as_f32().unwrap().len(), 12);
        assert_eq!(d.bytes().unwrap().as_ptr() as usize % 64, 0);
        d.set_shape(&[2, 3]).unwrap();
        assert_eq!((d.rows(), d.cols()), (2, 3));
        assert!(d.set_shape(&[100, 3]).is_err());
    }

    #[test]
    fn dtype_conversion_round_trips_representable_values() {
        let d = Data::from_f32(&[4], &[1.0, -2.5, 0.125, 3.0]).unwrap();
        for dt in [DataType::F16, DataType::BF16] {
            assert_eq!(
                d.to_dtype(dt).unwrap().to_f32_vec().unwrap(),
                d.to_f32_vec().unwrap()
            );
        }
        assert!(d.as_f16().is_err());
    }

    #[test]
    fn id_is_renewed_by_clones_and_writes_only() {
        let mut d = Data::from_f32(&[2], &[1.0, 2.0]).unwrap();
        let id = d.id();
        assert_eq!(d.as_f32().unwrap(), &[1.0, 2.0]);
        assert_eq!(d.id(), id);
        assert_ne!(d.clone().id(), id);
        d.as_f32_mut().unwrap()[0] = 3.0;
        assert_ne!(d.id(), id);
    }

    #[test]
    fn from_bytes_checks_length() {
        assert!(Data::from_bytes(DataType::F32, &[2], &[0u8; 7]).is_err());
    }
}
