//! Where tensors live, and the record of every copy between host and device memory.
//!
//! A [`crate::Data`] is either in host memory ([`Location::Host`]) or in a buffer owned by
//! a device ([`DeviceBuffer`], tagged with its [`Location`]), as candle's
//! `Storage::{Cpu, Cuda}` and FastLLM's `dataDevice`. flm-core knows device memory only
//! through this trait, so it stays free of any accelerator library. Copies between
//! locations are made by the [`crate::Executor`] on request only, and each is recorded in
//! a [`TransferRecord`] (what asked for it, the direction, the bytes).

use std::any::Any;
use std::fmt;

/// The memory a tensor's bytes are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// Host memory: owned, on huge pages, or mapped from a file.
    Host,
    /// The memory of one device, such as `cuda:0`.
    Device {
        /// The device's name ([`crate::BaseDevice::name`]).
        name: &'static str,
        /// Which device of that name (the CUDA ordinal).
        ordinal: u32,
    },
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Host => f.write_str("host"),
            Location::Device { name, ordinal } => write!(f, "{name}:{ordinal}"),
        }
    }
}

/// A buffer of device memory, owned by the device that allocated it
/// ([`crate::BaseDevice::alloc`]) and freed when dropped. Only that device reads or writes
/// its contents; the host sees them through [`crate::Executor::to_host`].
pub trait DeviceBuffer: Send + Sync + fmt::Debug {
    /// The device whose memory this is (never [`Location::Host`]).
    fn location(&self) -> Location;
    /// Its size in bytes.
    fn len(&self) -> usize;
    /// Whether it holds no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The bytes, where the host can address this memory (host-visible memory, such as
    /// the [`Location::Device`] buffers of a device that runs host kernels on memory of
    /// its own); `None`, the default, for memory only its device reads (a GPU's).
    fn host_view(&self) -> Option<&[u8]> {
        None
    }
    /// The bytes, mutable, where the host can address this memory (see
    /// [`DeviceBuffer::host_view`]).
    fn host_view_mut(&mut self) -> Option<&mut [u8]> {
        None
    }
    /// The buffer as `Any`, for its device to reach its own type.
    fn as_any(&self) -> &dyn Any;
    /// The buffer as mutable `Any`, for its device to reach its own type.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// The direction of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Route {
    /// Where the bytes were.
    pub from: Location,
    /// Where they were copied to.
    pub to: Location,
}

/// The copies of one route asked for by one caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfers {
    /// Who asked: the op or the call that needed the copy ("load weights",
    /// "decode: token ids", "sample: logits").
    pub reason: &'static str,
    /// The direction.
    pub route: Route,
    /// Copies made.
    pub count: u64,
    /// Bytes copied in all.
    pub bytes: u64,
}

/// Every copy between locations an [`crate::Executor`] has made, grouped by reason and
/// route, in the order each group first appeared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TransferRecord {
    /// One entry per (reason, route).
    pub entries: Vec<Transfers>,
}

impl TransferRecord {
    /// Counts one copy of `bytes` bytes along `route`, asked for by `reason`.
    pub(crate) fn add(&mut self, reason: &'static str, route: Route, bytes: usize) {
        let bytes = bytes as u64;
        match self
            .entries
            .iter_mut()
            .find(|e| e.reason == reason && e.route == route)
        {
            Some(e) => {
                e.count += 1;
                e.bytes += bytes;
            }
            None => self.entries.push(Transfers {
                reason,
                route,
                count: 1,
                bytes,
            }),
        }
    }

    /// Copies and bytes in all.
    pub fn totals(&self) -> (u64, u64) {
        self.entries
            .iter()
            .fold((0, 0), |(c, b), e| (c + e.count, b + e.bytes))
    }

    /// The record as a printable table (empty without copies).
    pub fn report(&self) -> String {
        if self.entries.is_empty() {
            return String::new();
        }
        let mut out = format!(
            "{:<28} {:<18} {:>10} {:>14}\n",
            "transfer", "route", "copies", "bytes"
        );
        for e in &self.entries {
            out += &format!(
                "{:<28} {:<18} {:>10} {:>14}\n",
                e.reason,
                format!("{} -> {}", e.route.from, e.route.to),
                e.count,
                e.bytes
            );
        }
        out
    }
}
