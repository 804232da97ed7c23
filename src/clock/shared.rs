use std::any::Any;
use std::fmt;
use std::sync::Arc;

use super::{CachedClock, Clock, ManualClock, SystemClock};

/// A clock stored without a type parameter.
///
/// Public types such as `ArrayMetric` take "any clock" by value but carry no
/// clock type parameter, so the clock has to be stored behind one type. A
/// bare `Arc<dyn Clock>` would cost an indirect call on every request; the three
/// clocks this crate ships are recognised when the value is handed over and
/// called directly, and only user clocks go through the vtable.
#[derive(Clone)]
pub(crate) enum SharedClock {
    System(SystemClock),
    Cached(CachedClock),
    Manual(ManualClock),
    Other(Arc<dyn Clock>),
}

impl SharedClock {
    pub(crate) fn new<C: Clock>(clock: C) -> Self {
        let any: &dyn Any = &clock;
        if let Some(system) = any.downcast_ref::<SystemClock>() {
            return SharedClock::System(*system);
        }
        if let Some(cached) = any.downcast_ref::<CachedClock>() {
            return SharedClock::Cached(cached.clone());
        }
        if let Some(manual) = any.downcast_ref::<ManualClock>() {
            return SharedClock::Manual(manual.clone());
        }
        SharedClock::Other(Arc::new(clock))
    }

    pub(crate) fn system() -> Self {
        SharedClock::System(SystemClock::new())
    }

    /// `(now_millis, now_micros)` with as few reads as the clock allows: the
    /// system clock derives both from one counter reading (its milliseconds
    /// are its microseconds floored, so they agree exactly); other clocks are
    /// asked twice, as a user's clock may keep the two apart.
    #[inline]
    pub(crate) fn now_both(&self) -> (u64, u64) {
        match self {
            SharedClock::System(c) => {
                let micros = c.now_micros();
                (micros / 1000, micros)
            }
            SharedClock::Cached(c) => (c.now_millis(), c.now_micros()),
            SharedClock::Manual(c) => (c.now_millis(), c.now_micros()),
            SharedClock::Other(c) => (c.now_millis(), c.now_micros()),
        }
    }
}

impl SharedClock {
    /// [`now_millis`](Clock::now_millis) of the clocks that are not read
    /// inline: tests' and users' clocks.
    #[inline(never)]
    fn now_millis_other(&self) -> u64 {
        match self {
            SharedClock::System(c) => c.now_millis(),
            SharedClock::Cached(c) => c.now_millis(),
            SharedClock::Manual(c) => c.now_millis(),
            SharedClock::Other(c) => c.now_millis(),
        }
    }
}

impl Clock for SharedClock {
    #[inline]
    fn now_millis(&self) -> u64 {
        // The two real clocks inline, the others behind a call: two
        // compares and branches that go the same way on every admission,
        // instead of a jump through a table.
        match self {
            SharedClock::System(c) => c.now_millis(),
            SharedClock::Cached(c) => c.now_millis(),
            other => other.now_millis_other(),
        }
    }

    #[inline]
    fn now_micros(&self) -> u64 {
        match self {
            SharedClock::System(c) => c.now_micros(),
            SharedClock::Cached(c) => c.now_micros(),
            SharedClock::Manual(c) => c.now_micros(),
            SharedClock::Other(c) => c.now_micros(),
        }
    }
}

impl fmt::Debug for SharedClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SharedClock::System(c) => c.fmt(f),
            SharedClock::Cached(c) => c.fmt(f),
            SharedClock::Manual(c) => c.fmt(f),
            SharedClock::Other(_) => f.write_str("Clock { .. }"),
        }
    }
}
