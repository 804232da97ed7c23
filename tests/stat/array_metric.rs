//! `ArrayMetric`: every method of the `Metric` API, driven by a `ManualClock`.
//!
//! Unless a test says otherwise the window is 2 buckets of 500 ms over one
//! second, so bucket starts are multiples of 500 and slot `i` holds the
//! buckets starting at `500 * (2k + i)`.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use tower_sliding_window::clock::{Clock, ManualClock, SystemClock};
use tower_sliding_window::flow::{Admission, TryPass};
use tower_sliding_window::stat::{ArrayMetric, MetricNode};

fn metric(sample_count: usize, interval_ms: u64, start_ms: u64) -> (ManualClock, ArrayMetric) {
    let clock = ManualClock::new(start_ms);
    let metric = ArrayMetric::with_clock(sample_count, interval_ms, clock.clone())
        .expect("valid window configuration");
    (clock, metric)
}

fn occupiable(sample_count: usize, interval_ms: u64, start_ms: u64) -> (ManualClock, ArrayMetric) {
    let clock = ManualClock::new(start_ms);
    let metric = ArrayMetric::occupiable(sample_count, interval_ms, clock.clone())
        .expect("valid window configuration");
    (clock, metric)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Runs `f` on another thread and fails the test if it has not returned
/// within `limit`: an admission that spins forever must fail, not hang.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .expect("the call did not return in time (it spins or deadlocks)")
}

#[test]
fn configuration_accessors() {
    let (_, m) = metric(4, 1000, 0);
    assert_eq!(m.sample_count(), 4);
    assert_eq!(m.interval_ms(), 1000);
    assert_eq!(m.window_length_ms(), 250);
    assert!(m.list().is_empty(), "a fresh metric holds no bucket");
}

#[test]
fn every_counter_sums_over_the_window() {
    let (clock, m) = metric(2, 1000, 10_000);
    m.add_pass(3);
    m.add_block(1);
    m.add_success(2);
    m.add_exception(1);
    m.add_occupied_pass(4);
    m.add_rt(ms(30));
    clock.advance(ms(500));
    m.add_pass(2);
    m.add_block(5);
    m.add_success(1);
    m.add_exception(2);
    m.add_occupied_pass(1);
    m.add_rt(ms(12));
    m.add_rt(Duration::from_micros(7_500));

    let t = clock.now_millis();
    assert_eq!(m.pass(), 5, "pass at {t} ms");
    assert_eq!(m.block(), 6, "block at {t} ms");
    assert_eq!(m.success(), 3, "success at {t} ms");
    assert_eq!(m.exception(), 3, "exception at {t} ms");
    assert_eq!(m.occupied_pass(), 5, "occupied_pass at {t} ms");
    assert_eq!(
        m.rt(),
        Duration::from_micros(30_000 + 12_000 + 7_500),
        "rt at {t} ms"
    );
    assert_eq!(
        m.min_rt(),
        Some(Duration::from_micros(7_500)),
        "min_rt at {t} ms"
    );

    // The first bucket slides out at 11 000: only the second one is left.
    clock.set(11_000);
    let t = clock.now_millis();
    assert_eq!(m.pass(), 2, "pass at {t} ms");
    assert_eq!(m.block(), 5, "block at {t} ms");
    assert_eq!(m.success(), 1, "success at {t} ms");
    assert_eq!(m.exception(), 2, "exception at {t} ms");
    assert_eq!(m.occupied_pass(), 1, "occupied_pass at {t} ms");
    assert_eq!(m.rt(), Duration::from_micros(19_500), "rt at {t} ms");
    assert_eq!(
        m.min_rt(),
        Some(Duration::from_micros(7_500)),
        "min_rt at {t} ms"
    );
}

#[test]
fn max_success_is_the_busiest_bucket_and_zero_when_empty() {
    let (clock, m) = metric(4, 1000, 0);
    assert_eq!(
        m.max_success(),
        0,
        "empty window at {} ms",
        clock.now_millis()
    );

    m.add_success(2);
    clock.set(250);
    m.add_success(5);
    clock.set(500);
    m.add_success(1);
    m.add_pass(100); // other counters do not matter
    assert_eq!(m.max_success(), 5, "at {} ms", clock.now_millis());

    // 1 250: the buckets at 0 and 250 are gone, the one at 500 remains.
    clock.set(1_250);
    assert_eq!(m.max_success(), 1, "at {} ms", clock.now_millis());
    clock.set(1_500);
    assert_eq!(m.max_success(), 0, "at {} ms", clock.now_millis());
}

