//! The criterion group `admission_paired`: our admission and governor's
//! check, each on its default clock and on its cached one, plus the clock
//! reads alone, in short interleaved rounds on one thread.
//!
//! A round runs [`BATCH`] calls of every contender in turn, starting one
//! contender further along than the previous round, and notes each one's
//! nanoseconds per call. A slow phase of a shared machine then hits a whole
//! round rather than one contender's whole run, and the ratio of two
//! contenders *within* a round cancels it. Each benchmark of the group runs
//! whole rounds and hands criterion its contender's share of the time.
//!
//! Printed after the group: every contender's median over rounds, and for
//! the two pairs (ours and governor on their default clocks, then on their
//! cached ones) the ratio of the medians and the median of the per-round
//! ratios.

use std::cell::RefCell;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use governor::clock::{Clock as _, QuantaClock, QuantaUpkeepClock};
use tower_sliding_window::clock::{CachedClock, Clock, SystemClock};
use tower_sliding_window::flow::TryPass;

use crate::report::in_rounds;

use super::{
    array_metric, array_metric_cached_clock, governor_never_rejecting,
    governor_upkeep_never_rejecting,
};

/// Calls per contender per round: a few microseconds, so that the two
/// clock reads around a batch cost well under a nanosecond per call and
/// most rounds see no interruption.
const BATCH: u32 = 256;

/// The contenders, in round order; the benchmarks are the first four.
const NAMES: [&str; 8] = [
    "ours/try_pass_system_clock",
    "governor/check_default_clock",
    "ours/try_pass_cached_clock",
    "governor/check_upkeep_clock",
    "clock/system_clock_now_millis",
    "clock/governor_default_now",
    "clock/cached_clock_now_millis",
    "clock/governor_upkeep_now",
];
const BENCHED: usize = 4;

/// The ratios printed: (ours, governor) by index into [`NAMES`].
const PAIRS: [(usize, usize); 2] = [(0, 1), (2, 3)];

struct Rounds {
    batches: Vec<Box<dyn Fn()>>,
    next_start: usize,
    /// Per round, per contender: ns per call.
    ns: Vec<[f64; NAMES.len()]>,
}

impl Rounds {
    /// Runs `rounds` rounds; returns the time spent in contender `of`.
    fn run(&mut self, rounds: u64, of: usize) -> Duration {
        let mut spent = Duration::ZERO;
        for _ in 0..rounds {
            let start = self.next_start;
            self.next_start = (start + 1) % NAMES.len();
            let mut ns = [0.0; NAMES.len()];
            for k in 0..NAMES.len() {
                let i = (start + k) % NAMES.len();
                let began = Instant::now();
                (self.batches[i])();
                let took = began.elapsed();
                ns[i] = took.as_nanos() as f64 / f64::from(BATCH);
                if i == of {
                    spent += took;
                }
            }
            self.ns.push(ns);
        }
        spent
    }
}

/// `BATCH` calls of `op`, as one contender's share of a round.
fn batch(op: impl Fn() + 'static) -> Box<dyn Fn()> {
    Box::new(move || {
        for _ in 0..BATCH {
            op();
        }
    })
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

pub(crate) fn bench(c: &mut Criterion) {
    let ours = array_metric();
    let governor = governor_never_rejecting();
    let ours_cached = array_metric_cached_clock();
    let governor_upkeep = governor_upkeep_never_rejecting();
    let system = SystemClock::new();
    let quanta = QuantaClock::default();
    let cached = CachedClock::new();
    // quanta runs one upkeep thread per process: the limiter's clock.
    let upkeep: QuantaUpkeepClock = governor_upkeep.clock().clone();
    let rounds = RefCell::new(Rounds {
        batches: vec![
            batch(move || {
                let _ = black_box(ours.try_pass(black_box(1), black_box(u64::MAX)));
            }),
            batch(move || {
                let _ = black_box(governor.check());
            }),
            batch(move || {
                let _ = black_box(ours_cached.try_pass(black_box(1), black_box(u64::MAX)));
            }),
            batch(move || {
                let _ = black_box(governor_upkeep.check());
            }),
            batch(move || {
                black_box(black_box(&system).now_millis());
            }),
            batch(move || {
                black_box(black_box(&quanta).now());
            }),
            batch(move || {
                black_box(black_box(&cached).now_millis());
            }),
            batch(move || {
                black_box(black_box(&upkeep).now());
            }),
        ],
        next_start: 0,
        ns: Vec::new(),
    });

    let mut group = c.benchmark_group("admission_paired");
    group.throughput(Throughput::Elements(1));
    for (of, name) in NAMES.iter().enumerate().take(BENCHED) {
        group.bench_function(*name, |b| {
            b.iter_custom(|iters| {
                in_rounds(iters, u64::from(BATCH), |needed| {
                    rounds.borrow_mut().run(needed, of)
                })
            })
        });
    }
    group.finish();

    let rounds = rounds.into_inner();
    if rounds.ns.is_empty() {
        return;
    }
    println!();
    println!(
        "admission_paired: {} rounds of {BATCH} calls per contender",
        rounds.ns.len()
    );
    for (i, name) in NAMES.iter().enumerate() {
        let mut own: Vec<f64> = rounds.ns.iter().map(|r| r[i]).collect();
        println!("{name:32} {:7.2} ns (median)", median(&mut own));
    }
    for (a, b) in PAIRS {
        let mut of_a: Vec<f64> = rounds.ns.iter().map(|r| r[a]).collect();
        let mut of_b: Vec<f64> = rounds.ns.iter().map(|r| r[b]).collect();
        let mut per_round: Vec<f64> = rounds.ns.iter().map(|r| r[a] / r[b]).collect();
        println!(
            "{} / {}: {:.2} (ratio of medians), {:.2} (median per-round ratio)",
            NAMES[a],
            NAMES[b],
            median(&mut of_a) / median(&mut of_b),
            median(&mut per_round)
        );
    }
}
