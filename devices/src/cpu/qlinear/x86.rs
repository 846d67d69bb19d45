//! x86-64 int4 micro-kernels (int8 weights lie in panels, see `panels`).
//!
//! Each kernel computes a tile of `R` weight rows × `T` input rows, loading and unpacking
//! each weight vector once for the `T` inputs. Per chunk of the row it forms exact int32
//! dot products of 4 adjacent byte pairs per lane, converts them to f32 and accumulates
//! them scaled by the block scales of the lane: the codes `0..15` are the unsigned operand
//! of `vpdpbusd` / `vpmaddubsw` (`15·127·2` fits the i16 of `vpmaddubsw`), the activations
//! the signed one.

// Tiles index several register arrays by row and input in one loop body.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::cell::Cell;

use flm_core::quant::int4_mins;

use super::{Acts, QuantWeight};
use crate::cpu::{scratch, Isa};

/// Weight rows per full tile.
const TILE_ROWS: usize = 4;

/// Input rows per tile of the AVX-512 int4 prefill kernel over unpacked weight rows.
///
/// 4 × 3 keeps the accumulators and inputs in the 32 vector registers, where 4 × 4 spilled
/// to the stack (figures: docs/benchmarks.md, "Kernel choices"). Each output's arithmetic
/// is the same whatever the tile.
const UNPACKED_TILE_INPUTS: usize = 3;

/// Bytes a decode stream is prefetched ahead of its loads, each thread reading its rows one
/// after another as one stream (see [`rows`]): the fastest distance measured for int4-sym
/// decode (docs/benchmarks.md, "Kernel choices").
const ONE_STREAM_AHEAD: usize = 8192;

thread_local! {
    /// Unpacked int4 weight rows of the current tile (see [`unpack_i4_avx512`]).
    static UNPACKED: Cell<Vec<__m512i>> = const { Cell::new(Vec::new()) };
}

/// See [`super::rows`]. The caller guarantees that the CPU supports `isa`.
///
/// With AVX-512, int4 weights and more input rows than one tile (prefill), each tile of
/// 4 adjacent weight rows is first unpacked into L1-resident vectors, so that the
/// unpacking is paid once per weight row instead of once per [`UNPACKED_TILE_INPUTS`] input
/// rows.
///
/// Otherwise (decode) each thread reads its rows in memory order, as one stream prefetched
/// [`ONE_STREAM_AHEAD`] bytes ahead, in tiles of 4 adjacent rows, which
/// [`Tile::i4_avx512_groups`] and [`Tile::i4_avx2_body`] read one row after the other, scaling
/// each chunk as it arrives, so that the minimum terms and the horizontal sums are paid once per
/// tile. It decodes faster than 4 strided streams; one row per tile was slower, bound by its
/// per-row work (docs/benchmarks.md, "Kernel choices").
///
/// When the input rows fit one tile (decode), a kernel call runs all the full tiles of the
/// task, and a second one the rows left over, so that the dispatch, the set-up of a
/// tile and the stores of its results cost a few instructions per tile instead of a call
/// each (that overhead was half of a decode step's time without the arithmetic).
pub(super) fn rows(isa: Isa, w: &QuantWeight<'_>, acts: &Acts, j0: usize, yt: &mut [f32]) {
    let n = acts.n;
    let m = yt.len() / n;
    let max_t = if isa == Isa::Avx512 { 4 } else { 2 };
    let unpack = isa == Isa::Avx512 && n > max_t;
    let tile_inputs = if unpack { UNPACKED_TILE_INPUTS } else { max_t };
    let stride = if unpack { 1 } else { (m / TILE_ROWS).max(1) };
    let ahead = if stride == 1 { TILE_ROWS } else { 1 } * w.row_bytes;
    let tile = Tile {
        w,
        j: j0,
        loc: 0,
        tiles: 1,
        stride,
        ahead,
        once: false,
        acts,
        i: 0,
        unpacked: &[],
    };
    if n <= max_t && !unpack {
        let r = TILE_ROWS;
        let full = m / r;
        let tiles = Tile {
            tiles: full,
            stride: 1,
            ahead: ONE_STREAM_AHEAD,
            once: true,
            ..tile
        };
        let rest = Tile {
            j: j0 + r * full,
            loc: r * full,
            tiles: m - r * full,
            ..tiles
        };
        // SAFETY: `CpuDevice::with_isa` only accepts levels this CPU supports.
        unsafe {
            tiles.run(isa, r, n, yt);
            rest.run(isa, 1, n, yt);
        }
        return;
    }
    scratch::with(&UNPACKED, |unpacked| {
        let mut j = 0;
        while j < m {
            let tiled = if stride == 1 {
                m - j >= TILE_ROWS
            } else {
                j < stride
            };
            let r = if tiled { TILE_ROWS } else { 1 };
            if unpack {
                // SAFETY: `CpuDevice::with_isa` only accepts levels this CPU supports.
                unsafe { unpack_i4_avx512(w, j0 + j, r, unpacked) };
            }
            // The next tile's weight rows, prefetched into L2 a slice per input tile while
            // this one computes, so that unpacking them does not wait on memory.
            let next = if unpack {
                let rows = (j + TILE_ROWS).min(m)..(j + 2 * TILE_ROWS).min(m);
                &w.bytes[(j0 + rows.start) * w.row_bytes..(j0 + rows.end) * w.row_bytes]
            } else {
                &[]
            };
            let lines = next.len().div_ceil(64);
            let per_tile = lines.div_ceil(n.div_ceil(tile_inputs));
            let mut line = 0;
            let mut i = 0;
            while i < n {
                for l in line..(line + per_tile).min(lines) {
                    // SAFETY: prefetching has no side effects; the address lies in `next`.
                    unsafe { _mm_prefetch::<_MM_HINT_T1>(next.as_ptr().add(64 * l) as *const i8) };
                }
                line += per_tile;
                let t = (n - i).min(tile_inputs);
                let tile = Tile {
                    j: j0 + j,
                    loc: j,
                    i,
                    unpacked: if unpack { unpacked } else { &[] },
                    ..tile
                };
                // SAFETY: as above.
                unsafe { tile.run(isa, r, t, yt) };
                i += t;
            }
            j = match (tiled, stride) {
                (true, 1) => j + TILE_ROWS,
                (true, _) if j + 1 == stride => TILE_ROWS * stride,
                _ => j + 1,
            };
        }
    });
}

