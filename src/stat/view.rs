//! Reads of the admission ring: [`BucketRef`], a bucket as reads see it
//! (held, or only reserved), and the window reads `ArrayMetric`,
//! `StatisticNode` and `OccupiableBucketLeapArray` build on: sums,
//! per-bucket details, snapshots. Reads take no lock: each bucket counts
//! only while its stamp is in the window (see `leap_array`).

use std::time::Duration;

use super::admission::{AdmissionBucket, MetricArray};
use super::counts::{BucketSnapshot, Counts, MetricNode};

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
