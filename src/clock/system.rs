//! The default clock: the monotonic counter read on every call, anchored to
//! the UNIX epoch once per process. No thread, no cache.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use super::Clock;

/// The process-wide real clock.
///
/// - **Monotonic.** Readings come from [`quanta`]'s counter (the TSC on
///   x86-64 when it is invariant, the OS monotonic clock otherwise) measured
///   from one anchor, so they never follow the wall clock backwards when NTP
///   or an operator steps it. On top of that, a reading is never behind an
///   earlier reading taken on the same thread (each thread remembers its last
///   reading and never returns less), even if the thread moves to a core
///   whose counter lags.
/// - **Meaningful.** At first use the anchor is pinned to the current
///   [`SystemTime`], so readings are milliseconds (or microseconds) since the
///   UNIX epoch and can be logged or compared with other hosts. Every
///   `SystemClock` and every [`CachedClock`](super::CachedClock) of the
///   process shares that one anchor.
/// - **No hidden work.** Both [`now_millis`](Clock::now_millis) and
///   [`now_micros`](Clock::now_micros) read the counter when called; nothing
///   runs in the background. [`CachedClock`](super::CachedClock) trades an
///   upkeep thread for a cheaper `now_millis`.
///
/// A reading costs about what the bare counter read does, a fraction of
/// `std::time::Instant::now`; the figures are in `docs/performance.md`,
/// "What a clock reading costs".
///
/// A `SystemClock` is `Copy` and holds one reference to the process-wide
/// anchor: 8 bytes on 64-bit targets (`size_of::<SystemClock>()`). Every
/// instance reads the same time.
///
/// # Examples
///
/// ```
/// use tower_sliding_window::clock::{Clock, SystemClock};
///
/// let clock = SystemClock::new();
/// let a = clock.now_millis();
/// let b = clock.now_millis();
/// assert!(b >= a);
/// // Milliseconds since the UNIX epoch: well past 2020.
/// assert!(a > 1_577_836_800_000);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    anchor: &'static Anchor,
}

impl SystemClock {
    /// A handle to the process-wide clock. The first call in a process pins
    /// the anchor (it calibrates the counter, which takes a few
    /// milliseconds); later calls only fetch it. No thread is started.
    pub fn new() -> Self {
        SystemClock {
            anchor: Anchor::get(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now_millis(&self) -> u64 {
        self.anchor.now_millis()
    }

    #[inline]
    fn now_micros(&self) -> u64 {
        self.anchor.now_micros()
    }
}

static ANCHOR: OnceLock<Anchor> = OnceLock::new();

thread_local! {
    /// The latest reading this thread has returned, in nanoseconds since the
    /// anchor. Readings are clamped to it, so a thread never sees time go
    /// back even if it migrates to a core whose counter is slightly behind.
    /// Milliseconds and microseconds are both floors of one nanosecond
    /// figure, so clamping it keeps both monotonic and in agreement.
    static LAST_NANOS: Cell<u64> = const { Cell::new(0) };
}

/// The pairing of a counter reading with the wall clock, taken once per
/// process and shared by [`SystemClock`] and the cached clock.
#[derive(Debug)]
pub(super) struct Anchor {
    clock: quanta::Clock,
    base_raw: u64,
    /// The wall clock at `base_raw`, in whole microseconds since the epoch,
    /// written in nanoseconds (a multiple of 1000): a reading is then one
    /// addition and one division away from either unit, and
    /// `(base + ns) / 1_000_000` is exactly the floor of the microsecond
    /// reading divided by 1000.
    base_epoch_nanos: u64,
}

impl Anchor {
    pub(super) fn get() -> &'static Anchor {
        ANCHOR.get_or_init(|| {
            let clock = quanta::Clock::new();
            let base_raw = clock.raw();
            let base_epoch_micros = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
                // A wall clock before 1970 is misconfigured; start from 0
                // rather than refuse to run. Readings are still monotonic.
                .unwrap_or(0);
            Anchor {
                clock,
                base_raw,
                // Whole microseconds, so that both units floor alike (until
                // the year 2554, when this saturates).
                base_epoch_nanos: base_epoch_micros.saturating_mul(1000),
            }
        })
    }

    /// Nanoseconds since the epoch, read from the counter now, never less
    /// than the last reading returned on this thread (in either unit).
    #[inline]
    fn now_nanos(&self) -> u64 {
        // `delta_as_nanos` returns 0 for a counter behind the anchor, so a
        // reading is never before the anchor either.
        let elapsed = self.clock.delta_as_nanos(self.base_raw, self.clock.raw());
        // `try_with` fails only while this thread's locals are being
        // destroyed; the raw reading is then the best there is.
        let elapsed = LAST_NANOS
            .try_with(|last| {
                let elapsed = elapsed.max(last.get());
                last.set(elapsed);
                elapsed
            })
            .unwrap_or(elapsed);
        self.base_epoch_nanos.saturating_add(elapsed)
    }

    /// Microseconds since the epoch (see [`now_nanos`](Self::now_nanos)).
    #[inline]
    pub(super) fn now_micros(&self) -> u64 {
        self.now_nanos() / 1000
    }

    /// Milliseconds since the epoch: the floor of
    /// [`now_micros`](Self::now_micros) divided by 1000, in one division.
    #[inline]
    pub(super) fn now_millis(&self) -> u64 {
        self.now_nanos() / 1_000_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_and_micros_agree() {
        let clock = SystemClock::new();
        let ms = clock.now_millis();
        let us = clock.now_micros();
        // Both come from the counter: the later micros reading is not behind.
        assert!(us / 1000 >= ms, "micros {us} behind millis {ms}");
    }

    #[test]
    fn never_goes_backwards() {
        let clock = SystemClock::new();
        let mut last_ms = 0;
        let mut last_us = 0;
        for _ in 0..100_000 {
            let ms = clock.now_millis();
            let us = clock.now_micros();
            assert!(ms >= last_ms && us >= last_us);
            last_ms = ms;
            last_us = us;
        }
    }

    #[test]
    fn is_a_copyable_reference() {
        assert_eq!(
            std::mem::size_of::<SystemClock>(),
            std::mem::size_of::<&'static ()>()
        );
        let a = SystemClock::new();
        let b = a;
        assert!(std::ptr::eq(a.anchor, b.anchor));
    }
}
