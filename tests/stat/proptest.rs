//! `ArrayMetric` against a naive model.
//!
//! The model keeps every event in a `Vec` with the time it was recorded. The
//! window at read time `r` is the events whose bucket start lies in
//! `(start(r) - interval, start(r)]`, where `start(t) = t - t % len`; every
//! figure is recomputed from scratch on every read. Random sequences of
//! (time step, operation) are driven through a plain and an occupiable
//! metric and through their models, and **every** read is compared after
//! every step.
//!
//! Times never decrease in the main property. Clocks that step back are
//! covered by a deterministic script and a no-panic, no-inflation property
//! at the end of the file.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use tower_sliding_window::clock::{Clock, ManualClock};
use tower_sliding_window::flow::{Admission, TryPass};
use tower_sliding_window::stat::{ArrayMetric, MetricNode};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Pass,
    Block,
    Success,
    Exception,
    OccupiedPass,
    /// A response time, in microseconds.
    Rt,
}

#[derive(Debug, Clone)]
enum Op {
    Add(Kind, u64),
    /// Reserve `n` passes `ahead` buckets after the current one (1 ..=
    /// sample_count, so never more than one interval ahead, as
    /// `try_occupy_next` reserves), at `offset` ms into that bucket.
    Waiting {
        ahead: u64,
        offset: u64,
        n: u64,
    },
    TryPass {
        n: u64,
        limit: u64,
    },
}

#[derive(Debug, Clone)]
struct Step {
    advance: u64,
    op: Op,
    /// `window_pass` is probed at `start(now) - back * len + offset`.
    probe_back: i64,
    probe_offset: u64,
    /// `time_until_pass(n, limit)` is probed with these.
    quota_n: u64,
    quota_limit: u64,
}

#[derive(Debug, Clone, Copy)]
struct Event {
    time: u64,
    kind: Kind,
    n: u64,
}

/// The naive reference.
#[derive(Debug)]
struct Model {
    len: u64,
    interval: u64,
    occupiable: bool,
    events: Vec<Event>,
    /// `(bucket start, n)` of every reservation.
    reservations: Vec<(u64, u64)>,
    /// Starts of the buckets a write has opened.
    opened: BTreeSet<u64>,
}

impl Model {
    fn new(sample_count: u64, len: u64, occupiable: bool) -> Self {
        Model {
            len,
            interval: sample_count * len,
            occupiable,
            events: Vec::new(),
            reservations: Vec::new(),
            opened: BTreeSet::new(),
        }
    }

    fn start(&self, t: u64) -> u64 {
        t - t % self.len
    }

    /// Whether a bucket starting at `bucket` is in the window at `r`.
    fn in_window(&self, bucket: u64, r: u64) -> bool {
        let newest = self.start(r);
        bucket <= newest && newest - bucket < self.interval
    }

    fn record(&mut self, time: u64, kind: Kind, n: u64) {
        self.opened.insert(self.start(time));
        self.events.push(Event { time, kind, n });
    }

    /// Sum of `kind` over the events of bucket `bucket`; for passes,
    /// reservations for that bucket too.
    fn bucket_sum(&self, bucket: u64, kind: Kind) -> u64 {
        let events: u64 = self
            .events
            .iter()
            .filter(|e| e.kind == kind && self.start(e.time) == bucket)
            .map(|e| e.n)
            .sum();
        let reserved: u64 = if kind == Kind::Pass {
            self.reservations
                .iter()
                .filter(|&&(s, _)| s == bucket)
                .map(|&(_, n)| n)
                .sum()
        } else {
            0
        };
        events + reserved
    }

    /// Every bucket start in the window at `r` that holds anything a read
    /// can see: opened by a write, or reserved (and so matured).
    fn visible_buckets(&self, r: u64) -> Vec<u64> {
        let mut starts: BTreeSet<u64> = self
            .opened
            .iter()
            .copied()
            .filter(|&s| self.in_window(s, r))
            .collect();
        starts.extend(
            self.reservations
                .iter()
                .map(|&(s, _)| s)
                .filter(|&s| self.in_window(s, r)),
        );
        starts.into_iter().collect()
    }

    fn sum(&self, r: u64, kind: Kind) -> u64 {
        self.visible_buckets(r)
            .into_iter()
            .map(|b| self.bucket_sum(b, kind))
            .sum()
    }

    fn max_success(&self, r: u64) -> u64 {
        self.visible_buckets(r)
            .into_iter()
            .map(|b| self.bucket_sum(b, Kind::Success))
            .max()
            .unwrap_or(0)
    }

    fn min_rt(&self, r: u64) -> Option<Duration> {
        self.events
            .iter()
            .filter(|e| e.kind == Kind::Rt && self.in_window(self.start(e.time), r))
            .map(|e| e.n)
            .min()
            .map(Duration::from_micros)
    }

