//! The [`Executor`]: runs each op on the first device that supports it, and profiles.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{BaseDevice, Error, Op, OpKind, Result};

#[derive(Clone, Copy, Default)]
struct OpStat {
    count: u64,
    total: Duration,
}

/// Runs ops on devices held in priority order (for example CUDA, then CPU).
///
/// With `FLM_PROFILE=1` in the environment when it is created, it counts each op kind's
/// calls and wall time and prints a table to stderr when dropped (at exit). Without it the
/// per-op cost is a branch and a short loop over the devices.
pub struct Executor {
    devices: Vec<Box<dyn BaseDevice>>,
    profile: Option<Mutex<[OpStat; OpKind::ALL.len()]>>,
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
            profile: profile.then(|| Mutex::new([OpStat::default(); OpKind::ALL.len()])),
        }
    }

    /// Names of the devices, in priority order.
    pub fn device_names(&self) -> Vec<&'static str> {
        self.devices.iter().map(|d| d.name()).collect()
    }

    /// Makes every device batch-invariant from now on (see
    /// [`BaseDevice::require_batch_invariance`]).
    pub fn require_batch_invariance(&self) {
        for device in &self.devices {
            device.require_batch_invariance();
        }
    }

    /// Runs `op` on the first device that supports it.
    ///
    /// Errors: [`Error::Unsupported`] if no device does; otherwise the device's error.
    pub fn run(&self, op: Op<'_>) -> Result<()> {
        let kind = op.kind();
        let device = self
            .devices
            .iter()
            .find(|d| d.supports(&op))
            .ok_or_else(|| Error::Unsupported(format!("{op:?}")))?;
        match &self.profile {
            None => device.run(op),
            Some(stats) => {
                let start = Instant::now();
                let result = device.run(op);
                let elapsed = start.elapsed();
                if let Ok(mut stats) = stats.lock() {
                    let stat = &mut stats[kind as usize];
                    stat.count += 1;
                    stat.total += elapsed;
                }
                result
            }
        }
    }

    /// The profile as a printable table (empty when profiling is off).
    pub fn profile_report(&self) -> String {
        let Some(stats) = &self.profile else {
            return String::new();
        };
        let stats = match stats.lock() {
            Ok(s) => *s,
            Err(poisoned) => *poisoned.into_inner(),
        };
        let total: Duration = stats.iter().map(|s| s.total).sum();
        let mut out = format!(
            "{:<12} {:>10} {:>12} {:>10} {:>6}\n",
            "op", "calls", "total ms", "avg us", "%"
        );
        for (kind, stat) in OpKind::ALL.iter().zip(stats.iter()) {
            if stat.count == 0 {
                continue;
            }
            let ms = stat.total.as_secs_f64() * 1e3;
            out += &format!(
                "{:<12} {:>10} {:>12.3} {:>10.3} {:>6.1}\n",
                kind.name(),
                stat.count,
                ms,
                ms * 1e3 / stat.count as f64,
                100.0 * stat.total.as_secs_f64() / total.as_secs_f64().max(1e-12)
            );
        }
        out
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        if self.profile.is_some() {
            eprint!("flm profile (per op kind):\n{}", self.profile_report());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Data, DataType};

    struct OnlyAdd;
    impl BaseDevice for OnlyAdd {
        fn name(&self) -> &'static str {
            "only-add"
        }
        fn supports(&self, op: &Op<'_>) -> bool {
            matches!(op, Op::Add { .. })
        }
        fn require_batch_invariance(&self) {}
        fn run(&self, op: Op<'_>) -> Result<()> {
            if let Op::Add { x, y } = op {
                let y = y.as_f32()?.to_vec();
                for (a, b) in x.as_f32_mut()?.iter_mut().zip(y) {
                    *a += b;
                }
            }
            Ok(())
        }
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
}
