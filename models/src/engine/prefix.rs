//! The prefix cache: KV blocks of computed prompt prefixes, kept across requests and shared
//! between sequences (vLLM's automatic prefix caching, Kwon et al. 2023, with its
//! least-recently-used eviction).
//!
//! A block whose `block_size` positions are all computed is registered under its *key*: the
//! block before it in the sequence's table (or none for the first) and its tokens, hashed
//! together. Since the block before it is identified the same way, a key names the whole
//! token prefix up to the block's end, and keys and values depend on nothing else (the
//! kernels being batch invariant, a cached block holds the very bits the sequence would have
//! computed). A new sequence takes, with an extra reference each, the registered blocks of
//! the longest run of its leading full blocks and starts computing after them.
//!
//! The cache holds a reference of its own on every registered block, so a block outlives
//! the sequences that computed it. A block whose only owner is the cache is *evictable*:
//! when the pool runs short the scheduler evicts the least recently used ones (ties: the
//! deepest first). An evicted block takes its cached descendants with it, since their keys
//! name it and it may be reused for other tokens; every owner of a block owning the blocks
//! before it, those descendants are evictable too, and with the order above there are none
//! (a block is used whenever one of its descendants is).

use std::collections::HashMap;

use flm_core::BlockAllocator;

/// The key of a block: the block before it (`u32::MAX` for the first) and its tokens.
type Key = (u32, Vec<u32>);

/// A registered block.
struct Entry {
    key: Key,
    /// Blocks in the chain: 1 for a first block.
    depth: usize,
    /// Registered blocks whose key names this one.
    children: Vec<u32>,
    /// The clock when a lookup or a registration last went through it.
    last_used: u64,
}

/// The registered full blocks (see the module docs).
pub(super) struct PrefixCache {
    block_size: usize,
    blocks: HashMap<Key, u32>,
    entries: HashMap<u32, Entry>,
    clock: u64,
}

impl PrefixCache {
    pub(super) fn new(block_size: usize) -> PrefixCache {
        PrefixCache {
            block_size,
            blocks: HashMap::new(),
            entries: HashMap::new(),
            clock: 0,
        }
    }

    /// Blocks registered now (in use or evictable).
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Registered blocks owned by the cache alone, which [`PrefixCache::evict`] can free.
    pub(super) fn evictable(&self, alloc: &BlockAllocator) -> usize {
        self.entries
            .keys()
            .filter(|&&b| alloc.ref_count(b) == 1)
            .count()
    }