    fn previous(&self, r: u64, kind: Kind) -> u64 {
        match self.start(r).checked_sub(self.len) {
            Some(prev) if self.in_window(prev, r) => self.bucket_sum(prev, kind),
            _ => 0,
        }
    }

    fn window_pass(&self, probe: u64, r: u64) -> u64 {
        let bucket = self.start(probe);
        if self.in_window(bucket, r) {
            self.bucket_sum(bucket, Kind::Pass)
        } else {
            // Only future buckets are probed: never held, never matured.
            assert!(bucket > self.start(r), "probe outside the tested range");
            0
        }
    }

    fn waiting(&self, r: u64) -> u64 {
        self.reservations
            .iter()
            .filter(|&&(s, _)| s > r)
            .map(|&(_, n)| n)
            .sum()
    }

    fn details(&self, r: u64) -> Vec<MetricNode> {
        self.visible_buckets(r)
            .into_iter()
            .map(|b| {
                let success = self.bucket_sum(b, Kind::Success);
                let rt = self.bucket_sum(b, Kind::Rt);
                let mut node = MetricNode::default();
                node.timestamp_ms = b;
                node.pass = self.bucket_sum(b, Kind::Pass);
                node.block = self.bucket_sum(b, Kind::Block);
                node.success = success;
                node.exception = self.bucket_sum(b, Kind::Exception);
                node.occupied_pass = self.bucket_sum(b, Kind::OccupiedPass);
                // The average, raised to the bucket's minimum where it fell
                // below it (successes recorded without their response times):
                // a MetricNode's `rt` is never below the bucket's `min_rt`.
                let min = self
                    .events
                    .iter()
                    .filter(|e| e.kind == Kind::Rt && self.start(e.time) == b)
                    .map(|e| e.n)
                    .min();
                node.rt = (success > 0).then(|| {
                    let avg = Duration::from_nanos(rt * 1000 / success);
                    min.map_or(avg, |min| avg.max(Duration::from_micros(min)))
                });
                node
            })
            .collect()
    }

    /// Brute force: the first `d` such that, with no new events, the window
    /// at `r + d` leaves room for `n`. Reservations still in the future at
    /// `r` are left out (they are passes yet to happen).
    fn time_until_pass(&self, r: u64, n: u64, limit: u64) -> Option<Duration> {
        if n > limit {
            return None;
        }
        let now_start = self.start(r);
        let per_bucket: BTreeMap<u64, u64> = self
            .visible_buckets(r)
            .into_iter()
            .filter(|&b| b <= now_start)
            .map(|b| (b, self.bucket_sum(b, Kind::Pass)))
            .collect();
        (0..=self.interval)
            .find(|&d| {
                let pass: u64 = per_bucket
                    .iter()
                    .filter(|&(&b, _)| self.in_window(b, r + d))
                    .map(|(_, &p)| p)
                    .sum();
                pass + n <= limit
            })
            .map(Duration::from_millis)
    }

    fn apply(&mut self, r: u64, op: &Op) -> Option<Admission> {
        match *op {
            Op::Add(kind, n) => {
                self.record(r, kind, n);
                None
            }
            Op::Waiting { ahead, offset, n } => {
                if self.occupiable {
                    let future = self.start(r) + ahead * self.len + offset;
                    self.reservations.push((self.start(future), n));
                }
                None
            }
            Op::TryPass { n, limit } => {
                let window = self.sum(r, Kind::Pass);
                self.opened.insert(self.start(r));
                if window + n <= limit {
                    self.events.push(Event {
                        time: r,
                        kind: Kind::Pass,
                        n,
                    });
                    Some(Admission::Pass {
                        window_pass: window + n,
                    })
                } else {
                    Some(Admission::Block {
                        window_pass: window,
                    })
                }
            }
        }
    }
}

fn apply(metric: &ArrayMetric, clock: &ManualClock, op: &Op) -> Option<Admission> {
    let len = metric.window_length_ms();
    match *op {
        Op::Add(kind, n) => {
            match kind {
                Kind::Pass => metric.add_pass(n),
                Kind::Block => metric.add_block(n),
                Kind::Success => metric.add_success(n),
                Kind::Exception => metric.add_exception(n),
                Kind::OccupiedPass => metric.add_occupied_pass(n),
                Kind::Rt => metric.add_rt(Duration::from_micros(n)),
            }
            None
        }
        Op::Waiting { ahead, offset, n } => {
            let now = clock.now_millis();
            metric.add_waiting(now - now % len + ahead * len + offset, n);
            None
        }
        Op::TryPass { n, limit } => Some(metric.try_pass(n, limit)),
    }
}