#[test]
fn min_rt_of_a_window_without_rt_is_none() {
    let (clock, m) = metric(2, 1000, 0);
    assert_eq!(
        m.min_rt(),
        None,
        "fresh metric at {} ms",
        clock.now_millis()
    );
    m.add_pass(1);
    m.add_success(1);
    assert_eq!(
        m.min_rt(),
        None,
        "events but no rt at {} ms",
        clock.now_millis()
    );
    m.add_rt(ms(40));
    m.add_rt(ms(9));
    assert_eq!(m.min_rt(), Some(ms(9)), "at {} ms", clock.now_millis());
    // A zero response time is a real minimum, not "none".
    m.add_rt(Duration::ZERO);
    assert_eq!(
        m.min_rt(),
        Some(Duration::ZERO),
        "at {} ms",
        clock.now_millis()
    );
    clock.set(1_000);
    assert_eq!(m.min_rt(), None, "slid out at {} ms", clock.now_millis());
}

#[test]
fn previous_window_is_the_adjacent_bucket() {
    let (clock, m) = metric(4, 1000, 1_000);
    m.add_pass(3);
    m.add_block(2);
    clock.set(1_250);
    m.add_pass(1);
    assert_eq!(m.previous_window_pass(), 3, "at {} ms", clock.now_millis());
    assert_eq!(m.previous_window_block(), 2, "at {} ms", clock.now_millis());

    // The bucket before 1 500 is the one at 1 250.
    clock.set(1_600);
    assert_eq!(m.previous_window_pass(), 1, "at {} ms", clock.now_millis());
    assert_eq!(m.previous_window_block(), 0, "at {} ms", clock.now_millis());

    // At 2 000 the bucket at 1 750 was never opened: nothing, not the one
    // at 1 250 or 1 000.
    clock.set(2_000);
    assert_eq!(m.previous_window_pass(), 0, "at {} ms", clock.now_millis());
    assert_eq!(m.previous_window_block(), 0, "at {} ms", clock.now_millis());
}

#[test]
fn previous_window_before_time_zero_is_empty() {
    let (clock, m) = metric(2, 1000, 0);
    m.add_pass(7);
    m.add_block(7);
    assert_eq!(m.previous_window_pass(), 0, "at {} ms", clock.now_millis());
    assert_eq!(m.previous_window_block(), 0, "at {} ms", clock.now_millis());
    clock.set(500);
    assert_eq!(m.previous_window_pass(), 7, "at {} ms", clock.now_millis());
}

#[test]
fn previous_window_with_one_sample_is_never_the_current_bucket() {
    // Java returns the current bucket here (alibaba/Sentinel#3309).
    let (clock, m) = metric(1, 1000, 1_000);
    m.add_pass(2);
    m.add_block(2);
    clock.set(1_500);
    assert_eq!(m.previous_window_pass(), 0, "at {} ms", clock.now_millis());
    assert_eq!(m.previous_window_block(), 0, "at {} ms", clock.now_millis());
    clock.set(2_500);
    assert_eq!(m.previous_window_pass(), 0, "at {} ms", clock.now_millis());
    assert_eq!(m.pass(), 0, "at {} ms", clock.now_millis());
}

#[test]
fn window_pass_reads_one_bucket_without_opening_it() {
    let (clock, m) = metric(2, 1000, 100);
    m.add_pass(4);
    clock.set(600);
    m.add_pass(1);
    let t = clock.now_millis();
    assert_eq!(m.window_pass(0), 4, "bucket at 0, read at {t} ms");
    assert_eq!(m.window_pass(499), 4, "bucket at 0, read at {t} ms");
    assert_eq!(m.window_pass(500), 1, "bucket at 500, read at {t} ms");
    assert_eq!(m.window_pass(1_000), 0, "future bucket, read at {t} ms");

    // At 1 200 the bucket at 0 has left the window, but its slot was not
    // reused: like Sentinel's getWindowPass, the held bucket is still read.
    clock.set(1_200);
    let t = clock.now_millis();
    assert_eq!(m.pass(), 1, "window at {t} ms");
    assert_eq!(m.window_pass(100), 4, "held old bucket, read at {t} ms");
    // Reading did not open the bucket at 1 000.
    assert_eq!(m.window_pass(1_000), 0, "unopened bucket at {t} ms");
    assert!(m.window_value(1_000).is_none());

    // Once the slot is reused, the old bucket is gone.
    m.add_pass(2);
    assert_eq!(m.window_pass(100), 0, "reused slot, read at {t} ms");
    assert_eq!(m.window_pass(1_000), 2, "at {t} ms");
}

