//! The paged KV cache (Kwon et al. 2023, vLLM's PagedAttention): keys and values of many
//! sequences in one pool of fixed-size blocks.
//!
//! The pool holds `n_blocks` blocks of `block_size` positions per layer, f32 or f16
//! ([`crate::KvDtype`]) `[n_blocks · block_size, kv_dim]` for the keys and the same for the
//! values. A sequence
//! owns a list of blocks, its *block table*: its position `t` lives in pool row
//! `table[t / block_size] · block_size + t % block_size`. Blocks are handed out and taken
//! back by a [`BlockAllocator`] (a free list, O(1) both ways), so sequences of any length
//! share the memory without fragmentation, and a sequence that ends gives its blocks back
//! at once. Blocks carry a reference count, so that a block can be shared by several
//! sequences (a common prompt prefix) and returns to the free list with its last owner.

use crate::kv_cache::{check_kv_dtype, LayerPairs};
use crate::{Data, DataType, Error, Executor, KvDtype, Location, Result};

/// Hands out the blocks `0..n_blocks` of a pool: a LIFO free list and a reference count
/// per block. Running out is a value ([`BlockAllocator::alloc`] returns `None`), which a
/// scheduler answers by waiting or preempting, never a panic.
#[derive(Debug, Clone)]
pub struct BlockAllocator {
    free: Vec<u32>,
    refs: Vec<u32>,
}

impl BlockAllocator {
    /// An allocator of `n_blocks` free blocks.
    ///
    /// Errors: [`Error::InvalidArgument`] if `n_blocks` does not fit in a `u32`.
    pub fn new(n_blocks: usize) -> Result<BlockAllocator> {
        let n = u32::try_from(n_blocks).map_err(|_| {
            Error::InvalidArgument(format!("{n_blocks} KV blocks: at most 2^32 − 1"))
        })?;
        Ok(BlockAllocator {
            free: (0..n).rev().collect(),
            refs: vec![0; n_blocks],
        })
    }

    /// Blocks in the pool.
    pub fn total(&self) -> usize {
        self.refs.len()
    }

    /// Blocks free now.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// Takes a free block (reference count 1), or `None` when every block is in use.
    pub fn alloc(&mut self) -> Option<u32> {
        let b = self.free.pop()?;
        self.refs[b as usize] = 1;
        Some(b)
    }

    /// Adds an owner to block `b` (a shared prefix).
    ///
    /// Errors: [`Error::InvalidArgument`] if `b` is out of range or free.
    pub fn retain(&mut self, b: u32) -> Result<()> {
        match self.refs.get_mut(b as usize) {
            Some(r) if *r > 0 => {
                *r += 1;
                Ok(())
            }
            _ => Err(Error::InvalidArgument(format!(
                "KV block {b} is not allocated"
            ))),
        }
    }

    /// Drops one owner of block `b`; the block is free again when none is left.
    ///
    /// Errors: [`Error::InvalidArgument`] if `b` is out of range or already free (a
    /// double free), which leaves the allocator unchanged.
    pub fn release(&mut self, b: u32) -> Result<()> {
        match self.refs.get_mut(b as usize) {
            Some(r) if *r > 0 => {
                *r -= 1;
                if *r == 0 {
                    self.free.push(b);
                }
                Ok(())
            }
            _ => Err(Error::InvalidArgument(format!(
                "KV block {b} released but not allocated"
            ))),
        }
    }

    /// The owners of block `b` (0 when free or out of range).
    pub fn ref_count(&self, b: u32) -> u32 {
        self.refs.get(b as usize).copied().unwrap_or(0)
    }
}

/// The block pool of every layer (see the module docs): per layer a pair of f32 or f16
/// `[n_blocks · block_size, k_dim]` and `[n_blocks · block_size, v_dim]` tensors (keys,
/// values), plus the allocator of its blocks.
pub struct PagedKvCache {
    layers: LayerPairs,
    block_size: usize,
    allocator: BlockAllocator,
}

impl PagedKvCache {
    /// Allocates `n_blocks` zeroed blocks of `block_size` positions for `n_layers` layers of
    /// `widths = (k_dim, v_dim)` keys and values per position (`n_kv_heads · head_dim` each)
    /// of `dtype`, all free, in host memory.
    ///
    /// Errors: [`Error::InvalidArgument`] for a block size or block count of 0;
    /// [`Error::Shape`] if the size overflows; [`Error::DType`] unless `dtype` is f32 or f16.
    pub fn new(
        n_layers: usize,
        n_blocks: usize,
        block_size: usize,
        widths: (usize, usize),
        dtype: DataType,
    ) -> Result<PagedKvCache> {
        check_kv_dtype("PagedKvCache::new", dtype)?;
        let host = vec![Location::Host; n_layers];
        PagedKvCache::alloc(&host, (n_blocks, block_size, widths), &|shape, _| {
            Data::zeros(dtype, shape)
        })
    }

