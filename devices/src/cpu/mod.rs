//! The CPU device.
//!
//! Activations are f32; weights (embedding tables, linear weights, norm gains) may be f32,
//! f16 or bf16 and are widened to f32 row by row as they are used. Large ops are split over
//! the rayon thread pool; ops smaller than [`PARALLEL_MIN_WORK`] multiply-adds run on the
//! calling thread, so tiny models do not pay for waking threads.

mod activation;
mod attention;
mod elementwise;
mod embedding;
mod head_linear;
mod isa;
mod linear;
mod moe;
mod norm;
mod paged_attention;
mod qlinear;
mod rope;
mod sample;
mod schedule;
mod scratch;
mod simd;
mod weights;

use flm_core::{BaseDevice, CheckedOp, Error, Op, Result};
use rayon::prelude::*;

pub use isa::Isa;
pub use qlinear::ActivationBits;
use qlinear::LinearLevel;

/// Ops with fewer multiply-adds than this run on one thread.
pub const PARALLEL_MIN_WORK: usize = 1 << 17;

/// The CPU device: supports every op whose activations are f32. Its kernels use one
/// instruction-set level ([`Isa`]), chosen when it is created.
///
/// Its ops are batch-invariant at every level, whether asked for or not
/// ([`BaseDevice::require_batch_invariance`] has nothing to switch): a row's output has the
/// same bits whatever the other rows of the call, so an answer does not depend on how much
/// of the prompt was already in the KV cache, on other sessions or on the thread count. At
/// [`Isa::Amx`] that is why decode runs kernels that sum in the order of the prefill tiles.
///
/// int8, int4 and K-quant weights are dotted against activations quantised to
/// [`ActivationBits`], int8 unless [`CpuDevice::with_activation_bits`] says otherwise.
#[derive(Debug)]
pub struct CpuDevice {
    isa: Isa,
    activations: ActivationBits,
}

impl CpuDevice {
    /// A CPU device using the global rayon thread pool and the level `FLM_CPU_ISA` names,
    /// or the best this CPU has.
    ///
    /// Errors: [`Error::InvalidArgument`] when `FLM_CPU_ISA` names an unknown level or one
    /// this CPU lacks.
    pub fn new() -> Result<CpuDevice> {
        CpuDevice::with_isa(Isa::from_env()?)
    }

    /// A CPU device whose kernels use `isa`.
    ///
    /// Errors: [`Error::InvalidArgument`] when this CPU lacks `isa`.
    pub fn with_isa(isa: Isa) -> Result<CpuDevice> {
        if isa.is_supported() {
            Ok(CpuDevice {
                isa,
                activations: ActivationBits::Int8,
            })
        } else {
            Err(Error::InvalidArgument(format!("this CPU lacks {isa}")))
        }
    }

    /// This device with quantised weights dotted against `activations`.
    pub fn with_activation_bits(self, activations: ActivationBits) -> CpuDevice {
        CpuDevice {
            activations,
            ..self
        }
    }

    /// The instruction-set level of the kernels.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// How a Linear runs: the level and the activations' precision.
    fn linear_level(&self) -> LinearLevel {
        LinearLevel {
            isa: self.isa,
            activations: self.activations,
        }
    }
}

/// `out[i·m + j] = yt[j·n + i]`: the `[m, n]` output of a prefill kernel (one row per
/// output feature) transposed into `[n, m]`, in 16 × 16 tiles so that neither side is walked
/// with a stride of a whole row per element, and split over threads by rows of `out`.
pub(crate) fn transpose(yt: &[f32], n: usize, out: &mut [f32]) {
    const TILE: usize = 16;
    let m = out.len() / n;
    let rows = |i0: usize, o: &mut [f32]| {
        for j0 in (0..m).step_by(TILE) {
            let cols = (m - j0).min(TILE);
            for (di, row) in o.chunks_exact_mut(m).enumerate() {
                for (dj, y) in row[j0..j0 + cols].iter_mut().enumerate() {
                    *y = yt[(j0 + dj) * n + i0 + di];
                }
            }
        }
    };
    if n * m >= PARALLEL_MIN_WORK / 16 {
        out.par_chunks_mut(TILE * m)
            .enumerate()
            .for_each(|(b, o)| rows(b * TILE, o));
    } else {
        rows(0, out);
    }
}

