//! Criterion benchmark of multi-head latent attention's prefill (DeepSeek-AI 2024,
//! "DeepSeek-V2", §2.1) at DeepSeek-V2-Lite's shapes: 16 heads, a latent of 512, a rotated
//! key of 64, no-RoPE keys and values of 128, int4-sym (g32) projections, an f32 cache, the
//! best level of this CPU. A chunk of 128 queries (flm's prefill chunk) ending at cache row
//! 128, 512 or 2048 runs in each form:
//! - absorbed, as flm runs it (`models/src/llama/latent.rs`): `W_UK` into each query head
//!   (a HeadLinear), attention over the cached latents and rotated keys, `W_UV` on each
//!   head's output (a HeadLinear);
//! - expanded, as transformers' `DeepseekV2Attention` runs it: every cached latent through
//!   `kv_b_proj` into 16 keys and values (the cache holds latents only, so each chunk
//!   expands every row before it again), the shared rotated key repeated for every head,
//!   then attention over keys of 192 and values of 128.
//!
//! Both give the same attention output up to rounding; this measures which costs less.

mod common;

use common::{input, operands, weight};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use flm_core::{
    AttentionOperands, AttentionParams, Data, DataType, DecoupledRope, Executor, LinearPart, Op,
};
use flm_devices::CpuDevice;

const HEADS: usize = 16;
const LATENT: usize = 512;
const ROPE: usize = 64;
const NOPE: usize = 128;
const VALUE: usize = 128;
const CHUNK: usize = 128;

fn mla_prefill(c: &mut Criterion) {
    let dtype = DataType::I4SymG32;
    let exec = Executor::with_profiling(vec![Box::new(CpuDevice::new().expect("cpu"))], false);
    let k_absorb: Vec<Data> = (0..HEADS).map(|_| weight(LATENT, NOPE, dtype)).collect();
    let v_absorb: Vec<Data> = (0..HEADS).map(|_| weight(VALUE, LATENT, dtype)).collect();
    let (w_k, w_v) = (
        weight(HEADS * NOPE, LATENT, dtype),
        weight(HEADS * VALUE, LATENT, dtype),
    );
    let scale = 1.0 / ((NOPE + ROPE) as f32).sqrt();
    // The absorbed queries are the first HeadLinear's output, attention's over the latents
    // the second's input.
    let (q_nope, mut q_latent) = operands(CHUNK, HEADS * LATENT, HEADS * NOPE);
    let (mut out_latent, mut att) = operands(CHUNK, HEADS * VALUE, HEADS * LATENT);
    let q_rope = input(CHUNK, HEADS * ROPE);
    let zeros = |rows, cols| Data::zeros(DataType::F32, &[rows, cols]).expect("zeros");
    let mut group = c.benchmark_group("mla_prefill");
    group.sample_size(10);
    for rows in [128, 512, 2048] {
        let start_pos = rows - CHUNK;
        let (latents, k_rope) = (input(rows, LATENT), input(rows, ROPE));
        group.bench_function(BenchmarkId::new("absorbed", rows), |b| {
            b.iter(|| {
                exec.run(Op::HeadLinear {
                    input: &q_nope,
                    weights: &k_absorb,
                    output: &mut q_latent,
                })
                .expect("W_UK");
                exec.run(Op::Attention {
                    operands: AttentionOperands {
                        q: &q_latent,
                        cache_k: &latents,
                        cache_v: &latents,
                        rope: Some(DecoupledRope {
                            q: &q_rope,
                            cache: &k_rope,
                        }),
                        params: AttentionParams::causal(HEADS, 1, scale),
                        sinks: None,
                        output: &mut out_latent,
                    },
                    start_pos,
                })
                .expect("attention");
                exec.run(Op::HeadLinear {
                    input: &out_latent,
                    weights: &v_absorb,
                    output: &mut att,
                })
                .expect("W_UV");
            })
        });
        let (mut keys, mut vals) = (zeros(rows, HEADS * NOPE), zeros(rows, HEADS * VALUE));
        let mut rope_keys = zeros(rows, HEADS * ROPE);
        group.bench_function(BenchmarkId::new("expanded", rows), |b| {
            b.iter(|| {
                exec.run(Op::Linears {
                    input: &latents,
                    parts: &mut [
                        LinearPart::new(&w_k, None, &mut keys),
                        LinearPart::new(&w_v, None, &mut vals),
                    ],
                })
                .expect("kv_b");
                let shared = k_rope.as_f32().expect("f32");
                let repeated = rope_keys.as_f32_mut().expect("f32");
                for (row, key) in repeated
                    .chunks_exact_mut(HEADS * ROPE)
                    .zip(shared.chunks_exact(ROPE))
                {
                    for head in row.chunks_exact_mut(ROPE) {
                        head.copy_from_slice(key);
                    }
                }
                exec.run(Op::Attention {
                    operands: AttentionOperands {
                        q: &q_nope,
                        cache_k: &keys,
                        cache_v: &vals,
                        rope: Some(DecoupledRope {
                            q: &q_rope,
                            cache: &rope_keys,
                        }),
                        params: AttentionParams::causal(HEADS, HEADS, scale),
                        sinks: None,
                        output: &mut att,
                    },
                    start_pos,
                })
                .expect("attention");
            })
        });
    }
    group.finish();
}

criterion_group!(benches, mla_prefill);
criterion_main!(benches);
