//! [`flm_core::Op::Attention`] on [`super::CudaDevice`]:
//!
//! - prefill ([`FLASH_MIN_ROWS`] query rows or more, head dimension 64 or 128, batch
//!   invariance not asked for): [`super::flash_attn`], the FlashAttention-2 kernels of
//!   `kernels/flash_attn.cu`, tensor-core products on f16-rounded q, k, v;
//! - anything else (decode, other head dimensions, multi-head latent attention's decoupled
//!   RoPE part and value heads narrower or wider than the key heads): the flash-decoding
//!   kernels of `kernels/attention.cu` (partial softmax per chunk of [`ATTN_CHUNK`] cache
//!   positions, then an exact combine), in f32 over an f32 or f16 KV cache. The split is by
//!   a fixed chunk size, so a longer context gets more blocks: 4096 positions of 32 heads
//!   are 512 blocks for one row. Attention sinks (gpt-oss) always take this path: the
//!   combine adds each head's `e^(sink − M)` to the denominator.

use cudarc::driver::{CudaSlice, CudaView, PushKernelArg};
use flm_core::{alibi_slopes, AttentionOperands, Data, Error, Result};

use super::device::CudaDevice;
use super::flash_attn::flash_attention;
use super::graph::{Bound, StepWords};
use super::kernels::{FlashHeadDim, Kernel, KvType, ATTN_CHUNK};
use super::launch::{arg_or_null, dev_err, grid, int};
use super::operand::Input;

/// Query rows from which attention takes the flash (prefill) kernels: one warp's 16 rows
/// of an mma tile; fewer rows leave most of the tile empty.
pub const FLASH_MIN_ROWS: usize = 16;

/// Threads of an `attn_partial` block (4 warps, one key per warp at a time).
const THREADS: u32 = 128;

/// The device buffers both attention paths read: q (`n` rows of n_heads × head_dim f32),
/// the K and V cache rows (n_kv_heads × head_dim f32 each), the start position (one u32)
/// and the ALiBi slopes (n_heads f32) when the op has them.
pub(super) struct Operands<'a> {
    pub q: &'a CudaSlice<u8>,
    pub k: &'a CudaSlice<u8>,
    pub v: &'a CudaSlice<u8>,
    pub start: &'a CudaView<'a, u32>,
    pub slopes: Option<&'a CudaSlice<f32>>,
}

/// The widths of each head's parts in an attention op: its keys and queries (`head`),
/// the decoupled RoPE part of multi-head latent attention (`rope`, 0 without one) and its
/// values (`value`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Widths {
    pub head: usize,
    pub rope: usize,
    pub value: usize,
}

impl Widths {
    /// The widths of `o`'s heads (its shapes checked by the contract).
    pub(super) fn of(o: &AttentionOperands<'_>) -> Widths {
        let heads = o.params.n_heads;
        Widths {
            head: o.q.cols() / heads,
            rope: o.rope.map_or(0, |r| r.q.cols() / heads),
            value: o.output.cols() / heads,
        }
    }

    /// Whether the heads are plain ones (no RoPE part, values as wide as keys), as the
    /// flash kernels take them.
    pub(super) fn plain(self) -> bool {
        self.rope == 0 && self.value == self.head
    }

    /// `head`, `rope` and `value` as the kernels' `int` arguments.
    pub(super) fn ints(self) -> Result<[i32; 3]> {
        Ok([int(self.head)?, int(self.rope)?, int(self.value)?])
    }

    /// Bytes of dynamic shared memory of a partial kernel whose chunk takes `chunk` bytes:
    /// the chunk, the query's two parts and 32 floats of scratch.
    pub(super) fn partial_smem(self, op: &'static str, chunk: usize) -> Result<u32> {
        u32::try_from(chunk + (self.head + self.rope + 32) * 4).map_err(|_| Error::Shape {
            op,
            msg: format!("heads of {self:?}"),
        })
    }
}

/// The scalar kernel arguments of both attention paths: the `int`s of the op's fields,
/// `softcap` 0 for none and `window` 0 for none.
pub(super) struct Scalars {
    pub n_heads: i32,
    pub n_kv_heads: i32,
    pub scale: f32,
    pub softcap: f32,
    pub bidirectional: i32,
    pub window: i32,
}

