//! `flm bench`: prefill and decode tokens/s over repetitions, like llama-bench, with the
//! weight bytes read per decoded token, the bandwidth that achieves and the bandwidth
//! bound it is compared with: on the CPU the machine's streaming read bandwidth measured
//! on the spot, on a GPU its peak memory bandwidth from the device attributes (memory
//! clock × bus width × 2).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use flm_core::{
    quant, Data, DataType, DeviceSampler, Executor, Expert, Int4Form, Location, SamplerConfig,
};
use flm_devices::CpuDevice;

use crate::convert::DtypeArg;
use crate::device::{Chosen, DeviceArgs};
use flm_models::import;
use flm_models::llama::{Ffn, Llama, LlamaWeights, Logits, SharedLlama};
use flm_models::{Graph, ModelConfig, SharedModel};
use half::f16;
use rayon::prelude::*;

/// `flm bench` options.
#[derive(Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["model", "random"])))]
pub struct BenchArgs {
    /// A model file or directory flm loads.
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// A Hugging Face config.json: random weights at its shapes, built in memory.
    #[arg(long, requires = "dtype")]
    random: Option<PathBuf>,
    /// Weight dtype of --random.
    #[arg(long, value_enum)]
    dtype: Option<DtypeArg>,
    /// Weight dtype of --random's routed experts (default: --dtype), e.g. mxfp4 experts
    /// beside bf16 attention as gpt-oss ships them.
    #[arg(long, value_enum, requires = "random")]
    expert_dtype: Option<DtypeArg>,
    /// int4, int4-sym and int4-zp group size of --random: 32, 64 or 128.
    #[arg(long, default_value_t = 32)]
    group_size: usize,
    /// Prompt tokens prefilled in one call: the prefill test (llama-bench's ppN).
    #[arg(short, long, default_value_t = 128)]
    pub(crate) prompt_tokens: usize,
    /// Tokens decoded one at a time: the decode test (llama-bench's tgN), which starts
    /// after the `--depth` tokens, not after the prompt.
    #[arg(short = 'n', long, default_value_t = 64)]
    pub(crate) gen_tokens: usize,
    /// Tokens already in the KV cache when each test starts (llama-bench's -d): 0, the
    /// default, runs both tests from an empty context, as llama-bench -p and -n do.
    #[arg(short, long, default_value_t = 0, conflicts_with = "batch")]
    depth: usize,
    /// Worker threads (default: all cores).
    #[arg(short, long)]
    threads: Option<usize>,
    /// Measured repetitions (after one warm-up run).
    #[arg(short, long, default_value_t = 5)]
    pub(crate) reps: usize,
    /// Buffer size of the streaming bandwidth measurement, MiB.
    #[arg(long, default_value_t = 1024)]
    stream_mib: usize,
    /// One JSON object per line instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Decode this many sequences together, as the serving engine batches them (one
    /// forward of N rows per step over a paged KV cache, each sequence decoding after its
    /// prompt); tokens/s are their aggregate. A list (`--batch 1,8,32`) measures each.
    #[arg(long, value_delimiter = ',')]
    batch: Vec<usize>,
    /// Also measure a round of speculative decoding with this many drafts from the model's
    /// multi-token-prediction layer (DeepSeek-V3, GLM-4.5): its parts' costs and the
    /// speed-up they give at given acceptance rates.
    #[arg(long, conflicts_with = "batch")]
    mtp_drafts: Option<usize>,
    /// Split the model among this many tensor-parallel ranks of this process, the threads
    /// shared equally among them, and report the share of time in their collectives.
    #[arg(long, default_value_t = 1, conflicts_with_all = ["batch", "mtp_drafts", "depth"])]
    pub(crate) tp: usize,
    #[command(flatten)]
    device: DeviceArgs,
}

/// A small xorshift generator: benchmark weights need speed, not statistical quality.
fn fill_random(bytes: &mut [u8], seed: u64) {
    bytes
        .par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut s = seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            for b in chunk.chunks_mut(8) {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                b.copy_from_slice(&s.to_le_bytes()[..b.len()]);
            }
        });
}

