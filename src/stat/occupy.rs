//! Borrowing quota from future buckets: [`FutureBucketLeapArray`] (a ring of
//! reservations a user owns) and `Reservations`, the reservation ring
//! inside an occupiable admission ring. The admission ring that lends,
//! [`OccupiableBucketLeapArray`](super::OccupiableBucketLeapArray), is with
//! the other public face of that ring in `array_metric`.
//!
//! # The reservation ring
//!
//! `Reservations` is Sentinel's `FutureBucketLeapArray` as
//! `OccupiableBucketLeapArray` uses it.
//!
//! A reservation of `n` passes for the bucket starting at `s` is `n` passes
//! in this ring's bucket `s`. It counts as waiting while `s` lies ahead, and
//! as passes of bucket `s` once `s` has started: the admission ring starts
//! bucket `s` with them when it opens it, and reads count them even before.
//!
//! The ring is allocated on the first reservation, so rings that never
//! borrow do not pay for it. It has the admission ring's shape, so a start
//! has the same slot in both.
//!
//! Reusing a slot drops the reservation it held. If that reservation has
//! matured but the admission ring never opened its bucket, the passes would
//! be lost with it; the owner's `mature` callback opens that bucket first,
//! under this ring's rotation lock (lock order: reservation ring, then the
//! admission ring).

use std::fmt;
use std::sync::OnceLock;

use super::bucket::MetricBucket;
use super::leap_array::{LeapArray, WindowWrap};
use crate::error::ConfigError;
use crate::sync::backoff;

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

/// Borrowed quota, per future bucket.
pub(crate) struct Reservations {
    ring: OnceLock<LeapArray<MetricBucket>>,
    /// The admission ring's shape.
    window_length_ms: u64,
    interval_ms: u64,
    sample_count: usize,
}

impl Reservations {
    /// An empty reservation ring for an admission ring of this shape (already
    /// validated).
    pub(crate) fn with_shape_of<C>(main: &LeapArray<C>) -> Self {
        Reservations {
            ring: OnceLock::new(),
            window_length_ms: main.window_length_ms(),
            interval_ms: main.interval_ms(),
            sample_count: main.sample_count(),
        }
    }

    /// The ring, if anything was ever reserved.
    #[inline]
    pub(crate) fn ring(&self) -> Option<&LeapArray<MetricBucket>> {
        self.ring.get()
    }

    /// Passes reserved for the bucket starting at `start` (in slot `idx`, as
    /// in the admission ring).
    #[inline]
    pub(crate) fn held_at(&self, idx: usize, start: u64) -> Option<u64> {
        self.ring()?.held_at(idx, start).map(MetricBucket::pass)
    }

    /// Passes reserved for the bucket starting at `start`; 0 if none.
    pub(crate) fn reserved_for(&self, start: u64) -> u64 {
        self.ring()
            .and_then(|ring| ring.held(start))
            .map_or(0, MetricBucket::pass)
    }

    /// Reserved passes in buckets that start after `now`.
    pub(crate) fn waiting(&self, now: u64) -> u64 {
        self.ring().map_or(0, |ring| {
            ring.held_slots()
                .filter(|&(_, start, _)| start > now)
                .fold(0u64, |sum, (_, _, b)| sum.saturating_add(b.pass()))
        })
    }

    /// The newest bucket start anything was reserved for.
    #[inline]
    pub(crate) fn newest_start(&self) -> Option<u64> {
        self.ring()?.newest_start()
    }

    /// Reserves `n` passes in the bucket containing `future_time`. When a
    /// slot is reused, `mature(start, passes)` is called first, under this
    /// ring's rotation lock, with the reservation it held.
    pub(crate) fn reserve(&self, future_time: u64, n: u64, mature: impl FnOnce(u64, u64)) {
        let ring = self.ring.get_or_init(|| {
            LeapArray::from_shape(self.window_length_ms, self.interval_ms, self.sample_count)
        });
        let idx = match ring.find(future_time) {
            Ok((idx, _)) => idx,
            Err((idx, start)) => open(ring, idx, start, mature),
        };
        ring.value_at(idx).add_pass(n);
    }
}

/// Opens slot `idx` of the reservation ring for `start`: the rotation
/// protocol of `leap_array`, with the old reservation handed to `mature`
/// before the slot is emptied.
#[cold]
fn open(
    ring: &LeapArray<MetricBucket>,
    idx: usize,
    start: u64,
    mature: impl FnOnce(u64, u64),
) -> usize {
    let mut mature = Some(mature);
    let mut round = 0;
    loop {
        // Step 1: already holding this window (or a newer one).
        if ring.holding(idx, start).is_some() {
            return idx;
        }
        // Step 2: lock.
        let Some(mut rotation) = ring.try_lock_rotation() else {
            backoff(&mut round);
            continue;
        };
        // Step 3: re-check under the lock.
        if rotation.holding(idx, start).is_some() {
            return idx;
        }
        // The old reservation may have matured without its bucket ever
        // being opened: let the owner open it before it is dropped.
        if let Some(old) = rotation.previous(idx) {
            let passes = ring.value_at(idx).pass();
            if passes > 0 {
                if let Some(mature) = mature.take() {
                    mature(old, passes);
                }
            }
        }
        // Step 4: empty, publish; the guard unlocks on drop.
        ring.value_at(idx).reset();
        rotation.publish(idx, start);
        return idx;
    }
}
