//! Criterion benches for `tower-sliding-window`, in one binary.
//!
//! Each module registers its groups with the single `criterion_group!`
//! below; run a subset with a filter, for example
//!
//! ```text
//! cargo bench --bench main -- admission
//! ```
//!
//! - `core`: the statistics core (`ArrayMetric`, `StatisticNode`) on one
//!   thread and on two threads sharing one metric, each group with its
//!   floors (a plain `AtomicU64::fetch_add`, the clock read) and, for
//!   admission, governor's direct `RateLimiter::check()`.

use criterion::{criterion_group, criterion_main};

mod core;

criterion_group!(
    benches,
    core::single_threaded::bench,
    core::multi_threaded::bench,
    core::clock::bench,
);
criterion_main!(benches);
