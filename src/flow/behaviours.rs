//! Which flow behaviours a limiter runs besides the plain window, as one
//! small value the request path checks once.

use std::num::NonZeroU64;

/// The flow behaviours configured on a limiter, for every key. The default
/// is the plain window: Sentinel's reject behaviour on the QPS grade.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Behaviours {
    /// At most this many requests of a key in flight (Sentinel's thread
    /// grade, exact).
    pub(crate) max_concurrency: Option<NonZeroU64>,
}
