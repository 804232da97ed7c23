//! Time sources side by side: what one clock read costs with the crate's
//! `SystemClock` (the counter on every read), its `CachedClock` (milliseconds
//! from a cache an upkeep thread refreshes), `std`, and `quanta` (governor's
//! default clock reads `quanta::Clock::raw`).

use std::time::{Duration, Instant, SystemTime};

use criterion::{Criterion, Throughput};
use tower_sliding_window::clock::{CachedClock, Clock, ManualClock, SystemClock};

pub(crate) fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock");
    group.throughput(Throughput::Elements(1));

    let system = SystemClock::new();
    group.bench_function("system_clock/now_millis", |b| {
        b.iter(|| system.now_millis())
    });
    group.bench_function("system_clock/now_micros", |b| {
        b.iter(|| system.now_micros())
    });
    let cached = CachedClock::new();
    group.bench_function("cached_clock/now_millis", |b| {
        b.iter(|| cached.now_millis())
    });
    let manual = ManualClock::new(1_000);
    group.bench_function("manual_clock/now_millis", |b| {
        b.iter(|| manual.now_millis())
    });

    group.bench_function("std/instant_now", |b| b.iter(Instant::now));
    group.bench_function("std/system_time_now", |b| b.iter(SystemTime::now));

    let quanta = quanta::Clock::new();
    group.bench_function("quanta/clock_raw", |b| b.iter(|| quanta.raw()));
    group.bench_function("quanta/instant_now", |b| b.iter(quanta::Instant::now));
    // `recent()` reads a value an upkeep thread refreshes; without one it
    // falls back to a full read, so keep the thread alive for the bench.
    let _upkeep = quanta::Upkeep::new(Duration::from_millis(1))
        .start()
        .expect("quanta upkeep thread");
    group.bench_function("quanta/instant_recent", |b| b.iter(quanta::Instant::recent));

    group.finish();
}
