//! An opt-in clock whose millisecond reading is kept fresh by an upkeep
//! thread that lives exactly as long as the clock's handles.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::system::Anchor;
use super::Clock;
use crate::sync::process::{AtomicBool, AtomicU64};

/// A thread that sees the same cached value this many times in a row reads
/// the counter instead (see "If the upkeep thread is starved" on
/// [`CachedClock`]).
const SAME_READS_BEFORE_CHECK: u32 = 64;

/// A real clock whose [`now_millis`](Clock::now_millis) is one relaxed
/// atomic load, refreshed by a background thread.
///
/// Same time as [`SystemClock`](super::SystemClock) (one process-wide anchor
/// on the monotonic counter, milliseconds since the UNIX epoch), but the
/// millisecond reading comes from a cache that an upkeep thread refreshes
/// every `interval` (1 ms by default). [`now_micros`](Clock::now_micros)
/// still reads the counter, so response times keep their precision.
///
/// - **Opt-in, and it stops.** [`CachedClock::new`] starts the thread
///   (`tsw-clock-upkeep`); clones share it. When the last clone is dropped
///   the thread is woken, told to stop, and joined before `drop` returns.
///   Create one and clone it: every `new` starts a thread of its own.
/// - **If the upkeep thread is starved.** A thread that reads the same cached
///   value 64 times in a row reads the counter itself and publishes the
///   newer value to the cache (a `fetch_max`, so the cache never moves
///   back), and returns it. So time cannot freeze for more than 64 reads on
///   any reading thread, however long the upkeep thread is kept off the CPU.
///   Under normal load the cache moves every interval, long before a thread
///   that does any real work between reads gets to 64.
/// - **Monotonic.** Every write to the cache is a `fetch_max`, so no reader
///   ever sees it go back, on any thread.
/// - **If the thread cannot be started** (the OS refuses), every
///   `now_millis` reads the counter: slower, still correct.
///
/// The cached reading lags the counter by up to one interval plus however
/// late the upkeep thread wakes; windows are cut from it, which is far finer
/// than any bucket.
///
/// One `now_millis` costs a fraction of a [`SystemClock`](super::SystemClock)
/// reading (a relaxed load and the per-thread bookkeeping of the starvation
/// rule above, no counter read); the figures are in `docs/performance.md`,
/// "What a clock reading costs".
/// [`now_micros`](Clock::now_micros) costs what `SystemClock`'s does. The
/// upkeep thread wakes `1 / interval` times a second whether or not anything
/// reads the clock (at 1 ms, on the order of 1% of one core).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::clock::{CachedClock, Clock};
///
/// let clock = CachedClock::with_interval(Duration::from_millis(2));
/// let a = clock.now_millis();
/// assert!(clock.clone().now_millis() >= a);
/// assert!(a > 1_577_836_800_000); // milliseconds since the UNIX epoch
/// drop(clock); // the last handle: the upkeep thread stops here
/// ```
#[derive(Clone)]
pub struct CachedClock {
    /// What readers load; also held by the upkeep thread.
    cache: Arc<Cache>,
    /// One per set of clones: its `Drop` stops the thread.
    _upkeep: Arc<Upkeep>,
}

/// The state the upkeep thread shares with the handles.
struct Cache {
    anchor: &'static Anchor,
    /// Milliseconds since the epoch. Only ever raised, with `fetch_max`.
    millis: AtomicU64,
    /// Set by the last handle's drop; the thread exits when it sees it.
    stop: AtomicBool,
    /// Set when no upkeep thread runs: readers then go to the counter.
    direct: AtomicBool,
}

impl Cache {
    /// Reads the counter and raises the cache to it; returns the reading.
    ///
    /// The cache is written only when the reading is ahead of it: a
    /// `fetch_max` takes the cache line for writing even when it changes
    /// nothing, and readers on other cores would then miss it on their next
    /// read. Every thread that reads in a tight loop comes here once per 64
    /// reads of an unchanged value (see `SAME_READS_BEFORE_CHECK`), far more
    /// often than the value moves.
    fn refresh(&self) -> u64 {
        let now = self.anchor.now_millis();
        // `Relaxed` (both): the value is a timestamp, not a flag guarding
        // other data.
        let cached = self.millis.load(Ordering::Relaxed);
        if now <= cached {
            return cached;
        }
        let previous = self.millis.fetch_max(now, Ordering::Relaxed);
        previous.max(now)
    }
}

/// Owns the upkeep thread; dropped with the last handle.
struct Upkeep {
    cache: Arc<Cache>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Upkeep {
    fn drop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.cache.stop.store(true, Ordering::Relaxed);
        thread.thread().unpark();
        // The thread only sleeps and refreshes; it cannot panic unless the
        // counter read does, and then there is nothing left to clean up.
        let _ = thread.join();
    }
}

thread_local! {
    /// `(last cached value seen, how many reads in a row saw it)` for this
    /// thread, across every `CachedClock` (they share one time).
    static SEEN: Cell<(u64, u32)> = const { Cell::new((0, 0)) };
}

impl CachedClock {
    /// A cached clock refreshed every millisecond, with its own upkeep
    /// thread. Clone it to share the thread.
    pub fn new() -> Self {
        Self::with_interval(Duration::from_millis(1))
    }

