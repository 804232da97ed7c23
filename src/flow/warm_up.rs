//! The warm-up controller: Sentinel's `WarmUpController`, Guava's
//! `SmoothWarmingUp` over a window's pass count.
//!
//! A key that has been idle is *cold*: it holds many stored tokens, and the
//! more tokens it holds, the lower its allowed rate. Passes spend tokens and
//! idle time refills them, so under sustained load the allowed rate climbs
//! from `limit / cold_factor` to `limit` over the warm-up period, and falls
//! back when the key goes quiet.
//!
//! # Implementation details
//!
//! Sentinel counts per second; here every figure is per window
//! (`interval`), which is the same for the default one-second window. With
//! `count` the limit per window, `cold` the cold factor and `p` the warm-up
//! period in windows:
//!
//! - `warning = floor(p * count) / (cold - 1)` (integer division),
//! - `max = warning + floor(2 * p * count / (1 + cold))`,
//! - `slope = (cold - 1) / count / (max - warning)`.
//!
//! Once per window (at the first request of a new window) the tokens are
//! synced with the pass count of the window before: they refill by `count`
//! per window elapsed while below `warning`, and above it only when the
//! previous window passed fewer than `count / cold`, capped at `max`; then
//! the previous window's passes are spent. A key starts cold (full).
//!
//! The admission check: with `stored >= warning` the window may hold
//! `floor(nextUp(1 / ((stored - warning) * slope + 1 / count)))` passes,
//! else `count`. The layer then admits with its usual compare-and-swap
//! against that effective limit, so the window count stays exact; only the
//! limit moves.
//!
//! The pass count per window lives in one word with the window's index
//! (`tag`), so the first caller in a new window swaps it and, by that swap
//! alone, is the one that syncs the tokens with the old window's count.

use std::fmt;

use super::WarmUpSettings;
use crate::sync::{AtomicU64, Ordering};

/// The default cold factor: the allowed rate starts at a third of the limit.
pub(crate) const DEFAULT_COLD_FACTOR: u64 = 3;

/// Bits of the pass word that hold the window index (its low bits).
const TAG_BITS: u32 = 24;
const COUNT_BITS: u32 = 64 - TAG_BITS;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// `last_filled` before the first sync.
const NEVER: u64 = u64::MAX;
/// The pass word before the first sync: no window's word (counts stop one
/// short of `COUNT_MASK`), so the first caller's swap is the only election.
const UNSYNCED: u64 = u64::MAX;

/// The constants of Sentinel's warm-up for one limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Curve {
    pub(crate) count: u64,
    pub(crate) cold: u64,
    pub(crate) warning: u64,
    pub(crate) max: u64,
    pub(crate) slope: f64,
}

impl Curve {
    /// The curve for `count` passes per window, warming up over
    /// `period_windows` windows (`period / interval`).
    pub(crate) fn new(count: u64, period_windows: f64, cold: u64) -> Curve {
        let cold = cold.max(2);
        // `(int)(period * count)` in Sentinel: floored, then the integer
        // divisions of its Java code.
        let product = (period_windows * count as f64).floor();
        let product = if product.is_finite() && product > 0.0 {
            product.min(u64::MAX as f64) as u64
        } else {
            0
        };
        let warning = product / (cold - 1);
        let extra = (2.0 * period_windows * count as f64 / (1.0 + cold as f64)).floor();
        let extra = if extra.is_finite() && extra > 0.0 {
            extra.min(u64::MAX as f64) as u64
        } else {
            0
        };
        let max = warning.saturating_add(extra);
        let slope = if max > warning && count > 0 {
            (cold - 1) as f64 / count as f64 / (max - warning) as f64
        } else {
            0.0
        };
        Curve {
            count,
            cold,
            warning,
            max,
            slope,
        }
    }

    /// How many passes a window may hold with `stored` tokens.
    pub(crate) fn allowed(&self, stored: u64) -> u64 {
        if self.count == 0 || stored < self.warning || self.slope == 0.0 {
            return self.count;
        }
        let above = (stored - self.warning) as f64;
        let qps = 1.0 / (above * self.slope + 1.0 / self.count as f64);
        // Sentinel compares `passQps + acquire <= nextUp(warningQps)`; with
        // whole passes that is a limit of `floor(nextUp(qps))`.
        let qps = next_up(qps);
        (qps.floor() as u64).min(self.count)
    }

