use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::Clock;
use crate::sync::process::{fence, AtomicU64};

/// A clock that moves only when told to.
///
/// Clones share one time: hand a clone to the layer or metric under test and
/// keep one to drive it. The time is kept as whole milliseconds plus the
/// microseconds within the millisecond, so [`set`](ManualClock::set) reads
/// back exactly for every `u64` (up to `u64::MAX` ms) and
/// [`advance`](ManualClock::advance) by less than a millisecond is not lost;
/// [`now_millis`](Clock::now_millis) rounds down, and
/// [`now_micros`](Clock::now_micros) saturates at `u64::MAX` (times beyond
/// about 584 000 years).
///
/// # Thread safety
///
/// Reads take no lock and write nothing shared: the two parts of the time
/// are published under a sequence number (a seqlock), so a reader never sees
/// the milliseconds of one time with the microseconds of another; a read
/// that overlaps a write retries until the write (a few stores) is done.
/// Writers (`set`, `advance`) take turns the same way; concurrent advances
/// are never lost. A `Mutex` would be simpler, but every request through a
/// layer on a `ManualClock` reads it, and the stress tests read it from many
/// threads at once: a lock would serialise exactly the accesses those tests
/// exist to overlap.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::clock::{Clock, ManualClock};
///
/// let clock = ManualClock::new(1_000);
/// let shared = clock.clone();
///
/// clock.advance(Duration::from_micros(1_500));
/// assert_eq!(shared.now_millis(), 1_001);
/// assert_eq!(shared.now_micros(), 1_001_500);
///
/// clock.set(5);
/// assert_eq!(shared.now_millis(), 5);
/// clock.set(u64::MAX);
/// assert_eq!(shared.now_millis(), u64::MAX);
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    time: Arc<Time>,
}

/// The time of a [`ManualClock`], as a seqlock over two words.
#[derive(Debug)]
struct Time {
    /// Even while no write is in progress; a writer makes it odd, writes
    /// `millis` and `sub_micros`, then makes it even again (one higher than
    /// the odd value). A reader that sees the same even value before and
    /// after reading both words read one consistent time.
    seq: AtomicU64,
    /// Whole milliseconds.
    millis: AtomicU64,
    /// Microseconds within the millisecond, `0..1000`.
    sub_micros: AtomicU64,
}

/// The latest time a clock can hold: `u64::MAX` ms and 999 µs.
const MAX_MICROS: u128 = u64::MAX as u128 * 1000 + 999;

impl Time {
    /// One consistent `(millis, sub_micros)` pair.
    #[inline]
    fn read(&self) -> (u64, u64) {
        loop {
            // `Acquire` pairs with the writer's `Release` store of the even
            // value: the words read below are at least that write's.
            let before = self.seq.load(Ordering::Acquire);
            if before % 2 == 0 {
                let millis = self.millis.load(Ordering::Relaxed);
                let sub_micros = self.sub_micros.load(Ordering::Relaxed);
                // Orders the two loads above before the re-check of `seq`: if
                // a writer's store to either word was seen, its odd `seq` (or
                // a later value) is seen too.
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    return (millis, sub_micros);
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Replaces the time with `f(current)`, in microseconds since 0.
    fn update(&self, f: impl FnOnce(u128) -> u128) {
        // Take the write turn: move `seq` from even to odd.
        let mut seq = self.seq.load(Ordering::Relaxed);
        loop {
            if seq % 2 == 0 {
                match self.seq.compare_exchange_weak(
                    seq,
                    seq + 1,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(current) => seq = current,
                }
            } else {
                std::hint::spin_loop();
                seq = self.seq.load(Ordering::Relaxed);
            }
        }
        // Keeps the word stores below after the odd `seq` for any reader that
        // sees one of them (pairs with the reader's `Acquire` fence).
        fence(Ordering::Release);
        let now = u128::from(self.millis.load(Ordering::Relaxed)) * 1000
            + u128::from(self.sub_micros.load(Ordering::Relaxed));
        let next = f(now).min(MAX_MICROS);
        // Both fit: `next / 1000 <= u64::MAX` by the `min` above.
        self.millis.store((next / 1000) as u64, Ordering::Relaxed);
        self.sub_micros
            .store((next % 1000) as u64, Ordering::Relaxed);
        // Publish: even again, and the words written before it.
        self.seq.store(seq + 2, Ordering::Release);
    }
}

impl ManualClock {
    /// A clock that reads `start_ms` milliseconds until it is moved.
    pub fn new(start_ms: u64) -> Self {
        ManualClock {
            time: Arc::new(Time {
                seq: AtomicU64::new(0),
                millis: AtomicU64::new(start_ms),
                sub_micros: AtomicU64::new(0),
            }),
        }
    }

    /// Sets the time to exactly `ms` milliseconds (and no microseconds).
    /// Any `u64` reads back unchanged from [`now_millis`](Clock::now_millis).
    /// The time may move backwards, which is how tests model a clock that
    /// steps back.
    pub fn set(&self, ms: u64) {
        self.time.update(|_| u128::from(ms) * 1000);
    }

    /// Moves the time forward by `by`, to whole microseconds (less than a
    /// microsecond is dropped), saturating at `u64::MAX` milliseconds and
    /// 999 microseconds.
    pub fn advance(&self, by: Duration) {
        let by = by.as_micros();
        self.time.update(|now| now.saturating_add(by));
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_millis(&self) -> u64 {
        self.time.read().0
    }

    #[inline]
    fn now_micros(&self) -> u64 {
        let (millis, sub_micros) = self.time.read();
        millis.saturating_mul(1000).saturating_add(sub_micros)
    }
}
