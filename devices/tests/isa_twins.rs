//! Every SIMD level this CPU supports against the portable twin ([`Isa::Scalar`]) on the
//! same random operands, odd sizes included: tiles of weight rows and input rows that do not
//! divide the sizes, partial blocks and groups, and sizes above the parallel threshold.
//!
//! The formula tests of the other files run with the level `FLM_CPU_ISA` selects (the best
//! one by default); `.ci/run` also runs them with each lower level forced.

#[macro_use]
mod common;

use common::*;
use flm_core::{Data, DataType, Executor, Op};
use flm_devices::{CpuDevice, Isa};

/// An executor holding only the CPU device at `isa`.
fn executor_at(isa: Isa) -> Executor {
    let device = CpuDevice::with_isa(isa).expect("a supported level");
    Executor::with_profiling(vec![Box::new(device)], false)
}

/// Runs `Op::Linear` at `isa`.
fn linear_at(isa: Isa, x: &Data, weight: &Data, bias: Option<&Data>) -> Vec<f32> {
    let mut out = nan_output(&[x.rows(), weight.rows()]);
    executor_at(isa)
        .run(Op::Linear {
            input: x,
            weight,
            bias,
            output: &mut out,
        })
        .expect("linear");
    out.as_f32().expect("f32").to_vec()
}

/// Each level's Linear against the scalar one. The integer sums are exact in both, so they
/// differ only by the order of the f32 accumulation: at most `1e-5 · Σ|ŵ·x|`.
fn linear_matches_scalar(dtype: DataType) {
    let mut rng = rng(0x15a);
    let sizes = [
        (1, 1, 1),
        (1, 33, 5),
        (2, 64, 4),
        (3, 95, 9),
        (4, 128, 8),
        (5, 160, 7),
        (7, 257, 13),
        (9, 300, 6),
        (1, 2048, 67),
        (6, 1000, 45),
        (37, 64, 512),
        (37, 172, 64),
    ];
    for (n, k, m) in sizes {
        let (x, xv) = random_f32(&mut rng, &[n, k], 1.0);
        let (w, wv) = random_weight(&mut rng, &[m, k], dtype);
        let (b, _) = random_f32(&mut rng, &[m], 1.0);
        let want = linear_at(Isa::Scalar, &x, &w, Some(&b));
        let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
        let mag: Vec<f64> = (0..n * m)
            .map(|e| {
                let (i, j) = (e / m, e % m);
                (0..k)
                    .map(|c| (wv[j * k + c] * xv[i * k + c]).abs() as f64)
                    .sum::<f64>()
            })
            .collect();
        for isa in Isa::supported().into_iter().filter(|&i| i != Isa::Scalar) {
            let got = linear_at(isa, &x, &w, Some(&b));
            let what = format!("Linear {dtype} at {isa}, n={n} k={k} m={m}");
            assert_close(&what, &got, &want, |e| 1e-5 * mag[e] + 1e-6);
        }
    }
}

dtype_tests!([int8: I8, int4_g32: I4G32, int4_g64: I4G64, int4_g128: I4G128] linear_matches_scalar);
