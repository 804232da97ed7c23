//! The bucket ring: [`LeapArray`], the [`WindowWrap`] views it hands out,
//! and the rotation lock its owners open buckets under.
//!
//! # Implementation details
//!
//! A slot is a window stamp (the start of the window its bucket holds) next
//! to the bucket. Recording at time `t`:
//!
//! 1. Load the stamp of slot `(t / len) % sample_count` (`Acquire`). If it is
//!    `start(t)` or newer, write into the bucket in place and stop.
//! 2. Otherwise the slot holds an older window. Take the ring's rotation
//!    lock ([`LeapArray::try_lock_rotation`]): a bit in one `AtomicU64` that
//!    also holds the newest window start ever published, taken with a
//!    compare-and-swap (`Acquire`). If it is held, back off and go to 1.
//! 3. With the returned [`Rotation`] guard, re-load the stamp: the previous
//!    holder may have opened this very bucket. If so, drop the guard and use
//!    the bucket.
//! 4. Empty the bucket (the owner decides how: a plain reset, or a take
//!    that rolls the counts up elsewhere), then [`Rotation::publish`] the new
//!    start with a `Release` store to the stamp. Dropping the guard releases
//!    the lock (`Release`, recording the newest start), also on unwind.
//!
//! Owners with more bookkeeping (the admission ring in `admission`, the
//! reservation ring in `occupy`) write their own step 4 in one
//! function, in order, around the same guard.
//!
//! Why no event is lost or counted twice:
//!
//! - A writer **of the new window** adds only after loading the new stamp
//!   with `Acquire`, which synchronises with the `Release` publication that
//!   follows the reset. The reset happens-before its add, so the reset
//!   cannot overwrite it. (Sentinel publishes the new start *before*
//!   resetting, and resets without re-checking, so concurrent writes of the
//!   new window can be wiped: alibaba/Sentinel#2230.)
//! - Only one thread at a time can open buckets in a ring, and it re-checks
//!   under the lock, so a bucket is reset once per window, never twice.
//! - A **late writer** (it loaded the old stamp, then was delayed past the
//!   rotation) adds either before the reset, so the event counts in the old
//!   window, which has just slid out, or after it, so it counts in the new
//!   one, as any write behind its slot does. Each `fetch_add` lands exactly
//!   once in exactly one window.
//!
//! The lock is held only to open a bucket (at most once per bucket length
//! per ring) and covers a few stores; recording within a bucket never
//! touches it. A thread that needs the bucket being opened waits for those
//! stores; a thread writing into any other bucket does not wait at all.
//!
//! Readers do not lock. They may observe a bucket mid-reset and so see a
//! window whose counts are torn across buckets, but never a count from a
//! window that is not in range: a bucket counts only if its stamp, loaded
//! with `Acquire` before its counters, is in the window.

use std::fmt;

use super::bucket::MetricBucket;
use crate::error::ConfigError;
use crate::sync::{backoff, AtomicU64, AtomicUsize, Ordering};

/// A value a [`LeapArray`] can keep per bucket.
///
/// The array reuses values in place: when a slot moves on to a new window its
/// value is [`reset`](BucketValue::reset) first. `reset` must not panic, and
/// writes racing with it must leave the value usable (plain atomics do).
pub trait BucketValue: Default + Send + Sync + 'static {
    /// Returns the value to its empty state.
    fn reset(&self);
}

impl BucketValue for MetricBucket {
    fn reset(&self) {
        MetricBucket::reset(self);
    }
}

/// The largest supported sample count.
///
/// A ring costs one 64-byte slot per bucket, allocated up front, and a
/// `StatisticNode` keeps one per key, so the cap bounds what each key
/// costs. Memory per `StatisticNode`, in bytes:
///
/// ```text
///   size_of::<StatisticNode>()                    (struct, inline)
/// + 80 × sample_count                             (second window: 64-byte slot,
///                                                  8-byte admission cache,
///                                                  8-byte roll-up bookkeeping)
/// + 64 × 60                                       (minute window)
/// + 64 × sample_count, once anything is reserved  (reservation ring)
/// ```
///
/// On a 64-bit target the struct is 312 bytes, so the default node (10
/// samples) holds 4 640 bytes on the heap and 4 952 in all, 5 592 once it
/// lends quota (`tests/no_alloc.rs` checks these figures); at the cap of
/// 600, 52 152 bytes (90 552 with reservations). Finer buckets than a tenth of a
/// second over a minute-long window buy no accuracy worth that.
pub(crate) const MAX_SAMPLE_COUNT: usize = 600;

