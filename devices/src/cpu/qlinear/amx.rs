//! Intel AMX (Advanced Matrix Extensions, Sapphire Rapids and later) int8 and int4 tile
//! kernels for prefill.
//!
//! One tile multiply computes a 16 × 16 block of int32 dot products over one block of 32
//! values (Intel SDM vol. 1 ch. 18, "Intel AMX"):
//! - A (`tmm0`/`tmm3`): up to 16 weight rows × 32 codes, copied out of the weights' panel
//!   ([`flm_core::panels`]) as rows of one code per byte, once per call and panel;
//! - B (`tmm1`/`tmm4`): 16 input rows (tokens) of the same block, repacked once per call into
//!   the VNNI tile layout `B[q][4·t + i] = q_x[t][4q + i]` by [`TileActs::pack`];
//! - C (`tmm2`/`tmm5`): `C[j][t] = Σ_k q_w[j][k] q_x[t][k]`, exact, with `tdpbssd` (int8:
//!   signed × signed) or `tdpbusd` (int4: unsigned codes `0..15` × signed activations).
//!
//! Each block's C is then scaled by the block scales of its 16 tokens (one vector, as the
//! lanes of a row of C are tokens) and accumulated in f32 — the order of `panels`, block by
//! block. Two blocks are in flight at once (two sets of tile registers), so the tile unit
//! multiplies one block while the vector unit scales the previous one.
//!
//! Fewer than [`super::AMX_MIN_ROWS`] input rows (decode, short speculative batches) go to
//! the AVX-512 panel kernels, which sum each output in the same order: the same bits for a
//! row alone as in a prefill (batch invariance). One-row tile multiplies were slower there
//! (1.5× for int8, 4× for int4): every block's C goes through memory, and decode has nothing
//! to amortise it over.
//!
//! Tile registers are not known to the compiler: every `asm!` block below names the ones it
//! uses, and nothing else in the program touches them (we use no AMX intrinsics).

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::Cell;
use std::sync::OnceLock;

use flm_core::panels::STEP;
use flm_core::quant::BLOCK;
use flm_core::DataType;

use super::int4::Int4Params;
use super::{Acts, QuantWeight};
use crate::cpu::scratch;

/// Input rows (tokens) per tile: the columns of B and C.
const TOKENS: usize = 16;

/// Weight rows per tile: the rows of A and C.
const ROWS: usize = 16;

/// Bytes of one B tile: 8 rows of 16 tokens × 4 codes.
const B_BYTES: usize = BLOCK * TOKENS;

/// Whether this CPU has AMX-TILE and AMX-INT8 and the kernel lets this process use them.
///
/// Linux (5.16 and later) hands out the 8 KiB tile-data register state only on request
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); the request is made once, for
/// the whole process.
pub(crate) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(detect)
}

#[cfg(target_os = "linux")]
fn detect() -> bool {
    const AMX_TILE_AND_INT8: u32 = 3 << 24;
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    let leaf7 = __cpuid_count(7, 0);
    if leaf7.edx & AMX_TILE_AND_INT8 != AMX_TILE_AND_INT8 {
        return false;
    }
    // SAFETY: this request only widens the extended register state the kernel saves for
    // this process; it touches no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn detect() -> bool {
    false
}

/// The inputs of one call, repacked into B tiles.
#[derive(Default)]
pub(crate) struct TileActs {
    /// Input rows.
    n: usize,
    tiles: usize,
    blocks: usize,
    groups: usize,
    /// `tiles × blocks` B tiles of [`B_BYTES`] (padding tokens are zero).
    b: Vec<i8>,
    /// `tiles × blocks × 16` block scales of the tile's tokens.
    d: Vec<f32>,
    /// `tiles × groups × 16` group sums of the tile's tokens (see [`Acts::gsum`]).
    gsum: Vec<f32>,
}

