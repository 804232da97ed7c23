//! Admission: the windowed pass count against a limit.
//!
//! [`ArrayMetric::try_pass`](crate::stat::ArrayMetric::try_pass) and
//! [`StatisticNode::try_pass`](crate::stat::StatisticNode::try_pass) decide
//! and record in one atomic step: "admit `n` if the pass count of the window
//! plus `n` stays within `limit`". With any number of concurrent callers
//! exactly `limit` are admitted per window, never more and never fewer. The
//! [`stat` module docs](crate::stat#exact-admission) explain how.
//!
//! ```
//! use tower_sliding_window::clock::ManualClock;
//! use tower_sliding_window::flow::Admission;
//! use tower_sliding_window::stat::ArrayMetric;
//!
//! let clock = ManualClock::new(0);
//! let metric = ArrayMetric::with_clock(10, 1000, clock.clone())?;
//! assert_eq!(metric.try_pass(1, 2), Admission::Pass { window_pass: 1 });
//! assert_eq!(metric.try_pass(1, 2), Admission::Pass { window_pass: 2 });
//! assert_eq!(metric.try_pass(1, 2), Admission::Block { window_pass: 2 });
//! # Ok::<(), tower_sliding_window::ConfigError>(())
//! ```

mod admission;

pub(crate) use admission::wait_for_quota;
pub use admission::Admission;

use crate::stat::StatisticNode;

/// Admits `n` at `now` against `limit` on `node`'s second window, recording
/// a pass, or `n` blocks on rejection.
#[inline]
pub(crate) fn admit(node: &StatisticNode, now: u64, n: u64, limit: u64) -> Admission {
    node.try_pass_at(now, n, limit)
}

/// Milliseconds from `now` until `n` more passes fit under `limit`.
pub(crate) fn retry_after_ms(node: &StatisticNode, now: u64, n: u64, limit: u64) -> Option<u64> {
    node.wait_for_quota_at(now, n, limit)
}
