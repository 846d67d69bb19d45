//! Helpers shared by the CPU op tests: the executor, seeded random tensors, weight dtype
//! conversion and a tolerance check that reports the worst element; and the GPU of the
//! CUDA tests.
//!
//! Every test compares the [`flm_devices::CpuDevice`] (run through [`flm_core::Executor`], as
//! the models run it) against a naive formula written in the test, evaluated in f64 on the
//! exact f32 inputs (and on the rounded weights for f16/bf16, since widening them is exact).

#![allow(dead_code, unused_macros)]

use flm_core::{AttentionParams, Data, DataType, Error, Executor, Op, PagedSeq, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Relative error allowed on an f32 dot product, measured against `Σ |a_i·b_i|`: its
/// rounding error is about `u·√k·rms(a_i·b_i)` for random data (`u = 2^-24`), far below
/// `1e-6·Σ|a_i·b_i| = 1e-6·k·mean|a_i·b_i|` at every size tested, while a dropped or wrong
/// term of ordinary size is far above it.
pub const DOT_REL: f64 = 1e-6;

/// f32 machine epsilon (2^-23 = two units of rounding) in f64.
pub const EPS: f64 = f32::EPSILON as f64;

/// An executor holding only the CPU device, profiling off.
pub fn executor() -> Executor {
    Executor::with_profiling(
        vec![Box::new(
            flm_devices::CpuDevice::new().expect("FLM_CPU_ISA names a level this CPU has"),
        )],
        false,
    )
}

/// Runs one op on a fresh CPU executor.
pub fn run(op: Op<'_>) -> Result<()> {
    executor().run(op)
}

/// CUDA GPU 0, or `None` after a line saying why the test skips (no driver, no device, no
/// libnvrtc or libcublas), so that GPU tests pass on machines without one.
#[cfg(feature = "cuda")]
pub fn gpu() -> Option<flm_devices::cuda::CudaDevice> {
    match flm_devices::cuda::CudaDevice::new(0) {
        Ok(d) => Some(d),
        Err(why) => {
            eprintln!("skipped: no CUDA GPU ({why})");
            None
        }
    }
}

/// A seeded generator, so that every failure reproduces.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `len` values uniform in `[-scale, scale)` (zeros for `scale == 0`).
pub fn uniform(rng: &mut StdRng, len: usize, scale: f32) -> Vec<f32> {
    if scale == 0.0 {
        return vec![0.0; len];
    }
    (0..len).map(|_| rng.random_range(-scale..scale)).collect()
}

/// An owned f32 tensor.
pub fn f32_data(shape: &[usize], values: &[f32]) -> Data {
    Data::from_f32(shape, values).expect("shape matches values")
}

/// `d`'s values rounded to the nearest f16 (as `half` rounds), as an f16 tensor: a KV cache
/// of `--kv-dtype f16`.
pub fn to_f16(d: &Data) -> Data {
    let values = d.to_f32_vec().expect("f32 values");
    let mut h = Data::zeros(DataType::F16, d.shape()).expect("shape fits");
    for (h, v) in h.as_f16_mut().expect("f16").iter_mut().zip(values) {
        *h = half::f16::from_f32(v);
    }
    h
}

/// A random f32 activation tensor and its values.
pub fn random_f32(rng: &mut StdRng, shape: &[usize], scale: f32) -> (Data, Vec<f32>) {
    let values = uniform(rng, shape.iter().product(), scale);
    (f32_data(shape, &values), values)
}

/// A random weight tensor in `dtype` and its values after rounding to that dtype, which is
/// what the reference formula must use.
pub fn random_weight(rng: &mut StdRng, shape: &[usize], dtype: DataType) -> (Data, Vec<f32>) {
    let (w, _) = random_f32(rng, shape, 1.0);
    let w = w.to_dtype(dtype).expect("conversion");
    let values = w.to_f32_vec().expect("a host tensor");
    (w, values)
}

/// `n_experts` random SwiGLU experts (`[inner, dim]` gate and up, `[dim, inner]` down) of
/// `dtype`, for `Op::MoeFfn`, in the layout the model graphs give the CPU (int8 and int4
/// in panels, [`flm_core::panels`]).
pub fn random_experts(
    rng: &mut StdRng,
    n_experts: usize,
    (dim, inner): (usize, usize),
    dtype: DataType,
) -> Vec<flm_core::Expert> {
    (0..n_experts)
        .map(|_| {
            let mut weight = |shape: &[usize]| {
                let w = random_weight(rng, shape, dtype).0;
                if flm_core::panels::has_panels(dtype) {
                    w.to_panels().expect("panels")
                } else {
                    w
                }
            };
            flm_core::Expert {
                gate: weight(&[inner, dim]),
                up: weight(&[inner, dim]),
                down: weight(&[dim, inner]),
                biases: None,
            }
        })
        .collect()
}

/// An f32 output tensor filled with NaN, so an element the kernel forgets to write fails.
pub fn nan_output(shape: &[usize]) -> Data {
    f32_data(shape, &vec![f32::NAN; shape.iter().product()])
}

/// The values `run` writes into a NaN-filled f32 output of `shape` (see [`nan_output`]).
pub fn output_of(shape: &[usize], run: impl FnOnce(&mut Data) -> Result<()>) -> Vec<f32> {
    let mut out = nan_output(shape);
    run(&mut out).expect("the op runs");
    out.to_f32_vec().expect("a host tensor")
}

/// Asserts that `got` has the bits of `want` (so `-0.0 != 0.0`, and NaN fails).
pub fn assert_same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: element {i}: {:e}, want {:e}", got[i], want[i]);
    }
}

