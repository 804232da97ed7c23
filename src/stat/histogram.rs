//! [`RtHistogram`]: a layer's response times counted into buckets with
//! fixed bounds, one count per completed request.
//!
//! The keys' windows keep response times as sums, which give an average and
//! nothing finer; quantiles need each response time put in its bucket when
//! it is known. One histogram serves the whole layer (never one per key),
//! and it exists only once an exporter asks for it: until then a completion
//! pays one load of an empty slot.

use std::sync::{Arc, OnceLock};

use crate::sync::{AtomicU64, Ordering};

/// The slot every entry of a layer shares: empty until an exporter installs
/// the layer's histogram, then set for good.
pub(crate) type RtSlot = Arc<OnceLock<RtHistogram>>;

/// Upper bounds, in seconds, used when none are given: HTTP response times
/// from a millisecond to ten seconds.
#[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
pub(crate) const DEFAULT_RT_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// At most this many bounds (each costs a counter and a line per scrape).
#[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
pub(crate) const MAX_RT_BUCKETS: usize = 64;

/// Response times counted by bucket, with their sum.
///
/// # Concurrency
///
/// Every field is written with relaxed `fetch_add`s only, and never
/// decreases. A reader loads each counter once and reports their sum as the
/// count, so the `+Inf` bucket equals the count in every read; the sum is a
/// separate word, so a read may see a response in its bucket and not yet in
/// the sum (or the reverse), off by the responses completing during the
/// read. Nothing here orders other memory: the histogram only counts.
#[derive(Debug)]
#[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
pub(crate) struct RtHistogram {
    /// Upper bounds in seconds, strictly increasing, as given.
    bounds: Box<[f64]>,
    /// The same bounds in whole microseconds (the resolution of recorded
    /// times): a time of `t` µs belongs to the first bound with `t <=
    /// bound`.
    bounds_us: Box<[u64]>,
    /// Responses per bucket, not cumulative: `counts[i]` are over bound
    /// `i - 1` and at most bound `i`; the last one is over every bound.
    counts: Box<[AtomicU64]>,
    /// Every recorded time summed, in microseconds (saturating is not
    /// needed: 2^64 µs is over half a million years).
    sum_us: AtomicU64,
}

/// A histogram's counters, read once.
#[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
#[derive(Debug, Clone)]
pub(crate) struct RtCounts {
    /// `(upper bound in seconds, responses in that bucket alone)`, the last
    /// bound `f64::INFINITY`.
    pub(crate) buckets: Vec<(f64, u64)>,
    /// Responses recorded: the buckets summed.
    pub(crate) count: u64,
    /// Their times summed, in seconds.
    pub(crate) sum_seconds: f64,
}

#[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
impl RtHistogram {
    /// A histogram with these upper bounds (seconds), or why they cannot
    /// be: `setting` names the setting in the message.
    pub(crate) fn new(bounds: &[f64], setting: &str) -> Result<Self, String> {
        if bounds.is_empty() || bounds.len() > MAX_RT_BUCKETS {
            return Err(format!(
                "{setting}: between 1 and {MAX_RT_BUCKETS} bucket bounds are needed, got {}",
                bounds.len()
            ));
        }
        let mut bounds_us = Vec::with_capacity(bounds.len());
        for &bound in bounds {
            if !bound.is_finite() || bound < 1e-6 {
                return Err(format!(
                    "{setting}: every bound must be a finite number of seconds, at least \
                     0.000001 (one microsecond), got {bound}"
                ));
            }
            let us = whole_micros(bound);
            if bounds_us.last().is_some_and(|&last| us <= last) {
                return Err(format!(
                    "{setting}: bounds must increase by at least a microsecond each, got \
                     {bound} after {}",
                    bounds[bounds_us.len() - 1]
                ));
            }
            bounds_us.push(us);
        }
        Ok(RtHistogram {
            bounds: bounds.into(),
            bounds_us: bounds_us.into(),
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        })
    }

    /// The upper bounds, in seconds, as given.
    pub(crate) fn bounds(&self) -> &[f64] {
        &self.bounds
    }

    /// Counts one response that took `rt_us` microseconds: two relaxed
    /// adds, on counters the whole layer shares.
    #[inline]
    pub(crate) fn record(&self, rt_us: u64) {
        let bucket = self.bounds_us.partition_point(|&bound| bound < rt_us);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(rt_us, Ordering::Relaxed);
    }

    /// The counters now (see "Concurrency" above).
    pub(crate) fn read(&self) -> RtCounts {
        let mut buckets = Vec::with_capacity(self.counts.len());
        let mut count = 0u64;
        for (i, counter) in self.counts.iter().enumerate() {
            let n = counter.load(Ordering::Relaxed);
            count = count.saturating_add(n);
            let bound = self.bounds.get(i).copied().unwrap_or(f64::INFINITY);
            buckets.push((bound, n));
        }
        RtCounts {
            buckets,
            count,
            sum_seconds: self.sum_us.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}

/// `seconds` in whole microseconds, rounding down, except that a bound
/// within float error of a whole microsecond (0.005 is 4999.999… or
/// 5000.000…1 µs once multiplied) is that microsecond: a response of
/// exactly the bound is within it.
fn whole_micros(seconds: f64) -> u64 {
    let us = seconds * 1e6;
    let nearest = us.round();
    if (us - nearest).abs() <= 1e-9 * nearest.max(1.0) {
        nearest as u64
    } else {
        us.floor() as u64
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_time_on_a_bound_is_within_it() {
        let h = RtHistogram::new(&DEFAULT_RT_BUCKETS, "test").unwrap();
        for us in [
            0,
            1_000,
            1_001,
            5_000,
            7_000,
            10_000_000,
            10_000_001,
            u64::MAX / 4,
        ] {
            h.record(us);
        }
        let read = h.read();
        let counts: Vec<u64> = read.buckets.iter().map(|(_, n)| *n).collect();
        assert_eq!(counts, [2, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(read.count, 8);
        assert_eq!(read.buckets.last().unwrap().0, f64::INFINITY);
    }

    #[test]
    fn bad_bounds_are_refused_with_the_setting_named() {
        for bad in [
            &[][..],
            &[0.0],
            &[-1.0],
            &[f64::NAN],
            &[f64::INFINITY],
            &[0.1, 0.1],
            &[0.2, 0.1],
            &[0.1, 0.1000001],
            &[1e-7],
        ] {
            let err = RtHistogram::new(bad, "rt_buckets").unwrap_err();
            assert!(err.starts_with("rt_buckets: "), "{err}");
        }
        let too_many: Vec<f64> = (1..=65).map(f64::from).collect();
        assert!(RtHistogram::new(&too_many, "rt_buckets").is_err());
        assert!(RtHistogram::new(&too_many[..64], "rt_buckets").is_ok());
        assert!(RtHistogram::new(&[0.1, 0.100001], "rt_buckets").is_ok());
    }
}
