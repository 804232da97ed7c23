//! `CircuitBreaker`: one breaker's state machine and its statistics.
//!
//! # Implementation details
//!
//! The state is one atomic word: the low two bits are the state's tag, the
//! rest a time in milliseconds (used by `OPEN` only).
//!
//! | word                 | state                                          |
//! |----------------------|------------------------------------------------|
//! | `CLOSED` (0)         | closed                                         |
//! | `until << 2 \| OPEN`  | open until `until`; half-open from then on    |
//! | `PROBING`            | half-open, the probe is out                    |
//! | `FREE`               | half-open, the probe slot is free again        |
//!
//! An open breaker whose time has come is half-open without any write: the
//! first request after it takes the probe slot by swapping `OPEN` (or
//! `FREE`) for `PROBING` in one compare-and-swap, so among any number of
//! racing requests exactly one wins it. Only the request holding the probe
//! ever moves the word away from `PROBING`: to `CLOSED` or `OPEN` when it
//! completes, to `FREE` when it is dropped or refused by a flow rule. No
//! other writer can race with it there, so those moves are plain stores.
//! `CLOSED` becomes `OPEN` by compare-and-swap, so of several completions
//! that find the threshold exceeded at once, one opens the breaker (and
//! logs it).
//!
//! The statistics are a one-bucket window of `stat_interval` (Sentinel's
//! degrade rules count the same way): a completion adds one to the
//! bucket's success count, and one to its exception count when it counts
//! against the breaker. Closing after a successful probe resets the bucket
//! (fresh statistics); a completion racing with that reset may be lost, which
//! only delays the next opening by one completion.

use std::time::Duration;

use super::rule::Breaker;
use super::state::BreakerState;
use crate::stat::{BucketLeapArray, MetricBucket};
use crate::sync::{AtomicU64, Ordering};

const TAG_BITS: u32 = 2;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const PROBING: u64 = 2;
const FREE: u64 = 3;

/// The word of a breaker open until `until_ms`.
fn open_until(until_ms: u64) -> u64 {
    (until_ms.min(u64::MAX >> TAG_BITS) << TAG_BITS) | OPEN
}

/// One circuit breaker: the state machine of the [module docs](crate::breaker)
/// with its own statistics, independent of HTTP and of the clock (every
/// call is given the time, in milliseconds).
///
/// The layer keeps one per key and breaker setting; it is public for code
/// that guards something other than a tower service.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::breaker::{Breaker, BreakerState, CircuitBreaker};
///
/// let breaker = CircuitBreaker::new(
///     Breaker::error_count(1).min_requests(1).open_for(Duration::from_secs(5)),
/// );
/// for _ in 0..2 {
///     let permit = breaker.try_pass(0).expect("closed");
///     permit.complete(10, Duration::from_millis(10), true);
/// }
/// assert!(matches!(breaker.state(10), BreakerState::Open { .. }));
/// assert_eq!(breaker.try_pass(10).err(), Some(Duration::from_millis(5_000)));
///
/// // Half-open after five seconds: one probe, which decides.
/// let probe = breaker.try_pass(5_010).expect("the probe");
/// assert!(probe.is_probe());
/// assert!(breaker.try_pass(5_010).is_err(), "one probe at a time");
/// probe.complete(5_020, Duration::from_millis(10), false);
/// assert_eq!(breaker.state(5_020), BreakerState::Closed);
/// ```
#[derive(Debug)]
pub struct CircuitBreaker {
    rule: Breaker,
    /// The state word (see the module's implementation details).
    state: AtomicU64,
    /// Completions in the current stat interval: `success` counts them all,
    /// `exception` those that count against the breaker.
    window: BucketLeapArray,
}

impl CircuitBreaker {
    /// A closed breaker with the settings of `rule`.
    pub fn new(rule: Breaker) -> Self {
        CircuitBreaker {
            rule,
            state: AtomicU64::new(CLOSED),
            window: BucketLeapArray::new(1, rule.stat_interval_ms)
                .expect("one bucket over an interval checked by `Breaker`"),
        }
    }

    /// The breaker's settings.
    pub fn rule(&self) -> &Breaker {
        &self.rule
    }