/// Times are clamped to this (about 146 million years of milliseconds), which
/// keeps every window start below the lock bit of `LeapArray::rotation`.
pub(crate) const MAX_TIME: u64 = 1 << 62;

/// Stamp of a slot that has never held a window. Distinct from every real
/// start, so time 0 is an ordinary time.
const EMPTY: u64 = u64::MAX;

/// Lock bit of `LeapArray::rotation`.
const LOCKED: u64 = 1 << 63;

/// A ring of `sample_count` buckets that together cover the last
/// `interval_ms` milliseconds: Sentinel's `LeapArray`.
///
/// Bucket `i` covers `[start, start + window_length)` where
/// `window_length = interval_ms / sample_count`, `start = t - t % window_length`
/// and the slot is `(t / window_length) % sample_count`. The window at time `t`
/// is exactly the buckets whose starts lie in `(start(t) - interval, start(t)]`;
/// a bucket older than that is never counted, even before its slot is reused.
///
/// Buckets are opened lazily by [`current_window`](Self::current_window), the
/// only method that writes. Reads never open a bucket and never need a prior
/// write. Rotation never loses an event nor counts one twice under
/// concurrency; the protocol is described at the top of
/// `src/stat/leap_array.rs`.
///
/// # Examples
///
/// ```
/// use tower_sliding_window::stat::{BucketLeapArray, LeapArray, MetricBucket};
///
/// // Ten 100 ms buckets over one second.
/// let array: BucketLeapArray = LeapArray::new(10, 1000)?;
/// array.current_window(1_050).value().add_pass(2);
/// array.current_window(1_420).value().add_pass(1);
///
/// let total: u64 = array.values(1_499).map(MetricBucket::pass).sum();
/// assert_eq!(total, 3);
/// // At 2 050 the bucket that started at 1 000 has slid out.
/// let total: u64 = array.values(2_050).map(MetricBucket::pass).sum();
/// assert_eq!(total, 1);
/// # Ok::<(), tower_sliding_window::ConfigError>(())
/// ```
pub struct LeapArray<B> {
    window_length_ms: u64,
    interval_ms: u64,
    sample_count: usize,
    slots: Box<[Slot<B>]>,
    /// Rotation lock (bit 63) and one more than the newest window start ever
    /// published (bits 0..63; 0 before the first, so that a first window at
    /// time 0 is still recognised as the newest). Every bucket opening happens with
    /// the lock held, so openings are totally ordered; the newest start lets
    /// a caller whose clock lags catch up with the others.
    rotation: AtomicU64,
    /// Slot of the newest window start, written with the lock held before
    /// the lock is released. Read without the lock only as a hint: the fast
    /// path confirms it against the slot's stamp.
    newest_slot: AtomicUsize,
}

/// One bucket with the start of the window it currently holds.
///
/// Aligned to a cache line: a `MetricBucket` (56 bytes) and its stamp fill
/// exactly one, so two slots never share a line.
#[repr(align(64))]
struct Slot<B> {
    /// Start of the window whose counts `value` holds, or `EMPTY`.
    ///
    /// Written only by the thread holding the rotation lock, with `Release`,
    /// after the value was reset: a thread that loads a start with `Acquire`
    /// and then writes cannot have its write undone by that reset.
    stamp: AtomicU64,
    value: B,
}

/// A type alias for the ring of [`MetricBucket`]s: Sentinel's
/// `BucketLeapArray`.
pub type BucketLeapArray = LeapArray<MetricBucket>;

