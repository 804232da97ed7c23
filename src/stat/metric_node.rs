//! [`MetricNode`]: one bucket's (or one second's) counts, as plain data.

use std::time::Duration;

use super::counts::Counts;

/// The counts of one bucket (or one second) at a point in time: Sentinel's
/// `MetricNode`, as returned by [`ArrayMetric::details`](super::ArrayMetric::details)
/// and [`StatisticNode::metrics`](super::StatisticNode::metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct MetricNode {
    /// Start of the bucket, in clock milliseconds.
    pub timestamp_ms: u64,
    /// Admitted requests.
    pub pass: u64,
    /// Rejected requests.
    pub block: u64,
    /// Completed requests.
    pub success: u64,
    /// Completed requests classified as failures.
    pub exception: u64,
    /// Requests admitted on borrowed quota.
    pub occupied_pass: u64,
    /// Average response time over the successes; `None` when there were
    /// none. Never below the bucket's smallest response time.
    pub rt: Option<Duration>,
}

impl MetricNode {
    pub(crate) fn from_counts(start: u64, counts: &Counts) -> Self {
        MetricNode {
            timestamp_ms: start,
            pass: counts.pass,
            block: counts.block,
            success: counts.success,
            exception: counts.exception,
            occupied_pass: counts.occupied_pass,
            rt: counts.avg_rt(),
        }
    }
}
