//! Two threads on one metric (or one limiter, one counter): the same
//! operations as `single_threaded`, timed with `iter_custom` and reported as
//! aggregate time per operation (see the `core` module docs).

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use tower_sliding_window::clock::{Clock, SystemClock};
use tower_sliding_window::flow::TryPass;
use tower_sliding_window::stat::StatisticNode;

use super::{
    array_metric, array_metric_cached_clock, governor_never_rejecting,
    governor_upkeep_never_rejecting, node_request, run_threads, KeepFull,
};

/// One thread per core on the reference machine.
const THREADS: usize = 2;

pub(crate) fn bench(c: &mut Criterion) {
    add_pass(c);
    admission(c);
    pass_read(c);
    node_update(c);
}

fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(format!("{name}_{THREADS}_threads"));
    group.throughput(Throughput::Elements(1));
    group
}

/// Benches `op` on `THREADS` threads sharing `shared`.
fn shared<S, F>(group: &mut BenchmarkGroup<'_, WallTime>, id: &str, shared: &S, op: F)
where
    S: Sync + ?Sized,
    F: Fn(&S) + Sync,
{
    group.bench_function(id, |b| {
        b.iter_custom(|iters| run_threads(THREADS, iters, shared, &op))
    });
}

/// The floors: both threads incrementing one counter (the cost of sharing
/// one cache line) and both reading the cached clock.
fn floors(group: &mut BenchmarkGroup<'_, WallTime>) {
    let counter = AtomicU64::new(0);
    shared(group, "floor/fetch_add", &counter, |c| {
        black_box(c.fetch_add(1, Ordering::Relaxed));
    });
    let clock = SystemClock::new();
    shared(group, "floor/now_millis", &clock, |c| {
        black_box(c.now_millis());
    });
}

fn add_pass(c: &mut Criterion) {
    let mut group = group(c, "add_pass");
    let metric = array_metric();
    shared(&mut group, "array_metric/add_pass", &metric, |m| {
        m.add_pass(black_box(1));
    });
    floors(&mut group);
    group.finish();
}

fn admission(c: &mut Criterion) {
    let mut group = group(c, "admission");
    let metric = array_metric();
    shared(&mut group, "array_metric/try_pass_admit", &metric, |m| {
        let _ = black_box(m.try_pass(black_box(1), black_box(u64::MAX)));
    });
    {
        let metric = Arc::new(array_metric());
        let _full = KeepFull::start(Arc::clone(&metric));
        shared(&mut group, "array_metric/try_pass_reject", &*metric, |m| {
            let _ = black_box(m.try_pass(black_box(1), black_box(0)));
        });
    }
    let limiter = governor_never_rejecting();
    shared(&mut group, "governor/check", &limiter, |l| {
        let _ = black_box(l.check());
    });
    // Both without the counter read (see the single-threaded group).
    let metric = array_metric_cached_clock();
    shared(
        &mut group,
        "array_metric/try_pass_admit_cached_clock",
        &metric,
        |m| {
            let _ = black_box(m.try_pass(black_box(1), black_box(u64::MAX)));
        },
    );
    let limiter = governor_upkeep_never_rejecting();
    shared(&mut group, "governor/check_upkeep_clock", &limiter, |l| {
        let _ = black_box(l.check());
    });
    floors(&mut group);
    group.finish();
}

fn pass_read(c: &mut Criterion) {
    let mut group = group(c, "pass_read");
    let metric = Arc::new(array_metric());
    let _full = KeepFull::start(Arc::clone(&metric));
    shared(&mut group, "array_metric/pass", &*metric, |m| {
        black_box(m.pass());
    });
    floors(&mut group);
    group.finish();
}

fn node_update(c: &mut Criterion) {
    let mut group = group(c, "node_update");
    let node = StatisticNode::new();
    shared(&mut group, "statistic_node/request", &node, |n| {
        node_request(black_box(n));
    });
    floors(&mut group);
    group.finish();
}
