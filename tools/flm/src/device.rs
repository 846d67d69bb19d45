//! `--device`, `--gpu-layers`, `--moe-device` and `--cuda-graph`, shared by every command
//! that computes.

use std::sync::Arc;

use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use flm_core::{Executor, KvDtype, Location};
use flm_devices::{ActivationBits, CpuDevice, DeviceChoice};
use flm_models::llama::LlamaWeights;
use flm_models::tensor_parallel::{ExecutorFactory, TensorParallel};
use flm_models::{Arch, GpuLayers, ModelConfig, SharedModel};

/// `--moe-device`: where the routed experts of a mixture-of-experts model run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MoeDevice {
    /// On the CPU, their weights in host memory, whatever `--gpu-layers` places.
    Cpu,
}

/// `--cuda-graph`: whether decode steps run as CUDA graphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum CudaGraph {
    /// Capture a decode step once per batch size and replay it (where every layer is on
    /// the GPU).
    #[default]
    On,
    /// Run every step op by op.
    Off,
}

/// `--activation-bits`: a precision, or `auto`, which picks one by the model's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ActivationArg {
    /// 16 bits up to [`AUTO_INT16_MAX_WEIGHTS`] weights, 8 above.
    #[default]
    Auto,
    /// This precision.
    Bits(ActivationBits),
}

/// The most weights of a model that `--activation-bits auto` gives 16-bit activations: the
/// sub-billion chat models (SmolLM2-135M and 360M, Qwen2.5-0.5B), which int8 activations
/// mislead most (SmolLM2 answers the capital of France in French) and which stay fast at
/// the cost of 16 bits; from TinyLlama's 1.1 billion on, prefill's slowdown outweighs it
/// (docs/benchmarks.md, "Activation bits: the cost of 16").
pub const AUTO_INT16_MAX_WEIGHTS: u64 = 1_000_000_000;

impl ActivationArg {
    /// The precision for a model of `weights` weights (asked only for `auto`).
    ///
    /// Errors: those of `weights`.
    pub fn resolve(self, weights: impl FnOnce() -> Result<u64>) -> Result<ActivationBits> {
        Ok(match self {
            ActivationArg::Bits(bits) => bits,
            ActivationArg::Auto if weights()? <= AUTO_INT16_MAX_WEIGHTS => ActivationBits::Int16,
            ActivationArg::Auto => ActivationBits::Int8,
        })
    }
}

impl std::str::FromStr for ActivationArg {
    type Err = String;

    /// `auto`, or a precision as [`ActivationBits`] reads it.
    fn from_str(s: &str) -> std::result::Result<ActivationArg, String> {
        match s {
            "auto" => Ok(ActivationArg::Auto),
            bits => bits
                .parse()
                .map(ActivationArg::Bits)
                .map_err(|e| format!("{e}, or auto")),
        }
    }
}

impl std::fmt::Display for ActivationArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ActivationArg::Auto => f.write_str("auto"),
            ActivationArg::Bits(bits) => bits.fmt(f),
        }
    }
}

