//! Model-checked concurrency of the statistics core.
//!
//! Run with `ci/loom.sh` (`RUSTFLAGS="--cfg loom"`): every atomic of the
//! crate then comes from loom (through `src/sync.rs`), and each model below
//! is explored over every interleaving up to the preemption bound.
//!
//! The models are tiny on purpose: two or three threads, two buckets of one
//! millisecond (an interval of 2 ms, so bucket `t` lives in slot `t % 2` and
//! time 2 reuses the slot of time 0), explicit times. To give threads
//! different times on one `ArrayMetric`, [`ThreadClock`] reads a loom
//! thread-local that each thread sets before it starts.
//!
//! At most one thread of a model can ever be waiting for the rotation lock.
//! A waiter yields, and loom 0.7 makes a yielded thread runnable again as
//! soon as any other thread runs, without charging a preemption; two waiters
//! can then hand the processor back and forth forever while the lock holder
//! never runs, and the model exceeds loom's branch limit. (Real schedulers
//! do run the holder.) So the three-thread models admit on a bucket the
//! model's own thread opened beforehand, and the races to open buckets are
//! between two threads.

#![cfg(loom)]

use std::cell::Cell;

use loom::sync::Arc;
use loom::thread;
use tower_sliding_window::clock::Clock;
use tower_sliding_window::flow::TryPass;
use tower_sliding_window::stat::{ArrayMetric, BucketLeapArray, MetricBucket};

loom::thread_local! {
    static NOW: Cell<u64> = Cell::new(0);
}

/// A clock whose reading is per thread: see [`at`].
#[derive(Debug, Clone, Copy)]
struct ThreadClock;

impl Clock for ThreadClock {
    fn now_millis(&self) -> u64 {
        NOW.with(Cell::get)
    }
}

/// Sets the calling thread's time.
fn at(ms: u64) {
    NOW.with(|now| now.set(ms));
}

/// Two buckets of 1 ms.
fn metric() -> Arc<ArrayMetric> {
    Arc::new(ArrayMetric::with_clock(2, 2, ThreadClock).expect("valid window"))
}

fn ring() -> Arc<BucketLeapArray> {
    Arc::new(BucketLeapArray::new(2, 2).expect("valid window"))
}

fn window_pass(ring: &BucketLeapArray, now: u64) -> u64 {
    ring.values(now).map(MetricBucket::pass).sum()
}

/// (a) Adds racing with a rotation. Slot 0 holds the bucket at 0 with 5
/// passes. One thread writes at time 2, which reuses slot 0 (a writer of the
/// new window); another writes at time 0, late, into the old window; the
/// model's own thread reads the window at 2 meanwhile.
///
/// The new window's writer is never lost; the late write is counted at most
/// once (in the old window, which has expired, or in the new one); the old
/// window's 5 never leak into the new one, not even to a concurrent reader.
#[test]
fn add_during_rotation() {
    loom::model(|| {
        let ring = ring();
        ring.current_window(0).value().add_pass(5);

        let new_writer = {
            let ring = Arc::clone(&ring);
            thread::spawn(move || ring.current_window(2).value().add_pass(1))
        };
        let late_writer = {
            let ring = Arc::clone(&ring);
            thread::spawn(move || ring.current_window(0).value().add_pass(1))
        };

        let seen = window_pass(&ring, 2);
        assert!(seen <= 2, "a reader at 2 ms saw {seen} passes");

        new_writer.join().unwrap();
        late_writer.join().unwrap();

        let wrap = ring.current_window(2);
        assert_eq!(wrap.window_start(), 2, "slot 0 holds the window at 2");
        let pass = window_pass(&ring, 2);
        assert!(
            pass == 1 || pass == 2,
            "window at 2 ms: {pass} passes, expected the new writer's 1 plus \
             at most the late one"
        );
        assert!(ring.window_value(0).is_none(), "the bucket at 0 is gone");
    });
}

