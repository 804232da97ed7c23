//! The RateLimit fields of a response, from a key's entry and a decision.

use std::sync::Arc;

use crate::response::{PolicyName, Quota, ResponseConfig};
use crate::store::Entry;

/// The RateLimit fields for `entry` after a decision that left
/// `window_pass` passes in its window, with more quota in `reset_ms`.
pub(crate) fn quota(
    entry: &Entry,
    response: &ResponseConfig,
    limit: u64,
    window_pass: u64,
    reset_ms: u64,
) -> Quota {
    Quota {
        policy: PolicyName {
            base: Arc::clone(&response.policy_name),
            tag: entry.policy_tag(),
            overflow: entry.is_overflow(),
        },
        limit,
        window_ms: entry.node.second_window().interval_ms(),
        remaining: limit.saturating_sub(window_pass),
        reset_ms,
    }
}
