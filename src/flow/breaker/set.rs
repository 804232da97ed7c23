//! `Breakers`: the breakers of one key, asked and fed together.

use super::circuit::{CircuitBreaker, Completion, Moved, ProbeToken};
use super::rule::{Breaker, Measure};
use super::state::BreakerState;
use crate::stat::StatisticNode;
use crate::sync::{AtomicU64, Ordering};

/// The most breakers one layer may have.
pub(crate) const MAX_BREAKERS: usize = 64;

/// Which of a key's breakers a request holds the probe slot of, with the
/// slot's token: `(index, token)`, the index in the order the breakers were
/// given to the layer. Empty (no allocation) for every request but probes.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ProbeSet(Vec<(usize, ProbeToken)>);

impl ProbeSet {
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The token of breaker `index`'s slot, if the request holds it.
    fn holds(&self, index: usize) -> Option<ProbeToken> {
        self.0
            .iter()
            .find(|(held, _)| *held == index)
            .map(|&(_, token)| token)
    }
}

/// The breakers of one key, one per [`Breaker`] of the layer. `None` (no
/// allocation, one check per request) when the layer has none; one thin
/// pointer in every key's entry either way, so a layer without breakers
/// keeps its per-key memory.
#[derive(Debug, Default)]
pub(crate) struct Breakers(Option<Box<List>>);

#[derive(Debug)]
struct List {
    breakers: Box<[CircuitBreaker]>,
    /// How many of the breakers are not closed (open or half-open).
    /// Incremented by the one completion that opens a closed breaker, after
    /// it opened it; decremented by the probe that closes it, after it
    /// closed it; each move is reported once (see `Moved`), so the count
    /// never goes below zero. Relaxed: a request that reads 0 while a
    /// breaker is being opened passes as if it had come an instant
    /// earlier; one that reads more than 0 asks every breaker's own word.
    not_closed: AtomicU64,
    /// The shortest `max_rt` of the `slow_ratio` breakers, in microseconds
    /// (`u64::MAX` without any): a completion no slower than this is slow
    /// for none of them.
    slow_above_us: u64,
    /// Whether a breaker counts every completion in its own window (its
    /// stat interval is not the key's window).
    counts_every_completion: bool,
}

