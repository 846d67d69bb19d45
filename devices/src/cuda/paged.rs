//! [`flm_core::Op::PagedAttention`] and [`flm_core::Op::ScatterRows`] on
//! [`super::CudaDevice`] (`kernels/paged_attention.cu`): attention through each sequence's
//! block table, split over the context and merged by `attention.cu`'s `attn_combine`, and
//! the scatter of new key/value rows into their pool slots.
//!
//! Both run on operands in this GPU's memory only (the pool is placed with the layers): a
//! pool in host memory would be copied whole for every op. The row metadata (positions,
//! block tables, destination rows) come with the op in host memory, packed by [`RowMap`];
//! they are the same for every layer of a step, so [`Uploads`] copies them up once per
//! step and the other layers reuse that copy.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, PushKernelArg};
use flm_core::{alibi_slopes, AttentionOperands, Data, DataType, Error, PagedSeq, Result};

use super::attention::{Partials, Widths};
use super::device::CudaDevice;
use super::kernels::{Kernel, KvType, PAGED_CHUNK};
use super::launch::{arg_or_null, dev_err, grid, int};
use super::operand::Input;

/// Threads of a `paged_attn_partial` block (4 warps, one key per warp at a time).
const THREADS: u32 = 128;

/// Threads of a `scatter_rows` block (one block per row).
const SCATTER_THREADS: u32 = 256;

/// The row metadata `paged_attn_partial` reads, packed in one `u32` array: `row_pos` (each
/// row's cache position), then `row_table` (where its sequence's block table starts in
/// `tables`), then `tables` (every sequence's block table, in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RowMap {
    /// `[row_pos; n_rows] ++ [row_table; n_rows] ++ tables`.
    pub words: Vec<u32>,
    /// Rows of `q`.
    pub n_rows: usize,
    /// The largest cache position any row sees, plus one.
    pub context: usize,
}

