//! [`TryPass`]: admission on the public statistics types.

use std::time::Duration;

use super::admission::{admission, admit, fits, retry_after_ms, Admission};
use super::quota::wait_for_quota;
use crate::stat::{ArrayMetric, StatisticNode};

/// Exact admission against a limit, for [`ArrayMetric`] and
/// [`StatisticNode`].
///
/// Import it to call `try_pass` and `time_until_pass` on those types:
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::clock::ManualClock;
/// use tower_sliding_window::flow::{Admission, TryPass};
/// use tower_sliding_window::stat::ArrayMetric;
///
/// let clock = ManualClock::new(0);
/// let metric = ArrayMetric::with_clock(10, 1000, clock.clone())?;
/// let admitted = (0..5).filter(|_| metric.try_pass(1, 3).is_pass()).count();
/// assert_eq!(admitted, 3);
/// assert_eq!(metric.pass(), 3);
/// assert_eq!(metric.try_pass(1, 3), Admission::Block { window_pass: 3 });
///
/// // The three passes leave the window one second after they were made.
/// assert_eq!(metric.time_until_pass(1, 3), Some(Duration::from_secs(1)));
/// clock.advance(Duration::from_secs(1));
/// assert!(metric.try_pass(1, 3).is_pass());
/// # Ok::<(), tower_sliding_window::ConfigError>(())
/// ```
pub trait TryPass {
    /// Admits `n` requests if the window's pass count plus `n` stays within
    /// `limit`, recording them as passes in the same atomic step.
    ///
    /// With the clock frozen and any number of threads calling, exactly
    /// `limit` passes are admitted per window. That holds in every window the
    /// ring evaluates (bucket-aligned); an unaligned interval can see up to
    /// twice the limit under bursts.
    ///
    /// On a rejection, an [`ArrayMetric`] records nothing (record it with
    /// [`add_block`](ArrayMetric::add_block) if wanted), while a
    /// [`StatisticNode`] records `n` blocks, as Sentinel's `StatisticSlot`
    /// does.
    fn try_pass(&self, n: u64, limit: u64) -> Admission;

    /// How long until `n` more passes would fit under `limit`, if nothing
    /// else passed meanwhile: zero when they fit now, `None` when they never
    /// can (`n > limit`).
    fn time_until_pass(&self, n: u64, limit: u64) -> Option<Duration>;
}

impl TryPass for ArrayMetric {
    #[inline]
    fn try_pass(&self, n: u64, limit: u64) -> Admission {
        let outcome = self
            .array()
            .try_add_pass(self.now(), n, move |window_pass| {
                fits(window_pass, n, limit)
            });
        admission(outcome, n)
    }

    fn time_until_pass(&self, n: u64, limit: u64) -> Option<Duration> {
        let now = self.now();
        wait_for_quota(self.window_passes(now), now, self.interval_ms(), n, limit)
            .map(Duration::from_millis)
    }
}

/// ```
/// use tower_sliding_window::clock::ManualClock;
/// use tower_sliding_window::flow::TryPass;
/// use tower_sliding_window::stat::StatisticNode;
///
/// let node = StatisticNode::with_clock(ManualClock::new(0));
/// assert!(node.try_pass(2, 2).is_pass());
/// assert!(!node.try_pass(1, 2).is_pass());
/// assert_eq!(node.block_qps(), 1.0, "a rejection is recorded as a block");
/// ```
impl TryPass for StatisticNode {
    #[inline]
    fn try_pass(&self, n: u64, limit: u64) -> Admission {
        admit(self, self.now(), n, limit)
    }

    fn time_until_pass(&self, n: u64, limit: u64) -> Option<Duration> {
        retry_after_ms(self, self.now(), n, limit).map(Duration::from_millis)
    }
}
