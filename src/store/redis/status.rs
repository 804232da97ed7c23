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
use std::sync::Mutex;

/// Where admissions are decided now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub enum StoreMode {
    /// In Redis: every replica shares the limit.
    Remote,
    /// Redis failed (an error, or no answer within the timeout), is not
    /// connected yet, or evicts keys (see
    /// [`StoreStatus::evicting`]): the failure policy decides, and Redis
    /// is probed again now and then.
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
    /// Requests whose key's data in Redis could not be used (its name
    /// holds a value that is not a hash): each was answered by the failure
    /// policy, and no other key was affected. Not counted in `failures`.
    pub key_errors: u64,
    /// The server's `maxmemory-policy` evicts keys (anything but
    /// `noeviction`), as last read: at connect, and by the probes after a
    /// failure. Unless the store was told
    /// [`allow_evicting_server`](super::RedisStore::allow_evicting_server),
    /// the mode is then [`StoreMode::Fallback`].
    pub evicting: bool,
    /// Requests admitted through the store: each one a pass Redis granted
    /// to its own call, or a leased pass spent with no round trip. The
    /// failure policy's answers are not counted; a pass a layer's own
    /// window then refuses (see
    /// [a server that forgets](super#a-server-that-forgets))
    /// is.
    pub admitted: u64,
    /// Passes leased: granted by Redis beyond the calling request's own,
    /// for later requests of this replica (see
    /// [leases](super#leases-for-hot-keys)).
    pub leased: u64,
    /// Leased passes spent: requests admitted with no round trip.
    pub lease_spent: u64,
    /// Leased passes not spent before their bucket ended: they stay
    /// counted in Redis as passes (so they only ever refuse more) and
    /// expire with the bucket. Leased passes are never given back.
    pub stranded: u64,
}

impl StoreStatus {
    /// Round trips per admitted request: `round_trips / admitted` (`None`
    /// before the first admission). 1 for keys that are not hot, and
    /// below 1 for a hot key that leases (refused requests cost round
    /// trips too, but are not admissions).
    pub fn round_trips_per_admission(&self) -> Option<f64> {
        (self.admitted > 0).then(|| self.round_trips as f64 / self.admitted as f64)
    }
}

/// The shared, lock-free state behind [`StoreStatus`]. Relaxed everywhere:
/// each field is a counter or flag read on its own.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// Redis failed and has not answered since (or was never reached).
    fallback: AtomicBool,
    /// The server's policy evicts keys, as last read. Written by whoever
    /// read the policy last; a reader may see the previous reading, which
    /// costs at most one request decided the old way.
    evicting: AtomicBool,
    /// The policy last read, for the log line when it changes (read and
    /// written only then: at connect and by probes).
    policy: Mutex<String>,
    /// While in fallback: the time (store clock, ms) of the next probe.
    next_probe_ms: AtomicU64,
    failures: AtomicU64,
    round_trips: AtomicU64,
    answered_locally: AtomicU64,
    fallbacks: AtomicU64,
    outages: AtomicU64,
    key_errors: AtomicU64,
    admitted: AtomicU64,
    leased: AtomicU64,
    lease_spent: AtomicU64,
    stranded: AtomicU64,
}

/// What a request may do, given the store's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Ask Redis.
    Remote,
    /// Ask Redis, as the probe: after a failure, or while the server is
    /// refused for evicting keys. The probe reads the policy again.
    Probe,
    /// Do not ask: the failure policy answers.
    Fallback,
}

impl Health {
    /// A store that has not connected yet: in fallback, with its first
    /// probe due at once.
    pub(crate) fn not_connected() -> Health {
        Health {
            fallback: AtomicBool::new(true),
            ..Health::default()
        }
    }

