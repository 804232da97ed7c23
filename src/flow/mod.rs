//! The admission decision: the windowed pass count against a limit.
//!
//! [`stat`](crate::stat) records and offers one primitive to the crate: "add
//! `n` passes to the newest bucket if a decision about the window's pass
//! count says yes, in one compare-and-swap". This module owns the decision:
//! the rule `window_pass + n <= limit`, the [`Admission`] it yields, and how
//! long a rejected caller should wait ([`TryPass::time_until_pass`]).
//!
//! With any number of concurrent callers and a frozen clock, exactly `limit`
//! are admitted per window, never more and never fewer. "Window" means the
//! buckets the ring evaluates: the count is exact in every bucket-aligned
//! window, while an interval that is not aligned to bucket starts can see up
//! to twice the limit under bursts (the end of one window and the start of
//! the next).
//!
//! Every controller (the window, the concurrency gauge, pacing, the circuit
//! breakers, the shared store) answers a request with one decision type:
//! pass, wait, or block with a [`Reason`] and a retry time (see
//! `decision.rs`). Warm-up moves the limit the window decides against.
//!
//! The circuit breakers ([`breaker`], also at `tower_sliding_window::breaker`)
//! are decisions of the same kind: they read statistics the layer feeds and
//! know nothing of HTTP.
//!
//! ```
//! use tower_sliding_window::clock::ManualClock;
//! use tower_sliding_window::flow::{Admission, TryPass};
//! use tower_sliding_window::stat::ArrayMetric;
//!
//! let clock = ManualClock::new(0);
//! let metric = ArrayMetric::with_clock(10, 1000, clock.clone())?;
//! assert_eq!(metric.try_pass(1, 2), Admission::Pass { window_pass: 1 });
//! assert_eq!(metric.try_pass(1, 2), Admission::Pass { window_pass: 2 });
//! assert_eq!(metric.try_pass(1, 2), Admission::Block { window_pass: 2 });
//! # Ok::<(), tower_sliding_window::ConfigError>(())
//! ```

mod admission;
mod behaviours;
pub mod breaker;
mod compact_windows;
pub(crate) mod concurrency;
mod decision;
#[cfg(feature = "tokio")]
mod pacing;
mod quota;
mod throttle;
mod try_pass;
pub(crate) mod warm_up;
mod windows;

pub use admission::Admission;
#[cfg(feature = "tokio")]
pub(crate) use admission::{occupy, occupy_wait_ms};
pub(crate) use admission::{pass_reset_ms, window};
pub(crate) use behaviours::{Behaviours, WarmUpSettings};
pub(crate) use compact_windows::{all_compact_windows, anchor, compact_retry_ms, CompactFurther};
pub use decision::Reason;
pub(crate) use decision::{Decision, Pass, Refusal};
#[cfg(feature = "tokio")]
pub(crate) use pacing::pace;
pub(crate) use quota::wait_for_quota;
pub use throttle::{Pacer, Turn};
pub use try_pass::TryPass;
pub(crate) use windows::{all_windows, window_retry_ms};
