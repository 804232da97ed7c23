//! From a key's state and a decision to what the response says: the
//! RateLimit fields of a pass, and the one place a refusal is recorded and
//! answered, for both key tiers (a full key's [`Entry`], a compact key's
//! window).

use std::sync::Arc;

use bytes::Bytes;
use http::Response;

use crate::flow::Refusal;
use crate::response::{rejection_response, PolicyItem, PolicyName, Quota, ResponseConfig};
use crate::stat::{CompactShape, CompactWindow, ExtraWindows};
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
    /// Adds the key's further windows (`limit_per`) to `quota`, made for
    /// its first window at `at` (`behind` later on the clock); nothing for
    /// a key without them.
    #[inline]
    fn further_windows(&self, _quota: &mut Quota, _at: u64, _behind: u64) {}
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

    fn further_windows(&self, quota: &mut Quota, at: u64, behind: u64) {
        if let Some(windows) = self.windows() {
            several_windows(self, windows, quota, at, behind);
        }
    }
}

/// The RateLimit fields of a key with further windows: every window in
/// `RateLimit-Policy`, and the tightest (the least quota left; on a tie,
/// the longest until more) in `RateLimit` and in the fields the rejection
/// builder reads. Each window's reset is the time until it could take the
/// rest of its limit and one more (for a full window: until one more
/// fits), as for the first window of a key.
#[cold]
#[inline(never)]
fn several_windows(entry: &Entry, windows: &ExtraWindows, quota: &mut Quota, at: u64, behind: u64) {
    let first_pass = quota.limit.saturating_sub(quota.remaining);
    let first_reset = crate::flow::pass_reset_ms(&entry.node, at, behind, quota.limit, first_pass);
    let further = windows.iter().map(|window| {
        let limit = window.limit();
        let interval_ms = window.interval_ms();
        let remaining = limit.saturating_sub(window.pass(at));
        let reset = crate::flow::window_retry_ms(window, at, behind, remaining.saturating_add(1));
        (interval_ms, limit, remaining, reset)
    });
    tightest(quota, first_reset, windows.len(), further);
}

/// Lists every window in `quota` (made for the first window, whose reset
/// is `first_reset`) and the further ones, `(interval_ms, limit,
/// remaining, reset)` each, in `RateLimit-Policy`, and puts the tightest in
/// `RateLimit`: the least quota left, the longest until more on a tie.
fn tightest(
    quota: &mut Quota,
    first_reset: u64,
    count: usize,
    windows: impl Iterator<Item = (u64, u64, u64, u64)>,
) {
    let mut items = Vec::with_capacity(count + 1);
    items.push(PolicyItem {
        window: None,
        limit: quota.limit,
        window_ms: quota.window_ms,
    });
    // (remaining, reset, window, limit, window_ms) of the tightest so far.
    let mut tightest = (
        quota.remaining,
        first_reset,
        None,
        quota.limit,
        quota.window_ms,
    );
    for (interval_ms, limit, remaining, reset) in windows {
        items.push(PolicyItem {
            window: Some(interval_ms),
            limit,
            window_ms: interval_ms,
        });
        if (remaining, std::cmp::Reverse(reset)) < (tightest.0, std::cmp::Reverse(tightest.1)) {
            tightest = (remaining, reset, Some(interval_ms), limit, interval_ms);
        }
    }
    let (remaining, reset_ms, window, limit, window_ms) = tightest;
    quota.remaining = remaining;
    quota.reset_ms = reset_ms;
    quota.policy.window = window;
    quota.limit = limit;
    quota.window_ms = window_ms;
    quota.policies = Some(items.into_boxed_slice());
}

/// A compact key's window, as a decision on it is answered.
pub(crate) struct CompactCounted<'a> {
    pub(crate) window: &'a CompactWindow,
    pub(crate) shape: &'a CompactShape,
    pub(crate) tag: Option<u32>,
    pub(crate) overflow: bool,
    /// The key's further windows, when the layer has them.
    pub(crate) further: Option<CompactSeveral<'a>>,
}

/// A compact key's further windows (`limit_per`) with their shapes and the
/// key's limits in them.
pub(crate) struct CompactSeveral<'a> {
    pub(crate) windows: &'a [CompactWindow],
    pub(crate) shapes: &'a [CompactShape],
    pub(crate) limits: &'a [u64],
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

    fn further_windows(&self, quota: &mut Quota, at: u64, behind: u64) {
        if let Some(further) = &self.further {
            several_compact_windows(self, further, quota, at, behind);
        }
    }
}

/// [`several_windows`] for a compact key: the same fields from its compact
/// windows.
#[cold]
#[inline(never)]
fn several_compact_windows(
    key: &CompactCounted<'_>,
    further: &CompactSeveral<'_>,
    quota: &mut Quota,
    at: u64,
    behind: u64,
) {
    let first_pass = quota.limit.saturating_sub(quota.remaining);
    let first_reset = key
        .window
        .pass_reset_ms(key.shape, at, behind, quota.limit, first_pass);
    let windows = (0..further.windows.len()).map(|i| {
        let window = crate::flow::CompactFurther {
            window: &further.windows[i],
            shape: &further.shapes[i],
            limit: further.limits[i],
        };
        let remaining = window
            .limit
            .saturating_sub(window.window.window_counts(window.shape, at).0);
        let reset = crate::flow::compact_retry_ms(window, at, behind, remaining.saturating_add(1));
        (window.shape.interval_ms, window.limit, remaining, reset)
    });
    tightest(quota, first_reset, further.windows.len(), windows);
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
            window: None,
        },
        limit,
        window_ms: key.window_ms(),
        remaining: limit.saturating_sub(window_pass),
        reset_ms,
        policies: None,
    }
}

/// Records a refused request of `key` as one block at `at` and answers it.
/// Every refusal of the layer, whatever controller gave it, whether it was
/// decided in `call` or after a wait, and whatever the key's tier, goes
/// through here: its block is recorded once, and its response is built from
/// its reason (see [`response`](crate::response)). The debug event names
/// the policy and the reason, never the key. The caller, which still has
/// the request, records its key in the layer's top-blocked summary
/// (`Registry::blocked`).
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
    let mut quota = quota(key, response, limit, window_pass, retry_after_ms);
    key.further_windows(&mut quota, at, 0);
    tracing::debug!(
        policy = %quota.policy,
        reason = reason.as_str(),
        limit,
        retry_after_ms,
        "request rejected"
    );
    rejection_response(response, reason, &quota, retry_after_ms)
}
