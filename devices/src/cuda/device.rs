//! [`CudaDevice`]: one NVIDIA GPU, its stream, cuBLAS, the compiled kernels of
//! [`super::kernels`] and the cache of uploaded host weights.
//!
//! Its ops (see [`super::dispatch`]) read and write tensors that live in its memory
//! ([`super::CudaBuffer`], placed there by the executor: `--gpu-layers`) in place, int8 and
//! int4 ones in the GPU GEMV layout they were uploaded in (`upload_tensor`). Tensors
//! in host memory are the per-op offload: host weights are uploaded once, the first time
//! an op reads them, and kept for as long as their [`Data::id`] stays the same (a Linear's
//! f16/bf16/int8/int4 weight repacked into its GPU GEMV layout, [`crate::gemv_layout`],
//! as is an int8/int4 embedding table; quantised weights staying quantised); host activations, token ids and the KV
//! cache rows an attention op reads are copied in for each op and its output copied back.
//! A decode step whose operands all live here can be captured as a CUDA graph and
//! replayed ([`super::graph`]); the device runs on a stream of its own for that (the legacy
//! default stream cannot be captured).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, PushKernelArg,
    ValidAsZeroBits,
};
use flm_core::{BaseDevice, Data, DataType, Error, Result, RopeTable};

use super::graph::Capture;
use super::kernels::{has_quant_kernels, FloatWeight, Kernel, MODULES};
use super::launch::{dev_err, grid};
use super::nvrtc;
use super::ptx_cache::PtxCache;
use super::GpuInfo;
use crate::gemv_layout::GemvLayout;

/// The CUDA device: one GPU, one stream, the compiled kernels and the uploaded weights.
///
/// Batch invariance ([`flm_core::BaseDevice::require_batch_invariance`]): every kernel computes an
/// input row on its own (the GEMV kernels take up to eight rows per weight read, each summed
/// in the same order whatever its neighbours) except cuBLAS, whose algorithm
/// depends on the batch; once asked, f16/bf16 Linears take the GEMV kernels whatever the
/// row count, and Linears with f32 weights are left to the next device (the CPU).
pub struct CudaDevice {
    pub(super) stream: Arc<CudaStream>,
    pub(super) blas: CudaBlas,
    info: GpuInfo,
    pub(super) ordinal: u32,
    functions: HashMap<Kernel, CudaFunction>,
    weights: WeightCache,
    packed: WeightCache,
    /// The f16 scratch of the quantised prefill ([`super::dequant`]), grown on demand.
    f16_scratch: Mutex<CudaSlice<u16>>,
    /// RoPE tables' cos and sin rows by [`RopeTable::id`], uploaded once each.
    rope_tables: Mutex<HashMap<u64, Arc<RopeRows>>>,
    pub(super) batch_invariant: AtomicBool,
    /// The paged ops' row metadata of the current step ([`super::paged::Uploads`]).
    pub(super) paged_uploads: Mutex<super::paged::Uploads>,
    /// cuBLAS's workspace, set once so that a captured GEMM allocates nothing.
    _blas_workspace: CudaSlice<u8>,
    /// The step being captured ([`super::graph`]).
    pub(super) capture: Mutex<Option<Capture>>,
    /// Whether `capture` holds one (read by every upload and download).
    pub(super) capturing: AtomicBool,
    /// Unique per device opened, so a captured step replays only where it was captured.
    pub(super) instance: u64,
}

/// Uploaded weights by [`Data::id`].
type WeightCache = Mutex<HashMap<u64, Arc<CudaSlice<u8>>>>;

/// A RoPE table's `[max_pos, rotary_dim / 2]` cos and sin rows in GPU memory.
pub(super) struct RopeRows {
    pub cos: CudaSlice<f32>,
    pub sin: CudaSlice<f32>,
}

/// cuBLAS's workspace: 32 MiB, what cuBLAS itself takes on Hopper (its documentation of
/// `cublasSetWorkspace`), so that no GEMM allocates inside a captured step.
const BLAS_WORKSPACE: usize = 32 << 20;

/// The [`CudaDevice::instance`] of the next device opened.
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

