//! Which flow behaviours a limiter runs besides the plain window, as one
//! small value the request path checks once.

use std::num::NonZeroU64;
use std::time::Duration;

/// The flow behaviours configured on a limiter, for every key. The default
/// is the plain window: Sentinel's reject behaviour on the QPS grade.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Behaviours {
    /// At most this many requests of a key in flight (Sentinel's thread
    /// grade, exact).
    pub(crate) max_concurrency: Option<NonZeroU64>,
    /// Uniform pacing: passes spaced `interval / limit` apart, a request
    /// waiting at most this long for its turn (Sentinel's rate limiter).
    pub(crate) throttle: Option<Duration>,
    /// Warm-up after idle time (Sentinel's warm-up controller).
    pub(crate) warm_up: Option<WarmUpSettings>,
}

/// The settings of [`Behaviours::warm_up`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WarmUpSettings {
    /// How long sustained load takes to bring a cold key to its limit.
    pub(crate) period_ms: u64,
    /// The limit divided by the cold rate (3 unless set).
    pub(crate) cold_factor: u64,
}
