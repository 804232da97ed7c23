use std::fmt;
use std::time::Duration;

use super::MetricEvent;
use crate::sync::{AtomicU64, Ordering};

/// One bucket's counters: Sentinel's `MetricBucket`.
///
/// Every counter is an independent atomic, so recording never takes a lock.
/// The whole bucket is seven `u64`s (56 bytes); with the window stamp the
/// [`LeapArray`](super::LeapArray) keeps beside it, a slot is exactly one
/// 64-byte cache line.
///
/// Counts wrap at `2^64`, except the pass count, which is kept in 47 bits
/// (about 1.4 × 10^14 per bucket) and saturates there; the upper bits of that
/// word carry the admission bookkeeping described in
/// [`ArrayMetric`](super::ArrayMetric)'s implementation notes.
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
    /// Pass count in the low 47 bits; see [`pass_word`] for the upper bits.
    pass: AtomicU64,
    block: AtomicU64,
    exception: AtomicU64,
    success: AtomicU64,
    /// Sum of response times, in microseconds.
    rt: AtomicU64,
    occupied_pass: AtomicU64,
    /// Smallest response time in microseconds; `u64::MAX` when none was seen.
    /// Kept with `fetch_min`, so unlike Sentinel's it never loses a smaller
    /// value to a concurrent writer.
    min_rt: AtomicU64,
}

/// Layout of the pass counter word.
///
/// ```text
///  63     62 ........ 47  46 ............. 0
/// [SEALED][ round tag  ][     count        ]
/// ```
///
/// The tag and seal bit serve exact admission in `ArrayMetric`; a bare
/// `MetricBucket` keeps them at zero and only the count matters.
pub(crate) mod pass_word {
    /// Set on a bucket's pass word once a newer bucket of the same array has
    /// been opened: admissions must move on to the newer bucket.
    pub(crate) const SEALED: u64 = 1 << 63;
    pub(crate) const TAG_SHIFT: u32 = 47;
    pub(crate) const TAG_MASK: u64 = 0xFFFF << TAG_SHIFT;
    pub(crate) const COUNT_MAX: u64 = (1 << TAG_SHIFT) - 1;

    #[inline]
    pub(crate) const fn count(word: u64) -> u64 {
        word & COUNT_MAX
    }

    #[inline]
    pub(crate) const fn tag(word: u64) -> u64 {
        (word & TAG_MASK) >> TAG_SHIFT
    }

    #[inline]
    pub(crate) const fn is_sealed(word: u64) -> bool {
        word & SEALED != 0
    }

    #[inline]
    pub(crate) const fn with_tag(tag: u64, count: u64) -> u64 {
        ((tag << TAG_SHIFT) & TAG_MASK) | (count & COUNT_MAX)
    }
}

/// Adds below this size go through a plain `fetch_add`; at most this much can
/// be added concurrently by any realistic number of threads before the count
/// reaches [`pass_word::COUNT_MAX`], which keeps carries out of the tag bits.
const FAST_ADD_LIMIT: u64 = 1 << 32;
const FAST_ADD_HEADROOM: u64 = 1 << 40;

impl MetricBucket {
    /// An empty bucket.
    pub fn new() -> Self {
        MetricBucket {
            pass: AtomicU64::new(0),
            block: AtomicU64::new(0),
            exception: AtomicU64::new(0),
            success: AtomicU64::new(0),
            rt: AtomicU64::new(0),
            occupied_pass: AtomicU64::new(0),
            min_rt: AtomicU64::new(u64::MAX),
        }
    }