impl CudaDevice {
    /// Opens GPU `ordinal`, compiles (or loads from the disk cache) every kernel module for
    /// its compute capability and starts cuBLAS on the device's stream.
    ///
    /// Errors: a one-line reason (no driver library, no device, no libnvrtc or libcublas,
    /// a module that does not compile or load).
    pub fn new(ordinal: usize) -> std::result::Result<CudaDevice, String> {
        let (ctx, info) = super::probe(ordinal)?;
        if !nvrtc::available() {
            return Err("libnvrtc not found".into());
        }
        // SAFETY: only asks the dynamic loader whether libcublas opens.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err("libcublas not found".into());
        }
        let cache = PtxCache::default_location();
        let functions =
            load_functions(&ctx, &info.arch(), cache.as_ref()).map_err(|e| e.to_string())?;
        // SAFETY: every operation of this device goes through its one stream, so cudarc's
        // events ordering buffers between streams are not needed; left on, they would make
        // a capture wait on events recorded outside it.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| format!("CUDA stream: {e}"))?;
        let blas = CudaBlas::new(Arc::clone(&stream)).map_err(|e| format!("cuBLAS: {e}"))?;
        let workspace = stream
            .alloc_zeros::<u8>(BLAS_WORKSPACE)
            .map_err(|e| format!("cuBLAS workspace: {e}"))?;
        {
            let (ptr, _sync) = workspace.device_ptr(&stream);
            // SAFETY: the workspace is a live device allocation of BLAS_WORKSPACE bytes on the
            // handle's stream, kept alive as long as the handle (both fields of the device).
            let status = unsafe {
                cudarc::cublas::sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    ptr as *mut std::ffi::c_void,
                    BLAS_WORKSPACE,
                )
            };
            if status != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(format!("cuBLAS workspace: {status:?}"));
            }
        }
        let f16_scratch = stream
            .alloc_zeros::<u16>(1)
            .map_err(|e| format!("scratch: {e}"))?;
        Ok(CudaDevice {
            stream,
            blas,
            info,
            ordinal: u32::try_from(ordinal).map_err(|_| format!("GPU ordinal {ordinal}"))?,
            functions,
            weights: Mutex::new(HashMap::new()),
            rope_tables: Mutex::new(HashMap::new()),
            packed: Mutex::new(HashMap::new()),
            f16_scratch: Mutex::new(f16_scratch),
            batch_invariant: AtomicBool::new(false),
            paged_uploads: Mutex::new(super::paged::Uploads::default()),
            _blas_workspace: workspace,
            capture: Mutex::new(None),
            capturing: AtomicBool::new(false),
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// `table`'s cos and sin rows in GPU memory, uploaded the first time and reused for
    /// its [`RopeTable::id`].
    pub(super) fn rope_rows(&self, table: &RopeTable) -> Result<Arc<RopeRows>> {
        cached_by_id(&self.rope_tables, table.id(), "RoPE table", || {
            Ok(RopeRows {
                cos: self.upload(table.cos_rows())?,
                sin: self.upload(table.sin_rows())?,
            })
        })
    }

    /// The GPU's properties.
    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    /// Whether batch invariance was asked for (see [`CudaDevice`]).
    pub(super) fn batch_invariant(&self) -> bool {
        self.batch_invariant.load(Ordering::Relaxed)
    }

    /// Whether this device runs [`flm_core::Op::Linear`] with these operands (f32 input): any float
    /// or quantised weight, but f32 weights when batch invariance was asked for (cuBLAS
    /// does not promise it).
    pub(super) fn supports_linear(
        &self,
        weight: &Data,
        bias: Option<&Data>,
        output: &Data,
    ) -> bool {
        let f32 = |d: &Data| d.dtype() == DataType::F32;
        let w = weight.dtype();
        (FloatWeight::of(w).is_some() || has_quant_kernels(w))
            && bias.is_none_or(f32)
            && f32(output)
            && !(w == DataType::F32 && self.batch_invariant())
    }

    /// The loaded kernel `kernel`.
    pub(super) fn function(&self, kernel: Kernel) -> Result<&CudaFunction> {
        self.functions
            .get(&kernel)
            .ok_or_else(|| Error::Device(format!("kernel {} is not loaded", kernel.name())))
    }

    /// The host weight `w` in GPU memory: its bytes as they are on the host, uploaded the
    /// first time and reused while `w.id()` is unchanged.
    pub(super) fn cached_weight(&self, w: &Data) -> Result<Arc<CudaSlice<u8>>> {
        self.cached(&self.weights, w, || Ok(Cow::Borrowed(w.bytes()?)))
    }

    /// The weight `w` repacked into the GPU GEMV `layout` ([`crate::gemv_layout`]) in GPU
    /// memory, packed and uploaded the first time (from its host bytes, or from a download
    /// of its buffer when it lives on this GPU in another layout: f16/bf16 rows of
    /// `cols % 8 != 0` values) and reused while `w.id()` is unchanged. A tied classifier and
    /// embedding table, one tensor, share the upload.
    pub(super) fn packed_weight(
        &self,
        w: &Data,
        layout: &GemvLayout,
    ) -> Result<Arc<CudaSlice<u8>>> {
        self.cached(&self.packed, w, || match w.device_buffer() {
            None => Ok(Cow::Owned(layout.pack(w.bytes()?)?)),
            Some(buffer) => {
                let mut host = Data::zeros(w.dtype(), w.shape())?;
                self.download_tensor(buffer, &mut host)?;
                Ok(Cow::Owned(layout.pack(host.bytes()?)?))
            }
        })
    }

    /// The upload of `bytes()` in `cache` under `w.id()`, made the first time.
    fn cached<'w>(
        &self,
        cache: &WeightCache,
        w: &'w Data,
        bytes: impl FnOnce() -> Result<Cow<'w, [u8]>>,
    ) -> Result<Arc<CudaSlice<u8>>> {
        cached_by_id(cache, w.id(), "weight", || {
            self.refuse_in_capture("uploading a weight")?;
            self.stream.clone_htod(&*bytes()?).map_err(dev_err)
        })
    }

    /// The device's f16 scratch, at least `len` values, locked for the caller's op. Its
    /// kernels run on the device's one stream, so an op's writes to it come after every
    /// earlier op's reads; it only grows, to the largest request seen.
    pub(super) fn f16_scratch(&self, len: usize) -> Result<MutexGuard<'_, CudaSlice<u16>>> {
        let mut scratch = self
            .f16_scratch
            .lock()
            .map_err(|_| Error::Device("f16 scratch poisoned".into()))?;
        if scratch.len() < len {
            // Memory allocated inside a captured step would belong to its graph.
            self.refuse_in_capture("growing the f16 scratch")?;
            *scratch = self.stream.alloc_zeros::<u16>(len).map_err(dev_err)?;
        }
        Ok(scratch)
    }

    /// Seconds per call of `f`, the mean of `reps` calls timed by CUDA events on the
    /// device's stream: `f` should only queue work (operands resident, no download). A
    /// `hold_stream` kernel holds the stream while the calls are queued, so that the events
    /// time the GPU's work rather than the host's launches (nvbench's blocking kernel).
    ///
    /// Errors: those of `f` and of the launches; [`Error::Device`] when the hold ended
    /// before the last call was queued (the host launches slower than the GPU runs them,
    /// so the figure would time the launches).
    pub fn time_queued(&self, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        const HOLD_NS: u64 = 20_000_000;
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let hold = self.function(Kernel::HoldStream)?;
        let mut b = self.stream.launch_builder(hold);
        b.arg(&HOLD_NS);
        // SAFETY: `hold_stream(unsigned long long)` takes one value and touches no memory.
        unsafe { b.launch(grid((1, 1, 1), 32, 0)?) }.map_err(dev_err)?;
        let start = self.stream.record_event(timing).map_err(dev_err)?;
        for _ in 0..reps {
            f()?;
        }
        let end = self.stream.record_event(timing).map_err(dev_err)?;
        let held = !start.try_is_complete().map_err(dev_err)?;
        let ms = start.elapsed_ms(&end).map_err(dev_err)?;
        if !held {
            return Err(Error::Device(format!(
                "{reps} calls took longer to queue than the {} ms hold",
                HOLD_NS / 1_000_000
            )));
        }
        Ok(f64::from(ms) / 1e3 / reps.max(1) as f64)
    }

    /// A copy of `values` in GPU memory.
    ///
    /// Errors: [`Error::Device`] inside a captured step (a host copy cannot be replayed).
    pub(super) fn upload<T: DeviceRepr>(&self, values: &[T]) -> Result<CudaSlice<T>> {
        self.refuse_in_capture("a host upload")?;
        self.stream.clone_htod(values).map_err(dev_err)
    }

    /// `n` zeroed values in GPU memory.
    pub(super) fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>> {
        self.stream.alloc_zeros(n.max(1)).map_err(dev_err)
    }

    /// Copies `src` back into the host slice `dst` and waits for the stream.
    pub(super) fn download<T: DeviceRepr>(&self, src: &CudaSlice<T>, dst: &mut [T]) -> Result<()> {
        self.refuse_in_capture("a download")?;
        self.stream.memcpy_dtoh(src, dst).map_err(dev_err)?;
        self.stream.synchronize().map_err(dev_err)
    }

    /// Checks the flag a kernel sets on bad input (a token id or a position out of range).
    /// Inside a capture it checks nothing: a replay checks its inputs on the host first
    /// ([`flm_core::StepBounds`]).
    pub(super) fn check_flag(
        &self,
        flag: &CudaSlice<i32>,
        what: impl FnOnce() -> Error,
    ) -> Result<()> {
        if self.capturing() {
            return Ok(());
        }
        let mut v = [0i32];
        self.download(flag, &mut v)?;
        if v[0] == 0 {
            Ok(())
        } else {
            Err(what())
        }
    }
}

