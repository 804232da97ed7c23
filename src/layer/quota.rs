//! From a key's state and a decision to what the response says: the
//! RateLimit fields of a pass, and the one place a refusal is recorded and
//! answered, for both key tiers (a full key's [`Entry`], a compact key's
//! window).

use std::sync::Arc;

use bytes::Bytes;
use http::Response;

use crate::flow::Refusal;
use crate::response::{rejection_response, PolicyName, Quota, ResponseConfig};
use crate::stat::{CompactShape, CompactWindow};
use crate::store::Entry;

/// What the answer to a decision reads from the key it was made on.
pub(crate) trait Counted {
    /// Records one refused request at `at`.
    fn record_block(&self, at: u64);
    /// Passes in the key's window at `at`.
    fn window_pass(&self, at: u64) -> u64;
    /// The key's own policy's tag (`None` on the default limit), and
    /// whether the key is counted on the overflow entry.
    fn policy(&self) -> (Option<u32>, bool);
    /// Length of the key's window, in milliseconds.
    fn window_ms(&self) -> u64;
}

impl Counted for Entry {
    #[inline]
    fn record_block(&self, at: u64) {
        self.node.record_block_at(at, 1);
    }

    fn window_pass(&self, at: u64) -> u64 {
        self.node.window_counts(at).pass
    }

    #[inline]
    fn policy(&self) -> (Option<u32>, bool) {
        (self.policy_tag(), self.is_overflow())
    }

    #[inline]
    fn window_ms(&self) -> u64 {
        self.node.second_window().interval_ms()
    }
}

/// A compact key's window, as a decision on it is answered.
pub(crate) struct CompactCounted<'a> {
    pub(crate) window: &'a CompactWindow,
    pub(crate) shape: &'a CompactShape,
    pub(crate) tag: Option<u32>,
    pub(crate) overflow: bool,
}

impl Counted for CompactCounted<'_> {
    #[inline]
    fn record_block(&self, at: u64) {
        self.window.record_block(self.shape, at);
    }

    fn window_pass(&self, at: u64) -> u64 {
        self.window.window_counts(self.shape, at).0
    }

    #[inline]
    fn policy(&self) -> (Option<u32>, bool) {
        (self.tag, self.overflow)
    }

    #[inline]
    fn window_ms(&self) -> u64 {
        self.shape.interval_ms
    }
}

/// The RateLimit fields for `key` after a decision that left `window_pass`
/// passes in its window, with more quota in `reset_ms`.
pub(crate) fn quota(
    key: &impl Counted,
    response: &ResponseConfig,
    limit: u64,
    window_pass: u64,
    reset_ms: u64,
) -> Quota {
    let (tag, overflow) = key.policy();
    Quota {
        policy: PolicyName {
            base: Arc::clone(&response.policy_name),
            tag,
            overflow,
        },
        limit,
        window_ms: key.window_ms(),
        remaining: limit.saturating_sub(window_pass),
        reset_ms,
    }
}

/// Records a refused request of `key` as one block at `at` and answers it.
/// Every refusal of the layer, whatever controller gave it, whether it was
/// decided in `call` or after a wait, and whatever the key's tier, goes
/// through here: its block is recorded once, and its response is built from
/// its reason (see [`response`](crate::response)). The debug event names
/// the policy and the reason, never the key.
#[inline(never)]
pub(crate) fn refuse(
    key: &impl Counted,
    at: u64,
    refusal: Refusal,
    response: &ResponseConfig,
) -> Response<Bytes> {
    key.record_block(at);
    let window_pass = refusal.window_pass.unwrap_or_else(|| key.window_pass(at));
    let Refusal {
        reason,
        retry_after_ms,
        limit,
        ..
    } = refusal;
    let quota = quota(key, response, limit, window_pass, retry_after_ms);
    tracing::debug!(
        policy = %quota.policy,
        reason = reason.as_str(),
        limit,
        retry_after_ms,
        "request rejected"
    );
    rejection_response(response, reason, &quota, retry_after_ms)
}