    /// A cached clock refreshed every `interval`, with its own upkeep thread.
    /// Readings lag the counter by up to about `interval`.
    ///
    /// # Panics
    ///
    /// If `interval` is zero: "CachedClock::with_interval: `interval` must be
    /// greater than zero" (a zero interval would spin a core).
    pub fn with_interval(interval: Duration) -> Self {
        assert!(
            !interval.is_zero(),
            "CachedClock::with_interval: `interval` must be greater than zero"
        );
        let anchor = Anchor::get();
        let cache = Arc::new(Cache {
            anchor,
            millis: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            direct: AtomicBool::new(false),
        });
        cache.refresh();
        let spawned = thread::Builder::new()
            .name("tsw-clock-upkeep".into())
            .spawn({
                let cache = Arc::clone(&cache);
                move || upkeep(&cache, interval)
            });
        let thread = match spawned {
            Ok(thread) => Some(thread),
            Err(_) => {
                cache.direct.store(true, Ordering::Relaxed);
                None
            }
        };
        CachedClock {
            _upkeep: Arc::new(Upkeep {
                cache: Arc::clone(&cache),
                thread,
            }),
            cache,
        }
    }

    /// The slow path of [`now_millis`](Clock::now_millis): no upkeep thread,
    /// or a cache that has not moved for too many reads on this thread.
    #[cold]
    #[inline(never)]
    fn read_counter(&self) -> u64 {
        let now = self.cache.refresh();
        let _ = SEEN.try_with(|seen| seen.set((now, 0)));
        now
    }
}

impl Default for CachedClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for CachedClock {
    #[inline]
    fn now_millis(&self) -> u64 {
        // `Relaxed`: the value is a timestamp, not a flag guarding other data.
        let cached = self.cache.millis.load(Ordering::Relaxed);
        let fresh = SEEN
            .try_with(|seen| {
                let (last, same) = seen.get();
                if cached != last {
                    seen.set((cached, 0));
                    true
                } else if same + 1 < SAME_READS_BEFORE_CHECK {
                    seen.set((last, same + 1));
                    true
                } else {
                    false
                }
            })
            // While this thread's locals are destroyed: no count to keep.
            .unwrap_or(true);
        if fresh && !self.cache.direct.load(Ordering::Relaxed) {
            cached
        } else {
            self.read_counter()
        }
    }

    #[inline]
    fn now_micros(&self) -> u64 {
        self.cache.anchor.now_micros()
    }
}

impl fmt::Debug for CachedClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedClock")
            .field("millis", &self.cache.millis.load(Ordering::Relaxed))
            .field("upkeep", &self._upkeep.thread.is_some())
            .finish()
    }
}

/// Body of the upkeep thread: refresh the cache every `interval` until the
/// last handle asks it to stop.
fn upkeep(cache: &Cache, interval: Duration) {
    while !cache.stop.load(Ordering::Relaxed) {
        // `park_timeout` returns early when the last handle unparks this
        // thread to stop it (or spuriously: the loop just refreshes early).
        thread::park_timeout(interval);
        cache.refresh();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_lives_as_long_as_the_handles() {
        let clock = CachedClock::with_interval(Duration::from_millis(5));
        let cache = Arc::downgrade(&clock.cache);
        let thread = clock._upkeep.thread.as_ref().expect("upkeep thread");
        assert!(!thread.is_finished(), "running while a handle lives");
        assert_eq!(thread.thread().name(), Some("tsw-clock-upkeep"));
        let clone = clock.clone();
        // Two handles, the upkeep owner and the thread share the cache.
        assert_eq!(cache.strong_count(), 4);
        drop(clock);
        assert!(
            !clone._upkeep.thread.as_ref().unwrap().is_finished(),
            "a clone keeps it running"
        );
        assert_eq!(cache.strong_count(), 3);
        drop(clone);
        // `drop` joined the thread, which released its share of the cache:
        // nothing holds it any more.
        assert_eq!(cache.strong_count(), 0, "upkeep thread still holds it");
    }

    #[test]
    fn a_stuck_cache_is_overtaken_by_the_counter() {
        let clock = CachedClock::with_interval(Duration::from_secs(3600));
        // Freeze the cache far in the past, as a starved thread would leave
        // it, and keep the upkeep thread from moving it (it sleeps an hour).
        clock.cache.millis.store(5, Ordering::Relaxed);
        let counter = SystemClock::new().now_millis();
        let readings: Vec<u64> = (0..=SAME_READS_BEFORE_CHECK)
            .map(|_| clock.now_millis())
            .collect();
        assert!(readings.windows(2).all(|w| w[0] <= w[1]), "{readings:?}");
        assert!(
            *readings.last().unwrap() >= counter,
            "still frozen after {} reads: {readings:?}",
            readings.len()
        );
        // The fresh value was published for every reader.
        assert!(clock.cache.millis.load(Ordering::Relaxed) >= counter);
    }

    #[test]
    fn readings_are_monotonic_and_follow_the_system_clock() {
        let clock = CachedClock::new();
        let system = SystemClock::new();
        let mut last = 0;
        for _ in 0..100_000 {
            let before = clock.now_millis();
            assert!(before >= last);
            last = before;
        }
        // The cache is never ahead of the counter.
        assert!(clock.now_millis() <= system.now_millis());
        assert!(clock.now_micros() / 1000 >= last);
    }

    #[test]
    #[should_panic(expected = "`interval` must be greater than zero")]
    fn a_zero_interval_is_rejected() {
        let _ = CachedClock::with_interval(Duration::ZERO);
    }

    use super::super::SystemClock;
}