#[test]
fn details_lists_each_held_bucket_oldest_first() {
    let (clock, m) = metric(4, 1000, 2_000);
    assert_eq!(m.details(), Vec::<MetricNode>::new(), "fresh metric");

    m.add_pass(2);
    m.add_success(2);
    m.add_rt(ms(10));
    m.add_rt(ms(30));
    clock.set(2_600);
    m.add_block(3);
    m.add_exception(1);
    m.add_occupied_pass(1);
    clock.set(2_900);
    m.add_pass(1);

    let t = clock.now_millis();
    let details = m.details();
    let starts: Vec<u64> = details.iter().map(|n| n.timestamp_ms).collect();
    assert_eq!(starts, [2_000, 2_500, 2_750], "starts at {t} ms");

    let first = details[0];
    assert_eq!(first.pass, 2, "at {t} ms");
    assert_eq!(first.success, 2, "at {t} ms");
    assert_eq!(first.block, 0, "at {t} ms");
    // rt is the average over the successes: (10 + 30) / 2.
    assert_eq!(first.rt, Some(ms(20)), "at {t} ms");

    let second = details[1];
    assert_eq!(
        (
            second.pass,
            second.block,
            second.exception,
            second.occupied_pass
        ),
        (0, 3, 1, 1),
        "at {t} ms"
    );
    assert_eq!(second.success, 0, "at {t} ms");
    assert_eq!(second.rt, None, "no successes: no average, at {t} ms");

    assert_eq!(details[2].pass, 1, "at {t} ms");

    // At 3 100 the bucket at 2 000 has slid out.
    clock.set(3_100);
    let starts: Vec<u64> = m.details().iter().map(|n| n.timestamp_ms).collect();
    assert_eq!(starts, [2_500, 2_750], "at {} ms", clock.now_millis());
}

#[test]
fn waiting_counts_reservations_until_their_bucket_starts() {
    let (clock, m) = occupiable(2, 1000, 700);
    m.add_pass(2);
    m.add_waiting(1_000, 3);
    m.add_waiting(1_200, 1);
    let t = clock.now_millis();
    assert_eq!(m.waiting(), 4, "at {t} ms");
    assert_eq!(m.pass(), 2, "reservations are not passes yet at {t} ms");

    clock.set(999);
    assert_eq!(m.waiting(), 4, "at {} ms", clock.now_millis());

    // At 1 000 the reserved bucket has started: its reservations are passes,
    // even though nothing has opened the bucket.
    clock.set(1_000);
    let t = clock.now_millis();
    assert_eq!(m.waiting(), 0, "at {t} ms");
    assert_eq!(m.pass(), 6, "at {t} ms");
    assert_eq!(m.window_pass(1_000), 4, "at {t} ms");

    // Opening the bucket keeps them.
    m.add_pass(1);
    assert_eq!(m.pass(), 7, "at {t} ms");
    assert_eq!(m.window_pass(1_000), 5, "at {t} ms");
}

#[test]
fn reserved_bucket_counts_only_inside_the_window() {
    let (clock, m) = occupiable(4, 1000, 0);
    m.add_waiting(600, 2);
    assert_eq!(m.waiting(), 2, "at {} ms", clock.now_millis());
    clock.set(500);
    assert_eq!(m.pass(), 2, "matured at {} ms", clock.now_millis());
    assert_eq!(
        m.details().iter().map(|n| n.pass).collect::<Vec<_>>(),
        [2],
        "details at {} ms",
        clock.now_millis()
    );
    clock.set(1_499);
    assert_eq!(m.pass(), 2, "at {} ms", clock.now_millis());
    clock.set(1_500);
    assert_eq!(m.pass(), 0, "slid out at {} ms", clock.now_millis());
}

