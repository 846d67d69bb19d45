//! The bandwidth of the decode GEMV kernels (`kernels/gemv.cu`) on Llama-2-7B's matrix
//! shapes: for each weight dtype with a GPU GEMV layout and 1 and 8 input rows, one
//! Linear's time (CUDA events around a queued batch, `CudaDevice::time_queued`, the
//! activations' quantisation included) and the weight bytes it reads per second, with their
//! share of the GPU's peak bandwidth (`GpuInfo::peak_bandwidth`). Every operand lives in GPU
//! memory (an op's operands share one memory), the weight placed there as the executor
//! places it (`--gpu-layers`: int8/int4 in the GPU layout, read where they are). It prints
//! the table to
//! stdout; it fails with a message when no CUDA GPU is usable.
//!
//! The weights are random bytes (every 16-bit value and f32 scale kept finite): the kernels'
//! time does not depend on the values.
//!
//! `cargo run --release -p flm-devices --features cuda --example cuda_gemv_bandwidth`

use std::io::Write;

use flm_core::{BaseDevice, Data, DataType, Op};
use flm_devices::cuda::CudaDevice;
use flm_devices::gemv_layout::{has_layout, GemvLayout};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

/// Llama-2-7B's Linear weights `[out, in]`.
const SHAPES: [(&str, usize, usize); 4] = [
    ("q/k/v/o", 4096, 4096),
    ("gate/up", 11008, 4096),
    ("down", 4096, 11008),
    ("lm_head", 32000, 4096),
];

/// Linears per timed batch.
const REPS: usize = 50;

/// A tensor of `dtype` and `shape` in `gpu`'s memory, uploaded from its host `bytes` as the
/// executor uploads (int8/int4 repacked into the GPU layout).
fn on_gpu(gpu: &CudaDevice, dtype: DataType, shape: &[usize], bytes: &[u8]) -> Data {
    let mut buffer = gpu.alloc(bytes.len()).unwrap();
    let host = Data::from_bytes(dtype, shape, bytes).unwrap();
    gpu.upload_tensor(&host, buffer.as_mut()).unwrap();
    Data::from_device(dtype, shape, buffer).unwrap()
}

/// `len` random bytes whose odd bytes are below 0x40, so that every little-endian f16,
/// bf16 or f32 value at an even offset is finite.
fn random_bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rng.fill_bytes(&mut bytes);
    for b in bytes.iter_mut().skip(1).step_by(2) {
        *b &= 0x3f;
    }
    bytes
}

/// Times one Linear of `w` (`[m, k]`, `bytes` bytes read) on `n` random input rows in GPU
/// memory and writes its table row, labelled `label` and `name`.
fn time_row(
    gpu: &CudaDevice,
    out: &mut impl Write,
    rng: &mut StdRng,
    (label, name): (&str, &str),
    w: &Data,
    bytes: f64,
    n: usize,
) {
    let (m, k, peak) = (w.rows(), w.cols(), gpu.info().peak_bandwidth);
    let x = on_gpu(gpu, DataType::F32, &[n, k], &random_bytes(rng, 4 * n * k));
    let mut y = on_gpu(gpu, DataType::F32, &[n, m], &vec![0u8; 4 * n * m]);
    let mut run = || {
        let op = Op::Linear {
            input: &x,
            weight: w,
            bias: None,
            output: &mut y,
        };
        gpu.run(op.validate()?)
    };
    // A warm-up call.
    run().unwrap();
    let cells = match gpu.time_queued(REPS, &mut run) {
        Ok(secs) => {
            let gbps = bytes / secs / 1e9;
            let share = peak.map_or("-".into(), |p| format!("{:.1}%", 100.0 * gbps * 1e9 / p));
            format!("{:>9.1} {:>9.0} {:>7}", secs * 1e6, gbps, share)
        }
        Err(e) => format!("not timed: {e}"),
    };
    writeln!(
        out,
        "{label:<22} {name:<8} {m:>6} {k:>6} {n:>4} {:>10.1} {cells}",
        bytes / 1e6
    )
    .unwrap();
}

fn main() -> Result<(), String> {
    let gpu = CudaDevice::new(0)?;
    let info = gpu.info().clone();
    let peak = info.peak_bandwidth;
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "decode GEMV bandwidth on {} (peak {}), {REPS} Linears per timing, weights in GPU memory",
        info.name,
        peak.map_or("unknown".into(), |p| format!("{:.0} GB/s", p / 1e9))
    )
    .unwrap();
    writeln!(
        stdout,
        "{:<22} {:<8} {:>6} {:>6} {:>4} {:>10} {:>9} {:>9} {:>7}",
        "dtype", "weight", "out", "in", "n", "MB", "us", "GB/s", "peak"
    )
    .unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    for dtype in DataType::VALUES.into_iter().filter(|&d| has_layout(d)) {
        for (name, m, k) in SHAPES {
            let len = dtype.byte_len(&[m, k]).unwrap();
            let w = on_gpu(&gpu, dtype, &[m, k], &random_bytes(&mut rng, len));
            let bytes = GemvLayout::new(dtype, m, k).unwrap().bytes as f64;
            let label = dtype.to_string();
            for n in [1, 8] {
                let row = (label.as_str(), name);
                time_row(&gpu, &mut stdout, &mut rng, row, &w, bytes, n);
            }
        }
    }
    Ok(())
}