    /// Asks to let one request through at `now_ms`. `Ok` carries the permit
    /// to [complete](Permit::complete) when the request completes (dropping
    /// it instead means the request was cancelled: it counts for nothing
    /// and, if it was the probe, frees the probe slot). `Err` carries how
    /// long until the breaker turns half-open (zero while it is half-open
    /// with the probe out).
    pub fn try_pass(&self, now_ms: u64) -> Result<Permit<'_>, Duration> {
        match self.enter(now_ms) {
            Ok(probe) => Ok(Permit {
                breaker: self,
                probe,
            }),
            Err(wait_ms) => Err(Duration::from_millis(wait_ms)),
        }
    }

    /// The state at `now_ms`.
    pub fn state(&self, now_ms: u64) -> BreakerState {
        let word = self.state.load(Ordering::Acquire);
        match word & TAG_MASK {
            CLOSED => BreakerState::Closed,
            OPEN if now_ms < word >> TAG_BITS => BreakerState::Open {
                half_open_in: Duration::from_millis((word >> TAG_BITS) - now_ms),
            },
            _ => BreakerState::HalfOpen,
        }
    }

    /// Whether the breaker is closed (nothing to keep for it but counts).
    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.state.load(Ordering::Acquire) == CLOSED
    }

    /// Lets a request through at `now`: `Ok(true)` when it is the probe,
    /// `Ok(false)` when the breaker is closed, `Err(ms until half-open)`
    /// otherwise (0 while the probe is out).
    #[inline]
    pub(crate) fn enter(&self, now: u64) -> Result<bool, u64> {
        // Acquire: pairs with the release of the store or swap that wrote
        // the word, so a request let through after a close sees the reset
        // statistics.
        let mut word = self.state.load(Ordering::Acquire);
        loop {
            let tag = word & TAG_MASK;
            match tag {
                CLOSED => return Ok(false),
                PROBING => return Err(0),
                OPEN if now < word >> TAG_BITS => return Err((word >> TAG_BITS) - now),
                _ => {}
            }
            // OPEN whose time has come, or FREE: take the probe slot. One
            // compare-and-swap, so exactly one racing request wins it.
            match self
                .state
                .compare_exchange(word, PROBING, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if tag == OPEN {
                        self.log_transition("open", "half_open");
                    }
                    return Ok(true);
                }
                Err(current) => word = current,
            }
        }
    }

    /// Records a completion at `now` that took `rt_us` and `failed` or not;
    /// `probe`: the request held the probe slot, and decides.
    #[inline]
    pub(crate) fn complete(&self, now: u64, rt_us: u64, failed: bool, probe: bool) {
        if probe {
            self.decide(now, rt_us, failed);
            return;
        }
        let bad = self.rule.is_bad(rt_us, failed);
        let bucket: &MetricBucket = self.window.current_window(now).value();
        bucket.add_success(1);
        if bad {
            bucket.add_exception(1);
        }
        // Only a closed breaker opens on its counts; completions of requests
        // let through before it opened count but decide nothing meanwhile.
        if !self.is_closed() || !self.rule.exceeded(bucket.success(), bucket.exception()) {
            return;
        }
        let until = now.saturating_add(self.rule.open_for_ms);
        if self
            .state
            .compare_exchange(
                CLOSED,
                open_until(until),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            self.log_transition("closed", "open");
        }
    }

    /// The probe's completion decides: closed with fresh statistics, or open
    /// again for `open_for`.
    fn decide(&self, now: u64, rt_us: u64, failed: bool) {
        debug_assert_eq!(
            self.state.load(Ordering::Relaxed),
            PROBING,
            "only the probe leaves PROBING"
        );
        if self.rule.probe_succeeded(rt_us, failed) {
            self.window.current_window(now).value().reset();
            // Release: the reset above is visible to whoever sees CLOSED.
            self.state.store(CLOSED, Ordering::Release);
            self.log_transition("half_open", "closed");
        } else {
            let until = now.saturating_add(self.rule.open_for_ms);
            self.state.store(open_until(until), Ordering::Release);
            self.log_transition("half_open", "open");
        }
    }

    /// Frees the probe slot of a probe that was dropped or refused: the
    /// breaker stays half-open and the next request may probe.
    pub(crate) fn release_probe(&self) {
        debug_assert_eq!(
            self.state.load(Ordering::Relaxed),
            PROBING,
            "only the probe leaves PROBING"
        );
        self.state.store(FREE, Ordering::Release);
    }

    /// One event per transition (never per request), without the key.
    fn log_transition(&self, from: &'static str, to: &'static str) {
        if to == "open" {
            tracing::warn!(
                breaker = self.rule.kind(),
                from,
                to,
                open_for_ms = self.rule.open_for_ms,
                "circuit breaker opened"
            );
        } else {
            tracing::info!(breaker = self.rule.kind(), from, to, "circuit breaker {to}");
        }
    }
}

/// Leave for one request to go through a [`CircuitBreaker`], from
/// [`CircuitBreaker::try_pass`].
///
/// [`complete`](Self::complete) it when the request completes. Dropping it
/// uncompleted counts the request for nothing, and frees the probe slot if
/// it held it.
#[derive(Debug)]
#[must_use = "a permit records the request's completion; dropping it counts nothing"]
pub struct Permit<'a> {
    breaker: &'a CircuitBreaker,
    probe: bool,
}

impl Permit<'_> {
    /// Whether this request is the half-open breaker's probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// Records the request's completion at `now_ms`: it took `rt` and
    /// `failed` or not. A probe decides the breaker's state.
    pub fn complete(mut self, now_ms: u64, rt: Duration, failed: bool) {
        let rt_us = u64::try_from(rt.as_micros()).unwrap_or(u64::MAX);
        let probe = std::mem::replace(&mut self.probe, false);
        self.breaker.complete(now_ms, rt_us, failed, probe);
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if self.probe {
            self.breaker.release_probe();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn tripped(rule: Breaker) -> CircuitBreaker {
        let breaker = CircuitBreaker::new(rule.min_requests(1));
        for _ in 0..3 {
            breaker.complete(0, 0, true, false);
        }
        breaker
    }

    #[test]
    fn a_released_probe_frees_the_slot() {
        let breaker = tripped(Breaker::error_count(1).open_for(Duration::from_millis(100)));
        assert_eq!(breaker.enter(50), Err(50));
        assert_eq!(breaker.enter(100), Ok(true));
        assert_eq!(breaker.enter(100), Err(0));
        breaker.release_probe();
        assert_eq!(breaker.state(100), BreakerState::HalfOpen);
        assert_eq!(breaker.enter(101), Ok(true));
    }

    #[test]
    fn a_failed_probe_opens_again_from_its_completion() {
        let breaker = tripped(Breaker::error_count(1).open_for(Duration::from_millis(100)));
        assert_eq!(breaker.enter(200), Ok(true));
        breaker.complete(250, 0, true, true);
        assert_eq!(
            breaker.state(250),
            BreakerState::Open {
                half_open_in: Duration::from_millis(100)
            }
        );
    }

    #[test]
    fn completions_while_open_decide_nothing() {
        let breaker = tripped(Breaker::error_count(1).open_for(Duration::from_millis(100)));
        breaker.complete(10, 0, false, false);
        assert!(matches!(breaker.state(10), BreakerState::Open { .. }));
    }
}
