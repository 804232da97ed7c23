//! Reads of the admission ring: [`BucketRef`], a bucket as reads see it
//! (held, or only reserved), and the window reads `ArrayMetric`,
//! `StatisticNode` and `OccupiableBucketLeapArray` build on: sums,
//! per-bucket details, snapshots. Reads take no lock: each bucket counts
//! only while its stamp is in the window (see `leap_array`). Also the
//! minute window's read side, [`MinuteWindow`], over the admission ring and
//! the `Rollup` it feeds (see `minute`).

use std::fmt;
use std::time::Duration;

use super::admission::{AdmissionBucket, MetricArray};
use super::counts::{BucketSnapshot, Counts, MetricNode};
use super::minute::Rollup;
use crate::clock::{Clock, SharedClock};

/// A bucket of the window as reads see it.
#[derive(Clone, Copy)]
pub(crate) enum BucketRef<'a> {
    /// The admission ring holds the bucket.
    Held(&'a AdmissionBucket),
    /// The admission ring never opened the bucket, but quota reserved for it
    /// has matured: reads count it as passes, as if the bucket had been
    /// opened.
    Reserved(u64),
}

impl BucketRef<'_> {
    pub(crate) fn pass(self) -> u64 {
        match self {
            BucketRef::Held(b) => b.pass(),
            BucketRef::Reserved(n) => n,
        }
    }

    fn tally(self, f: impl FnOnce(&AdmissionBucket) -> u64) -> u64 {
        match self {
            BucketRef::Held(b) => f(b),
            BucketRef::Reserved(_) => 0,
        }
    }

    pub(crate) fn block(self) -> u64 {
        self.tally(|b| b.tallies().block())
    }

    pub(crate) fn success(self) -> u64 {
        self.tally(|b| b.tallies().success())
    }

    pub(crate) fn exception(self) -> u64 {
        self.tally(|b| b.tallies().exception())
    }

    pub(crate) fn occupied_pass(self) -> u64 {
        self.tally(|b| b.tallies().occupied_pass())
    }

    pub(crate) fn rt_micros(self) -> u64 {
        self.tally(|b| b.tallies().rt_micros())
    }

    /// `u64::MAX` when none.
    pub(crate) fn min_rt_micros(self) -> u64 {
        match self {
            BucketRef::Held(b) => b.tallies().min_rt_micros(),
            BucketRef::Reserved(_) => u64::MAX,
        }
    }

    /// Every count of the bucket (a matured reservation has passes only).
    pub(crate) fn counts(self) -> Counts {
        match self {
            BucketRef::Held(b) => b.counts(),
            BucketRef::Reserved(pass) => Counts {
                pass,
                ..Counts::default()
            },
        }
    }
}

