//! Models: loading, freeing, tokenizing and detokenizing.

use std::ffi::c_char;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use flm_core::{BaseDevice, CheckedOp, Executor, KvDtype, Location, Op};
use flm_devices::{ActivationBits, CpuDevice, DeviceChoice};
use flm_models::{session, GpuLayers, SharedModel};
use flm_tokenizer::Tokenizer;

use crate::status::{
    arg_c_str, arg_ref, arg_slice, arg_str, free_handle, guard, new_handle, write_out, Failure,
    FlmStatus,
};

/// Options of flm_model_load(). A zero-initialised struct (`FlmModelOptions o = {0};`)
/// asks for the defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FlmModelOptions {
    /// Worker threads of the model's thread pool, shared by all its sessions; 0: one per
    /// CPU core; at most 4096.
    pub threads: usize,
    /// NUL-terminated device name: "cpu"; "cuda" (a CUDA GPU runs every op it supports,
    /// on the layers `gpu_layers` places in its memory, and the CPU the rest;
    /// FLM_STATUS_INVALID_ARGUMENT saying why when there is no usable GPU or the library was
    /// built without the `cuda` feature); or "auto" ("cuda" when a usable GPU is present,
    /// else "cpu"). NULL means "auto". Borrowed for the call only.
    pub device: *const c_char,
    /// Positions of each session's KV cache (the context length), capped at the model's;
    /// 0: the model's context, at most 4096.
    pub context: usize,
    /// Precision of the activations that int8, int4, K-quant and Q8_0 weights are dotted
    /// against on the CPU: 0 or 8, int8 blocks (as llama.cpp; the fastest); 16, int8 codes
    /// plus their rounding residual (the logits of unrounded activations, at twice the
    /// integer work). Any other value is FLM_STATUS_INVALID_ARGUMENT.
    pub activation_bits: u32,
    /// NUL-terminated element type of each session's KV cache: "f32"; "f16" (half the
    /// bytes attention reads, each key and value rounded to the nearest f16 as it is
    /// stored); or "auto" (f16 for a cache in a GPU's memory, f32 in host memory, where the
    /// caches of libflm's sessions live). NULL means "auto"; any other name is
    /// FLM_STATUS_INVALID_ARGUMENT. Borrowed for the call only.
    pub kv_dtype: *const c_char,
    /// NUL-terminated number of the model's first layers whose weights, KV caches and
    /// activations live in the GPU's memory (the rest in host memory, run by the CPU), as
    /// the CLI's `--gpu-layers`: "auto" places as many as the GPU's free memory holds after
    /// their KV caches; "0" keeps them all in host memory, the GPU running their ops one at
    /// a time from there. NULL means "auto"; without a GPU "auto" places nothing and a count
    /// above 0 is FLM_STATUS_INVALID_ARGUMENT, as is anything but "auto" or a count.
    /// Llama-graph models (ChatGLM-6B's graph stays in host memory under "auto").
    /// Borrowed for the call only.
    pub gpu_layers: *const c_char,
}

/// The CPU device with its parallel loops on the model's own thread pool instead of
/// rayon's global one: each op is run inside `pool.install`, so the generation loop (and
/// the caller's callback) stays on the caller's thread while the ops use `threads`
/// workers. Dropping it (when the model and all its sessions are freed) joins the
/// workers, so a host that frees everything leaves no flm thread behind.
///
/// Cost: one hand-over to the pool per op, some microseconds: noise for real models, but
/// most of the time of a model whose ops take microseconds (stories260K). Entering the
/// pool once per forward pass would remove it.
struct PooledCpu {
    pool: rayon::ThreadPool,
    cpu: CpuDevice,
    /// Dropped after `pool` (fields drop in declaration order), which tells the workers to
    /// exit.
    _workers: Workers,
}

/// The worker threads of a pool, joined on drop.
struct Workers(Vec<JoinHandle<()>>);

impl Drop for Workers {
    fn drop(&mut self) {
        for worker in self.0.drain(..) {
            // A worker that panicked has nothing left to clean up.
            let _ = worker.join();
        }
    }
}

/// Bound on `FlmModelOptions.threads`, far above any core count, so that a garbage value
/// is refused instead of exhausting the process's threads.
const MAX_THREADS: usize = 4096;

