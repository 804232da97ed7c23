//! From a key's entry and a decision to what the response says: the
//! RateLimit fields of a pass, and the one place a refusal is recorded and
//! answered.

use std::sync::Arc;

use bytes::Bytes;
use http::Response;

use crate::flow::Refusal;
use crate::response::{rejection_response, PolicyName, Quota, ResponseConfig};
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

/// Records a refused request of `entry` as one block at `at` and answers
/// it. Every refusal of the layer, whatever controller gave it and whether
/// it was decided in `call` or after a wait, goes through here: its block
/// is recorded once, and its response is built from its reason (see
/// [`response`](crate::response)). The debug event names the policy and
/// the reason, never the key. The caller, which still has the request,
/// records its key in the layer's top-blocked summary
/// (`Registry::blocked`), as both callers here do.
#[inline(never)]
pub(crate) fn refuse(
    entry: &Entry,
    at: u64,
    refusal: Refusal,
    response: &ResponseConfig,
) -> Response<Bytes> {
    entry.node.record_block_at(at, 1);
    let window_pass = refusal
        .window_pass
        .unwrap_or_else(|| entry.node.window_counts(at).pass);
    let Refusal {
        reason,
        retry_after_ms,
        limit,
        ..
    } = refusal;
    let quota = quota(entry, response, limit, window_pass, retry_after_ms);
    tracing::debug!(
        policy = %quota.policy,
        reason = reason.as_str(),
        limit,
        retry_after_ms,
        "request rejected"
    );
    rejection_response(response, reason, &quota, retry_after_ms)
}
