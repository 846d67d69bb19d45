//! The decode GEMV kernels (`kernels/gemv.cu`) against the CPU device's Linear: every
//! weight dtype with a GPU GEMV layout (f16, bf16, int8, int4 at groups of 32, 64 and 128 in
//! each form), odd sizes (columns not a multiple of the group or of 8, rows not a multiple
//! of the rows per block), 1, 2, 5 and 8 input rows (one launch row), with and without a
//! bias; 17 rows (three launch rows) once batch invariance was asked for, each row's output
//! bit for bit that of the row alone; and the weights that live in GPU memory (placed by the
//! executor's upload, int8/int4 ones in the GPU layout: read where they are by the same
//! kernels, by the prefill's dequantisation and by the Embedding, and downloaded back as
//! their .flm bytes). Skips with a message when no CUDA GPU is usable.
//!
//! Both devices take f32 activations against f16/bf16 weights and int8 activations
//! quantised in blocks of 32 with the same rounding against int8/int4 weights, so they
//! should differ by the order of f32 sums only. The tolerances, relative to `Σ|x·w|`: 1e-5
//! for f16/bf16, far below one wrong term; 1e-3 for int8/int4, which still fails a wrong
//! term at the sizes below 1000 columns and leaves room for an activation code rounded the
//! other way (about `0.016 / k`).
#![cfg(feature = "cuda")]

mod common;

use common::{gpu, nan_output, random_f32, rng};
use flm_core::{BaseDevice, Data, DataType, Op, TokenIds};
use flm_devices::cuda::CudaDevice;
use flm_devices::gemv_layout::{has_layout, packed_in_gpu_memory, GemvLayout};
use flm_devices::CpuDevice;

/// `w` copied into GPU memory, as the executor places a weight (`Executor::copy_into`).
fn resident(gpu: &CudaDevice, w: &Data) -> Data {
    let mut buffer = gpu.alloc(w.size_bytes()).unwrap();
    gpu.upload_tensor(w, buffer.as_mut()).unwrap();
    Data::from_device(w.dtype(), w.shape(), buffer).unwrap()
}

/// The f32 values of `d`, a tensor in `gpu`'s memory.
fn values_of(gpu: &CudaDevice, d: &Data) -> Vec<f32> {
    let mut host = Data::zeros(d.dtype(), d.shape()).unwrap();
    gpu.download_tensor(d.device_buffer().unwrap(), &mut host)
        .unwrap();
    host.to_f32_vec().unwrap()
}

/// The Linear on `gpu` with every operand in its memory (an op's operands live in one
/// memory): `w` placed there already, `x` and `bias` copied in, the output copied back.
fn resident_linear(gpu: &CudaDevice, x: &Data, w: &Data, bias: Option<&Data>) -> Vec<f32> {
    let (x, bias) = (resident(gpu, x), bias.map(|b| resident(gpu, b)));
    let mut out = resident(gpu, &nan_output(&[x.rows(), w.rows()]));
    let op = Op::Linear {
        input: &x,
        weight: w,
        bias: bias.as_ref(),
        output: &mut out,
    };
    assert!(gpu.supports(&op), "cuda runs the resident Linear");
    gpu.run(op.validate().unwrap()).unwrap();
    values_of(gpu, &out)
}

/// The Linear on `dev` (a host output, copied back).
fn linear(dev: &dyn BaseDevice, x: &Data, w: &Data, bias: Option<&Data>) -> Vec<f32> {
    let mut out = nan_output(&[x.rows(), w.rows()]);
    let op = Op::Linear {
        input: x,
        weight: w,
        bias,
        output: &mut out,
    };
    assert!(dev.supports(&op), "{} runs the Linear", dev.name());
    dev.run(op.validate().unwrap()).unwrap();
    out.to_f32_vec().unwrap()
}

/// `|gpu − cpu| <= tol · Σ_i |x[r, i] · w[o, i]|` for every output element.
fn check(what: &str, x: &Data, w: &Data, gpu: &[f32], cpu: &[f32], tol: f32) {
    let (xv, wv, k) = (x.to_f32_vec().unwrap(), w.to_f32_vec().unwrap(), x.cols());
    let m = w.rows();
    for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        let (r, o) = (i / m, i % m);
        let scale: f32 = xv[r * k..][..k]
            .iter()
            .zip(&wv[o * k..][..k])
            .map(|(a, b)| (a * b).abs())
            .sum::<f32>()
            + 1e-6;
        let err = (g - c).abs() / scale;
        assert!(
            err <= tol,
            "{what}: element {i} (row {r}, output {o}) gpu {g} cpu {c}: error {err} > {tol}"
        );
    }
}

fn tolerance(dtype: DataType) -> f32 {
    if dtype.is_quantized() {
        1e-3
    } else {
        1e-5
    }
}

#[test]
fn gemv_every_layout_dtype_against_the_cpu() {
    let Some(gpu) = gpu() else { return };
    let cpu = CpuDevice::new().unwrap();
    let mut rng = rng(34);
    for dtype in DataType::VALUES.into_iter().filter(|&d| has_layout(d)) {
        for (k, m) in [(4096, 300), (333, 77), (1000, 129), (31, 3), (8, 5)] {
            let w = random_f32(&mut rng, &[m, k], 1.0)
                .0
                .to_dtype(dtype)
                .unwrap();
            let bias = random_f32(&mut rng, &[m], 1.0).0;
            for n in [1, 2, 5, 8] {
                let x = random_f32(&mut rng, &[n, k], 1.0).0;
                let b = (n % 2 == 1).then_some(&bias);
                let what = format!("{dtype} n={n} k={k} m={m} bias={}", b.is_some());
                let g = linear(&gpu, &x, &w, b);
                let c = linear(&cpu, &x, &w, b);
                check(&what, &x, &w, &g, &c, tolerance(dtype));
            }
        }
    }
}

