//! Criterion benchmarks of the Linear kernels (f32, f16, bf16, int8, int4, Q8_0, Q4_K and
//! Q6_K weights) at TinyLlama shapes, at every instruction-set level this CPU has: matrix ×
//! vector (decode) at 2048×2048 and 5632×2048,
//! reported in weight bytes/s, and the prefill matrix × matrix 128×2048×2048, reported in
//! multiply-adds/s. `linear_input_perm` times the same int4-sym-g128 decode and prefill
//! with and without an input permutation (act-order GPTQ: the gather before the product),
//! at the best level.

mod common;

use common::{operands, weight};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use flm_core::{Data, DataType, Executor, Op};
use flm_devices::{CpuDevice, Isa};

fn linear(c: &mut Criterion) {
    let shapes = [(1, 2048, 2048), (1, 5632, 2048), (128, 2048, 2048)];
    for dtype in [
        DataType::F32,
        DataType::F16,
        DataType::BF16,
        DataType::I8,
        DataType::I4G32,
        DataType::I4SymG32,
        DataType::Q8_0,
        DataType::Q5_0,
        DataType::Q4K,
        DataType::Q6K,
        DataType::IQ4NL,
        DataType::IQ4XS,
        DataType::MXFP4,
    ] {
        for (n, m, k) in shapes {
            let w = weight(m, k, dtype);
            let (x, mut out) = operands(n, m, k);
            let mut group = c.benchmark_group(format!("linear_{dtype}_{n}x{m}x{k}"));
            group.sample_size(10);
            group.measurement_time(std::time::Duration::from_secs(2));
            group.throughput(if n == 1 {
                Throughput::Bytes(w.size_bytes() as u64)
            } else {
                Throughput::Elements((n * m * k) as u64)
            });
            for isa in Isa::supported() {
                let exec = Executor::with_profiling(
                    vec![Box::new(CpuDevice::with_isa(isa).expect("supported"))],
                    false,
                );
                group.bench_function(BenchmarkId::from_parameter(isa), |b| {
                    b.iter(|| {
                        exec.run(Op::Linear {
                            input: &x,
                            weight: &w,
                            bias: None,
                            output: &mut out,
                        })
                        .expect("linear")
                    })
                });
            }
            group.finish();
        }
    }
}

/// A permutation of `0..k` that scatters neighbours (a stride coprime to `k`), as act-order
/// scatters a group's channels.
fn scattered(k: usize) -> Data {
    let stride = (k / 2 + 1..)
        .find(|s| gcd(*s, k) == 1)
        .expect("a coprime stride");
    let bytes: Vec<u8> = (0..k)
        .flat_map(|j| ((j * stride % k) as i32).to_le_bytes())
        .collect();
    Data::from_bytes(DataType::I32, &[k], &bytes).expect("permutation")
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn linear_input_perm(c: &mut Criterion) {
    let exec = Executor::with_profiling(vec![Box::new(CpuDevice::new().expect("cpu"))], false);
    for (n, m, k) in [
        (1, 2048, 2048),
        (1, 5632, 2048),
        (1, 2048, 5632),
        (128, 2048, 2048),
    ] {
        let plain = weight(m, k, DataType::I4SymG128);
        let permuted = plain
            .clone()
            .with_input_perm(scattered(k))
            .expect("permuted weight");
        let (x, mut out) = operands(n, m, k);
        let mut group = c.benchmark_group(format!("linear_input_perm_{n}x{m}x{k}"));
        group.sample_size(20);
        group.measurement_time(std::time::Duration::from_secs(2));
        for (name, w) in [("plain", &plain), ("permuted", &permuted)] {
            group.bench_function(name, |b| {
                b.iter(|| {
                    exec.run(Op::Linear {
                        input: &x,
                        weight: w,
                        bias: None,
                        output: &mut out,
                    })
                    .expect("linear")
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, linear, linear_input_perm);
criterion_main!(benches);
