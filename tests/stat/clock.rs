//! `ManualClock`, `SystemClock`, `CachedClock` and the `Clock` trait's
//! provided pieces.

use crate::support;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tower_sliding_window::clock::{CachedClock, Clock, ManualClock, SystemClock};
use tower_sliding_window::stat::ArrayMetric;

#[test]
fn manual_clock_starts_where_told_and_moves_only_when_told() {
    let clock = ManualClock::new(1_234);
    assert_eq!(clock.now_millis(), 1_234);
    assert_eq!(clock.now_micros(), 1_234_000);
    thread::sleep(Duration::from_millis(5));
    assert_eq!(
        clock.now_millis(),
        1_234,
        "a manual clock never moves by itself"
    );

    clock.advance(Duration::from_millis(66));
    assert_eq!(clock.now_millis(), 1_300);
    clock.set(7);
    assert_eq!(clock.now_millis(), 7, "set may move the time backwards");
    assert_eq!(clock.now_micros(), 7_000);
    clock.set(0);
    assert_eq!(clock.now_millis(), 0);
}

#[test]
fn manual_clock_keeps_sub_millisecond_time() {
    let clock = ManualClock::new(10);
    for _ in 0..3 {
        clock.advance(Duration::from_micros(400));
    }
    assert_eq!(clock.now_micros(), 11_200);
    assert_eq!(clock.now_millis(), 11, "millis round down");
    clock.advance(Duration::from_nanos(999));
    assert_eq!(clock.now_micros(), 11_200, "below a microsecond is dropped");
    clock.advance(Duration::from_micros(800));
    assert_eq!(clock.now_millis(), 12);
}

#[test]
fn manual_clock_clones_share_one_time() {
    let a = ManualClock::new(0);
    let b = a.clone();
    a.advance(Duration::from_secs(2));
    assert_eq!(b.now_millis(), 2_000);
    b.set(50);
    assert_eq!(a.now_millis(), 50);

    // A metric built with a clone follows the original.
    let metric = ArrayMetric::with_clock(2, 1000, a.clone()).unwrap();
    metric.add_pass(1);
    b.set(1_050);
    assert_eq!(metric.pass(), 0, "at {} ms", b.now_millis());
}

#[test]
fn manual_clock_set_reads_back_exactly_for_any_u64() {
    let clock = ManualClock::new(0);
    for ms in [
        0,
        1,
        u64::MAX / 1000,
        u64::MAX / 1000 + 1,
        u64::MAX / 2,
        u64::MAX - 1,
        u64::MAX,
    ] {
        clock.set(ms);
        assert_eq!(clock.now_millis(), ms, "set({ms})");
        assert_eq!(
            clock.now_micros(),
            ms.saturating_mul(1000),
            "micros of set({ms}) saturate"
        );
        assert_eq!(ManualClock::new(ms).now_millis(), ms, "new({ms})");
    }
}

#[test]
fn manual_clock_set_moves_backwards_from_the_top() {
    let clock = ManualClock::new(u64::MAX);
    clock.advance(Duration::from_micros(250));
    clock.set(u64::MAX - 1);
    assert_eq!(clock.now_millis(), u64::MAX - 1);
    clock.set(5);
    assert_eq!(clock.now_millis(), 5);
    assert_eq!(clock.now_micros(), 5_000, "set clears the microseconds");
}

#[test]
fn manual_clock_advance_near_the_top_saturates() {
    let clock = ManualClock::new(u64::MAX - 1);
    clock.advance(Duration::from_micros(999));
    assert_eq!(
        clock.now_millis(),
        u64::MAX - 1,
        "999 us is not a millisecond"
    );
    clock.advance(Duration::from_micros(1));
    assert_eq!(clock.now_millis(), u64::MAX);
    clock.advance(Duration::from_secs(1));
    assert_eq!(clock.now_millis(), u64::MAX, "saturates");
    assert_eq!(clock.now_micros(), u64::MAX);

    let clock = ManualClock::new(5);
    clock.advance(Duration::MAX);
    assert_eq!(clock.now_millis(), u64::MAX, "saturates");
    clock.set(u64::MAX - 1);
    assert_eq!(clock.now_millis(), u64::MAX - 1, "and can still be set");
}