/// Where the model runs.
#[derive(Args, Clone, Copy, Default)]
pub struct DeviceArgs {
    /// cpu, cuda or auto: auto uses a CUDA GPU when this build has the `cuda` feature and
    /// one is usable, otherwise the CPU (saying why in one line when the build could have
    /// used a GPU); cuda without a usable GPU is an error.
    #[arg(long, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// N or auto: the first N layers' weights, KV cache and activations live on the GPU and
    /// the rest on the CPU (auto: as many as its free memory holds, the default wherever a
    /// GPU runs the model). 0 keeps them all in host memory, the GPU running the model's
    /// ops from there one at a time. Llama-graph models (run, chat, perplexity, bench, and
    /// serve, whose KV block pool goes with the layers).
    #[arg(long)]
    pub gpu_layers: Option<GpuLayers>,
    /// cpu: a mixture-of-experts model's experts stay in host memory and run on the CPU,
    /// while `--gpu-layers` puts the rest of their layers on the GPU (their input and output
    /// cross once per layer and step). Without `--gpu-layers` the experts run on the CPU
    /// anyway.
    #[arg(long, value_enum)]
    pub moe_device: Option<MoeDevice>,
    /// 8, 16 or auto: the precision of the activations that int8, int4 and K-quant weights
    /// are dotted against on the CPU. 8 (int8 blocks, as llama.cpp) is the fastest; 16 adds
    /// each block's int8 rounding residual, which brings the logits to those of f32
    /// activations at twice the integer work (prefill slows most; decode a little). auto
    /// is 16 for models of up to a billion weights, whose answers int8 activations change
    /// most and which run fast anyway, and 8 above.
    #[arg(long, default_value_t = ActivationArg::Auto)]
    pub activation_bits: ActivationArg,
    /// f32, f16 or auto: the element type of the KV cache. f16 halves the bytes attention
    /// reads, each key and value rounded to the nearest f16 as it is stored; auto is f16
    /// where the cache lives on a GPU (`--gpu-layers`) and f32 in host memory.
    #[arg(long, default_value_t = KvDtype::Auto)]
    pub kv_dtype: KvDtype,

    /// on or off: with every layer on the GPU (`--gpu-layers` covering them all), a decode
    /// step is captured once as a CUDA graph and replayed (one launch per token instead of
    /// one per op); off runs every step op by op, the workaround should a graph fail.
    #[arg(long, value_enum, default_value_t = CudaGraph::On)]
    pub cuda_graph: CudaGraph,
}

/// The executor, and the GPU's peak memory bandwidth in bytes/s when one runs the model.
pub struct Chosen {
    /// The devices in priority order.
    pub exec: Executor,
    /// From the GPU's attributes; `None` on the CPU.
    pub gpu_peak_bandwidth: Option<f64>,
    /// "cuda" or "cpu": the device the model's ops go to first.
    pub first: &'static str,
    /// The GPU's memory, when one was chosen.
    gpu: Option<Location>,
    /// `--gpu-layers`.
    gpu_layers: Option<GpuLayers>,
    /// `--moe-device`.
    moe_device: Option<MoeDevice>,
    /// `--kv-dtype`.
    kv_dtype: KvDtype,
    /// The CPU's activation precision (`--activation-bits`, resolved).
    bits: ActivationBits,
}

impl DeviceArgs {
    /// Builds the executor for a model of `weights` weights (asked only for
    /// `--activation-bits auto`); a fallback to the CPU prints its one line on stderr.
    ///
    /// Errors: `--device cuda` without a usable GPU; `--gpu-layers` without one; the CPU
    /// device's errors; those of `weights`.
    pub fn executor(&self, weights: impl FnOnce() -> Result<u64>) -> Result<Chosen> {
        let bits = self.activation_bits.resolve(weights)?;
        let cpu = CpuDevice::new()?.with_activation_bits(bits);
        let selection = flm_devices::select(self.device, cpu)?;
        if let Some(notice) = &selection.notice {
            eprintln!("{notice}");
        }
        let first = &selection.devices[0];
        let gpu = Some(first.location()).filter(|&l| l != Location::Host);
        if self.gpu_layers.is_some() && gpu.is_none() {
            bail!("--gpu-layers places layers on a GPU, and this flm has none to use");
        }
        let first = first.name();
        let exec = Executor::new(selection.devices);
        exec.set_step_graphs(self.cuda_graph == CudaGraph::On);
        Ok(Chosen {
            first,
            gpu,
            gpu_peak_bandwidth: selection.gpu_peak_bandwidth,
            exec,
            gpu_layers: self.gpu_layers,
            moe_device: self.moe_device,
            kv_dtype: self.kv_dtype,
            bits,
        })
    }
}

impl Chosen {
    /// The KV cache dtype of `--kv-dtype`.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// Checks that the model runs on the CPU, as a tensor-parallel rank does.
    ///
    /// Errors: a GPU chosen (`--device`, `--gpu-layers`).
    pub fn check_cpu(&self) -> Result<()> {
        if self.gpu.is_some() || self.gpu_layers.is_some() {
            bail!("tensor parallelism runs on the CPU (NCCL is not built yet): add --device cpu");
        }
        Ok(())
    }