/// A random tensor of `dtype`: codes and values from [`fill_random`] with small finite
/// scales (speed does not depend on the values). Vectors are f32 ones (norm gains).
fn random_tensor(dtype: DataType, shape: &[usize], seed: u64) -> Result<Data> {
    if shape.len() < 2 {
        return Ok(Data::from_f32(shape, &vec![1.0; shape.iter().product()])?);
    }
    // ggml's blocks hold scales (K-quants: scales of scales) that random bytes would make
    // huge or non-finite: a few rows of small values are quantised and repeated.
    if dtype.ggml_type().is_some() {
        return repeated_rows(dtype, shape, seed);
    }
    let mut data = Data::zeros(dtype, shape)?;
    let cols = data.cols();
    let bytes = data.bytes_mut()?;
    fill_random(bytes, seed);
    match dtype {
        DataType::F32 => bytes.par_chunks_mut(4).for_each(|b| {
            let v = (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) >> 8) as f32 / 8.4e8 - 0.01;
            b.copy_from_slice(&v.to_le_bytes());
        }),
        DataType::F16 | DataType::BF16 => bytes.par_chunks_mut(2).for_each(|b| {
            let v = f32::from(b[0]) / 12800.0 - 0.01;
            let bits = if dtype == DataType::F16 {
                f16::from_f32(v).to_bits()
            } else {
                half::bf16::from_f32(v).to_bits()
            };
            b.copy_from_slice(&bits.to_le_bytes());
        }),
        DataType::I8 => {
            let rb = quant::row_bytes(dtype, cols).context("row size")?;
            bytes.par_chunks_mut(rb).for_each(|row| {
                row[..4].copy_from_slice(&(0.02f32 / 127.0).to_le_bytes());
            });
        }
        _ => {
            let g = dtype.group_size().unwrap_or(32);
            let rb = quant::row_bytes(dtype, cols).context("row size")?;
            let kp = quant::padded_cols(dtype, cols);
            // The minimum -0.016, or as a zero point 8 (-8 * 0.002).
            let m = if dtype.int4_form() == Some(Int4Form::ZeroPoint) {
                f16::from_f32(8.0)
            } else {
                f16::from_f32(-0.016)
            };
            let d = f16::from_f32(0.002).to_le_bytes();
            // The scales; then, in asymmetric rows only, the minimums or zero points.
            bytes.par_chunks_mut(rb).for_each(|row| {
                let (scales, minimums) = row[kp / 2..].split_at_mut(2 * (kp / g));
                for s in scales.chunks_exact_mut(2) {
                    s.copy_from_slice(&d);
                }
                for s in minimums.chunks_exact_mut(2) {
                    s.copy_from_slice(&m.to_le_bytes());
                }
            });
        }
    }
    Ok(data)
}

/// A tensor of `dtype` (a ggml block type) whose rows repeat those of a few rows of small
/// random values quantised.
fn repeated_rows(dtype: DataType, shape: &[usize], seed: u64) -> Result<Data> {
    let cols = shape[shape.len() - 1];
    let rows = shape.iter().product::<usize>() / cols.max(1);
    let pattern = random_tensor(DataType::F32, &[rows.min(16), cols], seed)?.to_dtype(dtype)?;
    let pattern = pattern.bytes()?;
    let mut data = Data::zeros(dtype, shape)?;
    let bytes = data.bytes_mut()?;
    let chunk = pattern.len();
    bytes
        .par_chunks_mut(chunk.max(1))
        .for_each(|c| c.copy_from_slice(&pattern[..c.len()]));
    Ok(data)
}

/// Fails unless `config` runs on the Llama graph, the one `flm bench` measures.
fn llama_graph(config: &ModelConfig) -> Result<()> {
    ensure!(
        config.arch == flm_models::Arch::Llama,
        "flm bench measures the Llama graph (Llama, ChatGLM2/3, GLM-4, Baichuan, InternLM); \
         ChatGLM-6B is not supported yet"
    );
    Ok(())
}

