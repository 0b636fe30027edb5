//! The module's own heap, counted: the library's global allocator is the system allocator
//! with two counters, so the metrics can say how many bytes (and blocks) the module's code holds
//! at any moment, apart from everything else in the agent's process.
//!
//! Facts relied on: a Rust `cdylib` routes every allocation of its own Rust code through its
//! `#[global_allocator]` and nothing else does (the agent's C++ code, glibc, NVML allocate
//! through `malloc` directly), so the counters hold the Rust library's share of the agent's
//! heap. The C++ shim (`ffi/mesos-module`) is not counted: it keeps no state per container.
//! The system allocator is glibc's `malloc`, as before; the counters cost two relaxed atomic
//! adds per call (a 64-byte `alloc` + `dealloc` measured 116-139 ns counted against 115-125 ns
//! plain on the 2-core build VM: within its noise).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting what is live.
struct Counted;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static LIVE_BLOCKS: AtomicUsize = AtomicUsize::new(0);

// Not in this crate's own unit tests: they link the library a second time (the dev-dependency
// with the `testing` feature), whose allocator is the global one there.
#[cfg_attr(not(test), global_allocator)]
static HEAP: Counted = Counted;

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract `System` meets is met; the counters are updated only when `System`
// succeeded and never affect what is returned.
unsafe impl GlobalAlloc for Counted {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller meets `alloc`'s contract (non-zero size), which we pass on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator (that is, by `System`) with `layout`,
        // as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        LIVE_BLOCKS.fetch_sub(1, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout` and `new_size` is non-zero and
        // fits `isize` once rounded, as the caller guarantees.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

/// Bytes the module's code holds on the heap now, and in how many blocks.
pub(crate) fn live() -> (usize, usize) {
    (
        LIVE_BYTES.load(Ordering::Relaxed),
        LIVE_BLOCKS.load(Ordering::Relaxed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_is_live() {
        // In this test binary `HEAP` is not the global allocator: only this test moves the
        // counters.
        let before = live();
        let small = Layout::from_size_align(24, 8).unwrap_or_else(|_| unreachable!());
        let big = Layout::from_size_align(4096, 64).unwrap_or_else(|_| unreachable!());
        // SAFETY: non-zero sizes; each block is freed once, with the layout it has.
        unsafe {
            let a = HEAP.alloc(small);
            let b = HEAP.alloc_zeroed(big);
            assert!(!a.is_null() && !b.is_null());
            assert_eq!(live(), (before.0 + 24 + 4096, before.1 + 2));
            let a = HEAP.realloc(a, small, 100);
            assert!(!a.is_null());
            assert_eq!(live(), (before.0 + 100 + 4096, before.1 + 2));
            HEAP.dealloc(b, big);
            HEAP.dealloc(
                a,
                Layout::from_size_align(100, 8).unwrap_or_else(|_| unreachable!()),
            );
        }
        assert_eq!(live(), before);
    }
}