impl<B: BucketValue> LeapArray<B> {
    /// A ring of `sample_count` buckets over `interval_ms` milliseconds.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field when `sample_count` is 0 or above
    /// 600 (each bucket is allocated up front), when `interval_ms` is 0, or when `interval_ms` is not a multiple
    /// of `sample_count`.
    pub fn new(sample_count: usize, interval_ms: u64) -> Result<Self, ConfigError> {
        let window_length_ms = validate(sample_count, interval_ms)?;
        Ok(Self::build(window_length_ms, interval_ms, sample_count))
    }

    /// An empty ring of an already validated shape.
    pub(crate) fn from_shape(window_length_ms: u64, interval_ms: u64, sample_count: usize) -> Self {
        Self::build(window_length_ms, interval_ms, sample_count)
    }

    fn build(window_length_ms: u64, interval_ms: u64, sample_count: usize) -> Self {
        LeapArray {
            window_length_ms,
            interval_ms,
            sample_count,
            slots: (0..sample_count)
                .map(|_| Slot {
                    stamp: AtomicU64::new(EMPTY),
                    value: B::default(),
                })
                .collect(),
            rotation: AtomicU64::new(0),
            newest_slot: AtomicUsize::new(0),
        }
    }
}

/// Checks a window configuration and returns the bucket length.
pub(crate) fn validate(sample_count: usize, interval_ms: u64) -> Result<u64, ConfigError> {
    if sample_count == 0 {
        return Err(ConfigError::new(
            "sample_count",
            "must be greater than 0",
            "got 0",
        ));
    }
    if interval_ms == 0 {
        return Err(ConfigError::new(
            "interval_ms",
            "must be greater than 0",
            "got 0",
        ));
    }
    if interval_ms % sample_count as u64 != 0 {
        return Err(ConfigError::new(
            "interval_ms",
            "must be a multiple of `sample_count`",
            format!("got {interval_ms}, sample_count = {sample_count}"),
        ));
    }
    // After the shape checks, so that a shape that is wrong anyway is
    // reported as such. Each bucket is allocated up front: see
    // `MAX_SAMPLE_COUNT` for what a ring costs.
    if sample_count > MAX_SAMPLE_COUNT {
        return Err(ConfigError::new(
            "sample_count",
            "must be at most 600",
            format!("got {sample_count}; each bucket is allocated up front"),
        ));
    }
    let sample_count = sample_count as u64;
    Ok(interval_ms / sample_count)
}

impl<B> LeapArray<B> {
    /// Number of buckets in the ring.
    pub fn sample_count(&self) -> usize {
        self.sample_count
    }

    /// Length of the whole window, in milliseconds.
    pub fn interval_ms(&self) -> u64 {
        self.interval_ms
    }

    /// Length of one bucket, in milliseconds.
    pub fn window_length_ms(&self) -> u64 {
        self.window_length_ms
    }

    /// Slot index and bucket start for `time_ms`.
    #[inline]
    pub(crate) fn locate(&self, time_ms: u64) -> (usize, u64) {
        let time_ms = time_ms.min(MAX_TIME);
        let lap = time_ms / self.window_length_ms;
        let idx = (lap % self.sample_count as u64) as usize;
        debug_assert!(idx < self.slots.len(), "slot index out of range");
        (idx, lap * self.window_length_ms)
    }

    /// Start of the bucket containing `time_ms`.
    #[inline]
    pub(crate) fn start_of(&self, time_ms: u64) -> u64 {
        let time_ms = time_ms.min(MAX_TIME);
        time_ms - time_ms % self.window_length_ms
    }

    /// Slot index of the bucket starting at `start`.
    #[inline]
    pub(crate) fn index_of(&self, start: u64) -> usize {
        ((start / self.window_length_ms) % self.sample_count as u64) as usize
    }

    /// The newest window start any thread has opened, if any.
    #[inline]
    pub(crate) fn newest_start(&self) -> Option<u64> {
        (self.rotation.load(Ordering::Acquire) & !LOCKED).checked_sub(1)
    }

