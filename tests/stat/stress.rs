//! The concurrency guarantees on real threads.
//!
//! Each test runs for a bounded time (at most about a second and a half of
//! hammering) and asserts only on counts, never on timing.
//!
//! 1. With a frozen clock, exactly `limit` of any number of concurrent
//!    admissions pass, and every other one is a block.
//! 2. With a clock moving across bucket boundaries and slot reuse while
//!    threads record, no update is lost or counted twice. The clock is one
//!    shared `ManualClock` that only moves forward, so an event a thread
//!    records between reading `t0` and `t1` lands in a bucket starting in
//!    `[start(t0), start(t1)]`: it cannot land before the bucket of a time
//!    already read, nor after the newest bucket that exists when it lands,
//!    which was opened at a time the clock had already shown. Each bucket's
//!    count must therefore lie between the events certainly in it and the
//!    events possibly in it.
//! 3. With a moving clock, admission never lets any bucket-aligned window
//!    hold more than `limit` passes, and every admission is counted once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use tower_sliding_window::clock::{Clock, ManualClock};
use tower_sliding_window::flow::TryPass;
use tower_sliding_window::stat::{ArrayMetric, StatisticNode};

const THREADS: usize = 4;

/// How long a moving-clock test keeps hammering.
const RUN_FOR: Duration = Duration::from_millis(1_500);

