//! [`MinuteWindow`]: the read side of a `StatisticNode`'s minute window.

use std::fmt;
use std::time::Duration;

use super::counts::Counts;
use super::metric_array::MetricArray;
use super::metric_node::MetricNode;
use crate::clock::{Clock, SharedClock};

/// A [`StatisticNode`](super::StatisticNode)'s minute window: 60 buckets of
/// one second, read at the node's clock. Obtained from
/// [`StatisticNode::minute_window`](super::StatisticNode::minute_window).
///
/// Recording never writes it directly: a second-window bucket rolls up into
/// its second here when the second window reuses its slot, and reads add the
/// buckets not rolled up yet. Each event is counted once either way (a
/// sequence lock keeps a bucket from being seen in both places at once).
pub struct MinuteWindow<'a> {
    /// The node's second window, which rolls up into the minute window.
    array: &'a MetricArray,
    clock: &'a SharedClock,
}

/// The minute window's shape when the ring has no roll-up (never, for a
/// `StatisticNode`).
const DEFAULT_SHAPE: (usize, u64) = (60, 60_000);

impl<'a> MinuteWindow<'a> {
    pub(crate) fn new(array: &'a MetricArray, clock: &'a SharedClock) -> Self {
        MinuteWindow { array, clock }
    }

    fn now(&self) -> u64 {
        self.clock.now_millis()
    }

    fn fold<T: Clone>(&self, init: T, f: impl FnMut(&mut T, u64, Counts)) -> T {
        self.array.rollup_fold(self.now(), init, f)
    }

    fn shape(&self) -> (usize, u64) {
        self.array.rollup_shape().unwrap_or(DEFAULT_SHAPE)
    }

    fn sum(&self, f: impl Fn(&Counts) -> u64) -> u64 {
        self.fold(0u64, |sum, _, counts| {
            *sum = sum.saturating_add(f(&counts));
        })
    }

    /// Number of buckets: 60.
    pub fn sample_count(&self) -> usize {
        self.shape().0
    }

    /// Length of the window: 60 000 ms.
    pub fn interval_ms(&self) -> u64 {
        self.shape().1
    }

    /// Passes plus blocks in the last minute.
    pub(crate) fn total(&self) -> u64 {
        self.sum(|c| c.pass.saturating_add(c.block))
    }

    /// Admitted requests in the last minute (plus passes on borrowed quota,
    /// counted when granted, as Sentinel does).
    pub fn pass(&self) -> u64 {
        self.sum(|c| c.pass)
    }

    /// Rejected requests in the last minute.
    pub fn block(&self) -> u64 {
        self.sum(|c| c.block)
    }

    /// Completions in the last minute.
    pub fn success(&self) -> u64 {
        self.sum(|c| c.success)
    }

    /// Failed completions in the last minute.
    pub fn exception(&self) -> u64 {
        self.sum(|c| c.exception)
    }

    /// Passes on borrowed quota in the last minute.
    pub fn occupied_pass(&self) -> u64 {
        self.sum(|c| c.occupied_pass)
    }

    /// Sum of the response times of the last minute.
    pub fn rt(&self) -> Duration {
        Duration::from_micros(self.sum(|c| c.rt_micros))
    }

    /// Smallest response time of the last minute.
    pub fn min_rt(&self) -> Option<Duration> {
        let min = self.fold(u64::MAX, |min, _, counts| {
            *min = (*min).min(counts.min_rt_micros);
        });
        (min != u64::MAX).then(|| Duration::from_micros(min))
    }

    /// The counts of the second before the current one.
    fn previous(&self) -> Counts {
        let now = self.now();
        let (sample_count, interval) = self.shape();
        let length = interval / sample_count as u64;
        let current = now - now % length;
        let Some(previous) = current.checked_sub(length) else {
            return Counts::default();
        };
        self.fold(Counts::default(), |total, start, counts| {
            if start == previous {
                total.merge(&counts);
            }
        })
    }

    /// Passes of the previous whole second.
    pub fn previous_window_pass(&self) -> u64 {
        self.previous().pass
    }

    /// Blocks of the previous whole second.
    pub fn previous_window_block(&self) -> u64 {
        self.previous().block
    }

    /// One [`MetricNode`] per second with events in the window, oldest first.
    pub fn details(&self) -> Vec<MetricNode> {
        self.array
            .rollup_buckets(self.now())
            .iter()
            .map(|(start, counts)| MetricNode::from_counts(*start, counts))
            .collect()
    }
}

impl fmt::Debug for MinuteWindow<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MinuteWindow")
            .field("pass", &self.pass())
            .field("block", &self.block())
            .field("success", &self.success())
            .field("exception", &self.exception())
            .finish_non_exhaustive()
    }
}
