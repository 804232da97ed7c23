//! The one place that chooses between `std` and `loom` primitives.
//!
//! Every atomic in the statistics core is imported from here, so building
//! with `RUSTFLAGS="--cfg loom"` swaps them for loom's model-checked versions
//! without touching the code that uses them. Nothing else in the crate names
//! `cfg(loom)`.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Read-locks, ignoring poisoning: every structure behind these locks stays
/// consistent at every await-free step, so a panic elsewhere while a guard
/// was held must not turn later requests into panics.
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

/// Process-wide atomics that live in `static`s.
///
/// loom's atomics cannot be constructed in a `const` context and are only
/// valid inside a model, so the few statics of the crate (the cached
/// [`SystemClock`](crate::clock::SystemClock) reading) always use `std`. They
/// hold no state that a model checks: every model drives time by hand.
pub(crate) mod process {
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64};
}
