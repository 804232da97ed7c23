//! The bucket of a managed ring: the counters of a
//! [`MetricBucket`](super::MetricBucket), with the pass count packed into an
//! admission word.
//!
//! ```text
//!  63     62 ........ 47  46 ............. 0
//! [SEALED][ round tag  ][     count        ]
//! ```
//!
//! - `count`: the bucket's passes, saturating at [`pass_word::COUNT_MAX`]
//!   (about 1.4 × 10^14).
//! - `round tag`: which window of its slot the bucket holds (see
//!   `metric_array::round_tag`). An admission succeeds only on a word whose
//!   tag is the one it decided for, so a caller delayed across a rotation
//!   cannot land in the next window with a stale count (ABA).
//! - `SEALED`: set once a newer bucket of the ring has been opened; an
//!   admission never succeeds on a sealed word.
//!
//! The type is crate-private: a safe public `reset` on it would zero the
//! tag and stall every admission until the clock left the bucket. Readers
//! outside the crate get [`BucketSnapshot`](super::BucketSnapshot)s.

use super::counts::Counts;
use super::leap_array::BucketValue;
use super::tallies::Tallies;
use crate::sync::{AtomicU64, Ordering};

/// Layout of the admission word (see the module docs).
pub(crate) mod pass_word {
    /// Set on a bucket's word once a newer bucket of the same ring has been
    /// opened: admissions must move on to the newer bucket.
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

    /// The word's bits from the tag up: its round tag when the word is
    /// open, a value above `0xFFFF` when it is sealed. Comparing this with
    /// a round's tag checks both at once.
    #[inline]
    pub(crate) const fn open_tag(word: u64) -> u64 {
        word >> TAG_SHIFT
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

/// A managed bucket (56 bytes, like `MetricBucket`).
pub(crate) struct AdmissionBucket {
    /// The admission word: seal bit, round tag, pass count.
    word: AtomicU64,
    tallies: Tallies,
}

impl Default for AdmissionBucket {
    fn default() -> Self {
        AdmissionBucket {
            word: AtomicU64::new(0),
            tallies: Tallies::new(),
        }
    }
}

impl BucketValue for AdmissionBucket {
    fn reset(&self) {
        AdmissionBucket::reset(self);
    }
}

impl AdmissionBucket {
    /// The tallies (block, success, response times, ...).
    #[inline]
    pub(crate) fn tallies(&self) -> &Tallies {
        &self.tallies
    }

    /// Admitted requests.
    #[inline]
    pub(crate) fn pass(&self) -> u64 {
        pass_word::count(self.pass_word())
    }

    /// Every counter (each read on its own).
    pub(crate) fn counts(&self) -> Counts {
        self.tallies.counts(self.pass())
    }

    /// The raw admission word.
    #[inline]
    pub(crate) fn pass_word(&self) -> u64 {
        // Acquire: pairs with the Release of `start_round`, so a reader of a
        // round's word also sees what its opener stored before it.
        self.word.load(Ordering::Acquire)
    }

    /// Adds `n` passes unconditionally (saturating) and returns the word as
    /// it was before.
    #[inline]
    pub(crate) fn add_pass_returning(&self, n: u64) -> u64 {
        // Relaxed: only a guess at the headroom; the add below decides.
        let current = self.word.load(Ordering::Relaxed);
        if n < FAST_ADD_LIMIT
            && pass_word::count(current) < pass_word::COUNT_MAX - FAST_ADD_HEADROOM
        {
            // AcqRel keeps the word's modification order usable by the
            // admission protocol, which reads it with Acquire.
            return self.word.fetch_add(n, Ordering::AcqRel);
        }
        self.add_pass_saturating(n)
    }

    #[cold]
    fn add_pass_saturating(&self, n: u64) -> u64 {
        // AcqRel / Acquire: as the fast path above.
        let mut current = self.word.load(Ordering::Acquire);
        loop {
            let count = pass_word::count(current)
                .saturating_add(n)
                .min(pass_word::COUNT_MAX);
            let next = (current & !pass_word::COUNT_MAX) | count;
            match self.word.compare_exchange_weak(
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

    /// Replaces the word if it still equals `current`.
    #[inline]
    pub(crate) fn cas_pass_word(&self, current: u64, next: u64) -> Result<u64, u64> {
        // AcqRel on success: the admission is ordered after everything the
        // caller read to decide it. Acquire on failure: the fresh value is
        // used for the next decision.
        self.word
            .compare_exchange(current, next, Ordering::AcqRel, Ordering::Acquire)
    }

    /// Sets the seal bit, leaving count and tag alone.
    #[inline]
    pub(crate) fn seal(&self) {
        // AcqRel: the seal is ordered with the admissions on this word, so an
        // admission swapping after it fails.
        self.word.fetch_or(pass_word::SEALED, Ordering::AcqRel);
    }

    /// Tags a freshly emptied word for a new round and adds `count`, keeping
    /// any pass a late writer added since the reset (it counts in the new
    /// round, like any write behind its bucket). The word's tag and seal
    /// bits must be zero: only the bucket's opener, which emptied it, sets
    /// them.
    pub(crate) fn start_round(&self, tag: u64, count: u64) {
        debug_assert_eq!(
            self.word.load(Ordering::Relaxed) & !pass_word::COUNT_MAX,
            0,
            "start_round on a word that was not reset"
        );
        // Release: an admission that reads this round's word (Acquire) also
        // sees what the opener stored before it, the cached sum of the
        // older buckets.
        self.word
            .fetch_add(pass_word::with_tag(tag, count), Ordering::Release);
    }

    /// Empties the bucket and returns what it held. Each counter is swapped
    /// out in one atomic step, so a concurrent add is either in the result or
    /// left in the emptied bucket: never lost, never in both.
    pub(crate) fn take(&self) -> Counts {
        // AcqRel: ordered with the admissions on the word (see `seal`).
        let pass = pass_word::count(self.word.swap(0, Ordering::AcqRel));
        self.tallies.take(pass)
    }

    /// Clears every counter, the admission word included.
    pub(crate) fn reset(&self) {
        // Relaxed: the ring's owner publishes the reset with the slot's
        // stamp (Release) before anyone may write the new window.
        self.word.store(0, Ordering::Relaxed);
        self.tallies.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_in_56_bytes() {
        assert_eq!(std::mem::size_of::<AdmissionBucket>(), 56);
    }

    #[test]
    fn pass_saturates_instead_of_corrupting_the_tag() {
        let b = AdmissionBucket::default();
        b.start_round(0xABCD, 0);
        b.add_pass_returning(u64::MAX);
        b.add_pass_returning(5);
        assert_eq!(b.pass(), pass_word::COUNT_MAX);
        assert_eq!(pass_word::tag(b.pass_word()), 0xABCD);
        assert!(!pass_word::is_sealed(b.pass_word()));
    }

    #[test]
    fn seal_keeps_count_and_tag() {
        let b = AdmissionBucket::default();
        b.start_round(7, 3);
        b.seal();
        b.add_pass_returning(2);
        let w = b.pass_word();
        assert!(pass_word::is_sealed(w));
        assert_eq!(pass_word::tag(w), 7);
        assert_eq!(b.pass(), 5);
    }
}
