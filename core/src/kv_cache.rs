//! The preallocated key/value cache, and the element type of KV caches ([`KvDtype`]).
//!
//! A cache holds f32 or f16 keys and values. With f16 (llama.cpp's default `--cache-type-k
//! f16`, vLLM's `kv_cache_dtype="auto"` for f16 models) attention reads half the bytes; the
//! keys and values are computed in f32 and rounded to the nearest f16 (ties to even) as
//! they are written, and widened exactly when attention reads them.

use std::fmt;
use std::str::FromStr;

use crate::{Data, DataType, Error, Executor, Location, Result};

/// `--kv-dtype`: the element type of a model's KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    /// f16 where the cache lives in a device's memory, [`KvDtype::HOST_DEFAULT`] in host
    /// memory.
    #[default]
    Auto,
    /// f32: the keys and values exactly as computed.
    F32,
    /// f16: half the bytes, each value rounded to the nearest f16.
    F16,
}

impl KvDtype {
    /// The element type [`KvDtype::Auto`] chooses for a cache in host memory (the CPU): f32,
    /// which keeps the values exact (f16's gain there was measured only on a loaded machine:
    /// docs/benchmarks.md, "KV cache dtype on the CPU").
    pub const HOST_DEFAULT: DataType = DataType::F32;

    /// The element type of a cache in the memory `at`: `F32` or `F16`.
    pub fn dtype_at(self, at: Location) -> DataType {
        match at {
            Location::Host => self.on_host(),
            Location::Device { .. } => self.on_device(),
        }
    }

    /// The element type of a cache in host memory.
    pub fn on_host(self) -> DataType {
        match self {
            KvDtype::F32 => DataType::F32,
            KvDtype::F16 => DataType::F16,
            KvDtype::Auto => KvDtype::HOST_DEFAULT,
        }
    }

    /// The element type of a cache in a device's memory.
    pub fn on_device(self) -> DataType {
        match self {
            KvDtype::F32 => DataType::F32,
            KvDtype::F16 | KvDtype::Auto => DataType::F16,
        }
    }
}

impl FromStr for KvDtype {
    type Err = Error;

    /// `auto`, `f32` or `f16`.
    ///
    /// Errors: [`Error::InvalidArgument`] for any other name.
    fn from_str(s: &str) -> Result<KvDtype> {
        match s {
            "auto" => Ok(KvDtype::Auto),
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            other => Err(Error::InvalidArgument(format!(
                "KV cache dtype {other:?}: f32, f16 or auto"
            ))),
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvDtype::Auto => "auto",
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
        })
    }
}

/// Checks that `dtype` is one a KV cache can hold (f32 or f16).
pub(crate) fn check_kv_dtype(op: &'static str, dtype: DataType) -> Result<()> {
    match dtype {
        DataType::F32 | DataType::F16 => Ok(()),
        other => Err(Error::DType {
            op,
            msg: format!("a KV cache holds f32 or f16, not {other}"),
        }),
    }
}

/// The keys and values of every layer, as the contiguous and the paged KV cache hold them:
/// a `(keys, values)` pair of `[rows, k_dim]` and `[rows, v_dim]` tensors per layer, each in
/// its layer's memory.
pub(crate) struct LayerPairs(pub(crate) Vec<(Data, Data)>);

impl LayerPairs {
    /// A pair of `[rows, k_dim]` and `[rows, v_dim]` tensors per location, each made by
    /// `zeros(shape, location)`.
    pub(crate) fn alloc(
        locations: &[Location],
        (rows, (k_dim, v_dim)): (usize, (usize, usize)),
        zeros: &dyn Fn(&[usize], Location) -> Result<Data>,
    ) -> Result<LayerPairs> {
        let pairs = locations
            .iter()
            .map(|&at| Ok((zeros(&[rows, k_dim], at)?, zeros(&[rows, v_dim], at)?)))
            .collect::<Result<_>>()?;
        Ok(LayerPairs(pairs))
    }

    /// The `(keys, values)` of layer `layer`. Panics if `layer` is out of range, which is a
    /// programming error of the model graph, not an input error.
    pub(crate) fn layer_mut(&mut self, layer: usize) -> (&mut Data, &mut Data) {
        let (k, v) = &mut self.0[layer];
        (k, v)
    }
}

