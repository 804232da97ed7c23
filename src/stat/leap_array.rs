//! The bucket ring. The protocol is described in the `stat` module docs,
//! under "Implementation details"; the comments here point at its steps.

use std::fmt;

use super::{MetricBucket, WindowWrap};
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

/// The largest supported sample count. A larger ring would only cost memory:
/// no window needs buckets finer than a millisecond.
pub(crate) const MAX_SAMPLE_COUNT: usize = 1 << 20;

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
/// write. See the [module docs](super#implementation-details) for how
/// rotation stays exact under concurrency.
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

/// Steps a bucket-owning type takes while a bucket opens. Used by
/// `ArrayMetric` for exact admission and for borrowed (future) quota.
pub(crate) trait OpenHooks<B> {
    /// Runs with the rotation lock held, before `slot`'s value is reset for
    /// the window `start`. `newest` is true when no newer window has ever
    /// been published.
    fn before_reset(&self, _array: &LeapArray<B>, _slot: usize, _start: u64, _newest: bool) {}

    /// Empties `value` (in slot `slot`), which held the window `previous`
    /// (if any), for the window `start`. Runs with the rotation lock held.
    fn reset_value(&self, value: &B, _slot: usize, _previous: Option<u64>, _start: u64)
    where
        B: BucketValue,
    {
        value.reset();
    }

    /// Runs with the rotation lock held, right after the new window was
    /// published.
    fn after_publish(&self) {}

    /// Runs with the rotation lock held, after the value was reset and
    /// before the window is published.
    fn after_reset(&self, _value: &B, _start: u64, _newest: bool) {}
}

/// No extra steps: a plain ring.
pub(crate) struct NoHooks;

impl<B> OpenHooks<B> for NoHooks {}

impl<B: BucketValue> LeapArray<B> {
    /// A ring of `sample_count` buckets over `interval_ms` milliseconds.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field when `sample_count` is 0 or above
    /// 2^20, when `interval_ms` is 0, or when `interval_ms` is not a multiple
    /// of `sample_count`.
    pub fn new(sample_count: usize, interval_ms: u64) -> Result<Self, ConfigError> {
        let window_length_ms = validate(sample_count, interval_ms)?;
        Ok(Self::build(window_length_ms, interval_ms, sample_count))
    }

    /// An empty ring with the same (already validated) shape as `other`.
    pub(crate) fn with_shape_of<C>(other: &LeapArray<C>) -> Self {
        Self::build(
            other.window_length_ms,
            other.interval_ms,
            other.sample_count,
        )
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
    if sample_count > MAX_SAMPLE_COUNT {
        return Err(ConfigError::new(
            "sample_count",
            "must be at most 1048576",
            format!("got {sample_count}"),
        ));
    }
    if interval_ms == 0 {
        return Err(ConfigError::new(
            "interval_ms",
            "must be greater than 0",
            "got 0",
        ));
    }
    let sample_count = sample_count as u64;
    if interval_ms % sample_count != 0 {
        return Err(ConfigError::new(
            "interval_ms",
            "must be a multiple of `sample_count`",
            format!("got {interval_ms}, sample_count = {sample_count}"),
        ));
    }
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

    /// The starts of the buckets of the window at `time_ms`, oldest first.
    pub(crate) fn window_starts(&self, time_ms: u64) -> impl Iterator<Item = u64> + '_ {
        self.window_slots(time_ms).map(|(_, start)| start)
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
        let (idx, start) = self.open(now_ms, &NoHooks);
        WindowWrap::new(start, self.window_length_ms, &self.slots[idx].value)
    }

    /// Opens the bucket for `now_ms` (see [`current_window`]) and returns its
    /// slot index and the start of the window the slot holds.
    #[inline]
    pub(crate) fn open<H: OpenHooks<B>>(&self, now_ms: u64, hooks: &H) -> (usize, u64) {
        match self.newest_holding(now_ms) {
            Some(found) => found,
            None => self.open_slow(now_ms, hooks),
        }
    }

    /// [`open`](Self::open) when `now_ms` is not in the newest bucket.
    #[cold]
    #[inline(never)]
    fn open_slow<H: OpenHooks<B>>(&self, now_ms: u64, hooks: &H) -> (usize, u64) {
        let (idx, start) = self.locate(now_ms);
        let slot = &self.slots[idx];
        let mut round = 0;
        loop {
            // Step 1 of the protocol: a slot already holding this window (or
            // a newer one) is written in place.
            let held = slot.stamp.load(Ordering::Acquire);
            if held == start || (held != EMPTY && held > start) {
                return (idx, held);
            }
            // Step 2: the slot holds an older window (or none). Take the
            // rotation lock; whoever holds it may be opening this very slot.
            let Some(newest) = self.try_lock_rotation() else {
                backoff(&mut round);
                continue;
            };
            // Step 3: re-check under the lock: a thread that held it before
            // us may have opened the bucket already.
            let guard = RotationGuard {
                array: self,
                newest: newest.map_or(start, |n| n.max(start)),
            };
            let held = slot.stamp.load(Ordering::Acquire);
            if held != EMPTY && held >= start {
                drop(guard);
                return (idx, held);
            }
            // Step 4: reset and publish. Writers that loaded the old stamp
            // before this point may still add to the value; their events land
            // either before the reset (counted in the old, expired window) or
            // after it (counted in the new one): once either way.
            let is_newest = newest.map_or(true, |n| start > n);
            hooks.before_reset(self, idx, start, is_newest);
            hooks.reset_value(&slot.value, idx, (held != EMPTY).then_some(held), start);
            hooks.after_reset(&slot.value, start, is_newest);
            // Release: the reset above happens-before every write by a thread
            // that loads this stamp with Acquire (step 1).
            slot.stamp.store(start, Ordering::Release);
            hooks.after_publish();
            if is_newest {
                self.newest_slot.store(idx, Ordering::Relaxed);
            }
            drop(guard);
            return (idx, start);
        }
    }

    /// The fast path of [`open`](Self::open): when `now_ms` falls in the
    /// newest opened bucket, which is almost always, find it without the two
    /// divisions of [`locate`](Self::locate).
    #[inline]
    fn newest_holding(&self, now_ms: u64) -> Option<(usize, u64)> {
        self.newest_slot_for(now_ms, false)
    }

    /// The slot of the newest opened bucket when `now_ms` lies in it or
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

    /// Takes the rotation lock if it is free, returning the newest start
    /// (`Some(None)` when no window was ever opened).
    #[inline]
    fn try_lock_rotation(&self) -> Option<Option<u64>> {
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
            .map(|encoded| encoded.checked_sub(1))
    }
}

/// Releases the rotation lock, recording the newest start, even if a hook or
/// `reset` unwinds: a panic there must not wedge every later opening.
struct RotationGuard<'a, B> {
    array: &'a LeapArray<B>,
    newest: u64,
}

impl<B> Drop for RotationGuard<'_, B> {
    fn drop(&mut self) {
        // Release: the next lock holder (Acquire) sees this holder's work.
        self.array
            .rotation
            .store(self.newest + 1, Ordering::Release);
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

        let huge = LeapArray::<MetricBucket>::new(MAX_SAMPLE_COUNT + 1, 1 << 40).unwrap_err();
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
