//! Kernel-level prefill timings on the GPU, written to stderr: the Linear of
//! Llama-2-7B's feed-forward shape (2048 rows × 4096 inputs × 11008 outputs) for f16, int8
//! and int4 weights (the quantised ones dequantised to f16 for cuBLAS), and attention of
//! 2048 causal rows over 32 heads of 128 (the flash kernel), in TFLOP/s, with every operand
//! resident on the GPU so that no host copy is timed. Fails with a message where no CUDA
//! GPU is usable.
//!
//! `cargo run --release -p flm-devices --features cuda --example cuda_prefill_bench`

use std::io::Write;
use std::time::Instant;

use flm_core::{AttentionOperands, AttentionParams, BaseDevice, Data, DataType, Executor, Op};
use flm_devices::cuda::CudaDevice;

/// Times of each op: one warm-up, then this many, averaged.
const REPS: usize = 10;

/// Deterministic values in [-1, 1) (no RNG: the timings do not depend on them).
fn values(shape: &[usize], seed: usize) -> Data {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| (((i + seed) as u64 * 2_654_435_761) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    Data::from_f32(shape, &v).unwrap()
}

/// Writes a figure to stderr, where `../shared/gpu/run.sh`'s logs hold it.
fn report(line: String) {
    std::io::stderr()
        .write_all(format!("{line}\n").as_bytes())
        .unwrap();
}

/// Seconds per run of `op` on the executor's GPU, averaged over [`REPS`] after a warm-up;
/// the one-value download of `sync` waits for the stream.
fn time(exec: &Executor, sync: &Data, mut op: impl FnMut() -> flm_core::Result<()>) -> f64 {
    op().unwrap();
    exec.to_host(sync, "bench: sync").unwrap();
    let t = Instant::now();
    for _ in 0..REPS {
        op().unwrap();
    }
    exec.to_host(sync, "bench: sync").unwrap();
    t.elapsed().as_secs_f64() / REPS as f64
}

fn main() -> Result<(), String> {
    let gpu = CudaDevice::new(0)?;
    let (name, location) = (gpu.info().name.clone(), gpu.location());
    let exec = Executor::new(vec![Box::new(gpu)]);
    let dev = |d: &Data| exec.to_device(d, location, "bench: upload").unwrap();
    let sync = dev(&values(&[1], 0));
    report(format!("prefill kernels on {name}, mean of {REPS} runs"));

    let (n, k, m) = (2048, 4096, 11008);
    let x = dev(&values(&[n, k], 1));
    let mut y = dev(&Data::zeros(DataType::F32, &[n, m]).unwrap());
    let w_values = values(&[m, k], 2);
    for dtype in [
        DataType::F16,
        DataType::I8,
        DataType::I4G32,
        DataType::I4SymG128,
    ] {
        let w = dev(&w_values.to_dtype(dtype).unwrap());
        let s = time(&exec, &sync, || {
            exec.run(Op::Linear {
                input: &x,
                weight: &w,
                bias: None,
                output: &mut y,
            })
        });
        let tflops = 2.0 * (n * k * m) as f64 / s / 1e12;
        report(format!(
            "Linear {dtype} {n}x{k}x{m}: {:.3} ms, {tflops:.1} TFLOP/s",
            s * 1e3
        ));
    }

    let (heads, kv_heads, head_dim) = (32, 32, 128);
    let q = dev(&values(&[n, heads * head_dim], 3));
    let cache_k = dev(&values(&[n, kv_heads * head_dim], 4));
    let cache_v = dev(&values(&[n, kv_heads * head_dim], 5));
    let mut out = dev(&Data::zeros(DataType::F32, &[n, heads * head_dim]).unwrap());
    let s = time(&exec, &sync, || {
        exec.run(Op::Attention {
            operands: AttentionOperands {
                q: &q,
                cache_k: &cache_k,
                cache_v: &cache_v,
                rope: None,
                params: AttentionParams::causal(heads, kv_heads, 1.0 / (head_dim as f32).sqrt()),
                sinks: None,
                output: &mut out,
            },
            start_pos: 0,
        })
    });
    // Causal: about half of the n × n scores, two products (QKᵀ and PV) of head_dim each.
    let tflops = 2.0 * 2.0 * (n * n / 2 * heads * head_dim) as f64 / s / 1e12;
    report(format!(
        "Attention causal {n} rows, {heads}/{kv_heads} heads x {head_dim}: {:.3} ms, {tflops:.1} TFLOP/s",
        s * 1e3
    ));
    Ok(())
}
