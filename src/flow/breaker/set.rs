//! `Breakers`: the breakers of one key, asked and fed together.

use super::circuit::{CircuitBreaker, Completion};
use super::rule::Breaker;
use super::state::BreakerState;
use crate::stat::StatisticNode;

/// The most breakers one layer may have: a request's probe slots are one
/// bit each in a `u64`.
pub(crate) const MAX_BREAKERS: usize = 64;

/// Which of a key's breakers a request holds the probe slot of: one bit
/// per breaker, in the order they were given to the layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ProbeSet(u64);

impl ProbeSet {
    pub(crate) fn is_empty(self) -> bool {
        self.0 == 0
    }

    fn holds(self, index: usize) -> bool {
        self.0 & (1 << index) != 0
    }
}

/// The breakers of one key, one per [`Breaker`] of the layer. `None` (no
/// allocation, one check per request) when the layer has none; one thin
/// pointer in every key's entry either way, so a layer without breakers
/// keeps its per-key memory.
#[derive(Debug, Default)]
pub(crate) struct Breakers(Option<Box<List>>);

#[derive(Debug)]
struct List(Box<[CircuitBreaker]>);

impl Breakers {
    /// The breakers of a key whose statistics window has `sample_count`
    /// buckets over `interval_ms` (those with that stat interval count on
    /// it: see [`CircuitBreaker`]'s implementation details).
    pub(crate) fn new(rules: &[Breaker], sample_count: usize, interval_ms: u64) -> Self {
        debug_assert!(rules.len() <= MAX_BREAKERS, "checked by the layer");
        if rules.is_empty() {
            return Breakers(None);
        }
        let list = rules
            .iter()
            .map(|&rule| CircuitBreaker::on_key(rule, sample_count, interval_ms))
            .collect();
        Breakers(Some(Box::new(List(list))))
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Every breaker, in the order they were given.
    #[inline]
    fn all(&self) -> &[CircuitBreaker] {
        self.0.as_ref().map_or(&[], |list| &list.0)
    }

    /// Lets a request through every breaker at `now`: `Ok` with the probe
    /// slots it took, or `Err` with the longest wait until the refusing
    /// breakers turn half-open (0 while a probe is out), having freed any
    /// probe slot it took on the way: a request refused by one breaker is
    /// no probe of another.
    pub(crate) fn enter(&self, now: u64) -> Result<ProbeSet, u64> {
        let mut probes = ProbeSet::default();
        for (index, breaker) in self.all().iter().enumerate() {
            match breaker.enter(now) {
                Ok(true) => probes.0 |= 1 << index,
                Ok(false) => {}
                Err(wait) => {
                    self.release(probes);
                    // The request waits for every open breaker: the longest
                    // wait of the rest, read without taking their slots.
                    let rest = self.all()[index + 1..].iter().map(|b| match b.state(now) {
                        BreakerState::Open { half_open_in } => {
                            u64::try_from(half_open_in.as_millis()).unwrap_or(u64::MAX)
                        }
                        _ => 0,
                    });
                    return Err(rest.fold(wait, u64::max));
                }
            }
        }
        Ok(probes)
    }

    /// Records `done` in every breaker; `probes`: the slots the request
    /// held, whose breakers it decides; `key`: the key's statistics, which
    /// have recorded `done` already.
    #[inline]
    pub(crate) fn complete(&self, done: Completion, probes: ProbeSet, key: &StatisticNode) {
        for (index, breaker) in self.all().iter().enumerate() {
            breaker.complete(done, probes.holds(index), Some(key));
        }
    }

    /// Frees the probe slots in `probes` (a dropped or refused probe).
    pub(crate) fn release(&self, probes: ProbeSet) {
        for (index, breaker) in self.all().iter().enumerate() {
            if probes.holds(index) {
                breaker.release_probe();
            }
        }
    }

    /// Every breaker's state at `now`, in the order they were given.
    pub(crate) fn states(&self, now: u64) -> Vec<BreakerState> {
        self.all().iter().map(|b| b.state(now)).collect()
    }

    /// How many breakers are not closed (open, or half-open).
    #[cfg(feature = "prometheus")]
    pub(crate) fn not_closed(&self) -> u64 {
        self.all().iter().filter(|b| !b.is_closed()).count() as u64
    }

    /// Whether every breaker is closed: nothing to lose if the key's entry
    /// goes.
    pub(crate) fn all_closed(&self) -> bool {
        self.all().iter().all(CircuitBreaker::is_closed)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_request_refused_by_one_breaker_frees_the_probe_of_another() {
        let quick = Breaker::error_count(0)
            .min_requests(1)
            .open_for(Duration::from_millis(10));
        let slow = quick.open_for(Duration::from_millis(1_000));
        let breakers = Breakers::new(&[quick, slow], 1, 1_000);
        let failed = Completion {
            now: 0,
            rt_us: 0,
            failed: true,
            panicked: false,
        };
        for breaker in breakers.all() {
            breaker.complete(failed, false, None);
        }
        // The first is half-open at 10, the second open until 1000.
        assert_eq!(breakers.enter(10), Err(990));
        assert_eq!(breakers.states(10)[0], BreakerState::HalfOpen);
        assert_eq!(breakers.enter(1_000), Ok(ProbeSet(0b11)));
    }
}