/// `tiles` tiles of `R` weight rows × `T` input rows: tile `s` takes the weight rows
/// `j + s · step + r · stride` for `r < R` and the input rows `i..i + T`, where `step` is `R`
/// if `stride` is 1 (tiles of adjacent rows, one after another) and 1 otherwise (strided
/// tiles, interleaved).
#[derive(Clone, Copy)]
struct Tile<'a> {
    w: &'a QuantWeight<'a>,
    j: usize,
    /// Row `j`'s index in the task's output.
    loc: usize,
    tiles: usize,
    /// Weight rows between the rows of the tile.
    stride: usize,
    /// Bytes ahead of each weight load to prefetch: the same place in the row the next
    /// tile reads, or in decode [`ONE_STREAM_AHEAD`] bytes further in the stream.
    ahead: usize,
    /// Whether the call reads each weight once (decode), so that the prefetches are
    /// non-temporal (see [`Tile::prefetch_ahead`]).
    once: bool,
    acts: &'a Acts,
    i: usize,
    /// The tile's weight rows unpacked by [`unpack_i4_avx512`], or empty.
    unpacked: &'a [__m512i],
}

/// Unpacks int4 rows `j..j + r` for [`Tile::i4_avx512_unpacked`]: per chunk of 128 values
/// and row, the low codes, the high codes and the 16 lane scales `d_g` (as f32 bits).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn unpack_i4_avx512(w: &QuantWeight<'_>, j: usize, r: usize, out: &mut Vec<__m512i>) {
    match w.dtype.group_size() {
        Some(32) => unpack_rows_avx512::<32>(w, j, r, out),
        Some(64) => unpack_rows_avx512::<64>(w, j, r, out),
        _ => unpack_rows_avx512::<128>(w, j, r, out),
    }
}

/// [`unpack_i4_avx512`] for groups of `G` values.
#[inline(always)]
unsafe fn unpack_rows_avx512<const G: usize>(
    w: &QuantWeight<'_>,
    j: usize,
    r: usize,
    out: &mut Vec<__m512i>,
) {
    let kp = w.kp;
    let chunks = kp.div_ceil(128);
    out.clear();
    out.reserve(3 * r * chunks);
    for c in 0..chunks {
        for row in (j..j + r).map(|jj| w.row(jj)) {
            let (lo, hi, dw) = unpack_chunk_avx512::<G>(row.as_ptr(), kp, c);
            out.extend_from_slice(&[lo, hi, _mm512_castps_si512(dw)]);
        }
    }
}

/// Chunk `c` (128 values) of the int4 row at `row` (`kp` padded columns, groups of `G`
/// values): low codes, high codes and lane scales.
#[inline(always)]
unsafe fn unpack_chunk_avx512<const G: usize>(
    row: *const u8,
    kp: usize,
    c: usize,
) -> (__m512i, __m512i, __m512) {
    let (lo, hi) = chunk_codes_avx512(row, kp, c);
    (lo, hi, chunk_scales_avx512::<G>(row, kp, c))
}

/// The low and the high codes of chunk `c` (128 values) of the int4 row at `row` (`kp`
/// padded columns). All chunks but a row's last load without a mask; the last reads no
/// byte past the row's codes.
#[inline(always)]
unsafe fn chunk_codes_avx512(row: *const u8, kp: usize, c: usize) -> (__m512i, __m512i) {
    let rest = kp - 128 * c;
    let mask: __mmask64 = if rest >= 128 {
        !0
    } else {
        (1 << (rest / 2)) - 1
    };
    nibbles_avx512(_mm512_maskz_loadu_epi8(mask, row.add(64 * c) as *const i8))
}

/// The lane scales of chunk `c` (128 values) of the int4 row at `row` (`kp` padded
/// columns, groups of `G` values): lane `l` holds the scale `d_g` of block `4c + l / 4`.
/// `G` is a constant so that the group arithmetic folds to shifts and a whole chunk loads
/// its `128 / G` scales without a branch.
#[inline(always)]
unsafe fn chunk_scales_avx512<const G: usize>(row: *const u8, kp: usize, c: usize) -> __m512 {
    let gidx = match G {
        32 => _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
        64 => _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
        _ => _mm512_setzero_si512(),
    };
    let scales = row.add(kp / 2 + 2 * (128 * c / G));
    let rest = kp - 128 * c;
    let ds = if rest >= 128 {
        load_f16x4(scales, 128 / G)
    } else {
        load_f16x4(scales, rest.div_ceil(G))
    };
    _mm512_permutexvar_ps(gidx, _mm512_castps128_ps512(ds))
}

