//! The preallocated key/value cache.

use crate::{Data, DataType, Executor, Location, Result};

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

    /// As [`KvCache::new`], with layer `l`'s pair allocated by `exec` in the memory of
    /// `locations[l]` (one layer per location).
    ///
    /// Errors: [`crate::Error::Shape`] if the size overflows; the allocation's errors.
    pub fn placed(
        exec: &Executor,
        locations: &[Location],
        max_seq: usize,
        kv_dim: usize,
    ) -> Result<KvCache> {
        let layers = locations
            .iter()
            .map(|&at| {
                Ok((
                    exec.zeros(DataType::F32, &[max_seq, kv_dim], at)?,
                    exec.zeros(DataType::F32, &[max_seq, kv_dim], at)?,
                ))
            })
            .collect::<Result<_>>()?;
        Ok(KvCache { layers, max_seq })
    }

    /// Moves every layer's pair to the memory of `locations[l]` with `exec`, recorded
    /// under `reason` (a layer already there stays as it is).
    ///
    /// Errors: [`crate::Error::Shape`] unless there is one location per layer; those of
    /// [`Executor::to_device`].
    pub fn place(
        self,
        exec: &Executor,
        locations: &[Location],
        reason: &'static str,
    ) -> Result<KvCache> {
        if locations.len() != self.layers.len() {
            return Err(crate::Error::Shape {
                op: "KvCache::place",
                msg: format!(
                    "{} locations for {} layers",
                    locations.len(),
                    self.layers.len()
                ),
            });
        }
        let layers = self
            .layers
            .into_iter()
            .zip(locations)
            .map(|((k, v), &at)| {
                let moved = |d: Data| -> Result<Data> {
                    if d.location() == at {
                        Ok(d)
                    } else {
                        exec.to_device(&d, at, reason)
                    }
                };
                Ok((moved(k)?, moved(v)?))
            })
            .collect::<Result<_>>()?;
        Ok(KvCache {
            layers,
            max_seq: self.max_seq,
        })
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