    /// The model `config` with `weights` split among `ranks` ranks of this process
    /// ([`TensorParallel::local`]) of `threads / ranks` threads each (at least one), each
    /// with its own CPU executor like this one's, its KV caches of `--kv-dtype`.
    ///
    /// Errors: a GPU chosen, a graph other than Llama's, and those of the split.
    pub fn split(
        &self,
        config: &ModelConfig,
        weights: &LlamaWeights,
        ranks: usize,
        threads: usize,
    ) -> Result<SharedModel> {
        self.check_cpu()?;
        ensure!(
            config.arch == Arch::Llama,
            "--tp splits Llama-graph models, and this is ChatGLM-6B"
        );
        let bits = self.bits;
        let executor: ExecutorFactory = Arc::new(move || {
            let cpu = CpuDevice::new().map_err(|e| flm_models::Error::Config(e.to_string()))?;
            Ok(Executor::new(vec![Box::new(
                cpu.with_activation_bits(bits),
            )]))
        });
        let per_rank = (threads / ranks).max(1);
        let kv = self.kv_dtype;
        Ok(TensorParallel::local(
            config, weights, ranks, per_rank, kv, executor,
        )?)
    }

    /// `model` with its KV caches of `--kv-dtype` and its layers where `--gpu-layers` puts
    /// them (as it is without the flag), saying in one line on stderr how many went to the
    /// GPU.
    ///
    /// Errors: a graph that cannot be placed, the GPU's free memory unknown for `auto`,
    /// and the allocation and copy errors of placing the weights.
    pub fn place(&self, model: SharedModel) -> Result<SharedModel> {
        let model = model.with_kv_dtype(self.kv_dtype)?;
        let Some(gpu) = self.gpu else {
            return Ok(model);
        };
        let layers = match self.gpu_layers {
            Some(layers) => layers,
            // With a GPU the layers go where its memory holds them, unless the graph runs
            // in host memory only (ChatGLM-6B's).
            None if model.placement().is_some() => GpuLayers::Auto,
            None => return Ok(model),
        };
        let experts_on_host = self.moe_device == Some(MoeDevice::Cpu);
        let model = model
            .place_gpu_layers(&self.exec, gpu, layers, experts_on_host)
            .context("cannot place the model's layers")?;
        if let Some(p) = model.placement() {
            let on_gpu = (0..p.n_layers()).filter(|&l| p.layer(l) == gpu).count();
            eprintln!(
                "--gpu-layers {layers}: {on_gpu} of {} layers on {gpu}{}",
                p.n_layers(),
                if experts_on_host && model.config().moe.is_some() {
                    ", their experts in host memory"
                } else {
                    ""
                }
            );
        }
        Ok(model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activation_bits_auto_follows_the_model_size() {
        let auto: ActivationArg = "auto".parse().unwrap();
        assert_eq!(auto, ActivationArg::default());
        let small = auto.resolve(|| Ok(135_000_000)).unwrap();
        assert_eq!(small, ActivationBits::Int16);
        let at = auto.resolve(|| Ok(AUTO_INT16_MAX_WEIGHTS)).unwrap();
        assert_eq!(at, ActivationBits::Int16);
        let large = auto.resolve(|| Ok(AUTO_INT16_MAX_WEIGHTS + 1)).unwrap();
        assert_eq!(large, ActivationBits::Int8);
        // A given precision never asks for the size.
        let eight: ActivationArg = "8".parse().unwrap();
        let asked = eight.resolve(|| anyhow::bail!("not asked")).unwrap();
        assert_eq!(asked, ActivationBits::Int8);
        assert_eq!("16".parse::<ActivationArg>().unwrap().to_string(), "16");
        let e = "12".parse::<ActivationArg>().unwrap_err();
        assert!(e.contains("8 or 16, or auto"), "{e}");
    }
}