/// What the matrices of `ckpt` hold, by their share of its weights, most first: the dtype
/// flm runs each as, with the file's ggml type where flm repacks or requantises it
/// (`q4_k 70%, int8 (Q5_1) 27%, q6_k 3%`); the dtype alone when it is the only one.
fn weights_label(ckpt: &import::Checkpoint) -> String {
    let mut shares: Vec<(String, usize)> = Vec::new();
    for t in ckpt.tensors.iter().filter(|t| t.shape.len() == 2) {
        let n = t.shape.iter().product::<usize>();
        let loaded = t.encoding.load_dtype().name();
        let label = match t.encoding {
            import::Encoding::Ggml(ty) => format!("{loaded} ({})", ty.name()),
            _ => loaded.to_string(),
        };
        match shares.iter_mut().find(|(l, _)| *l == label) {
            Some((_, total)) => *total += n,
            None => shares.push((label, n)),
        }
    }
    shares.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    let all: usize = shares.iter().map(|&(_, n)| n).sum();
    match shares.as_slice() {
        [(only, _)] => only.clone(),
        _ => shares
            .iter()
            .map(|(label, n)| format!("{label} {:.0}%", 100.0 * *n as f64 / all.max(1) as f64))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// The model to measure, a name for it and what its weights are (a dtype, or
/// [`weights_label`]'s mix for a file).
fn build(args: &BenchArgs, positions: usize, chosen: &Chosen) -> Result<(Llama, String, String)> {
    let (config, weights, name, dtype) = source(args, positions)?;
    let model = SharedLlama::new(config, weights).context("cannot build the model")?;
    let model = chosen
        .place(SharedModel::from(model))?
        .llama()
        .context("the bench runs the Llama graph")?;
    let model = Llama::with_model(model).context("cannot build the model")?;
    Ok((model, name, dtype))
}

/// The configuration (its context `positions`) and weights of the model to measure, a name
/// for it and what its weights are.
pub(crate) fn source(
    args: &BenchArgs,
    positions: usize,
) -> Result<(ModelConfig, LlamaWeights, String, String)> {
    let (mut config, weights, name, dtype): (ModelConfig, _, _, _) =
        match (&args.model, &args.random) {
            (Some(path), _) => {
                let ckpt = import::load(path)
                    .with_context(|| format!("cannot load the model {}", path.display()))?;
                llama_graph(&ckpt.config)?;
                let label = weights_label(&ckpt);
                let weights = LlamaWeights::load(&ckpt)?;
                (ckpt.config, weights, path.display().to_string(), label)
            }
            (None, Some(config)) => {
                let Some(dtype) = args.dtype else {
                    bail!("--random needs --dtype");
                };
                let dtype = dtype.with_group(args.group_size)?;
                let expert_dtype = match args.expert_dtype {
                    Some(d) => d.with_group(args.group_size)?,
                    None => dtype,
                };
                let ckpt = import::random(config, 0)
                    .with_context(|| format!("cannot read {}", config.display()))?;
                llama_graph(&ckpt.config)?;
                let mut seed = 0u64;
                let bar = crate::progress::bar(0, "random tensors")?;
                let weights = LlamaWeights::from_tensors(&ckpt.config, |name, shape| {
                    seed += 1;
                    bar.set_position(seed);
                    bar.set_message(name.hf().unwrap_or_default());
                    let dtype = match name {
                        flm_models::tensor_names::TensorName::Expert(..) => expert_dtype,
                        _ => dtype,
                    };
                    random_tensor(dtype, shape, seed).map_err(|e| {
                        flm_models::Error::Config(format!("cannot build random weights: {e:#}"))
                    })
                })?;
                bar.finish_and_clear();
                (
                    ckpt.config,
                    weights,
                    config.display().to_string(),
                    if expert_dtype == dtype {
                        dtype.name().to_string()
                    } else {
                        format!("{dtype}, experts {expert_dtype}")
                    },
                )
            }
            (None, None) => bail!("pass --model or --random"),
        };
    ensure!(
        positions <= config.max_seq_len,
        "the bench needs {positions} positions (--depth plus the longer of --prompt-tokens and \
         --gen-tokens; with --batch, --prompt-tokens plus --gen-tokens), which exceeds the \
         model's context of {}",
        config.max_seq_len
    );
    config.max_seq_len = positions;
    Ok((config, weights, name, dtype))
}

/// Bytes of weights one decode step reads: every layer tensor (of a mixture-of-experts
/// layer, the router and `top_k` experts), the final norm, the classifier (the embedding
/// table when tied) and one embedding row.
fn weight_bytes_per_token(w: &LlamaWeights, c: &ModelConfig) -> usize {
    let (vocab, top_k) = (c.vocab_size, c.moe.as_ref().map_or(0, |m| m.top_k));
    let layers: usize = w
        .layers
        .iter()
        .map(|l| {
            let all: usize = l.tensors().iter().map(|d| d.size_bytes()).sum();
            // A token reads only its top_k experts' weights.
            let unread = match &l.ffn {
                Ffn::Moe { experts, .. } => {
                    let bytes = |e: &Expert| [&e.gate, &e.up, &e.down].map(Data::size_bytes);
                    let per_expert = experts.first().map_or(0, |e| bytes(e).iter().sum());
                    per_expert * experts.len().saturating_sub(top_k)
                }
                Ffn::Dense { .. } => 0,
            };
            all - unread
        })
        .sum();
    let classifier = w.classifier.as_ref().unwrap_or(&w.embedding).size_bytes();
    layers + w.final_norm.size_bytes() + classifier + w.embedding.size_bytes() / vocab.max(1)
}

/// Streaming read bandwidth in GB/s: the best of 3 passes summing a `mib` MiB buffer on
/// the current thread pool, in each of three patterns.
///
/// Errors: the buffer cannot be allocated.
///
/// Each task reads its chunk either as one sequential stream or as 8 parts in lockstep, a
/// cache line of each per step, prefetching 1024 bytes ahead on x86-64, as the float and
/// AVX2 int8 decode kernels read several weight rows at once, or as one stream prefetched
/// 8192 bytes ahead, as the other int8 and int4 decode kernels read their rows. Which
/// pattern reads faster depends on the machine (several misses in flight help some cores,
/// one stream others; docs/benchmarks.md).
/// The bound is what the machine allows, so it is the fastest of the three.
fn stream_read_gb_s(mib: usize) -> Result<f64> {
    // Allocated as weights are, so that it reads through the same kind of pages.
    let mut data = Data::zeros(DataType::F32, &[mib << 18])?;
    fill_random(data.bytes_mut()?, 7);
    let buf: &[u64] = bytemuck::cast_slice(data.bytes()?);
    let per_task = buf.len().div_ceil(rayon::current_num_threads() * 16).max(1);
    let pass = |sum: fn(&[u64]) -> u64| {
        let start = Instant::now();
        let total = buf
            .par_chunks(per_task)
            .map(sum)
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(total);
        (buf.len() * 8) as f64 / start.elapsed().as_secs_f64() / 1e9
    };
    Ok((0..3)
        .flat_map(|_| {
            [
                pass(sum_streams::<1, 1024>),
                pass(sum_streams::<1, 8192>),
                pass(sum_streams::<8, 1024>),
            ]
        })
        .fold(0.0, f64::max))
}

/// The wrapping sum of `chunk`, read as `S` parts in lockstep, one cache line (8 `u64`)
/// of each per step, each line prefetched `AHEAD` bytes ahead on x86-64.
fn sum_streams<const S: usize, const AHEAD: usize>(chunk: &[u64]) -> u64 {
    let part = chunk.len() / S / 8 * 8;
    let mut acc = [[0u64; 8]; S];
    for i in (0..part).step_by(8) {
        for (s, acc) in acc.iter_mut().enumerate() {
            let line = &chunk[s * part + i..][..8];
            #[cfg(target_arch = "x86_64")]
            // SAFETY: prefetching has no side effects, whatever the address.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().wrapping_byte_add(AHEAD) as *const i8);
            }
            for (a, x) in acc.iter_mut().zip(line) {
                *a = a.wrapping_add(*x);
            }
        }
    }
    let rest = chunk[S * part..]
        .iter()
        .fold(0u64, |s, &x| s.wrapping_add(x));
    acc.iter().flatten().fold(rest, |s, &a| s.wrapping_add(a))
}

/// Mean and sample standard deviation.
fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

/// Runs `flm bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    ensure!(args.prompt_tokens > 0, "--prompt-tokens must be at least 1");
    ensure!(args.gen_tokens > 0, "--gen-tokens must be at least 1");
    ensure!(args.reps > 0, "--reps must be at least 1");
    ensure!(!args.batch.contains(&0), "--batch must be at least 1");
    let threads = args.threads.unwrap_or_else(rayon::current_num_threads);
    ensure!(threads > 0, "--threads must be at least 1");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("cannot start the thread pool")?;
    // `None`: one sequence through the single-sequence forward pass.
    let (positions, batches): (usize, Vec<Option<usize>>) = if args.batch.is_empty() {
        // A speculative round verifies K + 1 rows after the prompt.
        let round = args.mtp_drafts.map_or(0, |k| args.prompt_tokens + k + 1);
        let positions = (args.depth + args.prompt_tokens.max(args.gen_tokens)).max(round);
        (positions, vec![None])
    } else {
        let sizes = args.batch.iter().copied().map(Some).collect();
        (args.prompt_tokens + args.gen_tokens, sizes)
    };
    let isa = CpuDevice::new()?.isa();
    let chosen = args.device.executor(|| match (&args.model, &args.random) {
        (Some(path), _) => crate::load::weights(path),
        (None, Some(config)) => Ok(import::random(config, 0)
            .with_context(|| format!("cannot read {}", config.display()))?
            .parameter_count()),
        (None, None) => bail!("pass --model or --random"),
    })?;
    if crate::split::wanted(args.tp)? {
        return crate::bench_tp::run(&args, positions, &chosen, threads);
    }
    let exec: &Executor = &chosen.exec;
    if !args.batch.is_empty() {
        // As the serving engine runs it.
        exec.require_batch_invariance();
    }
    pool.install(|| -> Result<()> {
        let (mut model, name, dtype) = build(&args, positions, &chosen)?;
        let vocab = model.config().vocab_size;
        let bytes = weight_bytes_per_token(model.weights(), model.config());
        let tokens = |n: usize, salt: u64| -> Vec<u32> {
            (0..n as u64)
                .map(|i| ((i * 2_654_435_761 + salt) % vocab as u64) as u32)
                .collect()
        };
        let prompt = tokens(args.prompt_tokens, 0);
        // The context both tests start after: it stays in the KV cache, and the tests
        // overwrite only the positions after it.
        let depth = args.depth;
        if depth > 0 {
            model.forward(exec, &tokens(depth, 1), 0, Logits::Last)?;
        }
        // Logits on a device are sampled there, as a session samples them (greedy: the
        // same argmax), so a decode step copies one id out instead of the logits.
        let location = model.logits_location();
        let mut on_device = match location {
            Location::Device { .. } => Some(DeviceSampler::new(
                exec,
                &SamplerConfig::default(),
                vocab,
                location,
                &[],
            )?),
            Location::Host => None,
        };
        let mut once = |model: &mut Llama, batch: Option<usize>| -> Result<(f64, f64)> {
            if let Some(n) = batch {
                return crate::bench_batch::once(exec, model, &prompt, n, args.gen_tokens);
            }
            let start = Instant::now();
            model.forward(exec, &prompt, depth, Logits::Last)?;
            let prefill = start.elapsed().as_secs_f64();
            // As llama-bench's tgN: one token at a time from `depth` on, each the argmax
            // of the step before.
            let start = Instant::now();
            let mut next = prompt[0];
            for g in 0..args.gen_tokens {
                next = match &mut on_device {
                    Some(sampler) => {
                        let logits = model.forward_resident(exec, &[next], depth + g)?;
                        sampler.sample(exec, logits)?
                    }
                    None => {
                        flm_core::argmax(model.forward(exec, &[next], depth + g, Logits::Last)?)
                    }
                };
            }
            let decode = start.elapsed().as_secs_f64();
            Ok((
                args.prompt_tokens as f64 / prefill,
                args.gen_tokens as f64 / decode,
            ))
        };
        let mut measured = Vec::new();
        let bar = crate::progress::bar(((args.reps + 1) * batches.len()) as u64, "runs")?;
        for &batch in &batches {
            bar.set_message(batch.map_or("(warm-up first)".into(), |n| format!("batch {n}")));
            once(&mut model, batch)?;
            bar.inc(1);
            let runs = (0..args.reps)
                .map(|_| {
                    let run = once(&mut model, batch);
                    bar.inc(1);
                    run
                })
                .collect::<Result<Vec<_>>>()?;
            let (pp, pp_sd) = mean_sd(&runs.iter().map(|r| r.0).collect::<Vec<_>>());
            let (tg, tg_sd) = mean_sd(&runs.iter().map(|r| r.1).collect::<Vec<_>>());
            measured.push((batch.unwrap_or(1), [pp, pp_sd, tg, tg_sd]));
        }
        bar.finish_and_clear();
        let rounds = args
            .mtp_drafts
            .map(|k| crate::bench_mtp::costs(exec, &mut model, &prompt, k, args.reps))
            .transpose()?;
        // Whether the single-sequence decode steps ran as a CUDA graph (`--cuda-graph`).
        let step_graph = model.captured_steps().contains(&1);
        drop(model);
        // The bound decode is compared with: the GPU's peak, or the CPU's measured stream.
        let (stream, bound) = match chosen.gpu_peak_bandwidth {
            Some(peak) => (peak / 1e9, "GPU peak memory bandwidth"),
            None => (
                stream_read_gb_s(args.stream_mib.max(1))?,
                "streaming read bandwidth",
            ),
        };
        let (cpu, cpus) = (cpu_model(), std::thread::available_parallelism().map_or(1, |n| n.get()));
        for (batch, [pp, pp_sd, tg, tg_sd]) in measured {
            // A batched step reads the weights once for all its sequences.
            let decode_gb_s = bytes as f64 * tg / batch as f64 / 1e9;
            if args.json {
                let line = serde_json::json!({
                    "model": name,
                    "dtype": dtype,
                    "device": chosen.first,
                    "isa": isa.name(),
                    "cpu_model": cpu,
                    "cpus": cpus,
                    "threads": threads,
                    "prompt_tokens": args.prompt_tokens,
                    "gen_tokens": args.gen_tokens,
                    "depth": args.depth,
                    "batch": batch,
                    "cuda_graph": step_graph && batch == 1,
                    "reps": args.reps,
                    "prefill_tok_s": pp,
                    "prefill_tok_s_sd": pp_sd,
                    "decode_tok_s": tg,
                    "decode_tok_s_sd": tg_sd,
                    "weight_bytes_per_token": bytes,
                    "decode_gb_s": decode_gb_s,
                    // The CPU's measured stream, or the GPU's peak: the bound named by "bound".
                    "stream_gb_s": stream,
                    "bound": bound,
                    "bandwidth_fraction": decode_gb_s / stream,
                });
                println!("{line}");
            } else {
                println!(
                    "model {name} ({dtype}) on {} ({cpu}, {cpus} CPUs), {} CPU kernels, {threads} \
                     threads, {} repetitions, {batch} sequence(s) at once (aggregate tokens/s){}",
                    chosen.first,
                    isa,
                    args.reps,
                    if step_graph && batch == 1 {
                        ", decode steps as a CUDA graph"
                    } else {
                        ""
                    }
                );
                let at = match args.depth {
                    0 => String::new(),
                    d => format!(" @ d{d}"),
                };
                println!(
                    "| test | tokens/s |\n|---|---|\n| pp{}{at} | {pp:.2} ± {pp_sd:.2} |\n| tg{}{at} | {tg:.2} ± {tg_sd:.2} |",
                    args.prompt_tokens, args.gen_tokens
                );
                println!(
                    "weights read per decoded token: {:.3} GB; decode moves {decode_gb_s:.2} GB/s; \
                     {bound} {stream:.2} GB/s, so decode runs at {:.0}% of the \
                     bandwidth bound ({:.2} tokens/s)",
                    bytes as f64 / 1e9,
                    100.0 * decode_gb_s / stream,
                    stream * 1e9 / bytes as f64 * batch as f64
                );
            }
        }
        if let Some(r) = rounds {
            // Random weights draft at random (0); DeepSeek-V3 reports 85–90% for its layer.
            let alphas = [0.0, 0.5, 0.85];
            if args.json {
                let line = serde_json::json!({
                    "mtp_drafts": r.drafts,
                    "verify_ms": r.verify * 1e3,
                    "drafts_ms": r.draft * 1e3,
                    "decode_ms": r.decode * 1e3,
                    "speed_up_at": alphas.map(|a| [a, r.speed_up(a)]),
                });
                println!("{line}");
            } else {
                println!(
                    "speculative round, {} drafts from the multi-token-prediction layer: \
                     verification of {} rows {:.2} ms, drafts {:.2} ms, against a decode \
                     step of {:.2} ms; speed-up at acceptance {}",
                    r.drafts,
                    r.drafts + 1,
                    r.verify * 1e3,
                    r.draft * 1e3,
                    r.decode * 1e3,
                    alphas.map(|a| format!("{a}: {:.2}×", r.speed_up(a))).join(", ")
                );
            }
        }
        Ok(())
    })
}

/// The CPU's name as the OS gives it, for the report: Linux's `model name` (x86), or the
/// implementer and part numbers of an ARM core; the architecture where neither is known.
fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        info.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_owned())
        })
    };
    let arch = std::env::consts::ARCH;
    match (
        field("model name"),
        field("CPU implementer"),
        field("CPU part"),
    ) {
        (Some(name), _, _) => name,
        (None, Some(implementer), Some(part)) => {
            format!("{arch}, implementer {implementer}, part {part}")
        }
        _ => arch.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_sum_reads_every_value_once() {
        for len in [0, 1, 7, 63, 64, 65, 1000, 4096, 5003] {
            let v: Vec<u64> = (0..len as u64)
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .collect();
            let want = v.iter().fold(0u64, |s, &x| s.wrapping_add(x));
            assert_eq!(sum_streams::<1, 1024>(&v), want, "length {len}");
            assert_eq!(sum_streams::<1, 8192>(&v), want, "length {len}");
            assert_eq!(sum_streams::<8, 1024>(&v), want, "length {len}");
        }
    }
}