    /// The registered blocks holding the longest run of `tokens`' leading full blocks, at
    /// most `max_blocks` of them; marks them used now.
    pub(super) fn lookup(&mut self, tokens: &[u32], max_blocks: usize) -> Vec<u32> {
        self.clock += 1;
        let mut found = Vec::new();
        let mut parent = u32::MAX;
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let Some(&b) = self.blocks.get(&(parent, chunk.to_vec())) else {
                break;
            };
            if let Some(e) = self.entries.get_mut(&b) {
                e.last_used = self.clock;
            }
            found.push(b);
            parent = b;
        }
        found
    }

    /// Registers the full blocks of a sequence with block table `table` whose first `cached`
    /// positions of `tokens` are computed, taking a reference on each newly registered block
    /// from `alloc`, and marks them used now. A prefix registered already keeps its block,
    /// and the blocks after one computed twice stay out (no lookup could reach them).
    pub(super) fn register(
        &mut self,
        table: &[u32],
        tokens: &[u32],
        cached: usize,
        alloc: &mut BlockAllocator,
    ) {
        self.clock += 1;
        let full = cached / self.block_size;
        let mut parent = u32::MAX;
        for (depth, (&b, chunk)) in table
            .iter()
            .zip(tokens.chunks_exact(self.block_size))
            .take(full)
            .enumerate()
        {
            if let Some(e) = self.entries.get_mut(&b) {
                e.last_used = self.clock;
            } else {
                let key = (parent, chunk.to_vec());
                // A block of the table is allocated to the sequence: retaining cannot fail.
                if self.blocks.contains_key(&key) || alloc.retain(b).is_err() {
                    return;
                }
                self.blocks.insert(key.clone(), b);
                self.entries.insert(
                    b,
                    Entry {
                        key,
                        depth: depth + 1,
                        children: Vec::new(),
                        last_used: self.clock,
                    },
                );
                if let Some(p) = self.entries.get_mut(&parent) {
                    p.children.push(b);
                }
            }
            parent = b;
        }
    }

    /// Evicts up to `count` evictable blocks, least recently used first (ties: deepest
    /// first), with their descendants, giving the cache's reference back to `alloc`.
    /// Returns the blocks freed.
    pub(super) fn evict(&mut self, count: usize, alloc: &mut BlockAllocator) -> usize {
        let mut candidates: Vec<(u64, std::cmp::Reverse<usize>, u32)> = self
            .entries
            .iter()
            .filter(|(&b, _)| alloc.ref_count(b) == 1)
            .map(|(&b, e)| (e.last_used, std::cmp::Reverse(e.depth), b))
            .collect();
        candidates.sort_unstable();
        let mut freed = 0;
        for (_, _, b) in candidates {
            if freed >= count {
                break;
            }
            freed += self.remove_subtree(b, alloc);
        }
        freed
    }

    /// Unregisters `b` (if still registered) and its descendants and releases the cache's
    /// references; returns the blocks that became free.
    fn remove_subtree(&mut self, b: u32, alloc: &mut BlockAllocator) -> usize {
        let mut freed = 0;
        let mut stack = vec![b];
        while let Some(b) = stack.pop() {
            let Some(entry) = self.entries.remove(&b) else {
                continue;
            };
            self.blocks.remove(&entry.key);
            if let Some(p) = self.entries.get_mut(&entry.key.0) {
                p.children.retain(|&c| c != b);
            }
            stack.extend(entry.children);
            // The cache holds a reference on every registered block: releasing cannot fail.
            let _ = alloc.release(b);
            if alloc.ref_count(b) == 0 {
                freed += 1;
            }
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An allocator of `n` blocks with blocks `0..n` taken, in order.
    fn taken(n: usize) -> BlockAllocator {
        let mut a = BlockAllocator::new(n).unwrap();
        let mut got: Vec<u32> = (0..n).map(|_| a.alloc().unwrap()).collect();
        got.sort();
        assert_eq!(got, (0..n as u32).collect::<Vec<_>>());
        a
    }

    #[test]
    fn chains_of_full_blocks_are_found_and_outlive_their_sequence() {
        let mut a = taken(10);
        let mut cache = PrefixCache::new(2);
        let tokens = [1, 2, 3, 4, 5];
        // Positions 0..4 computed: blocks 7 and 9 are full, block 4 is not.
        cache.register(&[7, 9, 4], &tokens, 5, &mut a);
        assert_eq!((a.ref_count(7), a.ref_count(9), a.ref_count(4)), (2, 2, 1));
        assert_eq!(cache.lookup(&[1, 2, 3, 4, 6, 6], 3), vec![7, 9]);
        assert_eq!(cache.lookup(&[1, 2, 3, 4], 1), vec![7]);
        assert_eq!(cache.lookup(&[1, 2, 9, 4], 3), vec![7]);
        // The same tokens after another first block are another prefix.
        assert_eq!(cache.lookup(&[0, 2, 3, 4], 3), Vec::<u32>::new());
        // A second sequence with the same prefix in other blocks keeps the first's.
        cache.register(&[5, 6], &[1, 2, 3, 4], 4, &mut a);
        assert_eq!((a.ref_count(5), a.ref_count(6)), (1, 1));
        assert_eq!(cache.lookup(&tokens, 2), vec![7, 9]);
        // The sequence ends: its blocks stay, owned by the cache alone.
        for b in [7, 9, 4] {
            a.release(b).unwrap();
        }
        assert_eq!(cache.evictable(&a), 2);
        assert_eq!(cache.lookup(&tokens, 2), vec![7, 9]);
        assert_eq!(cache.evict(1, &mut a), 1);
        assert_eq!(
            a.ref_count(9),
            0,
            "the deeper of two blocks used together goes first"
        );
        assert_eq!(cache.lookup(&tokens, 2), vec![7]);
        assert_eq!(cache.evict(5, &mut a), 1);
        assert!(cache.lookup(&tokens, 2).is_empty());
        assert_eq!(cache.len(), 0);
        assert!(cache.blocks.is_empty());
    }

    #[test]
    fn eviction_takes_the_least_recently_used_and_spares_blocks_in_use() {
        let mut a = taken(6);
        let mut cache = PrefixCache::new(1);
        cache.register(&[0, 1], &[10, 11], 2, &mut a);
        cache.register(&[2, 3], &[20, 21], 2, &mut a);
        cache.register(&[4], &[30], 1, &mut a);
        for b in 0..5 {
            a.release(b).unwrap();
        }
        // Block 5 stands for a running sequence that took the prefix [30].
        a.retain(4).unwrap();
        assert_eq!(cache.lookup(&[10, 11], 2), vec![0, 1]);
        assert_eq!(cache.evictable(&a), 4);
        // [20, 21] is the oldest: its deeper block first, then its first.
        assert_eq!(cache.evict(2, &mut a), 2);
        assert_eq!(a.ref_count(3) + a.ref_count(2), 0);
        assert_eq!(cache.evict(10, &mut a), 2);
        assert_eq!(cache.len(), 1, "block 4 is in use");
        assert_eq!(cache.lookup(&[30], 1), vec![4]);
    }

    #[test]
    fn evicting_a_block_takes_its_descendants() {
        let mut a = taken(3);
        let mut cache = PrefixCache::new(1);
        cache.register(&[0, 1, 2], &[5, 6, 7], 3, &mut a);
        for b in 0..3 {
            a.release(b).unwrap();
        }
        assert_eq!(cache.remove_subtree(1, &mut a), 2);
        assert_eq!(cache.lookup(&[5, 6, 7], 3), vec![0]);
        assert_eq!(cache.len(), 1);
        assert!(cache.entries[&0].children.is_empty());
    }
}
