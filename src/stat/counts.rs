//! The events a bucket counts ([`MetricEvent`]) and a bucket's counts as
//! plain numbers: `Counts` inside the crate, and the
//! two forms readers outside it get, [`BucketSnapshot`] (one bucket of a
//! managed ring, with its window) and [`MetricNode`] (one bucket or one
//! second, as data); and the response-time arithmetic every read path
//! shares.
//!
//! Response times are sums of microseconds that saturate at `u64::MAX`
//! rather than wrap (see `bucket`, "Tallies"), so an average can come out
//! low after absurd samples. Every average handed out goes through
//! [`Counts::avg_rt`] or [`clamp_avg`], which keep it at or above the
//! window's minimum: a reader never sees `avg_rt < min_rt`.

use std::time::Duration;

/// The events a [`MetricBucket`](super::MetricBucket) counts.
///
/// These are Sentinel's `MetricEvent`s. "Success" means *completed*: a
/// request that failed still counts as a success, and as an exception on top.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum MetricEvent {
    /// A request was admitted.
    Pass,
    /// A request was rejected by a limit.
    Block,
    /// A completed request was classified as a failure.
    Exception,
    /// A request completed (whatever its outcome).
    Success,
    /// Response time, in microseconds. Adding `n` adds `n` µs to the sum and
    /// offers `n` as a new minimum.
    Rt,
    /// A request passed by borrowing quota from a future bucket.
    OccupiedPass,
}

impl MetricEvent {
    /// All events, in declaration order.
    pub const ALL: [MetricEvent; 6] = [
        MetricEvent::Pass,
        MetricEvent::Block,
        MetricEvent::Exception,
        MetricEvent::Success,
        MetricEvent::Rt,
        MetricEvent::OccupiedPass,
    ];
}

/// A bucket's (or a window's) counters as plain numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) pass: u64,
    pub(crate) block: u64,
    pub(crate) exception: u64,
    pub(crate) success: u64,
    pub(crate) rt_micros: u64,
    pub(crate) occupied_pass: u64,
    /// `u64::MAX` when none.
    pub(crate) min_rt_micros: u64,
}

impl Default for Counts {
    fn default() -> Self {
        Counts {
            pass: 0,
            block: 0,
            exception: 0,
            success: 0,
            rt_micros: 0,
            occupied_pass: 0,
            min_rt_micros: u64::MAX,
        }
    }
}

impl Counts {
    /// Adds `other` into `self`, saturating.
    pub(crate) fn merge(&mut self, other: &Counts) {
        self.pass = self.pass.saturating_add(other.pass);
        self.block = self.block.saturating_add(other.block);
        self.exception = self.exception.saturating_add(other.exception);
        self.success = self.success.saturating_add(other.success);
        self.rt_micros = self.rt_micros.saturating_add(other.rt_micros);
        self.occupied_pass = self.occupied_pass.saturating_add(other.occupied_pass);
        self.min_rt_micros = self.min_rt_micros.min(other.min_rt_micros);
    }

    /// Whether any event was recorded.
    pub(crate) fn is_empty(&self) -> bool {
        *self == Counts::default()
    }

    /// The smallest response time, `None` when none was recorded.
    pub(crate) fn min_rt(&self) -> Option<Duration> {
        min_rt(self.min_rt_micros)
    }

    /// The average response time over the successes, never below
    /// [`min_rt`](Self::min_rt); `None` without successes.
    pub(crate) fn avg_rt(&self) -> Option<Duration> {
        clamp_avg(average_rt(self.rt_micros, self.success), self.min_rt_micros)
    }
}

/// `rt_sum / successes`, or `None` without successes. The raw quotient: a
/// caller that also has the minimum passes the result through [`clamp_avg`].
pub(crate) fn average_rt(rt_micros: u64, successes: u64) -> Option<Duration> {
    let nanos = u128::from(rt_micros) * 1000 / u128::from(successes.max(1));
    (successes != 0).then(|| Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)))
}

/// Raises an average to the minimum when it fell below it. That happens
/// only when the sum saturated after absurd response times, or when
/// successes were recorded without their response times; either way the
/// minimum is the better lower bound.
pub(crate) fn clamp_avg(avg: Option<Duration>, min_rt_micros: u64) -> Option<Duration> {
    avg.map(|avg| match min_rt(min_rt_micros) {
        Some(min) => avg.max(min),
        None => avg,
    })
}

/// A stored minimum (`u64::MAX` for none) as a duration.
pub(crate) fn min_rt(min_rt_micros: u64) -> Option<Duration> {
    (min_rt_micros != u64::MAX).then(|| Duration::from_micros(min_rt_micros))
}

/// A response time in whole microseconds, saturating.
pub(crate) fn micros(rt: Duration) -> u64 {
    u64::try_from(rt.as_micros()).unwrap_or(u64::MAX)
}

