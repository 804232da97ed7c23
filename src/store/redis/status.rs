//! Whether the store is answering, what it has cost, and the switch between
//! Redis and the fallback.
//!
//! The first failed round trip switches the store to [`StoreMode::Fallback`]
//! and logs one warning; from then on requests do not wait on Redis: the
//! caller's [`StoreFailure`](super::StoreFailure) policy answers them at
//! once, and one request per probe interval tries Redis again. The first
//! round trip that succeeds switches back to [`StoreMode::Remote`] and logs
//! one notice. Nothing is logged per request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Where admissions are decided now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub enum StoreMode {
    /// In Redis: every replica shares the limit.
    Remote,
    /// Redis failed (an error, or no answer within the timeout): the
    /// failure policy decides, and Redis is probed again now and then.
    Fallback,
}

/// The state of a [`RedisStore`](super::RedisStore): its mode and counters
/// since it connected (shared by its clones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct StoreStatus {
    /// Where admissions are decided now.
    pub mode: StoreMode,
    /// Round trips that failed: an error, a reply that made no sense, or
    /// no answer within the timeout.
    pub failures: u64,
    /// Round trips to Redis (each one script call).
    pub round_trips: u64,
    /// Requests refused without a round trip, for a key known to be
    /// blocked.
    pub answered_locally: u64,
    /// Requests answered by the failure policy, without a round trip,
    /// while in [`StoreMode::Fallback`].
    pub fallbacks: u64,
    /// Switches from [`StoreMode::Remote`] to [`StoreMode::Fallback`].
    pub outages: u64,
}

/// The shared, lock-free state behind [`StoreStatus`]. Relaxed everywhere:
/// each field is a counter or flag read on its own.
#[derive(Debug, Default)]
pub(crate) struct Health {
    fallback: AtomicBool,
    /// While in fallback: the time (store clock, ms) of the next probe.
    next_probe_ms: AtomicU64,
    failures: AtomicU64,
    round_trips: AtomicU64,
    answered_locally: AtomicU64,
    fallbacks: AtomicU64,
    outages: AtomicU64,
}

/// What a request may do, given the store's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Ask Redis.
    Remote,
    /// Do not ask: the failure policy answers.
    Fallback,
}

impl Health {
    /// Whether a request at `now_ms` goes to Redis. In fallback, exactly
    /// one request per probe interval does (the one that moves the probe
    /// time on).
    pub(crate) fn route(&self, now_ms: u64, probe_ms: u64) -> Route {
        if !self.fallback.load(Ordering::Relaxed) {
            return Route::Remote;
        }
        let next = self.next_probe_ms.load(Ordering::Relaxed);
        if now_ms >= next
            && self
                .next_probe_ms
                .compare_exchange(
                    next,
                    now_ms.saturating_add(probe_ms),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Route::Remote;
        }
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        Route::Fallback
    }

    pub(crate) fn round_trip(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn answered_locally(&self) {
        self.answered_locally.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a failed round trip at `now_ms`; logs the switch to fallback
    /// once.
    pub(crate) fn failed(&self, now_ms: u64, probe_ms: u64, why: &dyn std::fmt::Display) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.next_probe_ms
            .store(now_ms.saturating_add(probe_ms), Ordering::Relaxed);
        if !self.fallback.swap(true, Ordering::Relaxed) {
            self.outages.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                error = %why,
                probe_ms,
                "redis store unavailable: admissions fall back to the failure policy"
            );
        }
    }

    /// Records a round trip that succeeded; logs the recovery once.
    pub(crate) fn succeeded(&self) {
        if self.fallback.load(Ordering::Relaxed) && self.fallback.swap(false, Ordering::Relaxed) {
            tracing::info!("redis store recovered: admissions are shared again");
        }
    }

    pub(crate) fn status(&self) -> StoreStatus {
        StoreStatus {
            mode: if self.fallback.load(Ordering::Relaxed) {
                StoreMode::Fallback
            } else {
                StoreMode::Remote
            },
            failures: self.failures.load(Ordering::Relaxed),
            round_trips: self.round_trips.load(Ordering::Relaxed),
            answered_locally: self.answered_locally.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            outages: self.outages.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_probe_per_interval_while_down() {
        let health = Health::default();
        assert_eq!(health.route(0, 100), Route::Remote);
        health.failed(10, 100, &"refused");
        assert_eq!(health.status().mode, StoreMode::Fallback);
        assert_eq!(health.route(50, 100), Route::Fallback);
        assert_eq!(health.route(110, 100), Route::Remote, "the probe");
        assert_eq!(health.route(111, 100), Route::Fallback, "one probe only");
        health.failed(120, 100, &"refused");
        health.succeeded();
        assert_eq!(health.route(121, 100), Route::Remote);
        let status = health.status();
        assert_eq!(
            (
                status.mode,
                status.failures,
                status.outages,
                status.fallbacks
            ),
            (StoreMode::Remote, 2, 1, 2)
        );
    }
}
