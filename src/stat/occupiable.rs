//! [`OccupiableBucketLeapArray`]: an admission ring that lends quota from
//! future buckets, at explicit times.

use std::fmt;

use super::event::MetricEvent;
use super::metric_array::MetricArray;
use super::metric_node::MetricNode;
use super::snapshot::BucketSnapshot;
use crate::error::ConfigError;

/// A bucket ring that can lend quota from future buckets: Sentinel's
/// `OccupiableBucketLeapArray`.
///
/// Reservations ([`add_waiting`](Self::add_waiting)) wait in a reservation
/// ring of the same shape. When the reserved bucket opens, its pass count
/// starts at the reservation; reads at a time inside that bucket count the
/// reservation as passes even before anything opens it.
/// [`ArrayMetric::occupiable`](super::ArrayMetric::occupiable) is the same
/// ring behind a clock.
///
/// Its buckets are managed (they carry the bookkeeping the ring relies on):
/// record through [`add`](Self::add) and read [`BucketSnapshot`]s.
///
/// # Examples
///
/// ```
/// use tower_sliding_window::stat::OccupiableBucketLeapArray;
///
/// let ring = OccupiableBucketLeapArray::new(2, 1000)?;
/// ring.add_waiting(1_000, 3);
/// assert_eq!(ring.current_waiting(700), 3);
/// assert_eq!(ring.current_window(1_000).pass(), 3);
/// assert_eq!(ring.current_waiting(1_000), 0);
/// # Ok::<(), tower_sliding_window::ConfigError>(())
/// ```
pub struct OccupiableBucketLeapArray {
    array: MetricArray,
}

impl OccupiableBucketLeapArray {
    /// A ring of `sample_count` buckets over `interval_ms`, with a reservation
    /// ring of the same shape.
    ///
    /// # Errors
    ///
    /// See [`LeapArray::new`](super::LeapArray::new).
    pub fn new(sample_count: usize, interval_ms: u64) -> Result<Self, ConfigError> {
        Ok(OccupiableBucketLeapArray {
            array: MetricArray::new(sample_count, interval_ms, true)?,
        })
    }

    /// Opens the bucket for `now_ms` if needed (a newly opened bucket starts
    /// with the passes reserved for it) and returns a snapshot of it.
    pub fn current_window(&self, now_ms: u64) -> BucketSnapshot {
        self.array.current_snapshot(now_ms)
    }

    /// Records `n` events in the bucket for `now_ms` (opened if needed). For
    /// [`MetricEvent::Rt`], `n` is a response time in microseconds.
    ///
    /// ```
    /// use tower_sliding_window::stat::{MetricEvent, OccupiableBucketLeapArray};
    ///
    /// let ring = OccupiableBucketLeapArray::new(2, 1000)?;
    /// ring.add(700, MetricEvent::Pass, 2);
    /// assert_eq!(ring.current_window(700).pass(), 2);
    /// # Ok::<(), tower_sliding_window::ConfigError>(())
    /// ```
    pub fn add(&self, now_ms: u64, event: MetricEvent, n: u64) {
        let tallies = || self.array.current(now_ms).tallies();
        match event {
            MetricEvent::Pass => self.array.add_pass(now_ms, n),
            MetricEvent::Block => tallies().add_block(n),
            MetricEvent::Exception => tallies().add_exception(n),
            MetricEvent::Success => tallies().add_success(n),
            MetricEvent::Rt => tallies().add_rt_micros(n, n),
            MetricEvent::OccupiedPass => tallies().add_occupied_pass(n),
        }
    }

    /// Reserves `n` passes in the bucket containing `future_time_ms`.
    pub fn add_waiting(&self, future_time_ms: u64, n: u64) {
        self.array.add_waiting(None, future_time_ms, n);
    }

    /// Passes reserved in buckets that start after `now_ms`.
    pub fn current_waiting(&self, now_ms: u64) -> u64 {
        self.array.waiting(now_ms)
    }

    /// One [`MetricNode`] per bucket in the window at `now_ms`, oldest first,
    /// matured reservations included.
    pub fn details(&self, now_ms: u64) -> Vec<MetricNode> {
        self.array.details(now_ms)
    }

    /// Snapshots of the buckets the ring holds for the window at `now_ms`,
    /// oldest first (see [`ArrayMetric::list`](super::ArrayMetric::list)).
    pub fn list(&self, now_ms: u64) -> Vec<BucketSnapshot> {
        self.array.list(now_ms)
    }
}

impl fmt::Debug for OccupiableBucketLeapArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OccupiableBucketLeapArray")
            .field("sample_count", &self.array.sample_count())
            .field("interval_ms", &self.array.interval_ms())
            .finish_non_exhaustive()
    }
}