impl MetricArray {
    /// The bucket starting at `start`, as reads see it.
    #[inline]
    fn bucket(&self, start: u64) -> Option<BucketRef<'_>> {
        self.bucket_at(self.main.index_of(start), start)
    }

    /// [`bucket`](Self::bucket) with the slot of `start` already known (the
    /// reservation ring has the same shape, so the same slot).
    #[inline]
    pub(super) fn bucket_at(&self, idx: usize, start: u64) -> Option<BucketRef<'_>> {
        if let Some(held) = self.main.held_at(idx, start) {
            return Some(BucketRef::Held(held));
        }
        self.reservations
            .as_ref()?
            .held_at(idx, start)
            .map(BucketRef::Reserved)
    }

    /// The window's buckets at `now`, oldest first, with their starts.
    pub(crate) fn buckets(
        &self,
        now: u64,
    ) -> impl Iterator<Item = (u64, BucketRef<'_>)> + Clone + '_ {
        self.main
            .window_slots(now)
            .filter_map(move |(idx, start)| self.bucket_at(idx, start).map(|b| (start, b)))
    }

    /// The window's buckets at `now` as `(start, passes)`, oldest first: what
    /// a retry estimate needs. No allocation.
    pub(crate) fn pass_buckets(&self, now: u64) -> impl Iterator<Item = (u64, u64)> + Clone + '_ {
        self.buckets(now).map(|(start, b)| (start, b.pass()))
    }

    /// Every count of the window at `now`, summed.
    pub(crate) fn counts(&self, now: u64) -> Counts {
        self.buckets(now)
            .fold(Counts::default(), |mut counts, (_, bucket)| {
                counts.merge(&bucket.counts());
                counts
            })
    }

    pub(crate) fn sum(&self, now: u64, f: impl Fn(BucketRef<'_>) -> u64) -> u64 {
        self.buckets(now)
            .fold(0u64, |sum, (_, b)| sum.saturating_add(f(b)))
    }

    pub(crate) fn max_success(&self, now: u64) -> u64 {
        self.buckets(now)
            .map(|(_, b)| b.success())
            .max()
            .unwrap_or(0)
    }

    pub(crate) fn min_rt(&self, now: u64) -> Option<Duration> {
        let min = self
            .buckets(now)
            .map(|(_, b)| b.min_rt_micros())
            .min()
            .unwrap_or(u64::MAX);
        super::counts::min_rt(min)
    }

    /// The bucket one bucket before the one containing `now`.
    pub(crate) fn previous(&self, now: u64) -> Option<BucketRef<'_>> {
        let start = self
            .main
            .start_of(now)
            .checked_sub(self.main.window_length_ms())?;
        if !self.main.in_window(start, now) {
            return None;
        }
        self.bucket(start)
    }

    /// Passes of the bucket containing `time`, if that bucket is held, or
    /// reserved and matured by `now`.
    pub(crate) fn window_pass(&self, time: u64, now: u64) -> u64 {
        let start = self.main.start_of(time);
        if let Some(held) = self.main.held(start) {
            return held.pass();
        }
        if start > self.main.start_of(now) {
            return 0;
        }
        self.bucket(start).map_or(0, |b| b.pass())
    }

    /// Reserved passes in buckets that start after `now`.
    pub(crate) fn waiting(&self, now: u64) -> u64 {
        self.reservations
            .as_ref()
            .map_or(0, |reservations| reservations.waiting(now))
    }

    pub(crate) fn details(&self, now: u64) -> Vec<MetricNode> {
        self.buckets(now)
            .map(|(start, b)| MetricNode::from_counts(start, &b.counts()))
            .collect()
    }

    /// A snapshot of the held bucket starting at `start`, if held.
    fn snapshot(&self, idx: usize, start: u64) -> Option<BucketSnapshot> {
        self.main
            .held_at(idx, start)
            .map(|bucket| BucketSnapshot::new(start, self.main.window_length_ms(), bucket.counts()))
    }

    /// Snapshots of the buckets the ring holds for the window at `now`,
    /// oldest first (matured reservations whose bucket was never opened are
    /// not buckets; [`details`](Self::details) has them).
    pub(crate) fn list(&self, now: u64) -> Vec<BucketSnapshot> {
        self.main
            .window_slots(now)
            .filter_map(|(idx, start)| self.snapshot(idx, start))
            .collect()
    }

    /// A snapshot of the held bucket containing `time`, without opening it.
    pub(crate) fn window_value(&self, time: u64) -> Option<BucketSnapshot> {
        let start = self.main.start_of(time);
        self.snapshot(self.main.index_of(start), start)
    }

    /// Opens the bucket for `now` and snapshots it.
    pub(crate) fn current_snapshot(&self, now: u64) -> BucketSnapshot {
        let (idx, start) = self.open(now);
        let bucket = self.main.value_at(idx);
        BucketSnapshot::new(start, self.main.window_length_ms(), bucket.counts())
    }
}

/// A [`StatisticNode`](super::StatisticNode)'s minute window: 60 buckets of
/// one second, read at the node's clock. Obtained from
/// [`StatisticNode::minute_window`](super::StatisticNode::minute_window).
///
/// Recording never writes it directly: a second-window bucket rolls up into
/// its second here when the second window reuses its slot, and reads add the
/// buckets not rolled up yet. Each event is counted once either way (a
/// sequence lock keeps a bucket from being seen in both places at once).
pub struct MinuteWindow<'a> {
    /// The node's second window, which rolls up into the minute window.
    array: &'a MetricArray,
    clock: &'a SharedClock,
}

