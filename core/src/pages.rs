//! Large zero-filled buffers on huge pages.
//!
//! Decode reads every weight once per token, so it streams the whole model through the
//! TLB: with 4 KiB pages that is a TLB miss every 4 KiB (a two-dimensional page walk under a
//! hypervisor), and the hardware prefetchers stop at every 4 KiB boundary. A 2 MiB page
//! removes both. [`HugeBuffer`] is a private anonymous mapping whose start is aligned to
//! 2 MiB and which Linux is asked (`madvise(MADV_HUGEPAGE)`, the `madvise` setting of
//! transparent huge pages) to back with huge pages before its first touch. Where the kernel
//! has no huge page to give, or on another Unix, it is an ordinary zero-filled mapping.
//! (Decode gains a few %: docs/benchmarks.md, "Kernel choices".)

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// The huge-page size of x86-64 and of AArch64 with 4 KiB base pages, in bytes.
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

/// A zero-filled, 2 MiB-aligned, read-write private anonymous mapping of `len` bytes.
///
/// Only whole 2 MiB pages inside it can be huge: a buffer of `n·2 MiB + r` bytes gets `n`
/// huge pages and `r` bytes of base pages, so no memory is spent past its end.
pub struct HugeBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns its mapping exclusively, like a `Vec<u8>`.
unsafe impl Send for HugeBuffer {}
// SAFETY: shared access is read-only through `&[u8]`.
unsafe impl Sync for HugeBuffer {}

impl HugeBuffer {
    /// Maps `len` zero bytes (`len > 0`), or `None` if the OS refuses the mapping (address
    /// space or memory exhausted).
    pub fn zeroed(len: usize) -> Option<HugeBuffer> {
        if len == 0 {
            return None;
        }
        let reserve = len.checked_add(HUGE_PAGE_BYTES)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let base = base as usize;
        let start = base.next_multiple_of(HUGE_PAGE_BYTES);
        let page = page_size();
        let end = (start + len).next_multiple_of(page);
        // SAFETY: both ranges lie inside the reservation just made and are page-aligned
        // (mmap returns page-aligned memory; `start` and `end` are multiples of the page
        // size); trimming them leaves exactly [start, end) mapped.
        unsafe {
            if start > base {
                libc::munmap(base as *mut libc::c_void, start - base);
            }
            if base + reserve > end {
                libc::munmap(end as *mut libc::c_void, base + reserve - end);
            }
        }
        #[cfg(target_os = "linux")]
        // SAFETY: advice on memory this buffer owns. It is advisory: on failure (huge pages
        // disabled, or a kernel without them) the pages stay 4 KiB and work the same.
        unsafe {
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        Some(HugeBuffer {
            ptr: NonNull::new(start as *mut u8)?,
            len,
        })
    }
}

/// The base page size in bytes.
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096).max(4096)
}

impl Deref for HugeBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points at `len` mapped, initialised (zero-filled) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for HugeBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for HugeBuffer {
    /// A copy in a new mapping; aborts like `Vec::clone` if memory is exhausted.
    fn clone(&self) -> HugeBuffer {
        let mut copy = HugeBuffer::zeroed(self.len).unwrap_or_else(|| {
            std::alloc::handle_alloc_error(std::alloc::Layout::for_value::<[u8]>(self))
        });
        copy.copy_from_slice(self);
        copy
    }
}

impl Drop for HugeBuffer {
    fn drop(&mut self) {
        let mapped = self.len.next_multiple_of(page_size());
        // SAFETY: unmaps exactly the range `zeroed` left mapped, once.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), mapped);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_zeroed_and_writable() {
        for len in [1, 4095, HUGE_PAGE_BYTES, 3 * HUGE_PAGE_BYTES + 12345] {
            let mut b = HugeBuffer::zeroed(len).unwrap();
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % HUGE_PAGE_BYTES, 0);
            assert!(b.iter().all(|&x| x == 0));
            b[len - 1] = 7;
            assert_eq!(b[len - 1], 7);
        }
        assert!(HugeBuffer::zeroed(0).is_none());
        let mut a = HugeBuffer::zeroed(HUGE_PAGE_BYTES + 1).unwrap();
        a[HUGE_PAGE_BYTES] = 9;
        let b = a.clone();
        a[HUGE_PAGE_BYTES] = 1;
        assert_eq!((b[HUGE_PAGE_BYTES], b.len()), (9, a.len()));
    }
}