#[test]
fn add_waiting_on_a_plain_metric_does_nothing() {
    let (clock, m) = metric(2, 1000, 700);
    m.add_waiting(1_000, 3);
    assert_eq!(m.waiting(), 0, "at {} ms", clock.now_millis());
    clock.set(1_000);
    assert_eq!(m.waiting(), 0, "at {} ms", clock.now_millis());
    assert_eq!(m.pass(), 0, "at {} ms", clock.now_millis());
    m.add_pass(1);
    assert_eq!(m.pass(), 1, "at {} ms", clock.now_millis());
}

#[test]
fn try_pass_admits_up_to_the_limit() {
    let (clock, m) = metric(2, 1000, 100);
    assert_eq!(m.try_pass(2, 5), Admission::Pass { window_pass: 2 });
    assert_eq!(m.try_pass(3, 5), Admission::Pass { window_pass: 5 });
    assert_eq!(m.try_pass(1, 5), Admission::Block { window_pass: 5 });
    assert_eq!(
        m.pass(),
        5,
        "blocks record nothing, at {} ms",
        clock.now_millis()
    );
    assert_eq!(
        m.block(),
        0,
        "blocks record nothing, at {} ms",
        clock.now_millis()
    );

    // Passes recorded without admission still count against the limit.
    clock.set(600);
    m.add_pass(1);
    assert_eq!(m.try_pass(1, 7), Admission::Pass { window_pass: 7 });
    assert_eq!(m.try_pass(1, 7), Admission::Block { window_pass: 7 });

    // At 1 000 the bucket at 0 (5 passes) slides out.
    clock.set(1_000);
    assert_eq!(m.try_pass(4, 6), Admission::Pass { window_pass: 6 });
    assert_eq!(m.try_pass(1, 6), Admission::Block { window_pass: 6 });
    assert_eq!(m.pass(), 6, "at {} ms", clock.now_millis());
}

#[test]
fn try_pass_with_a_larger_batch_than_the_room_left_admits_nothing() {
    let (clock, m) = metric(2, 1000, 50);
    assert!(m.try_pass(3, 4).is_pass());
    let blocked = m.try_pass(2, 4);
    assert_eq!(blocked, Admission::Block { window_pass: 3 });
    assert!(!blocked.is_pass());
    assert_eq!(blocked.window_pass(), 3);
    assert_eq!(m.pass(), 3, "at {} ms", clock.now_millis());
    assert!(m.try_pass(1, 4).is_pass());
}

#[test]
fn try_pass_with_limit_zero_blocks_everything() {
    let (clock, m) = metric(2, 1000, 100);
    assert_eq!(m.try_pass(1, 0), Admission::Block { window_pass: 0 });
    clock.set(5_000);
    assert_eq!(m.try_pass(1, 0), Admission::Block { window_pass: 0 });
    assert_eq!(m.pass(), 0, "at {} ms", clock.now_millis());
}

#[test]
fn try_pass_counts_matured_reservations() {
    let (clock, m) = occupiable(2, 1000, 700);
    m.add_waiting(1_000, 3);
    assert_eq!(m.try_pass(3, 3), Admission::Pass { window_pass: 3 });
    clock.set(1_000);
    // The bucket at 500 holds 3 admissions and the one at 1 000 opens with 3
    // reserved: the window is full.
    assert_eq!(m.try_pass(1, 6), Admission::Block { window_pass: 6 });
    clock.set(1_500);
    assert_eq!(m.try_pass(3, 6), Admission::Pass { window_pass: 6 });
}

#[test]
fn try_pass_at_time_zero_returns() {
    // Regression: the first bucket ever opened, when it started at 0, was
    // treated as an older bucket and sealed against admission, so try_pass
    // spun forever on it.
    let (clock, m) = metric(10, 1000, 0);
    let admitted = within(Duration::from_secs(10), move || {
        let admitted = (0..5).filter(|_| m.try_pass(1, 3).is_pass()).count();
        (admitted, m.pass())
    });
    assert_eq!(admitted, (3, 3), "at {} ms", clock.now_millis());
}

#[test]
fn try_pass_when_the_first_bucket_starts_at_zero_but_time_moved_on() {
    let (clock, m) = metric(2, 1000, 0);
    m.add_pass(1);
    clock.set(499);
    let result = within(Duration::from_secs(10), move || m.try_pass(1, 2));
    assert_eq!(
        result,
        Admission::Pass { window_pass: 2 },
        "at {} ms",
        clock.now_millis()
    );
}