/// The counts of one bucket of a managed ring, copied at one moment,
/// together with the window the bucket held.
///
/// [`ArrayMetric::list`](super::ArrayMetric::list),
/// [`ArrayMetric::window_value`](super::ArrayMetric::window_value) and the
/// reads of [`OccupiableBucketLeapArray`](super::OccupiableBucketLeapArray)
/// return these instead of the bucket itself: the ring's buckets carry the
/// bookkeeping that keeps admission exact, and nothing a reader holds can
/// change them. Each counter is read on its own, so under concurrent writes
/// a snapshot is not a single instant of the whole bucket.
///
/// # Examples
///
/// ```
/// use tower_sliding_window::clock::ManualClock;
/// use tower_sliding_window::stat::ArrayMetric;
///
/// let clock = ManualClock::new(1_000);
/// let metric = ArrayMetric::with_clock(10, 1000, clock)?;
/// metric.add_pass(2);
/// metric.add_block(1);
///
/// let bucket = metric.window_value(1_000).expect("the bucket at 1 000");
/// assert_eq!((bucket.window_start(), bucket.pass(), bucket.block()), (1_000, 2, 1));
/// assert!(bucket.is_time_in_window(1_099));
/// # Ok::<(), tower_sliding_window::ConfigError>(())
/// ```
///
/// A snapshot cannot reset the bucket it was taken from (nor can anything
/// else a managed ring hands out):
///
/// ```compile_fail
/// use tower_sliding_window::clock::ManualClock;
/// use tower_sliding_window::stat::ArrayMetric;
///
/// let metric = ArrayMetric::with_clock(10, 1000, ManualClock::new(0)).unwrap();
/// metric.add_pass(1);
/// metric.window_value(0).unwrap().reset();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketSnapshot {
    window_start: u64,
    window_length_ms: u64,
    counts: Counts,
}

impl BucketSnapshot {
    pub(crate) fn new(window_start: u64, window_length_ms: u64, counts: Counts) -> Self {
        BucketSnapshot {
            window_start,
            window_length_ms,
            counts,
        }
    }

    /// Start of the bucket's window, in clock milliseconds.
    pub fn window_start(&self) -> u64 {
        self.window_start
    }

    /// Length of one bucket, in milliseconds.
    pub fn window_length_ms(&self) -> u64 {
        self.window_length_ms
    }

    /// Whether `time_ms` falls in `[window_start, window_start + length)`.
    pub fn is_time_in_window(&self, time_ms: u64) -> bool {
        time_ms >= self.window_start && time_ms - self.window_start < self.window_length_ms
    }

    /// The counter for `event` ([`MetricEvent::Rt`]: the sum in
    /// microseconds).
    pub fn get(&self, event: MetricEvent) -> u64 {
        match event {
            MetricEvent::Pass => self.counts.pass,
            MetricEvent::Block => self.counts.block,
            MetricEvent::Exception => self.counts.exception,
            MetricEvent::Success => self.counts.success,
            MetricEvent::Rt => self.counts.rt_micros,
            MetricEvent::OccupiedPass => self.counts.occupied_pass,
        }
    }

    /// Admitted requests.
    pub fn pass(&self) -> u64 {
        self.counts.pass
    }

    /// Rejected requests.
    pub fn block(&self) -> u64 {
        self.counts.block
    }

    /// Completed requests classified as failures.
    pub fn exception(&self) -> u64 {
        self.counts.exception
    }

    /// Completed requests.
    pub fn success(&self) -> u64 {
        self.counts.success
    }

    /// Requests that passed on borrowed (future) quota.
    pub fn occupied_pass(&self) -> u64 {
        self.counts.occupied_pass
    }

    /// The sum of the response times.
    pub fn rt(&self) -> Duration {
        Duration::from_micros(self.counts.rt_micros)
    }

    /// The smallest response time, or `None` if there was none.
    pub fn min_rt(&self) -> Option<Duration> {
        self.counts.min_rt()
    }
}

/// The counts of one bucket (or one second) at a point in time: Sentinel's
/// `MetricNode`, as returned by [`ArrayMetric::details`](super::ArrayMetric::details)
/// and [`StatisticNode::metrics`](super::StatisticNode::metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct MetricNode {
    /// Start of the bucket, in clock milliseconds.
    pub timestamp_ms: u64,
    /// Admitted requests.
    pub pass: u64,
    /// Rejected requests.
    pub block: u64,
    /// Completed requests.
    pub success: u64,
    /// Completed requests classified as failures.
    pub exception: u64,
    /// Requests admitted on borrowed quota.
    pub occupied_pass: u64,
    /// Average response time over the successes; `None` when there were
    /// none. Never below the bucket's smallest response time.
    pub rt: Option<Duration>,
}

impl MetricNode {
    pub(crate) fn from_counts(start: u64, counts: &Counts) -> Self {
        MetricNode {
            timestamp_ms: start,
            pass: counts.pass,
            block: counts.block,
            success: counts.success,
            exception: counts.exception,
            occupied_pass: counts.occupied_pass,
            rt: counts.avg_rt(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn average_never_drops_below_the_minimum() {
        // A saturated sum over two successes of half the range each.
        let counts = Counts {
            success: 4,
            rt_micros: u64::MAX,
            min_rt_micros: u64::MAX / 2,
            ..Counts::default()
        };
        assert_eq!(counts.avg_rt(), counts.min_rt());
        assert!(counts.avg_rt() >= counts.min_rt());
    }

    #[test]
    fn average_without_rt_is_the_plain_quotient() {
        let counts = Counts {
            success: 2,
            rt_micros: 10,
            ..Counts::default()
        };
        assert_eq!(counts.avg_rt(), Some(Duration::from_micros(5)));
        assert_eq!(Counts::default().avg_rt(), None);
    }
}