impl BaseDevice for PooledCpu {
    fn name(&self) -> &'static str {
        self.cpu.name()
    }

    fn supports(&self, op: &Op<'_>) -> bool {
        self.cpu.supports(op)
    }

    fn run(&self, op: CheckedOp<'_>) -> flm_core::Result<()> {
        self.pool.install(|| self.cpu.run(op))
    }

    fn require_batch_invariance(&self) {
        self.cpu.require_batch_invariance()
    }
}

/// A loaded model (opaque): weights, tokenizer and executor (devices, thread pool),
/// shared by its sessions.
pub struct FlmModel {
    pub(crate) model: SharedModel,
    pub(crate) tokenizer: Arc<Tokenizer>,
    pub(crate) exec: Arc<Executor>,
}

/// The NUL-terminated option `ptr` named `name` as UTF-8, "auto" when NULL.
///
/// # Safety
/// `ptr` must be NULL or a NUL-terminated string (the FlmModelOptions docs).
unsafe fn option_name<'a>(ptr: *const c_char, name: &'static str) -> Result<&'a str, Failure> {
    if ptr.is_null() {
        return Ok("auto");
    }
    // SAFETY: `ptr` is NUL-terminated (this function's contract).
    let value = unsafe { arg_c_str(ptr, name) }?;
    value
        .to_str()
        .map_err(|_| Failure::new(FlmStatus::InvalidUtf8, format!("{name} is not valid UTF-8")))
}

/// The KV cache dtype of the options.
fn kv_dtype(options: &FlmModelOptions) -> Result<KvDtype, Failure> {
    // SAFETY: the caller passes a NUL-terminated name or NULL (FlmModelOptions docs).
    let name = unsafe { option_name(options.kv_dtype, "options->kv_dtype") }?;
    name.parse().map_err(|_| {
        Failure::new(
            FlmStatus::InvalidArgument,
            format!("options->kv_dtype is {name:?}: f32, f16 or auto"),
        )
    })
}

/// The GPU layers of the options.
fn gpu_layers(options: &FlmModelOptions) -> Result<GpuLayers, Failure> {
    // SAFETY: the caller passes a NUL-terminated count or NULL (FlmModelOptions docs).
    let name = unsafe { option_name(options.gpu_layers, "options->gpu_layers") }?;
    name.parse().map_err(|e: String| {
        Failure::new(
            FlmStatus::InvalidArgument,
            format!("options->gpu_layers: {e}"),
        )
    })
}

/// `model` with its first layers on the executor's GPU as `layers` says (see
/// [`FlmModelOptions::gpu_layers`]).
fn place(
    model: SharedModel,
    (exec, gpu): (&Executor, Option<Location>),
    layers: GpuLayers,
) -> Result<SharedModel, Failure> {
    match (gpu, layers) {
        (None, GpuLayers::Auto | GpuLayers::Count(0)) => Ok(model),
        (None, GpuLayers::Count(n)) => Err(Failure::new(
            FlmStatus::InvalidArgument,
            format!("options->gpu_layers is {n}, and no GPU runs the model"),
        )),
        // A graph that runs in host memory only stays there under the default.
        (Some(_), GpuLayers::Auto) if model.placement().is_none() => Ok(model),
        (Some(gpu), layers) => Ok(model.place_gpu_layers(exec, gpu, layers, false)?),
    }
}

