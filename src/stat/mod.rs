//! Sentinel's sliding-window statistics, with no HTTP in sight.
//!
//! | Sentinel (Java)            | here                        |
//! |----------------------------|-----------------------------|
//! | `MetricEvent`              | [`MetricEvent`]             |
//! | `MetricBucket`             | [`MetricBucket`]            |
//! | `LeapArray<T>`             | [`LeapArray<B>`](LeapArray) |
//! | `WindowWrap<T>`            | [`WindowWrap`]              |
//! | `BucketLeapArray`          | [`BucketLeapArray`]         |
//! | `OccupiableBucketLeapArray`| [`OccupiableBucketLeapArray`] |
//! | `FutureBucketLeapArray`    | [`FutureBucketLeapArray`]   |
//! | `ArrayMetric` / `Metric`   | [`ArrayMetric`]             |
//! | `StatisticNode`            | [`StatisticNode`]           |
//! | `MetricNode`               | [`MetricNode`]              |
//!
//! This module records and reads; deciding whether a request may pass is
//! [`flow`](crate::flow)'s job, built on a one-step "add if" this module
//! offers the crate.
//!
//! Where this module deliberately differs from Java:
//!
//! - **The window edge.** The window at time `t` is exactly the buckets whose
//!   starts lie in `(start(t) - interval, start(t)]`: a bucket one full
//!   interval old never counts (Java's `isWindowDeprecated` counts it until its
//!   slot is reused; sentinel-golang does not).
//! - **A clock that steps back** never loses an event: it is recorded in the
//!   window its slot holds (Java hands out a detached bucket and drops it).
//! - **`previous_window`** with one sample is `None`, not the current bucket;
//!   **`min_rt`** of an empty window is `None`, not 5000 ms; **`max_success`**
//!   of an empty window is 0, not 1.
//! - **Managed buckets are read-only.** The rings behind [`ArrayMetric`],
//!   [`StatisticNode`] and [`OccupiableBucketLeapArray`] hand out
//!   [`BucketSnapshot`]s, never their buckets; a [`LeapArray`] you build
//!   yourself holds plain [`MetricBucket`]s that are yours to write.
//! - **No lost updates and exact admission** under concurrency.
//!
//! # Implementation details
//!
//! Each protocol is described next to its code:
//!
//! - bucket rotation (stamps, the rotation lock and its guard): `leap_array.rs`;
//! - exact admission (the admission word, sealing, the cached sum of older
//!   buckets): `admission_bucket.rs` and `metric_array.rs`;
//! - borrowed quota: `reservation.rs`;
//! - the minute window's roll-up and its sequence lock: `rollup.rs`;
//! - saturating response times: `tallies.rs` and `counts.rs`.
//!
//! These properties are model-checked with loom (`tests/loom.rs`) and
//! stress-tested on real threads (`tests/stat/stress.rs`).

// No two files import each other; `tests` in each file cover it alone.
mod admission_bucket;
mod array_metric;
mod bucket;
mod bucket_ref;
mod counts;
mod event;
mod future_array;
mod histogram;
mod leap_array;
mod metric_array;
mod metric_node;
mod minute;
mod node;
mod occupiable;
mod reservation;
mod rollup;
mod snapshot;
mod tallies;
mod window_wrap;

pub use crate::error::ConfigError;
pub use array_metric::ArrayMetric;
pub use bucket::MetricBucket;
pub use event::MetricEvent;
pub use future_array::FutureBucketLeapArray;
pub use leap_array::{BucketLeapArray, BucketValue, LeapArray};
pub use metric_node::MetricNode;
pub use minute::MinuteWindow;
pub use node::StatisticNode;
pub use occupiable::OccupiableBucketLeapArray;
pub use snapshot::BucketSnapshot;
pub use window_wrap::WindowWrap;

pub(crate) use counts::Counts;
#[cfg(feature = "prometheus")]
pub(crate) use histogram::RtHistogram;
pub(crate) use histogram::RtSlot;
#[cfg(feature = "prometheus")]
pub(crate) use histogram::{RtCounts, DEFAULT_RT_BUCKETS};
#[cfg_attr(not(feature = "prometheus"), allow(unused_imports))]
pub(crate) use rollup::want_lifetime_totals;
// Part of the crate-internal interface (snapshots that merge several nodes
// divide their own sums); `Counts::avg_rt` is the clamped form.
#[allow(unused_imports)]
pub(crate) use counts::average_rt;
pub(crate) use leap_array::validate as validate_window;
