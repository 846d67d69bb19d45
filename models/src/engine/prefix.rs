//! Sharing the KV blocks of a common prompt prefix between running sequences (vLLM's
//! automatic prefix caching, restricted to blocks alive in some running sequence).
//!
//! A block whose `block_size` positions are all computed is registered under its *key*: the
//! block before it in the sequence's table (or none for the first) and its tokens. Since the
//! block before it is identified the same way, a key names the whole token prefix up to the
//! block's end, and keys and values depend on nothing else (the kernels being batch
//! invariant, a shared block holds the very bits the sequence would have computed). A new
//! sequence takes, with an extra reference each, the registered blocks of the longest run of
//! its leading full blocks and starts computing after them. A block leaves the table when
//! its last owner frees it; blocks after it in a chain are always freed with or before it,
//! as every owner of a block owns the blocks before it.

use std::collections::HashMap;

/// The key of a block: the block before it (`u32::MAX` for the first) and its tokens.
type Key = (u32, Vec<u32>);

/// The registered full blocks (see the module docs).
pub(super) struct PrefixCache {
    block_size: usize,
    blocks: HashMap<Key, u32>,
    keys: HashMap<u32, Key>,
}

impl PrefixCache {
    pub(super) fn new(block_size: usize) -> PrefixCache {
        PrefixCache {
            block_size,
            blocks: HashMap::new(),
            keys: HashMap::new(),
        }
    }

    /// The registered blocks holding the longest run of `tokens`' leading full blocks, at
    /// most `max_blocks` of them.
    pub(super) fn lookup(&self, tokens: &[u32], max_blocks: usize) -> Vec<u32> {
        let mut found = Vec::new();
        let mut parent = u32::MAX;
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            match self.blocks.get(&(parent, chunk.to_vec())) {
                Some(&b) => {
                    found.push(b);
                    parent = b;
                }
                None => break,
            }
        }
        found
    }

    /// Registers the full blocks of a sequence with block table `table` whose first `cached`
    /// positions of `tokens` are computed. A prefix registered already keeps its block, and
    /// the blocks after one computed twice stay out (no lookup could reach them).
    pub(super) fn register(&mut self, table: &[u32], tokens: &[u32], cached: usize) {
        let full = cached / self.block_size;
        let mut parent = u32::MAX;
        for (&b, chunk) in table
            .iter()
            .zip(tokens.chunks_exact(self.block_size))
            .take(full)
        {
            if !self.keys.contains_key(&b) {
                let key = (parent, chunk.to_vec());
                if self.blocks.contains_key(&key) {
                    return;
                }
                self.blocks.insert(key.clone(), b);
                self.keys.insert(b, key);
            }
            parent = b;
        }
    }

    /// Forgets block `b`, freed by its last owner.
    pub(super) fn forget(&mut self, b: u32) {
        if let Some(key) = self.keys.remove(&b) {
            self.blocks.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_of_full_blocks_are_found_and_forgotten() {
        let mut cache = PrefixCache::new(2);
        let tokens = [1, 2, 3, 4, 5];
        // Positions 0..4 computed: blocks 7 and 9 are full, block 4 is not.
        cache.register(&[7, 9, 4], &tokens, 5);
        assert_eq!(cache.lookup(&[1, 2, 3, 4, 6, 6], 3), vec![7, 9]);
        assert_eq!(cache.lookup(&[1, 2, 3, 4], 1), vec![7]);
        assert_eq!(cache.lookup(&[1, 2, 9, 4], 3), vec![7]);
        // The same tokens after another first block are another prefix.
        assert_eq!(cache.lookup(&[0, 2, 3, 4], 3), Vec::<u32>::new());
        // A second sequence with the same prefix in other blocks keeps the first's.
        cache.register(&[5, 6], &[1, 2, 3, 4], 4);
        assert_eq!(cache.lookup(&tokens, 2), vec![7, 9]);
        cache.forget(9);
        assert_eq!(cache.lookup(&tokens, 2), vec![7]);
        cache.forget(7);
        assert!(cache.lookup(&tokens, 2).is_empty());
        assert!(cache.blocks.is_empty() && cache.keys.is_empty());
    }
}
