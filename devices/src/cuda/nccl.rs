//! [`NcclGroup`]: a [`Communicator`] whose ranks each drive one GPU and move data with
//! NCCL (NVIDIA's collective library), through cudarc with `libnccl` loaded at run time.
//!
//! A group starts through another group, its bootstrap ([`NcclGroup::over`]: an MPI group
//! under `mpirun`, or a [`LocalGroup`] of threads): rank 0 creates NCCL's unique id and
//! broadcasts it over the bootstrap, then every rank joins the NCCL communicator on its
//! GPU. The group keeps the bootstrap for what NCCL does not do:
//! - every collective opens with the header exchange of [`flm_core::comm::header`] over
//!   the bootstrap, so that ranks that disagree (collective, length, root) all return the
//!   same error before any NCCL call, which would wait forever or read past a buffer;
//! - [`Communicator::abort`] aborts the bootstrap too, which ends an MPI job or ends the
//!   collectives of a local group's other threads, where NCCL would leave them waiting.
//!
//! The collectives of the trait move host slices through device buffers kept in the group
//! (grown as needed). The sum of [`Communicator::all_reduce_sum`] is an NCCL all-gather
//! then a sum in rank order on the host, since `ncclAllReduce` sums in the order of the
//! algorithm it picks (ring, tree) and the bits must be those of [`LocalGroup`]. While
//! NCCL runs, the host polls the stream and `ncclCommGetAsyncError`, as NCCL's
//! documentation of fault tolerance asks, so that a failed transfer or an abort on another
//! thread ends the wait with an error and `ncclCommAbort`. Only a failure inside NCCL or
//! CUDA can stop a rank after the headers agreed, and only NCCL can tell the others then
//! (through their asynchronous error); so too for a failure inside NCCL's own start
//! (`ncclCommInitRank`) after the other ranks entered it.
//! [`NcclGroup::all_reduce_sum_device`] sums GPU memory in place, in NCCL's own order.
//!
//! NCCL allows one rank per GPU in a communicator: a group of `n` ranks needs `n` GPUs.

use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtrMut, DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::result as nccl;
use cudarc::nccl::sys;
use flm_core::comm::header::{
    agree, Header, ALL_GATHER, ALL_REDUCE, BARRIER, BROADCAST, DEVICE_ALL_REDUCE,
};
use flm_core::comm::{Communicator, LocalGroup};
use flm_core::{Error, Result};

/// The oldest NCCL whose symbols the group calls (`ncclGetLastError` came with 2.13), in
/// `ncclGetVersion`'s code: major·10000 + minor·100 + patch.
const MIN_VERSION: c_int = 2_13_00;

/// Polls of a collective in progress before the wait starts yielding the core.
const SPINS: u32 = 2_000;
/// Polls before it starts sleeping.
const YIELDS: u32 = 20_000;
/// The sleep between polls of a long wait.
const NAP: Duration = Duration::from_micros(50);

/// f32s per encoded [`Header`]: each of its four u64 words in four 16-bit pieces.
const PIECES: usize = 16;

/// Whether `libnccl` can be loaded. cudarc asks the dynamic loader for `libnccl.so` (the
/// `libnccl-dev` package's link) and a few versioned names, but not `libnccl.so.2`, the
/// only name the runtime package and the `nvidia-nccl` wheels install; a `libnccl.so` link
/// to it in a directory on `LD_LIBRARY_PATH` serves.
pub fn available() -> bool {
    // SAFETY: this only asks the dynamic loader whether the library opens; no NCCL symbol
    // is called.
    unsafe { sys::is_culib_present() }
}

/// An NCCL communicator handle, null once aborted or destroyed.
struct Comm(sys::ncclComm_t);

// SAFETY: NCCL lets any thread use a communicator, one call at a time; the group's lock on
// its `State` keeps the calls one at a time.
unsafe impl Send for Comm {}

