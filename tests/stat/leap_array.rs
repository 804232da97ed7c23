//! The explicit-time building blocks: `LeapArray`, `WindowWrap`,
//! `MetricBucket`, `FutureBucketLeapArray` and `OccupiableBucketLeapArray`.
//! Every method takes its time as an argument, so no clock is needed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tower_sliding_window::stat::{
    BucketLeapArray, BucketValue, FutureBucketLeapArray, LeapArray, MetricBucket, MetricEvent,
    OccupiableBucketLeapArray,
};

fn ring(sample_count: usize, interval_ms: u64) -> BucketLeapArray {
    LeapArray::new(sample_count, interval_ms).expect("valid window")
}

fn pass_at(ring: &BucketLeapArray, t: u64) -> u64 {
    ring.values(t).map(MetricBucket::pass).sum()
}

fn starts(ring: &BucketLeapArray, t: u64) -> Vec<u64> {
    ring.list(t).iter().map(|w| w.window_start()).collect()
}

#[test]
fn shape() {
    let r = ring(5, 1000);
    assert_eq!(r.sample_count(), 5);
    assert_eq!(r.interval_ms(), 1000);
    assert_eq!(r.window_length_ms(), 200);
    assert!(format!("{r:?}").contains("LeapArray"));
}

#[test]
fn current_window_opens_the_bucket_containing_the_time() {
    let r = ring(4, 1000);
    let w = r.current_window(1_260);
    assert_eq!(w.window_start(), 1_250);
    assert_eq!(w.window_length_ms(), 250);
    assert!(w.is_time_in_window(1_250));
    assert!(w.is_time_in_window(1_499));
    assert!(!w.is_time_in_window(1_500));
    assert!(!w.is_time_in_window(1_249));
    w.value().add_pass(2);
    // The same bucket again, with its count.
    let again = r.current_window(1_499);
    assert_eq!(again.window_start(), 1_250);
    assert_eq!(again.value().pass(), 2);
    // A copy of a wrap reads the same bucket.
    let copy = again;
    assert_eq!(copy.value().pass(), again.value().pass());
}

#[test]
fn values_and_list_cover_exactly_the_window() {
    let r = ring(4, 1000);
    for (t, n) in [(1_000, 1), (1_250, 2), (1_500, 4), (1_750, 8)] {
        r.current_window(t).value().add_pass(n);
    }
    assert_eq!(starts(&r, 1_999), [1_000, 1_250, 1_500, 1_750]);
    assert_eq!(pass_at(&r, 1_999), 15);
    // At 2 000 the bucket at 1 000 is exactly one interval old: out.
    assert_eq!(starts(&r, 2_000), [1_250, 1_500, 1_750]);
    assert_eq!(pass_at(&r, 2_000), 14);
    // Reads at an earlier time see only what was in its window.
    assert_eq!(starts(&r, 1_300), [1_000, 1_250]);
    assert_eq!(pass_at(&r, 1_300), 3);
    // Nothing before any bucket.
    assert!(r.list(500).is_empty());
    assert_eq!(pass_at(&r, 10_000), 0);
}

#[test]
fn reads_open_nothing() {
    let r = ring(2, 1000);
    r.current_window(100).value().add_pass(1);
    let _ = pass_at(&r, 1_200);
    let _ = r.list(1_200);
    let _ = r.previous_window(1_200);
    let _ = r.window_value(1_200);
    // The bucket at 0 is still held: nothing reused its slot.
    assert_eq!(r.window_value(0).map(MetricBucket::pass), Some(1));
    assert!(r.window_value(1_000).is_none());
}

#[test]
fn a_slot_reused_starts_from_zero() {
    let r = ring(2, 1000);
    let first = r.current_window(100);
    first.value().add_pass(5);
    first.value().add_rt(Duration::from_millis(3));
    let reused = r.current_window(1_100);
    assert_eq!(reused.window_start(), 1_000);
    assert_eq!(reused.value().pass(), 0);
    assert_eq!(reused.value().min_rt(), None);
    assert!(r.window_value(100).is_none(), "the old bucket is gone");
}

#[test]
fn previous_window() {
    let r = ring(4, 1000);
    r.current_window(1_000).value().add_block(3);
    let prev = r.previous_window(1_300).expect("the bucket at 1 000");
    assert_eq!(prev.window_start(), 1_000);
    assert_eq!(prev.value().block(), 3);
    // Only the adjacent bucket: at 1 500 the one before is 1 250 (never
    // opened), not 1 000.
    assert!(r.previous_window(1_500).is_none());
    assert!(r.previous_window(100).is_none(), "no bucket before time 0");

    let one = ring(1, 1000);
    one.current_window(1_000).value().add_pass(1);
    assert!(one.previous_window(1_500).is_none(), "one sample: never");
    assert!(one.previous_window(2_500).is_none());
}

#[test]
fn time_behind_a_slot_is_recorded_in_its_newer_window() {
    let r = ring(2, 1000);
    r.current_window(1_200).value().add_pass(1);
    let behind = r.current_window(200);
    assert_eq!(behind.window_start(), 1_000);
    behind.value().add_pass(1);
    assert_eq!(pass_at(&r, 1_200), 2);
}