/// Keys and values of every layer for positions `0..max_seq`, allocated once (llama2.c's
/// `key_cache` / `value_cache`): f32 or f16 `[max_seq, k_dim]` and `[max_seq, v_dim]` per
/// layer, where both are `n_kv_heads * head_dim` (with multi-head latent attention, the
/// latent's and the rotated key's widths).
pub struct KvCache {
    layers: LayerPairs,
    max_seq: usize,
}

impl KvCache {
    /// Allocates `n_layers` pairs of zeroed `[max_seq, k_dim]` and `[max_seq, v_dim]`
    /// tensors of `dtype` in host memory (`widths = (k_dim, v_dim)`).
    ///
    /// Errors: [`crate::Error::Shape`] if the size overflows; [`crate::Error::DType`]
    /// unless `dtype` is f32 or f16.
    pub fn new(
        n_layers: usize,
        max_seq: usize,
        widths: (usize, usize),
        dtype: DataType,
    ) -> Result<KvCache> {
        check_kv_dtype("KvCache::new", dtype)?;
        let host = vec![Location::Host; n_layers];
        let layers = LayerPairs::alloc(&host, (max_seq, widths), &|shape, _| {
            Data::zeros(dtype, shape)
        })?;
        Ok(KvCache { layers, max_seq })
    }

    /// As [`KvCache::new`], with layer `l`'s pair allocated by `exec` in the memory of
    /// `locations[l]` (one layer per location), of the element type `dtype` chooses there.
    ///
    /// Errors: [`crate::Error::Shape`] if the size overflows; the allocation's errors.
    pub fn placed(
        exec: &Executor,
        locations: &[Location],
        max_seq: usize,
        widths: (usize, usize),
        dtype: KvDtype,
    ) -> Result<KvCache> {
        let layers = LayerPairs::alloc(locations, (max_seq, widths), &|shape, at| {
            exec.zeros(dtype.dtype_at(at), shape, at)
        })?;
        Ok(KvCache { layers, max_seq })
    }

    /// Moves every layer's pair to the memory of `locations[l]` with `exec`, recorded
    /// under `reason` (a layer already there stays as it is), keeping its element type.
    ///
    /// Errors: [`crate::Error::Shape`] unless there is one location per layer; those of
    /// [`Executor::to_device`].
    pub fn place(
        self,
        exec: &Executor,
        locations: &[Location],
        reason: &'static str,
    ) -> Result<KvCache> {
        if locations.len() != self.layers.0.len() {
            return Err(crate::Error::Shape {
                op: "KvCache::place",
                msg: format!(
                    "{} locations for {} layers",
                    locations.len(),
                    self.layers.0.len()
                ),
            });
        }
        let layers = self
            .layers
            .0
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
            layers: LayerPairs(layers),
            max_seq: self.max_seq,
        })
    }

    /// Positions the cache holds (the context length).
    pub fn max_seq(&self) -> usize {
        self.max_seq
    }

    /// The element type of each layer's keys and values, first layer to last.
    pub fn dtypes(&self) -> Vec<DataType> {
        self.layers.0.iter().map(|(k, _)| k.dtype()).collect()
    }

    /// The `(keys, values)` of layer `layer`. Panics if `layer` is out of range, which is a
    /// programming error of the model graph, not an input error.
    pub fn layer_mut(&mut self, layer: usize) -> (&mut Data, &mut Data) {
        self.layers.layer_mut(layer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_dtype_names_and_defaults() {
        for (name, kv) in [
            ("auto", KvDtype::Auto),
            ("f32", KvDtype::F32),
            ("f16", KvDtype::F16),
        ] {
            assert_eq!(name.parse::<KvDtype>().unwrap(), kv);
            assert_eq!(kv.to_string(), name);
        }
        let err = "bf16".parse::<KvDtype>().unwrap_err().to_string();
        assert!(err.contains("f32, f16 or auto"), "{err}");
        let gpu = Location::Device {
            name: "cuda",
            ordinal: 0,
        };
        assert_eq!(KvDtype::Auto.dtype_at(gpu), DataType::F16);
        assert_eq!(
            KvDtype::Auto.dtype_at(Location::Host),
            KvDtype::HOST_DEFAULT
        );
        assert_eq!(KvDtype::F32.dtype_at(gpu), DataType::F32);
        assert_eq!(KvDtype::F16.dtype_at(Location::Host), DataType::F16);
        let kv = KvCache::new(2, 3, (4, 4), DataType::F16).unwrap();
        assert_eq!(kv.layers.0[1].0.dtype(), DataType::F16);
        assert!(KvCache::new(1, 3, (4, 4), DataType::BF16).is_err());
    }
}