#[test]
fn time_until_pass() {
    let (clock, m) = metric(4, 1000, 1_000);
    assert_eq!(m.time_until_pass(1, 5), Some(Duration::ZERO));
    assert_eq!(
        m.time_until_pass(6, 5),
        None,
        "more than the limit never fits"
    );
    assert_eq!(m.time_until_pass(1, 0), None, "nothing fits a zero limit");

    m.add_pass(3); // bucket at 1 000
    clock.set(1_300);
    m.add_pass(2); // bucket at 1 250
    clock.set(1_600);
    assert_eq!(m.time_until_pass(0, 5), Some(Duration::ZERO));
    // One more needs the bucket at 1 000 gone: at 2 000.
    assert_eq!(m.time_until_pass(1, 5), Some(ms(400)));
    // Four more need 4 freed: both buckets gone, at 2 250.
    assert_eq!(m.time_until_pass(4, 5), Some(ms(650)));
    assert_eq!(m.time_until_pass(5, 5), Some(ms(650)));
    assert_eq!(m.time_until_pass(6, 5), None);

    // The answer is exact: one millisecond earlier it does not fit yet.
    clock.set(1_999);
    assert!(!m.try_pass(1, 5).is_pass(), "at {} ms", clock.now_millis());
    assert_eq!(m.time_until_pass(1, 5), Some(ms(1)));
    clock.set(2_000);
    assert_eq!(m.time_until_pass(1, 5), Some(Duration::ZERO));
    assert!(m.try_pass(1, 5).is_pass(), "at {} ms", clock.now_millis());
}

#[test]
fn a_bucket_exactly_one_interval_old_is_never_counted() {
    // Java counts the bucket at 0 in the window at 1000 until its slot is
    // reused (PR alibaba/Sentinel#3480); the window here is (start - I, start].
    let (clock, m) = metric(2, 1000, 0);
    m.add_pass(1);
    m.add_block(1);
    clock.set(500);
    m.add_pass(2);
    clock.set(999);
    assert_eq!(m.pass(), 3, "at {} ms", clock.now_millis());
    clock.set(1_000);
    // Nothing has reused slot 0 yet, and reads do not open buckets.
    assert!(m.window_value(0).is_some());
    assert_eq!(m.pass(), 2, "at {} ms", clock.now_millis());
    assert_eq!(m.block(), 0, "at {} ms", clock.now_millis());
    assert_eq!(m.details().len(), 1, "at {} ms", clock.now_millis());
    assert_eq!(m.try_pass(1, 3), Admission::Pass { window_pass: 3 });
}

#[test]
fn a_long_idle_gap_empties_the_window() {
    let (clock, m) = metric(10, 1000, 5_000);
    for _ in 0..10 {
        m.add_pass(1);
        m.add_success(1);
        m.add_rt(ms(5));
        clock.advance(ms(100));
    }
    clock.set(5_999);
    assert_eq!(m.pass(), 10, "at {} ms", clock.now_millis());

    for gap in [1_000 + 5_999, 3_600_000, 86_400_000 * 365] {
        clock.set(gap);
        let t = clock.now_millis();
        assert_eq!(m.pass(), 0, "at {t} ms");
        assert_eq!(m.success(), 0, "at {t} ms");
        assert_eq!(m.rt(), Duration::ZERO, "at {t} ms");
        assert_eq!(m.min_rt(), None, "at {t} ms");
        assert_eq!(m.max_success(), 0, "at {t} ms");
        assert_eq!(m.previous_window_pass(), 0, "at {t} ms");
        assert!(m.details().is_empty(), "at {t} ms");
        assert_eq!(m.time_until_pass(1, 1), Some(Duration::ZERO), "at {t} ms");
    }
    m.add_pass(1);
    assert_eq!(m.pass(), 1, "at {} ms", clock.now_millis());
    assert!(m.try_pass(1, 2).is_pass());
    assert!(!m.try_pass(1, 2).is_pass());
}

#[test]
fn a_clock_stepping_back_never_loses_an_event() {
    let (clock, m) = metric(2, 1000, 1_200);
    m.add_pass(1);
    // 200 falls in slot 0, which already holds the bucket at 1 000: the
    // write goes there instead of being dropped.
    clock.set(200);
    m.add_pass(1);
    m.add_block(1);
    let t = clock.now_millis();
    assert_eq!(m.pass(), 0, "the held bucket is in the future at {t} ms");
    clock.set(1_200);
    let t = clock.now_millis();
    assert_eq!(m.pass(), 2, "at {t} ms");
    assert_eq!(m.block(), 1, "at {t} ms");
}

