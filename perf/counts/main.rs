//! Instruction counts of one admission, for `valgrind --tool=callgrind`:
//! each contender runs [`CALLS`] times inside a function of its own that is
//! never inlined, so callgrind's inclusive count of that function divided by
//! the number of calls is what one call executes, clock read included.
//! Unlike a timing, the count does not move with the load of the machine.
//!
//! ```text
//! cargo build --release -p perf --bin counts
//! valgrind --tool=callgrind --callgrind-out-file=target/counts.out \
//!     target/release/counts
//! callgrind_annotate --inclusive=yes target/counts.out | grep 'counts::'
//! ```
//!
//! The contenders: our `ArrayMetric::try_pass` (admitting) on the default
//! `SystemClock` and on a `CachedClock`, governor's direct `check()` on its
//! default clock and on its upkeep clock, and the clock reads alone.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock as _, QuantaClock, QuantaUpkeepClock};
use governor::{Quota, RateLimiter};
use tower_sliding_window::clock::{CachedClock, Clock, SystemClock};
use tower_sliding_window::flow::TryPass;
use tower_sliding_window::stat::ArrayMetric;

/// Calls per contender: enough that the first call (which opens a bucket)
/// and the rotations of a run under valgrind weigh under 0.01 instruction
/// per call.
const CALLS: u64 = 1_000_000;

/// Our admission on the metric's clock. The two contenders below differ
/// only in the metric they are given, so each passes its own name along
/// (otherwise the linker may fold them into one function).
#[inline(always)]
fn admit(metric: &ArrayMetric, name: &'static str) {
    black_box(name);
    for _ in 0..CALLS {
        let _ = black_box(metric.try_pass(black_box(1), black_box(u64::MAX)));
    }
}

#[inline(never)]
fn ours_system(metric: &ArrayMetric) {
    admit(metric, "system");
}

#[inline(never)]
fn ours_cached(metric: &ArrayMetric) {
    admit(metric, "cached");
}

#[inline(never)]
fn governor_default(limiter: &governor::DefaultDirectRateLimiter) {
    for _ in 0..CALLS {
        let _ = black_box(limiter.check());
    }
}

type UpkeepLimiter = RateLimiter<
    governor::state::NotKeyed,
    governor::state::InMemoryState,
    QuantaUpkeepClock,
    governor::middleware::NoOpMiddleware<governor::clock::QuantaInstant>,
>;

#[inline(never)]
fn governor_upkeep(limiter: &UpkeepLimiter) {
    for _ in 0..CALLS {
        let _ = black_box(limiter.check());
    }
}

#[inline(never)]
fn clock_system(clock: &SystemClock) {
    for _ in 0..CALLS {
        black_box(black_box(clock).now_millis());
    }
}

#[inline(never)]
fn clock_cached(clock: &CachedClock) {
    for _ in 0..CALLS {
        black_box(black_box(clock).now_millis());
    }
}

#[inline(never)]
fn clock_governor_default(clock: &QuantaClock) {
    for _ in 0..CALLS {
        black_box(black_box(clock).now());
    }
}

#[inline(never)]
fn clock_governor_upkeep(clock: &QuantaUpkeepClock) {
    for _ in 0..CALLS {
        black_box(black_box(clock).now());
    }
}

fn main() {
    let quota = Quota::per_second(NonZeroU32::MAX);

    let metric = ArrayMetric::new(10, 1000).expect("valid window");
    ours_system(&metric);
    let cached = CachedClock::new();
    let metric = ArrayMetric::with_clock(10, 1000, cached.clone()).expect("valid window");
    ours_cached(&metric);

    governor_default(&RateLimiter::direct(quota));
    let upkeep =
        QuantaUpkeepClock::from_interval(Duration::from_millis(1)).expect("quanta upkeep thread");
    governor_upkeep(&RateLimiter::direct_with_clock(quota, upkeep.clone()));

    clock_system(&SystemClock::new());
    clock_cached(&cached);
    clock_governor_default(&QuantaClock::default());
    clock_governor_upkeep(&upkeep);
    println!("{CALLS} calls per contender");
}
