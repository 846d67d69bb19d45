//! `--device` and `--gpu-layers`, shared by every command that computes.

use anyhow::{ensure, Result};
use clap::Args;
use flm_core::Executor;
use flm_devices::DeviceChoice;

/// Where the model runs.
#[derive(Args, Clone, Copy, Default)]
pub struct DeviceArgs {
    /// cpu, cuda or auto: auto uses a CUDA GPU when this build has the `cuda` feature and
    /// one is usable, otherwise the CPU (saying why in one line); cuda without a usable GPU
    /// is an error.
    #[arg(long, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Layers to place on the GPU when the model does not fit (the rest on the CPU). Not
    /// implemented yet: with a GPU every op it supports runs there.
    #[arg(long)]
    pub gpu_layers: Option<usize>,
}

/// The executor, and the GPU's peak memory bandwidth in bytes/s when one runs the model.
pub struct Chosen {
    /// The devices in priority order.
    pub exec: Executor,
    /// From the GPU's attributes; `None` on the CPU.
    pub gpu_peak_bandwidth: Option<f64>,
    /// "cuda" or "cpu": the device the model's ops go to first.
    pub first: &'static str,
}

impl DeviceArgs {
    /// Builds the executor; a fallback to the CPU prints its one line on stderr.
    ///
    /// Errors: `--device cuda` without a usable GPU; `--gpu-layers` with a GPU (not
    /// implemented); the CPU device's errors.
    pub fn executor(&self) -> Result<Chosen> {
        let selection = flm_devices::select(self.device)?;
        if let Some(notice) = &selection.notice {
            eprintln!("{notice}");
        }
        let first = selection.devices[0].name();
        ensure!(
            self.gpu_layers.is_none() || first != "cuda",
            "--gpu-layers: splitting the layers between the GPU and the CPU is not \
             implemented yet; leave it out to run every op the GPU supports there"
        );
        Ok(Chosen {
            exec: Executor::new(selection.devices),
            gpu_peak_bandwidth: selection.gpu_peak_bandwidth,
            first,
        })
    }
}