#[test]
fn a_clock_stepping_back_into_a_stale_slot_reopens_its_own_bucket() {
    let (clock, m) = metric(2, 1000, 100);
    m.add_pass(5); // bucket at 0, slot 0
    clock.set(2_600);
    m.add_pass(1); // bucket at 2 500, slot 1
    clock.set(2_100); // slot 0 holds the stale bucket at 0
    m.add_pass(1);
    assert_eq!(m.pass(), 1, "at {} ms", clock.now_millis());
    assert_eq!(m.window_pass(2_000), 1, "at {} ms", clock.now_millis());
    clock.set(2_600);
    assert_eq!(m.pass(), 2, "at {} ms", clock.now_millis());
}

#[test]
fn admission_with_a_clock_stepping_back_is_decided_on_the_newest_window() {
    let (clock, m) = metric(2, 1000, 1_200);
    assert!(m.try_pass(1, 2).is_pass());
    clock.set(200);
    let t = clock.now_millis();
    assert_eq!(
        m.try_pass(1, 2),
        Admission::Pass { window_pass: 2 },
        "at {t} ms"
    );
    assert_eq!(
        m.try_pass(1, 2),
        Admission::Block { window_pass: 2 },
        "at {t} ms"
    );
    clock.set(1_200);
    assert_eq!(m.pass(), 2, "at {} ms", clock.now_millis());
}

#[test]
fn time_zero_is_an_ordinary_time() {
    let (clock, m) = occupiable(2, 1000, 0);
    m.add_pass(1);
    m.add_block(2);
    m.add_success(3);
    m.add_exception(4);
    m.add_occupied_pass(5);
    m.add_rt(ms(6));
    m.add_waiting(500, 1);
    let t = clock.now_millis();
    assert_eq!(m.pass(), 1, "at {t} ms");
    assert_eq!(m.block(), 2, "at {t} ms");
    assert_eq!(m.success(), 3, "at {t} ms");
    assert_eq!(m.exception(), 4, "at {t} ms");
    assert_eq!(m.occupied_pass(), 5, "at {t} ms");
    assert_eq!(m.rt(), ms(6), "at {t} ms");
    assert_eq!(m.min_rt(), Some(ms(6)), "at {t} ms");
    assert_eq!(m.max_success(), 3, "at {t} ms");
    assert_eq!(m.waiting(), 1, "at {t} ms");
    assert_eq!(m.window_pass(0), 1, "at {t} ms");
    assert_eq!(m.details().len(), 1, "at {t} ms");
    assert_eq!(m.details()[0].timestamp_ms, 0, "at {t} ms");
    assert_eq!(m.previous_window_pass(), 0, "at {t} ms");
    let admission = within(Duration::from_secs(10), move || m.try_pass(1, 2));
    assert_eq!(admission, Admission::Pass { window_pass: 2 }, "at {t} ms");
}

#[test]
fn huge_times_do_not_panic() {
    let (clock, m) = metric(10, 1000, 0);
    clock.set(u64::MAX / 1000);
    m.add_pass(1);
    assert!(m.try_pass(1, 2).is_pass());
    assert_eq!(m.pass(), 2, "at {} ms", clock.now_millis());
    let _ = m.time_until_pass(1, 2);
    let _ = m.details();
}

#[test]
fn the_system_clock_constructor_records() {
    // Two buckets of an hour: the window always covers at least the last
    // hour, so events recorded during the test are all still in it.
    let m = ArrayMetric::new(2, 7_200_000).expect("valid window");
    m.add_pass(2);
    m.add_block(1);
    let now = SystemClock::new().now_millis();
    assert_eq!(m.pass(), 2, "at {now} ms");
    assert_eq!(m.block(), 1, "at {now} ms");
    assert!(m.try_pass(1, 3).is_pass(), "at {now} ms");
    assert!(!m.try_pass(1, 3).is_pass(), "at {now} ms");
    assert_eq!(m.waiting(), 0);
}

#[test]
fn debug_output_names_the_shape() {
    let (_, m) = occupiable(4, 2000, 0);
    let debug = format!("{m:?}");
    assert!(debug.contains("ArrayMetric"), "{debug}");
    assert!(debug.contains("sample_count: 4"), "{debug}");
    assert!(debug.contains("interval_ms: 2000"), "{debug}");
}