impl TileActs {
    /// Repacks `acts`, quantised in natural order.
    pub(super) fn pack(&mut self, acts: &Acts) {
        let (blocks, groups) = (acts.blocks, acts.groups);
        let tiles = acts.n.div_ceil(TOKENS);
        self.n = acts.n;
        self.tiles = tiles;
        self.blocks = blocks;
        self.groups = groups;
        for (v, len) in [
            (&mut self.d, tiles * blocks * TOKENS),
            (&mut self.gsum, tiles * groups * TOKENS),
        ] {
            v.clear();
            v.resize(len, 0.0);
        }
        self.b.clear();
        self.b.resize(tiles * blocks * B_BYTES, 0);
        for i in 0..acts.n {
            let (tile, t) = (i / TOKENS, i % TOKENS);
            let qs = acts.row_qs(i);
            for b in 0..blocks {
                let dst = &mut self.b[(tile * blocks + b) * B_BYTES..][..B_BYTES];
                for (q, src) in qs[b * BLOCK..][..BLOCK].chunks_exact(4).enumerate() {
                    dst[q * 4 * TOKENS + 4 * t..][..4].copy_from_slice(src);
                }
                self.d[(tile * blocks + b) * TOKENS + t] = acts.row_d(i)[b];
            }
            for (g, &s) in acts.row_gsum(i).iter().enumerate() {
                self.gsum[(tile * groups + g) * TOKENS + t] = s;
            }
        }
    }
}

/// The 64-byte operand of `ldtilecfg` (palette 1).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    /// Two sets of A, B, C tiles (`tmm0..2`, `tmm3..5`) for `m ≤ 16` weight rows.
    fn new(m: usize) -> TileConfig {
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for set in [0, 3] {
            (c.rows[set], c.colsb[set]) = (m as u8, BLOCK as u16);
            (c.rows[set + 1], c.colsb[set + 1]) = ((BLOCK / 4) as u8, (4 * TOKENS) as u16);
            (c.rows[set + 2], c.colsb[set + 2]) = (m as u8, (4 * TOKENS) as u16);
        }
        c
    }
}

/// Per-thread buffers of the kernel.
#[derive(Default)]
struct Scratch {
    /// The rows of the panel, one code per byte: `16 × kp`.
    codes: Vec<u8>,
    /// Int4 group scales and minimums of the panel as f32: `groups × 16` each (group `g` of
    /// row `dr` at `g·16 + dr`, so that a vector holds one group of the 16 rows); int8:
    /// the 16 row scales.
    dg: Vec<f32>,
    mg: Vec<f32>,
}

/// Two C tiles stored as int32, 64-byte aligned for vector loads.
#[repr(C, align(64))]
struct CBuf([[i32; TOKENS * ROWS]; 2]);

thread_local! {
    static SCRATCH: Cell<Scratch> = Cell::new(Scratch::default());
}

/// Computes `yt[(j − j0)·n + i] = Σ ŵ_j · x_i` for the rows `j0..j0 + yt.len() / n` of `w`
/// (in panels, `j0` a multiple of 16) and the `n ≥` [`super::AMX_MIN_ROWS`] input rows
/// that `tiles` packs.
///
/// The caller guarantees that [`available`] returned true and that the CPU has AVX-512
/// (F, BW, VL, VNNI) and F16C.
pub(super) fn rows(w: &QuantWeight<'_>, tiles: &TileActs, j0: usize, yt: &mut [f32]) {
    let n = tiles.n;
    scratch::with(&SCRATCH, |scratch| {
        for (p, out) in yt.chunks_mut(ROWS * n).enumerate() {
            let (j, r) = (j0 + p * ROWS, out.len() / n);
            // SAFETY: the caller guarantees AMX and AVX-512 (F, BW, VL, VNNI: `Isa::Amx`
            // includes `Isa::Avx512`); `tiles` packs `n` input rows.
            unsafe { panel(w, tiles, j, r, n, out, scratch) };
        }
    });
}

