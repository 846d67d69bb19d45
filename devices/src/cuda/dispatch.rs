//! [`CudaDevice`] as a [`BaseDevice`]: which ops it runs, on which operands, and the one
//! place each op is handed to its module (one per kernel file: `norm`, `elementwise`,
//! `embedding`, `linear`, `rope`, `attention`, `paged`, `sample`; `head_linear` runs
//! `linear`'s kernels per head).

use std::sync::atomic::Ordering;

use flm_core::{
    AttentionOperands, BaseDevice, CapturedStep, CheckedOp, Data, DataType, DeviceBuffer, Error,
    Location, Op, Result, StepInputs,
};

use super::kernels::{has_quant_kernels, FloatWeight, KvType};
use super::{
    attention, elementwise, embedding, head_linear, linear, norm, paged, rope, sample, CudaDevice,
};
use crate::gemv_layout::GemvLayout;

impl BaseDevice for CudaDevice {
    fn name(&self) -> &'static str {
        "cuda"
    }

    /// Ops whose operands are all on this GPU or all in host memory (the per-op offload,
    /// [`BaseDevice::runs_host_operands`]); row copies only on this GPU.
    fn supports(&self, op: &Op<'_>) -> bool {
        let resident = match op.location() {
            Ok(Location::Host) => false,
            Ok(at) if at == self.location() => true,
            _ => return false,
        };
        let f32 = |d: &Data| d.dtype() == DataType::F32;
        // A KV cache of flm_core::KvDtype: f32 or f16.
        let kv_cache = |d: &Data| matches!(d.dtype(), DataType::F32 | DataType::F16);
        let float_w = |d: &Data| FloatWeight::of(d.dtype()).is_some();
        let any_w = |d: &Data| float_w(d) || has_quant_kernels(d.dtype());
        match op {
            Op::Embedding { table, output, .. } => any_w(table) && f32(output),
            Op::RmsNorm {
                input,
                weight,
                output,
                ..
            } => f32(input) && float_w(weight) && f32(output),
            Op::LayerNorm {
                input,
                weight,
                bias,
                output,
                ..
            } => f32(input) && float_w(weight) && bias.dtype() == weight.dtype() && f32(output),
            Op::Linear {
                input,
                weight,
                bias,
                output,
            } => f32(input) && self.supports_linear(weight, *bias, output),
            Op::Linears { input, parts } => {
                f32(input)
                    && parts
                        .iter()
                        .all(|p| self.supports_linear(p.weight, p.bias, p.output))
            }
            Op::Rope { x, .. } | Op::RopeRows { x, .. } | Op::Rope2d { x, .. } => f32(x),
            Op::Attention { operands: o, .. } => {
                f32(o.q)
                    && kv_cache(o.cache_k)
                    && o.cache_v.dtype() == o.cache_k.dtype()
                    && f32(o.output)
                    && rope_part(o)
            }
            Op::SiluMul { gate, up, output } | Op::GeluMul { gate, up, output } => {
                f32(gate) && f32(up) && f32(output)
            }
            Op::Add { x, y } => f32(x) && f32(y),
            Op::Gelu { x } | Op::Scale { x, .. } | Op::SoftCap { x, .. } => f32(x),
            Op::Argmax { input, .. } => f32(input),
            // Sampling state lives with the logits: host logits are sampled on the host.
            Op::Sample { .. } => resident,
            // Host row copies are the CPU's, and so is a paged pool in host memory (this
            // GPU would copy it whole for every op).
            Op::CopyRows {
                src: (src, _),
                dst: (dst, _),
                ..
            } => resident && f32(src) && kv_cache(dst),
            Op::PagedAttention { operands: o, .. } => {
                resident
                    && f32(o.q)
                    && KvType::of(o.cache_k.dtype()).is_some()
                    && f32(o.output)
                    && rope_part(o)
            }
            Op::ScatterRows { src, dst, .. } => {
                resident && f32(src) && KvType::of(dst.dtype()).is_some()
            }
            // The experts run on the CPU, from host memory (`--moe-device cpu`).
            Op::MoeFfn { .. } => false,
            Op::HeadLinear {
                input,
                weights,
                output,
            } => {
                f32(input)
                    && weights
                        .iter()
                        .all(|w| self.supports_linear(w, None, output))
            }
            // Qwen2-MoE's shared expert runs beside the routed experts, on the CPU.
            Op::GatedAdd { .. } => false,
        }
    }

    fn require_batch_invariance(&self) {
        self.batch_invariant.store(true, Ordering::Relaxed);
    }

    fn location(&self) -> Location {
        Location::Device {
            name: "cuda",
            ordinal: self.ordinal,
        }
    }

    /// The per-op offload: activations are copied in and out for each op, weights once.
    fn runs_host_operands(&self) -> bool {
        true
    }

    fn free_memory(&self) -> Option<u64> {
        let (free, _total) = self.stream.context().mem_get_info().ok()?;
        Some(free as u64)
    }

    fn alloc(&self, bytes: usize) -> Result<Box<dyn DeviceBuffer>> {
        self.alloc_buffer(bytes)
    }

    fn upload(&self, src: &[u8], dst: &mut dyn DeviceBuffer) -> Result<()> {
        self.upload_bytes(src, dst)
    }

    fn download(&self, src: &dyn DeviceBuffer, dst: &mut [u8]) -> Result<()> {
        self.download_bytes(src, dst)
    }

    /// int8/int4 tensors repacked into the GPU GEMV layout ([`crate::gemv_layout`]), the
    /// layout every kernel reads them in; other dtypes as they are.
    fn upload_tensor(&self, src: &Data, dst: &mut dyn DeviceBuffer) -> Result<()> {
        match GemvLayout::in_gpu_memory(src.dtype(), src.shape())? {
            Some(layout) => self.upload_bytes(&layout.pack(src.bytes()?)?, dst),
            None => self.upload_bytes(src.bytes()?, dst),
        }
    }

    /// The inverse of [`BaseDevice::upload_tensor`]: int8/int4 tensors unpacked.
    fn download_tensor(&self, src: &dyn DeviceBuffer, dst: &mut Data) -> Result<()> {
        match GemvLayout::in_gpu_memory(dst.dtype(), dst.shape())? {
            Some(layout) => self.download_packed(&layout, src, dst.bytes_mut()?),
            None => self.download_bytes(src, dst.bytes_mut()?),
        }
    }

    fn supports_capture(&self) -> bool {
        true
    }

    fn begin_capture(&self, step: &StepInputs<'_>) -> Result<()> {
        self.begin_step_capture(step)
    }

    fn end_capture(&self, keep: bool) -> Result<Option<Box<dyn CapturedStep>>> {
        self.end_step_capture(keep)
    }

    fn replay(&self, captured: &dyn CapturedStep, step: &StepInputs<'_>) -> Result<()> {
        self.replay_step(captured, step)
    }

    fn run(&self, op: CheckedOp<'_>) -> Result<()> {
        let step = op.follows_step();
        match op.into_op() {
            Op::Embedding {
                table,
                tokens,
                output,
            } => embedding::embedding(self, table, (tokens, step), output),
            Op::RmsNorm {
                input,
                weight,
                eps,
                output,
            } => norm::norm(self, input, weight, None, eps, output),
            Op::LayerNorm {
                input,
                weight,
                bias,
                eps,
                output,
            } => norm::norm(self, input, weight, Some(bias), eps, output),
            Op::Linear {
                input,
                weight,
                bias,
                output,
            } => linear::linear(self, input, weight, bias, output),
            Op::Linears { input, parts } => parts
                .iter_mut()
                .try_for_each(|p| linear::linear(self, input, p.weight, p.bias, p.output)),
            Op::Rope {
                x,
                table,
                n_heads,
                start_pos,
            } => {
                let positions: Vec<u32> = (0..x.rows())
                    .map(|i| u32::try_from(start_pos.saturating_add(i)).unwrap_or(u32::MAX))
                    .collect();
                rope::rope(self, x, table, n_heads, &[(&positions, 0)], step)
            }
            Op::RopeRows {
                x,
                table,
                n_heads,
                positions,
            } => rope::rope(self, x, table, n_heads, &[(positions, 0)], step),
            Op::Rope2d {
                x,
                table,
                n_heads,
                positions,
                block_positions,
            } => {
                let half = table.head_dim();
                rope::rope(
                    self,
                    x,
                    table,
                    n_heads,
                    &[(positions, 0), (block_positions, half)],
                    step,
                )
            }
            Op::Attention {
                operands,
                start_pos,
            } => attention::attention(self, operands, start_pos, step),
            Op::SiluMul { gate, up, output } => {
                elementwise::gate_mul(self, elementwise::Gate::Silu, gate, up, output)
            }
            Op::GeluMul { gate, up, output } => {
                elementwise::gate_mul(self, elementwise::Gate::Gelu, gate, up, output)
            }
            Op::Add { x, y } => elementwise::add(self, x, y),
            Op::Gelu { x } => elementwise::unary(self, x, elementwise::Unary::Gelu),
            Op::Scale { x, alpha } => elementwise::unary(self, x, elementwise::Unary::Scale(alpha)),
            Op::SoftCap { x, cap } => elementwise::unary(self, x, elementwise::Unary::SoftCap(cap)),
            Op::Argmax { input, output } => sample::argmax(self, input, output),
            Op::Sample {
                logits,
                state,
                output,
                config,
            } => sample::sample(self, config, logits, state, output),
            Op::CopyRows { src, dst, n_rows } => {
                elementwise::copy_rows(self, src, dst, (n_rows, step))
            }
            Op::PagedAttention {
                operands,
                block_size,
                seqs,
            } => paged::paged_attention(self, operands, block_size, seqs),
            Op::ScatterRows { src, rows, dst } => paged::scatter_rows(self, src, rows, dst),
            Op::HeadLinear {
                input,
                weights,
                output,
            } => head_linear::head_linear(self, input, weights, output),
            op @ (Op::MoeFfn { .. } | Op::GatedAdd { .. }) => {
                Err(Error::Unsupported(format!("{:?} on cuda", op.kind())))
            }
        }
    }
}

/// Whether the decoupled RoPE part of `o`, if any, is of the types the kernels read: f32
/// queries and rotated keys of the cache's type.
fn rope_part(o: &AttentionOperands<'_>) -> bool {
    o.rope
        .is_none_or(|r| r.q.dtype() == DataType::F32 && r.cache.dtype() == o.cache_k.dtype())
}
