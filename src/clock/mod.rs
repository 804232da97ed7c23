//! Time sources.
//!
//! Everything in this crate that needs the time asks a [`Clock`]. Windows are
//! cut in whole milliseconds ([`Clock::now_millis`]); response times are
//! measured in microseconds ([`Clock::now_micros`]).
//!
//! - [`SystemClock`] is the default: monotonic, anchored to the UNIX epoch,
//!   and cheap enough to read on every request (see its docs for the figures).
//!   It reads the counter on every call and starts no thread.
//! - [`CachedClock`] is the same time with a cheaper `now_millis`: one load of
//!   a value that an upkeep thread refreshes. Opt-in: the thread runs only
//!   while a handle to the clock exists.
//! - [`ManualClock`] only moves when told to. Tests, simulations and replays
//!   use it to make every window edge deterministic.
//!
//! Any other type can be a clock by implementing the trait:
//!
//! ```
//! use tower_sliding_window::clock::Clock;
//!
//! /// A clock frozen at one instant.
//! struct Frozen(u64);
//!
//! impl Clock for Frozen {
//!     fn now_millis(&self) -> u64 {
//!         self.0
//!     }
//! }
//!
//! assert_eq!(Frozen(1_500).now_micros(), 1_500_000);
//! ```

mod cached;
mod manual;
mod shared;
mod system;

pub use cached::CachedClock;
pub use manual::ManualClock;
pub(crate) use shared::SharedClock;
pub use system::SystemClock;

use std::sync::Arc;

/// A source of the current time.
///
/// Implementations must be cheap to call and should never go backwards; the
/// statistics stay consistent if they do, and a step is paid for within one
/// window (see [Steps](Clock#steps)).
///
/// # Steps
///
/// Each key's statistics run on the clock's readings, never behind the
/// newest bucket they have opened:
///
/// - A reading behind that bucket by at most one window (a thread that read
///   the clock a little before another, a small step back) is recorded in
///   that bucket, and the key's windows hold still until the clock catches
///   up: at most one window.
/// - A reading behind it by more than a window (the clock stepped back, or
///   one reading ran far ahead and the clock is sane again) makes the key
///   take the difference as a skew: from then on its windows slide at the
///   clock's pace, that much ahead of it. The passes recorded before the
///   step still count, for one window at most, so a key is never frozen or
///   held in the table for longer than one window after the first request
///   that sees the step.
/// - A step forward slides every window forward at once, as time passing
///   would: the passes of the last window are forgotten. The cost of a
///   step, either way, is at most one extra window of passes.
///
/// Under [`throttle`](crate::SlidingWindowLayer::throttle), a key's turns are
/// spaced on the clock's readings too: a turn more than the throttle's
/// `max_wait` ahead of the clock can only come from a step back, and is
/// forgotten once no request waits for a turn (see
/// [`Pacer`](crate::flow::Pacer)).
///
/// Readings are clamped at 2^62 ms (146 million years): a key written at
/// the clamp stays there.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since an arbitrary but fixed origin. Windows and buckets
    /// are cut from this value.
    fn now_millis(&self) -> u64;

    /// Microseconds since the same origin as [`now_millis`](Clock::now_millis).
    /// Response times are measured with this value.
    ///
    /// The default multiplies [`now_millis`](Clock::now_millis) by 1000, which
    /// is exact for clocks that only move in whole milliseconds.
    fn now_micros(&self) -> u64 {
        self.now_millis().saturating_mul(1000)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now_millis(&self) -> u64 {
        (**self).now_millis()
    }

    #[inline]
    fn now_micros(&self) -> u64 {
        (**self).now_micros()
    }
}

impl<C: Clock + ?Sized> Clock for Box<C> {
    #[inline]
    fn now_millis(&self) -> u64 {
        (**self).now_millis()
    }

    #[inline]
    fn now_micros(&self) -> u64 {
        (**self).now_micros()
    }
}