/// Asserts `|got[i] - want[i]| <= tol(i)` for every `i`, reporting the worst violation.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], tol: impl Fn(usize) -> f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        let excess = err / tol(i).max(f64::MIN_POSITIVE);
        // Written so that a NaN result fails.
        let within = err <= tol(i);
        let worse = match worst {
            None => true,
            Some((_, e)) => excess > e || excess.is_nan(),
        };
        if !within && worse {
            worst = Some((i, excess));
        }
    }
    if let Some((i, _)) = worst {
        panic!(
            "{what}: element {i}: got {}, want {}, |diff| {:e} > tol {:e}",
            got[i],
            want[i],
            (got[i] as f64 - want[i]).abs(),
            tol(i)
        );
    }
}

/// One attention shape and mask.
#[derive(Debug, Clone, Copy)]
pub struct AttentionCase {
    /// Query rows, the first at position `start_pos`.
    pub n: usize,
    pub start_pos: usize,
    /// Query heads and KV heads.
    pub heads: (usize, usize),
    pub head_dim: usize,
    pub mask: Mask,
}

/// Which cache rows each query row sees, and how its scores are biased and capped.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mask {
    /// Sliding window: positions each row sees at most.
    pub window: Option<usize>,
    /// Rows of the prefix-LM mask's bidirectional prefix.
    pub bidirectional: usize,
    pub alibi: bool,
    /// Soft-capping of the scaled scores (Gemma 2).
    pub softcap: Option<f32>,
}

impl AttentionCase {
    /// `n` rows from `start_pos`, `heads` (query heads, KV heads) of `head_dim`: causal, no
    /// window, ALiBi or soft cap.
    pub fn new(n: usize, start_pos: usize, heads: (usize, usize), head_dim: usize) -> Self {
        AttentionCase {
            n,
            start_pos,
            heads,
            head_dim,
            mask: Mask::default(),
        }
    }

    /// The width of q and of the output: `n_heads · head_dim`.
    pub fn q_dim(&self) -> usize {
        self.heads.0 * self.head_dim
    }

    /// The width of the KV cache: `n_kv_heads · head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.heads.1 * self.head_dim
    }

    /// The case's attention, its scores scaled by `1/√head_dim`.
    pub fn params(&self) -> AttentionParams {
        AttentionParams {
            n_heads: self.heads.0,
            n_kv_heads: self.heads.1,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
            alibi: self.mask.alibi,
            softcap: self.mask.softcap,
            bidirectional: self.mask.bidirectional,
            sliding_window: self.mask.window,
        }
    }
}

/// The `PagedSeq`s of sequences of `(start_pos, n_rows)` over the block tables `tables`.
pub fn paged_seqs<'a>(
    seqs: impl IntoIterator<Item = (usize, usize)>,
    tables: &'a [Vec<u32>],
) -> Vec<PagedSeq<'a>> {
    seqs.into_iter()
        .zip(tables)
        .map(|((start_pos, n_rows), blocks)| PagedSeq {
            n_rows,
            start_pos,
            blocks,
        })
        .collect()
}

/// Generates a module named after `check` with one `#[test]` per listed dtype calling
/// `check(dtype)`: `dtype_tests!([f32: F32, f16: F16] linear_matches_formula)` gives
/// `linear_matches_formula::f32` and `linear_matches_formula::f16`.
macro_rules! dtype_tests {
    ([$($test:ident: $dtype:ident),* $(,)?] $check:ident) => {
        mod $check {
            $(
                #[test]
                fn $test() {
                    super::$check(flm_core::DataType::$dtype)
                }
            )*
        }
    };
}

/// [`dtype_tests!`] over the float weight dtypes, for each check.
macro_rules! weight_dtype_tests {
    ($($check:ident),* $(,)?) => {
        $(dtype_tests!([f32: F32, f16: F16, bf16: BF16] $check);)*
    };
}

/// [`dtype_tests!`] over the quantised weight dtypes, for each check.
#[allow(unused_macros)]
macro_rules! quant_dtype_tests {
    ($($check:ident),* $(,)?) => {
        $(dtype_tests!([
            i8: I8,
            i4g32: I4G32,
            i4g64: I4G64,
            i4g128: I4G128,
            i4sg32: I4SymG32,
            i4sg64: I4SymG64,
            i4sg128: I4SymG128,
            i4zg32: I4ZpG32,
            i4zg64: I4ZpG64,
            i4zg128: I4ZpG128
        ] $check);)*
    };
}

/// Runs `op` on the CPU ([`run`]) and asserts that it is refused with [`Error::Shape`];
/// `what` names the case in the failure message.
pub fn assert_shape_err(op: Op<'_>, what: impl std::fmt::Display) {
    match run(op) {
        Err(Error::Shape { .. }) => {}
        other => panic!("{what}: {other:?}, not a shape error"),
    }
}
