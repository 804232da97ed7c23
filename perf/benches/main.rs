//! Criterion benches for `tower-sliding-window`, in one binary.
//!
//! Each module registers its groups with the single `criterion_group!`
//! below; run a subset with a filter, for example
//!
//! ```text
//! cargo bench -p perf --bench main -- admission
//! ```
//!
//! - `core`: the statistics core (`ArrayMetric`, `StatisticNode`) on one
//!   thread and on two threads sharing one metric, each group with its
//!   floors (a plain `AtomicU64::fetch_add`, the clock read) and, for
//!   admission, governor's direct `RateLimiter::check()`; `admission_paired`
//!   interleaves admission, governor's check and the clock reads in short
//!   rounds and prints the ratios.
//! - `layer`: one request through an axum `Router` with and without the
//!   layer, against a no-op layer and tower_governor: the group `layer`
//!   (one contender after another) and `layer_paired` (interleaved rounds,
//!   with a table of the cost beyond the no-op layer), and `layer_threads`
//!   (the per-client contenders on two threads sharing each layer).
//! - `keyed`: `keyed_admission`, one admission on a table of many keys
//!   (random keys) against governor's keyed `check_key` on the same keys,
//!   in interleaved rounds.
//! - `export`: the dashboard's JSON for 4096 keys (`dashboard_json`;
//!   feature `dashboard`, on by default).

use criterion::{criterion_group, criterion_main};

mod core;
#[path = "../load/direct.rs"]
mod direct;
#[cfg(feature = "dashboard")]
mod export;
mod keyed;
mod layer;
mod report;

#[cfg(feature = "dashboard")]
criterion_group!(dashboard, export::bench);
#[cfg(not(feature = "dashboard"))]
fn dashboard() {}

criterion_group!(
    benches,
    core::single_threaded::bench,
    core::multi_threaded::bench,
    core::clock::bench,
    core::paired::bench,
    layer::sequential::bench,
    layer::paired::bench,
    layer::threads::bench,
    keyed::bench,
);
criterion_main!(benches, dashboard);
