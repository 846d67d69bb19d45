//! Batch invariance of the CPU ops: each output row is bit-identical whatever other rows
//! are computed in the same call, wherever it sits in the batch, and however the call is
//! split over threads (Thinking Machines Lab, "Defeating Nondeterminism in LLM Inference",
//! 2025). Continuous batching computes a request's decode row together with other requests'
//! rows, and speculative decoding verifies draft tokens in one forward of several rows;
//! both must give what one row at a time gives.
//!
//! Every op takes its rows from a pool of [`POOL`] random rows (or positions): each pool row
//! is computed alone (`n = 1`), then in batches of [`BATCHES`] rows that start at different
//! pool rows, so that a row sits at different positions of different batches, with rayon
//! pools of 1 and 2 threads. The level is the one `FLM_CPU_ISA` names (`.ci/run` forces
//! each in turn), or every level this CPU has when it is unset: invariance holds per level,
//! levels differ from each other by rounding.

#[macro_use]
mod common;

use common::*;
use flm_core::{
    AttentionOperands, AttentionParams, DataType, Executor, MoeRouting, Op, RopeStyle, RopeTable,
};
use flm_devices::{ActivationBits, CpuDevice, Isa};

/// Batch sizes: 1, odd sizes that leave partial tiles, the AMX threshold (8), above 128.
const BATCHES: [usize; 9] = [1, 2, 3, 5, 8, 13, 17, 33, 130];

/// Rows (or positions) the batches take their rows from.
const POOL: usize = 150;

/// The first pool row of the batch of `n` rows, different for each batch size.
fn first_row(n: usize) -> usize {
    (7 * n + 3) % (POOL - n + 1)
}

/// Checks the op `batch(executor, first, n)`, which computes pool rows `first..first + n` in
/// one call and returns their `[n, width]` outputs, at every level and thread count.
fn check(what: &str, batch: impl Fn(&Executor, usize, usize) -> Vec<f32> + Sync) {
    check_with(ActivationBits::Int8, what, batch)
}

/// [`check`] on CPU devices whose quantised Linears use `bits` activations.
fn check_with(
    bits: ActivationBits,
    what: &str,
    batch: impl Fn(&Executor, usize, usize) -> Vec<f32> + Sync,
) {
    for isa in Isa::to_check().expect("FLM_CPU_ISA names a level this CPU has") {
        let cpu = CpuDevice::with_isa(isa).expect("a supported level");
        // Never asked for batch invariance: the CPU kernels have it whatever the caller asks.
        let exec = Executor::with_profiling(vec![Box::new(cpu.with_activation_bits(bits))], false);
        let mut alone: Vec<Vec<f32>> = Vec::new();
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("thread pool");
            pool.install(|| {
                for r in 0..POOL {
                    let row = batch(&exec, r, 1);
                    match alone.get(r) {
                        Some(want) => {
                            let what = format!("{what} at {isa}: row {r} alone on {threads}");
                            assert_same_bits(&what, &row, want);
                        }
                        None => alone.push(row),
                    }
                }
                for n in BATCHES {
                    let first = first_row(n);
                    let got = batch(&exec, first, n);
                    let width = got.len() / n;
                    for (i, got) in got.chunks_exact(width).enumerate() {
                        let what = format!(
                            "{what} at {isa}, {threads} threads: row {} at {i} of {n}",
                            first + i
                        );
                        assert_same_bits(&what, got, &alone[first + i]);
                    }
                }
            });
        }
    }
}

/// Linear with every weight dtype, a bias, and shapes with partial tiles, a row shorter than
/// one AVX-512 vector, several 512-column panels, rows longer than the 2048 columns of
/// TinyLlama's attention (4500, ending in a partial chunk), and serial and parallel calls.
fn linear_is_batch_invariant(dtype: DataType) {
    linear_is_batch_invariant_with(ActivationBits::Int8, dtype)
}

/// The same with 16-bit activations, whose residual rows double the kernels' input rows.
fn linear_is_batch_invariant_with_16_bit_activations(dtype: DataType) {
    linear_is_batch_invariant_with(ActivationBits::Int16, dtype)
}

fn linear_is_batch_invariant_with(bits: ActivationBits, dtype: DataType) {
    for (k, m) in [(13, 19), (300, 67), (1100, 150), (4500, 21)] {
        let mut rng = rng(k as u64 * 1000 + m as u64);
        let (_, x) = random_f32(&mut rng, &[POOL, k], 1.0);
        let (w, _) = random_weight(&mut rng, &[m, k], dtype);
        let (bias, _) = random_f32(&mut rng, &[m], 1.0);
        let what = format!("Linear {dtype} k={k} m={m}, {bits}-bit activations");
        check_with(bits, &what, |exec, first, n| {
            output_of(&[n, m], |output| {
                exec.run(Op::Linear {
                    input: &f32_data(&[n, k], &x[first * k..(first + n) * k]),
                    weight: &w,
                    bias: Some(&bias),
                    output,
                })
            })
        });
    }
}