/// What a collective uses, held under the group's lock.
struct State {
    comm: Comm,
    /// Every rank's f32 operand, rank after rank (the all-gathers run in place in it).
    floats: Option<CudaSlice<f32>>,
    /// The bytes of a broadcast.
    bytes: Option<CudaSlice<u8>>,
    /// The all-gathered operands of an all-reduce, on the host.
    gathered: Vec<f32>,
    /// Every rank's encoded header.
    headers: Vec<f32>,
    /// Recorded after the work of a collective, polled until it completes.
    done: CudaEvent,
}

/// One rank of a group whose ranks each drive one GPU, over NCCL.
///
/// The collectives of [`Communicator`] take host slices; [`NcclGroup::all_reduce_sum_device`]
/// takes GPU memory. Calls are one at a time (a lock keeps them so), from any thread.
pub struct NcclGroup {
    rank: usize,
    n: usize,
    /// The GPU's ordinal.
    ordinal: usize,
    /// The stream of the host collectives, on the group's GPU.
    stream: Arc<CudaStream>,
    /// The group this one started through; it carries the headers and the aborts.
    bootstrap: Arc<dyn Communicator>,
    state: Mutex<State>,
    /// Whether the group has failed; `failure` then says how.
    failed: AtomicBool,
    /// The first failure: its rank and why.
    failure: Mutex<Option<(usize, String)>>,
    /// Nanoseconds spent in collectives.
    waited: AtomicU64,
}

