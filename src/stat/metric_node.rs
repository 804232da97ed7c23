use std::time::Duration;

use super::bucket::Counts;
use super::metric_array::BucketRef;

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
    /// Average response time over the successes; `None` when there were none.
    pub rt: Option<Duration>,
}

impl MetricNode {
    pub(crate) fn from_bucket(start: u64, bucket: BucketRef<'_>) -> Self {
        MetricNode {
            timestamp_ms: start,
            pass: bucket.pass(),
            block: bucket.block(),
            success: bucket.success(),
            exception: bucket.exception(),
            occupied_pass: bucket.occupied_pass(),
            rt: average_rt(bucket.rt_micros(), bucket.success()),
        }
    }
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
            rt: average_rt(counts.rt_micros, counts.success),
        }
    }
}

/// `rt_sum / successes`, or `None` without successes.
pub(crate) fn average_rt(rt_micros: u64, successes: u64) -> Option<Duration> {
    let nanos = u128::from(rt_micros) * 1000 / u128::from(successes.max(1));
    (successes != 0).then(|| Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)))
}