impl Breakers {
    /// The breakers of a key whose statistics window has `sample_count`
    /// buckets over `interval_ms` (those with that stat interval count on
    /// it: see [`CircuitBreaker`]'s implementation details).
    pub(crate) fn new(rules: &[Breaker], sample_count: usize, interval_ms: u64) -> Self {
        debug_assert!(rules.len() <= MAX_BREAKERS, "checked by the layer");
        if rules.is_empty() {
            return Breakers(None);
        }
        let breakers: Box<[CircuitBreaker]> = rules
            .iter()
            .map(|&rule| CircuitBreaker::on_key(rule, sample_count, interval_ms))
            .collect();
        let slow_above_us = rules
            .iter()
            .filter_map(|rule| match rule.measure {
                Measure::SlowRatio { max_rt_us, .. } => Some(max_rt_us),
                _ => None,
            })
            .min()
            .unwrap_or(u64::MAX);
        let counts_every_completion = breakers.iter().any(CircuitBreaker::counts_every_completion);
        Breakers(Some(Box::new(List {
            breakers,
            not_closed: AtomicU64::new(0),
            slow_above_us,
            counts_every_completion,
        })))
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Whether every breaker is closed, or there are none: a request then
    /// has nothing to ask them. One load.
    #[inline]
    pub(crate) fn none_open(&self) -> bool {
        self.0
            .as_ref()
            .is_none_or(|list| list.not_closed.load(Ordering::Relaxed) == 0)
    }

    /// Whether a completion that took `rt_us` and `failed` or not (or
    /// panicked) is anything to the breakers, when the request held no
    /// probe: no for a good one, when every breaker counts on the key's
    /// statistics.
    #[inline]
    pub(crate) fn want(&self, rt_us: u64, failed: bool) -> bool {
        self.0.as_ref().is_some_and(|list| {
            failed || rt_us > list.slow_above_us || list.counts_every_completion
        })
    }

    /// Every breaker, in the order they were given.
    #[inline]
    fn all(&self) -> &[CircuitBreaker] {
        self.0.as_ref().map_or(&[], |list| &list.breakers)
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
                Ok(Some(token)) => probes.0.push((index, token)),
                Ok(None) => {}
                Err(wait) => {
                    self.release(&probes);
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
    pub(crate) fn complete(&self, done: Completion, probes: &ProbeSet, key: &StatisticNode) {
        let Some(list) = &self.0 else {
            return;
        };
        for (index, breaker) in list.breakers.iter().enumerate() {
            match breaker.complete(done, probes.holds(index), Some(key)) {
                Moved::No => {}
                Moved::Opened => {
                    list.not_closed.fetch_add(1, Ordering::Relaxed);
                }
                Moved::Closed => {
                    list.not_closed.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Frees the probe slots in `probes` (a dropped or refused probe).
    pub(crate) fn release(&self, probes: &ProbeSet) {
        for &(index, token) in &probes.0 {
            self.all()[index].release_probe(token);
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

    /// Whether every breaker is idle at `now` (closed, or half-open with
    /// its probe slot free): nothing to lose if the key's entry goes, since
    /// new breakers would let the next request through as these would.
    pub(crate) fn idle_at(&self, now: u64) -> bool {
        self.all().iter().all(|breaker| breaker.is_idle_at(now))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use super::*;

    use crate::clock::{ManualClock, SharedClock};

    fn node() -> StatisticNode {
        StatisticNode::build(SharedClock::new(ManualClock::new(0)), 2, 1_000, false).unwrap()
    }

    fn indices(probes: &ProbeSet) -> Vec<usize> {
        probes.0.iter().map(|&(index, _)| index).collect()
    }

    fn not_closed(breakers: &Breakers) -> u64 {
        breakers
            .0
            .as_ref()
            .unwrap()
            .not_closed
            .load(Ordering::Relaxed)
    }

    #[test]
    fn the_not_closed_count_follows_every_transition() {
        let rule = Breaker::error_count(0)
            .min_requests(1)
            .open_for(Duration::from_millis(100));
        let key = node();
        let breakers = Breakers::new(&[rule, rule.open_for(Duration::from_millis(300))], 2, 1_000);
        assert!(breakers.none_open());
        key.record_completion_at(0, Duration::ZERO, true);
        breakers.complete(Completion::finished(0, 0, true), &ProbeSet::default(), &key);
        assert_eq!(not_closed(&breakers), 2);
        assert!(!breakers.none_open());
        // A late failure while open moves nothing.
        key.record_completion_at(5, Duration::ZERO, true);
        breakers.complete(Completion::finished(5, 0, true), &ProbeSet::default(), &key);
        assert_eq!(not_closed(&breakers), 2);
        // Half-open and probed: still not closed; a dropped probe neither.
        let probe = breakers.enter(100);
        assert_eq!(probe, Err(200), "the second is open until 300");
        let probes = breakers.enter(300).unwrap();
        assert_eq!(indices(&probes), [0, 1]);
        breakers.release(&probes);
        assert_eq!(not_closed(&breakers), 2);
        // A successful probe closes both.
        let probes = breakers.enter(300).unwrap();
        key.record_completion_at(300, Duration::ZERO, false);
        breakers.complete(Completion::finished(300, 0, false), &probes, &key);
        assert_eq!(not_closed(&breakers), 0);
        assert!(breakers.none_open());
    }

    #[test]
    fn racing_failures_open_a_breaker_once() {
        let key = node();
        let breakers = Breakers::new(&[Breaker::error_count(3).min_requests(1)], 2, 1_000);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..500 {
                        key.record_completion_at(10, Duration::ZERO, true);
                        breakers.complete(
                            Completion::finished(10, 0, true),
                            &ProbeSet::default(),
                            &key,
                        );
                    }
                });
            }
        });
        assert_eq!(not_closed(&breakers), 1);
    }

    #[test]
    fn good_completions_are_wanted_only_by_breakers_counting_on_their_own() {
        let slow = Breaker::slow_ratio(Duration::from_millis(100), 0.5);
        let on_key = Breakers::new(&[Breaker::error_ratio(0.5), slow], 2, 1_000);
        assert!(!on_key.want(100_000, false), "not slower than max_rt");
        assert!(on_key.want(100_001, false));
        assert!(on_key.want(0, true));
        let own = Breakers::new(
            &[Breaker::error_ratio(0.5).stat_interval(Duration::from_secs(5))],
            2,
            1_000,
        );
        assert!(own.want(0, false));
        assert!(!Breakers::default().want(0, true));
    }

    #[test]
    fn a_request_refused_by_one_breaker_frees_the_probe_of_another() {
        let quick = Breaker::error_count(0)
            .min_requests(1)
            .open_for(Duration::from_millis(10));
        let slow = quick.open_for(Duration::from_millis(1_000));
        let breakers = Breakers::new(&[quick, slow], 1, 1_000);
        let failed = Completion::finished(0, 0, true);
        for breaker in breakers.all() {
            let _ = breaker.complete(failed, None, None);
        }
        // The first is half-open at 10, the second open until 1000.
        assert_eq!(breakers.enter(10), Err(990));
        assert_eq!(breakers.states(10)[0], BreakerState::HalfOpen);
        assert_eq!(breakers.enter(1_000).map(|p| indices(&p)), Ok(vec![0, 1]));
    }
}
