//! The parameters of an int4 panel ([`flm_core::panels::Int4Panel`]) that the panel
//! kernels of every level read: where its scales and minimums lie, and how a minimum is
//! formed from what is stored ([`flm_core::quant::Int4Row`]).

use flm_core::panels::Int4Panel;
use flm_core::quant::{int4_mins, BLOCK};
use flm_core::DataType;
use half::f16;

/// Where the parts of an int4 panel lie and how its minimums are formed.
#[derive(Clone, Copy)]
pub(super) struct Int4Params {
    /// The panel's layout.
    pub layout: Int4Panel,
    /// Blocks per group.
    pub per_group: usize,
    /// Groups per row.
    pub groups: usize,
    /// `m_g = factor · stored`, times `d_g` where `times_scale`.
    pub factor: f32,
    pub times_scale: bool,
}

impl Int4Params {
    /// The parameters of a panel of `r` rows of the int4 `dtype` with `kp` padded columns.
    pub fn new(dtype: DataType, kp: usize, r: usize) -> Option<Int4Params> {
        let layout = Int4Panel::new(dtype, r)?;
        let mins = int4_mins(dtype, kp);
        Some(Int4Params {
            layout,
            per_group: layout.group / BLOCK,
            groups: kp / layout.group,
            factor: mins.factor,
            times_scale: mins.times_scale,
        })
    }

    /// `d_g` and `m_g` of row `dr` of `panel`.
    pub fn scale_and_min(&self, panel: &[u8], g: usize, dr: usize) -> (f32, f32) {
        let d = f16_at(&panel[self.layout.scales(g)..], dr);
        let m = self.factor * f16_at(&panel[self.layout.mins(g)..], dr);
        (d, if self.times_scale { m * d } else { m })
    }
}

/// The f16 number `i` of `bytes`, as f32.
fn f16_at(bytes: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32()
}
