//! `Breaker`: one circuit breaker's settings, a plain value checked when it
//! is built.

use std::time::Duration;

/// What a breaker measures, and its threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Measure {
    /// Completions slower than `max_rt_us`, as a share of all completions.
    SlowRatio { max_rt_us: u64, ratio: f64 },
    /// Failed completions, as a share of all completions.
    ErrorRatio { ratio: f64 },
    /// Failed completions, counted.
    ErrorCount { count: u64 },
}

/// The settings of one circuit breaker (Sentinel's degrade rule): what it
/// measures, its threshold, and how long it stays open.
///
/// Built with [`slow_ratio`](Self::slow_ratio),
/// [`error_ratio`](Self::error_ratio) or [`error_count`](Self::error_count),
/// adjusted with [`min_requests`](Self::min_requests),
/// [`stat_interval`](Self::stat_interval) and [`open_for`](Self::open_for),
/// and given to a layer with
/// [`SlidingWindowLayer::breaker`](crate::SlidingWindowLayer::breaker). The
/// value is only configuration: every key of the layer gets its own breaker
/// built from it. See the [module docs](crate::breaker) for the state
/// machine and an example of each kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Breaker {
    pub(crate) measure: Measure,
    pub(crate) min_requests: u64,
    pub(crate) stat_interval_ms: u64,
    pub(crate) open_for_ms: u64,
}

/// Default [`Breaker::min_requests`].
const DEFAULT_MIN_REQUESTS: u64 = 5;
/// Default [`Breaker::stat_interval`], in milliseconds.
const DEFAULT_STAT_INTERVAL_MS: u64 = 1_000;
/// Default [`Breaker::open_for`], in milliseconds.
const DEFAULT_OPEN_FOR_MS: u64 = 10_000;

impl Breaker {
    fn with(measure: Measure) -> Self {
        Breaker {
            measure,
            min_requests: DEFAULT_MIN_REQUESTS,
            stat_interval_ms: DEFAULT_STAT_INTERVAL_MS,
            open_for_ms: DEFAULT_OPEN_FOR_MS,
        }
    }

    /// Opens when more than `ratio` of the completions in the stat interval
    /// took longer than `max_rt` (Sentinel's slow-request ratio). A ratio of
    /// 1.0 opens only when every completion was slow. The probe succeeds
    /// when it is not a failure and takes at most `max_rt`.
    ///
    /// A slow call is seen when it completes: a call that is still running
    /// does not count yet, however long it has been running. The probe is
    /// the exception: once a request finds it has been out for longer than
    /// `max_rt`, it is known to be slow, and has failed (the breaker is
    /// open again for `open_for`), whether or not it ever completes.
    ///
    /// # Panics
    ///
    /// When `ratio` is not within `0.0..=1.0` (NaN included).
    pub fn slow_ratio(max_rt: Duration, ratio: f64) -> Self {
        check_ratio("slow_ratio", ratio);
        let max_rt_us = u64::try_from(max_rt.as_micros()).unwrap_or(u64::MAX);
        Self::with(Measure::SlowRatio { max_rt_us, ratio })
    }

    /// Opens when more than `ratio` of the completions in the stat interval
    /// were failures, as the layer's classifier decides (by default a 5xx
    /// response or an error of the inner service). A ratio of 1.0 opens
    /// only when every completion failed.
    ///
    /// # Panics
    ///
    /// When `ratio` is not within `0.0..=1.0` (NaN included).
    pub fn error_ratio(ratio: f64) -> Self {
        check_ratio("error_ratio", ratio);
        Self::with(Measure::ErrorRatio { ratio })
    }

    /// Opens when more than `count` completions in the stat interval were
    /// failures, as the layer's classifier decides.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use axum::{body::Body, http::StatusCode, routing::get, Router};
    /// use tower::ServiceExt;
    /// use tower_sliding_window::breaker::{Breaker, BreakerState};
    /// use tower_sliding_window::clock::ManualClock;
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// let clock = ManualClock::new(0);
    /// let layer = SlidingWindowLayer::qps(1_000)
    ///     .clock(clock.clone())
    ///     .breaker(Breaker::error_count(2).min_requests(1));
    /// let stats = layer.handle();
    /// let app = Router::new()
    ///     .route("/", get(|| async { StatusCode::BAD_GATEWAY }))
    ///     .layer(layer);
    /// let send = || async {
    ///     let request = http::Request::get("/").body(Body::empty()).unwrap();
    ///     app.clone().oneshot(request).await.unwrap().status()
    /// };
    ///
    /// // Two failures are not more than two: still closed.
    /// assert_eq!(send().await, StatusCode::BAD_GATEWAY);
    /// assert_eq!(send().await, StatusCode::BAD_GATEWAY);
    /// assert_eq!(stats.breakers(&()), [BreakerState::Closed]);
    /// // The third opens it, and the next request is cut off.
    /// assert_eq!(send().await, StatusCode::BAD_GATEWAY);
    /// assert_eq!(send().await, StatusCode::SERVICE_UNAVAILABLE);
    /// assert!(matches!(stats.breakers(&())[..], [BreakerState::Open { .. }]));
    /// # }
    /// ```
    pub fn error_count(count: u64) -> Self {
        Self::with(Measure::ErrorCount { count })
    }

    /// The fewest completions in the stat interval for the breaker to open
    /// (default 5): below it, the measure is not looked at.
    ///
    /// # Panics
    ///
    /// When `n` is 0.
    pub fn min_requests(mut self, n: u64) -> Self {
        assert!(
            n > 0,
            "Breaker::min_requests: invalid `min_requests`: must be at least 1 (got 0)"
        );
        self.min_requests = n;
        self
    }

