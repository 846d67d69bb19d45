//! The [`Executor`]: runs each op on the first device that supports it where its operands
//! live, makes and records every copy between host and device memory, and profiles
//! (`profile.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard};
use std::thread::ThreadId;
use std::time::Instant;

use crate::profile::{Call, Profile};
use crate::{
    BaseDevice, CheckedOp, Data, DataType, Error, Layout, Location, Op, Result, Route, StepGraph,
    StepInputs, TransferRecord,
};

/// Runs ops on devices held in priority order (for example CUDA, then CPU).
///
/// An op runs on the first device that supports it among those whose memory holds its
/// operands ([`BaseDevice::location`]); operands in two memories are an error
/// ([`Op::validate`]). Copies between memories are made only by [`Executor::to_device`],
/// [`Executor::to_host`] and [`Executor::copy_into`], each recorded with the reason its
/// caller gives ([`Executor::transfers`]).
///
/// With `FLM_PROFILE=1` in the environment when it is created, it counts each op kind's
/// calls and wall time, and those of each weight matrix (or set of matrices) of the Linear
/// and Linears ops, with the bytes of weights they read per second, and prints the tables
/// to stderr when dropped (at exit), with the transfer record. Without it the per-op cost
/// is a branch and a short loop over the devices. A replayed step ([`Executor::replay`])
/// is not in the per-op tables: its ops ran as one launch.
///
/// A decode step can be captured once on a device and replayed ([`Executor::capture`],
/// [`StepGraph`]); [`Executor::set_step_graphs`] turns that off (`--cuda-graph off`).
pub struct Executor {
    devices: Vec<Box<dyn BaseDevice>>,
    profile: Option<Mutex<Profile>>,
    transfers: Mutex<TransferRecord>,
    /// Whether models may capture their steps ([`Executor::can_capture`]).
    step_graphs: AtomicBool,
    /// Set while a capture is under way, so that [`Executor::run`] checks `capture`.
    capturing: AtomicBool,
    /// The memory whose device is capturing, and the thread that issues the step's ops.
    capture: Mutex<Option<(Location, ThreadId)>>,
    /// Held for writing by a capture and for reading by every op, copy and replay of the
    /// other threads, so that theirs wait instead of landing in the capture.
    gate: RwLock<()>,
}

impl Executor {
    /// An executor over `devices`, highest priority first. Profiling follows `FLM_PROFILE`.
    pub fn new(devices: Vec<Box<dyn BaseDevice>>) -> Executor {
        let profile = std::env::var("FLM_PROFILE").is_ok_and(|v| v == "1");
        Executor::with_profiling(devices, profile)
    }

    /// An executor with profiling on or off regardless of the environment.
    pub fn with_profiling(devices: Vec<Box<dyn BaseDevice>>, profile: bool) -> Executor {
        Executor {
            devices,
            profile: profile.then(|| Mutex::new(Profile::default())),
            transfers: Mutex::new(TransferRecord::default()),
            step_graphs: AtomicBool::new(true),
            capturing: AtomicBool::new(false),
            capture: Mutex::new(None),
            gate: RwLock::new(()),
        }
    }

    /// Allows or forbids capturing steps from now on (allowed by default): with `false`,
    /// [`Executor::can_capture`] is false everywhere and models run every step op by op
    /// (`--cuda-graph off`, the workaround should a captured step misbehave).
    pub fn set_step_graphs(&self, on: bool) {
        self.step_graphs.store(on, Ordering::Relaxed);
    }

    /// Whether a step whose ops all run in the memory `at` can be captured there: step
    /// graphs are allowed ([`Executor::set_step_graphs`]) and its device captures
    /// ([`BaseDevice::supports_capture`]).
    pub fn can_capture(&self, at: Location) -> bool {
        self.step_graphs.load(Ordering::Relaxed)
            && self.device_at(at).is_ok_and(|d| d.supports_capture())
    }