/// (a') The same race through `ArrayMetric`, whose rotation also resets the
/// admission bookkeeping of the pass word: the new window's writer is never
/// lost and nothing is double counted.
#[test]
fn add_during_rotation_array_metric() {
    loom::model(|| {
        let metric = metric();
        at(0);
        metric.add_pass(5);

        let new_writer = {
            let metric = Arc::clone(&metric);
            thread::spawn(move || {
                at(2);
                metric.add_pass(1);
                metric.add_block(1);
            })
        };
        let late_writer = {
            let metric = Arc::clone(&metric);
            thread::spawn(move || {
                at(0);
                metric.add_pass(1);
            })
        };
        new_writer.join().unwrap();
        late_writer.join().unwrap();

        at(2);
        let pass = metric.pass();
        assert!(
            pass == 1 || pass == 2,
            "window at 2 ms: {pass} passes (new writer 1, late writer at most 1)"
        );
        assert_eq!(metric.block(), 1, "window at 2 ms");
    });
}

/// (b) Two threads open the same new bucket at once (Sentinel resets it
/// twice without a re-check, alibaba/Sentinel#2230): both adds are counted,
/// and the old bucket's passes are not.
#[test]
fn two_threads_open_the_same_bucket() {
    loom::model(|| {
        let ring = ring();
        ring.current_window(0).value().add_pass(5);

        let handles: Vec<_> = (0..2)
            .map(|_| {
                let ring = Arc::clone(&ring);
                thread::spawn(move || {
                    let wrap = ring.current_window(2);
                    assert_eq!(wrap.window_start(), 2);
                    wrap.value().add_pass(1);
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(window_pass(&ring, 2), 2, "window at 2 ms");
        assert_eq!(ring.window_value(2).map(MetricBucket::pass), Some(2));
    });
}

/// (b') The same through `ArrayMetric`, on a slot never used before (the
/// first opening at time 1) and on a reused one (time 2).
#[test]
fn two_threads_open_the_same_bucket_array_metric() {
    for t in [1, 2] {
        loom::model(move || {
            let metric = metric();
            at(0);
            metric.add_pass(5);

            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let metric = Arc::clone(&metric);
                    thread::spawn(move || {
                        at(t);
                        metric.add_pass(1);
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            at(t);
            // At 1 the window also holds the bucket at 0 (5 passes).
            let expected = if t == 1 { 7 } else { 2 };
            assert_eq!(metric.pass(), expected, "window at {t} ms");
        });
    }
}

/// (c) Admission at the limit with a frozen time. Three callers, with room
/// for two under the limit, on a bucket that is already open (with and
/// without a pass in the older bucket of the window): exactly two are
/// admitted, and the window then holds exactly `limit` passes, never more
/// and never fewer.
#[test]
fn admission_at_the_limit_with_a_frozen_clock() {
    for prefilled in [0, 1] {
        loom::model(move || {
            let limit = 2 + prefilled;
            let metric = metric();
            at(0);
            metric.add_pass(prefilled);
            at(1);
            metric.add_pass(0); // opens the bucket at 1
            let handles: Vec<_> = (0..3)
                .map(|_| {
                    let metric = Arc::clone(&metric);
                    thread::spawn(move || {
                        at(1);
                        metric.try_pass(1, limit).is_pass()
                    })
                })
                .collect();
            let admitted = handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .filter(|&passed| passed)
                .count() as u64;
            at(1);
            assert_eq!(admitted, 2, "admitted at 1 ms, {prefilled} already in");
            assert_eq!(metric.pass(), limit, "window at 1 ms");
        });
    }
}

/// (c') The same while the callers also race to open the bucket: two
/// callers, limit 1, on a fresh slot and on a slot holding an older bucket
/// (whose pass counts: the window at 1 holds the buckets at 0 and 1).
#[test]
fn admission_at_the_limit_while_opening_the_bucket() {
    for prefilled in [0, 1] {
        loom::model(move || {
            let limit = 1 + prefilled;
            let metric = metric();
            at(0);
            metric.add_pass(prefilled);
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let metric = Arc::clone(&metric);
                    thread::spawn(move || {
                        at(1);
                        metric.try_pass(1, limit)
                    })
                })
                .collect();
            let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            let admitted = results.iter().filter(|r| r.is_pass()).count();
            at(1);
            assert_eq!(admitted, 1, "admitted at 1 ms: {results:?}");
            assert_eq!(metric.pass(), limit, "window at 1 ms");
        });
    }
}

/// (d) Admission by threads whose times straddle bucket boundaries, limit 1.
/// A asks at 0; B asks at 1 and then at 2 (the bucket at 2 reuses A's slot).
///
/// Any window that holds two admissions is over the limit, so:
/// - A's and B's first request never both pass: the window at 1 holds the
///   buckets at 0 and 1, and an A that runs after bucket 1 opened is moved
///   forward to it;
/// - B's two requests never both pass: the window at 2 holds the buckets at
///   1 and 2;
/// - the window at the newest time never holds more than the limit, and
///   holds B's admission if there was one.
#[test]
fn admission_straddling_a_boundary() {
    loom::model(|| {
        let metric = metric();
        let a = {
            let metric = Arc::clone(&metric);
            thread::spawn(move || {
                at(0);
                metric.try_pass(1, 1).is_pass()
            })
        };
        let b = {
            let metric = Arc::clone(&metric);
            thread::spawn(move || {
                at(1);
                let first = metric.try_pass(1, 1).is_pass();
                at(2);
                let second = metric.try_pass(1, 1).is_pass();
                (first, second)
            })
        };
        let a = a.join().unwrap();
        let (b1, b2) = b.join().unwrap();

        assert!(!(a && b1), "A (0 ms) and B (1 ms) both passed");
        assert!(!(b1 && b2), "B at 1 ms and at 2 ms both passed");
        at(2);
        let pass = metric.pass();
        assert!(pass <= 1, "window at 2 ms holds {pass} passes");
        // B's admissions land in buckets 1 or 2, both in the window at 2;
        // A's may too, if A was moved forward.
        assert!(
            pass >= u64::from(b1 || b2),
            "window at 2 ms lost B's admission"
        );
    });
}
/// (d') Two callers straddling a boundary with no slot reuse: exactly one of
/// them passes, and the window at the newer time holds exactly that pass.
#[test]
fn admission_straddling_a_boundary_exactly_one_passes() {
    loom::model(|| {
        let metric = metric();
        let ask = |t: u64| {
            let metric = Arc::clone(&metric);
            thread::spawn(move || {
                at(t);
                metric.try_pass(1, 1).is_pass()
            })
        };
        let (a, b) = (ask(0), ask(1));
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert!(
            a != b,
            "exactly one of A (0 ms) and B (1 ms) passes: {a} {b}"
        );
        at(1);
        assert_eq!(metric.pass(), 1, "window at 1 ms");
    });
}

/// (e) A `StatisticNode`'s minute window is fed by rolling second-window
/// buckets up as their slots are reused. A late writer adds to the bucket
/// being rolled up: its pass lands before the roll-up or after it, and is
/// counted exactly once either way.
#[test]
fn roll_up_with_a_late_writer() {
    loom::model(|| {
        let node = node();
        at(0);
        node.add_pass_request(5);

        // Opens the slot of the bucket at 0 for the window at 2 ms, rolling
        // the bucket at 0 up into second 0 of the minute window.
        let new_writer = {
            let node = Arc::clone(&node);
            thread::spawn(move || {
                at(2);
                node.add_pass_request(1);
            })
        };
        // Still writing at 0 ms.
        at(0);
        node.add_pass_request(1);
        new_writer.join().unwrap();

        // All seven passes fall in second 0 of the minute window.
        at(2);
        assert_eq!(node.total_pass(), 7, "minute window at 2 ms");
    });
}

/// (e') A reader sums the minute window while a bucket is rolled up: it
/// never sees the bucket twice (in the second window and in the minute) or
/// in neither place.
#[test]
fn roll_up_with_a_reader() {
    loom::model(|| {
        let node = node();
        at(0);
        node.add_pass_request(5);

        let new_writer = {
            let node = Arc::clone(&node);
            thread::spawn(move || {
                at(2);
                node.add_pass_request(1);
            })
        };
        at(2);
        let seen = node.total_pass();
        assert!(
            seen == 5 || seen == 6,
            "minute window at 2 ms read {seen} passes; 5, then 6, were recorded"
        );
        new_writer.join().unwrap();
        assert_eq!(node.total_pass(), 6, "minute window at 2 ms");
    });
}

/// (f) A matured reservation is never dropped. Quota reserved for the
/// bucket at 1 ms waits in the reservation ring's slot 1. At 1 ms one
/// thread admits (opening the bucket at 1, which starts with the 2 reserved
/// passes), while another reserves for the bucket at 3, which reuses that
/// reservation slot: before dropping the old reservation it opens the bucket
/// at 1 if nobody has (lock order: reservation ring, then the admission
/// ring). Either way the 2 reserved passes are counted exactly once.
#[test]
fn a_matured_reservation_survives_its_slot_being_reused() {
    loom::model(|| {
        let metric = Arc::new(ArrayMetric::occupiable(2, 2, ThreadClock).expect("valid window"));
        at(0);
        metric.add_waiting(1, 2);

        let admitter = {
            let metric = Arc::clone(&metric);
            thread::spawn(move || {
                at(1);
                metric.try_pass(1, 3)
            })
        };
        let reserver = {
            let metric = Arc::clone(&metric);
            thread::spawn(move || {
                at(1);
                metric.add_waiting(3, 1);
            })
        };
        let admission = admitter.join().unwrap();
        reserver.join().unwrap();

        at(1);
        assert!(admission.is_pass(), "{admission:?} at 1 ms");
        assert_eq!(admission.window_pass(), 3, "at 1 ms");
        assert_eq!(metric.pass(), 3, "window at 1 ms: 2 reserved + 1 admitted");
        assert_eq!(metric.waiting(), 1, "reserved for 3 ms, seen at 1 ms");
    });
}

/// A node whose second window is two buckets of 1 ms.
fn node() -> Arc<tower_sliding_window::stat::StatisticNode> {
    Arc::new(
        tower_sliding_window::stat::StatisticNode::with_second_window(ThreadClock, 2, 2)
            .expect("valid window"),
    )
}

/// `max_concurrency`'s reservation: two threads each take the one place,
/// check the gauge, give it back, and try once more. The gauge never passes
/// the limit and every place taken is given back.
#[test]
fn concurrency_reservation_never_exceeds_the_limit() {
    loom::model(|| {
        let node = node();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let node = Arc::clone(&node);
                thread::spawn(move || {
                    let mut taken = 0;
                    for _ in 0..2 {
                        if node.try_increase_concurrency(1) {
                            taken += 1;
                            assert_eq!(node.cur_concurrency(), 1, "over the limit");
                            node.decrease_concurrency();
                        }
                    }
                    taken
                })
            })
            .collect();
        let taken: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(taken >= 1, "no attempt got the free place");
        assert_eq!(node.cur_concurrency(), 0, "a place was not given back");
    });
}

/// Two places, three threads racing for them with no release: exactly two
/// win.
#[test]
fn concurrency_reservation_two_places_two_winners() {
    loom::model(|| {
        let node = node();
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let node = Arc::clone(&node);
                thread::spawn(move || node.try_increase_concurrency(2))
            })
            .collect();
        let winners = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|&won| won)
            .count();
        assert_eq!(winners, 2);
        assert_eq!(node.cur_concurrency(), 2);
    });
}

