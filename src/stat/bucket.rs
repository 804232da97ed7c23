//! One bucket's counters: the counters every bucket has besides its pass
//! count (`Tallies`), and the
//! plain counter bucket of a ring a user owns ([`MetricBucket`]). The
//! admission ring's bucket keeps the same tallies beside an admission word
//! (see `admission`).
//!
//! # Tallies
//!
//! Each tally is an independent atomic updated with `Relaxed`: nothing is
//! published through a tally, and a ring orders these writes against a
//! bucket's reset through the bucket's window stamp (see `leap_array`).
//!
//! Counts wrap at `2^64`, except the response-time sum, which saturates at
//! `u64::MAX` microseconds: [`saturating_add`] adds with one `fetch_add`
//! while there is headroom and falls back to a compare-and-swap loop only
//! near the top of the range.

use std::fmt;
use std::time::Duration;

use super::counts::{micros, Counts, MetricEvent};
use crate::sync::{AtomicU64, Ordering};

/// Adds below this go through a plain `fetch_add` (about 12.7 days in
/// microseconds).
const FAST_ADD_MAX: u64 = 1 << 40;
/// A sum below this has room for `2^23` concurrent fast adds before it could
/// wrap: more threads than any process runs.
const FAST_SUM_MAX: u64 = 1 << 63;

/// Adds `n` to `counter`, saturating at `u64::MAX`.
#[inline]
pub(crate) fn saturating_add(counter: &AtomicU64, n: u64) {
    // Relaxed: an independent tally (see the module docs).
    if n < FAST_ADD_MAX && counter.load(Ordering::Relaxed) < FAST_SUM_MAX {
        counter.fetch_add(n, Ordering::Relaxed);
    } else {
        saturating_add_slow(counter, n);
    }
}

#[cold]
fn saturating_add_slow(counter: &AtomicU64, n: u64) {
    // Relaxed: as above; the loop only makes the add saturate.
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |sum| {
        Some(sum.saturating_add(n))
    });
}

/// Six counters of one bucket (48 bytes).
pub(crate) struct Tallies {
    block: AtomicU64,
    exception: AtomicU64,
    success: AtomicU64,
    /// Sum of response times, in microseconds; saturates at `u64::MAX`.
    rt: AtomicU64,
    occupied_pass: AtomicU64,
    /// Smallest response time in microseconds; `u64::MAX` when none was
    /// seen. Kept with `fetch_min`, so unlike Sentinel's it never loses a
    /// smaller value to a concurrent writer.
    min_rt: AtomicU64,
}

impl Tallies {
    pub(crate) fn new() -> Self {
        Tallies {
            block: AtomicU64::new(0),
            exception: AtomicU64::new(0),
            success: AtomicU64::new(0),
            rt: AtomicU64::new(0),
            occupied_pass: AtomicU64::new(0),
            min_rt: AtomicU64::new(u64::MAX),
        }
    }

    // Relaxed on every access below: independent tallies (module docs).

