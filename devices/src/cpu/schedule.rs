//! Work splitting of the CPU device's Linears over the rayon thread pool.

use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

/// Most parts (weight matrices sharing one input, such as Q, K and V, or the gate and up
/// projections of a decode step's routed experts, 8 of each at most in the models flm
/// runs) one Linear call multiplies at once.
pub(crate) const MAX_PARTS: usize = 16;

/// Runs `f(p, j0, rows)` over the rows of every `outs[p]` (`n` values each; `rows` is
/// rows `j0..` of `outs[p]`) on every thread of the pool, by guided self-scheduling
/// (Polychronopoulos & Kuck, "Guided Self-Scheduling", IEEE Trans. Computers 1987): each
/// thread claims chunks of `1 / threads` of the rows left in all parts, in whole
/// multiples of `granule` rows and within one part, until none is left. At most
/// [`MAX_PARTS`] parts.
///
/// Decode chunks start long, so that a chunk's rows form long streams (see
/// `qlinear::x86::rows`), and end short, so that the threads finish together (equal tasks
/// left them idle part of the time); a thread that starts late, or is slowed down by another
/// process, claims fewer chunks. `1 / threads` rather than the classic `1 / (2 · threads)`
/// because each chunk pays to start its streams anew (docs/benchmarks.md, "Kernel choices").
///
/// The int8/int4 decode kernels of `qlinear` and the float ones of `linear` split their
/// rows this way. Nothing is allocated.
pub(super) fn guided(
    outs: &mut [&mut [f32]],
    n: usize,
    granule: usize,
    f: impl Fn(usize, usize, &mut [f32]) + Sync,
) {
    /// The parts' rows, claimed by the threads.
    struct PartRows([(*mut f32, usize); MAX_PARTS]);
    // SAFETY: the threads write disjoint rows (see below).
    unsafe impl Sync for PartRows {}
    impl PartRows {
        /// Rows `j0..j1` of part `p`.
        ///
        /// # Safety
        /// They must lie within the part and be claimed by the caller alone.
        #[allow(clippy::mut_from_ref)]
        unsafe fn part(&self, p: usize, j0: usize, j1: usize, n: usize) -> &mut [f32] {
            std::slice::from_raw_parts_mut(self.0[p].0.add(j0 * n), (j1 - j0) * n)
        }
    }
    debug_assert!(outs.len() <= MAX_PARTS, "{} parts", outs.len());
    let threads = rayon::current_num_threads();
    if threads == 1 {
        for (p, out) in outs.iter_mut().enumerate() {
            f(p, 0, out);
        }
        return;
    }
    let mut rows = PartRows([(std::ptr::null_mut(), 0); MAX_PARTS]);
    for (r, out) in rows.0.iter_mut().zip(outs.iter_mut()) {
        *r = (out.as_mut_ptr(), out.len() / n);
    }
    let total: usize = outs.iter().map(|o| o.len() / n).sum();
    // Rows claimed so far, counting the parts one after another.
    let next = AtomicUsize::new(0);
    let claim = || loop {
        let g0 = next.load(Ordering::Relaxed);
        if g0 >= total {
            return;
        }
        let (mut p, mut j0) = (0, g0);
        while j0 >= rows.0[p].1 {
            j0 -= rows.0[p].1;
            p += 1;
        }
        let size = (total - g0).div_ceil(threads).next_multiple_of(granule);
        let j1 = (j0 + size).min(rows.0[p].1);
        if next
            .compare_exchange_weak(g0, g0 + j1 - j0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            // SAFETY: the exchange hands rows `j0..j1` of part `p` to this thread alone,
            // and they lie within `outs[p]`, which outlives the threads' work.
            f(p, j0, unsafe { rows.part(p, j0, j1, n) });
        }
    };
    (0..threads).into_par_iter().for_each(|_| claim());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Also a check of the raw-pointer splitting under Miri, which passes it with Tree
    /// Borrows (`MIRIFLAGS="-Zmiri-tree-borrows -Zmiri-permissive-provenance
    /// -Zmiri-ignore-leaks" cargo +nightly miri test -p flm-devices --lib schedule`; the
    /// leaks are the pool's threads, still alive at exit; under Stacked Borrows, Miri
    /// reports undefined behaviour inside crossbeam-epoch, rayon's dependency, not here).
    #[test]
    fn every_row_of_every_part_is_claimed_once() {
        let n = 3;
        let mut parts: Vec<Vec<f32>> = [37, 5, 64].iter().map(|&m| vec![0.0; m * n]).collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        pool.install(|| {
            let mut outs: Vec<&mut [f32]> = parts.iter_mut().map(Vec::as_mut_slice).collect();
            guided(&mut outs, n, 4, |p, j0, rows| {
                for (dj, row) in rows.chunks_exact_mut(n).enumerate() {
                    for y in row {
                        *y += (p * 1000 + j0 + dj) as f32;
                    }
                }
            });
        });
        for (p, part) in parts.iter().enumerate() {
            for (j, row) in part.chunks_exact(n).enumerate() {
                assert!(
                    row.iter().all(|&y| y == (p * 1000 + j) as f32),
                    "part {p}, row {j}: {row:?}"
                );
            }
        }
    }
}