/// The value of `cache` under `id`, made by `make` and kept the first time.
fn cached_by_id<V>(
    cache: &Mutex<HashMap<u64, Arc<V>>>,
    id: u64,
    what: &str,
    make: impl FnOnce() -> Result<V>,
) -> Result<Arc<V>> {
    let mut cache = cache
        .lock()
        .map_err(|_| Error::Device(format!("{what} cache poisoned")))?;
    if let Some(v) = cache.get(&id) {
        return Ok(Arc::clone(v));
    }
    let v = Arc::new(make()?);
    cache.insert(id, Arc::clone(&v));
    Ok(v)
}

fn load_functions(
    ctx: &Arc<CudaContext>,
    arch: &str,
    cache: Option<&PtxCache>,
) -> Result<HashMap<Kernel, CudaFunction>> {
    let mut functions = HashMap::new();
    for module in MODULES {
        let ptx = nvrtc::compile_cached(module, arch, cache)?;
        let loaded = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(|e| Error::Device(format!("loading module {}: {e}", module.name)))?;
        for &kernel in module.kernels {
            let name = kernel.name();
            let f = loaded
                .load_function(name)
                .map_err(|e| Error::Device(format!("kernel {name}: {e}")))?;
            functions.insert(kernel, f);
        }
    }
    Ok(functions)
}