#[test]
fn gemv_rows_beyond_eight_are_batch_invariant() {
    let Some(gpu) = gpu() else { return };
    // From here on every Linear of f16/bf16/int8/int4 weights takes the GEMV kernels, 17
    // rows as three launch rows, and a row's output must not depend on its neighbours.
    gpu.require_batch_invariance();
    let cpu = CpuDevice::new().unwrap();
    let mut rng = rng(36);
    for dtype in DataType::VALUES.into_iter().filter(|&d| has_layout(d)) {
        let (n, k, m) = (17, 1000, 129);
        let w = random_f32(&mut rng, &[m, k], 1.0)
            .0
            .to_dtype(dtype)
            .unwrap();
        let x = random_f32(&mut rng, &[n, k], 1.0).0;
        let g = linear(&gpu, &x, &w, None);
        let c = linear(&cpu, &x, &w, None);
        check(&format!("{dtype} n={n}"), &x, &w, &g, &c, tolerance(dtype));
        let xv = x.to_f32_vec().unwrap();
        for r in [0, 7, 8, 16] {
            let alone = Data::from_f32(&[1, k], &xv[r * k..][..k]).unwrap();
            let one = linear(&gpu, &alone, &w, None);
            let same = one
                .iter()
                .zip(&g[r * m..][..m])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{dtype}: row {r} of {n} differs from the row alone");
        }
    }
}

#[test]
fn gemv_weights_in_gpu_memory() {
    let Some(gpu) = gpu() else { return };
    let cpu = CpuDevice::new().unwrap();
    let mut rng = rng(35);
    // f16 rows read where they are (k % 8 == 0) or repacked once (k % 8 != 0); int8 and int4
    // read where they are, in the GPU layout they were uploaded in: the decode kernels (the
    // host weights' tolerance) and, at 17 rows, the prefill's f16 dequantisation (f16
    // activations: cuda_ops' tolerance).
    for dtype in [
        DataType::F16,
        DataType::BF16,
        DataType::I8,
        DataType::I4G32,
        DataType::I4SymG128,
        DataType::I4ZpG64,
    ] {
        for (k, m) in [(1024, 67), (333, 77)] {
            let host = random_f32(&mut rng, &[m, k], 1.0)
                .0
                .to_dtype(dtype)
                .unwrap();
            let w = resident(&gpu, &host);
            let bias = random_f32(&mut rng, &[m], 1.0).0;
            for n in [1, 5, 17] {
                if n > 8 && !dtype.is_quantized() {
                    continue;
                }
                let x = random_f32(&mut rng, &[n, k], 1.0).0;
                let b = (n == 5).then_some(&bias);
                let what = format!("resident {dtype} n={n} k={k} m={m} bias={}", b.is_some());
                let g = resident_linear(&gpu, &x, &w, b);
                let c = linear(&cpu, &x, &host, b);
                let tol = if n > 8 { 2e-2 } else { tolerance(dtype) };
                check(&what, &x, &host, &g, &c, tol);
            }
        }
    }
}

#[test]
fn quantised_tensors_in_gpu_memory_round_trip_and_embed() {
    let Some(gpu) = gpu() else { return };
    let cpu = CpuDevice::new().unwrap();
    let mut rng = rng(37);
    for dtype in DataType::VALUES
        .into_iter()
        .filter(|&d| packed_in_gpu_memory(d))
    {
        // Odd sizes; a 1-D tensor is one row.
        for shape in [&[100, 333][..], &[7, 64], &[333]] {
            let host = random_f32(&mut rng, shape, 1.0).0.to_dtype(dtype).unwrap();
            let on_gpu = resident(&gpu, &host);
            // The buffer holds the GPU layout, and downloads as the .flm bytes.
            let layout = GemvLayout::for_shape(dtype, shape).unwrap();
            let mut raw = vec![0u8; host.size_bytes()];
            gpu.download(on_gpu.device_buffer().unwrap(), &mut raw)
                .unwrap();
            assert_eq!(
                raw,
                layout.pack(host.bytes().unwrap()).unwrap(),
                "{dtype} {shape:?}"
            );
            let mut back = Data::zeros(dtype, shape).unwrap();
            gpu.download_tensor(on_gpu.device_buffer().unwrap(), &mut back)
                .unwrap();
            assert_eq!(
                back.bytes().unwrap(),
                host.bytes().unwrap(),
                "{dtype} {shape:?} round trip"
            );
            if shape.len() != 2 {
                continue;
            }
            // The Embedding reads the table where it is, as it reads a host one.
            let tokens = [0u32, (shape[0] - 1) as u32, 3, 0];
            let out_shape = [tokens.len(), shape[1]];
            let mut g = resident(&gpu, &nan_output(&out_shape));
            let mut c = nan_output(&out_shape);
            for (dev, table, out) in [
                (&gpu as &dyn BaseDevice, &on_gpu, &mut g),
                (&cpu, &host, &mut c),
            ] {
                let op = Op::Embedding {
                    table,
                    tokens: TokenIds::Host(&tokens),
                    output: out,
                };
                assert!(dev.supports(&op), "{} runs the Embedding", dev.name());
                dev.run(op.validate().unwrap()).unwrap();
            }
            let outs = [values_of(&gpu, &g), c.to_f32_vec().unwrap()];
            let same = outs[0]
                .iter()
                .zip(&outs[1])
                .all(|(a, b)| (a - b).abs() <= 1e-6 * (1.0 + b.abs()));
            assert!(same, "Embedding of a resident {dtype} {shape:?} table");
        }
    }
}
