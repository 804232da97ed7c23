//! The one place that chooses between `std` and `loom` primitives.
//!
//! Every atomic in the statistics core is imported from here, so building
//! with `RUSTFLAGS="--cfg loom"` swaps them for loom's model-checked versions
//! without touching the code that uses them. Nothing else in the crate names
//! `cfg(loom)`.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
#[cfg(loom)]
pub(crate) use loom_store_as_swap::AtomicU64;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub(crate) use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Stores `value` in a `u32` that other threads change by
/// read-modify-write at the same time: a plain store, which loom models as
/// a `swap` whose result is ignored (why: `AtomicU64` below). The two allow
/// the same executions; the store costs an x86 `mov` where the swap is a
/// locked `xchg`.
#[inline]
pub(crate) fn store_racing_rmw(atomic: &AtomicU32, value: u32, order: Ordering) {
    #[cfg(loom)]
    atomic.swap(value, order);
    #[cfg(not(loom))]
    atomic.store(value, order);
}

/// loom's `AtomicU64`, except that `store` is modelled as a `swap`.
///
/// loom 0.7 lets a plain `store` land between the read and the write of a
/// concurrent read-modify-write on the same atomic (tokio-rs/loom#254 and
/// #389), so it reports histories that the memory model forbids: a bucket
/// reset (`store`) racing with a late writer's `fetch_add` then "loses" the
/// reset, and the old window's counts appear in the new one. A `swap` whose
/// result is ignored allows exactly the executions a `store` does, and loom
/// models its atomicity correctly. Normal builds use `std`'s type directly;
/// nothing changes outside `--cfg loom`.
#[cfg(loom)]
mod loom_store_as_swap {
    use loom::sync::atomic::{AtomicU64 as Inner, Ordering};

    #[derive(Debug)]
    pub(crate) struct AtomicU64(Inner);

    #[allow(dead_code)]
    impl AtomicU64 {
        pub(crate) fn new(value: u64) -> Self {
            AtomicU64(Inner::new(value))
        }

        pub(crate) fn load(&self, order: Ordering) -> u64 {
            self.0.load(order)
        }

        pub(crate) fn store(&self, value: u64, order: Ordering) {
            self.0.swap(value, order);
        }

        pub(crate) fn swap(&self, value: u64, order: Ordering) -> u64 {
            self.0.swap(value, order)
        }

        pub(crate) fn fetch_add(&self, value: u64, order: Ordering) -> u64 {
            self.0.fetch_add(value, order)
        }

        pub(crate) fn fetch_sub(&self, value: u64, order: Ordering) -> u64 {
            self.0.fetch_sub(value, order)
        }

        pub(crate) fn fetch_or(&self, value: u64, order: Ordering) -> u64 {
            self.0.fetch_or(value, order)
        }

        pub(crate) fn fetch_and(&self, value: u64, order: Ordering) -> u64 {
            self.0.fetch_and(value, order)
        }

        pub(crate) fn fetch_min(&self, value: u64, order: Ordering) -> u64 {
            self.0.fetch_min(value, order)
        }

        pub(crate) fn fetch_max(&self, value: u64, order: Ordering) -> u64 {
            self.0.fetch_max(value, order)
        }

        pub(crate) fn compare_exchange(
            &self,
            current: u64,
            new: u64,
            success: Ordering,
            failure: Ordering,
        ) -> Result<u64, u64> {
            self.0.compare_exchange(current, new, success, failure)
        }

        pub(crate) fn compare_exchange_weak(
            &self,
            current: u64,
            new: u64,
            success: Ordering,
            failure: Ordering,
        ) -> Result<u64, u64> {
            self.0.compare_exchange_weak(current, new, success, failure)
        }

        pub(crate) fn fetch_update<F>(
            &self,
            set_order: Ordering,
            fetch_order: Ordering,
            f: F,
        ) -> Result<u64, u64>
        where
            F: FnMut(u64) -> Option<u64>,
        {
            self.0.fetch_update(set_order, fetch_order, f)
        }
    }
}

/// Read-locks, ignoring poisoning: every structure behind these locks stays
/// consistent at every await-free step, so a panic elsewhere while a guard
/// was held must not turn later requests into panics.
#[inline]
pub(crate) fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Write-locks, ignoring poisoning (see [`read`]).
pub(crate) fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Back off inside a wait loop.
///
/// Under loom this yields to the model's scheduler, which a spin loop must do
/// or the model never terminates. On real threads it spins briefly and then
/// gives the core away, so a waiter never burns a whole time slice while the
/// thread it waits for is descheduled.
#[inline]
pub(crate) fn backoff(round: &mut u32) {
    #[cfg(loom)]
    {
        let _ = round;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        if *round < 6 {
            for _ in 0..(1u32 << *round) {
                std::hint::spin_loop();
            }
            *round += 1;
        } else {
            std::thread::yield_now();
        }
    }
}

/// Atomics that are never part of a loom model: the clocks' own.
///
/// loom's atomics cannot be constructed in a `const` context and are only
/// valid inside a model, so the clocks (the time of a
/// [`ManualClock`](crate::clock::ManualClock), the cache of a
/// [`CachedClock`](crate::clock::CachedClock), shared with its upkeep thread)
/// always use `std`. They hold no state that a model checks: the models
/// drive time by hand and never interleave inside a clock read.
pub(crate) mod process {
    pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64};
}
