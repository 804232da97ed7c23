//! The pacing controller's answer as a [`Decision`]: a [`Pacer`]'s
//! [`Turn`] for one request, with the conversions between the limit, the
//! layer's clocks and the pacer's nanoseconds.

use std::time::Duration;

use super::decision::{Decision, Pass, Reason, Refusal};
use super::throttle::{Pacer, Turn};

/// A turn taken that is not due yet: the request waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PendingTurn {
    /// How long until the turn.
    pub(crate) wait: Duration,
    /// The turn and the spacing of turns, in nanoseconds (to give the turn
    /// back if it goes unused).
    pub(crate) at_ns: u64,
    pub(crate) cost_ns: u64,
}

impl PendingTurn {
    /// The refusal of a request that cannot wait for this turn (the
    /// runtime has no timer), under `limit`: retry when the turn is due.
    pub(crate) fn refusal(&self, limit: u64) -> Refusal {
        let ms = u64::try_from(self.wait.as_millis()).unwrap_or(u64::MAX);
        Refusal::new(Reason::Throttle, ms.max(1), limit)
    }
}

/// Takes the next turn of `pacer` for a request at `now_us` (microseconds
/// on the layer's clock) on a key allowed `limit` per `interval_ms`: a
/// pass if the turn is due now (the turn is then used), a wait for a turn
/// at most `max_wait` away (its waiter uses or gives it back), or a refusal
/// (a limit of 0 never gets a turn, nor does a key without a pacer: retry
/// after a window).
pub(crate) fn pace(
    pacer: Option<&Pacer>,
    now_us: u64,
    limit: u64,
    interval_ms: u64,
    max_wait: Duration,
) -> Decision<Pass, PendingTurn> {
    let (Some(pacer), Some(cost_ns)) = (pacer, Pacer::cost_ns(interval_ms, limit)) else {
        return Decision::Block(Refusal::new(Reason::Throttle, interval_ms, limit));
    };
    match pacer.reserve(now_us.saturating_mul(1_000), cost_ns, max_wait) {
        Turn::Wait { wait, at_ns } if wait.is_zero() => {
            pacer.used(at_ns);
            Decision::Pass(Pass {
                limit,
                window_pass: None,
                // The next turn, in whole milliseconds.
                reset_ms: Some(cost_ns.div_ceil(1_000_000)),
            })
        }
        Turn::Wait { wait, at_ns } => Decision::Wait(PendingTurn {
            wait,
            at_ns,
            cost_ns,
        }),
        Turn::Refuse { retry_after } => {
            let ms = u64::try_from(retry_after.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
            Decision::Block(Refusal::new(Reason::Throttle, ms.max(1), limit))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_are_passes_waits_then_refusals_in_milliseconds() {
        let pacer = Pacer::new();
        let max_wait = Duration::from_millis(600);
        // 4 per second: a turn every 250 ms.
        let now_us = 10_000_000;
        assert!(matches!(
            pace(Some(&pacer), now_us, 4, 1000, max_wait),
            Decision::Pass(Pass {
                reset_ms: Some(250),
                ..
            })
        ));
        let Decision::Wait(turn) = pace(Some(&pacer), now_us, 4, 1000, max_wait) else {
            panic!("the second turn is 250 ms away");
        };
        assert_eq!(turn.wait, Duration::from_millis(250));
        assert_eq!(turn.refusal(4).retry_after_ms, 250);
        let _ = pace(Some(&pacer), now_us, 4, 1000, max_wait);
        // The fourth turn is 750 ms away: 150 ms past the longest wait.
        let Decision::Block(refusal) = pace(Some(&pacer), now_us, 4, 1000, max_wait) else {
            panic!("the fourth turn is too far away");
        };
        assert_eq!(refusal.reason, Reason::Throttle);
        assert_eq!(refusal.retry_after_ms, 150);
    }

    #[test]
    fn a_limit_of_zero_is_refused_for_a_window() {
        let Decision::Block(refusal) = pace(Some(&Pacer::new()), 0, 0, 2000, Duration::ZERO) else {
            panic!("no turn under a limit of 0");
        };
        assert_eq!(refusal.retry_after_ms, 2000);
    }
}
