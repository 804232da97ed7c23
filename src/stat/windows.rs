//! A key's further windows (`SlidingWindowLayer::limit_per`): one admission
//! ring and one limit per window, besides the key's first window (its
//! `StatisticNode`'s second window).
//!
//! Each ring is the admission engine of `admission.rs` without a roll-up or
//! reservations: it counts passes only, and a pass taken in it can be given
//! back ([`MetricArray::give_back`]), which the all-or-none decision over
//! the key's windows needs (`flow::windows`).

use super::admission::{MetricArray, Placed};
use crate::error::ConfigError;
use crate::sync::{AtomicU64, Ordering};

/// The shape of one further window: `sample_count` buckets over
/// `interval_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowShape {
    pub(crate) sample_count: usize,
    pub(crate) interval_ms: u64,
}

/// One further window of a key.
pub(crate) struct ExtraWindow {
    ring: MetricArray,
    /// The limit this window admits against. Relaxed: read once per
    /// request on its own; a change applies from the next request, as the
    /// first window's limit (`Entry::limit`).
    limit: AtomicU64,
}

/// A key's further windows, in the order the layer was given them.
pub(crate) struct ExtraWindows {
    windows: Box<[ExtraWindow]>,
}

impl ExtraWindows {
    /// A ring per shape, each starting with the limit `limits` gives for
    /// its index; `strict` rings count the bucket that has just left the
    /// window too.
    pub(crate) fn new(
        shapes: &[WindowShape],
        strict: bool,
        limits: impl Fn(usize) -> u64,
    ) -> Result<Self, ConfigError> {
        let windows = shapes
            .iter()
            .enumerate()
            .map(|(i, shape)| {
                Ok(ExtraWindow {
                    ring: MetricArray::build(
                        shape.sample_count,
                        shape.interval_ms,
                        false,
                        None,
                        strict,
                    )?,
                    limit: AtomicU64::new(limits(i)),
                })
            })
            .collect::<Result<Box<[_]>, ConfigError>>()?;
        Ok(ExtraWindows { windows })
    }

    /// The windows, in order.
    #[inline]
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, ExtraWindow> {
        self.windows.iter()
    }

    /// Number of windows.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.windows.len()
    }

    /// Window `i`.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&ExtraWindow> {
        self.windows.get(i)
    }

    /// Whether no window holds anything that can count at `now` or later
    /// (a key with passes left in any window must keep its entry).
    pub(crate) fn idle_at(&self, now: u64) -> bool {
        self.windows.iter().all(|w| w.idle_at(now))
    }
}

impl ExtraWindow {
    /// The limit the window admits against now.
    #[inline]
    pub(crate) fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Sets the limit, from the next request.
    pub(crate) fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Length of the window, in milliseconds.
    #[inline]
    pub(crate) fn interval_ms(&self) -> u64 {
        self.ring.interval_ms()
    }

    /// Adds `n` passes at `now` if `decide(window_pass)` says yes, in one
    /// compare-and-swap: `Ok` with the window's passes before the add and
    /// where they landed (to [`give_back`](Self::give_back) them), or
    /// `Err(window_pass)`.
    #[inline]
    pub(crate) fn try_take(
        &self,
        now: u64,
        n: u64,
        decide: impl Fn(u64) -> bool,
    ) -> Result<(u64, Placed), u64> {
        self.ring.try_take(now, n, decide)
    }

    /// Takes back `n` passes placed at `placed` (see
    /// `MetricArray::give_back`).
    #[inline]
    pub(crate) fn give_back(&self, placed: Placed, n: u64) {
        self.ring.give_back(placed, n);
    }

    /// Passes in the window at `now`.
    pub(crate) fn pass(&self, now: u64) -> u64 {
        self.ring.sum(now, |b| b.pass())
    }

    /// What admission counts at `now`, as `(start, passes)` oldest first,
    /// and how long a bucket counts for it (as
    /// `StatisticNode::admission_passes`). No allocation.
    pub(crate) fn admission_passes(
        &self,
        now: u64,
    ) -> (impl Iterator<Item = (u64, u64)> + Clone + '_, u64) {
        let ring = &self.ring;
        let departed = ring.departed_bucket(now);
        let span = if ring.is_strict() {
            ring.interval_ms().saturating_add(ring.window_length_ms())
        } else {
            ring.interval_ms()
        };
        (departed.into_iter().chain(ring.pass_buckets(now)), span)
    }

    /// Whether nothing this window holds can count at `now` or later.
    fn idle_at(&self, now: u64) -> bool {
        let interval = self.ring.interval_ms();
        let window_start = now - now % self.ring.window_length_ms();
        self.ring
            .newest_start()
            .is_none_or(|start| start.saturating_add(interval) <= window_start)
    }
}

impl std::fmt::Debug for ExtraWindows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.windows.iter().map(|w| (w.interval_ms(), w.limit())))
            .finish()
    }
}