    /// The window start slot `idx` holds, if it holds one.
    #[inline]
    pub(crate) fn held_start(&self, idx: usize) -> Option<u64> {
        // Acquire pairs with the Release that published the window, so the
        // reset of the value is visible before any of its counts are read.
        match self.slots[idx].stamp.load(Ordering::Acquire) {
            EMPTY => None,
            start => Some(start),
        }
    }

    #[inline]
    pub(crate) fn value_at(&self, idx: usize) -> &B {
        &self.slots[idx].value
    }

    /// The bucket for `start` if its slot holds exactly that window.
    #[inline]
    pub(crate) fn held(&self, start: u64) -> Option<&B> {
        let idx = self.index_of(start);
        (self.held_start(idx) == Some(start)).then(|| &self.slots[idx].value)
    }

    /// The bucket for `start`, in slot `idx`, if the slot holds exactly that
    /// window. `idx` must be `start`'s slot (as from `window_slots`).
    #[inline]
    pub(crate) fn held_at(&self, idx: usize, start: u64) -> Option<&B> {
        debug_assert_eq!(idx, self.index_of(start), "slot of {start}");
        (self.held_start(idx) == Some(start)).then(|| &self.slots[idx].value)
    }

    /// The slots and starts of the `sample_count` buckets that make up the
    /// window at `time_ms`, oldest first (fewer near time 0). Two divisions
    /// for the newest bucket, none for the others.
    pub(crate) fn window_slots(
        &self,
        time_ms: u64,
    ) -> impl Iterator<Item = (usize, u64)> + Clone + '_ {
        let (newest_idx, newest) = self.locate(time_ms);
        let len = self.window_length_ms;
        let count = self.sample_count;
        (0..count).rev().filter_map(move |back| {
            let start = newest.checked_sub((back as u64).checked_mul(len)?)?;
            let idx = if newest_idx >= back {
                newest_idx - back
            } else {
                newest_idx + count - back
            };
            Some((idx, start))
        })
    }

    /// Whether a bucket starting at `start` counts in the window at `time_ms`.
    #[inline]
    pub(crate) fn in_window(&self, start: u64, time_ms: u64) -> bool {
        let newest = self.start_of(time_ms);
        start <= newest && newest - start < self.interval_ms
    }

    /// Every slot's held start and value, in slot order.
    pub(crate) fn held_slots(&self) -> impl Iterator<Item = (usize, u64, &B)> + '_ {
        self.slots.iter().enumerate().filter_map(|(idx, slot)| {
            match slot.stamp.load(Ordering::Acquire) {
                EMPTY => None,
                start => Some((idx, start, &slot.value)),
            }
        })
    }

    /// The bucket containing `time_ms` if the array holds it; no refresh and
    /// no validity check against any other time (Sentinel's `getWindowValue`).
    pub fn window_value(&self, time_ms: u64) -> Option<&B> {
        self.held(self.start_of(time_ms))
    }

    /// The bucket that starts exactly one bucket before the one containing
    /// `now_ms`, if the array still holds it. With `sample_count == 1` there is
    /// never one: opening the current bucket would reuse its slot.
    pub fn previous_window(&self, now_ms: u64) -> Option<WindowWrap<'_, B>> {
        let start = self.start_of(now_ms).checked_sub(self.window_length_ms)?;
        if !self.in_window(start, now_ms) {
            return None;
        }
        self.held(start)
            .map(|value| WindowWrap::new(start, self.window_length_ms, value))
    }

    /// The buckets in the window at `now_ms`, oldest first. Buckets the array
    /// does not hold (no event in that bucket, or a slot since reused) are
    /// skipped.
    pub fn values(&self, now_ms: u64) -> impl Iterator<Item = &B> + '_ {
        self.window_slots(now_ms)
            .filter_map(move |(idx, start)| self.held_at(idx, start))
    }

    /// Like [`values`](Self::values), with each bucket's start. No
    /// allocation.
    pub(crate) fn values_with_start(&self, now_ms: u64) -> impl Iterator<Item = (u64, &B)> + '_ {
        self.window_slots(now_ms)
            .filter_map(move |(idx, start)| self.held_at(idx, start).map(|value| (start, value)))
    }

    /// Like [`values`](Self::values), with each bucket's window.
    pub fn list(&self, now_ms: u64) -> Vec<WindowWrap<'_, B>> {
        self.window_slots(now_ms)
            .filter_map(|(idx, start)| {
                self.held_at(idx, start)
                    .map(|value| WindowWrap::new(start, self.window_length_ms, value))
            })
            .collect()
    }
}