    /// Adds `n` to the counter for `event`. For [`MetricEvent::Rt`], `n` is a
    /// response time in microseconds (see [`add_rt`](Self::add_rt)).
    pub fn add(&self, event: MetricEvent, n: u64) {
        // Relaxed: each counter is an independent tally; nothing is published
        // through it. Bucket rotation orders these writes against the reset
        // with the window stamp (see `LeapArray`).
        match event {
            MetricEvent::Pass => self.add_pass(n),
            MetricEvent::Block => {
                self.block.fetch_add(n, Ordering::Relaxed);
            }
            MetricEvent::Exception => {
                self.exception.fetch_add(n, Ordering::Relaxed);
            }
            MetricEvent::Success => {
                self.success.fetch_add(n, Ordering::Relaxed);
            }
            MetricEvent::Rt => self.add_rt_micros(n),
            MetricEvent::OccupiedPass => {
                self.occupied_pass.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// The current value of the counter for `event` ([`MetricEvent::Rt`]: the
    /// sum in microseconds).
    pub fn get(&self, event: MetricEvent) -> u64 {
        match event {
            MetricEvent::Pass => self.pass(),
            MetricEvent::Block => self.block(),
            MetricEvent::Exception => self.exception(),
            MetricEvent::Success => self.success(),
            MetricEvent::Rt => self.rt.load(Ordering::Relaxed),
            MetricEvent::OccupiedPass => self.occupied_pass(),
        }
    }

    /// Admitted requests.
    pub fn pass(&self) -> u64 {
        pass_word::count(self.pass.load(Ordering::Acquire))
    }

    /// Rejected requests.
    pub fn block(&self) -> u64 {
        self.block.load(Ordering::Relaxed)
    }

    /// Completed requests classified as failures.
    pub fn exception(&self) -> u64 {
        self.exception.load(Ordering::Relaxed)
    }

    /// Completed requests.
    pub fn success(&self) -> u64 {
        self.success.load(Ordering::Relaxed)
    }

    /// Requests that passed on borrowed (future) quota.
    pub fn occupied_pass(&self) -> u64 {
        self.occupied_pass.load(Ordering::Relaxed)
    }

    /// Adds `n` admitted requests (saturating at about 1.4 × 10^14).
    pub fn add_pass(&self, n: u64) {
        self.add_pass_returning(n);
    }

    /// Adds `n` passes and returns the pass word as it was before.
    #[inline]
    pub(crate) fn add_pass_returning(&self, n: u64) -> u64 {
        let current = self.pass.load(Ordering::Relaxed);
        if n < FAST_ADD_LIMIT
            && pass_word::count(current) < pass_word::COUNT_MAX - FAST_ADD_HEADROOM
        {
            // AcqRel keeps the pass word's modification order usable by the
            // admission protocol, which reads it with Acquire.
            return self.pass.fetch_add(n, Ordering::AcqRel);
        }
        self.add_pass_saturating(n)
    }

    #[cold]
    fn add_pass_saturating(&self, n: u64) -> u64 {
        let mut current = self.pass.load(Ordering::Acquire);
        loop {
            let count = pass_word::count(current)
                .saturating_add(n)
                .min(pass_word::COUNT_MAX);
            let next = (current & !pass_word::COUNT_MAX) | count;
            match self.pass.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(previous) => return previous,
                Err(actual) => current = actual,
            }
        }
    }

    /// Adds `n` rejected requests.
    pub fn add_block(&self, n: u64) {
        self.add(MetricEvent::Block, n);
    }

    /// Adds `n` failed completions.
    pub fn add_exception(&self, n: u64) {
        self.add(MetricEvent::Exception, n);
    }

    /// Adds `n` completions.
    pub fn add_success(&self, n: u64) {
        self.add(MetricEvent::Success, n);
    }

    /// Adds `n` requests that passed on borrowed quota.
    pub fn add_occupied_pass(&self, n: u64) {
        self.add(MetricEvent::OccupiedPass, n);
    }

    /// Adds one response time to the sum and offers it as the new minimum.
    /// Precision is one microsecond; longer than `u64::MAX` µs saturates.
    pub fn add_rt(&self, rt: Duration) {
        self.add_rt_micros(u64::try_from(rt.as_micros()).unwrap_or(u64::MAX));
    }

    fn add_rt_micros(&self, micros: u64) {
        self.rt.fetch_add(micros, Ordering::Relaxed);
        // Most response times are not a new minimum: a plain load spares the
        // read-modify-write. A racing smaller value is still kept, because
        // `fetch_min` only ever lowers the minimum.
        if micros < self.min_rt.load(Ordering::Relaxed) {
            self.min_rt.fetch_min(micros, Ordering::Relaxed);
        }
    }

    /// The sum of the response times added.
    pub fn rt(&self) -> Duration {
        Duration::from_micros(self.rt.load(Ordering::Relaxed))
    }

    /// The smallest response time added, or `None` if there was none.
    pub fn min_rt(&self) -> Option<Duration> {
        match self.min_rt.load(Ordering::Relaxed) {
            u64::MAX => None,
            micros => Some(Duration::from_micros(micros)),
        }
    }

    pub(crate) fn min_rt_micros(&self) -> u64 {
        self.min_rt.load(Ordering::Relaxed)
    }

    pub(crate) fn rt_micros(&self) -> u64 {
        self.rt.load(Ordering::Relaxed)
    }

    /// Every counter at once (not a consistent snapshot under concurrent
    /// writes: each counter is read on its own).
    pub(crate) fn counts(&self) -> Counts {
        Counts {
            pass: self.pass(),
            block: self.block(),
            exception: self.exception(),
            success: self.success(),
            rt_micros: self.rt_micros(),
            occupied_pass: self.occupied_pass(),
            min_rt_micros: self.min_rt_micros(),
        }
    }

    /// Empties the bucket and returns what it held. Each counter is swapped
    /// out in one atomic step, so a concurrent add is either in the result or
    /// left in the emptied bucket: never lost, never in both.
    pub(crate) fn take(&self) -> Counts {
        Counts {
            pass: pass_word::count(self.pass.swap(0, Ordering::AcqRel)),
            block: self.block.swap(0, Ordering::Relaxed),
            exception: self.exception.swap(0, Ordering::Relaxed),
            success: self.success.swap(0, Ordering::Relaxed),
            rt_micros: self.rt.swap(0, Ordering::Relaxed),
            occupied_pass: self.occupied_pass.swap(0, Ordering::Relaxed),
            min_rt_micros: self.min_rt.swap(u64::MAX, Ordering::Relaxed),
        }
    }

    /// Adds every count of `counts` to this bucket.
    pub(crate) fn absorb(&self, counts: &Counts) {
        let add = |counter: &AtomicU64, n: u64| {
            if n != 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        };
        if counts.pass != 0 {
            self.add_pass(counts.pass);
        }
        add(&self.block, counts.block);
        add(&self.exception, counts.exception);
        add(&self.success, counts.success);
        add(&self.rt, counts.rt_micros);
        add(&self.occupied_pass, counts.occupied_pass);
        if counts.min_rt_micros < self.min_rt.load(Ordering::Relaxed) {
            self.min_rt
                .fetch_min(counts.min_rt_micros, Ordering::Relaxed);
        }
    }

    /// Clears every counter.
    pub fn reset(&self) {
        self.pass.store(0, Ordering::Relaxed);
        self.block.store(0, Ordering::Relaxed);
        self.exception.store(0, Ordering::Relaxed);
        self.success.store(0, Ordering::Relaxed);
        self.rt.store(0, Ordering::Relaxed);
        self.occupied_pass.store(0, Ordering::Relaxed);
        self.min_rt.store(u64::MAX, Ordering::Relaxed);
    }

    // --- admission bookkeeping, used by `ArrayMetric` -----------------------

    /// The raw pass word: count plus tag and seal bits.
    #[inline]
    pub(crate) fn pass_word(&self) -> u64 {
        self.pass.load(Ordering::Acquire)
    }

    /// Replaces the pass word if it still equals `current`.
    #[inline]
    pub(crate) fn cas_pass_word(&self, current: u64, next: u64) -> Result<u64, u64> {
        // AcqRel on success: the admission is ordered after everything the
        // caller read to decide it. Acquire on failure: the fresh value is
        // used for the next decision.
        self.pass
            .compare_exchange(current, next, Ordering::AcqRel, Ordering::Acquire)
    }

    /// Sets the seal bit, leaving count and tag alone.
    #[inline]
    pub(crate) fn seal_pass(&self) {
        self.pass.fetch_or(pass_word::SEALED, Ordering::AcqRel);
    }

    /// Tags a freshly [`reset`](Self::reset) pass word for a new round and
    /// adds `count`, keeping any pass a late writer added since the reset
    /// (it counts in the new round, like any write behind its bucket).
    /// The word's tag and seal bits must be zero: only the bucket's opener,
    /// which called `reset`, sets them.
    pub(crate) fn start_round(&self, tag: u64, count: u64) {
        debug_assert_eq!(
            self.pass.load(Ordering::Relaxed) & !pass_word::COUNT_MAX,
            0,
            "start_round on a word that was not reset"
        );
        // Release: an admission that reads this round's word (Acquire) also
        // sees what the opener stored before it, the cached sum of the
        // older buckets.
        self.pass
            .fetch_add(pass_word::with_tag(tag, count), Ordering::Release);
    }
}

/// A bucket's counters as plain numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) pass: u64,
    pub(crate) block: u64,
    pub(crate) exception: u64,
    pub(crate) success: u64,
    pub(crate) rt_micros: u64,
    pub(crate) occupied_pass: u64,
    /// `u64::MAX` when none.
    pub(crate) min_rt_micros: u64,
}

impl Default for Counts {
    fn default() -> Self {
        Counts {
            pass: 0,
            block: 0,
            exception: 0,
            success: 0,
            rt_micros: 0,
            occupied_pass: 0,
            min_rt_micros: u64::MAX,
        }
    }
}

impl Counts {
    /// Adds `other` into `self`, saturating.
    pub(crate) fn merge(&mut self, other: &Counts) {
        self.pass = self.pass.saturating_add(other.pass);
        self.block = self.block.saturating_add(other.block);
        self.exception = self.exception.saturating_add(other.exception);
        self.success = self.success.saturating_add(other.success);
        self.rt_micros = self.rt_micros.saturating_add(other.rt_micros);
        self.occupied_pass = self.occupied_pass.saturating_add(other.occupied_pass);
        self.min_rt_micros = self.min_rt_micros.min(other.min_rt_micros);
    }

    /// Whether any event was recorded.
    pub(crate) fn is_empty(&self) -> bool {
        *self == Counts::default()
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
    fn pass_saturates_instead_of_corrupting_the_tag() {
        let b = MetricBucket::new();
        b.start_round(0xABCD, 0);
        b.add_pass(u64::MAX);
        b.add_pass(5);
        assert_eq!(b.pass(), pass_word::COUNT_MAX);
        assert_eq!(pass_word::tag(b.pass_word()), 0xABCD);
        assert!(!pass_word::is_sealed(b.pass_word()));
    }

    #[test]
    fn seal_keeps_count_and_tag() {
        let b = MetricBucket::new();
        b.start_round(7, 3);
        b.seal_pass();
        b.add_pass(2);
        let w = b.pass_word();
        assert!(pass_word::is_sealed(w));
        assert_eq!(pass_word::tag(w), 7);
        assert_eq!(b.pass(), 5);
    }

    #[test]
    fn huge_rt_saturates() {
        let b = MetricBucket::new();
        b.add_rt(Duration::MAX);
        assert_eq!(b.rt(), Duration::from_micros(u64::MAX));
    }
}
