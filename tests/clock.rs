//! `ManualClock`, `SystemClock` and the `Clock` trait's provided pieces.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tower_sliding_window::clock::{Clock, ManualClock, SystemClock};
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
fn manual_clock_saturates_instead_of_overflowing() {
    let clock = ManualClock::new(u64::MAX);
    assert_eq!(clock.now_micros(), u64::MAX);
    clock.advance(Duration::from_secs(1));
    assert_eq!(clock.now_micros(), u64::MAX);
    clock.set(5);
    clock.advance(Duration::MAX);
    assert_eq!(clock.now_micros(), u64::MAX);
    assert_eq!(clock.now_millis(), u64::MAX / 1000);
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
    // The precise reading comes straight from the counter: it has moved by
    // at least the sleep.
    let later = clock.now_micros();
    assert!(later >= us + 30_000, "{us} us then {later} us");
    // The cached millisecond reading is refreshed by a background thread,
    // which a loaded machine may starve for a while: only require that it
    // moves, within a generous bound.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while clock.now_millis() <= ms {
        assert!(
            std::time::Instant::now() < deadline,
            "cached reading stuck at {ms} ms"
        );
        thread::sleep(Duration::from_millis(1));
    }
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
