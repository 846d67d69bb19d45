//! Integer dot products between quantised weight rows and int8 activation blocks
//! (layouts in [`flm_core::quant`]). These are the portable kernels: plain integer loops
//! that LLVM vectorises, and the twins that ISA-specific kernels are tested against.

use flm_core::quant::{ActBlock, BLOCK};
use half::f16;

/// `Σ ŵ·x` for an int8 per-channel row: `s · Σ_b a_b · Σ_i q_w q_x`.
pub(crate) fn dot_i8(row: &[u8], acts: &[ActBlock]) -> f32 {
    let scale = f32::from_le_bytes([row[0], row[1], row[2], row[3]]);
    let mut acc = 0.0f32;
    for (a, qw) in acts.iter().zip(row[4..].chunks_exact(BLOCK)) {
        let s: i32 = qw
            .iter()
            .zip(&a.qs)
            .map(|(&w, &x)| i32::from(w as i8) * i32::from(x))
            .sum();
        acc += a.d * s as f32;
    }
    acc * scale
}

/// `Σ ŵ·x` for an int4 row with groups of `group`:
/// `Σ_g d_g · Σ_b a_b Σ_i q_w q_x + m_g · Σ_b a_b Σ_i q_x`.
pub(crate) fn dot_i4(group: usize, row: &[u8], acts: &[ActBlock]) -> f32 {
    let mut acc = 0.0f32;
    for (block, a) in row
        .chunks_exact(4 + group / 2)
        .zip(acts.chunks(group / BLOCK))
    {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        let m = f16::from_le_bytes([block[2], block[3]]).to_f32();
        let (mut dots, mut sums) = (0.0f32, 0.0f32);
        for (codes, a) in block[4..].chunks_exact(BLOCK / 2).zip(a) {
            let mut s = 0i32;
            for (i, &c) in codes.iter().enumerate() {
                s += i32::from(c & 0x0f) * i32::from(a.qs[i])
                    + i32::from(c >> 4) * i32::from(a.qs[i + BLOCK / 2]);
            }
            dots += a.d * s as f32;
            sums += a.d * a.sum as f32;
        }
        acc += d * dots + m * sums;
    }
    acc
}
