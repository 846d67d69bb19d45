//! The [`Executor`]: runs each op on the first device that supports it, and profiles.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{BaseDevice, Data, DataType, Error, Op, OpKind, Result};

#[derive(Clone, Copy, Default)]
struct OpStat {
    count: u64,
    total: Duration,
}

/// The weights a Linear or Linears op reads, and whether it multiplies them by one input
/// row (a matrix × vector product, as in decode) or by several (matrix × matrix, prefill).
#[derive(Clone, PartialEq, Eq)]
struct WeightKey {
    kind: OpKind,
    matvec: bool,
    /// Each part's dtype and `[rows, cols]`.
    parts: Vec<(DataType, usize, usize)>,
}

impl WeightKey {
    /// The key and weight bytes of `op`, if it is a Linear or a Linears.
    fn of(op: &Op<'_>) -> Option<(WeightKey, usize)> {
        let (kind, input, weights): (_, _, Vec<&Data>) = match op {
            Op::Linear { input, weight, .. } => (OpKind::Linear, input, vec![weight]),
            Op::Linears { input, parts } => (
                OpKind::Linears,
                input,
                parts.iter().map(|p| p.weight).collect(),
            ),
            _ => return None,
        };
        let key = WeightKey {
            kind,
            matvec: input.rows() == 1,
            parts: weights
                .iter()
                .map(|w| (w.dtype(), w.rows(), w.cols()))
                .collect(),
        };
        Some((key, weights.iter().map(|w| w.size_bytes()).sum()))
    }

    /// `dtype rows×cols` of each part, joined by ` + `.
    fn label(&self) -> String {
        self.parts
            .iter()
            .map(|(dtype, rows, cols)| format!("{dtype} {rows}x{cols}"))
            .collect::<Vec<_>>()
            .join(" + ")
    }
}

/// The profile's tallies: per op kind, and per weight for the Linear ops.
struct Profile {
    kinds: [OpStat; OpKind::ALL.len()],
    /// Each key's calls, wall time and weight bytes per call.
    weights: Vec<(WeightKey, OpStat, usize)>,
}

/// Runs ops on devices held in priority order (for example CUDA, then CPU).
///
/// With `FLM_PROFILE=1` in the environment when it is created, it counts each op kind's
/// calls and wall time, and those of each weight matrix (or set of matrices) of the Linear
/// and Linears ops, with the bytes of weights they read per second, and prints the tables
/// to stderr when dropped (at exit). Without it the per-op cost is a branch and a short
/// loop over the devices.
pub struct Executor {
    devices: Vec<Box<dyn BaseDevice>>,
    profile: Option<Mutex<Profile>>,
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
            profile: profile.then(|| {
                Mutex::new(Profile {
                    kinds: [OpStat::default(); OpKind::ALL.len()],
                    weights: Vec::new(),
                })
            }),
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

    /// Checks `op` ([`Op::validate`]) and runs it on the first device that supports it.
    ///
    /// Errors: those of [`Op::validate`]; [`Error::Unsupported`] if no device supports the
    /// op; otherwise the device's error.
    pub fn run(&self, op: Op<'_>) -> Result<()> {
        let op = op.validate()?;
        let kind = op.op().kind();
        let device = self
            .devices
            .iter()
            .find(|d| d.supports(op.op()))
            .ok_or_else(|| Error::Unsupported(format!("{:?}", op.op())))?;
        match &self.profile {
            None => device.run(op),
            Some(profile) => {
                let weights = WeightKey::of(op.op());
                let start = Instant::now();
                let result = device.run(op);
                let elapsed = start.elapsed();
                if let Ok(mut profile) = profile.lock() {
                    profile.kinds[kind as usize].add(elapsed);
                    if let Some((key, bytes)) = weights {
                        match profile.weights.iter_mut().find(|(k, ..)| *k == key) {
                            Some((_, stat, _)) => stat.add(elapsed),
                            None => {
                                let mut stat = OpStat::default();
                                stat.add(elapsed);
                                profile.weights.push((key, stat, bytes));
                            }
                        }
                    }
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
        let Some(profile) = &self.profile else {
            return String::new();
        };
        let profile = match profile.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        let stats = &profile.kinds;
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
        if profile.weights.is_empty() {
            return out;
        }
        let mut weights: Vec<_> = profile.weights.iter().collect();
        weights.sort_by_key(|w| std::cmp::Reverse(w.1.total));
        out += &format!(
            "\nper weight (GB/s: weight bytes read per second):\n{:<8} {:<8} {:>10} {:>12} {:>10} {:>8}  weights\n",
            "op", "product", "calls", "total ms", "avg us", "GB/s"
        );
        for (key, stat, bytes) in weights {
            let secs = stat.total.as_secs_f64();
            out += &format!(
                "{:<8} {:<8} {:>10} {:>12.3} {:>10.3} {:>8.2}  {}\n",
                key.kind.name(),
                if key.matvec { "matvec" } else { "matmul" },
                stat.count,
                secs * 1e3,
                secs * 1e6 / stat.count as f64,
                (*bytes as f64 * stat.count as f64) / secs.max(1e-12) / 1e9,
                key.label()
            );
        }
        out
    }
}

impl OpStat {
    /// Counts one call that took `elapsed`.
    fn add(&mut self, elapsed: Duration) {
        self.count += 1;
        self.total += elapsed;
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
    use crate::{CheckedOp, LinearPart};

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
}