/// Compares every read of `metric` with `model` at the clock's time.
fn compare(
    name: &str,
    step: usize,
    metric: &ArrayMetric,
    model: &Model,
    clock: &ManualClock,
    s: &Step,
) -> Result<(), TestCaseError> {
    let r = clock.now_millis();
    let at = format!("{name}, step {step}, at {r} ms");
    prop_assert_eq!(metric.pass(), model.sum(r, Kind::Pass), "pass, {}", at);
    prop_assert_eq!(metric.block(), model.sum(r, Kind::Block), "block, {}", at);
    prop_assert_eq!(
        metric.success(),
        model.sum(r, Kind::Success),
        "success, {}",
        at
    );
    prop_assert_eq!(
        metric.exception(),
        model.sum(r, Kind::Exception),
        "exception, {}",
        at
    );
    prop_assert_eq!(
        metric.occupied_pass(),
        model.sum(r, Kind::OccupiedPass),
        "occupied_pass, {}",
        at
    );
    prop_assert_eq!(
        metric.rt(),
        Duration::from_micros(model.sum(r, Kind::Rt)),
        "rt, {}",
        at
    );
    prop_assert_eq!(metric.min_rt(), model.min_rt(r), "min_rt, {}", at);
    prop_assert_eq!(
        metric.max_success(),
        model.max_success(r),
        "max_success, {}",
        at
    );
    prop_assert_eq!(
        metric.previous_window_pass(),
        model.previous(r, Kind::Pass),
        "previous_window_pass, {}",
        at
    );
    prop_assert_eq!(
        metric.previous_window_block(),
        model.previous(r, Kind::Block),
        "previous_window_block, {}",
        at
    );
    prop_assert_eq!(metric.waiting(), model.waiting(r), "waiting, {}", at);
    prop_assert_eq!(metric.details(), model.details(r), "details, {}", at);

    let len = model.len;
    let probe = (model.start(r) as i64 - s.probe_back * len as i64 + s.probe_offset as i64).max(0);
    let probe = probe as u64;
    if model.in_window(model.start(probe), r) || model.start(probe) > model.start(r) {
        prop_assert_eq!(
            metric.window_pass(probe),
            model.window_pass(probe, r),
            "window_pass({}), {}",
            probe,
            at
        );
    }
    prop_assert_eq!(
        metric.time_until_pass(s.quota_n, s.quota_limit),
        model.time_until_pass(r, s.quota_n, s.quota_limit),
        "time_until_pass({}, {}), {}",
        s.quota_n,
        s.quota_limit,
        at
    );

    // The ring holds (at least) every bucket a write opened in the window,
    // and nothing outside what a read can see.
    let listed: BTreeSet<u64> = metric.list().iter().map(|w| w.window_start()).collect();
    let visible: BTreeSet<u64> = model.visible_buckets(r).into_iter().collect();
    let opened: BTreeSet<u64> = model
        .opened
        .iter()
        .copied()
        .filter(|&b| model.in_window(b, r))
        .collect();
    prop_assert!(
        opened.is_subset(&listed) && listed.is_subset(&visible),
        "list: opened {:?}, listed {:?}, visible {:?}, {}",
        opened,
        listed,
        visible,
        at
    );
    Ok(())
}

fn op(sample_count: u64, len: u64) -> impl Strategy<Value = Op> {
    let kind = prop_oneof![
        Just(Kind::Pass),
        Just(Kind::Block),
        Just(Kind::Success),
        Just(Kind::Exception),
        Just(Kind::OccupiedPass),
    ];
    prop_oneof![
        4 => (kind, 0..=5u64).prop_map(|(k, n)| Op::Add(k, n)),
        1 => (0..=50_000u64).prop_map(|us| Op::Add(Kind::Rt, us)),
        // At least one: an empty reservation reserves nothing (Sentinel
        // never makes one), and whether it shows up as an empty bucket is
        // not specified.
        2 => (1..=sample_count, 0..len, 1..=4u64)
            .prop_map(|(ahead, offset, n)| Op::Waiting { ahead, offset, n }),
        4 => (0..=4u64, 0..=12u64).prop_map(|(n, limit)| Op::TryPass { n, limit }),
    ]
}

fn step(sample_count: u64, len: u64) -> impl Strategy<Value = Step> {
    let interval = sample_count * len;
    let advance = prop_oneof![
        4 => 0..=len,
        3 => 0..=2 * interval,
        1 => 0..=30 * interval,
    ];
    (
        advance,
        op(sample_count, len),
        -2..=sample_count as i64,
        0..len,
        0..=5u64,
        0..=12u64,
    )
        .prop_map(
            |(advance, op, probe_back, probe_offset, quota_n, quota_limit)| Step {
                advance,
                op,
                probe_back,
                probe_offset,
                quota_n,
                quota_limit,
            },
        )
}