/// What the pacer models share: a pacer's turns `COST` ns apart, asked for
/// at `NOW`, with room for every caller of a model.
mod pacing {
    use std::time::Duration;

    pub(crate) use tower_sliding_window::flow::Pacer;
    use tower_sliding_window::flow::Turn;

    pub(crate) const COST: u64 = 10;
    const NOW: u64 = 1_000;

    /// The next turn of `pacer`.
    pub(crate) fn turn(pacer: &Pacer) -> u64 {
        match pacer.reserve(NOW, COST, Duration::from_nanos(100)) {
            Turn::Wait { at_ns, .. } => at_ns,
            Turn::Refuse { .. } => panic!("room for every caller"),
        }
    }
}

/// The pacer's turn reservation: two callers at the same time, with room
/// for both, get two distinct turns one `cost` apart (never a shared turn,
/// never a skipped one); a third caller that gives its turn back while it is
/// still the latest hands that very turn to the next caller.
#[test]
fn pacer_turns_are_distinct_and_consecutive() {
    use pacing::{turn, Pacer, COST};

    loom::model(|| {
        let pacer = Arc::new(Pacer::new());
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let pacer = Arc::clone(&pacer);
                thread::spawn(move || turn(&pacer))
            })
            .collect();
        let mut turns: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        turns.sort_unstable();
        assert_eq!(turns, [1_000, 1_010]);
        let third = turn(&pacer);
        assert_eq!(third, 1_020);
        assert!(pacer.give_back(third, COST));
        assert_eq!(turn(&pacer), 1_020);
    });
}

