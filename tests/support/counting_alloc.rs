//! A global allocator that tallies, per thread, the allocations made and
//! the bytes allocated and freed, then defers to the system allocator.
//! Per thread because tests run in parallel: a global tally would pick up
//! the other tests' allocations.
//!
//! A test binary that counts includes this file by path and installs it:
//! `#[global_allocator] static GLOBAL: Counting = Counting;`.

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts, then defers to [`System`].
pub struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static ALLOCATED: Cell<u64> = const { Cell::new(0) };
    static FREED: Cell<u64> = const { Cell::new(0) };
}

fn add(cell: &'static std::thread::LocalKey<Cell<u64>>, n: usize) {
    // `try_with`: allocations can happen while a thread's locals are being
    // torn down, when they can no longer be counted (nor matter here).
    let _ = cell.try_with(|c| c.set(c.get() + n as u64));
}

// SAFETY: every method forwards to `System` with the arguments it was given;
// counting touches only const-initialised thread-locals without destructors,
// which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(&ALLOCATIONS, 1);
        add(&ALLOCATED, layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        add(&ALLOCATIONS, 1);
        add(&ALLOCATED, layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(&ALLOCATIONS, 1);
        add(&FREED, layout.size());
        add(&ALLOCATED, new_size);
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(&FREED, layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::dealloc`'s contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// What the current thread allocated while running something: how many
/// allocations (a `realloc` counts as one) and their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocated {
    pub count: u64,
    pub bytes: u64,
}

/// No allocation at all.
pub const NOTHING: Allocated = Allocated { count: 0, bytes: 0 };

/// What the current thread allocated while running `f`, and its result.
pub fn allocated_by<R>(f: impl FnOnce() -> R) -> (R, Allocated) {
    let count = ALLOCATIONS.with(Cell::get);
    let bytes = ALLOCATED.with(Cell::get);
    let result = f();
    let allocated = Allocated {
        count: ALLOCATIONS.with(Cell::get) - count,
        bytes: ALLOCATED.with(Cell::get) - bytes,
    };
    (result, allocated)
}

/// Bytes the current thread holds now, net of what it freed.
pub fn live() -> i64 {
    ALLOCATED.with(Cell::get) as i64 - FREED.with(Cell::get) as i64
}