/// The minute window's shape when the ring has no roll-up (never, for a
/// `StatisticNode`).
const DEFAULT_SHAPE: (usize, u64) = (60, 60_000);

impl<'a> MinuteWindow<'a> {
    pub(crate) fn new(array: &'a MetricArray, clock: &'a SharedClock) -> Self {
        MinuteWindow { array, clock }
    }

    fn now(&self) -> u64 {
        self.clock.now_millis()
    }

    fn fold<T: Clone>(&self, init: T, f: impl FnMut(&mut T, u64, Counts)) -> T {
        self.array.rollup_fold(self.now(), init, f)
    }

    fn shape(&self) -> (usize, u64) {
        self.array.rollup_shape().unwrap_or(DEFAULT_SHAPE)
    }

    fn sum(&self, f: impl Fn(&Counts) -> u64) -> u64 {
        self.fold(0u64, |sum, _, counts| {
            *sum = sum.saturating_add(f(&counts));
        })
    }

    /// Number of buckets: 60.
    pub fn sample_count(&self) -> usize {
        self.shape().0
    }

    /// Length of the window: 60 000 ms.
    pub fn interval_ms(&self) -> u64 {
        self.shape().1
    }

    /// Passes plus blocks in the last minute.
    pub(crate) fn total(&self) -> u64 {
        self.sum(|c| c.pass.saturating_add(c.block))
    }

    /// Admitted requests in the last minute (plus passes on borrowed quota,
    /// counted when granted, as Sentinel does).
    pub fn pass(&self) -> u64 {
        self.sum(|c| c.pass)
    }

    /// Rejected requests in the last minute.
    pub fn block(&self) -> u64 {
        self.sum(|c| c.block)
    }

    /// Completions in the last minute.
    pub fn success(&self) -> u64 {
        self.sum(|c| c.success)
    }

    /// Failed completions in the last minute.
    pub fn exception(&self) -> u64 {
        self.sum(|c| c.exception)
    }

    /// Passes on borrowed quota in the last minute.
    pub fn occupied_pass(&self) -> u64 {
        self.sum(|c| c.occupied_pass)
    }

    /// Sum of the response times of the last minute.
    pub fn rt(&self) -> Duration {
        Duration::from_micros(self.sum(|c| c.rt_micros))
    }

    /// Smallest response time of the last minute.
    pub fn min_rt(&self) -> Option<Duration> {
        let min = self.fold(u64::MAX, |min, _, counts| {
            *min = (*min).min(counts.min_rt_micros);
        });
        super::counts::min_rt(min)
    }

    /// The counts of the second before the current one.
    fn previous(&self) -> Counts {
        let now = self.now();
        let (sample_count, interval) = self.shape();
        let length = interval / sample_count as u64;
        let current = now - now % length;
        let Some(previous) = current.checked_sub(length) else {
            return Counts::default();
        };
        self.fold(Counts::default(), |total, start, counts| {
            if start == previous {
                total.merge(&counts);
            }
        })
    }

    /// Passes of the previous whole second.
    pub fn previous_window_pass(&self) -> u64 {
        self.previous().pass
    }

    /// Blocks of the previous whole second.
    pub fn previous_window_block(&self) -> u64 {
        self.previous().block
    }

    /// One [`MetricNode`] per second with events in the window, oldest first.
    pub fn details(&self) -> Vec<MetricNode> {
        self.array
            .rollup_buckets(self.now())
            .iter()
            .map(|(start, counts)| MetricNode::from_counts(*start, counts))
            .collect()
    }
}

impl fmt::Debug for MinuteWindow<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MinuteWindow")
            .field("pass", &self.pass())
            .field("block", &self.block())
            .field("success", &self.success())
            .field("exception", &self.exception())
            .finish_non_exhaustive()
    }
}

