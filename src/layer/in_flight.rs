//! The guard that holds a passed request's place in its key's concurrency
//! gauge and records its completion.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use crate::flow::{self, Decision};
use crate::store::{Entry, Probe};

/// Holds a passed request's place in its key's concurrency gauge.
///
/// Dropping it always releases the place, so a request whose future or body
/// is dropped (client gone, timeout) or whose handler panics cannot leak it.
pub(crate) struct InFlight {
    /// The key whose gauge holds the place. (A compact key keeps no gauge
    /// and records no completion: its passes take no guard at all.)
    entry: Arc<Entry>,
    /// `Clock::now_micros` at admission.
    started_us: u64,
    /// Set while the inner service's code runs (its `call`, a poll of its
    /// future or of its body); still set at drop only if that code unwound.
    in_user_code: bool,
    completed: bool,
    /// The probe slots the request holds in its key's circuit breakers, if
    /// any: its completion decides them; dropped uncompleted, they are
    /// freed. Boxed: only a half-open breaker's probe holds slots, and the
    /// future of every passed request carries this guard.
    probe: Option<Box<Probe>>,
}

impl InFlight {
    /// Marks a request in flight: one more in the concurrency gauge.
    pub(crate) fn start(entry: Arc<Entry>, started_us: u64) -> Self {
        entry.node.increase_concurrency();
        Self::holding(entry, started_us)
    }

    /// Like [`start`](Self::start), if fewer than `max` requests of the key
    /// are in flight; else the concurrency controller's refusal (against
    /// `limit`), having recorded nothing.
    pub(crate) fn try_start(
        entry: &Arc<Entry>,
        started_us: u64,
        max: NonZeroU64,
        limit: u64,
    ) -> Decision<Self> {
        flow::concurrency::try_enter(&entry.node, max, limit)
            .map(|()| Self::holding(Arc::clone(entry), started_us))
    }

    /// The guard of a place already taken in `entry`'s gauge. Under a
    /// system rule the request also passes into the layer-wide node here:
    /// every guard is made through this function, whatever path the
    /// request took (at once, after a wait, with a concurrency place).
    fn holding(entry: Arc<Entry>, started_us: u64) -> Self {
        if let Some(system) = &entry.system {
            system.enter();
        }
        InFlight {
            entry,
            started_us,
            in_user_code: false,
            completed: false,
            probe: None,
        }
    }

    /// Makes this request its key's breakers' probe (see `Probe`).
    #[inline]
    pub(crate) fn hold_probe(&mut self, probe: Probe) {
        self.probe = Some(Box::new(probe));
    }

    /// Starts the response time again at `now_us`: a place taken before a
    /// wait counts the time in the inner service only.
    pub(crate) fn restart(&mut self, now_us: u64) {
        self.started_us = now_us;
    }

    #[inline]
    pub(crate) fn enter_user_code(&mut self) {
        self.in_user_code = true;
    }

    #[inline]
    pub(crate) fn leave_user_code(&mut self) {
        self.in_user_code = false;
    }

    /// Records a completion: one success with its response time, and an
    /// exception on top when it failed.
    pub(crate) fn complete(&mut self, failed: bool) {
        let entry = &self.entry;
        let node = &entry.node;
        // One clock reading serves the response time and the bucket.
        let (now_ms, now_us) = node.clock().now_both();
        let rt_us = now_us.saturating_sub(self.started_us);
        node.record_completion_at(now_ms, Duration::from_micros(rt_us), failed);
        if let Some(system) = &entry.system {
            system.complete(now_ms, Duration::from_micros(rt_us), failed);
        }
        // The layer's histogram, once an exporter wants it: two relaxed
        // adds on counters the layer shares (see `RtHistogram`).
        if let Some(histogram) = entry.rt_histogram.get() {
            histogram.record(rt_us);
        }
        // Closed breakers that count on the key's statistics have nothing
        // to do for a good completion: the key has just recorded it.
        if self.probe.is_some() || entry.breakers.want(rt_us, failed) {
            entry.complete_breakers(now_ms, rt_us, failed, false, self.probe.take());
        }
        self.completed = true;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let entry = &self.entry;
        let node = &entry.node;
        if !self.completed && self.in_user_code {
            // The inner service panicked: a failure, not a success, for
            // the breakers too (a probe that panics failed).
            node.increase_exception_qps(1);
            if let Some(system) = &entry.system {
                system.panicked();
            }
            if !entry.breakers.is_empty() {
                let (now_ms, now_us) = node.clock().now_both();
                let rt_us = now_us.saturating_sub(self.started_us);
                entry.complete_breakers(now_ms, rt_us, true, true, self.probe.take());
            }
        }
        // Matched by the increase in `InFlight::start`.
        node.release_concurrency();
        // Matched by the `enter` in `holding`.
        if let Some(system) = &entry.system {
            system.leave();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::InFlight;

    /// Every passed request's response future holds this guard: four words
    /// (the key, the start, the probe's box, the flags), the probe's slots
    /// boxed because only a half-open breaker's probe holds any.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn the_guard_is_four_words() {
        assert_eq!(std::mem::size_of::<InFlight>(), 32);
    }
}