/// The executor of a model's sessions, from the options' device and threads, and the
/// memory of its GPU when it has one.
fn executor(options: &FlmModelOptions) -> Result<(Executor, Option<Location>), Failure> {
    // SAFETY: the caller passes a NUL-terminated device name or NULL (FlmModelOptions docs).
    let device = unsafe { option_name(options.device, "options->device") }?;
    let choice: DeviceChoice = device
        .parse()
        .map_err(|e: String| Failure::new(FlmStatus::InvalidArgument, e))?;
    if options.threads > MAX_THREADS {
        return Err(Failure::new(
            FlmStatus::InvalidArgument,
            format!(
                "options->threads is {}, at most {MAX_THREADS} are allowed",
                options.threads
            ),
        ));
    }
    let activations = match options.activation_bits {
        0 | 8 => ActivationBits::Int8,
        16 => ActivationBits::Int16,
        bits => {
            return Err(Failure::new(
                FlmStatus::InvalidArgument,
                format!("options->activation_bits is {bits}: 0, 8 or 16"),
            ))
        }
    };
    let cpu = CpuDevice::new()?.with_activation_bits(activations);
    let mut workers = Vec::new();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(options.threads)
        .spawn_handler(|thread| {
            let name = format!("flm-worker-{}", thread.index());
            let handle = std::thread::Builder::new()
                .name(name)
                .spawn(|| thread.run())?;
            workers.push(handle);
            Ok(())
        })
        .build()
        .map_err(|e| {
            Failure::new(
                FlmStatus::InvalidArgument,
                format!("cannot start {} threads: {e}", options.threads),
            )
        })?;
    // The GPU, when one is chosen, then the pooled CPU in place of the selection's own.
    let mut devices: Vec<Box<dyn BaseDevice>> = match choice {
        DeviceChoice::Cpu => Vec::new(),
        choice => flm_devices::select(choice, CpuDevice::new()?)?
            .devices
            .into_iter()
            .filter(|d| d.location() != Location::Host)
            .collect(),
    };
    let gpu = devices.first().map(|d| d.location());
    devices.push(Box::new(PooledCpu {
        pool,
        cpu,
        _workers: Workers(workers),
    }));
    Ok((Executor::new(devices), gpu))
}

/// Loads the model at `path` (NUL-terminated; a llama2.c `.bin`, a `.flm` file, a GGUF
/// file or a Hugging Face directory, detected from the bytes) with the tokenizer inside
/// or beside it.
///
/// `options` may be NULL (the defaults). On success `*out_model` receives a new handle
/// that the caller owns and frees with flm_model_free(); on failure it is set to NULL.
///
/// Errors: FLM_STATUS_NULL_POINTER (`path` or `out_model`), FLM_STATUS_IO (a missing or
/// unreadable file), FLM_STATUS_FORMAT (a malformed model or tokenizer),
/// FLM_STATUS_INVALID_ARGUMENT / FLM_STATUS_INVALID_UTF8 (options).
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string; `options` NULL or a valid struct;
/// `out_model` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn flm_model_load(
    path: *const c_char,
    options: *const FlmModelOptions,
    out_model: *mut *mut FlmModel,
) -> FlmStatus {
    let load = || {
        // SAFETY: `path` is NULL or NUL-terminated (this function's contract).
        let path = unsafe { arg_c_str(path, "path") }?;
        let defaults = FlmModelOptions {
            threads: 0,
            device: std::ptr::null(),
            context: 0,
            activation_bits: 0,
            kv_dtype: std::ptr::null(),
            gpu_layers: std::ptr::null(),
        };
        // SAFETY: `options` is NULL or valid (this function's contract).
        let options = unsafe { options.as_ref() }.unwrap_or(&defaults);
        let (exec, gpu) = executor(options)?;
        let kv_dtype = kv_dtype(options)?;
        let gpu_layers = gpu_layers(options)?;
        let context = (options.context > 0).then_some(options.context);
        let path = Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()));
        let (model, tokenizer) = session::load_model(path, None, context)?;
        let model = place(model.with_kv_dtype(kv_dtype)?, (&exec, gpu), gpu_layers)?;
        Ok(FlmModel {
            model,
            tokenizer: Arc::new(tokenizer),
            exec: Arc::new(exec),
        })
    };
    // SAFETY: `out_model` is NULL or writable (this function's contract).
    unsafe { new_handle(out_model, "out_model", load) }
}

/// Frees a model handle. Sessions created from it stay usable (they keep what they need
/// alive). NULL is ignored.
///
/// # Safety
/// `model` must be NULL or a handle from flm_model_load() not freed before, and no other
/// thread may be using it.
#[no_mangle]
pub unsafe extern "C" fn flm_model_free(model: *mut FlmModel) {
    // SAFETY: this function's contract.
    unsafe { free_handle(model) }
}

