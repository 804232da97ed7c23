//! The lease logic against an exact reference: a model of the admission
//! script (the same arithmetic as `admit.lua`) and of the replicas around
//! it, driven by generated interleavings of requests, script executions,
//! replies delivered in any order, and time. Every admission is placed at
//! the moment it happened (the script's execution for a caller's own pass,
//! the take for a leased pass), and every bucket-aligned window must hold
//! at most the limit.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// The script's arithmetic (`admit.lua`) on one key, `n = 1`.
#[derive(Debug, Default)]
struct Script {
    /// Bucket start (ms) to passes recorded.
    buckets: BTreeMap<u64, u64>,
}

#[derive(Debug, Clone, Copy)]
struct Shape {
    bucket_ms: u64,
    samples: u64,
    strict: bool,
}

impl Shape {
    fn span(&self) -> u64 {
        self.samples + u64::from(self.strict)
    }
}

impl Script {
    /// One call at the server's `now_ms`: `Ok(grant)` when it passed, else
    /// `Err(ms until a pass fits)`.
    fn call(
        &mut self,
        shape: Shape,
        limit: u64,
        (want, rate, lag_us, batch): (u64, u64, u64, u64),
        now_us: u64,
    ) -> Result<Grant, u64> {
        let now_ms = now_us / 1000;
        let bucket = shape.bucket_ms;
        let start = now_ms - now_ms % bucket;
        let oldest = start.saturating_sub((shape.span() - 1) * bucket);
        let first = start.saturating_sub((shape.samples - 1) * bucket);
        self.buckets.retain(|&at, _| at >= oldest);
        let counted: u64 = self.buckets.values().sum();
        let in_window: u64 = self.buckets.range(first..).map(|(_, p)| p).sum();
        if counted + 1 > limit {
            if limit == 0 {
                return Err(u64::MAX);
            }
            let need = counted + 1 - limit;
            let mut freed = 0;
            for (&at, &passes) in &self.buckets {
                freed += passes;
                if freed >= need {
                    return Err(at + shape.span() * bucket - now_ms);
                }
            }
            unreachable!("the counted passes free enough");
        }
        let ends_us = (start + bucket) * 1000 - now_us;
        let cap = (limit / (shape.span() * LEASE_SHARE)).max(1);
        let batch = if ends_us > lag_us { batch } else { 1 };
        let granted = want
            .min(limit - counted)
            .min(cap.min(time_cap(rate, ends_us, lag_us)).max(batch))
            .max(1);
        *self.buckets.entry(start).or_default() += granted;
        Ok(Grant {
            granted,
            bucket_start: start,
            ends_us,
            window_pass: in_window + granted,
            limit,
        })
    }
}

/// A script call in flight.
#[derive(Debug, Clone)]
struct Call {
    replica: usize,
    sent_us: u64,
    /// Passes asked for the pool.
    asked: u64,
    /// 1: the caller waits for its own pass; 0: a refill.
    kept: u64,
    /// What it asks the script: passes, the replica's rate, its lag, the
    /// batch of requests already waiting.
    ask: (u64, u64, u64, u64),
    /// Set when the script has run it: its answer.
    answer: Option<Result<Grant, u64>>,
}

#[derive(Debug, Clone, Copy)]
enum Event {
    /// A request at one replica.
    Request(usize),
    /// The script runs a call in flight (chosen by index).
    Execute(usize),
    /// A reply reaches its replica (chosen by index).
    Deliver(usize),
    /// Time passes, in µs.
    Advance(u64),
}

fn event(replicas: usize) -> impl Strategy<Value = Event> {
    prop_oneof![
        10 => (0..replicas).prop_map(Event::Request),
        3 => any::<usize>().prop_map(Event::Execute),
        3 => any::<usize>().prop_map(Event::Deliver),
        6 => (0u64..200).prop_map(Event::Advance),
        1 => (0u64..20_000).prop_map(Event::Advance),
    ]
}

