//! The criterion group `layer_threads`: the peer-address contenders on two
//! threads at once, each thread with its own current-thread runtime and its
//! own clone of one app, so both threads' requests go through one layer
//! (one table, one limiter), as a multi-threaded server's do.
//!
//! Two workloads, each run for every contender:
//!
//! - `spread`: each thread sends the requests of its own [`CLIENTS`]
//!   clients in turn (addresses `10.<thread>.0.<n>`): many keys, none
//!   shared between the threads. What the threads share is the table (its
//!   locks, for a layer that takes them) and nothing else.
//! - `one_client`: both threads send the one peer of the other layer
//!   benches: both update the same key.
//!
//! A round runs every (contender, workload) pair in turn, in an order
//! rotated by one each round. For each pair both threads wait at a spinning
//! barrier, then send [`BATCH`] requests each; the pair's time is from the
//! first thread's start to the last thread's end, divided by the requests
//! of both: the time per request of the two threads together (the inverse
//! of their throughput). The table printed after the group has, per pair,
//! the median of that time and its difference to the no-op layer's under
//! the same workload in the same round; then our contenders' cost beyond
//! the no-op layer relative to tower_governor's.
//!
//! With two threads on a machine of two cores, a round is sensitive to
//! anything else the machine runs: quote ratios from one run, with its load
//! average.

use std::cell::RefCell;
use std::hint::spin_loop;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::Router;
use criterion::{Criterion, Throughput};

use super::{common, runtime, Contender, PEER};
use crate::report::{print_ratio, print_rows, RoundTable};

/// Threads sending at once: one per core on the reference machine.
const THREADS: usize = 2;

/// Requests per thread per pair and round: long enough (a few hundred
/// microseconds) that the barrier's skew between the threads is a small
/// part of the pair's time.
const BATCH: u32 = 256;

/// Clients per thread in the `spread` workload.
const CLIENTS: u32 = 64;

/// The contenders, each under both workloads; the no-op layer first (the
/// others' cost is taken beyond it).
const CONTENDERS: [Contender; 4] = [
    Contender::NoopPeerIp,
    Contender::OursPeerIp,
    Contender::OursCompactPeerIp,
    Contender::TowerGovernorPeerIp,
];

/// Who sends the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    Spread,
    OneClient,
}

impl Workload {
    /// The peer of the `n`th request of thread `thread`.
    fn peer(self, thread: usize, n: u32) -> SocketAddr {
        match self {
            Workload::Spread => {
                let thread = u8::try_from(thread + 1).expect("a handful of threads");
                let client = u8::try_from(n % CLIENTS + 1).expect("at most 255 clients");
                SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, thread, 0, client)), 40_000)
            }
            Workload::OneClient => PEER,
        }
    }
}

/// One (contender, workload) pair: the unit a round times.
#[derive(Debug, Clone, Copy)]
struct Pair {
    id: &'static str,
    /// Index in [`CONTENDERS`].
    contender: usize,
    workload: Workload,
}

const fn pair(id: &'static str, contender: usize, workload: Workload) -> Pair {
    Pair {
        id,
        contender,
        workload,
    }
}

/// Every pair, in the order of the report; each contender's pair at the
/// same index modulo 2 has the same workload.
const PAIRS: [Pair; 8] = [
    pair("noop_layer_peer_ip/spread", 0, Workload::Spread),
    pair("noop_layer_peer_ip/one_client", 0, Workload::OneClient),
    pair("ours_peer_ip/spread", 1, Workload::Spread),
    pair("ours_peer_ip/one_client", 1, Workload::OneClient),
    pair("ours_compact_peer_ip/spread", 2, Workload::Spread),
    pair("ours_compact_peer_ip/one_client", 2, Workload::OneClient),
    pair("tower_governor_peer_ip/spread", 3, Workload::Spread),
    pair("tower_governor_peer_ip/one_client", 3, Workload::OneClient),
];

const N: usize = PAIRS.len();

/// The no-op layer's pair with the workload of pair `i`.
fn baseline(i: usize) -> usize {
    i % 2
}

/// A barrier that spins: a thread woken from a blocking wait starts tens
/// of microseconds after the other, which would show up as time of the
/// pair being measured.
struct SpinBarrier {
    arrived: AtomicUsize,
    /// Moved on by the last thread to arrive; the others spin until it
    /// moves.
    generation: AtomicUsize,
    /// Set when a thread panicked: it never arrives again, and the others
    /// stop waiting for it (and panic too) instead of spinning for ever.
    abandoned: AtomicBool,
}

/// Abandons its barrier when dropped during a panic.
struct Abandon<'a>(&'a SpinBarrier);

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.abandoned.store(true, Ordering::Release);
        }
    }
}

impl SpinBarrier {
    fn new() -> Self {
        SpinBarrier {
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            abandoned: AtomicBool::new(false),
        }
    }

    fn wait(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == THREADS {
            // No thread arrives for the next generation before it sees
            // this one end, after the reset.
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            assert!(
                !self.abandoned.load(Ordering::Acquire),
                "the other bench thread panicked"
            );
            if spins < 100_000 {
                spins += 1;
                spin_loop();
            } else {
                thread::yield_now();
            }
        }
    }
}

