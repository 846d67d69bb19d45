//! Rotary position embedding, applied in place.

use flm_core::{Data, Result, RopeStyle, RopeTable};

use super::simd::{self, Kernel, Simd};
use super::Isa;

/// Rotates the first `table.rotary_dim()` dimensions of each head of each row of `x`
/// `[n, n_heads * head_dim]` (f32, checked by [`flm_core::Op::validate`]); row `i` is at
/// position `start_pos + i`. For a pair
/// `(a, b)` and angle θ: `a' = a·cosθ − b·sinθ`, `b' = a·sinθ + b·cosθ` (RoFormer eq. 34).
/// Pairs are `(2j, 2j+1)` for [`RopeStyle::AdjacentPairs`] (llama2.c `run.c`) and
/// `(j, j + rotary_dim/2)` for [`RopeStyle::RotateHalf`] (HF `apply_rotary_pos_emb`).
pub(crate) fn rope(isa: Isa, x: &mut Data, table: &RopeTable, start_pos: usize) -> Result<()> {
    let cols = x.cols();
    let k = Rope {
        x: x.as_f32_mut()?,
        cols,
        table,
        start_pos,
        positions: None,
    };
    simd::run(isa, k);
    Ok(())
}

/// As [`rope`], with row `i` at `positions[i]` (see [`flm_core::Op::RopeRows`]).
pub(crate) fn rope_rows(
    isa: Isa,
    x: &mut Data,
    table: &RopeTable,
    positions: &[u32],
) -> Result<()> {
    let cols = x.cols();
    let k = Rope {
        x: x.as_f32_mut()?,
        cols,
        table,
        start_pos: 0,
        positions: Some(positions),
    };
    simd::run(isa, k);
    Ok(())
}

/// The operands of [`rope`]: `x` `[n, cols]` rotated in place.
struct Rope<'a> {
    x: &'a mut [f32],
    cols: usize,
    table: &'a RopeTable,
    start_pos: usize,
    /// The position of each row, instead of `start_pos + i`.
    positions: Option<&'a [u32]>,
}

/// The position of row `i`: `positions[i]`, or `start_pos + i` without a list.
fn position(start_pos: usize, positions: Option<&[u32]>, i: usize) -> usize {
    positions.map_or(start_pos + i, |p| p[i] as usize)
}

impl Kernel for Rope<'_> {
    type Output = ();

    /// Rotate-half: `a`, `b`, cos and sin are four contiguous runs. Adjacent pairs: with
    /// `c`/`s` the cos/sin of each pair repeated twice, `v' = v·c ∓ swap(v)·s` (`fmaddsub`).
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let (head_dim, rot) = (self.table.head_dim(), self.table.rotary_dim());
        let (half, l) = (rot / 2, S::LANES);
        let style = self.table.style();
        for (i, row) in self.x.chunks_exact_mut(self.cols).enumerate() {
            let Some((cos, sin)) = self.table.at(position(self.start_pos, self.positions, i))
            else {
                continue;
            };
            for head in row.chunks_exact_mut(head_dim) {
                match style {
                    RopeStyle::RotateHalf => {
                        let (a, b) = head[..rot].split_at_mut(half);
                        let mut j = 0;
                        while j + l <= half {
                            let (va, vb) = (s.load(&a[j..]), s.load(&b[j..]));
                            let (c, sn) = (s.load(&cos[j..]), s.load(&sin[j..]));
                            s.store(&mut a[j..], s.fnma(vb, sn, s.mul(va, c)));
                            s.store(&mut b[j..], s.fma(va, sn, s.mul(vb, c)));
                            j += l;
                        }
                        if j < half {
                            let (va, vb) = (s.load_part(&a[j..]), s.load_part(&b[j..]));
                            let (c, sn) = (s.load_part(&cos[j..]), s.load_part(&sin[j..]));
                            s.store_part(&mut a[j..], s.fnma(vb, sn, s.mul(va, c)));
                            s.store_part(&mut b[j..], s.fma(va, sn, s.mul(vb, c)));
                        }
                    }
                    RopeStyle::AdjacentPairs => {
                        let head = &mut head[..rot];
                        let mut c = 0;
                        while c + l <= rot {
                            let v = s.load(&head[c..]);
                            let (cd, sd) = (s.load_dup(&cos[c / 2..]), s.load_dup(&sin[c / 2..]));
                            s.store(
                                &mut head[c..],
                                s.fmaddsub(v, cd, s.mul(s.swap_pairs(v), sd)),
                            );
                            c += l;
                        }
                        if c < rot {
                            let v = s.load_part(&head[c..]);
                            let cd = s.load_dup_part(&cos[c / 2..]);
                            let sd = s.load_dup_part(&sin[c / 2..]);
                            let r = s.fmaddsub(v, cd, s.mul(s.swap_pairs(v), sd));
                            s.store_part(&mut head[c..], r);
                        }
                    }
                }
            }
        }
    }
}

/// ChatGLM-6B's two-dimensional RoPE (see [`flm_core::Op::Rope2d`]): each head of `x`
/// `[n, n_heads · 2·half]` (f32), `half = table.head_dim()`, is two halves rotated as one
/// [`rope`] head each, the first at `positions[i]` and the second at `block_positions[i]`
/// for row `i` (THUDM `modeling_chatglm.py`, `RotaryEmbedding` applied to
/// `q1, q2 = q.chunk(2)`).
pub(crate) fn rope_2d(
    isa: Isa,
    x: &mut Data,
    table: &RopeTable,
    positions: &[u32],
    block_positions: &[u32],
) -> Result<()> {
    let half = table.head_dim();
    let cols = x.cols();
    for ((row, &p), &b) in x
        .as_f32_mut()?
        .chunks_exact_mut(cols)
        .zip(positions)
        .zip(block_positions)
    {
        for (h, part) in row.chunks_exact_mut(half).enumerate() {
            let pos = if h % 2 == 0 { p } else { b };
            let k = Rope {
                x: part,
                cols: half,
                table,
                start_pos: pos as usize,
                positions: None,
            };
            simd::run(isa, k);
        }
    }
    Ok(())
}