/// A request's next step at replica `r` (see [`KeyLease::step`]).
#[allow(clippy::too_many_arguments)]
fn request(
    r: usize,
    may_wait: bool,
    now_us: u64,
    lease: &mut KeyLease,
    calls: &mut Vec<Call>,
    run: &mut Run,
    parked: &mut [u64],
    blocked_until: &[u64],
) {
    let (rtt_us, max, lag_us) = run.settings;
    match lease.step(now_us, rtt_us, max, may_wait) {
        Step::Spend(_, refill) => {
            run.admitted.push(now_us);
            if let Some(want) = refill {
                calls.push(Call {
                    replica: r,
                    sent_us: now_us,
                    asked: want,
                    kept: 0,
                    ask: (want, lease.rate(), lag_us, 0),
                    answer: None,
                });
            }
        }
        Step::Wait => parked[r] += 1,
        Step::Ask(ask) if now_us < blocked_until[r] => lease.failed(ask.want - 1),
        Step::Ask(ask) => calls.push(Call {
            replica: r,
            sent_us: now_us,
            asked: ask.want - 1,
            kept: 1,
            ask: (ask.want, lease.rate(), lag_us, ask.batch),
            answer: None,
        }),
    }
}

/// What a run did.
#[derive(Debug, Default)]
struct Run {
    /// Admission times, µs.
    admitted: Vec<u64>,
    leased: u64,
    stranded: u64,
    /// Times of the script's calls, µs.
    round_trips: Vec<u64>,
    /// The replicas' round trip, largest lease and lag.
    settings: (u64, u64, u64),
}

/// Plays `events` on `replicas` replicas sharing one key; the replicas
/// measure `rtt_us`. Returns the admissions and counters, after checking
/// that no bucket holds more admissions than the script recorded in it.
fn play(shape: Shape, limit: u64, rtt_us: u64, replicas: usize, events: &[Event]) -> Run {
    let mut script = Script::default();
    let mut leases = vec![KeyLease::default(); replicas];
    // Each replica refuses without a round trip until this time (µs), as
    // the store does after a refusal.
    let mut blocked_until = vec![0u64; replicas];
    // Requests waiting for a call in flight, per replica.
    let mut parked = vec![0u64; replicas];
    let mut calls: Vec<Call> = Vec::new();
    let mut run = Run::default();
    let mut now_us = 0u64;
    let max = max_lease(limit, shape.span());
    run.settings = (rtt_us, max, lag_us(rtt_us, SERVER_CLOCK_SLACK_US));
    for &event in events {
        let mut woken = None;
        match event {
            Event::Request(r) => {
                leases[r].arrive(now_us);
                run.stranded += leases[r].expire(now_us);
                request(
                    r,
                    true,
                    now_us,
                    &mut leases[r],
                    &mut calls,
                    &mut run,
                    &mut parked,
                    &blocked_until,
                );
            }
            Event::Execute(k) => {
                let waiting: Vec<usize> = (0..calls.len())
                    .filter(|&i| calls[i].answer.is_none())
                    .collect();
                if waiting.is_empty() {
                    continue;
                }
                let call = &mut calls[waiting[k % waiting.len()]];
                // The server reads its clock in whole ms.
                let grant = script.call(shape, limit, call.ask, now_us);
                run.round_trips.push(now_us);
                if let (Ok(_), 1) = (grant, call.kept) {
                    // The caller's own pass: decided, and recorded, now.
                    run.admitted.push(now_us);
                }
                call.answer = Some(grant);
            }
            Event::Deliver(k) => {
                let done: Vec<usize> = (0..calls.len())
                    .filter(|&i| calls[i].answer.is_some())
                    .collect();
                if done.is_empty() {
                    continue;
                }
                let call = calls.remove(done[k % done.len()]);
                woken = Some(call.replica);
                let lease = &mut leases[call.replica];
                match call.answer.expect("answered") {
                    Ok(grant) => {
                        run.leased += grant.granted - call.kept;
                        run.stranded += lease.granted(
                            call.asked,
                            call.kept,
                            grant,
                            (call.sent_us, now_us, slack_us(grant.ends_us)),
                        );
                    }
                    Err(wait_ms) => {
                        lease.failed(call.asked);
                        // The store remembers a refusal of a caller's own
                        // pass (not a refill's: the pool may hold passes),
                        // from the time its call was sent.
                        if call.kept == 0 {
                            continue;
                        }
                        let until = call.sent_us.saturating_add(wait_ms.saturating_mul(1000));
                        blocked_until[call.replica] = blocked_until[call.replica].max(until);
                    }
                }
            }
            Event::Advance(us) => now_us += us,
        }
        // A reply wakes the requests waiting at its replica: each takes
        // its next step (and may wait again for a call still in flight).
        if let Some(r) = woken.take() {
            for _ in 0..std::mem::take(&mut parked[r]) {
                leases[r].woken();
                run.stranded += leases[r].expire(now_us);
                request(
                    r,
                    true,
                    now_us,
                    &mut leases[r],
                    &mut calls,
                    &mut run,
                    &mut parked,
                    &blocked_until,
                );
            }
        }
    }
    // Every recorded bucket holds at least the admissions made in it.
    let mut made: BTreeMap<u64, u64> = BTreeMap::new();
    for &at in &run.admitted {
        *made
            .entry(at / 1000 / shape.bucket_ms * shape.bucket_ms)
            .or_default() += 1;
    }
    let recorded_since = script.buckets.keys().next().copied().unwrap_or(u64::MAX);
    for (start, admissions) in made.range(recorded_since..) {
        let recorded = script.buckets.get(start).copied().unwrap_or(0);
        assert!(
            *admissions <= recorded,
            "bucket {start}: {admissions} admissions, {recorded} recorded"
        );
    }
    run
}