/// The low and the high nibbles of the 64 bytes `v`, as bytes `0..15`.
#[inline(always)]
unsafe fn nibbles_avx512(v: __m512i) -> (__m512i, __m512i) {
    let low = _mm512_set1_epi8(0x0f);
    (
        _mm512_and_si512(v, low),
        _mm512_and_si512(_mm512_srli_epi16(v, 4), low),
    )
}

/// [`nibbles_avx512`] with GFNI: the high nibbles in one `vgf2p8affineqb` instead of a
/// shift and a mask, one instruction fewer per 128 codes of the decode kernel.
///
/// The affine map multiplies each byte, as a vector of bits, by an 8×8 bit matrix: output
/// bit `i` is the parity of the input byte and-ed with byte `7 − i` of the matrix. Bytes
/// 7..4 select input bits 4..7 for output bits 0..3; bytes 3..0 are zero, clearing bits
/// 4..7 (Intel SDM, GF2P8AFFINEQB).
#[inline(always)]
unsafe fn nibbles_avx512_gfni(v: __m512i) -> (__m512i, __m512i) {
    const HIGH_NIBBLE: i64 = 0x1020_4080_0000_0000;
    (
        _mm512_and_si512(v, _mm512_set1_epi8(0x0f)),
        _mm512_gf2p8affine_epi64_epi8::<0>(v, _mm512_set1_epi64(HIGH_NIBBLE)),
    )
}

/// The scales `d_g` (f16 at `p`) of 16 blocks of 32 values, a quad of 4 chunks, one per
/// lane: lane `b` holds the scale of the group of block `b`.
#[inline(always)]
unsafe fn block_scales_avx512<const G: usize>(p: *const u8) -> __m512 {
    match G {
        32 => _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)),
        64 => _mm512_permutexvar_ps(
            _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
            _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))),
        ),
        _ => _mm512_permutexvar_ps(
            _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
            _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64(p as *const __m128i))),
        ),
    }
}

/// `Σ q_w · q_x` of each lane (4 values of the low and 4 of the high half of a chunk),
/// exact: `|Σ| ≤ 8 · 15 · 127`.
#[inline(always)]
unsafe fn dot_i4_avx512((lo, hi): (__m512i, __m512i), alo: __m512i, ahi: __m512i) -> __m512i {
    let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, alo);
    _mm512_dpbusd_epi32(p, hi, ahi)
}

macro_rules! by_tile {
    ($self:ident, $kernel:ident, $r:expr, $t:expr, $yt:ident) => {
        match ($r, $t) {
            (1, 1) => $self.$kernel::<1, 1>($yt),
            (1, 2) => $self.$kernel::<1, 2>($yt),
            (1, 3) => $self.$kernel::<1, 3>($yt),
            (1, _) => $self.$kernel::<1, 4>($yt),
            (_, 1) => $self.$kernel::<4, 1>($yt),
            (_, 2) => $self.$kernel::<4, 2>($yt),
            (_, 3) => $self.$kernel::<4, 3>($yt),
            (_, _) => $self.$kernel::<4, 4>($yt),
        }
    };
}

/// Runs `$call` (a kernel computing `$out` for the tile `$tile`) on each tile of `$self`
/// and stores the results in `$yt`, all in the calling function, whose target features
/// the kernel then inherits.
macro_rules! each_tile {
    ($self:ident, $yt:ident, $r:expr, $t:expr, |$tile:ident, $out:ident| $call:expr) => {{
        let n = $self.acts.n;
        let step = if $self.stride == 1 { $r } else { 1 };
        for s in 0..$self.tiles {
            let $tile = Tile {
                j: $self.j + s * step,
                ..*$self
            };
            let mut $out = [[0.0f32; 4]; TILE_ROWS];
            $call;
            for r in 0..$r {
                let y = &mut $yt[($self.loc + s * step + r * $self.stride) * n + $self.i..][..$t];
                for t in 0..$t {
                    y[t] = $out[r][t];
                }
            }
        }
    }};
}

macro_rules! by_tile_avx2 {
    ($self:ident, $kernel:ident, $vnni:literal, $r:expr, $t:expr, $yt:ident) => {
        match ($r, $t) {
            (1, 1) => $self.$kernel::<1, 1, $vnni>($yt),
            (1, _) => $self.$kernel::<1, 2, $vnni>($yt),
            (_, 1) => $self.$kernel::<4, 1, $vnni>($yt),
            (_, _) => $self.$kernel::<4, 2, $vnni>($yt),
        }
    };
}

/// [`super::quantize_block`] with AVX-512: the same bits.
#[inline(always)]
pub(super) unsafe fn quantize_block_avx512(
    values: &[f32],
    lo: &mut [i8],
    hi: &mut [i8],
) -> (f32, i32) {
    let n = values.len().min(32);
    let m0: __mmask16 = if n >= 16 { 0xffff } else { (1 << n) - 1 };
    let m1: __mmask16 = if n >= 32 {
        0xffff
    } else {
        (1u32 << n.saturating_sub(16)) as u16 - 1
    };
    // Masked-off lanes are neither read nor faulted on.
    let v0 = _mm512_maskz_loadu_ps(m0, values.as_ptr());
    let v1 = _mm512_maskz_loadu_ps(m1, values.as_ptr().wrapping_add(16));
    let inf = _mm512_set1_ps(f32::INFINITY);
    let finite = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_abs_ps(v0), inf)
        & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_abs_ps(v1), inf);
    if finite != 0xffff {
        return super::non_finite_block(lo, hi);
    }
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    let d = amax / 127.0;
    let inv = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
    let q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));
    let q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
    _mm_storeu_si128(lo.as_mut_ptr() as *mut __m128i, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(hi.as_mut_ptr() as *mut __m128i, _mm512_cvtepi32_epi8(q1));
    (d, _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)))
}