/// One thread's part of `rounds` rounds, the first starting at pair
/// `start`: per round, per pair, when the thread began and ended its
/// requests.
fn worker(
    thread: usize,
    mut apps: Vec<Router>,
    rounds: u64,
    start: usize,
    barrier: &SpinBarrier,
) -> Vec<[(Instant, Instant); N]> {
    let _abandon = Abandon(barrier);
    let runtime = runtime();
    runtime.block_on(async {
        let now = Instant::now();
        let mut spans = Vec::new();
        for round in 0..rounds {
            let mut span = [(now, now); N];
            for k in 0..N {
                let i = (start + round as usize + k) % N;
                let pair = PAIRS[i];
                let contender = CONTENDERS[pair.contender];
                let app = &mut apps[pair.contender];
                barrier.wait();
                let begin = Instant::now();
                for n in 0..BATCH {
                    let request = contender.request_from(pair.workload.peer(thread, n));
                    let status = common::serve(app, request).await;
                    // A refusal would be cheaper than a pass: none may
                    // happen (each contender's limit is out of reach).
                    assert_eq!(
                        status,
                        StatusCode::OK,
                        "{}: no contender may refuse",
                        pair.id
                    );
                }
                span[i] = (begin, Instant::now());
            }
            spans.push(span);
        }
        spans
    })
}

/// The apps and every round run so far.
struct Rounds {
    /// One per contender, in [`CONTENDERS`] order; each thread serves a
    /// clone (one layer state).
    apps: Vec<Router>,
    /// Where the next round starts in [`PAIRS`].
    next_start: usize,
    /// Per round, per pair: ns per request of both threads together.
    ns: RoundTable<N>,
}

impl Rounds {
    /// Runs `rounds` rounds; returns the time spent in pair `of`.
    fn run(&mut self, rounds: u64, of: usize) -> Duration {
        let barrier = SpinBarrier::new();
        let start = self.next_start;
        self.next_start = (start + rounds as usize) % N;
        let per_thread: Vec<Vec<[(Instant, Instant); N]>> = thread::scope(|scope| {
            let workers: Vec<_> = (0..THREADS)
                .map(|t| {
                    let apps = self.apps.clone();
                    let barrier = &barrier;
                    scope.spawn(move || worker(t, apps, rounds, start, barrier))
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().expect("bench thread panicked"))
                .collect()
        });
        let requests = f64::from(BATCH) * THREADS as f64;
        let mut spent = Duration::ZERO;
        for round in 0..rounds as usize {
            let mut ns = [0.0; N];
            for (i, slot) in ns.iter_mut().enumerate() {
                let begin = per_thread.iter().map(|t| t[round][i].0).min();
                let end = per_thread.iter().map(|t| t[round][i].1).max();
                let (Some(begin), Some(end)) = (begin, end) else {
                    unreachable!("at least one thread");
                };
                let elapsed = end - begin;
                *slot = elapsed.as_nanos() as f64 / requests;
                if i == of {
                    spent += elapsed;
                }
            }
            self.ns.push(ns);
        }
        spent
    }

    fn report(&self) {
        if self.ns.is_empty() {
            return;
        }
        let rows = self.ns.rows(PAIRS.iter().map(|p| p.id), baseline);
        let heading = format!(
            "layer_threads: {} rounds, {THREADS} threads x {BATCH} requests per pair, \
             rotated order; ns per request of both threads together",
            self.ns.len()
        );
        print_rows(&heading, "beyond no-op", 34, &rows);
        // Pair `2 * contender + workload` (see `PAIRS`).
        let row = |contender: usize, workload: usize| &rows[2 * contender + workload];
        for workload in 0..2 {
            let governor = row(3, workload);
            print_ratio(row(1, workload), governor, "no-op");
            print_ratio(row(2, workload), governor, "no-op");
        }
    }
}

pub(crate) fn bench(c: &mut Criterion) {
    // The report finds pairs by position: contender by contender, each
    // under `spread`, then `one_client`.
    for (i, pair) in PAIRS.iter().enumerate() {
        let workload = [Workload::Spread, Workload::OneClient][i % 2];
        assert!(
            pair.contender == i / 2 && pair.workload == workload,
            "{}",
            pair.id
        );
    }
    let runtime = runtime();
    let rounds = RefCell::new(Rounds {
        apps: CONTENDERS.iter().map(|c| c.app(&runtime)).collect(),
        next_start: 0,
        ns: RoundTable::new(),
    });
    let mut group = c.benchmark_group("layer_threads");
    group
        .throughput(Throughput::Elements(1))
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    for (i, pair) in PAIRS.iter().enumerate() {
        group.bench_function(pair.id, |b| {
            b.iter_custom(|iters| {
                let per_round = u64::from(BATCH) * THREADS as u64;
                let rounds_needed = iters.div_ceil(per_round);
                let spent = rounds.borrow_mut().run(rounds_needed, i);
                // `rounds_needed * per_round` requests of this pair were
                // timed; criterion wants the time of `iters`.
                spent.mul_f64(iters as f64 / (rounds_needed * per_round) as f64)
            })
        });
    }
    group.finish();
    rounds.into_inner().report();
}
