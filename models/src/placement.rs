//! [`Placement`]: which memory each layer of a model runs in.
//!
//! A layer's weights, its KV cache and the activations it computes live in one memory (the
//! host's, or a device's such as `cuda:0`), and its ops run on the device there. The token
//! embedding goes with the first layer, the final norm and the classifier with the last.
//! Where two consecutive layers are in different memories, the residual stream is copied
//! once per step at that boundary ([`flm_core::Executor::copy_into`], recorded as
//! `"layer boundary: activations"`); nothing else crosses. This is llama.cpp's
//! `--n-gpu-layers` and FastLLM's device map.
//!
//! The routed experts of a mixture-of-experts layer may be kept apart, in host memory
//! ([`Placement::with_experts_on`], `--moe-device cpu`, FastLLM's MoE device): the rest of
//! the layer runs on its device, and the experts' op ([`flm_core::Op::MoeFfn`]) on the CPU,
//! its input and output copied across once per layer and step (`"experts: activations"`).

use std::fmt;
use std::str::FromStr;

use flm_core::Location;

use crate::{Error, Result};

/// How many of a model's first layers live on a GPU (`--gpu-layers`, libflm's
/// `gpu_layers`); the default wherever a GPU runs a Llama-graph model is [`GpuLayers::Auto`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuLayers {
    /// As many as the GPU's free memory holds ([`Placement::fit`]).
    Auto,
    /// This many (all of them when it is the layer count or more; 0 leaves every layer in
    /// host memory, the GPU running their ops one at a time from there).
    Count(usize),
}

impl FromStr for GpuLayers {
    type Err = String;

    /// "auto" or a layer count.
    fn from_str(s: &str) -> std::result::Result<GpuLayers, String> {
        match s {
            "auto" => Ok(GpuLayers::Auto),
            n => n
                .parse()
                .map(GpuLayers::Count)
                .map_err(|_| format!("{n:?} is neither a layer count nor auto")),
        }
    }
}

impl fmt::Display for GpuLayers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuLayers::Auto => f.write_str("auto"),
            GpuLayers::Count(n) => write!(f, "{n}"),
        }
    }
}

/// The memory of each layer of a model, first to last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    layers: Vec<Location>,
    /// The memory of every layer's routed experts, when not their layer's.
    experts: Option<Location>,
}

impl Placement {
    /// Every one of `n_layers` layers in host memory (the CPU).
    pub fn host(n_layers: usize) -> Placement {
        Placement {
            layers: vec![Location::Host; n_layers],
            experts: None,
        }
    }

    /// The first `on_device` of `n_layers` layers on `device` and the rest in host memory
    /// (`--gpu-layers N`). `on_device` beyond `n_layers` places them all on the device.
    pub fn first_layers(n_layers: usize, device: Location, on_device: usize) -> Placement {
        let on_device = on_device.min(n_layers);
        let mut layers = vec![device; on_device];
        layers.resize(n_layers, Location::Host);
        Placement {
            layers,
            experts: None,
        }
    }

    /// This placement with every layer's routed experts (router and expert matrices) in
    /// the memory `at` instead of their layer's.
    pub fn with_experts_on(self, at: Location) -> Placement {
        Placement {
            experts: Some(at),
            ..self
        }
    }

    /// The memory of layer `l`'s routed experts: `with_experts_on`'s, else the layer's.
    pub fn experts(&self, l: usize) -> Location {
        self.experts.unwrap_or_else(|| self.layer(l))
    }