/// A caller that gives its turn back while another takes one: the turns
/// that end up used are distinct and at least one `cost` apart, whichever
/// way the give-back and the reservation interleave (the given-back turn is
/// either handed on or left unused, never handed to two callers).
#[test]
fn pacer_give_back_racing_a_reservation() {
    use pacing::{turn, Pacer, COST};

    loom::model(|| {
        let pacer = Arc::new(Pacer::new());
        let leaver = {
            let pacer = Arc::clone(&pacer);
            thread::spawn(move || {
                let mine = turn(&pacer);
                (mine, pacer.give_back(mine, COST))
            })
        };
        let stayer = {
            let pacer = Arc::clone(&pacer);
            thread::spawn(move || turn(&pacer))
        };
        let (left, handed_on) = leaver.join().unwrap();
        let mut used = vec![stayer.join().unwrap(), turn(&pacer)];
        if !handed_on {
            // Not given back: it stays taken (unused, but it still counts
            // as spacing for the others).
            used.push(left);
        }
        used.sort_unstable();
        for pair in used.windows(2) {
            assert!(pair[1] >= pair[0] + COST, "turns {used:?} too close");
        }
    });
}

/// The last holder of a turn leaves (giving back the latest turn, with an
/// earlier one already a hole) while a caller arrives: whichever way they
/// interleave, the turns used are at least one `cost` apart, and once
/// everyone has left the next caller is spaced from the latest used turn
/// only, as if nobody had queued.
#[test]
fn pacer_last_waiter_leaving_races_an_arrival() {
    use pacing::{turn, Pacer, COST};

    loom::model(|| {
        let pacer = Arc::new(Pacer::new());
        let first = turn(&pacer);
        pacer.used(first);
        let hole = turn(&pacer);
        let last = turn(&pacer);
        assert!(!pacer.give_back(hole, COST));
        let leaver = {
            let pacer = Arc::clone(&pacer);
            thread::spawn(move || {
                pacer.give_back(last, COST);
                let again = turn(&pacer);
                pacer.used(again);
                again
            })
        };
        let arrival = {
            let pacer = Arc::clone(&pacer);
            thread::spawn(move || {
                let mine = turn(&pacer);
                pacer.used(mine);
                mine
            })
        };
        let mut used = vec![first, leaver.join().unwrap(), arrival.join().unwrap()];
        used.sort_unstable();
        for pair in used.windows(2) {
            assert!(pair[1] >= pair[0] + COST, "turns {used:?} too close");
        }
        assert_eq!(turn(&pacer), used[2] + COST, "used {used:?}");
    });
}