impl MetricArray {
    /// Folds `f` over the rollup's window at `now`: every bucket already
    /// rolled up, and every admission-ring bucket not rolled up yet, each
    /// with the start of the rollup bucket it belongs to. A rollup bucket may
    /// be visited more than once (once rolled up, then once per bucket still
    /// to come). Starts from `init` again whenever a roll-up interfered.
    /// `init` without a rollup. No allocation.
    pub(crate) fn rollup_fold<T: Clone>(
        &self,
        now: u64,
        init: T,
        mut f: impl FnMut(&mut T, u64, Counts),
    ) -> T {
        let Some(rollup) = &self.rollup else {
            return init;
        };
        rollup.read(|| {
            let mut acc = init.clone();
            rollup.for_each_rolled(now, |start, counts| f(&mut acc, start, counts));
            let newest_main = self.main.start_of(now);
            for (slot, start, bucket) in self.main.held_slots() {
                let second = rollup.start_of(start);
                if start <= newest_main && rollup.in_window(second, now) {
                    let mut counts = bucket.counts();
                    // Matured reservations (prefilled passes) are left out:
                    // see `Rollup::prefilled`.
                    counts.pass = counts.pass.saturating_sub(rollup.prefilled(slot));
                    f(&mut acc, second, counts);
                }
            }
            acc
        })
    }

    /// The most completions of one bucket of this ring among those that
    /// belong to a rollup bucket starting in `[since, now]`: the peaks of the
    /// buckets already rolled up, and every bucket not rolled up yet.
    /// 0 without a rollup or when it keeps no peaks (see
    /// `MetricArray::with_rollup`). No allocation.
    pub(crate) fn peak_success(&self, now: u64, since: u64) -> u64 {
        let Some(rollup) = &self.rollup else {
            return 0;
        };
        let slots = self.main.sample_count();
        rollup.read(|| {
            let mut best = rollup.peak_since(slots, since, now);
            let newest_main = self.main.start_of(now);
            for (_, start, bucket) in self.main.held_slots() {
                let second = rollup.start_of(start);
                if start <= newest_main && second >= since && rollup.in_window(second, now) {
                    best = best.max(bucket.tallies().success());
                }
            }
            best
        })
    }

    /// The rollup's window at `now`, one entry per rollup bucket (a second,
    /// for a `StatisticNode`), oldest first, empty ones left out.
    pub(crate) fn rollup_buckets(&self, now: u64) -> Vec<(u64, Counts)> {
        let mut out = self.rollup_fold(now, Vec::new(), |out, start, counts| {
            out.push((start, counts));
        });
        out.sort_unstable_by_key(|&(start, _)| start);
        out.dedup_by(|later, earlier| {
            let same = later.0 == earlier.0;
            if same {
                earlier.1.merge(&later.1);
            }
            same
        });
        out.retain(|(_, counts)| !counts.is_empty());
        out
    }

    /// Every count recorded since the ring was made: what has moved into
    /// the rollup plus every admission-ring bucket not moved yet, whatever
    /// window it holds (module docs, "Lifetime totals"). Only rings with a
    /// rollup keep them; without one this is the held buckets alone.
    pub(crate) fn lifetime_counts(&self) -> Counts {
        let held = || {
            let mut total = Counts::default();
            for (_, _, bucket) in self.main.held_slots() {
                total.merge(&bucket.counts());
            }
            total
        };
        match &self.rollup {
            Some(rollup) => rollup.read(|| {
                let mut total = rollup.moved_total();
                total.merge(&held());
                total
            }),
            None => held(),
        }
    }

    /// Records `n` occupied passes, and as many passes, straight into the
    /// rollup at `now` (see `Rollup::add_occupied_pass`).
    pub(crate) fn add_rollup_occupied_pass(&self, now: u64, n: u64) {
        if let Some(rollup) = &self.rollup {
            rollup.add_occupied_pass(now, n);
        }
    }

    /// The rollup's shape, if there is one: (sample count, interval).
    pub(crate) fn rollup_shape(&self) -> Option<(usize, u64)> {
        self.rollup.as_ref().map(Rollup::shape)
    }

    /// Length of one rollup bucket, if there is a rollup.
    pub(crate) fn rollup_window_length_ms(&self) -> Option<u64> {
        self.rollup.as_ref().map(Rollup::window_length_ms)
    }
}