    /// The capture under way, if any: its memory and the thread that runs it.
    fn capture_state(&self) -> Option<(Location, ThreadId)> {
        if !self.capturing.load(Ordering::Acquire) {
            return None;
        }
        match self.capture.lock() {
            Ok(c) => *c,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }

    fn set_capture(&self, state: Option<(Location, ThreadId)>) {
        let mut c = match self.capture.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        *c = state;
        self.capturing.store(state.is_some(), Ordering::Release);
    }

    /// Whether this thread is capturing a step ([`Executor::capture`]): its ops are being
    /// recorded, and copies between memories are refused.
    pub fn capturing(&self) -> bool {
        self.capture_state()
            .is_some_and(|(_, thread)| thread == std::thread::current().id())
    }

    /// For a call that uses the memory `at`: waits for a capture by another thread to end,
    /// and keeps any from starting until the guard drops. Nothing for the capturing
    /// thread's own calls, nor where no device captures (the host: so CPU ops pay nothing).
    fn enter(&self, at: &[Location]) -> Option<RwLockReadGuard<'_, ()>> {
        let captures = |d: &dyn BaseDevice| at.contains(&d.location()) && d.supports_capture();
        if !self.devices.iter().any(|d| captures(&**d)) {
            return None;
        }
        if let Some((_, thread)) = self.capture_state() {
            if std::thread::current().id() == thread {
                return None;
            }
        }
        Some(self.gate.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The error of `what` by the capturing thread while it captures a step: an op on
    /// another device, a copy between memories.
    fn escapes_capture(&self, what: impl FnOnce() -> String) -> Result<()> {
        match self.capture_state() {
            Some((at, thread)) if std::thread::current().id() == thread => {
                Err(Error::Device(format!(
                    "{} while a step is captured on {at}; run with --cuda-graph off to go \
                     without step graphs",
                    what()
                )))
            }
            _ => Ok(()),
        }
    }

    /// Captures the ops that `step_ops` runs through this executor (every one on the
    /// device of `at`, none waiting for the host) as one [`StepGraph`] for `step`'s batch
    /// size, then replays it once with `step` (a capture records without running). The
    /// ops whose token ids and positions are the step's go through
    /// [`Executor::run_step`]; the others must not depend on the step's values.
    ///
    /// Errors: [`Error::Unsupported`] where [`Executor::can_capture`] is false; whatever
    /// `step_ops` returns (the capture is then discarded); [`Error::Device`] for an op
    /// that would escape the capture (see [`StepGraph`]) or a device failure.
    pub fn capture<E: From<Error>>(
        &self,
        at: Location,
        step: &StepInputs<'_>,
        step_ops: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<StepGraph, E> {
        if !self.can_capture(at) {
            return Err(Error::Unsupported(format!("capturing a step in {at} memory")).into());
        }
        if self.capture_state().is_some() {
            return Err(Error::Device("a step is already being captured".into()).into());
        }
        let device = self.device_at(at)?;
        let gate = self.gate.write().unwrap_or_else(PoisonError::into_inner);
        device.begin_capture(step)?;
        self.set_capture(Some((at, std::thread::current().id())));
        let ran = step_ops();
        self.set_capture(None);
        let captured = device.end_capture(ran.is_ok());
        drop(gate);
        ran?;
        let captured = captured?
            .ok_or_else(|| Error::Device(format!("{} returned no capture", device.name())))?;
        let graph = StepGraph::new(at, step.batch(), captured);
        self.replay(&graph, step)?;
        Ok(graph)
    }

    /// Runs a captured step with `step`'s token ids and positions.
    ///
    /// Errors: [`Error::InvalidArgument`] when `step` has another batch size than the
    /// graph; those of [`BaseDevice::replay`].
    pub fn replay(&self, graph: &StepGraph, step: &StepInputs<'_>) -> Result<()> {
        if step.batch() != graph.batch() {
            return Err(Error::InvalidArgument(format!(
                "a step of {} rows replayed on a graph of {}",
                step.batch(),
                graph.batch()
            )));
        }
        self.escapes_capture(|| "replaying a step".into())?;
        let _gate = self.enter(&[graph.location()]);
        self.device_at(graph.location())?
            .replay(graph.captured(), step)
    }

    /// The device whose memory is `location`.
    fn device_at(&self, location: Location) -> Result<&dyn BaseDevice> {
        self.devices
            .iter()
            .find(|d| d.location() == location)
            .map(|d| &**d)
            .ok_or_else(|| Error::Placement(format!("no device of this executor is {location}")))
    }

    /// Free bytes of the memory at `location`, where its device tells
    /// ([`BaseDevice::free_memory`]).
    pub fn free_memory(&self, location: Location) -> Option<u64> {
        self.device_at(location).ok()?.free_memory()
    }

    /// Counts a copy in the transfer record.
    fn record(&self, reason: &'static str, from: Location, to: Location, bytes: usize) {
        let mut record = match self.transfers.lock() {
            Ok(r) => r,
            Err(poisoned) => poisoned.into_inner(),
        };
        record.add(reason, Route { from, to }, bytes);
    }

    /// Every copy between memories made so far, by reason and route.
    pub fn transfers(&self) -> TransferRecord {
        match self.transfers.lock() {
            Ok(r) => r.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// A copy of `data` in the memory of `location`, made by the device there and
    /// recorded under `reason`. When it is there already, nothing is recorded and the
    /// result is a [`Data::clone`] (host bytes copied, a mapping or a device buffer shared,
    /// the latter read-only). A weight's [`Data::input_perm`] moves with it.
    ///
    /// Errors: [`Error::Placement`] when no device of this executor is at `location`; the
    /// devices' allocation and copy errors.
    pub fn to_device(&self, data: &Data, location: Location, reason: &'static str) -> Result<Data> {
        if data.location() == location {
            return Ok(data.clone());
        }
        if data.layout() == Layout::Panels {
            // Panels are the CPU kernels' layout; other devices read rows.
            return self.to_device(&data.to_rows()?, location, reason);
        }
        let mut out = self.zeros(data.dtype(), data.shape(), location)?;
        self.copy_into(data, &mut out, reason)?;
        match data.input_perm() {
            Some(perm) => out.with_input_perm(self.to_device(perm, location, reason)?),
            None => Ok(out),
        }
    }

    /// A zero-filled tensor of `dtype` and `shape` in the memory of `location` (nothing is
    /// copied: device memory comes zeroed from [`BaseDevice::alloc`]).
    ///
    /// Errors: [`Error::Placement`] when no device of this executor is at `location`; the
    /// allocation's errors.
    pub fn zeros(&self, dtype: DataType, shape: &[usize], location: Location) -> Result<Data> {
        match location {
            Location::Host => Data::zeros(dtype, shape),
            device => {
                let bytes = dtype.byte_len(shape).ok_or_else(|| Error::Shape {
                    op: "Executor::zeros",
                    msg: format!("{dtype} shape {shape:?} overflows"),
                })?;
                Data::from_device(dtype, shape, self.device_at(device)?.alloc(bytes)?)
            }
        }
    }

    /// A copy of `data` in host memory (see [`Executor::to_device`]).
    pub fn to_host(&self, data: &Data, reason: &'static str) -> Result<Data> {
        self.to_device(data, Location::Host, reason)
    }

    /// Copies the bytes of `src` into `dst`, of the same dtype and shape, wherever each
    /// lives: a host copy, an upload, a download, or a download then an upload between two
    /// devices, each device's copy in the layout it keeps that dtype in
    /// ([`BaseDevice::upload_tensor`], [`BaseDevice::download_tensor`]). Copies between
    /// memories are recorded under `reason`.
    ///
    /// Errors: [`Error::Shape`] when the dtypes or shapes differ; [`Error::Placement`] for
    /// a device not in this executor; the devices' copy errors; [`Error::ReadOnly`] for a
    /// mapped or shared `dst`.
    pub fn copy_into(&self, src: &Data, dst: &mut Data, reason: &'static str) -> Result<()> {
        if src.dtype() != dst.dtype() || src.shape() != dst.shape() {
            return Err(Error::Shape {
                op: "Executor::copy_into",
                msg: format!(
                    "{} {:?} into {} {:?}",
                    src.dtype(),
                    src.shape(),
                    dst.dtype(),
                    dst.shape()
                ),
            });
        }
        let (from, to) = (src.location(), dst.location());
        if from != to {
            self.escapes_capture(|| format!("a copy ({reason})"))?;
        }
        let _gate = self.enter(&[from, to]);
        match (from, to) {
            (Location::Host, Location::Host) => {
                dst.bytes_mut()?.copy_from_slice(src.bytes()?);
                return Ok(());
            }
            (Location::Host, device) => {
                let device = self.device_at(device)?;
                device.upload_tensor(src, dst.device_buffer_mut()?)?;
            }
            (device, Location::Host) => {
                let device = self.device_at(device)?;
                let buffer = src.device_buffer().ok_or(Error::ReadOnly)?;
                device.download_tensor(buffer, dst)?;
            }
            (a, b) => {
                let mut staged = Data::zeros(src.dtype(), src.shape())?;
                let buffer = src.device_buffer().ok_or(Error::ReadOnly)?;
                self.device_at(a)?.download_tensor(buffer, &mut staged)?;
                self.device_at(b)?
                    .upload_tensor(&staged, dst.device_buffer_mut()?)?;
            }
        }
        self.record(reason, from, to, src.size_bytes());
        Ok(())
    }

    /// Makes every device batch-invariant from now on (see
    /// [`BaseDevice::require_batch_invariance`]).
    pub fn require_batch_invariance(&self) {
        for device in &self.devices {
            device.require_batch_invariance();
        }
    }

    /// Checks `op` ([`Op::validate`]) and runs it on the first device that supports it
    /// among those whose memory holds its operands (and, for host operands, those that
    /// offload them: [`BaseDevice::runs_host_operands`]).
    ///
    /// Errors: those of [`Op::validate`]; [`Error::Unsupported`] if no such device
    /// supports the op; otherwise the device's error.
    pub fn run(&self, op: Op<'_>) -> Result<()> {
        self.dispatch(op.validate()?)
    }

    /// As [`Executor::run`], for an op whose token ids and positions are those of the step
    /// being run (the embedding of its tokens, RoPE at its positions, the KV cache rows it
    /// writes and attends up to): in a captured step the device reads them from the
    /// step's buffer ([`StepInputs`]), so that a replay sees the next step's values. The
    /// model runs such ops this way whether or not the step is captured.
    ///
    /// Errors: as [`Executor::run`].
    pub fn run_step(&self, op: Op<'_>) -> Result<()> {
        self.dispatch(op.validate()?.at_step())
    }

    fn dispatch(&self, op: CheckedOp<'_>) -> Result<()> {
        let kind = op.op().kind();
        let location = op.location();
        let device = self
            .devices
            .iter()
            .filter(|d| {
                d.location() == location || (location == Location::Host && d.runs_host_operands())
            })
            .find(|d| d.supports(op.op()))
            .ok_or_else(|| Error::Unsupported(format!("{:?} in {location} memory", op.op())))?;
        if let Some((at, _)) = self.capture_state() {
            if device.location() != at || location != at {
                self.escapes_capture(|| {
                    format!("{kind:?} on {} in {location} memory", device.name())
                })?;
            }
        }
        let _gate = self.enter(&[device.location()]);
        match &self.profile {
            None => device.run(op),
            Some(profile) => {
                let call = Call::of(op.op());
                let start = Instant::now();
                let result = device.run(op);
                let elapsed = start.elapsed();
                if let Ok(mut profile) = profile.lock() {
                    profile.record(call, elapsed);
                }
                result
            }
        }
    }

    /// The profile as printable tables (empty when profiling is off): per op kind, then
    /// per weight of the Linear and Linears ops, slowest first, split into matrix × vector
    /// products (one input row: decode, and the classifier of the last prompt token) and
    /// matrix × matrix products (prefill), with the weight bytes read per second of wall
    /// time in GB/s (decimal): a matrix × vector product is bound by that rate, so it
    /// compares with the memory bandwidth.
    pub fn profile_report(&self) -> String {
        match &self.profile {
            None => String::new(),
            Some(profile) => match profile.lock() {
                Ok(p) => p.report(),
                Err(poisoned) => poisoned.into_inner().report(),
            },
        }
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        if self.profile.is_some() {
            eprint!("flm profile (per op kind):\n{}", self.profile_report());
            let transfers = self.transfers().report();
            if !transfers.is_empty() {
                eprint!("\nflm transfers between memories:\n{transfers}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::{RecordLog, RecordedStep, RecordingDevice};
    use crate::{CheckedOp, LinearPart, OpKind};
    use std::time::Duration;

    struct OnlyAdd;
    impl BaseDevice for OnlyAdd {
        fn name(&self) -> &'static str {
            "only-add"
        }
        fn supports(&self, op: &Op<'_>) -> bool {
            matches!(op, Op::Add { .. })
        }
        fn require_batch_invariance(&self) {}
        fn run(&self, op: CheckedOp<'_>) -> Result<()> {
            if let Op::Add { x, y } = op.into_op() {
                let y = y.as_f32()?.to_vec();
                for (a, b) in x.as_f32_mut()?.iter_mut().zip(y) {
                    *a += b;
                }
            }
            Ok(())
        }
    }

    /// Supports the Linear ops and takes 1 ms for each, computing nothing.
    struct SlowLinear;
    impl BaseDevice for SlowLinear {
        fn name(&self) -> &'static str {
            "slow-linear"
        }
        fn supports(&self, op: &Op<'_>) -> bool {
            matches!(op, Op::Linear { .. } | Op::Linears { .. })
        }
        fn require_batch_invariance(&self) {}
        fn run(&self, _: CheckedOp<'_>) -> Result<()> {
            std::thread::sleep(Duration::from_millis(1));
            Ok(())
        }
    }

    /// A device with memory of its own (host bytes tagged as `mock:0`) that runs Add on
    /// operands there: the executor's placement and transfer rules without a GPU.
    struct MockAccelerator;

    #[derive(Debug)]
    struct MockBuffer(Vec<u8>);

    const MOCK: Location = Location::Device {
        name: "mock",
        ordinal: 0,
    };

    impl crate::DeviceBuffer for MockBuffer {
        fn location(&self) -> Location {
            MOCK
        }
        fn len(&self) -> usize {
            self.0.len()
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
        fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
            self
        }
    }

    fn mock(buffer: &dyn crate::DeviceBuffer) -> &MockBuffer {
        buffer.as_any().downcast_ref().expect("a mock buffer")
    }

    impl BaseDevice for MockAccelerator {
        fn name(&self) -> &'static str {
            "mock"
        }
        fn supports(&self, op: &Op<'_>) -> bool {
            matches!(op, Op::Add { .. })
        }
        fn require_batch_invariance(&self) {}
        fn location(&self) -> Location {
            MOCK
        }
        fn alloc(&self, bytes: usize) -> Result<Box<dyn crate::DeviceBuffer>> {
            Ok(Box::new(MockBuffer(vec![0; bytes])))
        }
        fn upload(&self, src: &[u8], dst: &mut dyn crate::DeviceBuffer) -> Result<()> {
            let dst: &mut MockBuffer = dst.as_any_mut().downcast_mut().expect("a mock buffer");
            dst.0[..src.len()].copy_from_slice(src);
            Ok(())
        }
        fn download(&self, src: &dyn crate::DeviceBuffer, dst: &mut [u8]) -> Result<()> {
            dst.copy_from_slice(&mock(src).0[..dst.len()]);
            Ok(())
        }
        /// Keeps int8 tensors in a layout of its own: their bytes reversed.
        fn upload_tensor(&self, src: &Data, dst: &mut dyn crate::DeviceBuffer) -> Result<()> {
            let bytes = src.bytes()?;
            match src.dtype() {
                DataType::I8 => self.upload(&bytes.iter().rev().copied().collect::<Vec<_>>(), dst),
                _ => self.upload(bytes, dst),
            }
        }
        fn download_tensor(&self, src: &dyn crate::DeviceBuffer, dst: &mut Data) -> Result<()> {
            let int8 = dst.dtype() == DataType::I8;
            let bytes = dst.bytes_mut()?;
            self.download(src, bytes)?;
            if int8 {
                bytes.reverse();
            }
            Ok(())
        }
        fn run(&self, op: CheckedOp<'_>) -> Result<()> {
            if let Op::Add { x, y } = op.into_op() {
                let y: Vec<f32> =
                    bytemuck::cast_slice(&mock(y.device_buffer().unwrap()).0).to_vec();
                let x: &mut MockBuffer = x
                    .device_buffer_mut()?
                    .as_any_mut()
                    .downcast_mut()
                    .expect("a mock buffer");
                for (a, b) in bytemuck::cast_slice_mut::<u8, f32>(&mut x.0)
                    .iter_mut()
                    .zip(y)
                {
                    *a += b;
                }
            }
            Ok(())
        }
    }

    #[test]
    fn ops_run_where_their_operands_live_and_every_copy_is_recorded() {
        let exec =
            Executor::with_profiling(vec![Box::new(MockAccelerator), Box::new(OnlyAdd)], false);
        let x = Data::from_f32(&[2], &[1.0, 2.0]).unwrap();
        let y = Data::from_f32(&[2], &[0.5, 0.5]).unwrap();
        let mut xd = exec.to_device(&x, MOCK, "test: x").unwrap();
        let yd = exec.to_device(&y, MOCK, "test: y").unwrap();
        assert_eq!(xd.location(), MOCK);
        assert!(matches!(xd.as_f32(), Err(Error::Placement(_))));
        exec.run(Op::Add { x: &mut xd, y: &yd }).unwrap();
        exec.run(Op::Add { x: &mut xd, y: &yd }).unwrap();
        let back = exec.to_host(&xd, "test: result").unwrap();
        assert_eq!(back.as_f32().unwrap(), &[2.0, 3.0]);
        // Host operands run on the host device, untouched by the accelerator.
        let mut xh = x.clone();
        exec.run(Op::Add { x: &mut xh, y: &y }).unwrap();
        assert_eq!(xh.as_f32().unwrap(), &[1.5, 2.5]);

        let record = exec.transfers();
        let up = Route {
            from: Location::Host,
            to: MOCK,
        };
        let down = Route {
            from: MOCK,
            to: Location::Host,
        };
        let got: Vec<_> = record
            .entries
            .iter()
            .map(|e| (e.reason, e.route, e.count, e.bytes))
            .collect();
        assert_eq!(
            got,
            [
                ("test: x", up, 1, 8),
                ("test: y", up, 1, 8),
                ("test: result", down, 1, 8),
            ]
        );
        assert_eq!(record.totals(), (3, 24));
        assert!(
            record.report().contains("mock:0 -> host"),
            "{}",
            record.report()
        );
    }

    #[test]
    fn tensors_move_in_the_layout_their_device_keeps_them_in() {
        let exec = Executor::with_profiling(vec![Box::new(MockAccelerator)], false);
        let w = Data::from_f32(
            &[2, 40],
            &(0..80).map(|i| i as f32 - 40.0).collect::<Vec<_>>(),
        )
        .unwrap()
        .to_dtype(DataType::I8)
        .unwrap();
        let on_mock = exec.to_device(&w, MOCK, "test: up").unwrap();
        let held = &mock(on_mock.device_buffer().unwrap()).0;
        let reversed: Vec<u8> = w.bytes().unwrap().iter().rev().copied().collect();
        assert_eq!(held, &reversed, "uploaded in the device's layout");
        let back = exec.to_host(&on_mock, "test: down").unwrap();
        assert_eq!(back.bytes().unwrap(), w.bytes().unwrap());
        let mut into = Data::zeros(DataType::I8, &[2, 40]).unwrap();
        exec.copy_into(&on_mock, &mut into, "test: down").unwrap();
        assert_eq!(into.bytes().unwrap(), w.bytes().unwrap());
    }

    #[test]
    fn operands_in_two_memories_are_an_error_never_a_copy() {
        let exec =
            Executor::with_profiling(vec![Box::new(MockAccelerator), Box::new(OnlyAdd)], false);
        let mut x = exec
            .to_device(&Data::from_f32(&[2], &[1.0, 2.0]).unwrap(), MOCK, "test")
            .unwrap();
        let y = Data::from_f32(&[2], &[0.5, 0.5]).unwrap();
        let err = exec.run(Op::Add { x: &mut x, y: &y }).unwrap_err();
        assert!(matches!(err, Error::Placement(_)), "{err}");
        assert!(err.to_string().contains("mock:0"), "{err}");
        assert_eq!(exec.transfers().totals(), (1, 8));
        // No device runs an op in a memory it does not have.
        let host_only = Executor::with_profiling(vec![Box::new(OnlyAdd)], false);
        let mut x = exec.to_device(&y, MOCK, "test").unwrap();
        let yd = exec.to_device(&y, MOCK, "test").unwrap();
        let err = host_only.run(Op::Add { x: &mut x, y: &yd }).unwrap_err();
        assert!(matches!(err, Error::Unsupported(_)), "{err}");
        assert!(matches!(
            host_only.to_device(&y, MOCK, "test"),
            Err(Error::Placement(_))
        ));
    }

    #[test]
    fn linear_ops_are_profiled_per_weight_and_product() {
        let exec = Executor::with_profiling(vec![Box::new(SlowLinear)], true);
        let w3 = Data::zeros(DataType::F32, &[1000, 256]).unwrap();
        let w5 = Data::zeros(DataType::F16, &[500, 256]).unwrap();
        for rows in [1, 1, 2] {
            let input = Data::zeros(DataType::F32, &[rows, 256]).unwrap();
            let mut output = Data::zeros(DataType::F32, &[rows, 1000]).unwrap();
            exec.run(Op::Linear {
                input: &input,
                weight: &w3,
                bias: None,
                output: &mut output,
            })
            .unwrap();
        }
        let input = Data::zeros(DataType::F32, &[1, 256]).unwrap();
        let mut o3 = Data::zeros(DataType::F32, &[1, 1000]).unwrap();
        let mut o5 = Data::zeros(DataType::F32, &[1, 500]).unwrap();
        let mut parts = [
            LinearPart::new(&w3, None, &mut o3),
            LinearPart::new(&w5, None, &mut o5),
        ];
        exec.run(Op::Linears {
            input: &input,
            parts: &mut parts,
        })
        .unwrap();
        let report = exec.profile_report();
        // op, product, calls, total ms, avg us, GB/s, weights.
        let row = |op: &str, product: &str, weights: &str| -> (u64, f64) {
            let line = report
                .lines()
                .find(|l| {
                    let f: Vec<_> = l.split_whitespace().collect();
                    f.len() > 6 && f[0] == op && f[1] == product && l.ends_with(weights)
                })
                .unwrap_or_else(|| panic!("no {op} {product} {weights} row in\n{report}"));
            let f: Vec<_> = line.split_whitespace().collect();
            (f[2].parse().unwrap(), f[5].parse().unwrap())
        };
        // Each call reads the weights' bytes (1,024,000 and 256,000) in at least 1 ms.
        let (calls, gb_s) = row("Linear", "matvec", "  f32 1000x256");
        assert_eq!(calls, 2, "{report}");
        assert!(gb_s > 0.0 && gb_s <= 1_024_000.0 / 1e-3 / 1e9, "{report}");
        assert_eq!(row("Linear", "matmul", "  f32 1000x256").0, 1, "{report}");
        let (calls, gb_s) = row("Linears", "matvec", "  f32 1000x256 + f16 500x256");
        assert_eq!(calls, 1, "{report}");
        assert!(
            gb_s > 0.0 && gb_s <= (1_024_000.0 + 256_000.0) / 1e-3 / 1e9,
            "{report}"
        );
    }

    #[test]
    fn first_supporting_device_runs_and_is_profiled() {
        let exec = Executor::with_profiling(vec![Box::new(OnlyAdd)], true);
        let mut x = Data::from_f32(&[2], &[1.0, 2.0]).unwrap();
        let y = Data::from_f32(&[2], &[0.5, 0.5]).unwrap();
        exec.run(Op::Add { x: &mut x, y: &y }).unwrap();
        assert_eq!(x.as_f32().unwrap(), &[1.5, 2.5]);
        assert!(exec.profile_report().contains("Add"));
        let mut out = [0u32; 1];
        let err = exec
            .run(Op::Argmax {
                input: &Data::zeros(DataType::F32, &[1, 2]).unwrap(),
                output: &mut out,
            })
            .unwrap_err();
        assert!(matches!(err, Error::Unsupported(_)));
    }

    /// An executor over the mock accelerator capturing by recording
    /// ([`crate::recording::RecordingDevice`]) and the host's [`OnlyAdd`], with the
    /// device's log.
    fn capturing() -> (Executor, std::sync::Arc<RecordLog>) {
        let dev = RecordingDevice::new(MockAccelerator);
        let log = dev.log();
        let exec = Executor::with_profiling(vec![Box::new(dev), Box::new(OnlyAdd)], false);
        (exec, log)
    }

    fn two_adds(exec: &Executor, x: &mut Data, y: &Data) -> Result<()> {
        exec.run_step(Op::Add { x, y })?;
        exec.run(Op::Add { x, y })
    }

    #[test]
    fn a_captured_step_records_its_ops_on_one_device_and_replays_with_new_inputs() {
        let (exec, dev) = capturing();
        assert!(exec.can_capture(MOCK) && !exec.can_capture(Location::Host));
        let mut x = exec.zeros(DataType::F32, &[1, 2], MOCK).unwrap();
        let y = exec.zeros(DataType::F32, &[1, 2], MOCK).unwrap();
        let step = |tokens: &'static [u32], pos: usize| StepInputs {
            tokens,
            start_pos: pos,
            cache_row: pos + 1,
        };
        let graph = exec
            .capture(MOCK, &step(&[5], 3), || two_adds(&exec, &mut x, &y))
            .unwrap();
        assert_eq!((graph.location(), graph.batch()), (MOCK, 1));
        let recorded = &graph
            .captured()
            .as_any()
            .downcast_ref::<RecordedStep>()
            .unwrap()
            .0;
        assert_eq!(recorded, &[(OpKind::Add, true), (OpKind::Add, false)]);
        exec.replay(&graph, &step(&[8], 4)).unwrap();
        // The capture replays once with its own step, then with the next one.
        assert_eq!(dev.replays(), [vec![5, 3, 4], vec![8, 4, 5]]);
        let err = exec
            .replay(
                &graph,
                &StepInputs {
                    tokens: &[1, 2],
                    start_pos: 0,
                    cache_row: 0,
                },
            )
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        // Outside a capture the ops run again.
        two_adds(&exec, &mut x, &y).unwrap();
        assert_eq!(dev.kept(), [true]);
    }

    #[test]
    fn what_would_escape_a_capture_fails_it() {
        let (exec, dev) = capturing();
        let mut xd = exec.zeros(DataType::F32, &[1, 2], MOCK).unwrap();
        let mut xh = Data::zeros(DataType::F32, &[1, 2]).unwrap();
        let yh = Data::zeros(DataType::F32, &[1, 2]).unwrap();
        let step = StepInputs {
            tokens: &[1],
            start_pos: 1,
            cache_row: 1,
        };
        // An op that runs on the CPU, and a copy between memories.
        let err = exec
            .capture(MOCK, &step, || exec.run(Op::Add { x: &mut xh, y: &yh }))
            .unwrap_err();
        assert!(err.to_string().contains("--cuda-graph off"), "{err}");
        let err = exec
            .capture(MOCK, &step, || exec.copy_into(&yh, &mut xd, "test: up"))
            .unwrap_err();
        assert!(err.to_string().contains("a copy (test: up)"), "{err}");
        assert_eq!(dev.kept(), [false, false]);
        assert!(dev.replays().is_empty());
        // The failed captures left nothing behind: ops run and copy as before.
        exec.run(Op::Add { x: &mut xh, y: &yh }).unwrap();
        exec.copy_into(&yh, &mut xd, "test: up").unwrap();
    }

    #[test]
    fn other_threads_wait_for_a_capture_to_end() {
        let (exec, dev) = capturing();
        let mut xd = exec.zeros(DataType::F32, &[1, 2], MOCK).unwrap();
        let yd = exec
            .to_device(&Data::from_f32(&[1, 2], &[1.0, 2.0]).unwrap(), MOCK, "test")
            .unwrap();
        let step = StepInputs {
            tokens: &[1],
            start_pos: 1,
            cache_row: 1,
        };
        std::thread::scope(|s| {
            let mut other = None;
            let graph = exec.capture(MOCK, &step, || {
                let h = s.spawn(|| exec.run(Op::Add { x: &mut xd, y: &yd }));
                std::thread::sleep(Duration::from_millis(50));
                assert!(
                    !h.is_finished(),
                    "an op of another thread ran inside a capture"
                );
                other = Some(h);
                Ok::<_, Error>(())
            });
            assert!(graph.is_ok());
            other.unwrap().join().unwrap().unwrap();
        });
        // The other thread's Add ran after the capture, on the device, and not in the graph.
        assert_eq!(dev.kept(), [true]);
        assert_eq!(dev.replays().len(), 1);
        let back = exec.to_host(&xd, "test").unwrap();
        assert_eq!(back.as_f32().unwrap(), &[1.0, 2.0]);
    }

    #[test]
    fn step_graphs_can_be_turned_off_and_devices_without_them_refuse() {
        let exec =
            Executor::with_profiling(vec![Box::new(RecordingDevice::new(MockAccelerator))], false);
        exec.set_step_graphs(false);
        assert!(!exec.can_capture(MOCK));
        let step = StepInputs {
            tokens: &[1],
            start_pos: 1,
            cache_row: 1,
        };
        let err = exec
            .capture(MOCK, &step, || Ok::<_, Error>(()))
            .unwrap_err();
        assert!(matches!(err, Error::Unsupported(_)), "{err}");
        exec.set_step_graphs(true);
        assert!(exec.capture(MOCK, &step, || Ok::<_, Error>(())).is_ok());
        let plain = Executor::with_profiling(vec![Box::new(MockAccelerator)], false);
        assert!(!plain.can_capture(MOCK));
        let err = plain
            .capture(MOCK, &step, || Ok::<_, Error>(()))
            .unwrap_err();
        assert!(matches!(err, Error::Unsupported(_)), "{err}");
    }
}