impl<B: BucketValue> LeapArray<B> {
    /// The bucket for `now_ms`, opening it if its slot holds an older window.
    ///
    /// A time behind the window its slot already holds (a clock that stepped
    /// back, a thread that read the clock before another opened a newer
    /// bucket) is answered with that newer window: the event is recorded
    /// there rather than lost, and nothing panics.
    pub fn current_window(&self, now_ms: u64) -> WindowWrap<'_, B> {
        let (idx, start) = match self.find(now_ms) {
            Ok(found) => found,
            Err((idx, start)) => self.open_slow(idx, start),
        };
        WindowWrap::new(start, self.window_length_ms, &self.slots[idx].value)
    }

    /// Opens slot `idx` for the window `start` (steps 1 to 4 of the module
    /// docs), resetting the value in place.
    #[cold]
    #[inline(never)]
    fn open_slow(&self, idx: usize, start: u64) -> (usize, u64) {
        let mut round = 0;
        loop {
            if let Some(held) = self.holding(idx, start) {
                return (idx, held);
            }
            let Some(mut rotation) = self.try_lock_rotation() else {
                backoff(&mut round);
                continue;
            };
            if let Some(held) = rotation.holding(idx, start) {
                return (idx, held);
            }
            self.slots[idx].value.reset();
            rotation.publish(idx, start);
            return (idx, start);
        }
    }
}

impl<B> LeapArray<B> {
    /// Where `now_ms` is recorded: `Ok((slot, start))` when its slot holds
    /// its window or a newer one (step 1; `start` is the window held),
    /// `Err((slot, start))` when the slot must be opened for `start` first.
    #[inline]
    pub(crate) fn find(&self, now_ms: u64) -> Result<(usize, u64), (usize, u64)> {
        if let Some(found) = self.newest_slot_for(now_ms, false) {
            return Ok(found);
        }
        let (idx, start) = self.locate(now_ms);
        match self.holding(idx, start) {
            Some(held) => Ok((idx, held)),
            None => Err((idx, start)),
        }
    }

    /// The window start slot `idx` holds if it is `start` or newer (step 1).
    #[inline]
    pub(crate) fn holding(&self, idx: usize, start: u64) -> Option<u64> {
        self.held_start(idx).filter(|&held| held >= start)
    }

    /// The newest opened bucket's slot when `now_ms` lies in it or
    /// behind it: where admission records, a clock that lags being moved
    /// forward to the newest bucket. One load of the newest start, no
    /// division.
    #[inline]
    pub(crate) fn newest_covering(&self, now_ms: u64) -> Option<usize> {
        self.newest_slot_for(now_ms, true).map(|(idx, _)| idx)
    }

    /// The newest bucket's slot and start if `now_ms` falls in it (or, with
    /// `lagging`, anywhere before its end), confirmed against the slot's
    /// stamp.
    #[inline]
    fn newest_slot_for(&self, now_ms: u64, lagging: bool) -> Option<(usize, u64)> {
        let newest = self.newest_start()?;
        let now_ms = now_ms.min(MAX_TIME);
        let now_ms = if lagging { now_ms.max(newest) } else { now_ms };
        if now_ms < newest || now_ms - newest >= self.window_length_ms {
            return None;
        }
        // Relaxed: a stale index is caught by the stamp check below.
        let idx = self.newest_slot.load(Ordering::Relaxed);
        let slot = self.slots.get(idx)?;
        // Acquire, as in step 1: the stamp publishes the bucket's reset.
        (slot.stamp.load(Ordering::Acquire) == newest).then_some((idx, newest))
    }