/// Two callers take turns and give them back while a third takes one and
/// uses it: a caller that arrives when nobody is present may move the
/// latest turn back, and it must never do so over a turn someone else
/// took meanwhile (the same value of `latest` can come back after a turn is
/// given back).
#[test]
fn pacer_reclaiming_holes_never_overwrites_a_promised_turn() {
    use pacing::{turn, Pacer, COST};

    loom::model(|| {
        let pacer = Arc::new(Pacer::new());
        let first = turn(&pacer);
        pacer.used(first);
        let hole = turn(&pacer);
        let last = turn(&pacer);
        assert!(!pacer.give_back(hole, COST));
        pacer.give_back(last, COST);
        // Nobody present, `latest` past a hole.
        let flaky = {
            let pacer = Arc::clone(&pacer);
            thread::spawn(move || {
                let mine = turn(&pacer);
                pacer.give_back(mine, COST);
            })
        };
        let keeper = {
            let pacer = Arc::clone(&pacer);
            thread::spawn(move || {
                let mine = turn(&pacer);
                pacer.used(mine);
                mine
            })
        };
        flaky.join().unwrap();
        let kept = keeper.join().unwrap();
        assert!(kept >= first + COST, "{kept} too close to {first}");
        let next = turn(&pacer);
        assert_eq!(next, kept + COST);
    });
}