    /// Tokens after a sync at the start of a window, `elapsed_windows`
    /// after the last one, whose predecessor passed `previous_pass`.
    pub(crate) fn synced(&self, stored: u64, elapsed_windows: u64, previous_pass: u64) -> u64 {
        // Sentinel's `coolDownTokens`.
        let refill = elapsed_windows.saturating_mul(self.count);
        // Below the warning line tokens always refill; above it only while
        // the key runs below its cold rate.
        let refills = stored < self.warning
            || (stored > self.warning && previous_pass < self.count / self.cold);
        let tokens = if refills {
            stored.saturating_add(refill)
        } else {
            stored
        };
        tokens.min(self.max).saturating_sub(previous_pass)
    }
}

/// The next `f64` above `x` (Java's `Math.nextUp`), for positive finite `x`.
fn next_up(x: f64) -> f64 {
    if x.is_finite() && x >= 0.0 {
        f64::from_bits(x.to_bits() + 1)
    } else {
        x
    }
}

/// One key's warm-up state.
pub(crate) struct WarmUp {
    /// Stored tokens. Written only by the caller that won the window's swap
    /// of `passes` (once per window); read by every check. Relaxed: a check
    /// that reads the tokens of the window before decides with a limit one
    /// window old, which is what Sentinel's unsynchronized fields give too.
    stored: AtomicU64,
    /// The window start of the last sync, or `NEVER`. Stored with Release
    /// after the syncer's swap of `passes`, loaded with Acquire: a caller
    /// that sees a window as synced then sees that window's pass word, so
    /// it counts its pass there instead of taking the word for stale.
    last_filled: AtomicU64,
    /// `window index (low TAG_BITS) << COUNT_BITS | passes in that window`.
    /// The swap to a new index is the election of the window's syncer.
    passes: AtomicU64,
}

impl WarmUp {
    /// A cold key: the first sync fills it.
    pub(crate) fn new() -> Self {
        WarmUp {
            stored: AtomicU64::new(0),
            last_filled: AtomicU64::new(NEVER),
            passes: AtomicU64::new(UNSYNCED),
        }
    }

    /// The limit for a request at `now`: syncs the tokens if `now` starts a
    /// new window, then reads the curve.
    pub(crate) fn limit_at(&self, now: u64, interval_ms: u64, curve: &Curve) -> u64 {
        self.roll(now, interval_ms, curve);
        curve.allowed(self.stored.load(Ordering::Relaxed))
    }

    /// Counts one pass at `now` towards the window's pass count.
    pub(crate) fn record_pass(&self, now: u64, interval_ms: u64, curve: &Curve) {
        let tag = tag_of(now, interval_ms);
        // Relaxed: the word is its own state; no other memory hangs on it.
        let mut word = self.passes.load(Ordering::Relaxed);
        loop {
            if word == UNSYNCED || word >> COUNT_BITS != tag {
                // A pass that opens a window: sync first, then count.
                self.roll(now, interval_ms, curve);
                word = self.passes.load(Ordering::Relaxed);
                if word == UNSYNCED || word >> COUNT_BITS != tag {
                    // The window moved on meanwhile; this pass belongs to
                    // one that is over, and its sync is done.
                    return;
                }
            }
            // Saturates one short of the mask, so no word is `UNSYNCED`.
            let next = (word & !COUNT_MASK) | ((word & COUNT_MASK) + 1).min(COUNT_MASK - 1);
            match self.passes.compare_exchange_weak(
                word,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => word = actual,
            }
        }
    }