#[test]
fn time_zero_and_huge_times() {
    let r = ring(3, 3);
    let w = r.current_window(0);
    assert_eq!(w.window_start(), 0);
    w.value().add_pass(1);
    assert_eq!(pass_at(&r, 0), 1);
    assert_eq!(
        starts(&r, 2),
        [0, 1, 2].into_iter().take(1).collect::<Vec<_>>()
    );

    let r = ring(10, 1000);
    r.current_window(u64::MAX).value().add_pass(7);
    assert_eq!(pass_at(&r, u64::MAX), 7);
}

/// A custom bucket value: a single counter.
#[derive(Default)]
struct Counter(AtomicU64);

impl BucketValue for Counter {
    fn reset(&self) {
        self.0.store(0, Ordering::Relaxed);
    }
}

#[test]
fn a_ring_of_a_custom_value() {
    let r: LeapArray<Counter> = LeapArray::new(2, 100).unwrap();
    r.current_window(10)
        .value()
        .0
        .fetch_add(3, Ordering::Relaxed);
    r.current_window(60)
        .value()
        .0
        .fetch_add(4, Ordering::Relaxed);
    let sum = |t| {
        r.values(t)
            .map(|c| c.0.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    assert_eq!(sum(99), 7);
    assert_eq!(sum(100), 4);
    // Reusing the slot resets the value.
    assert_eq!(r.current_window(110).value().0.load(Ordering::Relaxed), 0);
}

#[test]
fn metric_bucket_counts_every_event() {
    let b = MetricBucket::default();
    b.add_pass(1);
    b.add_block(2);
    b.add_exception(3);
    b.add_success(4);
    b.add_occupied_pass(5);
    b.add_rt(Duration::from_micros(60));
    b.add(MetricEvent::Rt, 40);
    b.add(MetricEvent::Pass, 10);
    assert_eq!(
        (
            b.pass(),
            b.block(),
            b.exception(),
            b.success(),
            b.occupied_pass()
        ),
        (11, 2, 3, 4, 5)
    );
    assert_eq!(b.rt(), Duration::from_micros(100));
    assert_eq!(b.get(MetricEvent::Rt), 100, "the Rt counter is in us");
    assert_eq!(b.min_rt(), Some(Duration::from_micros(40)));
    for (event, expected) in MetricEvent::ALL.into_iter().zip([11, 2, 3, 4, 100, 5]) {
        assert_eq!(b.get(event), expected, "{event:?}");
    }
    b.reset();
    for event in MetricEvent::ALL {
        assert_eq!(b.get(event), 0, "{event:?} after reset");
    }
    assert_eq!(b.min_rt(), None);
    assert!(format!("{b:?}").contains("MetricBucket"));
}

#[test]
fn future_bucket_leap_array_counts_only_future_buckets() {
    let f = FutureBucketLeapArray::new(2, 1000).unwrap();
    f.current_window(1_300).value().add_pass(2);
    f.current_window(1_700).value().add_pass(1);
    let waiting = |now| f.values(now).map(MetricBucket::pass).sum::<u64>();
    assert_eq!(waiting(900), 3);
    assert_eq!(waiting(1_000), 1, "the bucket at 1 000 has started");
    assert_eq!(waiting(1_500), 0);
    assert_eq!(f.leap_array().sample_count(), 2);
}

#[test]
fn occupiable_ring_folds_reservations_into_their_bucket() {
    let o = OccupiableBucketLeapArray::new(2, 1000).unwrap();
    o.add(700, MetricEvent::Pass, 1);
    o.add_waiting(1_000, 3);
    o.add_waiting(1_400, 2);
    assert_eq!(o.current_waiting(700), 5);
    assert_eq!(o.current_waiting(1_000), 0);

    // Read at 1 200 before anything opens the bucket at 1 000: the
    // reservations already count as its passes.
    let details = o.details(1_200);
    let passes: Vec<(u64, u64)> = details.iter().map(|n| (n.timestamp_ms, n.pass)).collect();
    assert_eq!(passes, [(500, 1), (1_000, 5)]);
    // `list` holds only opened buckets.
    let listed: Vec<u64> = o.list(1_200).iter().map(|w| w.window_start()).collect();
    assert_eq!(listed, [500]);

    // Opening it starts its pass count at the reservation.
    let w = o.current_window(1_200);
    assert_eq!(w.window_start(), 1_000);
    assert_eq!(w.pass(), 5);
    assert_eq!(o.list(1_200).len(), 2);
    assert_eq!(o.list(1_200)[1].window_length_ms(), 500);
}

/// Whether a `PanicsOnce` reset has panicked yet (one test uses it).
static RESET_PANICKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A value whose first reset, in any slot, panics.
#[derive(Default)]
struct PanicsOnce;

impl BucketValue for PanicsOnce {
    fn reset(&self) {
        if !RESET_PANICKED.swap(true, Ordering::Relaxed) {
            panic!("reset failed");
        }
    }
}

#[test]
fn a_panicking_reset_releases_the_rotation_lock() {
    let r: LeapArray<PanicsOnce> = LeapArray::new(2, 100).unwrap();
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = r.current_window(10);
    }));
    assert!(first.is_err(), "the first reset panics");
    // The lock was released while unwinding: later openings proceed (a
    // wedged lock would spin here forever).
    assert_eq!(r.current_window(10).window_start(), 0);
    assert_eq!(r.current_window(160).window_start(), 150);
}