/// Two callers arrive at a pacer nobody is present at: each may find
/// itself alone and move `latest` back to one `cost` after the latest used
/// turn. Neither may do so over the turn the other just took: the two used
/// turns are distinct and one `cost` apart, and the next caller follows
/// the later one.
#[test]
fn pacer_two_arrivals_at_an_empty_pacer_get_distinct_turns() {
    use pacing::{turn, Pacer, COST};

    loom::model(|| {
        let pacer = Arc::new(Pacer::new());
        let first = turn(&pacer);
        pacer.used(first);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let pacer = Arc::clone(&pacer);
                thread::spawn(move || {
                    let mine = turn(&pacer);
                    pacer.used(mine);
                    mine
                })
            })
            .collect();
        let mut used: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        used.sort_unstable();
        assert_eq!(used, [first + COST, first + 2 * COST]);
        assert_eq!(turn(&pacer), first + 3 * COST);
    });
}

/// A breaker opened at 0 ms for 10 ms, so half-open at 10 ms.
fn half_open_breaker() -> Arc<tower_sliding_window::breaker::CircuitBreaker> {
    use std::time::Duration;
    use tower_sliding_window::breaker::{Breaker, CircuitBreaker};

    let rule = Breaker::error_count(0)
        .min_requests(1)
        .open_for(Duration::from_millis(10));
    let breaker = Arc::new(CircuitBreaker::new(rule));
    breaker
        .try_pass(0)
        .expect("closed")
        .complete(0, Duration::ZERO, true);
    breaker
}

/// The probe slot: two requests reach a half-open breaker at once; exactly
/// one is the probe, the other is refused.
#[test]
fn breaker_probe_slot_has_one_winner() {
    loom::model(|| {
        let breaker = half_open_breaker();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let breaker = Arc::clone(&breaker);
                thread::spawn(move || match breaker.try_pass(10) {
                    Ok(permit) => {
                        assert!(permit.is_probe(), "a half-open breaker only probes");
                        // Keep the slot taken until the model ends.
                        std::mem::forget(permit);
                        true
                    }
                    Err(_) => false,
                })
            })
            .collect();
        let probes = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|&won| won)
            .count();
        assert_eq!(probes, 1);
    });
}

/// Two requests reach a half-open breaker; one of them is cancelled right
/// after it was let through (its permit dropped), the other is kept. If the
/// kept one is the probe, no other request probes; otherwise the cancelled
/// one took the slot and must have freed it, so the next request probes.
/// Never two probes, never a breaker stuck half-open.
#[test]
fn breaker_dropped_probe_frees_the_slot() {
    loom::model(|| {
        let breaker = half_open_breaker();
        let cancelled = {
            let breaker = Arc::clone(&breaker);
            thread::spawn(move || {
                if let Ok(permit) = breaker.try_pass(10) {
                    assert!(permit.is_probe());
                    drop(permit);
                }
            })
        };
        let kept = {
            let breaker = Arc::clone(&breaker);
            thread::spawn(move || match breaker.try_pass(11) {
                Ok(permit) => {
                    assert!(permit.is_probe());
                    std::mem::forget(permit);
                    true
                }
                Err(_) => false,
            })
        };
        cancelled.join().unwrap();
        let kept_probe = kept.join().unwrap();
        let next = breaker.try_pass(12);
        if kept_probe {
            assert!(next.is_err(), "two probes out at once");
        } else {
            let permit = next.expect("the cancelled probe freed the slot");
            assert!(permit.is_probe());
            std::mem::forget(permit);
        }
    });
}