// Q5_K differs from Q4_K only in unpacking its codes (isa_twins covers it): left out to
// keep the emulated aarch64 runs of CI short.
dtype_tests!([f32: F32, f16: F16, bf16: BF16, i8: I8, i4g32: I4G32, i4g128: I4G128, i4sg32: I4SymG32,
    i4zg32: I4ZpG32, q4_k: Q4K, q6_k: Q6K, q5_0: Q5_0, q8_0: Q8_0, iq4_xs: IQ4XS, mxfp4: MXFP4]
    linear_is_batch_invariant);
dtype_tests!([i8: I8, i4g32: I4G32, q4_k: Q4K] linear_is_batch_invariant_with_16_bit_activations);

/// The routed experts with every weight dtype, without and with biases (gpt-oss's): each
/// expert runs over the rows routed to it in the call, so a row's experts see other rows
/// beside it in a batch and none alone; a row alone (decode) runs all its experts'
/// projections together.
fn moe_ffn_is_batch_invariant(dtype: DataType) {
    let (n_experts, dim, inner) = (6, 70, 40);
    let mut rng = rng(0x3e0);
    let (_, x) = random_f32(&mut rng, &[POOL, dim], 1.0);
    let (router, _) = random_f32(&mut rng, &[n_experts, dim], 0.2);
    let experts = random_experts(&mut rng, n_experts, (dim, inner), dtype);
    let mut biased = experts.clone();
    for e in &mut biased {
        e.biases = Some([inner, inner, dim].map(|len| random_f32(&mut rng, &[len], 1.0).0));
    }
    for (what, experts) in [("", &experts), (" with biases", &biased)] {
        check(&format!("MoeFfn {dtype}{what}"), |exec, first, n| {
            output_of(&[n, dim], |output| {
                exec.run(Op::MoeFfn {
                    input: &f32_data(&[n, dim], &x[first * dim..(first + n) * dim]),
                    router: &router,
                    experts,
                    first_expert: 0,
                    routing: MoeRouting::softmax(3, true),
                    activation: flm_core::ExpertActivation::SwiGlu,
                    output,
                })
            })
        });
    }
}

dtype_tests!([f32: F32, bf16: BF16, i8: I8, i4g32: I4G32, i4sg32: I4SymG32, mxfp4: MXFP4]
    moe_ffn_is_batch_invariant);

/// RMSNorm, LayerNorm, SwiGLU, GELU, the residual add, Scale and Argmax, on rows of 13 and
/// 1000 values.
#[test]
fn row_ops_are_batch_invariant() {
    for dim in [13, 1000] {
        let mut rng = rng(dim as u64);
        let (_, x) = random_f32(&mut rng, &[POOL, dim], 3.0);
        let (_, y) = random_f32(&mut rng, &[POOL, dim], 3.0);
        let (gain, _) = random_weight(&mut rng, &[dim], DataType::F16);
        let (shift, _) = random_f32(&mut rng, &[dim], 1.0);
        let rows =
            |v: &[f32], first: usize, n: usize| f32_data(&[n, dim], &v[first * dim..][..n * dim]);
        check(&format!("RmsNorm dim={dim}"), |exec, first, n| {
            let (input, weight) = (&rows(&x, first, n), &gain);
            output_of(&[n, dim], |output| {
                exec.run(Op::RmsNorm {
                    input,
                    weight,
                    eps: 1e-5,
                    output,
                })
            })
        });
        check(&format!("LayerNorm dim={dim}"), |exec, first, n| {
            let (input, weight, bias) = (&rows(&x, first, n), &gain, &shift);
            output_of(&[n, dim], |output| {
                exec.run(Op::LayerNorm {
                    input,
                    weight,
                    bias,
                    eps: 1e-5,
                    output,
                })
            })
        });
        check(&format!("SiluMul dim={dim}"), |exec, first, n| {
            let (gate, up) = (&rows(&x, first, n), &rows(&y, first, n));
            output_of(&[n, dim], |output| {
                exec.run(Op::SiluMul { gate, up, output })
            })
        });
        check(&format!("Gelu, Add, Scale dim={dim}"), |exec, first, n| {
            let mut v = rows(&x, first, n);
            exec.run(Op::Gelu { x: &mut v }).unwrap();
            exec.run(Op::Add {
                x: &mut v,
                y: &rows(&y, first, n),
            })
            .unwrap();
            exec.run(Op::Scale {
                x: &mut v,
                alpha: 0.7,
            })
            .unwrap();
            v.to_f32_vec().unwrap()
        });
        check(&format!("GatedAdd dim={dim}"), |exec, first, n| {
            let mut v = rows(&x, first, n);
            // Each row's gate logit: the first value of its row of `y`.
            let gates: Vec<f32> = (first..first + n).map(|r| y[r * dim]).collect();
            exec.run(Op::GatedAdd {
                x: &mut v,
                y: &rows(&y, first, n),
                gate: &f32_data(&[n, 1], &gates),
            })
            .unwrap();
            v.to_f32_vec().unwrap()
        });
        check(&format!("Argmax dim={dim}"), |exec, first, n| {
            let mut out = vec![u32::MAX; n];
            exec.run(Op::Argmax {
                input: &rows(&x, first, n),
                output: &mut out,
            })
            .unwrap();
            out.iter().map(|&i| i as f32).collect()
        });
    }
}