    /// Takes the rotation lock if it is free (step 2). Every bucket opening
    /// of the ring happens while a [`Rotation`] is alive, so openings are
    /// totally ordered.
    #[inline]
    pub(crate) fn try_lock_rotation(&self) -> Option<Rotation<'_, B>> {
        // Relaxed: only a guess; the compare-and-swap below decides.
        let current = self.rotation.load(Ordering::Relaxed);
        if current & LOCKED != 0 {
            return None;
        }
        // Acquire: everything the previous holder did (resets, seals,
        // publications) is visible to this holder.
        self.rotation
            .compare_exchange(
                current,
                current | LOCKED,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .ok()
            .map(|encoded| {
                let newest_before = encoded.checked_sub(1);
                Rotation {
                    array: self,
                    newest_before,
                    newest: newest_before,
                }
            })
    }
}

/// The ring's rotation lock, held: the one thread allowed to open buckets.
///
/// Dropping it releases the lock and records the newest start published,
/// also when the owner's bookkeeping unwinds: a panic there must not wedge
/// every later opening.
pub(crate) struct Rotation<'a, B> {
    array: &'a LeapArray<B>,
    /// The newest start published before the lock was taken.
    newest_before: Option<u64>,
    /// The newest start published so far, this holder's included.
    newest: Option<u64>,
}

impl<B> Rotation<'_, B> {
    /// Step 3: the window start slot `idx` holds, if it is `start` or newer
    /// (a previous holder opened it already).
    #[inline]
    pub(crate) fn holding(&self, idx: usize, start: u64) -> Option<u64> {
        self.array.holding(idx, start)
    }

    /// The window start slot `idx` holds before it is reused, if any.
    pub(crate) fn previous(&self, idx: usize) -> Option<u64> {
        self.array.held_start(idx)
    }

    /// Whether `start` would be the newest window ever opened.
    pub(crate) fn is_newest(&self, start: u64) -> bool {
        self.newest_before.is_none_or(|newest| start > newest)
    }

    /// Step 4, last: publishes `start` as the window slot `idx` holds. Call
    /// it once the slot's value is empty and ready for the new window.
    pub(crate) fn publish(&mut self, idx: usize, start: u64) {
        // Release: the reset before this happens-before every write by a
        // thread that loads this stamp with Acquire (step 1).
        self.array.slots[idx].stamp.store(start, Ordering::Release);
        if self.newest.is_none_or(|newest| start > newest) {
            self.newest = Some(start);
            // Relaxed: published by the Release that unlocks, and only a
            // hint anyway (see `newest_slot`).
            self.array.newest_slot.store(idx, Ordering::Relaxed);
        }
    }
}

impl<B> Drop for Rotation<'_, B> {
    fn drop(&mut self) {
        // Release: the next lock holder (Acquire) and every reader of the
        // newest start see this holder's work.
        let encoded = self.newest.map_or(0, |newest| newest + 1);
        self.array.rotation.store(encoded, Ordering::Release);
    }
}

impl<B: fmt::Debug> fmt::Debug for LeapArray<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeapArray")
            .field("sample_count", &self.sample_count)
            .field("interval_ms", &self.interval_ms)
            .field("window_length_ms", &self.window_length_ms)
            .field("newest_start", &self.newest_start())
            .finish_non_exhaustive()
    }
}

/// One bucket of a [`LeapArray`] together with the window it
/// belongs to: Sentinel's `WindowWrap`.
///
/// A `WindowWrap` is a view taken at one moment. The array reuses its buckets
/// in place, so a wrap kept past the end of its window may show the counts of
/// a later window that has taken over the same slot; take a fresh one per
/// read.
pub struct WindowWrap<'a, B> {
    window_start: u64,
    window_length_ms: u64,
    value: &'a B,
}

