//! The preallocated key/value cache.

use crate::{Data, DataType, Result};

/// Keys and values of every layer for positions `0..max_seq`, allocated once (llama2.c's
/// `key_cache` / `value_cache`): f32 `[max_seq, kv_dim]` per layer and per K/V, where
/// `kv_dim = n_kv_heads * head_dim`.
pub struct KvCache {
    layers: Vec<(Data, Data)>,
    max_seq: usize,
}

impl KvCache {
    /// Allocates `n_layers` pairs of zeroed `[max_seq, kv_dim]` f32 tensors.
    ///
    /// Errors: [`crate::Error::Shape`] if the size overflows.
    pub fn new(n_layers: usize, max_seq: usize, kv_dim: usize) -> Result<KvCache> {
        let layers = (0..n_layers)
            .map(|_| {
                Ok((
                    Data::zeros(DataType::F32, &[max_seq, kv_dim])?,
                    Data::zeros(DataType::F32, &[max_seq, kv_dim])?,
                ))
            })
            .collect::<Result<_>>()?;
        Ok(KvCache { layers, max_seq })
    }

    /// Positions the cache holds (the context length).
    pub fn max_seq(&self) -> usize {
        self.max_seq
    }

    /// The `(keys, values)` of layer `layer`. Panics if `layer` is out of range, which is a
    /// programming error of the model graph, not an input error.
    pub fn layer_mut(&mut self, layer: usize) -> (&mut Data, &mut Data) {
        let (k, v) = &mut self.layers[layer];
        (k, v)
    }
}
