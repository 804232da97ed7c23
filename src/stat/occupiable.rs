use std::fmt;

use super::metric_array::MetricArray;
use super::{LeapArray, MetricBucket, MetricNode, WindowWrap};
use crate::error::ConfigError;

/// A ring of reservations: buckets count only while they are in the future.
/// Sentinel's `FutureBucketLeapArray`, the "borrow" side of an
/// [`OccupiableBucketLeapArray`].
///
/// # Examples
///
/// ```
/// use tower_sliding_window::stat::FutureBucketLeapArray;
///
/// let future = FutureBucketLeapArray::new(10, 1000)?;
/// future.current_window(1_300).value().add_pass(2);
/// let waiting = |now| future.values(now).map(|b| b.pass()).sum::<u64>();
/// assert_eq!(waiting(1_000), 2);
/// assert_eq!(waiting(1_300), 0, "the bucket has started: no longer waiting");
/// # Ok::<(), tower_sliding_window::ConfigError>(())
/// ```
pub struct FutureBucketLeapArray {
    pub(crate) ring: LeapArray<MetricBucket>,
}

impl FutureBucketLeapArray {
    /// A ring of `sample_count` buckets over `interval_ms`.
    ///
    /// # Errors
    ///
    /// See [`LeapArray::new`].
    pub fn new(sample_count: usize, interval_ms: u64) -> Result<Self, ConfigError> {
        Ok(FutureBucketLeapArray {
            ring: LeapArray::new(sample_count, interval_ms)?,
        })
    }

    /// The bucket for `time_ms`, opened if needed.
    pub fn current_window(&self, time_ms: u64) -> WindowWrap<'_, MetricBucket> {
        self.ring.current_window(time_ms)
    }

    /// Held buckets that start after `now_ms`, in slot order.
    pub fn values(&self, now_ms: u64) -> impl Iterator<Item = &MetricBucket> + '_ {
        self.ring
            .held_slots()
            .filter(move |&(_, start, _)| start > now_ms)
            .map(|(_, _, bucket)| bucket)
    }

    /// The underlying ring.
    pub fn leap_array(&self) -> &LeapArray<MetricBucket> {
        &self.ring
    }
}

impl fmt::Debug for FutureBucketLeapArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FutureBucketLeapArray")
            .field("ring", &self.ring)
            .finish()
    }
}

/// A bucket ring that can lend quota from future buckets: Sentinel's
/// `OccupiableBucketLeapArray`.
///
/// Reservations ([`add_waiting`](Self::add_waiting)) wait in a
/// [`FutureBucketLeapArray`]. When the reserved bucket opens, its pass count
/// starts at the reservation; reads at a time inside that bucket count the
/// reservation as passes even before anything opens it.
/// [`ArrayMetric::occupiable`](super::ArrayMetric::occupiable) is the same
/// ring behind a clock.
///
/// # Examples
///
/// ```
/// use tower_sliding_window::stat::OccupiableBucketLeapArray;
///
/// let ring = OccupiableBucketLeapArray::new(2, 1000)?;
/// ring.add_waiting(1_000, 3);
/// assert_eq!(ring.current_waiting(700), 3);
/// assert_eq!(ring.current_window(1_000).value().pass(), 3);
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
    /// See [`LeapArray::new`].
    pub fn new(sample_count: usize, interval_ms: u64) -> Result<Self, ConfigError> {
        Ok(OccupiableBucketLeapArray {
            array: MetricArray::new(sample_count, interval_ms, true)?,
        })
    }

    /// The bucket for `now_ms`, opened if needed; a newly opened bucket starts
    /// with the passes reserved for it.
    pub fn current_window(&self, now_ms: u64) -> WindowWrap<'_, MetricBucket> {
        self.array.current_window(now_ms)
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

    /// The buckets the main ring holds for the window at `now_ms`, oldest
    /// first (see [`ArrayMetric::list`](super::ArrayMetric::list)).
    pub fn list(&self, now_ms: u64) -> Vec<WindowWrap<'_, MetricBucket>> {
        self.array.leap_array().list(now_ms)
    }
}

impl fmt::Debug for OccupiableBucketLeapArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OccupiableBucketLeapArray")
            .field("ring", self.array.leap_array())
            .finish_non_exhaustive()
    }
}