impl NcclGroup {
    /// This process's rank of a new NCCL group with the ranks and size of `bootstrap`,
    /// on GPU `ordinal`; every rank of `bootstrap` calls it, each with its own GPU (NCCL
    /// allows one rank per GPU). Rank 0 creates NCCL's unique id and broadcasts it over
    /// `bootstrap`, then every rank joins the communicator (`ncclCommInitRank`).
    ///
    /// The group keeps `bootstrap` for the header of each collective and for aborts; the
    /// caller may keep using it, with the collectives of both in the same order on every
    /// rank. An MPI bootstrap is finalised when the last of its handles is dropped, which
    /// must be on the thread that created it.
    ///
    /// Errors: [`Error::Collective`] naming a rank that cannot start: no `libnccl` (see
    /// [`available`]) or one older than 2.13, no usable GPU `ordinal`, or an NCCL failure.
    /// That rank aborts `bootstrap`, so that the others do not wait for it: the other
    /// threads of a local group return the same error, and an MPI job ends.
    pub fn over(bootstrap: Arc<dyn Communicator>, ordinal: usize) -> Result<NcclGroup> {
        let (rank, n) = (bootstrap.rank(), bootstrap.world_size());
        let abort = |msg: String| {
            bootstrap.abort(&msg);
            Error::Collective { rank, msg }
        };
        let (stream, done) = open(ordinal).map_err(abort)?;
        let mut id = [0u8; 128];
        if rank == 0 {
            let unique = nccl::get_uniqueid();
            let unique = unique.map_err(|e| abort(failure("ncclGetUniqueId", e)))?;
            for (b, c) in id.iter_mut().zip(unique.internal) {
                *b = c as u8;
            }
        }
        bootstrap.broadcast(&mut id, 0)?;
        let unique = sys::ncclUniqueId {
            internal: id.map(|b| b as c_char),
        };
        let (Ok(nranks), Ok(me)) = (c_int::try_from(n), c_int::try_from(rank)) else {
            return Err(abort(format!("{n} ranks are more than NCCL counts")));
        };
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| abort(format!("GPU {ordinal}: {e}")))?;
        let mut comm = std::ptr::null_mut();
        // SAFETY: `comm` receives the new communicator; NCCL joins it on the current
        // device, the GPU bound just above.
        unsafe { nccl::comm_init_rank(&mut comm, nranks, unique, me) }
            .map_err(|e| abort(failure("ncclCommInitRank", e)))?;
        Ok(NcclGroup::new(bootstrap, stream, done, Comm(comm)))
    }

    /// The ranks of a new group in this process, rank `r` on GPU `ordinals[r]`, started at
    /// once (`ncclCommInitAll`) over a [`LocalGroup`] of the same ranks. Hand each rank to
    /// a thread of its own: a collective returns once every rank has called it.
    ///
    /// Errors: [`Error::InvalidArgument`] for no ordinals or one twice (NCCL allows one
    /// rank per GPU); [`Error::Device`] when `libnccl` is absent or older than 2.13, a GPU
    /// is not usable, or NCCL fails.
    pub fn in_process(ordinals: &[usize]) -> Result<Vec<NcclGroup>> {
        let ranks = LocalGroup::new(ordinals.len())?;
        let mut seen = HashSet::new();
        if let Some(twice) = ordinals.iter().find(|o| !seen.insert(**o)) {
            return Err(Error::InvalidArgument(format!(
                "GPU {twice} named twice: NCCL allows one rank per GPU"
            )));
        }
        let opened = ordinals
            .iter()
            .map(|&o| open(o))
            .collect::<std::result::Result<Vec<_>, String>>()
            .map_err(Error::Device)?;
        let devices = ordinals
            .iter()
            .map(|&o| c_int::try_from(o))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| Error::Device("a GPU ordinal beyond NCCL's int".into()))?;
        let n = c_int::try_from(devices.len())
            .map_err(|_| Error::Device(format!("{} ranks", devices.len())))?;
        let mut comms = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` receives one communicator per entry of `devices`, both of length n.
        unsafe { nccl::comm_init_all(comms.as_mut_ptr(), n, devices.as_ptr()) }
            .map_err(|e| Error::Device(failure("ncclCommInitAll", e)))?;
        Ok(ranks
            .into_iter()
            .zip(opened)
            .zip(comms)
            .map(|((rank, (stream, done)), comm)| {
                NcclGroup::new(Arc::new(rank), stream, done, Comm(comm))
            })
            .collect())
    }

    /// The group around a communicator that has just joined on `stream`'s GPU: its rank
    /// and size are those of `bootstrap`.
    fn new(
        bootstrap: Arc<dyn Communicator>,
        stream: Arc<CudaStream>,
        done: CudaEvent,
        comm: Comm,
    ) -> NcclGroup {
        NcclGroup {
            rank: bootstrap.rank(),
            n: bootstrap.world_size(),
            ordinal: stream.context().ordinal(),
            stream,
            bootstrap,
            state: Mutex::new(State {
                comm,
                floats: None,
                bytes: None,
                gathered: Vec::new(),
                headers: Vec::new(),
                done,
            }),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            waited: AtomicU64::new(0),
        }
    }

    /// The stream of the group's transfers, on its GPU: where the device tensors of
    /// [`NcclGroup::all_reduce_sum_device`] are best allocated, sparing it two event waits.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// `x ← Σ_r x_r` over the ranks for f32 GPU memory, in place (`ncclAllReduce`). The
    /// call returns once the work is queued: on the group's stream, after the work queued
    /// so far on `x`'s stream, which then waits for it, so that the sum is in `x` for the
    /// work queued on `x`'s stream afterwards. All of the group's NCCL work thus runs on
    /// one stream, in the order of the calls, which the headers make the same on every
    /// rank.
    ///
    /// The sum is in NCCL's own order, which depends on the algorithm NCCL picks (ring,
    /// tree) for the size and the topology, not in rank order: unlike
    /// [`Communicator::all_reduce_sum`], the ranks may hold sums that differ in their last
    /// bits from those of [`LocalGroup`], or from another run's. The headers are exchanged
    /// as for every collective, so a length that differs between ranks is an error.
    ///
    /// Errors: [`Error::Collective`] when a rank failed, the lengths differ, `x` of some
    /// rank is not on its group's GPU, or CUDA or NCCL fail to queue the work; a failure
    /// of the transfer itself shows in the wait of the next host collective that moves
    /// data.
    pub fn all_reduce_sum_device(&self, x: &mut CudaSlice<f32>) -> Result<()> {
        let foreign = x.context().ordinal() != self.ordinal;
        let header = [DEVICE_ALL_REDUCE, x.len() as u64, 0, u64::from(foreign)];
        self.collective(header, 0, 0, |g, st, len| {
            let theirs = Arc::clone(x.stream());
            let apart = theirs.cu_stream() != g.stream.cu_stream();
            let join = |waits: &CudaStream, on: &CudaStream| {
                waits.join(on).map_err(|e| format!("CUDA event wait: {e}"))
            };
            if apart {
                join(&g.stream, &theirs)?;
            }
            {
                let (ptr, _record) = x.device_ptr_mut(&g.stream);
                // SAFETY: `ptr` is `x`'s live allocation of `len` f32s (the agreed length
                // is this rank's own), read and written in place on the group's stream,
                // which waits for the work queued on `x` so far.
                unsafe {
                    nccl::all_reduce(
                        ptr as *const c_void,
                        ptr as *mut c_void,
                        len,
                        sys::ncclDataType_t::ncclFloat32,
                        sys::ncclRedOp_t::ncclSum,
                        st.comm.0,
                        g.stream.cu_stream() as sys::cudaStream_t,
                    )
                }
                .map_err(|e| failure("ncclAllReduce", e))?;
            }
            if apart {
                join(&theirs, &g.stream)?;
            }
            Ok(())
        })
    }

    /// Runs a collective under the lock: grows the staging buffers to `floats` f32s and
    /// `bytes` bytes, exchanges `header` over the bootstrap and agrees on the length, then,
    /// for a length above 0, `body(group, state, len)` moves the data.
    ///
    /// An error of `body` or of the staging is this rank's failure: the group ends
    /// ([`NcclGroup::fail`]). An error of the bootstrap is another rank's: the group ends
    /// without aborting the bootstrap again. A disagreement leaves the group as it was.
    fn collective(
        &self,
        header: Header,
        floats: usize,
        bytes: usize,
        body: impl FnOnce(&Self, &mut State, usize) -> std::result::Result<(), String>,
    ) -> Result<()> {
        let start = Instant::now();
        let result = self.locked(header, floats, bytes, body);
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.waited.fetch_add(nanos, Ordering::Relaxed);
        result
    }

    /// [`NcclGroup::collective`] but for the clock.
    fn locked(
        &self,
        header: Header,
        floats: usize,
        bytes: usize,
        body: impl FnOnce(&Self, &mut State, usize) -> std::result::Result<(), String>,
    ) -> Result<()> {
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let st = &mut *guard;
        // Checked under the lock, which a failure takes to null the communicator.
        if self.failed.load(Ordering::Acquire) || st.comm.0.is_null() {
            return Err(self.failure());
        }
        let staged = grow(&self.stream, &mut st.floats, floats)
            .and_then(|()| grow(&self.stream, &mut st.bytes, bytes));
        if let Err(msg) = staged {
            return Err(self.fail(st, msg));
        }
        let mut mine = [0.0f32; PIECES];
        encode(&header, &mut mine);
        st.headers.resize(PIECES * self.n, 0.0);
        if let Err(e) = self.bootstrap.all_gather(&mine, &mut st.headers) {
            return Err(self.ended(st, e));
        }
        let headers: Vec<Header> = st.headers.chunks_exact(PIECES).map(decode).collect();
        let len = agree(&headers, self.rank)?;
        if len == 0 {
            return Ok(());
        }
        if let Err(e) = self.stream.context().bind_to_thread() {
            return Err(self.fail(st, format!("GPU {}: {e}", self.ordinal)));
        }
        body(self, st, len).map_err(|msg| self.fail(st, msg))
    }

    /// Waits for the work queued on the group's stream, polling it, NCCL's asynchronous
    /// error and the group's failure (an abort on another thread).
    fn wait(&self, st: &mut State) -> std::result::Result<(), String> {
        st.done
            .record(&self.stream)
            .map_err(|e| format!("CUDA event: {e}"))?;
        let mut turns = 0u32;
        loop {
            match st.done.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(format!("CUDA: {e}")),
            }
            if self.failed.load(Ordering::Acquire) {
                return Err("aborted during a collective".into());
            }
            let mut status = sys::ncclResult_t::ncclSuccess;
            // SAFETY: the communicator is live (a failure would have nulled it under this
            // lock) and `status` receives its asynchronous error.
            unsafe { sys::ncclCommGetAsyncError(st.comm.0, &mut status) }
                .result()
                .and_then(|_| status.result())
                .map_err(|e| failure("NCCL", e))?;
            turns = turns.saturating_add(1);
            if turns < SPINS {
                std::hint::spin_loop();
            } else if turns < YIELDS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(NAP);
            }
        }
    }

    /// The error of the group's first failure.
    fn failure(&self) -> Error {
        let f = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        let (rank, msg) = f.clone().unwrap_or((self.rank, "the group ended".into()));
        Error::Collective { rank, msg }
    }

    /// Records the failure of `rank` (`msg`) unless one came first; true when it is the
    /// first.
    fn record(&self, rank: usize, msg: &str) -> bool {
        let mut f = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        let first = f.is_none();
        if first {
            *f = Some((rank, msg.to_string()));
        }
        self.failed.store(true, Ordering::Release);
        first
    }

    /// Ends the group after this rank failed (`msg`), under the lock (`st`): records the
    /// failure, aborts the communicator and, for a first failure, the bootstrap, so that
    /// the other ranks learn; returns the group's failure.
    fn fail(&self, st: &mut State, msg: String) -> Error {
        if self.record(self.rank, &msg) {
            self.bootstrap.abort(&msg);
        }
        self.abort_comm(st);
        self.failure()
    }

    /// Ends the group after its bootstrap returned `err` (another rank failed or left),
    /// under the lock (`st`); returns `err`.
    fn ended(&self, st: &mut State, err: Error) -> Error {
        match &err {
            Error::Collective { rank, msg } => self.record(*rank, msg),
            other => self.record(self.rank, &other.to_string()),
        };
        self.abort_comm(st);
        err
    }

    /// `ncclCommAbort`, which also ends the work the communicator has queued; once only.
    fn abort_comm(&self, st: &mut State) {
        release(&self.stream, &mut st.comm, false);
    }
}

impl Communicator for NcclGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.n
    }

    fn all_reduce_sum(&self, x: &mut [f32]) -> Result<()> {
        let header = [ALL_REDUCE, x.len() as u64, 0, 0];
        let staged = self.n.saturating_mul(x.len());
        self.collective(header, staged, 0, |g, st, len| {
            g.gather(st, &*x, len)?;
            st.gathered.resize(g.n * len, 0.0);
            g.download(st.floats.as_ref(), &mut st.gathered)?;
            let mut ranks = st.gathered.chunks_exact(len);
            // Rank 0's operand, then each other rank's added in rank order, as LocalGroup.
            if let Some(first) = ranks.next() {
                x.copy_from_slice(first);
            }
            for operand in ranks {
                for (a, v) in x.iter_mut().zip(operand) {
                    *a += v;
                }
            }
            Ok(())
        })
    }

    fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<()> {
        let staged = self.n.saturating_mul(local.len());
        let invalid = out.len() != staged;
        let header = [ALL_GATHER, local.len() as u64, 0, u64::from(invalid)];
        self.collective(header, staged, 0, |g, st, len| {
            g.gather(st, local, len)?;
            g.download(st.floats.as_ref(), out)
        })
    }

    fn broadcast(&self, bytes: &mut [u8], root: usize) -> Result<()> {
        let invalid = root >= self.n;
        let header = [
            BROADCAST,
            bytes.len() as u64,
            root as u64,
            u64::from(invalid),
        ];
        self.collective(header, 0, bytes.len(), |g, st, len| {
            // `agree` checked root < n, and n fits NCCL's int since the communicator exists.
            let from = c_int::try_from(root).map_err(|_| format!("root {root}"))?;
            {
                let buf = st.bytes.as_mut().ok_or("no staging buffer")?;
                let mut view = buf.try_slice_mut(..len).ok_or("staging buffer too short")?;
                if g.rank == root {
                    g.stream
                        .memcpy_htod(&*bytes, &mut view)
                        .map_err(|e| format!("CUDA copy: {e}"))?;
                }
                let (ptr, _record) = view.device_ptr_mut(&g.stream);
                // SAFETY: `ptr` is `len` live bytes of the group's buffer, broadcast in
                // place on the group's stream.
                unsafe {
                    nccl::broadcast(
                        ptr as *const c_void,
                        ptr as *mut c_void,
                        len,
                        sys::ncclDataType_t::ncclUint8,
                        from,
                        st.comm.0,
                        g.stream.cu_stream() as sys::cudaStream_t,
                    )
                }
                .map_err(|e| failure("ncclBroadcast", e))?;
            }
            g.wait(st)?;
            if g.rank != root {
                let buf = st.bytes.as_ref().ok_or("no staging buffer")?;
                let view = buf.try_slice(..len).ok_or("staging buffer too short")?;
                g.stream
                    .memcpy_dtoh(&view, bytes)
                    .map_err(|e| format!("CUDA copy: {e}"))?;
            }
            Ok(())
        })
    }

    /// The header exchange over the bootstrap, which no rank completes before every rank
    /// has sent its header; NCCL is not called.
    fn barrier(&self) -> Result<()> {
        self.collective([BARRIER, 0, 0, 0], 0, 0, |_, _, _| Ok(()))
    }

    /// Records the failure, aborts the bootstrap (which ends an MPI job, or ends the
    /// collectives of a local group's other threads with this rank's failure) and the NCCL
    /// communicator: at once when no collective holds it, else by the collective in
    /// progress, which sees the failure while it waits.
    fn abort(&self, why: &str) {
        if self.record(self.rank, why) {
            self.bootstrap.abort(why);
        }
        let state = match self.state.try_lock() {
            Ok(state) => Some(state),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        if let Some(mut state) = state {
            self.abort_comm(&mut state);
        }
    }

    fn time_in_collectives(&self) -> Duration {
        Duration::from_nanos(self.waited.load(Ordering::Relaxed))
    }
}

impl NcclGroup {
    /// Copies `local` (`len` f32s) into this rank's part of the staging buffer and
    /// all-gathers every rank's in place, waiting for the transfer.
    fn gather(&self, st: &mut State, local: &[f32], len: usize) -> std::result::Result<(), String> {
        {
            let buf = st.floats.as_mut().ok_or("no staging buffer")?;
            let mut all = buf
                .try_slice_mut(..self.n * len)
                .ok_or("staging buffer too short")?;
            let at = self.rank * len;
            let mut part = all
                .try_slice_mut(at..at + len)
                .ok_or("staging buffer too short")?;
            self.stream
                .memcpy_htod(local, &mut part)
                .map_err(|e| format!("CUDA copy: {e}"))?;
            let (ptr, _record) = all.device_ptr_mut(&self.stream);
            let send = ptr + (at * std::mem::size_of::<f32>()) as u64;
            // SAFETY: `ptr` is `n·len` live f32s of the group's buffer; NCCL's in-place
            // all-gather reads this rank's part, at `rank·len`, and writes every rank's.
            unsafe {
                nccl::all_gather(
                    send as *const c_void,
                    ptr as *mut c_void,
                    len,
                    sys::ncclDataType_t::ncclFloat32,
                    st.comm.0,
                    self.stream.cu_stream() as sys::cudaStream_t,
                )
            }
            .map_err(|e| failure("ncclAllGather", e))?;
        }
        self.wait(st)
    }

    /// Copies the first `out.len()` f32s of the staging buffer `floats` to `out`. A copy
    /// to pageable host memory returns once it is complete (CUDA's "API synchronization
    /// behavior"), so `out` is ready on return.
    fn download(
        &self,
        floats: Option<&CudaSlice<f32>>,
        out: &mut [f32],
    ) -> std::result::Result<(), String> {
        let buf = floats.ok_or("no staging buffer")?;
        let view = buf
            .try_slice(..out.len())
            .ok_or("staging buffer too short")?;
        self.stream
            .memcpy_dtoh(&view, out)
            .map_err(|e| format!("CUDA copy: {e}"))
    }
}

impl Drop for NcclGroup {
    /// Destroys the communicator (`ncclCommDestroy`, after the work it has queued), or
    /// aborts it when the group failed, since the other ranks may be gone.
    fn drop(&mut self) {
        let failed = self.failed.load(Ordering::Acquire);
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        release(&self.stream, &mut st.comm, !failed);
    }
}

/// Destroys (`destroy`) or aborts the communicator `comm` of the group on `stream`'s GPU,
/// unless it is gone already, and nulls its handle so that it is never used again.
fn release(stream: &CudaStream, comm: &mut Comm, destroy: bool) {
    let handle = std::mem::replace(&mut comm.0, std::ptr::null_mut());
    if handle.is_null() {
        return;
    }
    // The GPU's context may be unusable already, and NCCL releases the handle either way.
    let _ = stream.context().bind_to_thread();
    // SAFETY: the handle is live and, behind the group's lock or in its drop, used by no
    // other call. Nothing remains to be done when the call itself fails.
    let _ = unsafe {
        if destroy {
            nccl::comm_destroy(handle)
        } else {
            nccl::comm_abort(handle)
        }
    };
}

/// GPU `ordinal`'s stream for a group and the event its waits poll, after checking that
/// `libnccl` loads and is recent enough; the reason when not.
fn open(ordinal: usize) -> std::result::Result<(Arc<CudaStream>, CudaEvent), String> {
    if !available() {
        return Err("libnccl.so not found (see flm_devices::cuda::nccl::available)".into());
    }
    // Not `failure`: an NCCL too old to check may lack ncclGetLastError.
    let version = nccl::get_nccl_version().map_err(|e| format!("ncclGetVersion: {:?}", e.0))?;
    if version < MIN_VERSION {
        return Err(format!("NCCL {version} is older than 2.13"));
    }
    let (ctx, _) = super::probe(ordinal)?;
    // SAFETY: the group's buffers are used only on its one stream, so cudarc's events
    // ordering buffers between streams are not needed.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx
        .new_stream()
        .map_err(|e| format!("CUDA stream on GPU {ordinal}: {e}"))?;
    let done = ctx
        .new_event(None)
        .map_err(|e| format!("CUDA event on GPU {ordinal}: {e}"))?;
    Ok((stream, done))
}

/// Makes `buf` hold at least `len` elements, allocating it anew (zeroed) when shorter.
fn grow<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    buf: &mut Option<CudaSlice<T>>,
    len: usize,
) -> std::result::Result<(), String> {
    if len == 0 || buf.as_ref().is_some_and(|b| b.len() >= len) {
        return Ok(());
    }
    *buf = None;
    let fresh = stream
        .alloc_zeros(len)
        .map_err(|e| format!("staging buffer of {len} elements: {e}"))?;
    *buf = Some(fresh);
    Ok(())
}

/// What `call` failed with: NCCL's code and its last error message.
fn failure(call: &str, e: nccl::NcclError) -> String {
    // SAFETY: ncclGetLastError (NCCL >= 2.13, checked before any other call) returns a
    // NUL-terminated string of NCCL's, valid until the next NCCL call on this thread; the
    // communicator argument is unused.
    let last = unsafe { CStr::from_ptr(sys::ncclGetLastError(std::ptr::null_mut())) };
    let last = last.to_string_lossy();
    if last.is_empty() {
        format!("{call}: {:?}", e.0)
    } else {
        format!("{call}: {:?} ({last})", e.0)
    }
}

/// `h` as f32s: each word in four 16-bit pieces, low first, each exact in an f32, so that
/// the header crosses the bootstrap's f32 all-gather unchanged.
fn encode(h: &Header, out: &mut [f32; PIECES]) {
    for (i, piece) in out.iter_mut().enumerate() {
        *piece = ((h[i / 4] >> (16 * (i % 4))) & 0xffff) as f32;
    }
}

/// The header of [`encode`]'s `PIECES` f32s.
fn decode(pieces: &[f32]) -> Header {
    let mut h = [0u64; 4];
    for (i, piece) in pieces.iter().enumerate().take(PIECES) {
        h[i / 4] |= (*piece as u64 & 0xffff) << (16 * (i % 4));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_cross_as_f32_unchanged() {
        let h: Header = [DEVICE_ALL_REDUCE, u64::MAX - 5, 1 << 40, 1];
        let mut pieces = [0.0; PIECES];
        encode(&h, &mut pieces);
        assert_eq!(decode(&pieces), h);
    }
}