    #[inline]
    pub(crate) fn add_block(&self, n: u64) {
        self.block.fetch_add(n, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn add_exception(&self, n: u64) {
        self.exception.fetch_add(n, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn add_success(&self, n: u64) {
        self.success.fetch_add(n, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn add_occupied_pass(&self, n: u64) {
        self.occupied_pass.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds `sum` microseconds to the response-time sum and offers
    /// `per_request` as the new minimum. One response time passes itself
    /// twice; a batch of `n` requests that took `sum` in all offers
    /// `sum / n`, so that the minimum never exceeds the average.
    #[inline]
    pub(crate) fn add_rt_micros(&self, sum: u64, per_request: u64) {
        saturating_add(&self.rt, sum);
        // `u64::MAX` stands for "no minimum": the longest time is one less.
        let per_request = per_request.min(u64::MAX - 1);
        // Most response times are not a new minimum: a plain load spares the
        // read-modify-write. A racing smaller value is still kept, because
        // `fetch_min` only ever lowers the minimum.
        if per_request < self.min_rt.load(Ordering::Relaxed) {
            self.min_rt.fetch_min(per_request, Ordering::Relaxed);
        }
    }

    pub(crate) fn block(&self) -> u64 {
        self.block.load(Ordering::Relaxed)
    }

    pub(crate) fn exception(&self) -> u64 {
        self.exception.load(Ordering::Relaxed)
    }

    pub(crate) fn success(&self) -> u64 {
        self.success.load(Ordering::Relaxed)
    }

    pub(crate) fn occupied_pass(&self) -> u64 {
        self.occupied_pass.load(Ordering::Relaxed)
    }

    pub(crate) fn rt_micros(&self) -> u64 {
        self.rt.load(Ordering::Relaxed)
    }

    pub(crate) fn min_rt_micros(&self) -> u64 {
        self.min_rt.load(Ordering::Relaxed)
    }

    /// Every tally, with `pass` as given (not a consistent snapshot under
    /// concurrent writes: each counter is read on its own).
    pub(crate) fn counts(&self, pass: u64) -> Counts {
        Counts {
            pass,
            block: self.block(),
            exception: self.exception(),
            success: self.success(),
            rt_micros: self.rt_micros(),
            occupied_pass: self.occupied_pass(),
            min_rt_micros: self.min_rt_micros(),
        }
    }

    /// Empties the tallies and returns what they held, `pass` as given. Each
    /// counter is swapped out in one atomic step, so a concurrent add is
    /// either in the result or left behind: never lost, never in both.
    pub(crate) fn take(&self, pass: u64) -> Counts {
        Counts {
            pass,
            block: self.block.swap(0, Ordering::Relaxed),
            exception: self.exception.swap(0, Ordering::Relaxed),
            success: self.success.swap(0, Ordering::Relaxed),
            rt_micros: self.rt.swap(0, Ordering::Relaxed),
            occupied_pass: self.occupied_pass.swap(0, Ordering::Relaxed),
            min_rt_micros: self.min_rt.swap(u64::MAX, Ordering::Relaxed),
        }
    }

    /// Adds every tally of `counts` (its `pass` is the caller's business).
    pub(crate) fn absorb(&self, counts: &Counts) {
        let add = |counter: &AtomicU64, n: u64| {
            if n != 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        };
        add(&self.block, counts.block);
        add(&self.exception, counts.exception);
        add(&self.success, counts.success);
        if counts.rt_micros != 0 {
            saturating_add(&self.rt, counts.rt_micros);
        }
        add(&self.occupied_pass, counts.occupied_pass);
        if counts.min_rt_micros < self.min_rt.load(Ordering::Relaxed) {
            self.min_rt
                .fetch_min(counts.min_rt_micros, Ordering::Relaxed);
        }
    }

    /// Clears every tally.
    pub(crate) fn reset(&self) {
        self.block.store(0, Ordering::Relaxed);
        self.exception.store(0, Ordering::Relaxed);
        self.success.store(0, Ordering::Relaxed);
        self.rt.store(0, Ordering::Relaxed);
        self.occupied_pass.store(0, Ordering::Relaxed);
        self.min_rt.store(u64::MAX, Ordering::Relaxed);
    }
}

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

    #[test]
    fn rt_sum_saturates_instead_of_wrapping() {
        let t = Tallies::new();
        t.add_rt_micros(u64::MAX, u64::MAX);
        t.add_rt_micros(u64::MAX, u64::MAX);
        assert_eq!(t.rt_micros(), u64::MAX);
        let t = Tallies::new();
        for _ in 0..1000 {
            t.add_rt_micros(1 << 62, 1 << 62);
        }
        assert_eq!(t.rt_micros(), u64::MAX);
    }

    #[test]
    fn a_batch_offers_its_per_request_time_as_the_minimum() {
        let t = Tallies::new();
        t.add_rt_micros(60, 20);
        assert_eq!(t.min_rt_micros(), 20);
        assert_eq!(t.rt_micros(), 60);
    }
}