/// One panel: weight rows `j..j + r` (`r ≤ 16`) × every input row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn panel(
    w: &QuantWeight<'_>,
    tiles: &TileActs,
    j: usize,
    r: usize,
    n: usize,
    yt: &mut [f32],
    scratch: &mut Scratch,
) {
    let int8 = w.dtype == DataType::I8;
    if int8 {
        unpack_i8(w, j, scratch);
    } else {
        unpack_i4(w, j, scratch);
    }
    let (a, a_stride) = (scratch.codes.as_ptr(), w.kp);
    let config = TileConfig::new(r);
    // SAFETY: the configuration is a valid palette-1 layout (rows ≤ 16, colsb ≤ 64), and
    // `available` obtained the permission to use tile data.
    asm!("ldtilecfg [{}]", in(reg) &config as *const TileConfig, options(nostack, readonly));
    let mut c = CBuf([[0; TOKENS * ROWS]; 2]);
    for tile in 0..tiles.tiles {
        let acc = if int8 {
            tile_rows::<true>(tiles, tile, a, a_stride, &[], &mut c)
        } else {
            let acc = tile_rows::<false>(tiles, tile, a, a_stride, &scratch.dg, &mut c);
            add_minimums(tiles, tile, &scratch.mg, acc)
        };
        let valid = (n - tile * TOKENS).min(TOKENS);
        let mask: __mmask16 = ((1u32 << valid) - 1) as __mmask16;
        for (dr, v) in acc.iter().enumerate().take(r) {
            let v = if int8 {
                _mm512_mul_ps(*v, _mm512_set1_ps(scratch.dg[dr]))
            } else {
                *v
            };
            _mm512_mask_storeu_ps(yt.as_mut_ptr().add(dr * n + tile * TOKENS), mask, v);
        }
    }
    // SAFETY: returns the tile registers to their initial state; no tile is live.
    asm!("tilerelease", options(nostack, nomem));
}

/// The f32 sums `Σ_b a_b [d_g] C_b` of one token tile for the 16 rows of the panel at `a`
/// (int8: `d_g` is 1 and the per-channel scale comes later; int4: `dg` holds `d_g`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn tile_rows<const INT8: bool>(
    tiles: &TileActs,
    tile: usize,
    a: *const u8,
    a_stride: usize,
    dg: &[f32],
    c: &mut CBuf,
) -> [__m512; ROWS] {
    let blocks = tiles.blocks;
    let per_group = (tiles.blocks / tiles.groups).max(1);
    let b_tiles = tiles.b.as_ptr().add(tile * blocks * B_BYTES);
    let scales = tiles.d.as_ptr().add(tile * blocks * TOKENS);
    let mut acc = [_mm512_setzero_ps(); ROWS];
    let mut b = 0;
    while b < blocks {
        let pair = b + 1 < blocks;
        multiply::<INT8, 0>(
            a.add(b * BLOCK),
            a_stride,
            b_tiles.add(b * B_BYTES),
            &mut c.0[0],
        );
        if pair {
            let (a1, b1) = (a.add((b + 1) * BLOCK), b_tiles.add((b + 1) * B_BYTES));
            multiply::<INT8, 1>(a1, a_stride, b1, &mut c.0[1]);
        }
        for (h, cb) in c.0.iter().enumerate().take(1 + pair as usize) {
            let block = b + h;
            let da = _mm512_loadu_ps(scales.add(block * TOKENS));
            for (dr, acc) in acc.iter_mut().enumerate() {
                let s = if INT8 {
                    da
                } else {
                    let g = block / per_group;
                    _mm512_mul_ps(da, _mm512_set1_ps(*dg.get_unchecked(g * ROWS + dr)))
                };
                let p =
                    _mm512_cvtepi32_ps(_mm512_load_si512(cb.as_ptr().add(dr * TOKENS) as *const _));
                *acc = _mm512_fmadd_ps(p, s, *acc);
            }
        }
        b += 2;
    }
    acc
}