impl<'a, B> WindowWrap<'a, B> {
    pub(crate) fn new(window_start: u64, window_length_ms: u64, value: &'a B) -> Self {
        WindowWrap {
            window_start,
            window_length_ms,
            value,
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

    /// The bucket's value.
    pub fn value(&self) -> &'a B {
        self.value
    }

    /// Whether `time_ms` falls in `[window_start, window_start + length)`.
    pub fn is_time_in_window(&self, time_ms: u64) -> bool {
        time_ms >= self.window_start && time_ms - self.window_start < self.window_length_ms
    }
}

impl<B> Clone for WindowWrap<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for WindowWrap<'_, B> {}

impl<B: fmt::Debug> fmt::Debug for WindowWrap<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowWrap")
            .field("window_start", &self.window_start)
            .field("window_length_ms", &self.window_length_ms)
            .field("value", self.value)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array(sc: usize, interval: u64) -> BucketLeapArray {
        LeapArray::new(sc, interval).unwrap()
    }

    fn pass_sum(a: &BucketLeapArray, t: u64) -> u64 {
        a.values(t).map(MetricBucket::pass).sum()
    }

    #[test]
    fn rejects_invalid_configuration_by_field() {
        let zero_sc = LeapArray::<MetricBucket>::new(0, 1000).unwrap_err();
        assert_eq!(zero_sc.field(), "sample_count");
        assert!(zero_sc.to_string().contains("greater than 0"), "{zero_sc}");

        let zero_interval = LeapArray::<MetricBucket>::new(2, 0).unwrap_err();
        assert_eq!(zero_interval.field(), "interval_ms");

        let indivisible = LeapArray::<MetricBucket>::new(3, 1000).unwrap_err();
        assert_eq!(indivisible.field(), "interval_ms");
        assert!(indivisible
            .to_string()
            .contains("multiple of `sample_count`"));

        let huge = LeapArray::<MetricBucket>::new(
            MAX_SAMPLE_COUNT + 1,
            1_000 * (MAX_SAMPLE_COUNT as u64 + 1),
        )
        .unwrap_err();
        assert_eq!(huge.field(), "sample_count");
    }

    #[test]
    fn window_starts_and_slot_indices() {
        let a = array(4, 1000);
        assert_eq!(a.window_length_ms(), 250);
        assert_eq!(a.locate(0), (0, 0));
        assert_eq!(a.locate(249), (0, 0));
        assert_eq!(a.locate(250), (1, 250));
        assert_eq!(a.locate(999), (3, 750));
        assert_eq!(a.locate(1000), (0, 1000));
        assert_eq!(
            a.locate(1_234_567),
            ((1_234_567 / 250 % 4) as usize, 1_234_500)
        );
        let w = a.current_window(1_260);
        assert_eq!(w.window_start(), 1_250);
        assert_eq!(w.window_length_ms(), 250);
        assert!(w.is_time_in_window(1_250));
        assert!(w.is_time_in_window(1_499));
        assert!(!w.is_time_in_window(1_500));
        assert!(!w.is_time_in_window(1_249));
    }

    #[test]
    fn time_zero_is_an_ordinary_time() {
        let a = array(2, 1000);
        a.current_window(0).value().add_pass(1);
        assert_eq!(pass_sum(&a, 0), 1);
        assert_eq!(a.window_value(0).map(MetricBucket::pass), Some(1));
        assert_eq!(a.list(0)[0].window_start(), 0);
    }

    #[test]
    fn bucket_exactly_one_interval_old_is_not_counted() {
        // sentinel-golang's rule: the window at t is (start(t) - interval, start(t)].
        let a = array(2, 1000);
        a.current_window(0).value().add_pass(1);
        a.current_window(500).value().add_pass(2);
        assert_eq!(pass_sum(&a, 999), 3);
        // At 1000 the bucket [0, 500) is exactly one interval old: out, even
        // though its slot has not been reused yet.
        assert_eq!(pass_sum(&a, 1000), 2);
        assert_eq!(pass_sum(&a, 1499), 2);
        assert_eq!(pass_sum(&a, 1500), 0);
    }