/// The probe completes successfully while another request arrives: that
/// request is refused (probe still out) or passes a closed breaker, never
/// becomes a second probe; the breaker ends closed.
#[test]
fn breaker_probe_completion_races_a_request() {
    use std::time::Duration;
    use tower_sliding_window::breaker::BreakerState;

    loom::model(|| {
        let breaker = half_open_breaker();
        let probe = breaker.try_pass(10).expect("the probe");
        assert!(probe.is_probe());
        let other = {
            let breaker = Arc::clone(&breaker);
            thread::spawn(move || match breaker.try_pass(10) {
                Ok(permit) => {
                    assert!(!permit.is_probe(), "a second probe");
                    std::mem::forget(permit);
                }
                Err(wait) => assert_eq!(wait, Duration::ZERO, "half-open, probe out"),
            })
        };
        probe.complete(11, Duration::ZERO, false);
        other.join().unwrap();
        assert_eq!(breaker.state(11), BreakerState::Closed);
    });
}

/// A probe out past its deadline completes successfully while another
/// request finds it overdue: exactly one of them moves the breaker. Either
/// the request failed the probe (the breaker is open again for `open_for`,
/// and the probe's late success closes nothing), or the probe closed it
/// first (the request was refused while it closed, or passed after).
#[test]
fn breaker_overdue_probe_completion_races_the_request_that_fails_it() {
    use std::time::Duration;
    use tower_sliding_window::breaker::BreakerState;

    loom::model(|| {
        let breaker = half_open_breaker();
        let probe = breaker.try_pass(10).expect("the probe");
        // The deadline of an error breaker: max(stat_interval 1 s, open_for).
        let other = {
            let breaker = Arc::clone(&breaker);
            thread::spawn(move || {
                breaker.try_pass(1_010).map(|permit| {
                    assert!(!permit.is_probe(), "a second probe");
                    std::mem::forget(permit);
                })
            })
        };
        probe.complete(1_010, Duration::ZERO, false);
        let other = other.join().unwrap();
        match (other, breaker.state(1_010)) {
            (Err(wait), BreakerState::Open { half_open_in }) => {
                assert_eq!(wait, Duration::from_millis(10));
                assert_eq!(half_open_in, Duration::from_millis(10));
            }
            (Err(wait), BreakerState::Closed) => assert_eq!(wait, Duration::ZERO),
            (Ok(()), BreakerState::Closed) => {}
            outcome => panic!("inconsistent outcome {outcome:?}"),
        }
    });
}

/// An overdue probe is dropped while another request fails it: the slot is
/// freed or the breaker is open again, never both, and never a second
/// probe out at once.
#[test]
fn breaker_overdue_probe_dropped_while_failed() {
    use std::time::Duration;
    use tower_sliding_window::breaker::BreakerState;

    loom::model(|| {
        let breaker = half_open_breaker();
        let probe = breaker.try_pass(10).expect("the probe");
        let other = {
            let breaker = Arc::clone(&breaker);
            thread::spawn(move || match breaker.try_pass(1_010) {
                Ok(permit) => {
                    // The slot was freed first: this request is the probe.
                    assert!(permit.is_probe());
                    std::mem::forget(permit);
                    true
                }
                Err(wait) => {
                    assert_eq!(wait, Duration::from_millis(10), "failed as overdue");
                    false
                }
            })
        };
        drop(probe);
        let probed = other.join().unwrap();
        let state = breaker.state(1_010);
        if probed {
            assert_eq!(state, BreakerState::HalfOpen);
            assert!(breaker.try_pass(1_010).is_err(), "two probes out at once");
        } else {
            assert_eq!(
                state,
                BreakerState::Open {
                    half_open_in: Duration::from_millis(10)
                }
            );
        }
    });
}