    /// The interval the breaker counts completions over (default 1 s): one
    /// window of this length, restarted when it ends, as Sentinel's degrade
    /// rules count. It is the breaker's own, apart from the layer's window.
    ///
    /// # Panics
    ///
    /// When `interval` is shorter than 1 ms or not a whole number of
    /// milliseconds.
    pub fn stat_interval(mut self, interval: Duration) -> Self {
        self.stat_interval_ms = whole_millis("stat_interval", interval);
        self
    }

    /// How long the breaker stays open before it lets one probe through
    /// (default 10 s). A probe that has not completed after the longer of
    /// `open_for` and [`stat_interval`](Self::stat_interval) counts as
    /// failed (see [States](crate::breaker#states)).
    ///
    /// # Panics
    ///
    /// When `duration` is shorter than 1 ms or not a whole number of
    /// milliseconds.
    pub fn open_for(mut self, duration: Duration) -> Self {
        self.open_for_ms = whole_millis("open_for", duration);
        self
    }

    /// How long a probe may be out before it counts as failed, in
    /// milliseconds: the longer of `stat_interval` and `open_for`. A probe
    /// still running then (a handler that never answers, a body that never
    /// ends under `track_body`) is failed by the next request, which finds
    /// the breaker open again for `open_for`; the probe's own completion,
    /// when it comes, is counted as an ordinary one and decides nothing. A
    /// `slow_ratio` probe is failed sooner, as soon as a request finds it
    /// has been out for longer than `max_rt`.
    pub(crate) fn probe_deadline_ms(&self) -> u64 {
        self.stat_interval_ms.max(self.open_for_ms)
    }

    /// The kind of breaker, as named in `tracing` events.
    pub(crate) fn kind(&self) -> &'static str {
        match self.measure {
            Measure::SlowRatio { .. } => "slow_ratio",
            Measure::ErrorRatio { .. } => "error_ratio",
            Measure::ErrorCount { .. } => "error_count",
        }
    }

    /// Whether one completion counts against the breaker: a failure, or
    /// (for `slow_ratio`) slower than `max_rt`.
    #[inline]
    pub(crate) fn is_bad(&self, rt_us: u64, failed: bool) -> bool {
        match self.measure {
            Measure::SlowRatio { max_rt_us, .. } => rt_us > max_rt_us,
            Measure::ErrorRatio { .. } | Measure::ErrorCount { .. } => failed,
        }
    }

    /// Whether a probe that took `rt_us` and `failed` or not succeeded: not
    /// a failure and, for `slow_ratio`, not slow.
    #[inline]
    pub(crate) fn probe_succeeded(&self, rt_us: u64, failed: bool) -> bool {
        !failed && !self.is_bad(rt_us, failed)
    }

    /// Whether `bad` of `total` completions in the stat interval open the
    /// breaker: at least `min_requests`, and the measure strictly over the
    /// threshold (a ratio of 1.0 is met by 100%).
    #[inline]
    pub(crate) fn exceeded(&self, total: u64, bad: u64) -> bool {
        if total < self.min_requests || total == 0 {
            return false;
        }
        match self.measure {
            Measure::ErrorCount { count } => bad > count,
            Measure::SlowRatio { ratio, .. } | Measure::ErrorRatio { ratio } => {
                let measured = bad as f64 / total as f64;
                measured > ratio || (ratio >= 1.0 && bad >= total)
            }
        }
    }
}

fn check_ratio(method: &str, ratio: f64) {
    assert!(
        (0.0..=1.0).contains(&ratio),
        "Breaker::{method}: invalid `ratio`: must be within 0.0..=1.0 (got {ratio})"
    );
}

fn whole_millis(setting: &str, value: Duration) -> u64 {
    assert!(
        value.subsec_nanos() % 1_000_000 == 0,
        "Breaker::{setting}: invalid `{setting}`: must be a whole number of milliseconds \
         (got {value:?})"
    );
    let Ok(ms) = u64::try_from(value.as_millis()) else {
        panic!("Breaker::{setting}: invalid `{setting}`: too long (got {value:?})");
    };
    assert!(
        ms > 0,
        "Breaker::{setting}: invalid `{setting}`: must be at least 1 ms (got {value:?})"
    );
    // The state word keeps times in 62 bits (see `circuit.rs`).
    assert!(
        ms < 1 << 40,
        "Breaker::{setting}: invalid `{setting}`: too long (got {value:?})"
    );
    ms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_are_strict_and_wait_for_min_requests() {
        let b = Breaker::error_ratio(0.5).min_requests(4);
        assert!(!b.exceeded(3, 3), "below min_requests");
        assert!(!b.exceeded(4, 2), "exactly the ratio does not open");
        assert!(b.exceeded(4, 3));
        let b = Breaker::error_count(2).min_requests(1);
        assert!(!b.exceeded(10, 2));
        assert!(b.exceeded(3, 3));
    }

    #[test]
    fn a_ratio_of_one_opens_at_one_hundred_percent() {
        let b = Breaker::error_ratio(1.0).min_requests(2);
        assert!(!b.exceeded(2, 1));
        assert!(b.exceeded(2, 2));
    }

    #[test]
    fn slow_means_strictly_longer_than_max_rt() {
        let b = Breaker::slow_ratio(Duration::from_millis(10), 0.5);
        assert!(!b.is_bad(10_000, false));
        assert!(b.is_bad(10_001, false));
        assert!(b.probe_succeeded(10_000, false));
        assert!(!b.probe_succeeded(1, true), "a failed probe fails");
    }
}
