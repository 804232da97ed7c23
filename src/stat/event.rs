/// The events a [`MetricBucket`](super::MetricBucket) counts.
///
/// These are Sentinel's `MetricEvent`s. "Success" means *completed*: a
/// request that failed still counts as a success, and as an exception on top.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum MetricEvent {
    /// A request was admitted.
    Pass,
    /// A request was rejected by a limit.
    Block,
    /// A completed request was classified as a failure.
    Exception,
    /// A request completed (whatever its outcome).
    Success,
    /// Response time, in microseconds. Adding `n` adds `n` µs to the sum and
    /// offers `n` as a new minimum.
    Rt,
    /// A request passed by borrowing quota from a future bucket.
    OccupiedPass,
}

impl MetricEvent {
    /// All events, in declaration order.
    pub const ALL: [MetricEvent; 6] = [
        MetricEvent::Pass,
        MetricEvent::Block,
        MetricEvent::Exception,
        MetricEvent::Success,
        MetricEvent::Rt,
        MetricEvent::OccupiedPass,
    ];
}