/// The most admissions any bucket-aligned window of `buckets` buckets
/// holds.
fn busiest_window(admitted: &[u64], bucket_ms: u64, buckets: u64) -> u64 {
    let mut per_bucket: BTreeMap<u64, u64> = BTreeMap::new();
    for &at in admitted {
        *per_bucket.entry(at / 1000 / bucket_ms).or_default() += 1;
    }
    per_bucket
        .keys()
        .map(|&first| {
            per_bucket
                .range(first..first + buckets)
                .map(|(_, n)| n)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

fn shape() -> impl Strategy<Value = Shape> {
    (
        prop_oneof![Just(10u64), Just(20), Just(50)],
        1u64..5,
        any::<bool>(),
    )
        .prop_map(|(bucket_ms, samples, strict)| Shape {
            bucket_ms,
            samples,
            strict,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn no_bucket_aligned_window_holds_more_than_the_limit(
        shape in shape(),
        limit in prop_oneof![1u64..10, 64u64..400, 400u64..1500],
        rtt_us in prop_oneof![Just(0u64), 100u64..2_000, 2_000u64..40_000],
        replicas in 1usize..4,
        events in prop::collection::vec(event(3), 1..4000),
    ) {
        let events: Vec<Event> = events
            .into_iter()
            .map(|e| match e {
                Event::Request(r) => Event::Request(r % replicas),
                other => other,
            })
            .collect();
        let run = play(shape, limit, rtt_us, replicas, &events);
        let busiest = busiest_window(&run.admitted, shape.bucket_ms, shape.samples);
        prop_assert!(busiest <= limit, "{busiest} admissions in one window, limit {limit}");
        if shape.strict {
            let busiest = busiest_window(&run.admitted, shape.bucket_ms, shape.span());
            prop_assert!(busiest <= limit, "strict: {busiest} in span buckets, limit {limit}");
        }
    }
}

/// Three replicas, each with a steady stream of requests (one every
/// `gap_us`), the script answering after `rtt_us / 2` and the reply
/// arriving `rtt_us / 2` later: a deterministic schedule.
fn steady(shape: Shape, limit: u64, rtt_us: u64, gap_us: u64, total_us: u64) -> Run {
    let mut events = Vec::new();
    let step = 50u64;
    let mut since_request = [0u64, gap_us / 3, 2 * gap_us / 3];
    let mut elapsed = 0;
    // Calls sent, as (time sent): each is executed and delivered in order.
    let mut sent: Vec<u64> = Vec::new();
    let mut executed: Vec<u64> = Vec::new();
    while elapsed < total_us {
        for (r, since) in since_request.iter_mut().enumerate() {
            *since += step;
            if *since >= gap_us {
                *since -= gap_us;
                events.push(Event::Request(r));
                sent.push(elapsed);
            }
        }
        // Any call sent `rtt/2` ago runs; any run `rtt/2` ago is answered.
        // (More calls are recorded than made, the extras find nothing to
        // run or deliver and are no-ops.)
        while sent.first().is_some_and(|&t| t + rtt_us / 2 <= elapsed) {
            events.push(Event::Execute(0));
            executed.push(sent.remove(0));
        }
        while executed.first().is_some_and(|&t| t + rtt_us <= elapsed) {
            events.push(Event::Deliver(0));
            executed.remove(0);
        }
        events.push(Event::Advance(step));
        elapsed += step;
    }
    play(shape, limit, rtt_us, 3, &events)
}

#[test]
fn steady_overload_on_three_replicas_admits_at_least_95_percent_in_few_round_trips() {
    // 10 buckets of 100 ms, 20 000 a second; each replica sees a request
    // every 100 µs (30 000 a second in all: 1.5 x the limit).
    let shape = Shape {
        bucket_ms: 100,
        samples: 10,
        strict: false,
    };
    let limit = 20_000;
    let seconds = 4;
    let run = steady(shape, limit, 400, 100, seconds * 1_000_000);
    // The first second fills the window; count the last three.
    let admitted = run.admitted.iter().filter(|&&at| at >= 1_000_000).count() as u64;
    let per_window = admitted as f64 / (seconds - 1) as f64;

    assert!(
        per_window >= 0.95 * limit as f64,
        "admitted {per_window} per window, limit {limit}"
    );
    assert!(busiest_window(&run.admitted, 100, 10) <= limit);
    assert!(run.leased > 0, "the hot key leased");
    // Round trips of the last three seconds (the first 100 ms tick has no
    // rate yet: every request asks for one pass).
    let trips = run
        .round_trips
        .iter()
        .filter(|&&at| at >= 1_000_000)
        .count();
    let per_admission = trips as f64 / admitted as f64;
    assert!(
        per_admission <= 0.05,
        "{per_admission} round trips per admission"
    );
}

#[test]
fn a_key_seen_once_a_second_asks_for_one_pass_whatever_the_round_trip() {
    let mut lease = KeyLease::default();
    for second in 0..20u64 {
        // Up to two arrivals in one tick: a request a second, with jitter.
        lease.arrive(second * 1_000_000 + 99_999);
        lease.arrive(second * 1_000_000 + 100_000);
        for rtt_us in [0, 100, 10_000, 100_000, 10_000_000] {
            let mut probe = lease.clone();
            assert_eq!(asks(&mut probe, rtt_us, 1_000_000), 1, "rtt {rtt_us} µs");
            assert_eq!(probe.refill(rtt_us, 1_000_000), None);
        }
    }
}

#[test]
fn a_hot_key_asks_for_what_it_expects_to_need_and_no_more_than_the_cap() {
    let mut lease = KeyLease::default();
    // 1 000 arrivals in one tick, then a request in the next.
    for i in 0..1_000 {
        lease.arrive(i * 100);
    }
    lease.arrive(TICK_US);
    // 16 round trips of 250 µs: 4 ms of a 100 ms tick of 1 000 arrivals.
    assert_eq!(asks(&mut lease.clone(), 250, 1_000), 40);
    assert_eq!(asks(&mut lease.clone(), 250, 25), 25, "capped");
    assert_eq!(
        asks(&mut lease.clone(), 250, 1),
        1,
        "a small limit never leases"
    );
    // The cover time is at most 1/8 of a tick.
    assert_eq!(asks(&mut lease.clone(), 1_000_000, 1_000), 125);
    // What is asked for is counted against the next ask (that does not
    // wait for it).
    assert_eq!(asks(&mut lease, 250, 1_000), 40);
    assert_eq!(asks(&mut lease, 250, 1_000), 1);
}

/// The passes a request that finds the pool empty asks for, when it may
/// not wait.
fn asks(lease: &mut KeyLease, rtt_us: u64, max_lease: u64) -> u64 {
    match lease.step(0, rtt_us, max_lease, false) {
        Step::Ask(ask) => ask.want,
        other => panic!("{other:?}"),
    }
}

#[test]
fn requests_that_wait_for_a_call_in_flight_are_decided_by_the_next_call_together() {
    let mut lease = KeyLease::default();
    let Step::Ask(first) = lease.step(0, 100, 1, true) else {
        panic!("the first request asks");
    };
    assert_eq!((first.want, first.batch), (1, 1));
    // Five more arrive while it is in flight: they wait.
    for _ in 0..5 {
        assert_eq!(lease.step(0, 100, 1, true), Step::Wait);
    }
    let grant = Grant {
        granted: 1,
        bucket_start: 0,
        ends_us: 50_000,
        window_pass: 1,
        limit: 100,
    };
    assert_eq!(lease.granted(0, 1, grant, (0, 100, 0)), 0);
    // Woken, the first asks for itself and the four still waiting...
    lease.woken();
    let Step::Ask(batch) = lease.step(100, 100, 1, true) else {
        panic!("a woken request asks");
    };
    assert_eq!((batch.want, batch.batch), (5, 5));
    // ...and the others wait for that call.
    for _ in 0..4 {
        lease.woken();
        assert_eq!(lease.step(100, 100, 1, true), Step::Wait);
    }
    let grant = Grant {
        granted: 5,
        window_pass: 6,
        ..grant
    };
    assert_eq!(lease.granted(4, 1, grant, (100, 200, 0)), 0);
    for _ in 0..4 {
        lease.woken();
        assert!(matches!(
            lease.step(200, 100, 1, true),
            Step::Spend(_, None)
        ));
    }
    assert_eq!(lease.pooled(), 0);
}

#[test]
fn passes_of_an_older_bucket_are_stranded_never_pooled() {
    let grant = |bucket_start, granted| Grant {
        granted,
        bucket_start,
        ends_us: 50_000,
        window_pass: granted,
        limit: 1_000,
    };
    let mut lease = KeyLease::default();
    // A grant of the bucket starting at 200 ms arrives first...
    assert_eq!(
        lease.granted(9, 1, grant(200, 10), (200_000, 201_000, 0)),
        0
    );
    assert_eq!(lease.pooled(), 9);
    // ...then a late one of the bucket before: its passes are not spent.
    assert_eq!(
        lease.granted(9, 1, grant(100, 10), (150_000, 201_000, 0)),
        9
    );
    assert_eq!(lease.pooled(), 9);
    // The same bucket adds up; a newer one strands what is left.
    assert_eq!(lease.granted(4, 1, grant(200, 5), (200_500, 201_000, 0)), 0);
    assert_eq!(lease.pooled(), 13);
    assert_eq!(
        lease.granted(4, 1, grant(300, 5), (300_000, 301_000, 0)),
        13
    );
    assert_eq!(lease.pooled(), 4);
    // The pool is spent only before its deadline (sent + ends).
    assert!(lease.take(349_999).is_some());
    assert_eq!(lease.take(350_000), None);
    assert_eq!(lease.expire(350_000), 3);
}

#[test]
fn a_grant_with_too_little_of_its_bucket_left_is_stranded_at_once() {
    let mut lease = KeyLease::default();
    let grant = Grant {
        granted: 10,
        bucket_start: 0,
        ends_us: 200,
        window_pass: 10,
        limit: 100,
    };
    // 200 µs left on the server, 200 µs of slack: nothing can be spent.
    assert_eq!(lease.granted(9, 1, grant, (0, 0, slack_us(200))), 9);
    assert_eq!(lease.pooled(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Steady streams keep keys hot, so leases are taken all the time, at
    /// every rate relative to the limit.
    #[test]
    fn steady_streams_at_any_rate_never_exceed_the_limit(
        shape in shape(),
        limit in 100u64..20_000,
        rtt_us in 50u64..5_000,
        gap_us in prop_oneof![Just(50u64), 100u64..2_000],
    ) {
        let run = steady(shape, limit, rtt_us, gap_us, 600_000);
        let busiest = busiest_window(&run.admitted, shape.bucket_ms, shape.samples);
        prop_assert!(busiest <= limit, "{busiest} admissions in one window, limit {limit}");
        let busiest = busiest_window(&run.admitted, shape.bucket_ms, shape.span());
        prop_assert!(!shape.strict || busiest <= limit, "strict: {busiest}, limit {limit}");
    }
}

#[test]
fn a_full_table_is_swept_at_most_once_a_tick_and_makes_room_for_keys_gone_idle() {
    use crate::store::redis::identity;

    let mut table = LeaseTable::default();
    let mut stranded = 0;
    for i in 0..MAX_LEASED_KEYS as u64 {
        table
            .get(identity(&i), 0, &mut stranded)
            .expect("room")
            .arrive(0);
    }
    let new = identity(&u64::MAX);
    // Every key is busy: no room, and no second sweep in the same tick.
    assert!(table.get(new, 1, &mut stranded).is_none());
    assert!(table.get(new, TICK_US - 1, &mut stranded).is_none());
    // Two ticks on, the keys are idle: the next sweep makes room.
    assert!(table.get(new, 2 * TICK_US, &mut stranded).is_some());
    assert_eq!(table.keys.len(), 1);
    assert_eq!(stranded, 0);
}
