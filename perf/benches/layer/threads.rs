//! The criterion group `layer_threads`: the per-client contenders on two
//! threads at once, each thread with its own current-thread runtime and its
//! own clone of one app, so both threads' requests go through one layer
//! (one table, one limiter), as a multi-threaded server's do. The
//! contenders key by the peer's address (the no-op layer, our full and
//! compact layers, tower_governor) or by the `x-api-key` header (the no-op
//! layer, our compact layer, tower_governor).
//!
//! Two workloads, each run for every contender:
//!
//! - `spread`: each thread sends the requests of its own [`CLIENTS`]
//!   clients in turn (addresses `10.<thread>.0.<n>`, keys
//!   `client-<thread>-<n>`): many keys, none shared between the threads.
//!   What the threads share is the table (its locks, for a layer that
//!   takes them) and nothing else.
//! - `one_client`: both threads send as the one client of the other layer
//!   benches: both update the same key.
//!
//! A round runs every (contender, workload) pair in turn, in an order
//! rotated by one each round. For each pair both threads wait at a spinning
//! barrier, then send [`BATCH`] requests each; the pair's time is from the
//! first thread's start to the last thread's end, divided by the requests
//! of both: the time per request of the two threads together (the inverse
//! of their throughput). The table printed after the group has, per pair,
//! the median of that time and its difference to the no-op layer's sent
//! the same kind of request under the same workload in the same round;
//! then our contenders' cost beyond the no-op layer relative to
//! tower_governor's with the same key.
//!
//! With two threads on a machine of two cores, a round is sensitive to
//! anything else the machine runs: quote ratios from one run, with its load
//! average.

use std::cell::RefCell;
use std::hint::spin_loop;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::Router;
use criterion::{Criterion, Throughput};

use super::{common, runtime, Contender, CLIENT, PEER};
use crate::report::{in_rounds, print_ratio, print_rows, RoundTable};

/// Threads sending at once: one per core on the reference machine.
const THREADS: usize = 2;

/// Requests per thread per pair and round: long enough (a few hundred
/// microseconds) that the barrier's skew between the threads is a small
/// part of the pair's time.
const BATCH: u32 = 256;

/// Clients per thread in the `spread` workload.
const CLIENTS: u32 = 64;

/// The contenders, each under both workloads. Each is taken beyond the
/// no-op layer sent the same kind of request ([`Contender::baseline`]),
/// which is in the list.
const CONTENDERS: [Contender; 7] = [
    Contender::NoopPeerIp,
    Contender::OursPeerIp,
    Contender::OursCompactPeerIp,
    Contender::TowerGovernorPeerIp,
    Contender::Noop,
    Contender::OursCompactHeader,
    Contender::TowerGovernorHeader,
];

/// Who sends the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    Spread,
    OneClient,
}

impl Workload {
    const ALL: [Workload; 2] = [Workload::Spread, Workload::OneClient];

    fn name(self) -> &'static str {
        match self {
            Workload::Spread => "spread",
            Workload::OneClient => "one_client",
        }
    }

    /// The client of the `n`th request of thread `thread`: its `x-api-key`
    /// value and its address. A contender keys by one of the two.
    fn client(self, thread: usize, n: u32) -> (&'static str, SocketAddr) {
        match self {
            Workload::Spread => {
                let client = n % CLIENTS;
                let octets = [
                    u8::try_from(thread + 1).expect("a handful of threads"),
                    u8::try_from(client + 1).expect("at most 255 clients"),
                ];
                let peer = IpAddr::V4(Ipv4Addr::new(10, octets[0], 0, octets[1]));
                (
                    api_keys()[thread][client as usize],
                    SocketAddr::new(peer, 40_000),
                )
            }
            Workload::OneClient => (CLIENT, PEER),
        }
    }
}

/// The `spread` workload's `x-api-key` values, per thread: made once and
/// kept for the whole run, so that a request's header is made as the other
/// layer benches make theirs (from a `&'static str`, no allocation).
fn api_keys() -> &'static [Vec<&'static str>] {
    static KEYS: OnceLock<Vec<Vec<&'static str>>> = OnceLock::new();
    KEYS.get_or_init(|| {
        (0..THREADS)
            .map(|t| {
                (0..CLIENTS)
                    .map(|c| &*Box::leak(format!("client-{t}-{c}").into_boxed_str()))
                    .collect()
            })
            .collect()
    })
}

/// Pair `i`: contender `i / 2` under workload `i % 2`.
fn pair(i: usize) -> (Contender, usize, Workload) {
    let contender = i / Workload::ALL.len();
    (
        CONTENDERS[contender],
        contender,
        Workload::ALL[i % Workload::ALL.len()],
    )
}

const N: usize = CONTENDERS.len() * Workload::ALL.len();

/// The pairs' names, `<contender>/<workload>`, in [`pair`] order.
fn pair_ids() -> &'static [&'static str] {
    static IDS: OnceLock<Vec<&'static str>> = OnceLock::new();
    IDS.get_or_init(|| {
        (0..N)
            .map(|i| {
                let (contender, _, workload) = pair(i);
                &*Box::leak(format!("{}/{}", contender.id(), workload.name()).into_boxed_str())
            })
            .collect()
    })
}

/// The pair of the no-op layer sent pair `i`'s kind of request under its
/// workload.
fn baseline(i: usize) -> usize {
    let (contender, _, workload) = pair(i);
    index(contender.baseline(), workload)
}

/// The pair of `contender` under `workload`.
fn index(contender: Contender, workload: Workload) -> usize {
    let c = CONTENDERS
        .iter()
        .position(|&x| x == contender)
        .expect("a contender of this group");
    let w = Workload::ALL
        .iter()
        .position(|&x| x == workload)
        .expect("a workload");
    c * Workload::ALL.len() + w
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
                let (contender, c, workload) = pair(i);
                let app = &mut apps[c];
                barrier.wait();
                let begin = Instant::now();
                for n in 0..BATCH {
                    let (client, peer) = workload.client(thread, n);
                    let request = contender.request_as(client, peer);
                    let status = common::serve(app, request).await;
                    // A refusal would be cheaper than a pass: none may
                    // happen (each contender's limit is out of reach).
                    assert_eq!(
                        status,
                        StatusCode::OK,
                        "{}: no contender may refuse",
                        pair_ids()[i]
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
    /// Where the next round starts, a pair (see [`pair`]).
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
        let rows = self.ns.rows(pair_ids().iter().copied(), baseline);
        let heading = format!(
            "layer_threads: {} rounds, {THREADS} threads x {BATCH} requests per pair, \
             rotated order; ns per request of both threads together",
            self.ns.len()
        );
        print_rows(&heading, "beyond no-op", 34, &rows);
        for workload in Workload::ALL {
            for (ours, theirs) in [
                (Contender::OursPeerIp, Contender::TowerGovernorPeerIp),
                (Contender::OursCompactPeerIp, Contender::TowerGovernorPeerIp),
                (Contender::OursCompactHeader, Contender::TowerGovernorHeader),
            ] {
                let row = |c| &rows[index(c, workload)];
                print_ratio(row(ours), row(theirs), "no-op");
            }
        }
    }
}

pub(crate) fn bench(c: &mut Criterion) {
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
    for (i, id) in pair_ids().iter().enumerate() {
        group.bench_function(*id, |b| {
            b.iter_custom(|iters| {
                // A round sends the pair's requests from every thread.
                in_rounds(iters, u64::from(BATCH) * THREADS as u64, |needed| {
                    rounds.borrow_mut().run(needed, i)
                })
            })
        });
    }
    group.finish();
    rounds.into_inner().report();
}