    /// The most of the first layers that fit in `free` bytes of `device` memory (`--gpu-layers
    /// auto`): layer `l` needs `layer_bytes[l]` (its weights and KV cache), and whatever is
    /// on the device needs `input_bytes` more (the embedding table and the activations); the
    /// last layer brings the head there too, `output_bytes` (final norm, classifier,
    /// logits), so it is placed only when that fits as well.
    pub fn fit(
        device: Location,
        free: u64,
        layer_bytes: &[u64],
        input_bytes: u64,
        output_bytes: u64,
    ) -> Placement {
        let n_layers = layer_bytes.len();
        let mut used = input_bytes;
        let mut fits = 0;
        for (l, &bytes) in layer_bytes.iter().enumerate() {
            let head = if l + 1 == n_layers { output_bytes } else { 0 };
            used = used.saturating_add(bytes);
            if used.saturating_add(head) > free {
                break;
            }
            fits = l + 1;
        }
        Placement::first_layers(n_layers, device, fits)
    }

    /// Layers placed.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// The memory of each layer, first to last.
    pub fn layers(&self) -> &[Location] {
        &self.layers
    }

    /// The memory of layer `l` (the host's past the last layer).
    pub fn layer(&self, l: usize) -> Location {
        self.layers.get(l).copied().unwrap_or(Location::Host)
    }

    /// The memory of the token embedding: the first layer's.
    pub fn input(&self) -> Location {
        self.layer(0)
    }

    /// The memory of the final norm, the classifier and the logits: the last layer's.
    pub fn output(&self) -> Location {
        self.layers.last().copied().unwrap_or(Location::Host)
    }

    /// The distinct memories, in the order of the layers.
    pub fn locations(&self) -> Vec<Location> {
        let mut out: Vec<Location> = Vec::new();
        for &l in &self.layers {
            if !out.contains(&l) {
                out.push(l);
            }
        }
        if out.is_empty() {
            out.push(Location::Host);
        }
        out
    }

    /// Whether every layer (and its experts) is in host memory.
    pub fn is_host(&self) -> bool {
        self.layers.iter().all(|&l| l == Location::Host)
            && self.experts.is_none_or(|e| e == Location::Host)
    }

    /// Boundaries between consecutive layers in different memories.
    pub fn boundaries(&self) -> usize {
        self.layers.windows(2).filter(|w| w[0] != w[1]).count()
    }

    /// `Ok` when this placement is for a model of `n_layers` layers.
    ///
    /// Errors: [`Error::Config`] otherwise.
    pub(crate) fn check(&self, n_layers: usize) -> Result<()> {
        if self.layers.len() == n_layers {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "a placement of {} layers for a model of {n_layers}",
                self.layers.len()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: Location = Location::Device {
        name: "cuda",
        ordinal: 0,
    };

    #[test]
    fn first_layers_split_the_model_once() {
        let p = Placement::first_layers(5, GPU, 2);
        assert_eq!(
            (0..5).map(|l| p.layer(l)).collect::<Vec<_>>(),
            [GPU, GPU, Location::Host, Location::Host, Location::Host]
        );
        assert_eq!((p.input(), p.output()), (GPU, Location::Host));
        assert_eq!(p.locations(), [GPU, Location::Host]);
        assert_eq!(p.boundaries(), 1);
        let all = Placement::first_layers(5, GPU, 99);
        assert_eq!(
            (all.output(), all.boundaries(), all.locations()),
            (GPU, 0, vec![GPU])
        );
        assert!(Placement::first_layers(5, GPU, 0).is_host());
        assert!(Placement::host(3).check(4).is_err());
    }

    #[test]
    fn auto_fits_whole_layers_after_the_input_and_the_head_last() {
        let layers = [100, 100, 100];
        let fit = |free| Placement::fit(GPU, free, &layers, 50, 30).boundaries();
        assert!(Placement::fit(GPU, 149, &layers, 50, 30).is_host());
        let two = Placement::fit(GPU, 250, &layers, 50, 30);
        assert_eq!((two.layer(1), two.layer(2)), (GPU, Location::Host));
        // The third layer fits (350) but not with the head (380).
        assert_eq!(fit(379), 1);
        let all = Placement::fit(GPU, 380, &layers, 50, 30);
        assert_eq!((all.output(), all.boundaries()), (GPU, 0));
    }
}