/// [`super::quantize_block`] with AVX2: the same bits.
#[inline(always)]
pub(super) unsafe fn quantize_block_avx2(
    values: &[f32],
    lo: &mut [i8],
    hi: &mut [i8],
) -> (f32, i32) {
    let mut padded = [0.0f32; 32];
    let p = if values.len() >= 32 {
        values.as_ptr()
    } else {
        padded[..values.len()].copy_from_slice(values);
        padded.as_ptr()
    };
    let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(p.add(8 * i)));
    let sign = _mm256_set1_ps(-0.0);
    let a = |x: __m256| _mm256_andnot_ps(sign, x);
    let inf = _mm256_set1_ps(f32::INFINITY);
    let finite = v
        .iter()
        .fold(_mm256_castsi256_ps(_mm256_set1_epi32(-1)), |f, &x| {
            _mm256_and_ps(f, _mm256_cmp_ps::<_CMP_LT_OQ>(a(x), inf))
        });
    if _mm256_movemask_ps(finite) != 0xff {
        return super::non_finite_block(lo, hi);
    }
    let m = _mm256_max_ps(
        _mm256_max_ps(a(v[0]), a(v[1])),
        _mm256_max_ps(a(v[2]), a(v[3])),
    );
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    let d = _mm_cvtss_f32(m) / 127.0;
    let inv = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
    let q: [__m256i; 4] = std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv)));
    // Pack to bytes (lane-wise), then restore the order as ggml's quantize_row_q8_0 does.
    let w = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    let w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm_storeu_si128(lo.as_mut_ptr() as *mut __m128i, _mm256_castsi256_si128(w));
    _mm_storeu_si128(
        hi.as_mut_ptr() as *mut __m128i,
        _mm256_extracti128_si256(w, 1),
    );
    let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    (d, _mm_cvtsi128_si32(s))
}

/// `Σ_i f16(m[i]) · g[i]` over `g.len()` values, each term also times `f16(d[i])` when
/// `d` is given (the zero points times the scales of an int4-zp row, see `Int4Row`).
#[inline(always)]
unsafe fn dot_f16_f32_avx2(m: *const u8, d: Option<*const u8>, g: &[f32]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for c in 0..g.len().div_ceil(8) {
        let count = (g.len() - 8 * c).min(8);
        let mut mv = load_f16x8(m.add(16 * c), count);
        if let Some(d) = d {
            mv = _mm256_mul_ps(mv, load_f16x8(d.add(16 * c), count));
        }
        let gv = if count == 8 {
            _mm256_loadu_ps(g.as_ptr().add(8 * c))
        } else {
            let mut gb = [0f32; 8];
            gb[..count].copy_from_slice(&g[8 * c..]);
            _mm256_loadu_ps(gb.as_ptr())
        };
        acc = _mm256_fmadd_ps(mv, gv, acc);
    }
    hsum256(acc)
}

/// Loads `count` (1 to 8) f16 values at `p` as the low lanes of an f32 vector (the other
/// lanes zero).
#[inline(always)]
unsafe fn load_f16x8(p: *const u8, count: usize) -> __m256 {
    if count == 8 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    } else {
        let mut b = [0u16; 8];
        std::ptr::copy_nonoverlapping(p, b.as_mut_ptr() as *mut u8, 2 * count);
        _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr() as *const __m128i))
    }
}

#[inline(always)]
pub(super) unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Loads `count` (1 to 4) f16 values at `p` as the low lanes of an f32 vector (the other
/// lanes zero).
#[inline(always)]
unsafe fn load_f16x4(p: *const u8, count: usize) -> __m128 {
    let v = match count {
        4 => _mm_loadl_epi64(p as *const __m128i),
        2 => _mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)),
        1 => _mm_cvtsi32_si128(i32::from(std::ptr::read_unaligned(p as *const u16))),
        _ => {
            let mut b = [0u16; 8];
            std::ptr::copy_nonoverlapping(p, b.as_mut_ptr() as *mut u8, 2 * count);
            _mm_loadu_si128(b.as_ptr() as *const __m128i)
        }
    };
    _mm_cvtph_ps(v)
}

/// The low and the high nibbles of the 32 bytes `v`, as bytes `0..15`.
#[inline(always)]
unsafe fn nibbles_avx2(v: __m256i) -> (__m256i, __m256i) {
    let low = _mm256_set1_epi8(0x0f);
    (
        _mm256_and_si256(v, low),
        _mm256_and_si256(_mm256_srli_epi16(v, 4), low),
    )
}

/// The scales `d_g` (f16 at `p`) of 8 blocks of 32 values, a quad of 4 AVX2 chunks, one per
/// lane: lane `b` holds the scale of the group of block `b`.
#[inline(always)]
unsafe fn block_scales_avx2<const G: usize>(p: *const u8) -> __m256 {
    match G {
        32 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
        64 => _mm256_permutevar8x32_ps(
            _mm256_castps128_ps256(_mm_cvtph_ps(_mm_loadl_epi64(p as *const __m128i))),
            _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3),
        ),
        _ => _mm256_permutevar8x32_ps(
            _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(
                p as *const i32,
            )))),
            _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1),
        ),
    }
}