    /// Moves the pass word to the window of `now`, syncing the tokens once
    /// per window (by whoever swaps the word).
    fn roll(&self, now: u64, interval_ms: u64, curve: &Curve) {
        let start = now - now % interval_ms;
        let tag = tag_of(now, interval_ms);
        let word = self.passes.load(Ordering::Relaxed);
        let last = self.last_filled.load(Ordering::Acquire);
        if last != NEVER && start <= last {
            return;
        }
        if word != UNSYNCED && word >> COUNT_BITS == tag {
            // Swapped already: its syncer is at work (or the key was idle
            // for a multiple of 2^24 windows, when the tag repeats; the
            // tokens then stay as they were).
            return;
        }
        let fresh = tag << COUNT_BITS;
        if self
            .passes
            .compare_exchange(word, fresh, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            // Another caller swapped it: it syncs.
            return;
        }
        // The previous window's passes, if the word held exactly that one.
        let previous_tag = tag_of(start.saturating_sub(interval_ms), interval_ms);
        let previous_pass =
            if word != UNSYNCED && start >= interval_ms && word >> COUNT_BITS == previous_tag {
                word & COUNT_MASK
            } else {
                0
            };
        let elapsed = if word == UNSYNCED || last == NEVER {
            // Never filled: Sentinel's `lastFilledTime` starts at 0, so the
            // first sync refills to the cap. A key starts cold.
            u64::MAX
        } else {
            (start - last) / interval_ms
        };
        let stored = self.stored.load(Ordering::Relaxed);
        self.stored.store(
            curve.synced(stored, elapsed, previous_pass),
            Ordering::Relaxed,
        );
        self.last_filled.store(start, Ordering::Release);
    }

    /// The stored tokens (for tests and debugging).
    pub(crate) fn stored(&self) -> u64 {
        self.stored.load(Ordering::Relaxed)
    }
}

/// The warm-up curve of a key whose limit is `limit` per `interval_ms`,
/// with `settings`' period counted in windows.
pub(crate) fn curve(settings: WarmUpSettings, limit: u64, interval_ms: u64) -> Curve {
    let period_windows = settings.period_ms as f64 / interval_ms as f64;
    Curve::new(limit, period_windows, settings.cold_factor)
}

/// The limit a key whose full limit is `limit` admits against at `at`:
/// what its warm-up `state` allows so far (syncing the tokens if `at`
/// opens a window).
pub(crate) fn warmed_limit(
    settings: WarmUpSettings,
    state: &WarmUp,
    at: u64,
    limit: u64,
    interval_ms: u64,
) -> u64 {
    state.limit_at(at, interval_ms, &curve(settings, limit, interval_ms))
}

/// Counts a pass at `at` towards the warm-up `state` of a key whose full
/// limit is `limit`.
#[inline(never)]
pub(crate) fn record_pass(
    settings: WarmUpSettings,
    state: &WarmUp,
    at: u64,
    limit: u64,
    interval_ms: u64,
) {
    state.record_pass(at, interval_ms, &curve(settings, limit, interval_ms));
}

fn tag_of(now: u64, interval_ms: u64) -> u64 {
    (now / interval_ms) & ((1 << TAG_BITS) - 1)
}

