//! `BreakerState`: what a breaker is doing, as read from outside.

use std::fmt;
use std::time::Duration;

/// The state of one key's circuit breaker, as read by
/// [`StatsHandle::breakers`](crate::StatsHandle::breakers) or
/// [`CircuitBreaker::state`](super::CircuitBreaker::state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BreakerState {
    /// Requests pass; completions are counted.
    Closed,
    /// Every request is refused until the breaker turns half-open.
    Open {
        /// How long until then.
        half_open_in: Duration,
    },
    /// One request (the probe) may go through, and decides: closed again if
    /// it succeeds, open again if it fails. Every other request is refused
    /// meanwhile.
    HalfOpen,
}

impl BreakerState {
    /// The state's name, as in `tracing` events: `closed`, `open` or
    /// `half_open`.
    pub fn name(&self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

impl fmt::Display for BreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