/// Adds the int4 minimum terms `Σ_g m_g · gsum_g` of one token tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn add_minimums(
    tiles: &TileActs,
    tile: usize,
    mg: &[f32],
    mut acc: [__m512; ROWS],
) -> [__m512; ROWS] {
    let groups = tiles.groups;
    let sums = tiles.gsum.as_ptr().add(tile * groups * TOKENS);
    for g in 0..groups {
        let s = _mm512_loadu_ps(sums.add(g * TOKENS));
        for (dr, acc) in acc.iter_mut().enumerate() {
            *acc = _mm512_fmadd_ps(_mm512_set1_ps(*mg.get_unchecked(g * ROWS + dr)), s, *acc);
        }
    }
    acc
}

/// `C = A·B` for one block into tile set `SET` (0: `tmm0..2`, 1: `tmm3..5`), stored to `c`.
///
/// # Safety
/// The tile configuration of [`panel`] is loaded; `a` points at `rows` rows of 32 codes
/// `a_stride` bytes apart, `b` at one B tile.
#[inline(always)]
unsafe fn multiply<const INT8: bool, const SET: usize>(
    a: *const u8,
    a_stride: usize,
    b: *const i8,
    c: &mut [i32; TOKENS * ROWS],
) {
    let b_stride = 4 * TOKENS;
    let c_ptr = c.as_mut_ptr();
    macro_rules! tiles {
        ($dp:literal, $a:literal, $b:literal, $c:literal) => {
            asm!(
                concat!("tilezero ", $c),
                concat!("tileloadd ", $a, ", [{a} + {sa}*1]"),
                concat!("tileloadd ", $b, ", [{b} + {sb}*1]"),
                concat!($dp, " ", $c, ", ", $a, ", ", $b),
                concat!("tilestored [{c} + {sb}*1], ", $c),
                a = in(reg) a,
                sa = in(reg) a_stride,
                b = in(reg) b,
                sb = in(reg) b_stride,
                c = in(reg) c_ptr,
                options(nostack),
            )
        };
    }
    match (INT8, SET) {
        (true, 0) => tiles!("tdpbssd", "tmm0", "tmm1", "tmm2"),
        (true, _) => tiles!("tdpbssd", "tmm3", "tmm4", "tmm5"),
        (false, 0) => tiles!("tdpbusd", "tmm0", "tmm1", "tmm2"),
        (false, _) => tiles!("tdpbusd", "tmm3", "tmm4", "tmm5"),
    }
}

/// Copies the int4 panel at row `j` ([`flm_core::panels`], `r` rows) into `s.codes` as rows
/// of `kp` codes, one per byte, and its group scales and minimums (as `Int4Row` forms
/// them) into `s.dg` and `s.mg` as f32, group-major (`g·16 + dr`; zeros for rows `r..16`).
fn unpack_i4(w: &QuantWeight<'_>, j: usize, s: &mut Scratch) {
    let (panel, r) = w.panel(j);
    let kp = w.kp;
    s.codes.resize(ROWS * kp, 0);
    for v in [&mut s.dg, &mut s.mg] {
        v.clear();
    }
    let Some(p) = Int4Params::new(w.dtype, kp, r) else {
        return;
    };
    for step in 0..kp / (2 * STEP) {
        let codes = &panel[p.layout.step(step)..][..STEP * r];
        for (dr, four) in codes.chunks_exact(STEP).enumerate() {
            let row = &mut s.codes[dr * kp + 2 * STEP * step..][..2 * STEP];
            for (q, &byte) in four.iter().enumerate() {
                row[q] = byte & 0x0f;
                row[STEP + q] = byte >> 4;
            }
        }
    }
    for v in [&mut s.dg, &mut s.mg] {
        v.resize(p.groups * ROWS, 0.0);
    }
    for g in 0..p.groups {
        for dr in 0..r {
            let (d, m) = p.scale_and_min(panel, g, dr);
            s.dg[g * ROWS + dr] = d;
            s.mg[g * ROWS + dr] = m;
        }
    }
}

