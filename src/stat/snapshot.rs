//! [`BucketSnapshot`]: what readers outside the crate get of a managed
//! bucket.

use std::time::Duration;

use super::counts::Counts;
use super::event::MetricEvent;

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
