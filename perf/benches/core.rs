//! Benches of the statistics core, plus the fixtures they share.
//!
//! Every metric runs on the real [`SystemClock`] (the default), so rotation
//! happens as it would in production: a new bucket every 100 ms. The
//! admission groups also run our metric on a [`CachedClock`] beside
//! governor on its upkeep clock: both without the counter read, so what is
//! left is each side's own work.
//!
//! Two-thread groups report **aggregate** time per operation: both threads
//! run the same number of operations on one shared value, and the wall time
//! from the first thread's start to the last thread's end is divided by the
//! total. Their throughput is the combined rate of both threads.
//!
//! The two-thread groups need two otherwise idle cores. When another process
//! keeps one busy, the bench threads take turns instead of contending, and
//! their figures drift towards the single-threaded ones (a `fetch_add` floor
//! no slower than on one thread is the sign); compare only runs where the
//! floor shows contention.

pub(crate) mod clock;
pub(crate) mod multi_threaded;
pub(crate) mod paired;
pub(crate) mod single_threaded;

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use governor::clock::{QuantaInstant, QuantaUpkeepClock};
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tower_sliding_window::clock::CachedClock;
use tower_sliding_window::flow::TryPass;
use tower_sliding_window::stat::{ArrayMetric, StatisticNode};

/// The second window of a `StatisticNode`: 10 buckets over one second.
pub(crate) const SAMPLE_COUNT: usize = 10;
pub(crate) const INTERVAL_MS: u64 = 1000;

/// The response time recorded per request in the `StatisticNode` benches.
pub(crate) const RT: Duration = Duration::from_micros(1_250);

/// A fresh metric with the `StatisticNode` second-window shape on the
/// system clock.
pub(crate) fn array_metric() -> ArrayMetric {
    ArrayMetric::new(SAMPLE_COUNT, INTERVAL_MS).expect("valid window")
}

/// The same metric on an opt-in [`CachedClock`]: admission without the
/// counter read (the clock's upkeep thread lives as long as the metric).
pub(crate) fn array_metric_cached_clock() -> ArrayMetric {
    ArrayMetric::with_clock(SAMPLE_COUNT, INTERVAL_MS, CachedClock::new()).expect("valid window")
}

/// Governor's direct limiter on its default (quanta) clock, with a quota it
/// never exhausts: about 4.3 billion cells per second, any burst.
pub(crate) fn governor_never_rejecting() -> DefaultDirectRateLimiter {
    let limiter = RateLimiter::direct(Quota::per_second(NonZeroU32::MAX));
    assert!(
        (0..1_000_000).all(|_| limiter.check().is_ok()),
        "the governor quota must never reject"
    );
    limiter
}

/// Governor's direct limiter on its upkeep clock (quanta's `recent` time,
/// refreshed every millisecond by a thread of its own): its check without
/// the counter read, to set beside ours on the cached clock.
pub(crate) type UpkeepDirectRateLimiter =
    RateLimiter<NotKeyed, InMemoryState, QuantaUpkeepClock, NoOpMiddleware<QuantaInstant>>;

/// [`governor_never_rejecting`] on governor's upkeep clock.
pub(crate) fn governor_upkeep_never_rejecting() -> UpkeepDirectRateLimiter {
    let clock =
        QuantaUpkeepClock::from_interval(Duration::from_millis(1)).expect("quanta upkeep thread");
    let limiter = RateLimiter::direct_with_clock(Quota::per_second(NonZeroU32::MAX), clock);
    assert!(
        (0..1_000_000).all(|_| limiter.check().is_ok()),
        "the governor quota must never reject"
    );
    limiter
}

/// One request's bookkeeping on a node: admission, in-flight gauge,
/// completion with its response time.
#[inline]
pub(crate) fn node_request(node: &StatisticNode) {
    let admitted = node.try_pass(1, u64::MAX).is_pass();
    node.increase_concurrency();
    node.add_rt_and_success(RT, 1);
    node.decrease_concurrency();
    std::hint::black_box(admitted);
}

/// Keeps every bucket of a metric's window held (one pass every 10 ms, so
/// about ten per bucket), so reads measure a full window. The thread sleeps
/// between writes and stops when the guard is dropped.
pub(crate) struct KeepFull {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl KeepFull {
    /// Starts the writer and waits one whole window, so every bucket is held
    /// when this returns.
    pub(crate) fn start(metric: Arc<ArrayMetric>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let handle = thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                while !stop.load(Ordering::Relaxed) {
                    metric.add_pass(1);
                    thread::sleep(Duration::from_millis(10));
                }
            }
        });
        thread::sleep(Duration::from_millis(INTERVAL_MS + 100));
        KeepFull {
            stop,
            handle: Some(handle),
        }
    }
}

impl Drop for KeepFull {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// Runs `op` `iters` times on each of `threads` threads at once, all on the
/// same `shared` value, and returns the aggregate time per operation
/// multiplied by `iters` (what `iter_custom` expects for one element per
/// iteration): wall time from the earliest start to the latest end, divided
/// by `threads`.
pub(crate) fn run_threads<S, F>(threads: usize, iters: u64, shared: &S, op: F) -> Duration
where
    S: Sync + ?Sized,
    F: Fn(&S) + Sync,
{
    let barrier = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        op(shared);
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("bench thread panicked"))
            .collect()
    });
    let start = spans
        .iter()
        .map(|s| s.0)
        .min()
        .expect("at least one thread");
    let end = spans
        .iter()
        .map(|s| s.1)
        .max()
        .expect("at least one thread");
    let threads = u32::try_from(threads).expect("a handful of threads");
    (end - start) / threads
}