/// `(sample_count, bucket length, start time, steps)`.
fn scenario() -> impl Strategy<Value = (u64, u64, u64, Vec<Step>)> {
    (1..=6u64, 1..=40u64).prop_flat_map(|(sample_count, len)| {
        let interval = sample_count * len;
        (
            Just(sample_count),
            Just(len),
            prop_oneof![3 => 0..=3 * interval, 1 => 1_000_000_000u64..=1_000_100_000],
            prop::collection::vec(step(sample_count, len), 1..60),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn array_metric_matches_the_naive_model(
        (sample_count, len, start, steps) in scenario()
    ) {
        let clock = ManualClock::new(start);
        let interval = sample_count * len;
        let plain = ArrayMetric::with_clock(sample_count as usize, interval, clock.clone())
            .expect("valid shape");
        let occupiable = ArrayMetric::occupiable(sample_count as usize, interval, clock.clone())
            .expect("valid shape");
        let mut plain_model = Model::new(sample_count, len, false);
        let mut occupiable_model = Model::new(sample_count, len, true);

        for (i, s) in steps.iter().enumerate() {
            clock.advance(Duration::from_millis(s.advance));
            let r = clock.now_millis();
            for (name, metric, model) in [
                ("plain", &plain, &mut plain_model),
                ("occupiable", &occupiable, &mut occupiable_model),
            ] {
                let got = apply(metric, &clock, &s.op);
                let want = model.apply(r, &s.op);
                prop_assert_eq!(got, want, "{:?} by {}, step {}, at {} ms", s.op, name, i, r);
                compare(name, i, metric, model, &clock, s)?;
            }
        }
    }
}

// --- clocks stepping back -------------------------------------------------

#[test]
fn a_scripted_clock_stepping_back() {
    // 4 buckets of 100 ms. Expected values are worked out by hand from the
    // DESIGN's rule: a write behind its slot's window lands in that newer
    // window; a write into a stale slot reopens its own bucket.
    let clock = ManualClock::new(1_000);
    let m = ArrayMetric::with_clock(4, 400, clock.clone()).unwrap();
    let at = |t: u64| {
        clock.set(t);
        t
    };

    at(1_000);
    m.add_pass(1); // bucket 1 000, slot 2
    at(1_150);
    m.add_pass(2); // bucket 1 100, slot 3
    at(1_210);
    m.add_pass(4); // bucket 1 200, slot 0
    let t = at(1_010); // back 200 ms: slot 2 holds 1 000 itself
    m.add_pass(8);
    assert_eq!(m.pass(), 9, "window (600, 1000] at {t} ms");
    let t = at(810); // slot 0 holds 1 200, newer: recorded there
    m.add_pass(16);
    assert_eq!(m.pass(), 0, "the window at {t} ms holds nothing");
    let t = at(1_299);
    assert_eq!(m.pass(), 31, "everything written, at {t} ms");
    let t = at(1_400); // bucket 1 000 slides out
    assert_eq!(m.pass(), 22, "at {t} ms");
    let t = at(1_900); // a long step forward, then back into stale slots
    m.add_pass(32); // bucket 1 900, slot 3
    let t2 = at(1_650); // slot 0 holds 1 200 (stale): reopened at 1 600
    m.add_pass(64);
    assert_eq!(m.pass(), 64, "at {t2} ms");
    at(1_900);
    assert_eq!(m.pass(), 96, "bucket 1 600 and 1 900, at {t} ms");
    // Admission on the newest window even with the clock behind it.
    at(1_650);
    assert_eq!(m.try_pass(1, 97), Admission::Pass { window_pass: 97 });
    assert_eq!(m.try_pass(1, 97), Admission::Block { window_pass: 97 });
    at(1_900);
    assert_eq!(m.pass(), 97, "at 1 900 ms");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// With arbitrary times, forwards and backwards: nothing panics, and no
    /// window ever counts more passes than were written.
    #[test]
    fn arbitrary_times_never_panic_nor_inflate(
        sample_count in 1..=5u64,
        len in 1..=50u64,
        ops in prop::collection::vec((0..=10_000u64, 0..=3u64, any::<bool>()), 1..80),
    ) {
        let clock = ManualClock::new(0);
        let interval = sample_count * len;
        let m = ArrayMetric::occupiable(sample_count as usize, interval, clock.clone()).unwrap();
        let mut written = 0u64;
        for (t, n, admit) in ops {
            clock.set(t);
            if admit {
                if m.try_pass(n, 6).is_pass() {
                    written += n;
                }
            } else {
                m.add_pass(n);
                written += n;
            }
            let window: u64 = m.list().iter().map(|w| w.pass()).sum();
            prop_assert!(m.pass() <= written, "pass {} > written {} at {} ms", m.pass(), written, t);
            prop_assert_eq!(m.pass(), window, "at {} ms", t);
            let _ = m.details();
            let _ = m.time_until_pass(n, 6);
            let _ = m.previous_window_pass();
        }
    }
}
