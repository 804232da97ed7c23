//! [`Decision`]: the one answer every controller gives, and [`Reason`]: why
//! a request was refused.
//!
//! Each controller the layer runs (the circuit breakers, the concurrency
//! gauge, the window, pacing, the shared store) answers a request with a
//! `Decision`: pass, wait, or block with a [`Refusal`] that carries the
//! reason and the retry time. Warm-up moves the limit the window decides
//! against and never answers on its own: a request refused under it is a
//! window refusal. The layer asks the controllers in order, stops at the
//! first answer that is not a pass, and turns a block into its response in
//! one place, so a new refusal reason is a new [`Reason`] variant and the
//! controller that gives it.

use std::convert::Infallible;

/// Why the layer refused a request, as its response builder sees it in
/// [`Rejection::reason`](crate::response::Rejection::reason).
///
/// More reasons may be added in minor releases: match with a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The key's sliding window holds its limit (under warm-up, the limit
    /// the key has warmed up to so far).
    Window,
    /// The key has as many requests in flight as
    /// [`max_concurrency`](crate::SlidingWindowLayer::max_concurrency)
    /// allows.
    Concurrency,
    /// A circuit breaker of the key is open, or half-open with its probe
    /// out.
    Breaker,
    /// Under [`throttle`](crate::SlidingWindowLayer::throttle): the key's
    /// next turn is further away than the longest wait (or its limit is 0,
    /// or the runtime cannot wait for the turn).
    Throttle,
    /// The shared store refused the key (feature `redis`), or the layer
    /// refused in its stead while Redis could not answer, under
    /// `StoreFailure::Deny`. (Under `StoreFailure::Local` the layer's own
    /// window decides then, and its refusals are [`Window`](Self::Window)
    /// refusals.)
    Store,
    /// The key found no room in the key table (see
    /// [`max_keys`](crate::SlidingWindowLayer::max_keys)) and the overflow
    /// entry it shares with the other such keys holds its limit.
    Overflow,
    /// The layer's [`system`](crate::SlidingWindowLayer::system) rule
    /// refused the request: the whole layer is at a limit of its rule, or
    /// the CPU is busy and more requests are in flight than the service
    /// can hold (see [`system`](crate::system)). Answered with
    /// `503 Service Unavailable`.
    System,
}

impl Reason {
    /// The reason a window refused: [`Overflow`](Reason::Overflow) when
    /// the key is counted on the overflow entry (the key table was full),
    /// else [`Window`](Reason::Window).
    #[inline]
    pub(crate) fn of_window(overflow: bool) -> Reason {
        if overflow {
            Reason::Overflow
        } else {
            Reason::Window
        }
    }

    /// A short lowercase name (`"window"`, `"breaker"`, ..), as written in
    /// the layer's `tracing` events.
    ///
    /// ```
    /// use tower_sliding_window::flow::Reason;
    ///
    /// assert_eq!(Reason::Breaker.as_str(), "breaker");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::Window => "window",
            Reason::Concurrency => "concurrency",
            Reason::Breaker => "breaker",
            Reason::Throttle => "throttle",
            Reason::Store => "store",
            Reason::Overflow => "overflow",
            Reason::System => "system",
        }
    }
}

/// A controller's answer to one request.
///
/// `P` is what a pass hands on (a probe slot, a concurrency place, the
/// figures of the RateLimit fields); `W` what a wait hands on (a turn, a
/// pending answer). A controller that never makes a request wait leaves
/// `W` as [`Infallible`].
#[derive(Debug)]
#[must_use = "a decision says whether the request may proceed"]
pub(crate) enum Decision<P = (), W = Infallible> {
    /// The request may go on.
    Pass(P),
    /// The request may go on once the wait is over. (Without the `tokio`
    /// feature there is no timer, and no controller answers with a wait.)
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    Wait(W),
    /// The request is refused; nothing the controller took is kept.
    Block(Refusal),
}

/// A refused request: why, and what its answer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) reason: Reason,
    /// Milliseconds until the request could pass if nothing else changes.
    pub(crate) retry_after_ms: u64,
    /// The limit the request was refused against (for the RateLimit
    /// fields and [`Rejection::limit`](crate::response::Rejection::limit)).
    pub(crate) limit: u64,
    /// Passes in the key's window when it was refused, if the controller
    /// knows them (the window does, the store says); `None`: read from the
    /// key's window when the block is recorded.
    pub(crate) window_pass: Option<u64>,
}

impl Refusal {
    /// A refusal for `reason` against `limit`, whose window's passes are
    /// read when it is recorded.
    #[inline]
    pub(crate) fn new(reason: Reason, retry_after_ms: u64, limit: u64) -> Refusal {
        Refusal {
            reason,
            retry_after_ms,
            limit,
            window_pass: None,
        }
    }
}

impl<P, W> Decision<P, W> {
    /// The same decision with `f` applied to what a pass hands on.
    #[inline]
    pub(crate) fn map<Q>(self, f: impl FnOnce(P) -> Q) -> Decision<Q, W> {
        match self {
            Decision::Pass(pass) => Decision::Pass(f(pass)),
            Decision::Wait(wait) => Decision::Wait(wait),
            Decision::Block(refusal) => Decision::Block(refusal),
        }
    }
}

impl<P> Decision<P> {
    /// The next controller's decision, asked only if this one passed.
    #[inline]
    pub(crate) fn and_then<Q, W>(self, next: impl FnOnce(P) -> Decision<Q, W>) -> Decision<Q, W> {
        match self {
            Decision::Pass(pass) => next(pass),
            Decision::Block(refusal) => Decision::Block(refusal),
            Decision::Wait(never) => match never {},
        }
    }
}

/// A pass through the admission controllers (window, pacing, store): the
/// figures its RateLimit fields give, when the layer sends them on passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pass {
    /// The limit the request passed under.
    pub(crate) limit: u64,
    /// Passes in the window, this one included, if the controller knows
    /// them; `None`: read from the window when the fields are written.
    pub(crate) window_pass: Option<u64>,
    /// Milliseconds until more quota, if the controller knows it; `None`:
    /// until the window could take the rest of its limit and one more
    /// ([`pass_reset_ms`](super::pass_reset_ms)).
    pub(crate) reset_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn and_then_asks_the_next_controller_only_after_a_pass() {
        let mut asked = 0;
        let passed: Decision<u64> = Decision::Pass(7);
        let next = passed.and_then(|limit| {
            asked += 1;
            Decision::<u64, ()>::Pass(limit + 1)
        });
        assert!(matches!(next, Decision::Pass(8)));
        let refused: Decision<u64> = Decision::Block(Refusal::new(Reason::Breaker, 5, 7));
        let next = refused.and_then(|limit| {
            asked += 1;
            Decision::<u64, ()>::Pass(limit)
        });
        assert!(matches!(
            next,
            Decision::Block(Refusal {
                reason: Reason::Breaker,
                retry_after_ms: 5,
                ..
            })
        ));
        assert_eq!(asked, 1);
    }

    #[test]
    fn every_reason_has_a_distinct_name() {
        let all = [
            Reason::Window,
            Reason::Concurrency,
            Reason::Breaker,
            Reason::Throttle,
            Reason::Store,
            Reason::Overflow,
            Reason::System,
        ];
        let names: std::collections::HashSet<_> = all.iter().map(Reason::as_str).collect();
        assert_eq!(names.len(), all.len());
    }
}
