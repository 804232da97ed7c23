//! [`FutureBucketLeapArray`]: a ring of reservations a user owns.

use std::fmt;

use super::bucket::MetricBucket;
use super::leap_array::LeapArray;
use super::window_wrap::WindowWrap;
use crate::error::ConfigError;

/// A ring of reservations: buckets count only while they are in the future.
/// Sentinel's `FutureBucketLeapArray`, the "borrow" side of an
/// [`OccupiableBucketLeapArray`](super::OccupiableBucketLeapArray).
///
/// This is a stand-alone ring you own, with plain [`MetricBucket`]s: nothing
/// else relies on its buckets, so they are yours to write and reset. (The
/// reservation ring inside an occupiable [`ArrayMetric`](super::ArrayMetric)
/// is never handed out.)
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
    ring: LeapArray<MetricBucket>,
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

    /// The underlying ring (this array's own: no other ring depends on it).
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