/// [`flm_core::Op::Attention`]: the cache rows the rows of `q` see are copied to the GPU
/// (a host cache), the flash kernel or the partial kernel of the cache's dtype (f32 or f16)
/// and the combine kernel run (see the module docs), and the output comes back. In a
/// captured step, where the op must follow the
/// step, the kernels read the step's cache row from its buffer and the partial kernel's
/// grid covers the whole cache, so that the graph stays valid as the position moves (the
/// chunks past it exit at once).
///
/// Errors: [`Error::Device`] when a launch fails.
pub(super) fn attention<'a>(
    dev: &CudaDevice,
    o: AttentionOperands<'a>,
    start_pos: usize,
    follows_step: bool,
) -> Result<()> {
    let n = o.q.rows();
    let widths = Widths::of(&o);
    let n_kv = o.params.n_kv_heads;
    let filled = start_pos + n;
    if n == 0 {
        return Ok(());
    }
    let step = dev.step_words("Attention", follows_step, |tokens, _, row| {
        tokens.len() == n && row == start_pos
    })?;
    let rows = match step {
        Some(_) => o.cache_k.rows(),
        None => filled.max(o.params.bidirectional),
    };
    dev.bound(Bound::CacheRows(o.cache_k.rows()))?;
    let kv = KvType::of(o.cache_k.dtype()).ok_or_else(|| Error::DType {
        op: "Attention",
        msg: format!("a {} KV cache on cuda", o.cache_k.dtype()),
    })?;
    let elem = kv.bytes();
    let q = dev.input(o.q)?;
    // A host cache is copied up to the rows the op reads; one on this GPU is read in place.
    let cache = |c: &'a Data, width: usize| -> Result<Input<'a>> {
        if c.device_buffer().is_some() {
            dev.input(c)
        } else {
            Ok(Input::Staged(
                dev.upload(&c.bytes()?[..rows * n_kv * width * elem])?,
            ))
        }
    };
    let (k, v) = (
        cache(o.cache_k, widths.head)?,
        cache(o.cache_v, widths.value)?,
    );
    let rope = match o.rope {
        Some(r) => Some((dev.input(r.q)?, cache(r.cache, widths.rope)?)),
        None => None,
    };
    let start_pos = u32::try_from(start_pos)
        .map_err(|_| Error::InvalidArgument(format!("start_pos {start_pos}")))?;
    let start = dev.step_or_upload(step.as_ref(), StepWords::cache_row, &[start_pos])?;
    let start = start.view();
    let slopes = o
        .params
        .alibi
        .then(|| dev.upload(&alibi_slopes(o.params.n_heads)))
        .transpose()?;
    let scalars = Scalars {
        n_heads: int(o.params.n_heads)?,
        n_kv_heads: int(o.params.n_kv_heads)?,
        scale: o.params.scale,
        // 0 stands for no soft-capping (a cap is positive: Op::validate).
        softcap: o.params.softcap.unwrap_or(0.0),
        bidirectional: int(o.params.bidirectional)?,
        window: int(o.params.sliding_window.unwrap_or(0))?,
    };
    let operands = Operands {
        q: q.slice(),
        k: k.slice(),
        v: v.slice(),
        start: &start,
        slopes: slopes.as_ref(),
    };
    let sinks = o.sinks.map(|s| dev.input(s)).transpose()?;
    // The flash kernel has no sink term; the partial kernels' combine has.
    let flash = FlashHeadDim::of(widths.head).filter(|_| {
        widths.plain() && n >= FLASH_MIN_ROWS && !dev.batch_invariant() && sinks.is_none()
    });
    if let Some(dim) = flash {
        let mut out = dev.output(o.output)?;
        flash_attention(dev, (dim, kv), &operands, &scalars, n, out.slice())?;
        return out.finish(dev);
    }
    let mut parts = Partials::new(
        dev,
        (n, o.params.n_heads, widths.value),
        rows.div_ceil(ATTN_CHUNK),
    )?;
    let [hd, rd, vd] = widths.ints()?;
    let smem = widths.partial_smem("Attention", ATTN_CHUNK * 4)?;
    let f = dev.function(Kernel::AttnPartial(kv))?;
    let mut b = dev.stream.launch_builder(f);
    let sc = &scalars;
    b.arg(operands.q).arg(operands.k).arg(operands.v);
    arg_or_null(&mut b, rope.as_ref().map(|(q, _)| q.slice()));
    arg_or_null(&mut b, rope.as_ref().map(|(_, k)| k.slice()));
    b.arg(operands.start)
        .arg(&sc.n_heads)
        .arg(&sc.n_kv_heads)
        .arg(&hd)
        .arg(&rd)
        .arg(&vd)
        .arg(&sc.scale)
        .arg(&sc.softcap);
    arg_or_null(&mut b, operands.slopes);
    b.arg(&sc.bidirectional).arg(&sc.window);
    b.arg(&mut parts.m).arg(&mut parts.l).arg(&mut parts.o);
    // SAFETY: arguments as `attn_partial` / `attn_partial_f16`; q holds n × n_heads ×
    // head_dim floats, k and v `rows` cache rows of n_kv_heads × head_dim (keys) and
    // n_kv_heads × v_dim (values) elements of the kernel's type (supports: f32 or f16, one
    // for all; every position a row sees is below `rows`), the RoPE part n × n_heads ×
    // rope_dim floats and `rows` rows of n_kv_heads × rope_dim elements, or two nulls with
    // rope_dim 0, the slopes n_heads floats or null, the partial buffers one entry (and
    // v_dim values) per (row, head, chunk), and the dynamic shared memory is the chunk's
    // scores, the query's two parts and 32 floats of scratch.
    unsafe { b.launch(grid((o.params.n_heads, n, parts.chunks), THREADS, smem)?) }
        .map_err(dev_err)?;
    parts.combine(dev, sinks.as_ref().map(Input::slice), o.output)
}

