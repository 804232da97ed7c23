//! [`MetricBucket`]: one bucket's counters, for rings a user owns.

use std::fmt;
use std::time::Duration;

use super::counts::{micros, Counts};
use super::event::MetricEvent;
use super::tallies::Tallies;
use crate::sync::{AtomicU64, Ordering};

/// One bucket's counters: Sentinel's `MetricBucket`.
///
/// Every counter is an independent atomic, so recording never takes a lock.
/// The whole bucket is seven `u64`s (56 bytes); with the window stamp the
/// [`LeapArray`](super::LeapArray) keeps beside it, a slot is exactly one
/// 64-byte cache line.
///
/// This is a plain counter bucket, for a [`BucketLeapArray`](super::BucketLeapArray)
/// you own. The rings behind [`ArrayMetric`](super::ArrayMetric) and
/// [`StatisticNode`](super::StatisticNode) keep their buckets to themselves
/// (with the admission bookkeeping next to the pass count) and hand out
/// read-only [`BucketSnapshot`](super::BucketSnapshot)s instead, so that no
/// safe call can reset a bucket admission relies on.
///
/// Counts wrap at `2^64`, except the response-time sum, which saturates.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::stat::{MetricBucket, MetricEvent};
///
/// let bucket = MetricBucket::new();
/// bucket.add_pass(3);
/// bucket.add(MetricEvent::Block, 1);
/// bucket.add_rt(Duration::from_millis(12));
/// bucket.add_rt(Duration::from_millis(4));
///
/// assert_eq!(bucket.pass(), 3);
/// assert_eq!(bucket.get(MetricEvent::Block), 1);
/// assert_eq!(bucket.rt(), Duration::from_millis(16));
/// assert_eq!(bucket.min_rt(), Some(Duration::from_millis(4)));
///
/// bucket.reset();
/// assert_eq!(bucket.pass(), 0);
/// assert_eq!(bucket.min_rt(), None);
/// ```
pub struct MetricBucket {
    /// Admitted requests. Relaxed: an independent tally, like the others.
    pass: AtomicU64,
    tallies: Tallies,
}

/// # Recording
impl MetricBucket {
    /// An empty bucket.
    pub fn new() -> Self {
        MetricBucket {
            pass: AtomicU64::new(0),
            tallies: Tallies::new(),
        }
    }

    /// Adds `n` to the counter for `event`. For [`MetricEvent::Rt`], `n` is a
    /// response time in microseconds (see [`add_rt`](Self::add_rt)).
    pub fn add(&self, event: MetricEvent, n: u64) {
        match event {
            MetricEvent::Pass => self.add_pass(n),
            MetricEvent::Block => self.tallies.add_block(n),
            MetricEvent::Exception => self.tallies.add_exception(n),
            MetricEvent::Success => self.tallies.add_success(n),
            MetricEvent::Rt => self.tallies.add_rt_micros(n, n),
            MetricEvent::OccupiedPass => self.tallies.add_occupied_pass(n),
        }
    }

    /// Adds `n` admitted requests.
    pub fn add_pass(&self, n: u64) {
        // Relaxed: an independent tally.
        self.pass.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds `n` rejected requests.
    pub fn add_block(&self, n: u64) {
        self.tallies.add_block(n);
    }

    /// Adds `n` failed completions.
    pub fn add_exception(&self, n: u64) {
        self.tallies.add_exception(n);
    }

    /// Adds `n` completions.
    pub fn add_success(&self, n: u64) {
        self.tallies.add_success(n);
    }

    /// Adds `n` requests that passed on borrowed quota.
    pub fn add_occupied_pass(&self, n: u64) {
        self.tallies.add_occupied_pass(n);
    }

    /// Adds one response time to the sum and offers it as the new minimum.
    /// Precision is one microsecond; the sum saturates at `u64::MAX` µs.
    pub fn add_rt(&self, rt: Duration) {
        let micros = micros(rt);
        self.tallies.add_rt_micros(micros, micros);
    }

    /// Clears every counter.
    pub fn reset(&self) {
        // Relaxed: a user's own ring orders resets through its stamps.
        self.pass.store(0, Ordering::Relaxed);
        self.tallies.reset();
    }
}

/// # Reading
impl MetricBucket {
    /// The current value of the counter for `event` ([`MetricEvent::Rt`]: the
    /// sum in microseconds).
    pub fn get(&self, event: MetricEvent) -> u64 {
        match event {
            MetricEvent::Pass => self.pass(),
            MetricEvent::Block => self.block(),
            MetricEvent::Exception => self.exception(),
            MetricEvent::Success => self.success(),
            MetricEvent::Rt => self.tallies.rt_micros(),
            MetricEvent::OccupiedPass => self.occupied_pass(),
        }
    }