impl fmt::Debug for WarmUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WarmUp")
            .field("stored_tokens", &self.stored())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// Two callers open a new window at once, each then recording a pass:
    /// exactly one syncs the tokens (the previous window's 4 passes are
    /// spent once), and both passes are counted in the new window.
    #[test]
    fn one_sync_per_window_and_no_pass_lost() {
        loom::model(|| {
            let curve = Curve::new(10, 10.0, 3);
            let warm = Arc::new(WarmUp::new());
            // Window 1: synced (cold: 100 tokens), four passes.
            warm.limit_at(1_000, 1_000, &curve);
            for _ in 0..4 {
                warm.record_pass(1_000, 1_000, &curve);
            }
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let warm = Arc::clone(&warm);
                    thread::spawn(move || {
                        warm.limit_at(2_000, 1_000, &curve);
                        warm.record_pass(2_000, 1_000, &curve);
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            // 100 - 4: above the warning line and the previous window ran
            // above the cold rate (4 >= 10 / 3), so no refill.
            assert_eq!(warm.stored(), 96);
            assert_eq!(warm.passes.load(Ordering::Relaxed) & COUNT_MASK, 2);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_constants_for_count_10_period_10() {
        // Sentinel's documented example: warning 50, max 100, slope 0.004.
        let curve = Curve::new(10, 10.0, 3);
        assert_eq!(curve.warning, 50);
        assert_eq!(curve.max, 100);
        assert!((curve.slope - 0.004).abs() < 1e-12, "{}", curve.slope);
        // Cold: a third of the limit; warm: the limit.
        assert_eq!(curve.allowed(100), 3);
        assert_eq!(curve.allowed(49), 10);
        assert_eq!(curve.allowed(50), 10);
        // Half-way down the slope: 1 / (25 * 0.004 + 0.1) = 5.
        assert_eq!(curve.allowed(75), 5);
    }

    /// Sentinel's controller, written out in floating point from its
    /// formulas, for one request per call: the per-window passes of a key
    /// offered `offered` requests in every window.
    fn sentinel_model(count: u64, period: f64, offered: u64, windows: usize) -> Vec<u64> {
        let cold = 3.0;
        let warning = ((period * count as f64).floor() as i64 / 2) as f64;
        let max = warning + (2.0 * period * count as f64 / (1.0 + cold)).floor();
        let slope = (cold - 1.0) / count as f64 / (max - warning);
        let mut stored = 0.0f64;
        let mut last_filled: Option<u64> = None;
        let mut previous = 0u64;
        let mut out = Vec::new();
        for w in 0..windows as u64 {
            // syncToken(previousPassQps)
            let elapsed = last_filled.map_or(1e12, |l| (w - l) as f64);
            let mut tokens = stored;
            if stored < warning || (stored > warning && (previous as f64) < (count / 3) as f64) {
                tokens = stored + elapsed * count as f64;
            }
            stored = (tokens.min(max) - previous as f64).max(0.0);
            last_filled = Some(w);
            let mut passed = 0u64;
            for _ in 0..offered {
                let allowed = if stored >= warning {
                    let q = 1.0 / ((stored - warning) * slope + 1.0 / count as f64);
                    f64::from_bits(q.to_bits() + 1)
                } else {
                    count as f64
                };
                if (passed + 1) as f64 <= allowed {
                    passed += 1;
                }
            }
            previous = passed;
            out.push(passed);
        }
        out
    }

    fn ours(count: u64, period: f64, offered: u64, windows: usize) -> Vec<u64> {
        let curve = Curve::new(count, period, 3);
        let warm = WarmUp::new();
        let interval = 1000;
        let mut out = Vec::new();
        for w in 0..windows as u64 {
            let now = 5_000 + w * interval;
            let mut passed = 0;
            for _ in 0..offered {
                if passed < warm.limit_at(now, interval, &curve) {
                    passed += 1;
                    warm.record_pass(now, interval, &curve);
                }
            }
            out.push(passed);
        }
        out
    }

    #[test]
    fn overload_warms_up_like_sentinel() {
        for (count, period) in [(10, 10.0), (100, 10.0), (100, 5.0), (1000, 3.0)] {
            let want = sentinel_model(count, period, count * 3, 40);
            assert_eq!(ours(count, period, count * 3, 40), want, "{count}/{period}");
            // It starts at a third of the limit and reaches the limit.
            assert_eq!(want[0], count / 3);
            assert_eq!(*want.last().unwrap(), count);
        }
    }

    #[test]
    fn idle_time_cools_the_key_down_again() {
        let curve = Curve::new(100, 10.0, 3);
        let warm = WarmUp::new();
        let mut now = 0;
        // Warm it up fully.
        for _ in 0..40 {
            now += 1000;
            for _ in 0..warm.limit_at(now, 1000, &curve) {
                warm.record_pass(now, 1000, &curve);
            }
        }
        assert_eq!(warm.limit_at(now, 1000, &curve), 100);
        // Ten quiet seconds: back to cold.
        now += 10_000;
        assert_eq!(warm.limit_at(now, 1000, &curve), 33);
    }

    #[test]
    fn hostile_settings_stay_finite() {
        for curve in [
            Curve::new(0, 10.0, 3),
            Curve::new(u64::MAX, 1e12, 3),
            Curve::new(1, 0.0, 3),
            Curve::new(5, 1.0, u64::MAX),
        ] {
            for stored in [0, 1, curve.warning, curve.max, u64::MAX] {
                assert!(curve.allowed(stored) <= curve.count);
            }
            let _ = curve.synced(u64::MAX, u64::MAX, u64::MAX);
        }
    }
}
