//! [`Admission`] and the rule that produces it.

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
