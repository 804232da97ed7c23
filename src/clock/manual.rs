use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::Clock;
use crate::sync::process::AtomicU64;

/// A clock that moves only when told to.
///
/// Clones share one time: hand a clone to the layer or metric under test and
/// keep one to drive it. The time is kept in microseconds, so
/// [`advance`](ManualClock::advance) by less than a millisecond is not lost;
/// [`now_millis`](Clock::now_millis) rounds down.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::clock::{Clock, ManualClock};
///
/// let clock = ManualClock::new(1_000);
/// let shared = clock.clone();
///
/// clock.advance(Duration::from_micros(1_500));
/// assert_eq!(shared.now_millis(), 1_001);
/// assert_eq!(shared.now_micros(), 1_001_500);
///
/// clock.set(5);
/// assert_eq!(shared.now_millis(), 5);
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    // Relaxed is enough everywhere: the time is a single value and nothing
    // else is published through it.
    micros: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock that reads `start_ms` milliseconds until it is moved.
    pub fn new(start_ms: u64) -> Self {
        ManualClock {
            micros: Arc::new(AtomicU64::new(start_ms.saturating_mul(1000))),
        }
    }

    /// Sets the time to exactly `ms` milliseconds. The time may move
    /// backwards, which is how tests model a clock that steps back.
    pub fn set(&self, ms: u64) {
        self.micros
            .store(ms.saturating_mul(1000), Ordering::Relaxed);
    }

    /// Moves the time forward by `by`, saturating at `u64::MAX` microseconds.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        // `fetch_update` never fails with a closure that always returns `Some`.
        let _ = self
            .micros
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(now.saturating_add(by))
            });
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_millis(&self) -> u64 {
        self.micros.load(Ordering::Relaxed) / 1000
    }

    #[inline]
    fn now_micros(&self) -> u64 {
        self.micros.load(Ordering::Relaxed)
    }
}
