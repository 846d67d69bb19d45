//! The executor's profiler (`FLM_PROFILE=1`): each op kind's calls and wall time, and those
//! of each weight of the Linear ops with the weight bytes they read per second.

use std::time::Duration;

use crate::{Data, DataType, Op, OpKind};

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

/// What the profile counts of one op, taken before the op runs (running consumes it).
pub(crate) struct Call {
    kind: OpKind,
    weights: Option<(WeightKey, usize)>,
}

impl Call {
    pub(crate) fn of(op: &Op<'_>) -> Call {
        Call {
            kind: op.kind(),
            weights: WeightKey::of(op),
        }
    }
}

/// The profile's tallies: per op kind, and per weight for the Linear ops.
#[derive(Default)]
pub(crate) struct Profile {
    kinds: [OpStat; OpKind::ALL.len()],
    /// Each key's calls, wall time and weight bytes per call.
    weights: Vec<(WeightKey, OpStat, usize)>,
}

impl Profile {
    /// Counts `call`, which took `elapsed`.
    pub(crate) fn record(&mut self, call: Call, elapsed: Duration) {
        self.kinds[call.kind as usize].add(elapsed);
        if let Some((key, bytes)) = call.weights {
            match self.weights.iter_mut().find(|(k, ..)| *k == key) {
                Some((_, stat, _)) => stat.add(elapsed),
                None => {
                    let mut stat = OpStat::default();
                    stat.add(elapsed);
                    self.weights.push((key, stat, bytes));
                }
            }
        }
    }

    /// The tables of [`crate::Executor::profile_report`].
    pub(crate) fn report(&self) -> String {
        let stats = &self.kinds;
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
        if self.weights.is_empty() {
            return out;
        }
        let mut weights: Vec<_> = self.weights.iter().collect();
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