/// Embedding rows of f32, f16 and bf16 tables.
#[test]
fn embedding_is_batch_invariant() {
    let mut rng = rng(7);
    let tokens: Vec<u32> = (0..POOL as u32).map(|i| (i * 37) % 101).collect();
    for dtype in [DataType::F32, DataType::F16, DataType::BF16] {
        let (table, _) = random_weight(&mut rng, &[101, 45], dtype);
        check(&format!("Embedding {dtype}"), |exec, first, n| {
            let tokens = &tokens[first..first + n];
            output_of(&[n, 45], |output| {
                exec.run(Op::Embedding {
                    table: &table,
                    tokens: tokens.into(),
                    output,
                })
            })
        });
    }
}

/// RoPE in both styles with partial rotation (pool row `r` at position `r`), and
/// ChatGLM's 2D RoPE (pool row `r` at the positions of entry `r` of two random lists).
#[test]
fn rope_is_batch_invariant() {
    let mut rng = rng(11);
    let (n_heads, head_dim) = (3, 40);
    let (_, x) = random_f32(&mut rng, &[POOL, n_heads * head_dim], 2.0);
    let rows = |first: usize, n: usize| f32_data(&[n, 120], &x[first * 120..][..n * 120]);
    for style in [RopeStyle::AdjacentPairs, RopeStyle::RotateHalf] {
        let table = RopeTable::new(style, head_dim, 24, 10000.0, POOL).unwrap();
        check(&format!("Rope {style:?}"), |exec, first, n| {
            let mut v = rows(first, n);
            let op = Op::Rope {
                x: &mut v,
                table: &table,
                n_heads,
                start_pos: first,
            };
            exec.run(op).unwrap();
            v.to_f32_vec().unwrap()
        });
        let table = RopeTable::new(style, 20, 20, 10000.0, POOL).unwrap();
        let positions: Vec<u32> = (0..POOL as u32).map(|i| (i * 13) % 149).collect();
        let blocks: Vec<u32> = (0..POOL as u32).map(|i| (i * 7) % 131).collect();
        check(&format!("Rope2d {style:?}"), |exec, first, n| {
            let mut v = rows(first, n);
            exec.run(Op::Rope2d {
                x: &mut v,
                table: &table,
                n_heads,
                positions: &positions[first..first + n],
                block_positions: &blocks[first..first + n],
            })
            .unwrap();
            v.to_f32_vec().unwrap()
        });
    }
}

/// Attention over a filled KV cache, pool row `r` being the query at position `r`: GQA and
/// multi-head, head sizes below and above one vector, ALiBi, a sliding window and
/// attention sinks (gpt-oss).
#[test]
fn attention_is_batch_invariant() {
    let cases = [
        // (n_heads, n_kv_heads, head_dim, alibi, sliding_window, sinks)
        (4, 2, 64, false, None, false),
        (6, 6, 13, false, None, false),
        (8, 1, 40, true, None, false),
        (4, 4, 32, false, Some(20), false),
        (8, 2, 64, false, Some(20), true),
        (6, 3, 13, true, None, true),
    ];
    for (seed, (n_heads, n_kv_heads, head_dim, alibi, sliding_window, sinks)) in
        cases.into_iter().enumerate()
    {
        let mut rng = rng(seed as u64 + 100);
        let (dim, kv_dim) = (n_heads * head_dim, n_kv_heads * head_dim);
        let (_, q) = random_f32(&mut rng, &[POOL, dim], 1.0);
        let (cache_k, _) = random_f32(&mut rng, &[POOL, kv_dim], 1.0);
        let (cache_v, _) = random_f32(&mut rng, &[POOL, kv_dim], 1.0);
        let sinks = sinks.then(|| random_f32(&mut rng, &[n_heads], 3.0).0);
        let what = format!(
            "Attention {n_heads}/{n_kv_heads} heads of {head_dim}, alibi {alibi}, \
             window {sliding_window:?}, sinks {}",
            sinks.is_some()
        );
        check(&what, |exec, first, n| {
            output_of(&[n, dim], |output| {
                exec.run(Op::Attention {
                    operands: AttentionOperands {
                        q: &f32_data(&[n, dim], &q[first * dim..][..n * dim]),
                        cache_k: &cache_k,
                        cache_v: &cache_v,
                        rope: None,
                        params: AttentionParams {
                            n_heads,
                            n_kv_heads,
                            scale: 1.0 / (head_dim as f32).sqrt(),
                            alibi,
                            bidirectional: 0,
                            sliding_window,
                            softcap: None,
                        },
                        sinks: sinks.as_ref(),
                        output,
                    },
                    start_pos: first,
                })
            })
        });
    }
}
