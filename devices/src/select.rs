//! Choosing the devices an [`flm_core::Executor`] runs on: `--device cpu|cuda|auto`.
//!
//! - `cpu`: the CPU device only.
//! - `auto` (the default): the CUDA device first when this build has the `cuda` feature
//!   and a usable GPU is present, then the CPU (which runs whatever the GPU does not);
//!   otherwise the CPU: silently in a build without the feature (the user asked for
//!   nothing), with one line saying why when a GPU was possible but is not usable
//!   (`flm: no CUDA GPU (libcuda.so not found); using the CPU`).
//! - `cuda`: as `auto`, but no usable GPU is an error: a benchmark or a script that asks
//!   for the GPU must not silently measure the CPU.

use std::fmt;
use std::str::FromStr;

use flm_core::{BaseDevice, Error, Result};

use crate::CpuDevice;

/// The `--device` choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// The GPU when there is a usable one, else the CPU.
    #[default]
    Auto,
    /// The CPU only.
    Cpu,
    /// The GPU; an error without one.
    Cuda,
}

impl FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<DeviceChoice, String> {
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda),
            other => Err(format!("unknown device {other:?} (cpu, cuda or auto)")),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceChoice::Auto => "auto",
            DeviceChoice::Cpu => "cpu",
            DeviceChoice::Cuda => "cuda",
        })
    }
}

/// The devices chosen, highest priority first, and what to tell the user.
pub struct Selection {
    /// For [`flm_core::Executor::new`]: the CUDA device (if any), then the CPU.
    pub devices: Vec<Box<dyn BaseDevice>>,
    /// The one line to print on stderr when `auto` fell back to the CPU from a GPU this
    /// build could have used.
    pub notice: Option<String>,
    /// Peak memory bandwidth of the GPU in bytes/s, when one was chosen and its driver
    /// reports it (for `flm bench`).
    pub gpu_peak_bandwidth: Option<f64>,
}

/// Why no GPU is used.
enum NoGpu {
    /// This build has no GPU device: `auto` says nothing, since nothing was possible.
    #[cfg_attr(feature = "cuda", allow(dead_code))] // built without the cuda feature only
    NotBuilt,
    /// The build has one but this machine cannot use it, for this reason.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))] // built by the cuda probe only
    Unusable(String),
}

impl fmt::Display for NoGpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoGpu::NotBuilt => f.write_str("this flm was built without the `cuda` feature"),
            NoGpu::Unusable(why) => f.write_str(why),
        }
    }
}

/// The GPU probe's answer: the CUDA device and its peak bandwidth, or why there is none.
type Probe = std::result::Result<(Box<dyn BaseDevice>, Option<f64>), NoGpu>;

/// Why this process cannot use a GPU, or `Ok` with the CUDA device.
#[cfg(feature = "cuda")]
fn gpu() -> Probe {
    if std::env::var_os("FLM_CUDA_DISABLE").is_some_and(|v| v == "1") {
        return Err(NoGpu::Unusable("FLM_CUDA_DISABLE=1".into()));
    }
    let device = crate::cuda::CudaDevice::new(0).map_err(NoGpu::Unusable)?;
    let bandwidth = device.info().peak_bandwidth;
    Ok((Box::new(device), bandwidth))
}

#[cfg(not(feature = "cuda"))]
fn gpu() -> Probe {
    Err(NoGpu::NotBuilt)
}

/// The devices for `choice`, with `cpu` as the CPU device.
///
/// Errors: [`Error::InvalidArgument`] for [`DeviceChoice::Cuda`] without a usable GPU
/// (the message says why).
pub fn select(choice: DeviceChoice, cpu: CpuDevice) -> Result<Selection> {
    select_from(choice, cpu, gpu)
}

