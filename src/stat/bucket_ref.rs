//! [`BucketRef`]: a bucket of an admission ring as reads see it, held or
//! only reserved.

use super::admission_bucket::AdmissionBucket;
use super::counts::Counts;

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