    #[test]
    fn slot_reuse_resets_the_bucket() {
        let a = array(2, 1000);
        a.current_window(100).value().add_pass(5);
        let w = a.current_window(1_100);
        assert_eq!(w.window_start(), 1000);
        assert_eq!(w.value().pass(), 0);
        w.value().add_pass(1);
        assert_eq!(pass_sum(&a, 1_100), 1);
    }

    #[test]
    fn long_idle_gap_deprecates_every_bucket() {
        let a = array(10, 1000);
        for t in (0..1000).step_by(100) {
            a.current_window(t).value().add_pass(1);
        }
        assert_eq!(pass_sum(&a, 999), 10);
        let later = 3_600_000;
        assert_eq!(pass_sum(&a, later), 0);
        assert!(a.list(later).is_empty());
        assert!(a.previous_window(later).is_none());
        a.current_window(later).value().add_pass(1);
        assert_eq!(pass_sum(&a, later), 1);
    }

    #[test]
    fn clock_stepping_back_records_in_the_newer_window() {
        let a = array(2, 1000);
        a.current_window(1_200).value().add_pass(1);
        // 200 maps to the same slot, which now holds the window at 1000.
        let w = a.current_window(200);
        assert_eq!(w.window_start(), 1000);
        w.value().add_pass(1);
        assert_eq!(pass_sum(&a, 1_200), 2);
        // Reads at the old time see no bucket: the held one is in its future.
        assert_eq!(pass_sum(&a, 200), 0);
    }

    #[test]
    fn clock_stepping_back_into_a_stale_slot_opens_the_old_window() {
        let a = array(2, 1000);
        a.current_window(100).value().add_pass(1);
        a.current_window(2_600).value().add_pass(1);
        // Slot 0 holds [0, 500), stale; going back to 2 100 reopens it.
        let w = a.current_window(2_100);
        assert_eq!(w.window_start(), 2_000);
        assert_eq!(w.value().pass(), 0);
    }

    #[test]
    fn previous_window_is_the_adjacent_bucket_only() {
        let a = array(4, 1000);
        a.current_window(0).value().add_block(1);
        a.current_window(250).value().add_block(2);
        let prev = a.previous_window(500).expect("bucket at 250");
        assert_eq!(prev.window_start(), 250);
        assert_eq!(prev.value().block(), 2);
        // 750 - 250 = 500: no bucket was opened there.
        assert!(a.previous_window(750).is_none());
        assert!(a.previous_window(100).is_none(), "nothing before 0");
    }

    #[test]
    fn previous_window_with_one_sample_is_none() {
        let a = array(1, 1000);
        a.current_window(1_000).value().add_pass(2);
        assert!(a.previous_window(1_500).is_none());
        assert!(a.previous_window(2_000).is_none());
    }

    #[test]
    fn values_and_list_are_oldest_first() {
        let a = array(4, 1000);
        for (t, n) in [(2_900, 4), (2_100, 1), (2_400, 2), (2_600, 3)] {
            a.current_window(t).value().add_pass(n);
        }
        let passes: Vec<u64> = a.values(2_999).map(MetricBucket::pass).collect();
        assert_eq!(passes, [1, 2, 3, 4]);
        let starts: Vec<u64> = a.list(2_999).iter().map(WindowWrap::window_start).collect();
        assert_eq!(starts, [2_000, 2_250, 2_500, 2_750]);
    }

    #[test]
    fn window_value_needs_the_exact_bucket() {
        let a = array(2, 1000);
        a.current_window(600).value().add_pass(3);
        assert_eq!(a.window_value(999).map(MetricBucket::pass), Some(3));
        assert!(a.window_value(1_600).is_none());
        assert!(a.window_value(100).is_none());
    }

    #[test]
    fn enormous_times_are_clamped_not_panicking() {
        let a = array(10, 1000);
        a.current_window(u64::MAX).value().add_pass(1);
        assert_eq!(pass_sum(&a, u64::MAX), 1);
        assert_eq!(a.start_of(u64::MAX), MAX_TIME - MAX_TIME % 100);
    }

    #[test]
    fn slot_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Slot<MetricBucket>>(), 64);
    }
}
