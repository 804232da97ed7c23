//! The concurrency controller: Sentinel's thread grade, exact.
//!
//! A request takes a place in its key's concurrency gauge with one
//! compare-and-swap that fails when `max` are in flight
//! ([`StatisticNode::try_increase_concurrency`]), so the gauge never reads
//! `max + 1`, however many callers race. The place is released when the
//! request completes, is cancelled or panics (the layer's in-flight guard).
//! A request over the limit is refused at once: it does not wait for a place.

use std::num::NonZeroU64;

use super::decision::{Decision, Reason, Refusal};
use crate::stat::StatisticNode;

/// `Retry-After` of a request refused for concurrency: in-flight requests
/// end at no predictable time, so the shortest honest answer, one second.
pub(crate) const RETRY_AFTER_MS: u64 = 1000;

/// Takes a place for one more request on `node` if fewer than `max` are in
/// flight; otherwise refuses it (nothing recorded), `limit` being the
/// key's limit for the RateLimit fields of the answer.
#[inline]
pub(crate) fn try_enter(node: &StatisticNode, max: NonZeroU64, limit: u64) -> Decision {
    if node.try_increase_concurrency(max.get()) {
        Decision::Pass(())
    } else {
        Decision::Block(Refusal::new(Reason::Concurrency, RETRY_AFTER_MS, limit))
    }
}