impl RowMap {
    /// The map of `seqs`, whose rows follow one another in `q`.
    ///
    /// Errors: [`Error::InvalidArgument`] for a position or a table offset beyond `u32`.
    pub(crate) fn new(seqs: &[PagedSeq<'_>]) -> Result<RowMap> {
        let n_rows: usize = seqs.iter().map(|s| s.n_rows).sum();
        let tables: usize = seqs.iter().map(|s| s.blocks.len()).sum();
        let word = |v: usize| {
            u32::try_from(v).map_err(|_| Error::InvalidArgument(format!("{v} exceeds a u32")))
        };
        let mut words = Vec::with_capacity(2 * n_rows + tables);
        let mut context = 0;
        for s in seqs {
            for p in s.start_pos..s.start_pos + s.n_rows {
                words.push(word(p)?);
                context = context.max(p + 1);
            }
        }
        let mut offset = 2 * n_rows;
        for s in seqs {
            // Offsets count from the start of `tables`, which the kernel is given.
            let at = word(offset - 2 * n_rows)?;
            words.extend(std::iter::repeat_n(at, s.n_rows));
            offset += s.blocks.len();
        }
        for s in seqs {
            words.extend_from_slice(s.blocks);
        }
        Ok(RowMap {
            words,
            n_rows,
            context,
        })
    }
}

/// The row metadata last uploaded for each op, reused while an op brings the same words
/// (the layers of one step).
#[derive(Default)]
pub(super) struct Uploads {
    /// [`RowMap::words`] of the last [`flm_core::Op::PagedAttention`].
    row_map: Option<(Vec<u32>, Arc<CudaSlice<u32>>)>,
    /// The destination rows of the last [`flm_core::Op::ScatterRows`].
    scatter: Option<(Vec<u32>, Arc<CudaSlice<u32>>)>,
}

/// `words` in GPU memory: the copy in `slot` when it holds the same words, else a new
/// upload, kept there for the next call.
fn upload_once(
    dev: &CudaDevice,
    slot: impl FnOnce(&mut Uploads) -> &mut Option<(Vec<u32>, Arc<CudaSlice<u32>>)>,
    words: &[u32],
) -> Result<Arc<CudaSlice<u32>>> {
    let mut uploads = dev
        .paged_uploads
        .lock()
        .map_err(|_| Error::Device("paged metadata cache poisoned".into()))?;
    let slot = slot(&mut uploads);
    if let Some((held, buffer)) = slot.as_ref() {
        if held == words {
            return Ok(Arc::clone(buffer));
        }
    }
    let buffer = Arc::new(dev.upload(words)?);
    *slot = Some((words.to_vec(), Arc::clone(&buffer)));
    Ok(buffer)
}

/// The kernels' variant for a pool of `dtype`.
fn kv_type(op: &'static str, dtype: DataType) -> Result<KvType> {
    KvType::of(dtype).ok_or_else(|| Error::DType {
        op,
        msg: format!("a {dtype} KV pool"),
    })
}

/// [`flm_core::Op::PagedAttention`] over pools in this GPU's memory: `paged_attn_partial`
/// over every (head, row, chunk of [`PAGED_CHUNK`] positions), then `attn_combine`.
///
/// Errors: [`Error::DType`] for a pool type without kernels; [`Error::Device`] when a
/// launch fails.
pub(super) fn paged_attention(
    dev: &CudaDevice,
    o: AttentionOperands<'_>,
    block_size: usize,
    seqs: &[PagedSeq<'_>],
) -> Result<()> {
    let (q, params) = (o.q, o.params);
    let n = q.rows();
    if n == 0 {
        return Ok(());
    }
    let kv = kv_type("PagedAttention", o.cache_k.dtype())?;
    let widths = Widths::of(&o);
    let map = RowMap::new(seqs)?;
    let qd = dev.input(q)?;
    let (k, v) = (dev.input(o.cache_k)?, dev.input(o.cache_v)?);
    let rope = match o.rope {
        Some(r) => Some((dev.input(r.q)?, dev.input(r.cache)?)),
        None => None,
    };
    let meta = upload_once(dev, |u| &mut u.row_map, &map.words)?;
    let r = map.n_rows;
    let (row_pos, row_table, tables) =
        (meta.slice(0..r), meta.slice(r..2 * r), meta.slice(2 * r..));
    let slopes = params
        .alibi
        .then(|| dev.upload(&alibi_slopes(params.n_heads)))
        .transpose()?;
    let mut parts = Partials::new(
        dev,
        (n, params.n_heads, widths.value),
        map.context.div_ceil(PAGED_CHUNK),
    )?;
    let (nh, nkv) = (int(params.n_heads)?, int(params.n_kv_heads)?);
    let [hd, rd, vd] = widths.ints()?;
    let (bs, window) = (int(block_size)?, int(params.sliding_window.unwrap_or(0))?);
    // 0 stands for no soft-capping (a cap is positive: Op::validate).
    let softcap = params.softcap.unwrap_or(0.0);
    // Scores and pool rows of a chunk.
    let smem = widths.partial_smem("PagedAttention", PAGED_CHUNK * (4 + 8))?;
    let f = dev.function(Kernel::PagedAttnPartial(kv))?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(qd.slice()).arg(k.slice()).arg(v.slice());
    arg_or_null(&mut b, rope.as_ref().map(|(q, _)| q.slice()));
    arg_or_null(&mut b, rope.as_ref().map(|(_, k)| k.slice()));
    b.arg(&row_pos)
        .arg(&row_table)
        .arg(&tables)
        .arg(&bs)
        .arg(&nh)
        .arg(&nkv)
        .arg(&hd)
        .arg(&rd)
        .arg(&vd)
        .arg(&params.scale)
        .arg(&softcap);
    arg_or_null(&mut b, slopes.as_ref());
    b.arg(&window);
    b.arg(&mut parts.m).arg(&mut parts.l).arg(&mut parts.o);
    // SAFETY: arguments as `paged_attn_partial_<KV>`: q holds n × n_heads × head_dim
    // floats, the pools n_blocks · block_size rows of n_kv_heads × head_dim (keys) and
    // n_kv_heads × v_dim (values) values, the RoPE part n × n_heads × rope_dim floats and a
    // pool of n_kv_heads × rope_dim values per row, or two nulls with rope_dim 0 (the
    // contract checks the shapes), the row map n positions, n table offsets and the
    // tables, whose every entry a row reads (positions below its own + 1) is a block of the
    // pool (Op::validate), the slopes n_heads floats or null, the partial buffers one entry
    // (and v_dim values) per (row, head, chunk); the dynamic shared memory is as the kernel
    // lays it out.
    unsafe { b.launch(grid((params.n_heads, n, parts.chunks), THREADS, smem)?) }
        .map_err(dev_err)?;
    let sinks = o.sinks.map(|s| dev.input(s)).transpose()?;
    parts.combine(dev, sinks.as_ref().map(Input::slice), o.output)
}

/// [`flm_core::Op::ScatterRows`] into a tensor in this GPU's memory: `dst[rows[r], :] =
/// src[r, :]`, one block per row.
///
/// Errors: [`Error::DType`] for a destination type without kernels; [`Error::Device`] when
/// a launch fails.
pub(super) fn scatter_rows(
    dev: &CudaDevice,
    src: &Data,
    rows: &[u32],
    dst: &mut Data,
) -> Result<()> {
    if rows.is_empty() || src.cols() == 0 {
        return Ok(());
    }
    let kv = kv_type("ScatterRows", dst.dtype())?;
    let cols = int(src.cols())?;
    let s = dev.input(src)?;
    let ids = upload_once(dev, |u| &mut u.scatter, rows)?;
    let mut d = dev.in_out(dst)?;
    let f = dev.function(Kernel::ScatterRows(kv))?;
    let mut b = dev.stream.launch_builder(f);
    b.arg(s.slice()).arg(&*ids).arg(d.slice()).arg(&cols);
    // SAFETY: arguments as `scatter_rows_<KV>`: src holds rows.len() × cols floats and
    // dst at least max(rows) + 1 rows of cols values (Op::validate).
    unsafe { b.launch(grid((rows.len(), 1, 1), SCATTER_THREADS, 0)?) }.map_err(dev_err)?;
    d.finish(dev)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flm_core::PagedKvCache;

    /// The kernel's lookup `tables[row_table[r] + t / bs] · bs + t % bs` over the packed map
    /// gives the pool row [`PagedKvCache::slot`] gives, for every position a row sees.
    #[test]
    fn the_row_map_finds_every_position_the_block_table_holds() {
        let bs = 16;
        let kv = PagedKvCache::new(1, 12, bs, (4, 4), flm_core::DataType::F32).unwrap();
        let (a, b, c) = (vec![3u32, 7], vec![3u32, 1, 0, 9], vec![11u32]);
        let seqs = [
            PagedSeq {
                n_rows: 1,
                start_pos: 20,
                blocks: &a,
            },
            PagedSeq {
                n_rows: 5,
                start_pos: 40,
                blocks: &b,
            },
            PagedSeq {
                n_rows: 0,
                start_pos: 3,
                blocks: &c,
            },
            PagedSeq {
                n_rows: 2,
                start_pos: 0,
                blocks: &c,
            },
        ];
        let map = RowMap::new(&seqs).unwrap();
        assert_eq!(map.n_rows, 8);
        assert_eq!(map.context, 45);
        let n = map.n_rows;
        let (pos, table, tables) = (&map.words[..n], &map.words[n..2 * n], &map.words[2 * n..]);
        let mut row = 0;
        for s in &seqs {
            for i in 0..s.n_rows {
                let p = pos[row] as usize;
                assert_eq!(p, s.start_pos + i);
                for t in 0..=p {
                    let slot = tables[table[row] as usize + t / bs] as usize * bs + t % bs;
                    assert_eq!(
                        Some(slot as u32),
                        kv.slot(s.blocks, t),
                        "row {row} position {t}"
                    );
                }
                row += 1;
            }
        }
    }
}
