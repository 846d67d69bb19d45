//! A bounded mutation fuzzer on stable Rust, for the parsers of outside bytes.
//!
//! `cargo fuzz` needs a nightly toolchain (for `-Zsanitizer` and coverage
//! instrumentation); this harness runs with the workspace's stable one, in the ordinary
//! test suite. [`fuzz`] starts from a seed corpus (files of `tests/data` and the committed
//! `tests/fuzz/<target>/` directory, which also holds every input that once failed, as a
//! regression test), mutates seeds with the classic byte-level operators of AFL and
//! libFuzzer (bit flips, random and "interesting" bytes and integers, insertions,
//! deletions, duplicated ranges, splices of two seeds, truncations), and calls the target
//! with each result for a bounded time: `FLM_FUZZ_SECONDS` per target (CI: 20), 1 by
//! default. The stream of inputs is seeded (`FLM_FUZZ_SEED`, default 0), so a run is
//! reproducible on one machine up to the number of executions its time allows.
//!
//! The target must not panic, whatever the bytes: a panic stops the run, the input is
//! written under the target directory, and the test fails naming the file. It is not
//! coverage-guided (that needs instrumentation), so mutations favour the first 4 KiB of
//! each input, where every format keeps its headers.

use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What a [`fuzz`] run did.
#[derive(Debug, Clone, Copy)]
pub struct Report {
    /// Inputs the target was called with (the unmutated seeds included).
    pub executions: u64,
    /// Time the run took.
    pub elapsed: Duration,
}

impl Report {
    /// Executions per second.
    pub fn rate(&self) -> f64 {
        self.executions as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// SplitMix64 (Steele, Lea & Flood 2014): a small, fast, seedable stream for the mutator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// An offset into `len` bytes (`len > 0`): in the first 4 KiB three times out of four.
    fn offset(&mut self, len: usize) -> usize {
        if self.below(4) > 0 {
            self.below(len.min(4096))
        } else {
            self.below(len)
        }
    }
}

/// Values that sit on the edges of parsers' checks (AFL's "interesting" values).
const INTERESTING: [u64; 12] = [
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX,
    64,
];

/// Mutates `input` in place with 1 to 4 operators; `other` is another seed, for splices.
fn mutate(rng: &mut Rng, input: &mut Vec<u8>, other: &[u8]) {
    for _ in 0..1 + rng.below(4) {
        if input.is_empty() {
            input.push(rng.next() as u8);
            continue;
        }
        let at = rng.offset(input.len());
        match rng.below(9) {
            0 => input[at] ^= 1 << rng.below(8),
            1 => input[at] = rng.next() as u8,
            2 => {
                let value = INTERESTING[rng.below(INTERESTING.len())];
                let width = [1, 2, 4, 8][rng.below(4)].min(input.len() - at);
                input[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
            }
            3 => {
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                input.splice(at..at, bytes);
            }
            4 => {
                let n = (1 + rng.below(64)).min(input.len() - at);
                input.drain(at..at + n);
            }
            5 => {
                let n = (1 + rng.below(64)).min(input.len() - at);
                let copy = input[at..at + n].to_vec();
                let to = rng.offset(input.len());
                input.splice(to..to, copy);
            }
            6 if !other.is_empty() => {
                let from = rng.offset(other.len());
                let n = (1 + rng.below(256)).min(other.len() - from);
                let end = (at + n).min(input.len());
                input.splice(at..end, other[from..from + n].iter().copied());
            }
            7 => input.truncate(at),
            _ => {
                // A decimal number in text formats (JSON, pickle's text opcodes).
                let digits = INTERESTING[rng.below(INTERESTING.len())].to_string();
                let end = (at + digits.len()).min(input.len());
                input.splice(at..end, digits.bytes());
            }
        }
    }
}

/// The seconds each target runs: `FLM_FUZZ_SECONDS`, else 1.
fn budget() -> Duration {
    let seconds = std::env::var("FLM_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(1.0);
    Duration::from_secs_f64(seconds)
}

/// The files of the committed corpus `tests/fuzz/<target>/`, sorted by name.
pub fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = crate::data_dir().join("../fuzz").join(target);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    paths.sort();
    paths
        .iter()
        .filter(|p| p.is_file())
        .map(|p| std::fs::read(p).unwrap())
        .collect()
}

/// Runs `target` on every seed, then on mutations of them until the budget is spent, and
/// prints the executions and their rate. `findings` is where a failing input is written.
///
/// Panics (failing the test) when the target panics, naming the file that holds the input.
pub fn fuzz(name: &str, seeds: &[Vec<u8>], findings: &Path, mut target: impl FnMut(&[u8])) {
    assert!(!seeds.is_empty(), "fuzz {name}: no seeds");
    let seed = std::env::var("FLM_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0u64);
    let name_hash = name
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    let mut rng = Rng(seed ^ name_hash);
    let (start, budget) = (Instant::now(), budget());
    let mut executions = 0u64;
    let mut run = |input: &[u8]| {
        executions += 1;
        if panic::catch_unwind(AssertUnwindSafe(|| target(input))).is_err() {
            std::fs::create_dir_all(findings).unwrap();
            let hash = input.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            });
            let path = findings.join(format!("{name}-{hash:016x}"));
            std::fs::write(&path, input).unwrap();
            panic!(
                "fuzz {name}: the target panicked on the input written to {} (add it to \
                 tests/fuzz/{name}/ once fixed)",
                path.display()
            );
        }
    };
    for input in seeds {
        run(input);
    }
    while start.elapsed() < budget {
        let mut input = seeds[rng.below(seeds.len())].clone();
        let other = &seeds[rng.below(seeds.len())];
        mutate(&mut rng, &mut input, other);
        run(&input);
    }
    let report = Report {
        executions,
        elapsed: start.elapsed(),
    };
    eprintln!(
        "fuzz {name}: {} executions in {:.1} s, {:.0} per second",
        report.executions,
        report.elapsed.as_secs_f64(),
        report.rate()
    );
}