/// The per-chunk partial results of a flash-decoding attention (`attn_partial`,
/// `paged_attn_partial`): the maximum `m`, the sum `l` and the unnormalised output `o`
/// (`width` values, the value heads' width) of each (row, head, chunk), in that order.
pub(super) struct Partials {
    pub m: CudaSlice<f32>,
    pub l: CudaSlice<f32>,
    pub o: CudaSlice<f32>,
    /// Chunks per (row, head).
    pub chunks: usize,
    shape: (usize, usize, usize),
}

impl Partials {
    /// Zeroed partials of `(rows, n_heads, width)` over `chunks` chunks.
    pub(super) fn new(
        dev: &CudaDevice,
        (rows, n_heads, width): (usize, usize, usize),
        chunks: usize,
    ) -> Result<Partials> {
        let parts = rows * n_heads * chunks;
        Ok(Partials {
            m: dev.zeros::<f32>(parts)?,
            l: dev.zeros::<f32>(parts)?,
            o: dev.zeros::<f32>(parts * width)?,
            chunks,
            shape: (rows, n_heads, width),
        })
    }

    /// Merges the chunks into `output` `[rows, n_heads · width]` (`attn_combine`), with the
    /// attention sinks `sinks` (f32 `[n_heads]`) in the denominators if given.
    ///
    /// Errors: [`Error::Device`] when the launch fails.
    pub(super) fn combine(
        self,
        dev: &CudaDevice,
        sinks: Option<&CudaSlice<u8>>,
        output: &mut Data,
    ) -> Result<()> {
        let (rows, n_heads, width) = self.shape;
        let mut out = dev.output(output)?;
        let (nh, hd, chunks) = (int(n_heads)?, int(width)?, int(self.chunks)?);
        let f = dev.function(Kernel::AttnCombine)?;
        let mut b = dev.stream.launch_builder(f);
        b.arg(&self.m).arg(&self.l).arg(&self.o);
        arg_or_null(&mut b, sinks);
        b.arg(&nh).arg(&hd).arg(&chunks).arg(out.slice());
        // SAFETY: the partial buffers as allocated by `new` and written by a partial
        // kernel, the sinks n_heads floats (Op::validate) or null, out rows × n_heads ×
        // width floats, as `attn_combine` reads and writes them.
        unsafe { b.launch(grid((n_heads, rows, 1), THREADS, 0)?) }.map_err(dev_err)?;
        out.finish(dev)
    }
}