/// Copies the int8 panel at row `j` ([`flm_core::panels`], `r` rows) into `s.codes` as
/// rows of `kp` codes, and its scales into `s.dg`.
fn unpack_i8(w: &QuantWeight<'_>, j: usize, s: &mut Scratch) {
    let (panel, r) = w.panel(j);
    let kp = w.kp;
    s.codes.resize(ROWS * kp, 0);
    s.dg.clear();
    s.dg.extend(
        panel[..4 * r]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
    );
    for (step, codes) in panel[4 * r..].chunks_exact(STEP * r).enumerate() {
        for (dr, four) in codes.chunks_exact(STEP).enumerate() {
            s.codes[dr * kp + STEP * step..][..STEP].copy_from_slice(four);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flm_core::{quant, Data};

    /// The tile kernels read an int8 panel as the rows it was packed from (any CPU: the
    /// copy is plain Rust).
    #[test]
    fn int8_panels_unpack_to_their_rows() {
        let (m, k) = (37, 100);
        let values: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 255) as f32 - 127.0)
            .collect();
        let rows = Data::from_f32(&[m, k], &values)
            .unwrap()
            .to_dtype(DataType::I8)
            .unwrap();
        let panels = rows.to_panels().unwrap();
        let row_bytes = quant::row_bytes(DataType::I8, k).unwrap();
        let w = QuantWeight {
            dtype: DataType::I8,
            bytes: panels.bytes().unwrap(),
            row_bytes,
            kp: row_bytes - 4,
        };
        let mut s = Scratch::default();
        for j in (0..m).step_by(ROWS) {
            unpack_i8(&w, j, &mut s);
            for dr in 0..(m - j).min(ROWS) {
                let want = &rows.bytes().unwrap()[(j + dr) * row_bytes..][..row_bytes];
                assert_eq!(&s.codes[dr * w.kp..][..w.kp], &want[4..], "row {}", j + dr);
                assert_eq!(s.dg[dr].to_le_bytes(), want[..4], "scale of row {}", j + dr);
            }
        }
    }

    /// The same for int4 panels of every form: the codes one per byte, and each group's
    /// scale and minimum as `Int4Row` gives them.
    #[test]
    fn int4_panels_unpack_to_their_rows() {
        use flm_core::quant::Int4Row;
        let (m, k) = (37, 256);
        let values: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 255) as f32 / 127.0 - 1.0)
            .collect();
        for dtype in [DataType::I4G32, DataType::I4SymG64, DataType::I4ZpG128] {
            let rows = Data::from_f32(&[m, k], &values)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let panels = rows.to_panels().unwrap();
            let row_bytes = quant::row_bytes(dtype, k).unwrap();
            let w = QuantWeight {
                dtype,
                bytes: panels.bytes().unwrap(),
                row_bytes,
                kp: k,
            };
            let mut s = Scratch::default();
            for j in (0..m).step_by(ROWS) {
                unpack_i4(&w, j, &mut s);
                for dr in 0..(m - j).min(ROWS) {
                    let bytes = &rows.bytes().unwrap()[(j + dr) * row_bytes..][..row_bytes];
                    let row = Int4Row::split(dtype, bytes);
                    for c in 0..k {
                        let (at, shift) = quant::nibble(c);
                        let want = bytes[at] >> shift & 0x0f;
                        assert_eq!(s.codes[dr * k + c], want, "{dtype} row {} code {c}", j + dr);
                    }
                    for g in 0..k / dtype.group_size().unwrap() {
                        assert_eq!(s.dg[g * ROWS + dr].to_bits(), row.scale(g).to_bits());
                        assert_eq!(s.mg[g * ROWS + dr].to_bits(), row.min(g).to_bits());
                    }
                }
            }
        }
    }
}