    /// As [`PagedKvCache::new`], with layer `l`'s pools allocated by `exec` in the memory of
    /// `locations[l]` (one layer per location), where the layer runs, of the element type
    /// `dtype` chooses there.
    ///
    /// Errors: those of [`PagedKvCache::new`]; the allocation's errors.
    pub fn placed(
        exec: &Executor,
        locations: &[Location],
        n_blocks: usize,
        block_size: usize,
        widths: (usize, usize),
        dtype: KvDtype,
    ) -> Result<PagedKvCache> {
        PagedKvCache::alloc(locations, (n_blocks, block_size, widths), &|shape, at| {
            exec.zeros(dtype.dtype_at(at), shape, at)
        })
    }

    /// The pools of a layer per location, each made by `zeros(shape, location)`.
    fn alloc(
        locations: &[Location],
        (n_blocks, block_size, widths): (usize, usize, (usize, usize)),
        zeros: &dyn Fn(&[usize], Location) -> Result<Data>,
    ) -> Result<PagedKvCache> {
        if block_size == 0 || n_blocks == 0 {
            return Err(Error::InvalidArgument(format!(
                "a paged KV cache needs blocks of at least one position and at least one \
                 block (got {n_blocks} blocks of {block_size})"
            )));
        }
        let rows = n_blocks
            .checked_mul(block_size)
            .ok_or_else(|| Error::Shape {
                op: "PagedKvCache::new",
                msg: format!("{n_blocks} blocks of {block_size} positions overflow"),
            })?;
        let layers = LayerPairs::alloc(locations, (rows, widths), zeros)?;
        Ok(PagedKvCache {
            layers,
            block_size,
            allocator: BlockAllocator::new(n_blocks)?,
        })
    }

    /// Bytes of one block over all layers, keys and values: `n_layers · block_size ·
    /// (k_dim + v_dim)` elements of `dtype`. Divide a memory budget by it for the number of
    /// blocks.
    pub fn block_bytes(
        n_layers: usize,
        block_size: usize,
        (k_dim, v_dim): (usize, usize),
        dtype: DataType,
    ) -> usize {
        k_dim
            .saturating_add(v_dim)
            .saturating_mul(n_layers)
            .saturating_mul(block_size)
            .saturating_mul(dtype.size_of())
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The block allocator.
    pub fn allocator(&self) -> &BlockAllocator {
        &self.allocator
    }

    /// The block allocator, to take and give back blocks.
    pub fn allocator_mut(&mut self) -> &mut BlockAllocator {
        &mut self.allocator
    }

    /// Blocks needed to hold `positions` positions.
    pub fn blocks_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.block_size)
    }

    /// The pool row of position `pos` of a sequence with block table `table`, or `None`
    /// when the table is too short.
    pub fn slot(&self, table: &[u32], pos: usize) -> Option<u32> {
        let block = *table.get(pos / self.block_size)? as usize;
        u32::try_from(block * self.block_size + pos % self.block_size).ok()
    }

    /// The `(keys, values)` pool of layer `layer`. Panics if `layer` is out of range, which is
    /// a programming error of the model graph, not an input error.
    pub fn layer_mut(&mut self, layer: usize) -> (&mut Data, &mut Data) {
        self.layers.layer_mut(layer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_hands_out_every_block_once_and_counts_owners() {
        let mut a = BlockAllocator::new(3).unwrap();
        let got: Vec<u32> = (0..3).map(|_| a.alloc().unwrap()).collect();
        let mut sorted = got.clone();
        sorted.sort();
        assert_eq!(sorted, [0, 1, 2]);
        assert_eq!(a.alloc(), None);
        assert_eq!(a.free(), 0);
        a.retain(got[1]).unwrap();
        a.release(got[1]).unwrap();
        assert_eq!(a.free(), 0, "a shared block stays with its other owner");
        a.release(got[1]).unwrap();
        assert_eq!(a.free(), 1);
        assert!(a.release(got[1]).is_err(), "double free");
        assert!(a.retain(got[1]).is_err());
        assert!(a.release(7).is_err());
        assert_eq!(a.alloc(), Some(got[1]));
    }

    #[test]
    fn slots_follow_the_block_table() {
        let kv = PagedKvCache::new(2, 4, 3, (5, 5), DataType::F32).unwrap();
        assert_eq!(kv.layers.0[0].0.shape(), &[12, 5]);
        let table = [2, 0];
        assert_eq!(kv.slot(&table, 0), Some(6));
        assert_eq!(kv.slot(&table, 2), Some(8));
        assert_eq!(kv.slot(&table, 3), Some(0));
        assert_eq!(kv.slot(&table, 6), None);
        assert_eq!(kv.blocks_for(7), 3);
        assert!(PagedKvCache::new(1, 0, 16, (4, 4), DataType::F32).is_err());
        assert!(PagedKvCache::new(1, 4, 0, (4, 4), DataType::F32).is_err());
        assert!(PagedKvCache::new(1, 4, 4, (4, 4), DataType::Q8_0).is_err());
        assert_eq!(
            PagedKvCache::block_bytes(2, 16, (8, 8), DataType::F32),
            2 * 2 * 16 * 8 * 4
        );
        let half = PagedKvCache::new(1, 4, 3, (5, 5), DataType::F16).unwrap();
        assert_eq!(half.layers.0[0].1.dtype(), DataType::F16);
    }
}
