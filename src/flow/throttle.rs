//! The pacing controller: Sentinel's rate limiter (`RateLimiterController`,
//! later `ThrottlingController`), uniform pacing with a bounded wait.
//!
//! # Implementation details
//!
//! One word per key, the *latest turn*: the time (ns on the limiter's clock)
//! of the last turn handed out, or [`NEVER`]. A caller at `now` asks for the
//! turn `max(latest + cost, now)`, with `cost = ceil(interval / limit)`
//! nanoseconds:
//!
//! - turn `- now <= max_wait`: it swaps `latest` for its turn with one
//!   compare-and-swap (`AcqRel`; a failed swap recomputes from the value it
//!   returned). So every caller's turn is exactly one `cost` after the turn
//!   before it, or `now` after an idle spell: no two callers share a turn,
//!   and none is skipped.
//! - further away: refused, nothing written.
//!
//! Sentinel sets `latest = now` on its fast path with a plain write and adds
//! `cost` on the slow one, so two callers can take one turn
//! (alibaba/Sentinel#3091); sentinel-golang uses a compare-and-swap on the
//! fast path only. Sentinel also needed a nanosecond mode for costs under a
//! millisecond (alibaba/Sentinel#1615); here time is kept in nanoseconds
//! throughout, so 3 000 per second paces at 333 334 ns, not at 333 or 334 µs.
//!
//! **Giving a turn back.** A caller that will not use its turn (its request
//! was dropped while waiting) swaps `latest` from its turn back to
//! `turn - cost` if its turn is still the latest: the next caller then gets
//! that very turn. If a later turn was handed out meanwhile, the swap fails
//! and the turn stays unused: the later callers keep their places (moving
//! them up would mean rewriting turns already promised). Such a turn is
//! harmless for the limit: an unused turn can only space the passes that
//! really happen further apart, never closer, so no interval ever holds more
//! passes than turns.

use std::fmt;
use std::time::Duration;

use crate::sync::{AtomicU64, Ordering};

/// `latest` before the first turn.
const NEVER: u64 = u64::MAX;

/// The outcome of [`Pacer::reserve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a turn says whether and when the request may proceed"]
pub enum Turn {
    /// The turn is `wait` from now (zero: go now). It is taken: give it back
    /// with [`Pacer::give_back`] if it will not be used.
    Wait {
        /// How long until the turn.
        wait: Duration,
        /// The turn, in nanoseconds on the caller's clock (for `give_back`).
        at_ns: u64,
    },
    /// The next turn is more than `max_wait` away; nothing was taken.
    Refuse {
        /// How long until a caller could get a turn within `max_wait`, if no
        /// one else takes one meanwhile.
        retry_after: Duration,
    },
}

/// Uniform pacing for one resource: Sentinel's rate limiter, with turns
/// reserved by compare-and-swap (module docs of `flow::throttle`).
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::flow::{Pacer, Turn};
///
/// // 4 per second: a turn every 250 ms; wait at most 600 ms.
/// let pacer = Pacer::new();
/// let cost = Pacer::cost_ns(1000, 4).unwrap();
/// let max_wait = Duration::from_millis(600);
/// let now = 10_000_000_000; // ns
/// let waits: Vec<_> = (0..4)
///     .map(|_| match pacer.reserve(now, cost, max_wait) {
///         Turn::Wait { wait, .. } => Some(wait.as_millis()),
///         Turn::Refuse { .. } => None,
///     })
///     .collect();
/// assert_eq!(waits, [Some(0), Some(250), Some(500), None]);
/// ```
pub struct Pacer {
    /// The latest turn handed out (ns), or `NEVER`.
    latest: AtomicU64,
}

impl Pacer {
    /// A pacer that has handed out no turn: the first caller goes at once.
    pub fn new() -> Self {
        Pacer {
            latest: AtomicU64::new(NEVER),
        }
    }

    /// Nanoseconds between turns for `limit` per `interval_ms`, rounded up
    /// (so `limit` turns never fit in less than the interval); `None` when
    /// `limit` is 0 (no turn ever).
    pub fn cost_ns(interval_ms: u64, limit: u64) -> Option<u64> {
        if limit == 0 {
            return None;
        }
        let interval_ns = u128::from(interval_ms) * 1_000_000;
        let cost = interval_ns.div_ceil(u128::from(limit)).max(1);
        Some(u64::try_from(cost).unwrap_or(u64::MAX))
    }

    /// Takes the next turn at `now_ns` if it is at most `max_wait` away
    /// (one compare-and-swap; see the module docs).
    pub fn reserve(&self, now_ns: u64, cost_ns: u64, max_wait: Duration) -> Turn {
        let max_wait_ns = u64::try_from(max_wait.as_nanos()).unwrap_or(u64::MAX);
        // Acquire: see the turn the previous caller took (nothing else is
        // published through this word; AcqRel keeps the turns in one order).
        let mut latest = self.latest.load(Ordering::Acquire);
        loop {
            let turn = match latest {
                NEVER => now_ns,
                latest => latest.saturating_add(cost_ns).max(now_ns),
            };
            let wait_ns = turn - now_ns;
            if wait_ns > max_wait_ns {
                return Turn::Refuse {
                    retry_after: Duration::from_nanos(wait_ns - max_wait_ns),
                };
            }
            match self
                .latest
                .compare_exchange(latest, turn, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Turn::Wait {
                        wait: Duration::from_nanos(wait_ns),
                        at_ns: turn,
                    }
                }
                Err(actual) => latest = actual,
            }
        }
    }

    /// The latest turn handed out (ns), if any.
    pub(crate) fn latest_ns(&self) -> Option<u64> {
        match self.latest.load(Ordering::Relaxed) {
            NEVER => None,
            latest => Some(latest),
        }
    }

    /// Gives back the turn `at_ns` taken with `cost_ns`, if it is still the
    /// latest; `true` when the next caller will get it. Otherwise it stays
    /// unused, which is harmless (module docs).
    pub fn give_back(&self, at_ns: u64, cost_ns: u64) -> bool {
        let previous = at_ns.checked_sub(cost_ns).unwrap_or(NEVER);
        self.latest
            .compare_exchange(at_ns, previous, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }
}

