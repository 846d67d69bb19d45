//! The hash map of the encoders' hot lookups (merge pairs, token bytes).
//!
//! std's `HashMap` hashes with SipHash-1-3, built to resist chosen keys; the keys here are
//! a fixed vocabulary's ids and pieces, and SipHash was a sixth of byte-level BPE's encode
//! time. rustc's FxHash takes one multiply per word. A text can still collide only as much
//! as the vocabulary's own keys do, since the text never becomes a key.

/// A `HashMap` hashed with rustc's FxHash (`rustc-hash`).
pub(crate) type FastMap<K, V> = rustc_hash::FxHashMap<K, V>;

/// The key of the pair of ids (`left`, `right`).
pub(crate) fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}