#[test]
fn manual_clock_readers_never_see_a_torn_time() {
    // A writer flips between two times whose milliseconds and microseconds
    // both differ; a reader must only ever see one of them whole.
    let (low, high) = (1_000_u64, u64::MAX - 7);
    let clock = ManualClock::new(low);
    let writer = {
        let clock = clock.clone();
        thread::spawn(move || {
            for _ in 0..20_000 {
                clock.set(low);
                clock.advance(Duration::from_micros(1));
                clock.set(high);
                clock.advance(Duration::from_micros(999));
            }
        })
    };
    while !writer.is_finished() {
        let us = clock.now_micros();
        let ms = clock.now_millis();
        assert!(
            [low * 1000, low * 1000 + 1, u64::MAX].contains(&us),
            "torn read: {us} us"
        );
        assert!([low, high].contains(&ms), "torn read: {ms} ms");
    }
    writer.join().unwrap();
}

#[test]
fn manual_clock_advances_are_not_lost_across_threads() {
    let clock = ManualClock::new(0);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let clock = clock.clone();
            thread::spawn(move || {
                for _ in 0..10_000 {
                    clock.advance(Duration::from_micros(3));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(clock.now_micros(), 4 * 10_000 * 3);
}

#[test]
fn system_clock_reads_milliseconds_since_the_epoch() {
    let clock = SystemClock::new();
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let ours = clock.now_millis();
    // Anchored to the wall clock at first use; the two may drift apart by
    // the time the process has run, which in a test is seconds at most.
    assert!(
        ours.abs_diff(wall) < 60_000,
        "system clock {ours} ms vs wall clock {wall} ms"
    );
    let default = SystemClock::default();
    assert!(default.now_millis() >= ours);
}

#[test]
fn system_clock_is_monotonic_on_every_thread() {
    let threads: Vec<_> = (0..2)
        .map(|_| {
            thread::spawn(|| {
                let clock = SystemClock::new();
                let (mut last_ms, mut last_us) = (0, 0);
                for _ in 0..200_000 {
                    let ms = clock.now_millis();
                    let us = clock.now_micros();
                    assert!(ms >= last_ms, "millis went back: {last_ms} -> {ms}");
                    assert!(us >= last_us, "micros went back: {last_us} -> {us}");
                    (last_ms, last_us) = (ms, us);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn system_clock_moves_forward() {
    let clock = SystemClock::new();
    let (ms, us) = (clock.now_millis(), clock.now_micros());
    thread::sleep(Duration::from_millis(30));
    // Both readings come straight from the counter: they have moved by at
    // least the sleep (a lower bound only, which no scheduler can break).
    let later = clock.now_micros();
    assert!(later >= us + 30_000, "{us} us then {later} us");
    assert!(clock.now_millis() >= ms + 30);
}

#[test]
fn system_clock_is_a_copyable_reference() {
    let clock = SystemClock::new();
    let copy = clock;
    assert!(copy.now_millis() <= clock.now_millis());
    assert_eq!(
        std::mem::size_of::<SystemClock>(),
        std::mem::size_of::<usize>()
    );
}

#[test]
fn cached_clock_shares_the_system_clocks_time() {
    let cached = CachedClock::new();
    let system = SystemClock::new();
    let a = cached.now_millis();
    let b = system.now_millis();
    // The cache is refreshed from the same counter: never ahead of it.
    assert!(a <= b, "cached {a} ms ahead of system {b} ms");
    let (mut last_ms, mut last_us) = (a, 0);
    for _ in 0..100_000 {
        let (ms, us) = (cached.now_millis(), cached.now_micros());
        assert!(ms >= last_ms && us >= last_us);
        (last_ms, last_us) = (ms, us);
    }
}

#[test]
fn cached_clock_moves_on_even_if_read_in_a_tight_loop() {
    // Whether or not the upkeep thread gets the CPU, a thread that keeps
    // reading sees time move: no bound on how soon, only that it does.
    let clock = CachedClock::with_interval(Duration::from_secs(3600));
    let start = clock.now_millis();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while clock.now_millis() <= start {
        assert!(std::time::Instant::now() < deadline, "frozen at {start} ms");
        std::hint::spin_loop();
    }
}

#[test]
fn cached_clock_drives_a_metric() {
    let clock = CachedClock::new();
    let metric = ArrayMetric::with_clock(10, 1000, clock.clone()).unwrap();
    metric.add_pass(3);
    assert_eq!(metric.pass(), 3);
    drop(clock);
    // The metric holds a clone: its clock still runs.
    metric.add_pass(1);
    assert_eq!(metric.pass(), 4);
}

#[test]
#[should_panic(expected = "`interval` must be greater than zero")]
fn cached_clock_rejects_a_zero_interval() {
    let _ = CachedClock::with_interval(Duration::ZERO);
}

/// A clock that only implements `now_millis`.
struct Frozen(u64);

impl Clock for Frozen {
    fn now_millis(&self) -> u64 {
        self.0
    }
}

#[test]
fn custom_clocks_and_pointer_wrappers() {
    assert_eq!(Frozen(42).now_micros(), 42_000, "default now_micros");
    assert_eq!(Frozen(u64::MAX).now_micros(), u64::MAX, "saturates");

    let arc: Arc<dyn Clock> = Arc::new(Frozen(9));
    assert_eq!(arc.now_millis(), 9);
    assert_eq!(arc.now_micros(), 9_000);
    let boxed: Box<dyn Clock> = Box::new(ManualClock::new(3));
    assert_eq!(boxed.now_millis(), 3);
    assert_eq!(boxed.now_micros(), 3_000);

    // Any clock can drive a metric.
    let metric = ArrayMetric::with_clock(2, 1000, Frozen(2_600)).unwrap();
    metric.add_pass(1);
    assert_eq!(metric.details()[0].timestamp_ms, 2_500);
    let metric = ArrayMetric::with_clock(2, 1000, arc).unwrap();
    metric.add_pass(1);
    assert_eq!(metric.details()[0].timestamp_ms, 0);
}

// --------------------------------------------- readings far from the rest

mod steps {
    use std::time::Duration;

    use axum::routing::get;
    use axum::Router;
    use http::StatusCode;
    use tower_sliding_window::clock::ManualClock;
    use tower_sliding_window::{PathKey, SlidingWindowLayer};

    use super::support::{ok_then_429, statuses, START_MS};

    const TEN_YEARS_MS: u64 = 10 * 365 * 24 * 3_600_000;
    const HOUR_MS: u64 = 3_600_000;

    fn app<X: tower_sliding_window::KeyExtractor>(layer: SlidingWindowLayer<X>) -> Router
    where
        X::Key: Clone,
    {
        Router::new()
            .route("/{path}", get(|| async { "hi" }))
            .layer(layer)
    }

    /// `qps(10)` per path, at most one key of its own.
    fn one_key_layer(clock: &ManualClock) -> SlidingWindowLayer<PathKey> {
        SlidingWindowLayer::qps(10)
            .key(PathKey)
            .max_keys(1)
            .clock(clock.clone())
    }

    #[tokio::test]
    async fn one_reading_ten_years_ahead_pins_no_key_once_the_clock_is_back() {
        let clock = ManualClock::new(START_MS);
        let layer = one_key_layer(&clock);
        let stats = layer.handle();
        let app = app(layer);
        // One request read the clock ten years ahead.
        clock.set(START_MS + TEN_YEARS_MS);
        assert_eq!(statuses(&app, "/a", 1).await, [StatusCode::OK]);
        // The clock is sane again. Within one window the key written then
        // is idle: the next key gets the slot, not the overflow entry.
        clock.set(START_MS + 1_000);
        assert_eq!(statuses(&app, "/a", 1).await, [StatusCode::OK]);
        clock.advance(Duration::from_millis(1_000));
        assert_eq!(statuses(&app, "/b", 1).await, [StatusCode::OK]);
        assert!(
            stats.snapshot("/b").is_some(),
            "/b was sent to the overflow entry"
        );
        assert!(stats.snapshot("/a").is_none(), "/a is still held");
    }

    #[tokio::test]
    async fn a_key_filled_ten_years_ahead_admits_again_within_a_window() {
        let clock = ManualClock::new(START_MS);
        let layer = SlidingWindowLayer::qps(10).clock(clock.clone());
        let app = Router::new()
            .route("/", get(|| async { "hi" }))
            .layer(layer);
        clock.set(START_MS + TEN_YEARS_MS);
        assert_eq!(statuses(&app, "/", 11).await, ok_then_429(10, 1));
        // Back: what passed then counts for one more window from the first
        // request that sees the clock back, not for ten years.
        clock.set(START_MS);
        assert_eq!(
            statuses(&app, "/", 1).await,
            [StatusCode::TOO_MANY_REQUESTS]
        );
        clock.advance(Duration::from_millis(1_000));
        assert_eq!(statuses(&app, "/", 11).await, ok_then_429(10, 1));
        // And the key's window slides with the clock from then on.
        clock.advance(Duration::from_millis(1_000));
        assert_eq!(statuses(&app, "/", 11).await, ok_then_429(10, 1));
    }

    #[tokio::test]
    async fn a_clock_stepped_back_an_hour_freezes_no_key() {
        let clock = ManualClock::new(START_MS + HOUR_MS);
        let layer = SlidingWindowLayer::qps(10).clock(clock.clone());
        let app = Router::new()
            .route("/", get(|| async { "hi" }))
            .layer(layer);
        assert_eq!(statuses(&app, "/", 11).await, ok_then_429(10, 1));
        // An hour back: the passes just made still count for their window
        // (no extra passes)...
        clock.set(START_MS);
        assert_eq!(
            statuses(&app, "/", 1).await,
            [StatusCode::TOO_MANY_REQUESTS]
        );
        // ...and one window later the key admits again, not an hour later.
        clock.advance(Duration::from_millis(1_000));
        assert_eq!(statuses(&app, "/", 11).await, ok_then_429(10, 1));
    }

    #[tokio::test]
    async fn a_step_back_within_a_window_is_recorded_in_the_newest_bucket() {
        let clock = ManualClock::new(START_MS);
        let layer = SlidingWindowLayer::qps(10).clock(clock.clone());
        let stats = layer.handle();
        let app = Router::new()
            .route("/", get(|| async { "hi" }))
            .layer(layer);
        assert_eq!(statuses(&app, "/", 5).await, ok_then_429(5, 0));
        // 300 ms back: the reading lags the newest bucket; it is recorded
        // there and the limit holds across the step.
        clock.set(START_MS - 300);
        assert_eq!(statuses(&app, "/", 6).await, ok_then_429(5, 1));
        assert_eq!(stats.snapshot(&()).unwrap().pass, 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_paced_key_is_neither_frozen_nor_pinned_by_a_step_back() {
        let clock = ManualClock::new(START_MS + HOUR_MS);
        let layer = SlidingWindowLayer::qps(10)
            .key(PathKey)
            .max_keys(1)
            .throttle(Duration::from_millis(500))
            .clock(clock.clone());
        let stats = layer.handle();
        let app = app(layer);
        assert_eq!(statuses(&app, "/a", 1).await, [StatusCode::OK]);
        // An hour back: the turn used lies an hour ahead, further than any
        // wait could reach. The key is paced from the clock again at once...
        clock.set(START_MS);
        assert_eq!(statuses(&app, "/a", 1).await, [StatusCode::OK]);
        // ...and, a window after its last pass, it is idle: the next key
        // gets the slot, not the overflow entry.
        clock.advance(Duration::from_millis(1_000));
        assert_eq!(statuses(&app, "/b", 1).await, [StatusCode::OK]);
        assert!(
            stats.snapshot("/b").is_some(),
            "/b was sent to the overflow entry"
        );
    }
}
