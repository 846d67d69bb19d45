//! Byte-level trie over token pieces.
//!
//! SentencePiece keeps its pieces in a hash map (`pieces_`, `reserved_id_map_` in
//! model_interface.cc) and its user-defined symbols in a Darts double-array trie
//! (`PrefixMatcher` in normalizer.cc). One structure serves both here: exact lookup of a
//! byte string and the longest entry that is a prefix of a text. Both cost O(key length)
//! and stop as soon as no entry can match, so looking up a long concatenation never costs
//! more than the longest piece.
//!
//! The trie is built once and then frozen into flat arrays: every node owns a contiguous,
//! sorted run of edge labels, searched by binary search, except the root, whose children
//! (every first byte of a vocabulary, a few hundred labels) sit in a table indexed by the
//! byte, since every lookup starts there.

/// Marks a node that ends no key.
const NO_VALUE: u32 = u32::MAX;

/// A frozen byte trie mapping byte strings to `u32` values.
#[derive(Debug, Clone)]
pub(crate) struct Trie {
    nodes: Vec<Node>,
    /// The root's child along each byte, or `NO_VALUE`.
    root: Box<[u32; 256]>,
    labels: Vec<u8>,
    targets: Vec<u32>,
}

#[derive(Debug, Clone, Copy)]
struct Node {
    /// Index of the first edge in `labels`/`targets`.
    first: u32,
    /// Number of edges (at most 256).
    count: u16,
    /// The value of the key ending here, or `NO_VALUE`.
    value: u32,
}

/// Collects keys before freezing them into a [`Trie`].
#[derive(Debug)]
pub(crate) struct TrieBuilder {
    /// Per node: its edges (label, child node) and its value.
    nodes: Vec<(Vec<(u8, u32)>, u32)>,
}

impl TrieBuilder {
    pub(crate) fn new() -> Self {
        TrieBuilder {
            nodes: vec![(Vec::new(), NO_VALUE)],
        }
    }

    /// Inserts `key -> value`. If the key is already present, keeps the first value and
    /// returns it, so the caller can report the duplicate.
    pub(crate) fn insert(&mut self, key: &[u8], value: u32) -> Option<u32> {
        let mut node = 0usize;
        for &b in key {
            let edges = &self.nodes[node].0;
            node = match edges.iter().find(|(l, _)| *l == b) {
                Some(&(_, child)) => child as usize,
                None => {
                    let child = self.nodes.len();
                    self.nodes.push((Vec::new(), NO_VALUE));
                    self.nodes[node].0.push((b, child as u32));
                    child
                }
            };
        }
        let slot = &mut self.nodes[node].1;
        if *slot != NO_VALUE {
            return Some(*slot);
        }
        *slot = value;
        None
    }

    pub(crate) fn build(self) -> Trie {
        let mut nodes = Vec::with_capacity(self.nodes.len());
        let mut labels = Vec::with_capacity(self.nodes.len());
        let mut targets = Vec::with_capacity(self.nodes.len());
        for (mut edges, value) in self.nodes {
            edges.sort_unstable_by_key(|&(l, _)| l);
            nodes.push(Node {
                first: labels.len() as u32,
                count: edges.len() as u16,
                value,
            });
            for (l, t) in edges {
                labels.push(l);
                targets.push(t);
            }
        }
        let mut root = Box::new([NO_VALUE; 256]);
        let first = nodes[0].first as usize;
        for i in first..first + nodes[0].count as usize {
            root[labels[i] as usize] = targets[i];
        }
        Trie {
            nodes,
            root,
            labels,
            targets,
        }
    }
}

impl Trie {
    /// The child of `node` along byte `b`.
    fn child(&self, node: u32, b: u8) -> Option<u32> {
        if node == 0 {
            let c = self.root[b as usize];
            return (c != NO_VALUE).then_some(c);
        }
        let n = self.nodes[node as usize];
        let start = n.first as usize;
        let end = start + n.count as usize;
        let i = self.labels[start..end].binary_search(&b).ok()?;
        Some(self.targets[start + i])
    }

    /// The value stored for exactly `key`.
    pub(crate) fn get(&self, key: &[u8]) -> Option<u32> {
        let mut node = 0u32;
        for &b in key {
            node = self.child(node, b)?;
        }
        let v = self.nodes[node as usize].value;
        (v != NO_VALUE).then_some(v)
    }

    /// The longest key that is a prefix of `text`, as (its length, its value).
    pub(crate) fn longest_prefix(&self, text: &[u8]) -> Option<(usize, u32)> {
        let mut node = 0u32;
        let mut best = None;
        for (i, &b) in text.iter().enumerate() {
            match self.child(node, b) {
                Some(c) => node = c,
                None => break,
            }
            let v = self.nodes[node as usize].value;
            if v != NO_VALUE {
                best = Some((i + 1, v));
            }
        }
        best
    }

    /// Whether the trie holds no key at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.nodes.len() == 1 && self.nodes[0].value == NO_VALUE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trie(keys: &[&str]) -> Trie {
        let mut b = TrieBuilder::new();
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(b.insert(k.as_bytes(), i as u32), None);
        }
        b.build()
    }

    #[test]
    fn exact_lookup() {
        let t = trie(&["a", "ab", "abc", "b", "▁the"]);
        assert_eq!(t.get(b"a"), Some(0));
        assert_eq!(t.get(b"ab"), Some(1));
        assert_eq!(t.get(b"abc"), Some(2));
        assert_eq!(t.get(b"b"), Some(3));
        assert_eq!(t.get("▁the".as_bytes()), Some(4));
        assert_eq!(t.get(b""), None);
        assert_eq!(t.get(b"abcd"), None);
        assert_eq!(t.get(b"c"), None);
        assert!(!t.is_empty());
        assert!(trie(&[]).is_empty());
    }

    #[test]
    fn longest_prefix_match() {
        let t = trie(&["<s>", "<s>x", "<", "ab"]);
        assert_eq!(t.longest_prefix(b"<s>xyz"), Some((4, 1)));
        assert_eq!(t.longest_prefix(b"<s>"), Some((3, 0)));
        assert_eq!(t.longest_prefix(b"<t"), Some((1, 2)));
        assert_eq!(t.longest_prefix(b"a"), None);
        assert_eq!(t.longest_prefix(b""), None);
    }

    #[test]
    fn duplicate_keeps_first() {
        let mut b = TrieBuilder::new();
        assert_eq!(b.insert(b"x", 7), None);
        assert_eq!(b.insert(b"x", 9), Some(7));
        assert_eq!(b.build().get(b"x"), Some(7));
    }

    #[test]
    fn all_byte_labels() {
        let keys: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b, b]).collect();
        let mut b = TrieBuilder::new();
        for (i, k) in keys.iter().enumerate() {
            b.insert(k, i as u32);
        }
        let t = b.build();
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(t.get(k), Some(i as u32));
        }
    }
}