#[test]
fn frozen_clock_admits_exactly_the_limit() {
    let clock = ManualClock::new(5_000);
    let metric = ArrayMetric::with_clock(10, 1000, clock.clone()).unwrap();
    let deadline = Instant::now() + RUN_FOR;
    let mut rounds = 0;
    // A new window per round, at least a few rounds.
    while rounds < 3 || (Instant::now() < deadline && rounds < 20) {
        for (limit, per_thread) in [(1, 50), (10_000, 5_000), (7_777, 20_000)] {
            let barrier = Barrier::new(THREADS);
            let passed = AtomicU64::new(0);
            let blocked = AtomicU64::new(0);
            thread::scope(|s| {
                for _ in 0..THREADS {
                    s.spawn(|| {
                        barrier.wait();
                        for _ in 0..per_thread {
                            if metric.try_pass(1, limit).is_pass() {
                                passed.fetch_add(1, Ordering::Relaxed);
                            } else {
                                blocked.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                }
            });
            let t = clock.now_millis();
            let attempts = (THREADS * per_thread) as u64;
            let passed = passed.into_inner();
            assert_eq!(passed, limit, "admitted at {t} ms (limit {limit})");
            assert_eq!(blocked.into_inner(), attempts - limit, "blocked at {t} ms");
            assert_eq!(metric.pass(), limit, "window at {t} ms");
            // The next limit needs a fresh window.
            clock.advance(Duration::from_millis(1_000));
        }
        rounds += 1;
    }
}

#[test]
fn frozen_clock_admits_exactly_the_limit_on_a_node() {
    let clock = ManualClock::new(70_000);
    let node = StatisticNode::with_clock(clock.clone());
    let (limit, per_thread) = (12_345u64, 25_000usize);
    let barrier = Barrier::new(THREADS);
    let passed = AtomicU64::new(0);
    thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..per_thread {
                    if node.try_pass(1, limit).is_pass() {
                        passed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let t = clock.now_millis();
    let attempts = (THREADS * per_thread) as u64;
    assert_eq!(passed.into_inner(), limit, "admitted at {t} ms");
    assert_eq!(node.pass_qps(), limit as f64, "at {t} ms");
    assert_eq!(node.block_qps(), (attempts - limit) as f64, "at {t} ms");
    assert_eq!(node.total_pass(), limit, "minute window at {t} ms");
    assert_eq!(node.block_request(), attempts - limit, "at {t} ms");
    assert_eq!(node.total_request(), attempts, "at {t} ms");
}

#[test]
fn frozen_clock_batches_never_overshoot() {
    let clock = ManualClock::new(1_000);
    let metric = ArrayMetric::with_clock(4, 400, clock.clone()).unwrap();
    let limit = 200_003u64;
    let passed = AtomicU64::new(0);
    thread::scope(|s| {
        for n in 1..=THREADS as u64 {
            let (metric, passed) = (&metric, &passed);
            s.spawn(move || {
                // Batches of `n` until one does not fit, then single passes
                // until none fits: when the thread stops, the window is full,
                // and passes never leave a frozen window.
                while metric.try_pass(n, limit).is_pass() {
                    passed.fetch_add(n, Ordering::Relaxed);
                }
                while metric.try_pass(1, limit).is_pass() {
                    passed.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    let t = clock.now_millis();
    let passed = passed.into_inner();
    assert_eq!(metric.pass(), passed, "recorded = admitted at {t} ms");
    assert_eq!(passed, limit, "at {t} ms");
}

/// Lets the writers run for about `d` between two clock steps. A sleep, so
/// that the core is theirs meanwhile: the races worth catching need writers
/// running on every core while a bucket opens. (A yield is no good here:
/// with every core busy it can cost a whole scheduler time slice.)
fn pause(d: Duration) {
    thread::sleep(d);
}

/// Passes recorded, keyed by `(start(t0), start(t1))`: the buckets of the
/// clock readings just before and just after the call that recorded them.
type Recorded = BTreeMap<(u64, u64), u64>;

#[test]
fn moving_clock_loses_and_duplicates_nothing() {
    // 4 buckets of 5 ms: the clock below crosses a bucket every 5 steps and
    // reuses every slot every 20.
    let (sample_count, len) = (4u64, 5u64);
    let interval = sample_count * len;
    let clock = ManualClock::new(1_000);
    let metric = ArrayMetric::with_clock(sample_count as usize, interval, clock.clone()).unwrap();
    let start = |t: u64| t - t % len;

    let deadline = Instant::now() + RUN_FOR;
    let mut all = Recorded::new();
    let mut rounds = 0;
    let mut checked = 0u64;
    while rounds < 3 || (Instant::now() < deadline && rounds < 200) {
        let stop = AtomicBool::new(false);
        let recorded: Vec<Recorded> = thread::scope(|s| {
            let writers: Vec<_> = (0..THREADS)
                .map(|w| {
                    let (clock, metric, stop) = (&clock, &metric, &stop);
                    s.spawn(move || {
                        let mut mine = Recorded::new();
                        let mut i = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            let t0 = clock.now_millis();
                            let n = 1 + (i + w as u64) % 3;
                            // Plain adds and admissions that always pass go
                            // through different paths of the same bucket.
                            if i % 2 == 0 {
                                metric.add_pass(n);
                            } else {
                                assert!(metric.try_pass(n, u64::MAX / 2).is_pass());
                            }
                            let t1 = clock.now_millis();
                            *mine.entry((start(t0), start(t1))).or_default() += n;
                            i += 1;
                        }
                        mine
                    })
                })
                .collect();
            // Move the clock across 3 intervals, 1 ms at a time, sometimes
            // jumping a whole interval and more (every slot reused at once).
            for step in 0..3 * interval {
                if step % 23 == 22 {
                    clock.advance(Duration::from_millis(interval + 3));
                } else {
                    clock.advance(Duration::from_millis(1));
                }
                pause(Duration::from_micros(200));
            }
            stop.store(true, Ordering::Relaxed);
            writers.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for mine in recorded {
            for (key, n) in mine {
                *all.entry(key).or_default() += n;
            }
        }

        // The clock is frozen now; check the window it shows.
        let now = clock.now_millis();
        let newest = start(now);
        let in_window = |b: u64| b <= newest && newest - b < interval;
        let sum = |keep: &dyn Fn(u64, u64) -> bool| -> u64 {
            all.iter()
                .filter(|&(&(s0, s1), _)| keep(s0, s1))
                .map(|(_, n)| n)
                .sum()
        };
        let details = metric.details();
        for node in &details {
            assert!(
                in_window(node.timestamp_ms),
                "bucket {} listed at {now} ms",
                node.timestamp_ms
            );
        }
        // Every bucket of the window, listed or not (an unlisted bucket
        // holds nothing).
        for back in 0..sample_count {
            let Some(b) = newest.checked_sub(back * len) else {
                break;
            };
            let pass = details
                .iter()
                .find(|n| n.timestamp_ms == b)
                .map_or(0, |n| n.pass);
            let certain = sum(&|s0, s1| s0 == b && s1 == b);
            let possible = sum(&|s0, s1| s0 <= b && b <= s1);
            assert!(
                certain <= pass && pass <= possible,
                "bucket {b} holds {pass} passes, expected {certain}..={possible} \
                 (round {rounds}, at {now} ms)"
            );
        }
        let window_certain = sum(&|s0, _| in_window(s0));
        let window_possible = sum(&|_, s1| in_window(s1));
        let pass = metric.pass();
        assert!(
            window_certain <= pass && pass <= window_possible,
            "window holds {pass} passes, expected {window_certain}..={window_possible} \
             (round {rounds}, at {now} ms)"
        );
        checked += window_certain;
        rounds += 1;
        // Passes a whole interval behind the clock can no longer be in any
        // window checked from here on.
        all.retain(|&(_, s1), _| s1 + 2 * interval > newest);
    }
    assert!(
        checked > 0,
        "no pass was ever certainly in a checked window"
    );
}

#[test]
fn moving_clock_admission_never_exceeds_the_limit() {
    // 4 buckets of 5 ms, and the fastest rotation there is: 2 buckets of
    // 1 ms, a slot reused every other clock step.
    admission_under_a_moving_clock(4, 5, 1_000, Duration::from_micros(200), RUN_FOR / 2);
    admission_under_a_moving_clock(2, 1, 300, Duration::from_micros(20), RUN_FOR / 2);
}

fn admission_under_a_moving_clock(
    sample_count: u64,
    len: u64,
    limit: u64,
    step_pause: Duration,
    run_for: Duration,
) {
    let interval = sample_count * len;
    let clock = ManualClock::new(0);
    let metric = ArrayMetric::with_clock(sample_count as usize, interval, clock.clone()).unwrap();

    let stop = AtomicBool::new(false);
    let admitted = AtomicU64::new(0);
    // Final pass count of every bucket, by start.
    let mut history: BTreeMap<u64, u64> = BTreeMap::new();
    let deadline = Instant::now() + run_for;

    thread::scope(|s| {
        for w in 0..THREADS as u64 {
            let (metric, stop, admitted) = (&metric, &stop, &admitted);
            s.spawn(move || {
                let n = 1 + w % 2;
                while !stop.load(Ordering::Relaxed) {
                    if metric.try_pass(n, limit).is_pass() {
                        admitted.fetch_add(n, Ordering::Relaxed);
                    }
                }
            });
        }
        // The only thread that moves the clock. Each time it leaves a
        // bucket it opens the new one (a write of nothing), which seals the
        // older ones: the bucket just left takes no more admissions, and its
        // slot has not been reused (the longest jump lands one slot further
        // on), so its final count is read and recorded.
        let mut step = 0u64;
        let mut current = 0u64;
        while Instant::now() < deadline {
            let jump = if step % 37 == 36 { interval + len } else { 1 };
            clock.advance(Duration::from_millis(jump));
            let now = clock.now_millis();
            if now - now % len != current {
                metric.add_block(0);
                let pass = metric.window_value(current).map_or(0, |b| b.pass());
                history.insert(current, pass);
                current = now - now % len;
            }
            pause(step_pause);
            step += 1;
        }
        stop.store(true, Ordering::Relaxed);
    });
    let now = clock.now_millis();
    let pass = metric.window_value(now - now % len).map_or(0, |b| b.pass());
    history.insert(now - now % len, pass);

    // Every bucket-aligned window: `sample_count` consecutive buckets.
    let first = *history.keys().next().expect("some bucket was opened");
    let last = *history.keys().last().unwrap();
    let mut newest = first;
    while newest <= last {
        let oldest = newest.saturating_sub(interval - len);
        let sum: u64 = history.range(oldest..=newest).map(|(_, p)| p).sum();
        assert!(
            sum <= limit,
            "window ending at bucket {newest} holds {sum} > {limit} \
             ({sample_count} x {len} ms, clock at {now} ms)"
        );
        newest += len;
    }
    let recorded: u64 = history.values().sum();
    assert_eq!(
        recorded,
        admitted.into_inner(),
        "every admission counted once (clock at {now} ms, {} buckets)",
        history.len()
    );
    assert!(history.values().any(|&p| p > 0), "nothing was admitted");
}

/// The minute window is fed by rolling second-window buckets up as the
/// second window reuses their slots. With the clock moving through many
/// reuses (but less than a minute, so nothing leaves the minute window),
/// a reader summing the minute window concurrently never sees more passes
/// than were recorded and never sees the total go down, and at the end it
/// holds every pass exactly once.
#[test]
fn minute_window_roll_up_counts_every_pass_once() {
    let clock = ManualClock::new(0);
    let node = StatisticNode::with_clock(clock.clone());
    let recorded = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let writers = 2;
    let barrier = Barrier::new(writers + 2);

    thread::scope(|scope| {
        for _ in 0..writers {
            scope.spawn(|| {
                barrier.wait();
                while !stop.load(Ordering::Relaxed) {
                    // Counted before it is recorded: `recorded` is an upper
                    // bound on what a reader can see.
                    recorded.fetch_add(1, Ordering::SeqCst);
                    node.add_pass_request(1);
                }
            });
        }
        scope.spawn(|| {
            barrier.wait();
            let mut last = 0;
            while !stop.load(Ordering::Relaxed) {
                let seen = node.total_pass();
                let upper = recorded.load(Ordering::SeqCst);
                assert!(
                    seen <= upper,
                    "read {seen} passes, only {upper} recorded (at {} ms)",
                    clock.now_millis()
                );
                assert!(
                    seen >= last,
                    "minute total fell from {last} to {seen} (at {} ms)",
                    clock.now_millis()
                );
                last = seen;
            }
        });
        barrier.wait();
        // 50 s of clock in steps of 37 ms: every slot of the 10 x 100 ms
        // second window is reused dozens of times, all within one minute.
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut t = 0;
        while t < 50_000 && Instant::now() < deadline {
            t += 37;
            clock.set(t);
            pause(Duration::from_micros(200));
        }
        stop.store(true, Ordering::Relaxed);
    });

    let total = recorded.load(Ordering::SeqCst);
    assert!(total > 0, "writers recorded nothing");
    assert_eq!(
        node.total_pass(),
        total,
        "minute window at {} ms",
        clock.now_millis()
    );
}
