//! One thread on one metric: the cost of each hot-path operation next to its
//! floors, a plain `fetch_add` and the cached clock read.

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
    governor_upkeep_never_rejecting, node_request, KeepFull, RT,
};

pub(crate) fn bench(c: &mut Criterion) {
    add_pass(c);
    admission(c);
    pass_read(c);
    node_update(c);
}

fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(1));
    group
}

/// The floors every group carries: the cheapest possible counter update and
/// the clock read each operation starts with.
fn floors(group: &mut BenchmarkGroup<'_, WallTime>) {
    let counter = AtomicU64::new(0);
    group.bench_function("floor/fetch_add", |b| {
        b.iter(|| counter.fetch_add(1, Ordering::Relaxed))
    });
    let clock = SystemClock::new();
    group.bench_function("floor/now_millis", |b| b.iter(|| clock.now_millis()));
}

fn add_pass(c: &mut Criterion) {
    let mut group = group(c, "add_pass");
    let metric = array_metric();
    group.bench_function("array_metric/add_pass", |b| {
        b.iter(|| metric.add_pass(black_box(1)))
    });
    floors(&mut group);
    group.finish();
}

fn admission(c: &mut Criterion) {
    let mut group = group(c, "admission");
    let metric = array_metric();
    group.bench_function("array_metric/try_pass_admit", |b| {
        b.iter(|| metric.try_pass(black_box(1), black_box(u64::MAX)))
    });
    {
        // A full window whose passes already exceed the limit: every call
        // sums the window and rejects.
        let metric = Arc::new(array_metric());
        let _full = KeepFull::start(Arc::clone(&metric));
        group.bench_function("array_metric/try_pass_reject", |b| {
            b.iter(|| metric.try_pass(black_box(1), black_box(0)))
        });
    }
    let limiter = governor_never_rejecting();
    group.bench_function("governor/check", |b| b.iter(|| limiter.check()));
    // Both without the counter read: our cached clock, governor's upkeep
    // clock.
    let metric = array_metric_cached_clock();
    group.bench_function("array_metric/try_pass_admit_cached_clock", |b| {
        b.iter(|| metric.try_pass(black_box(1), black_box(u64::MAX)))
    });
    let limiter = governor_upkeep_never_rejecting();
    group.bench_function("governor/check_upkeep_clock", |b| {
        b.iter(|| limiter.check())
    });
    floors(&mut group);
    group.finish();
}

fn pass_read(c: &mut Criterion) {
    let mut group = group(c, "pass_read");
    let metric = Arc::new(array_metric());
    let _full = KeepFull::start(Arc::clone(&metric));
    group.bench_function("array_metric/pass", |b| b.iter(|| metric.pass()));
    floors(&mut group);
    group.finish();
}

fn node_update(c: &mut Criterion) {
    let mut group = group(c, "node_update");
    let node = StatisticNode::new();
    group.bench_function("statistic_node/request", |b| {
        b.iter(|| node_request(black_box(&node)))
    });
    group.bench_function("statistic_node/try_pass", |b| {
        b.iter(|| node.try_pass(black_box(1), black_box(u64::MAX)))
    });
    group.bench_function("statistic_node/add_rt_and_success", |b| {
        b.iter(|| node.add_rt_and_success(black_box(RT), black_box(1)))
    });
    floors(&mut group);
    group.finish();
}
