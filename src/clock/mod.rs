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
/// statistics stay consistent if they do (a reading behind a bucket is
/// recorded in that bucket's newer window), but windows only slide forward.
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