pub(crate) fn shape_err(op: &'static str, msg: String) -> Error {
    Error::Shape { op, msg }
}

impl BaseDevice for CpuDevice {
    fn name(&self) -> &'static str {
        "cpu"
    }

    /// Every op: the contract ([`Op::validate`]) already asks for f32 activations, and the
    /// CPU kernels take every weight dtype.
    fn supports(&self, _: &Op<'_>) -> bool {
        true
    }

    /// Nothing to do: every CPU kernel is batch-invariant (see [`CpuDevice`]).
    fn require_batch_invariance(&self) {}

    fn run(&self, op: CheckedOp<'_>) -> Result<()> {
        match op.into_op() {
            Op::Embedding {
                table,
                tokens,
                output,
            } => embedding::embedding(self.isa.vector(), table, tokens, output),
            Op::RmsNorm {
                input,
                weight,
                eps,
                output,
            } => norm::rms_norm(self.isa.vector(), input, weight, eps, output),
            Op::Linear {
                input,
                weight,
                bias,
                output,
            } => linear::linear(self.linear_level(), input, weight, bias, output),
            Op::Linears { input, parts } => linear::linears(self.linear_level(), input, parts),
            Op::HeadLinear {
                input,
                weights,
                output,
            } => head_linear::head_linear(self.linear_level(), input, weights, output),
            Op::Rope {
                x,
                table,
                start_pos,
                ..
            } => rope::rope(self.isa.vector(), x, table, start_pos),
            Op::CopyRows { src, dst, n_rows } => elementwise::copy_rows(src, dst, n_rows),
            Op::Attention {
                operands,
                start_pos,
            } => attention::attention(self.isa.vector(), operands, start_pos),
            Op::PagedAttention {
                operands,
                block_size,
                seqs,
            } => paged_attention::paged_attention(self.isa.vector(), operands, block_size, seqs),
            Op::ScatterRows { src, rows, dst } => elementwise::scatter_rows(src, rows, dst),
            Op::RopeRows {
                x,
                table,
                positions,
                ..
            } => rope::rope_rows(self.isa.vector(), x, table, positions),
            Op::SiluMul { gate, up, output } => {
                activation::gate_mul::<activation::Silu>(self.isa.vector(), gate, up, output)
            }
            Op::Add { x, y } => elementwise::add(self.isa.vector(), x, y),
            Op::GatedAdd { x, y, gate } => elementwise::gated_add(x, y, gate),
            Op::Argmax { input, output } => {
                elementwise::argmax_rows(self.isa.vector(), input, output)
            }
            Op::Sample {
                logits,
                state,
                output,
                config,
            } => sample::sample(config, logits, state, output),
            Op::LayerNorm {
                input,
                weight,
                bias,
                eps,
                output,
            } => norm::layer_norm(self.isa.vector(), input, weight, bias, eps, output),
            Op::Gelu { x } => activation::gelu(self.isa.vector(), x),
            Op::MoeFfn {
                input,
                router,
                experts,
                first_expert,
                routing,
                activation,
                output,
            } => moe::moe_ffn(
                self.linear_level(),
                self.isa.vector(),
                input,
                (router, experts, first_expert),
                (&routing, activation),
                output,
            ),
            Op::GeluMul { gate, up, output } => {
                activation::gate_mul::<activation::GeluTanh>(self.isa.vector(), gate, up, output)
            }
            Op::SoftCap { x, cap } => activation::soft_cap(self.isa.vector(), x, cap),
            Op::Scale { x, alpha } => elementwise::scale(x, alpha),
            Op::Rope2d {
                x,
                table,
                positions,
                block_positions,
                ..
            } => rope::rope_2d(self.isa.vector(), x, table, positions, block_positions),
        }
    }
}
