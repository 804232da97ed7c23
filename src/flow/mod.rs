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
pub(crate) mod concurrency;
mod quota;
mod throttle;
mod try_pass;
pub(crate) mod warm_up;

pub use admission::Admission;
pub(crate) use admission::{retry_after_ms, try_admit};
pub(crate) use behaviours::{Behaviours, WarmUpSettings};
pub use throttle::{Pacer, Turn};
pub use try_pass::TryPass;
