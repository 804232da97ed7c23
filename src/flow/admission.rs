//! [`Admission`] and the rule that produces it.

use super::decision::{Decision, Pass, Reason, Refusal};
use super::quota::wait_for_quota;
use crate::stat::StatisticNode;

/// The outcome of an admission attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "an admission says whether the request may proceed"]
pub enum Admission {
    /// Admitted and recorded as pass.
    Pass {
        /// Passes in the window, this admission included.
        window_pass: u64,
    },
    /// Rejected: admitting would have taken the window past the limit.
    /// Nothing was recorded as pass.
    Block {
        /// Passes in the window when the decision was made.
        window_pass: u64,
    },
}

impl Admission {
    /// Whether the request was admitted.
    pub fn is_pass(&self) -> bool {
        matches!(self, Admission::Pass { .. })
    }

    /// Passes in the window after the decision.
    pub fn window_pass(&self) -> u64 {
        match *self {
            Admission::Pass { window_pass } | Admission::Block { window_pass } => window_pass,
        }
    }
}

/// The admission rule: `n` more passes fit if the window's pass count plus
/// `n` stays within `limit`.
#[inline]
pub(crate) fn fits(window_pass: u64, n: u64, limit: u64) -> bool {
    window_pass.saturating_add(n) <= limit
}

/// Turns the outcome of `stat`'s one-step "add if" into an [`Admission`].
#[inline]
pub(crate) fn admission(outcome: Result<u64, u64>, n: u64) -> Admission {
    match outcome {
        Ok(before) => Admission::Pass {
            window_pass: before + n,
        },
        Err(window_pass) => Admission::Block { window_pass },
    }
}

/// Admits `n` on `node` at `now` if the second window's pass count plus `n`
/// stays within `limit`, recording the passes in the same atomic step; a
/// rejection records `n` blocks. The hot path is one cached-sum check and
/// one compare-and-swap.
#[inline]
pub(crate) fn admit(node: &StatisticNode, now: u64, n: u64, limit: u64) -> Admission {
    let admission = try_admit(node, now, n, limit);
    if let Admission::Block { .. } = admission {
        node.record_block_at(now, n);
    }
    admission
}

/// Like [`admit`], but a rejection records nothing: the caller records the
/// block once it has decided (a prioritized request may borrow instead).
#[inline]
pub(crate) fn try_admit(node: &StatisticNode, now: u64, n: u64, limit: u64) -> Admission {
    admission(
        node.try_add_pass_at(now, n, move |window_pass| fits(window_pass, n, limit)),
        n,
    )
}

/// Milliseconds from `now` until `n` more passes fit under `limit` on
/// `node`'s second window if nothing else passes; `None` if they never can.
/// On a strict node the bucket that has just left the window counts too,
/// until one bucket length after it would have left a plain window.
/// Allocation-free.
pub(crate) fn retry_after_ms(node: &StatisticNode, now: u64, n: u64, limit: u64) -> Option<u64> {
    let (buckets, span_ms) = node.admission_passes(now);
    wait_for_quota(buckets, now, span_ms, n, limit)
}

/// Milliseconds until `n` more passes fit under `limit` on `node` at `at`,
/// on the clock: a wait computed at a reading moved forward by `behind`
/// (a clock that stepped back, see `store::effective_now`) is that much
/// longer.
pub(crate) fn retry_on_clock(
    node: &StatisticNode,
    at: u64,
    behind: u64,
    n: u64,
    limit: u64,
) -> Option<u64> {
    retry_after_ms(node, at, n, limit).map(|ms| {
        if ms == 0 {
            0
        } else {
            ms.saturating_add(behind)
        }
    })
}

/// The `reset` of a pass that left `window_pass` passes in the window:
/// until the window could take everything left of its limit and one more.
pub(crate) fn pass_reset_ms(
    node: &StatisticNode,
    at: u64,
    behind: u64,
    limit: u64,
    window_pass: u64,
) -> u64 {
    let more = limit.saturating_sub(window_pass).saturating_add(1);
    retry_on_clock(node, at, behind, more, limit).unwrap_or(0)
}

/// The window's answer to one request at `at` (moved forward by `behind`
/// from the clock's reading): a pass, recorded in the same atomic step, or
/// a refusal (nothing recorded) with the time until one more fits (the
/// window's length if none ever can). `overflow` says, only when it
/// refuses, whether the key is the overflow entry.
#[inline]
pub(crate) fn window(
    node: &StatisticNode,
    (at, behind): (u64, u64),
    limit: u64,
    interval_ms: u64,
    overflow: impl FnOnce() -> bool,
) -> Decision<Pass> {
    match try_admit(node, at, 1, limit) {
        Admission::Pass { window_pass } => Decision::Pass(Pass {
            limit,
            window_pass: Some(window_pass),
            reset_ms: None,
        }),
        Admission::Block { window_pass } => Decision::Block(window_refusal(
            node,
            (at, behind),
            limit,
            interval_ms,
            window_pass,
            overflow(),
        )),
    }
}

#[inline(never)]
fn window_refusal(
    node: &StatisticNode,
    (at, behind): (u64, u64),
    limit: u64,
    interval_ms: u64,
    window_pass: u64,
    overflow: bool,
) -> Refusal {
    Refusal {
        reason: Reason::of_window(overflow),
        retry_after_ms: retry_on_clock(node, at, behind, 1, limit).unwrap_or(interval_ms),
        limit,
        window_pass: Some(window_pass),
    }
}

/// Under `prioritized`, for a request the window refused at `at`: the wait
/// in milliseconds for a pass borrowed from a later bucket (Sentinel's
/// occupy) if one fits within the occupy timeout, taken from the key's
/// `limit` per `interval_ms`; `None` if none does. Nothing is recorded:
/// see [`occupy`].
#[cfg(feature = "tokio")]
pub(crate) fn occupy_wait_ms(
    node: &StatisticNode,
    at: u64,
    limit: u64,
    interval_ms: u64,
) -> Option<u64> {
    // `try_occupy_next` takes its threshold per second.
    let per_second = limit as f64 * 1000.0 / interval_ms as f64;
    node.try_occupy_next(at, 1, per_second)
}

/// Records the pass a request borrowed at `at` from the bucket `wait_ms`
/// later: it waits for that bucket, and the pass is in it already.
#[cfg(feature = "tokio")]
pub(crate) fn occupy(node: &StatisticNode, at: u64, wait_ms: u64) {
    node.add_waiting_request(at.saturating_add(wait_ms), 1);
    node.add_occupied_pass(1);
}