/// [`select`] with the GPU probe given (asked only when `choice` is not `Cpu`).
fn select_from(
    choice: DeviceChoice,
    cpu: CpuDevice,
    gpu: impl FnOnce() -> Probe,
) -> Result<Selection> {
    let cpu: Box<dyn BaseDevice> = Box::new(cpu);
    if choice == DeviceChoice::Cpu {
        return Ok(Selection {
            devices: vec![cpu],
            notice: None,
            gpu_peak_bandwidth: None,
        });
    }
    match gpu() {
        Ok((gpu, bandwidth)) => Ok(Selection {
            devices: vec![gpu, cpu],
            notice: None,
            gpu_peak_bandwidth: bandwidth,
        }),
        Err(why) if choice == DeviceChoice::Auto => Ok(Selection {
            devices: vec![cpu],
            notice: match why {
                NoGpu::NotBuilt => None,
                NoGpu::Unusable(why) => Some(format!("flm: no CUDA GPU ({why}); using the CPU")),
            },
            gpu_peak_bandwidth: None,
        }),
        Err(why) => Err(Error::InvalidArgument(format!(
            "--device cuda: no CUDA GPU ({why})"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_choices_and_refuses_others() {
        for c in [DeviceChoice::Auto, DeviceChoice::Cpu, DeviceChoice::Cuda] {
            assert_eq!(c.to_string().parse::<DeviceChoice>(), Ok(c));
        }
        assert!("gpu"
            .parse::<DeviceChoice>()
            .unwrap_err()
            .contains("cpu, cuda or auto"));
    }

    fn names(s: &Selection) -> Vec<&'static str> {
        s.devices.iter().map(|d| d.name()).collect()
    }

    fn cpu() -> CpuDevice {
        CpuDevice::new().unwrap()
    }

    fn no_gpu() -> Probe {
        Err(NoGpu::Unusable("libcuda.so not found".into()))
    }

    #[test]
    fn cpu_never_probes_the_gpu_and_prints_nothing() {
        let s = select_from(DeviceChoice::Cpu, cpu(), || panic!("probed")).unwrap();
        assert_eq!(names(&s), ["cpu"]);
        assert!(s.notice.is_none());
    }

    #[test]
    fn auto_without_a_gpu_uses_the_cpu_with_one_line_saying_why() {
        let s = select_from(DeviceChoice::Auto, cpu(), no_gpu).unwrap();
        assert_eq!(names(&s), ["cpu"]);
        assert_eq!(
            s.notice.as_deref(),
            Some("flm: no CUDA GPU (libcuda.so not found); using the CPU")
        );
    }

    #[test]
    fn auto_in_a_build_without_gpu_support_is_silent() {
        let s = select_from(DeviceChoice::Auto, cpu(), || Err(NoGpu::NotBuilt)).unwrap();
        assert_eq!(names(&s), ["cpu"]);
        assert!(s.notice.is_none());
        let err = select_from(DeviceChoice::Cuda, cpu(), || Err(NoGpu::NotBuilt))
            .err()
            .unwrap();
        assert_eq!(
            err.to_string(),
            "invalid argument: --device cuda: no CUDA GPU (this flm was built without the `cuda` feature)"
        );
    }

    #[test]
    fn cuda_without_a_gpu_is_an_error_saying_why() {
        let err = select_from(DeviceChoice::Cuda, cpu(), no_gpu)
            .err()
            .unwrap();
        assert_eq!(
            err.to_string(),
            "invalid argument: --device cuda: no CUDA GPU (libcuda.so not found)"
        );
    }

    #[test]
    fn a_gpu_comes_before_the_cpu() {
        let gpu = || {
            Ok((
                Box::new(CpuDevice::new().unwrap()) as Box<dyn BaseDevice>,
                Some(1e12),
            ))
        };
        let s = select_from(DeviceChoice::Auto, cpu(), gpu).unwrap();
        assert_eq!(s.devices.len(), 2);
        assert_eq!(s.gpu_peak_bandwidth, Some(1e12));
        assert!(s.notice.is_none());
    }
}