/// `Σ q_w · q_x` of each lane (4 values of the low and 4 of the high half of a chunk),
/// exact: `|Σ| ≤ 8 · 15 · 127`.
#[inline(always)]
unsafe fn dot_i4_avx2<const VNNI: bool>(
    (lo, hi): (__m256i, __m256i),
    alo: __m256i,
    ahi: __m256i,
) -> __m256i {
    let zero = _mm256_setzero_si256();
    if VNNI {
        dot_u8_i8::<true>(dot_u8_i8::<true>(zero, lo, alo), hi, ahi)
    } else {
        // Both products fit in i16 (|15·127·2| ≤ 3810), so add them first.
        let ones = _mm256_set1_epi16(1);
        let s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi));
        _mm256_madd_epi16(s, ones)
    }
}

/// `vpdpbusd` on 256 bits, or its AVX2 equivalent (`vpmaddubsw` then `vpmaddwd` with ones),
/// valid while `u · s` pair sums fit in i16.
#[inline(always)]
unsafe fn dot_u8_i8<const VNNI: bool>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_avx_epi32(acc, u, s)
    } else {
        let ones = _mm256_set1_epi16(1);
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones))
    }
}

impl Tile<'_> {
    /// The codes and the block scales of the tile's `T` input rows, each padded to whole
    /// chunks (see `Acts`).
    #[inline(always)]
    fn input_rows<const T: usize>(&self) -> ([*const i8; T], [*const f32; T]) {
        (
            std::array::from_fn(|t| self.acts.row_qs(self.i + t).as_ptr()),
            std::array::from_fn(|t| self.acts.row_d(self.i + t).as_ptr()),
        )
    }

    /// Prefetches the line [`Tile::ahead`] bytes past the weight byte at `p`.
    ///
    /// In decode (`once`) the hint is non-temporal: the weights stream through once per
    /// call, and each prefetch leads its load by a few KiB, so L1 holds the line until it
    /// is read and the stream need not fill the outer caches (a few % faster than
    /// `_MM_HINT_T0` with AVX-512, docs/benchmarks.md). Otherwise (prefill) the tile's rows
    /// are read again for each tile of
    /// inputs, so they are prefetched into every cache level.
    #[inline(always)]
    unsafe fn prefetch_ahead(&self, p: *const u8) {
        let p = p.wrapping_add(self.ahead) as *const i8;
        if self.once {
            _mm_prefetch::<_MM_HINT_NTA>(p);
        } else {
            _mm_prefetch::<_MM_HINT_T0>(p);
        }
    }

    /// [`Tile::prefetch_ahead`] in int4 decode, which reads each thread's rows as one stream
    /// [`ONE_STREAM_AHEAD`] bytes ahead with the non-temporal hint (see [`rows`]): the
    /// constant distance folds into the prefetch's address, where reading `once` and `ahead`
    /// from the tile cost 4 instructions per prefetch, a quarter of an AVX-512 chunk's.
    #[inline(always)]
    unsafe fn prefetch_stream(p: *const u8) {
        _mm_prefetch::<_MM_HINT_NTA>(p.wrapping_add(ONE_STREAM_AHEAD) as *const i8);
    }

    /// Runs the tiles of `r` (1 or 4) weight rows × `t` input rows, writing their outputs
    /// into the task's `yt`.
    ///
    /// # Safety
    /// The CPU must support `isa`, one of the x86 levels.
    unsafe fn run(&self, isa: Isa, r: usize, t: usize, yt: &mut [f32]) {
        match isa {
            Isa::Avx512 if self.unpacked.is_empty() => {
                if is_x86_feature_detected!("gfni") {
                    by_tile!(self, i4_avx512_gfni, r, t, yt)
                } else {
                    by_tile!(self, i4_avx512, r, t, yt)
                }
            }
            Isa::Avx512 => by_tile!(self, i4_avx512_unpacked, r, t, yt),
            Isa::AvxVnni => by_tile_avx2!(self, i4_avxvnni, true, r, t, yt),
            _ => by_tile_avx2!(self, i4_avx2, false, r, t, yt),
        }
    }

    /// The weight rows of the first tile.
    #[inline(always)]
    fn rows<const R: usize>(&self) -> [&[u8]; R] {
        let mut rows = [&[][..]; R];
        for (r, row) in rows.iter_mut().enumerate() {
            *row = self.w.row(self.j + r * self.stride);
        }
        rows
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn i4_avx512<const R: usize, const T: usize>(&self, yt: &mut [f32]) {
        self.i4_avx512_body::<R, T, false>(yt)
    }

    /// [`Tile::i4_avx512`] on CPUs with GFNI (see [`nibbles_avx512_gfni`]).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,gfni")]
    unsafe fn i4_avx512_gfni<const R: usize, const T: usize>(&self, yt: &mut [f32]) {
        self.i4_avx512_body::<R, T, true>(yt)
    }

    /// [`Tile::i4_avx512_groups`] for the weights' group size.
    #[inline(always)]
    unsafe fn i4_avx512_body<const R: usize, const T: usize, const GFNI: bool>(
        &self,
        yt: &mut [f32],
    ) {
        match self.w.dtype.group_size() {
            Some(32) => each_tile!(self, yt, R, T, |tile, out| tile
                .i4_avx512_groups::<R, T, 32, GFNI>(&mut out)),
            Some(64) => each_tile!(self, yt, R, T, |tile, out| tile
                .i4_avx512_groups::<R, T, 64, GFNI>(&mut out)),
            _ => each_tile!(self, yt, R, T, |tile, out| tile
                .i4_avx512_groups::<R, T, 128, GFNI>(&mut out)),
        }
    }

    /// [`Tile::i4_avx512`] on the first tile, for groups of `G` values.
    ///
    /// Reads the tile's rows one after another, each in memory order (its codes, then its
    /// scale lines), as one stream when the rows are adjacent, and scales each chunk's exact
    /// integer dot products as they are formed: a quad of 4 chunks (16 blocks) converts the
    /// scales of its 16 blocks at once, the chunks past the whole quads theirs one chunk at a
    /// time. Each output's accumulator takes its chunks in order, so the bits are those of
    /// any other tile shape. The minimum terms and the horizontal sums of the tile's rows are
    /// then formed together in [`Tile::finish_i4_avx512`], a cost paid once per tile of
    /// `R` rows rather than once per row. Only decode runs it (prefill unpacks its rows
    /// first), so it prefetches with [`Tile::prefetch_stream`].
    #[inline(always)]
    unsafe fn i4_avx512_groups<const R: usize, const T: usize, const G: usize, const GFNI: bool>(
        &self,
        out: &mut [[f32; 4]; TILE_ROWS],
    ) {
        let kp = self.w.kp;
        let rows = self.rows::<R>();
        let idx4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        // Lane `l` of chunk `q` of a quad takes the scale of the quad's block `4q + l / 4`.
        let idxq: [__m512i; 4] =
            std::array::from_fn(|q| _mm512_add_epi32(idx4, _mm512_set1_epi32(4 * q as i32)));
        let (qs, ds) = self.input_rows::<T>();
        let chunks = kp.div_ceil(128);
        let quad_chunks = 4 * (kp / 512);
        let scale_lines = (self.w.row_bytes - kp / 2).div_ceil(64);
        let mut acc = [[_mm512_setzero_ps(); T]; R];
        for r in 0..R {
            let row = rows[r].as_ptr();
            let scales = row.add(kp / 2);
            for quad in 0..quad_chunks / 4 {
                let dwb = block_scales_avx512::<G>(scales.add(1024 * quad / G));
                let mut s16 = [_mm512_setzero_ps(); T];
                for t in 0..T {
                    s16[t] = _mm512_mul_ps(dwb, _mm512_loadu_ps(ds[t].add(16 * quad)));
                }
                for q in 0..4 {
                    let c = 4 * quad + q;
                    let p = row.add(64 * c);
                    Self::prefetch_stream(p);
                    let v = _mm512_loadu_si512(p as *const _);
                    let codes = if GFNI {
                        nibbles_avx512_gfni(v)
                    } else {
                        nibbles_avx512(v)
                    };
                    for t in 0..T {
                        let a = qs[t].add(128 * c);
                        let alo = _mm512_loadu_si512(a as *const _);
                        let ahi = _mm512_loadu_si512(a.add(64) as *const _);
                        let p = _mm512_cvtepi32_ps(dot_i4_avx512(codes, alo, ahi));
                        let s = _mm512_permutexvar_ps(idxq[q], s16[t]);
                        acc[r][t] = _mm512_fmadd_ps(p, s, acc[r][t]);
                    }
                }
            }
            for c in quad_chunks..chunks {
                Self::prefetch_stream(row.add(64 * c));
                let codes = chunk_codes_avx512(row, kp, c);
                let dw = chunk_scales_avx512::<G>(row, kp, c);
                for t in 0..T {
                    let a = qs[t].add(128 * c);
                    let alo = _mm512_loadu_si512(a as *const _);
                    let ahi = _mm512_loadu_si512(a.add(64) as *const _);
                    let d = _mm_loadu_ps(ds[t].add(4 * c));
                    let das = _mm512_permutexvar_ps(idx4, _mm512_castps128_ps512(d));
                    let p = _mm512_cvtepi32_ps(dot_i4_avx512(codes, alo, ahi));
                    acc[r][t] = _mm512_fmadd_ps(p, _mm512_mul_ps(dw, das), acc[r][t]);
                }
            }
            for l in 0..scale_lines {
                Self::prefetch_stream(scales.wrapping_add(64 * l));
            }
        }
        self.finish_i4_avx512(&rows, &acc, out);
    }

    /// The int4 tiles over rows unpacked by [`unpack_i4_avx512`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn i4_avx512_unpacked<const R: usize, const T: usize>(&self, yt: &mut [f32]) {
        each_tile!(self, yt, R, T, |tile, out| tile
            .i4_avx512_unpacked_tile::<R, T>(&mut out))
    }

    /// [`Tile::i4_avx512_unpacked`] on the first tile.
    #[inline(always)]
    unsafe fn i4_avx512_unpacked_tile<const R: usize, const T: usize>(
        &self,
        out: &mut [[f32; 4]; TILE_ROWS],
    ) {
        let kp = self.w.kp;
        let rows = self.rows::<R>();
        let idx4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        let mut acc = [[_mm512_setzero_ps(); T]; R];
        for c in 0..kp.div_ceil(128) {
            let mut alo = [_mm512_setzero_si512(); T];
            let mut ahi = [_mm512_setzero_si512(); T];
            let mut da = [_mm512_setzero_ps(); T];
            for t in 0..T {
                let i = self.i + t;
                let a = self.acts.row_qs(i).as_ptr().add(128 * c);
                alo[t] = _mm512_loadu_si512(a as *const _);
                ahi[t] = _mm512_loadu_si512(a.add(64) as *const _);
                let d = _mm_loadu_ps(self.acts.row_d(i).as_ptr().add(4 * c));
                da[t] = _mm512_permutexvar_ps(idx4, _mm512_castps128_ps512(d));
            }
            for r in 0..R {
                let u = &self.unpacked[3 * (c * R + r)..][..3];
                let dw = _mm512_castsi512_ps(u[2]);
                for t in 0..T {
                    let p = _mm512_cvtepi32_ps(dot_i4_avx512((u[0], u[1]), alo[t], ahi[t]));
                    let s = _mm512_mul_ps(dw, da[t]);
                    acc[r][t] = _mm512_fmadd_ps(p, s, acc[r][t]);
                }
            }
        }
        self.finish_i4_avx512(&rows, &acc, out);
    }

    /// Adds the minimum terms `Σ_g m_g · gsum_g` (`m_g` as `Int4Row` reads it) to the int4 accumulators, lane by
    /// lane, and reduces each to its output. Each row's f16 factors `m_g` are widened once
    /// for all the tile's inputs, and each output takes one horizontal reduction. When every
    /// output reduced its products and its minimum terms apart and widened the factors
    /// again, this took about a quarter of a prefill tile's instructions (docs/benchmarks.md,
    /// "Kernel choices").
    #[inline(always)]
    unsafe fn finish_i4_avx512<const R: usize, const T: usize>(
        &self,
        rows: &[&[u8]; R],
        acc: &[[__m512; T]; R],
        out: &mut [[f32; 4]; TILE_ROWS],
    ) {
        let mins_at = int4_mins(self.w.dtype, self.w.kp);
        let gsums: [&[f32]; T] = std::array::from_fn(|t| self.acts.row_gsum(self.i + t));
        let groups = gsums[0].len();
        for r in 0..R {
            let ms = rows[r].as_ptr().add(mins_at.offset);
            let scales = rows[r].as_ptr().add(self.w.kp / 2);
            let mut mins = [_mm512_setzero_ps(); T];
            for g0 in (0..groups).step_by(16) {
                // Masked-off lanes are neither read nor faulted on.
                let mask: __mmask16 = if groups - g0 >= 16 {
                    !0
                } else {
                    (1 << (groups - g0)) - 1
                };
                let mut mv =
                    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, ms.add(2 * g0) as *const i16));
                if mins_at.times_scale {
                    let d = _mm256_maskz_loadu_epi16(mask, scales.add(2 * g0) as *const i16);
                    mv = _mm512_mul_ps(mv, _mm512_cvtph_ps(d));
                }
                for t in 0..T {
                    let gv = _mm512_maskz_loadu_ps(mask, gsums[t].as_ptr().add(g0));
                    mins[t] = _mm512_fmadd_ps(mv, gv, mins[t]);
                }
            }
            for t in 0..T {
                let sum = _mm512_fmadd_ps(mins[t], _mm512_set1_ps(mins_at.factor), acc[r][t]);
                out[r][t] = _mm512_reduce_add_ps(sum);
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn i4_avx2<const R: usize, const T: usize, const VNNI: bool>(&self, yt: &mut [f32]) {
        self.i4_avx2_groups::<R, T, VNNI>(yt)
    }

    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    unsafe fn i4_avxvnni<const R: usize, const T: usize, const VNNI: bool>(&self, yt: &mut [f32]) {
        self.i4_avx2_groups::<R, T, VNNI>(yt)
    }

    /// [`Tile::i4_avx2_body`] for the tile's [`Tile::once`].
    #[inline(always)]
    unsafe fn i4_avx2_groups<const R: usize, const T: usize, const VNNI: bool>(
        &self,
        yt: &mut [f32],
    ) {
        if self.once {
            self.i4_avx2_group_size::<R, T, VNNI, true>(yt)
        } else {
            self.i4_avx2_group_size::<R, T, VNNI, false>(yt)
        }
    }

    /// [`Tile::i4_avx2_body`] for the weights' group size.
    #[inline(always)]
    unsafe fn i4_avx2_group_size<
        const R: usize,
        const T: usize,
        const VNNI: bool,
        const ONCE: bool,
    >(
        &self,
        yt: &mut [f32],
    ) {
        match self.w.dtype.group_size() {
            Some(32) => each_tile!(self, yt, R, T, |tile, out| tile
                .i4_avx2_body::<R, T, VNNI, 32, ONCE>(&mut out)),
            Some(64) => each_tile!(self, yt, R, T, |tile, out| tile
                .i4_avx2_body::<R, T, VNNI, 64, ONCE>(&mut out)),
            _ => each_tile!(self, yt, R, T, |tile, out| tile
                .i4_avx2_body::<R, T, VNNI, 128, ONCE>(&mut out)),
        }
    }

    /// int4 on 256 bits: 64 values (two blocks) per chunk, groups of `G` values, in the
    /// order of [`Tile::i4_avx512_groups`]: the tile's rows one after another, each in memory
    /// order, each chunk scaled as it arrives. Whole quads of 4 chunks (256 values, 8 blocks)
    /// load their scales once and multiply them by the inputs' 8 block scales in one vector;
    /// a chunk then permutes its lanes out of it. The products and the accumulation order are
    /// those of single chunks, so a row's output does not depend on the tile. `ONCE` is
    /// [`Tile::once`]: decode prefetches with [`Tile::prefetch_stream`].
    #[inline(always)]
    unsafe fn i4_avx2_body<
        const R: usize,
        const T: usize,
        const VNNI: bool,
        const G: usize,
        const ONCE: bool,
    >(
        &self,
        out: &mut [[f32; 4]; TILE_ROWS],
    ) {
        let prefetch = |p: *const u8| {
            if ONCE {
                Self::prefetch_stream(p)
            } else {
                self.prefetch_ahead(p)
            }
        };
        let kp = self.w.kp;
        let rows = self.rows::<R>();
        let idx2 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
        // Lane `l` of chunk `q` of a quad takes the scale of the quad's block `2q + l / 4`.
        let idxq: [__m256i; 4] =
            std::array::from_fn(|q| _mm256_add_epi32(idx2, _mm256_set1_epi32(2 * q as i32)));
        let (qs, ds) = self.input_rows::<T>();
        let chunks = kp.div_ceil(64);
        let quad_chunks = 4 * (kp / 256);
        let scale_lines = (self.w.row_bytes - kp / 2).div_ceil(64);
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        for r in 0..R {
            let row = rows[r].as_ptr();
            let scales = row.add(kp / 2);
            for quad in 0..quad_chunks / 4 {
                let dwb = block_scales_avx2::<G>(scales.add(512 * quad / G));
                let mut s8 = [_mm256_setzero_ps(); T];
                for t in 0..T {
                    s8[t] = _mm256_mul_ps(dwb, _mm256_loadu_ps(ds[t].add(8 * quad)));
                }
                for q in 0..4 {
                    let c = 4 * quad + q;
                    let p = row.add(32 * c);
                    // One prefetch per 64 bytes of codes.
                    if q % 2 == 0 {
                        prefetch(p);
                    }
                    let codes = nibbles_avx2(_mm256_loadu_si256(p as *const __m256i));
                    for t in 0..T {
                        let a = qs[t].add(64 * c);
                        let alo = _mm256_loadu_si256(a as *const __m256i);
                        let ahi = _mm256_loadu_si256(a.add(32) as *const __m256i);
                        let p = _mm256_cvtepi32_ps(dot_i4_avx2::<VNNI>(codes, alo, ahi));
                        let s = _mm256_permutevar8x32_ps(s8[t], idxq[q]);
                        acc[r][t] = _mm256_fmadd_ps(p, s, acc[r][t]);
                    }
                }
            }
            for c in quad_chunks..chunks {
                let p = row.add(32 * c);
                prefetch(p);
                // A row's last chunk may hold 32 values: 16 bytes of codes.
                let v = if kp - 64 * c >= 64 {
                    _mm256_loadu_si256(p as *const __m256i)
                } else {
                    _mm256_zextsi128_si256(_mm_loadu_si128(p as *const __m128i))
                };
                let codes = nibbles_avx2(v);
                let (g0, gn) = (64 * c / G, (kp - 64 * c).min(64).div_ceil(G));
                let gidx = if G == 32 {
                    idx2
                } else {
                    _mm256_setzero_si256()
                };
                let d = load_f16x4(scales.add(2 * g0), gn);
                let dw = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(d), gidx);
                for t in 0..T {
                    let a = qs[t].add(64 * c);
                    let alo = _mm256_loadu_si256(a as *const __m256i);
                    let ahi = _mm256_loadu_si256(a.add(32) as *const __m256i);
                    let d = _mm_castpd_ps(_mm_load_sd(ds[t].add(2 * c) as *const f64));
                    let da = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(d), idx2);
                    let p = _mm256_cvtepi32_ps(dot_i4_avx2::<VNNI>(codes, alo, ahi));
                    acc[r][t] = _mm256_fmadd_ps(p, _mm256_mul_ps(dw, da), acc[r][t]);
                }
            }
            for l in 0..scale_lines {
                prefetch(scales.wrapping_add(64 * l));
            }
        }
        let mins = int4_mins(self.w.dtype, kp);
        for r in 0..R {
            let ms = rows[r].as_ptr().add(mins.offset);
            let scales = mins.times_scale.then(|| rows[r].as_ptr().add(kp / 2));
            for t in 0..T {
                let gsum = self.acts.row_gsum(self.i + t);
                out[r][t] = hsum256(acc[r][t]) + mins.factor * dot_f16_f32_avx2(ms, scales, gsum);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gfni_nibbles_match_the_shift_and_mask() {
        if !(Isa::Avx512.is_supported() && is_x86_feature_detected!("gfni")) {
            eprintln!("skipped: this CPU lacks AVX-512 or GFNI");
            return;
        }
        #[target_feature(enable = "avx512f,avx512bw,gfni")]
        unsafe fn both(bytes: &[u8; 64]) -> [[u8; 64]; 4] {
            let v = _mm512_loadu_si512(bytes.as_ptr() as *const _);
            let (a, b) = nibbles_avx512(v);
            let (c, d) = nibbles_avx512_gfni(v);
            [a, b, c, d].map(|x| std::mem::transmute::<__m512i, [u8; 64]>(x))
        }
        for base in (0..256).step_by(64) {
            let bytes: [u8; 64] = std::array::from_fn(|i| (base + i) as u8);
            // SAFETY: AVX-512 and GFNI are present (checked above).
            let [lo, hi, lo_gfni, hi_gfni] = unsafe { both(&bytes) };
            assert_eq!((lo, hi), (lo_gfni, hi_gfni));
            assert!(hi.iter().zip(&bytes).all(|(&h, &b)| h == b >> 4));
        }
    }
}