    /// Whether a request at `now_ms` goes to Redis. In fallback, or while
    /// the caller refuses the server (`refused`: it evicts keys), exactly
    /// one request per probe interval does (the one that moves the probe
    /// time on).
    pub(crate) fn route(&self, now_ms: u64, probe_ms: u64, refused: bool) -> Route {
        if !refused && !self.fallback.load(Ordering::Relaxed) {
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
            return Route::Probe;
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

    /// A request that Redis answered without deciding (the server evicts
    /// keys), left to the failure policy.
    pub(crate) fn answered_by_policy(&self) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    /// A request admitted by Redis's grant to its own call.
    pub(crate) fn admitted(&self) {
        self.admitted.fetch_add(1, Ordering::Relaxed);
    }

    /// `extra` passes granted beyond the callers' own.
    pub(crate) fn leased(&self, extra: u64) {
        if extra > 0 {
            self.leased.fetch_add(extra, Ordering::Relaxed);
        }
    }

    /// A request admitted with a leased pass.
    pub(crate) fn lease_spent(&self) {
        self.lease_spent.fetch_add(1, Ordering::Relaxed);
        self.admitted.fetch_add(1, Ordering::Relaxed);
    }

    /// `passes` leased passes whose bucket ended before they were spent.
    pub(crate) fn stranded(&self, passes: u64) {
        if passes > 0 {
            self.stranded.fetch_add(passes, Ordering::Relaxed);
        }
    }

    /// A request whose key's data could not be used.
    pub(crate) fn key_error(&self) {
        self.key_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn evicting(&self) -> bool {
        self.evicting.load(Ordering::Relaxed)
    }

    /// Records the server's `maxmemory-policy` (`""`: unknown, trusted);
    /// logs a change to or from an evicting one.
    pub(crate) fn set_policy(&self, policy: &str) {
        let evicting = !policy.is_empty() && policy != "noeviction";
        let mut last = self
            .policy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *last == policy {
            return;
        }
        if evicting {
            tracing::warn!(
                maxmemory_policy = policy,
                "redis store: the server evicts keys, which drops windows and lets keys pass \
                 their limit again; set maxmemory-policy noeviction (admissions fall back to \
                 the failure policy unless the store allows an evicting server)"
            );
        } else if self.evicting.load(Ordering::Relaxed) {
            tracing::info!(
                maxmemory_policy = policy,
                "redis store: the server no longer evicts keys"
            );
        }
        policy.clone_into(&mut last);
        self.evicting.store(evicting, Ordering::Relaxed);
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
            key_errors: self.key_errors.load(Ordering::Relaxed),
            evicting: self.evicting.load(Ordering::Relaxed),
            admitted: self.admitted.load(Ordering::Relaxed),
            leased: self.leased.load(Ordering::Relaxed),
            lease_spent: self.lease_spent.load(Ordering::Relaxed),
            stranded: self.stranded.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_probe_per_interval_while_down() {
        let health = Health::default();
        assert_eq!(health.route(0, 100, false), Route::Remote);
        health.failed(10, 100, &"refused");
        assert_eq!(health.status().mode, StoreMode::Fallback);
        assert_eq!(health.route(50, 100, false), Route::Fallback);
        assert_eq!(health.route(110, 100, false), Route::Probe, "the probe");
        assert_eq!(
            health.route(111, 100, false),
            Route::Fallback,
            "one probe only"
        );
        health.failed(120, 100, &"refused");
        health.succeeded();
        assert_eq!(health.route(121, 100, false), Route::Remote);
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

    #[test]
    fn a_refused_server_is_probed_once_per_interval() {
        let health = Health::default();
        health.set_policy("allkeys-lru");
        assert!(health.evicting());
        assert_eq!(health.route(0, 100, true), Route::Probe);
        assert_eq!(health.route(1, 100, true), Route::Fallback);
        assert_eq!(health.route(99, 100, true), Route::Fallback);
        assert_eq!(health.route(100, 100, true), Route::Probe);
        // A store that allows it decides in Redis meanwhile.
        assert_eq!(health.route(101, 100, false), Route::Remote);
        health.set_policy("noeviction");
        assert!(!health.evicting());
        health.set_policy("");
        assert!(!health.evicting(), "unknown: trusted");
    }

    #[test]
    fn a_store_not_connected_yet_probes_at_once() {
        let health = Health::not_connected();
        assert_eq!(health.status().mode, StoreMode::Fallback);
        assert_eq!(health.route(0, 100, false), Route::Probe);
        assert_eq!(health.route(1, 100, false), Route::Fallback);
        health.succeeded();
        assert_eq!(health.status().mode, StoreMode::Remote);
        assert_eq!(health.status().outages, 0);
    }
}