    /// Admitted requests.
    pub fn pass(&self) -> u64 {
        // Relaxed: an independent tally.
        self.pass.load(Ordering::Relaxed)
    }

    /// Rejected requests.
    pub fn block(&self) -> u64 {
        self.tallies.block()
    }

    /// Completed requests classified as failures.
    pub fn exception(&self) -> u64 {
        self.tallies.exception()
    }

    /// Completed requests.
    pub fn success(&self) -> u64 {
        self.tallies.success()
    }

    /// Requests that passed on borrowed (future) quota.
    pub fn occupied_pass(&self) -> u64 {
        self.tallies.occupied_pass()
    }

    /// The sum of the response times added.
    pub fn rt(&self) -> Duration {
        Duration::from_micros(self.tallies.rt_micros())
    }

    /// The smallest response time added, or `None` if there was none.
    pub fn min_rt(&self) -> Option<Duration> {
        super::counts::min_rt(self.tallies.min_rt_micros())
    }

    /// Every counter at once (each read on its own).
    pub(crate) fn counts(&self) -> Counts {
        self.tallies.counts(self.pass())
    }

    /// Adds every count of `counts` to this bucket.
    pub(crate) fn absorb(&self, counts: &Counts) {
        if counts.pass != 0 {
            self.add_pass(counts.pass);
        }
        self.tallies.absorb(counts);
    }
}

impl Default for MetricBucket {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MetricBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricBucket")
            .field("pass", &self.pass())
            .field("block", &self.block())
            .field("exception", &self.exception())
            .field("success", &self.success())
            .field("rt", &self.rt())
            .field("occupied_pass", &self.occupied_pass())
            .field("min_rt", &self.min_rt())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_in_56_bytes() {
        assert_eq!(std::mem::size_of::<MetricBucket>(), 56);
    }

    #[test]
    fn every_event_round_trips() {
        let b = MetricBucket::new();
        for (i, event) in MetricEvent::ALL.into_iter().enumerate() {
            b.add(event, i as u64 + 1);
        }
        assert_eq!(b.get(MetricEvent::Pass), 1);
        assert_eq!(b.get(MetricEvent::Block), 2);
        assert_eq!(b.get(MetricEvent::Exception), 3);
        assert_eq!(b.get(MetricEvent::Success), 4);
        assert_eq!(b.get(MetricEvent::Rt), 5);
        assert_eq!(b.min_rt(), Some(Duration::from_micros(5)));
        assert_eq!(b.get(MetricEvent::OccupiedPass), 6);
    }

    #[test]
    fn min_rt_is_none_until_an_rt_arrives() {
        let b = MetricBucket::new();
        assert_eq!(b.min_rt(), None);
        b.add_rt(Duration::from_micros(0));
        assert_eq!(b.min_rt(), Some(Duration::ZERO));
    }

    #[test]
    fn huge_rt_saturates() {
        let b = MetricBucket::new();
        b.add_rt(Duration::MAX);
        assert_eq!(b.rt(), Duration::from_micros(u64::MAX));
        b.add_rt(Duration::MAX);
        assert_eq!(b.rt(), Duration::from_micros(u64::MAX), "no wrap");
        // The largest representable minimum: `u64::MAX` itself means "none".
        assert_eq!(b.min_rt(), Some(Duration::from_micros(u64::MAX - 1)));
    }
}