impl Default for Pacer {
    fn default() -> Self {
        Pacer::new()
    }
}

impl fmt::Debug for Pacer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let latest = self.latest.load(Ordering::Relaxed);
        f.debug_struct("Pacer")
            .field("latest_turn_ns", &(latest != NEVER).then_some(latest))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn waits(pacer: &Pacer, now: u64, cost: u64, max_wait_ms: u64, n: usize) -> Vec<Option<u64>> {
        (0..n)
            .map(
                |_| match pacer.reserve(now, cost, Duration::from_millis(max_wait_ms)) {
                    Turn::Wait { wait, .. } => Some(u64::try_from(wait.as_nanos()).unwrap()),
                    Turn::Refuse { .. } => None,
                },
            )
            .collect()
    }

    #[test]
    fn spacing_is_interval_over_limit() {
        // Sentinel's example: count 10, 500 ms queue: 100 ms apart, five
        // wait, the rest are refused.
        let pacer = Pacer::new();
        let cost = Pacer::cost_ns(1000, 10).unwrap();
        assert_eq!(cost, 100 * MS);
        let got = waits(&pacer, 5_000 * MS, cost, 500, 8);
        let want = [0, 100, 200, 300, 400, 500].map(|ms| Some(ms * MS));
        assert_eq!(&got[..6], &want);
        assert_eq!(&got[6..], &[None, None]);
    }

    #[test]
    fn an_idle_pacer_starts_at_now_and_time_zero_is_ordinary() {
        let pacer = Pacer::new();
        let cost = Pacer::cost_ns(1000, 2).unwrap();
        assert_eq!(waits(&pacer, 0, cost, 0, 2), [Some(0), None]);
        // Long after: the turn is now again, not a backlog.
        assert_eq!(waits(&pacer, 10_000 * MS, cost, 0, 1), [Some(0)]);
    }

    #[test]
    fn sub_millisecond_spacing_keeps_nanoseconds() {
        // alibaba/Sentinel#1615: 3 000 per second.
        let cost = Pacer::cost_ns(1000, 3000).unwrap();
        assert_eq!(cost, 333_334);
        let pacer = Pacer::new();
        let now = 7_000 * MS;
        // Everything due within 1 ms: turns at 0, 333 334, 666 668, 1 000 002 ns.
        let got = waits(&pacer, now, cost, 1, 4);
        assert_eq!(got, [Some(0), Some(333_334), Some(666_668), None]);
        // A million per second paces at 1 µs, and a billion at 1 ns.
        assert_eq!(Pacer::cost_ns(1000, 1_000_000), Some(1_000));
        assert_eq!(Pacer::cost_ns(1000, 1_000_000_000), Some(1));
        assert_eq!(Pacer::cost_ns(1000, u64::MAX), Some(1));
        assert_eq!(Pacer::cost_ns(1000, 0), None);
    }

    #[test]
    fn a_refusal_says_when_a_turn_would_fit() {
        let pacer = Pacer::new();
        let cost = Pacer::cost_ns(1000, 1).unwrap();
        let now = 3_000 * MS;
        assert!(matches!(
            pacer.reserve(now, cost, Duration::ZERO),
            Turn::Wait { .. }
        ));
        let refused = pacer.reserve(now + 200 * MS, cost, Duration::from_millis(300));
        // Next turn at now + 1000 ms; within 300 ms of it from now + 700 ms.
        assert_eq!(
            refused,
            Turn::Refuse {
                retry_after: Duration::from_millis(500)
            }
        );
    }

    #[test]
    fn the_latest_turn_is_given_back_and_an_earlier_one_stays_unused() {
        let pacer = Pacer::new();
        let cost = Pacer::cost_ns(1000, 10).unwrap();
        let now = 1_000 * MS;
        let turns: Vec<u64> = (0..3)
            .map(|_| match pacer.reserve(now, cost, Duration::from_secs(1)) {
                Turn::Wait { at_ns, .. } => at_ns,
                Turn::Refuse { .. } => unreachable!(),
            })
            .collect();
        // The middle one cannot be given back: the third keeps its place.
        assert!(!pacer.give_back(turns[1], cost));
        // The last one can: the next caller gets that very turn.
        assert!(pacer.give_back(turns[2], cost));
        match pacer.reserve(now, cost, Duration::from_secs(1)) {
            Turn::Wait { at_ns, .. } => assert_eq!(at_ns, turns[2]),
            Turn::Refuse { .. } => unreachable!(),
        }
    }
}