#[test]
fn a_matured_reservation_survives_the_reuse_of_its_reservation_slot() {
    // Regression: when the reservation ring reused a slot, the old
    // reservation was folded into the main ring only if the main ring had
    // already opened a bucket at or after it. Reads count a matured
    // reservation as passes without opening anything, so after a run of
    // reservations with no other write the passes vanished from the window.
    let (clock, m) = occupiable(2, 1000, 700);
    m.add_waiting(1_000, 3);
    clock.set(1_200);
    assert_eq!(m.pass(), 3, "matured at {} ms", clock.now_millis());
    // 2 000 falls in the same reservation slot as 1 000.
    m.add_waiting(2_000, 1);
    let t = clock.now_millis();
    assert_eq!(m.pass(), 3, "still in the window at {t} ms");
    assert_eq!(m.window_pass(1_000), 3, "at {t} ms");
    assert_eq!(m.waiting(), 1, "at {t} ms");
    clock.set(1_999);
    assert_eq!(m.pass(), 3, "at {} ms", clock.now_millis());
    clock.set(2_000);
    assert_eq!(m.pass(), 1, "at {} ms", clock.now_millis());
}

#[test]
fn a_reservation_not_yet_due_is_not_folded_in_early() {
    // Reserving two laps ahead replaces a reservation that has not matured
    // (as in Sentinel); it must not open a main bucket in the future.
    let (clock, m) = occupiable(2, 1000, 100);
    m.add_waiting(1_000, 3);
    m.add_waiting(2_000, 1);
    let t = clock.now_millis();
    assert_eq!(m.pass(), 0, "at {t} ms");
    assert_eq!(m.waiting(), 1, "at {t} ms");
    assert!(m.try_pass(1, 1).is_pass(), "at {t} ms");
    clock.set(1_000);
    assert_eq!(
        m.pass(),
        0,
        "the replaced reservation, at {} ms",
        clock.now_millis()
    );
}

/// Hardening item 3: reading a managed bucket used to hand out the bucket
/// itself, whose public `reset()` zeroed the admission word; the next
/// `try_pass` then spun until the clock left the bucket (forever under a
/// `ManualClock`). Reads are snapshots now (resetting one does not compile:
/// see the `compile_fail` example on `BucketSnapshot`), and no read changes
/// what admission sees.
#[test]
fn reads_cannot_affect_admission() {
    let (clock, m) = metric(2, 1000, 0);
    assert!(m.try_pass(2, 3).is_pass());
    let listed = m.list();
    let held = m.window_value(0).expect("the bucket at 0");
    assert_eq!((listed.len(), held.pass()), (1, 2));
    let _ = (m.details(), m.pass(), m.min_rt(), m.max_success());
    let result = within(Duration::from_secs(10), move || {
        let admitted = (0..3).filter(|_| m.try_pass(1, 3).is_pass()).count();
        (admitted, m.pass())
    });
    assert_eq!(result, (1, 3), "at {} ms", clock.now_millis());
}

/// Hardening item 9: absurd response times saturate the sum instead of
/// wrapping it, and the average of a bucket never drops below its minimum.
#[test]
fn absurd_response_times_saturate() {
    let (clock, m) = metric(2, 1000, 0);
    m.add_rt(Duration::MAX);
    m.add_rt(Duration::MAX);
    m.add_success(2);
    let t = clock.now_millis();
    assert_eq!(m.rt(), Duration::from_micros(u64::MAX), "at {t} ms");
    let node = m.details()[0];
    assert!(node.rt >= m.min_rt(), "{node:?} at {t} ms");

    // Many huge samples: the sum would wrap many times over.
    let (clock, m) = metric(2, 1000, 0);
    let huge = Duration::from_micros(1 << 50);
    for _ in 0..100_000 {
        m.add_rt(huge);
    }
    m.add_success(100_000);
    let t = clock.now_millis();
    assert_eq!(m.rt(), Duration::from_micros(u64::MAX), "at {t} ms");
    assert_eq!(m.min_rt(), Some(huge), "at {t} ms");
    assert_eq!(
        m.details()[0].rt,
        Some(huge),
        "average raised to the minimum at {t} ms"
    );
}