/// Encodes `text_len` bytes of UTF-8 `text` into token ids, with the begin-of-sequence
/// token first if `add_bos`. `*n_ids` receives the number of ids the text encodes to;
/// they are written to `ids` (capacity `ids_capacity` elements, owned by the caller) when
/// they fit, else FLM_STATUS_BUFFER_TOO_SMALL is returned and nothing is written. Pass
/// `ids = NULL, ids_capacity = 0` to ask for the size.
///
/// Errors: FLM_STATUS_NULL_POINTER, FLM_STATUS_INVALID_UTF8, FLM_STATUS_BUFFER_TOO_SMALL,
/// FLM_STATUS_INVALID_ARGUMENT (`add_bos` with a tokenizer that has no BOS token),
/// FLM_STATUS_TOKENIZER (the tokenizer cannot cut this text).
///
/// # Safety
/// `model` must be NULL or a live handle; `text` NULL or `text_len` readable bytes; `ids`
/// NULL or `ids_capacity` writable elements; `n_ids` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn flm_tokenize(
    model: *const FlmModel,
    text: *const c_char,
    text_len: usize,
    add_bos: bool,
    ids: *mut u32,
    ids_capacity: usize,
    n_ids: *mut usize,
) -> FlmStatus {
    guard(|| {
        // SAFETY: the pointers satisfy this function's contract.
        let model = unsafe { arg_ref(model, "model") }?;
        // SAFETY: as above.
        let text = unsafe { arg_str(text, text_len, "text") }?;
        let encoded = model.tokenizer.encode(text, add_bos)?;
        // SAFETY: as above.
        unsafe { copy_out(&encoded, ids, ids_capacity, n_ids, ("ids", "n_ids")) }
    })
}

/// Decodes `n_ids` token ids into UTF-8 text, not NUL-terminated, as SentencePiece
/// `Decode` does (control tokens as nothing, the leading space of the first piece
/// dropped). `*text_len` receives the length in bytes; the text is
/// written to `text` (capacity `text_capacity` bytes, owned by the caller) when it fits,
/// else FLM_STATUS_BUFFER_TOO_SMALL is returned and nothing is written. Pass
/// `text = NULL, text_capacity = 0` to ask for the size.
///
/// Errors: FLM_STATUS_NULL_POINTER, FLM_STATUS_TOKEN_OUT_OF_RANGE (an id outside the
/// vocabulary), FLM_STATUS_BUFFER_TOO_SMALL.
///
/// # Safety
/// `model` must be NULL or a live handle; `ids` NULL or `n_ids` readable elements; `text`
/// NULL or `text_capacity` writable bytes; `text_len` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn flm_detokenize(
    model: *const FlmModel,
    ids: *const u32,
    n_ids: usize,
    text: *mut c_char,
    text_capacity: usize,
    text_len: *mut usize,
) -> FlmStatus {
    guard(|| {
        // SAFETY: the pointers satisfy this function's contract.
        let model = unsafe { arg_ref(model, "model") }?;
        // SAFETY: as above.
        let ids = unsafe { arg_slice(ids, n_ids, "ids") }?;
        let decoded = model.tokenizer.decode(ids)?;
        // SAFETY: as above.
        unsafe {
            copy_out(
                decoded.as_bytes(),
                text.cast::<u8>(),
                text_capacity,
                text_len,
                ("text", "text_len"),
            )
        }
    })
}

/// Writes the number of `values` to `*len`, then copies them to the caller's buffer `out`
/// of `capacity` elements if they fit: the counted results of the entry points, whose
/// callers may ask for the size first. `names` are those of `out` and `len` in messages.
///
/// # Safety
/// `len` must be NULL or valid for a write; a non-null `out` must be valid for `capacity`
/// writes of `T`, not overlapping `values`.
pub(crate) unsafe fn copy_out<T: Copy>(
    values: &[T],
    out: *mut T,
    capacity: usize,
    len: *mut usize,
    (what, len_what): (&str, &str),
) -> Result<FlmStatus, Failure> {
    // SAFETY: `len` is NULL or valid for a write (this function's contract).
    unsafe { write_out(len, values.len(), len_what) }?;
    if values.len() > capacity {
        return Err(Failure::new(
            FlmStatus::BufferTooSmall,
            format!(
                "{what} holds {capacity} elements, {} are needed",
                values.len()
            ),
        ));
    }
    if values.is_empty() {
        return Ok(FlmStatus::Ok);
    }
    if out.is_null() {
        return Err(Failure::new(
            FlmStatus::NullPointer,
            format!("{what} is NULL"),
        ));
    }
    // SAFETY: `out` is non-null and valid for `capacity >= values.len()` writes and does
    // not overlap `values` (this function's contract).
    unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), out, values.len()) };
    Ok(FlmStatus::Ok)
}
