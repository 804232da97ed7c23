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
//! offers the crate. The one exception is the compact key tier's window
//! (`compact.rs`), which holds too little to offer that step and decides
//! itself, with `flow`'s rule, decision type and wait estimate.
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
//! One file per concept; each protocol is described next to its code:
//!
//! - `counts.rs`: the events ([`MetricEvent`]) and a bucket's counts as
//!   values (the crate's `Counts`, [`BucketSnapshot`], [`MetricNode`]), and
//!   the response-time arithmetic reads share;
//! - `bucket.rs`: a bucket's counters ([`MetricBucket`] and the tallies
//!   every bucket shares), and saturating response times;
//! - `leap_array.rs`: the ring ([`LeapArray`], [`WindowWrap`]) and bucket
//!   rotation (stamps, the rotation lock and its guard);
//! - `occupy.rs`: borrowed quota ([`FutureBucketLeapArray`], and the
//!   reservation ring inside an occupiable admission ring);
//! - `minute.rs`: the roll-up that feeds the minute window, its sequence
//!   lock, lifetime totals;
//! - `admission.rs`: exact admission (the managed bucket and its admission
//!   word, sealing, the cached sum of older buckets and its straggler
//!   generation, strict rings), over a ring that holds a reservation ring
//!   and a roll-up;
//! - `view.rs`: the admission ring's reads, and the minute window's
//!   ([`MinuteWindow`]);
//! - `array_metric.rs`: the admission ring behind a clock ([`ArrayMetric`])
//!   or lending at explicit times ([`OccupiableBucketLeapArray`]);
//! - `node.rs`: [`StatisticNode`];
//! - `compact.rs`: one key's admission state in 28 bytes for the compact
//!   key tier (the crate's `CompactWindow`), deciding as a
//!   [`StatisticNode`] of the same shape would; it counts passes and the
//!   newest bucket's blocks only, and reuses `flow`'s wait estimate;
//! - `histogram.rs`: a layer's response-time histogram, for exporters.
//!
//! Each file uses only files listed before it (no two import each other).

//! These properties are model-checked with loom (`tests/loom.rs`, and for
//! the compact window the `loom_models` in `compact.rs`) and stress-tested
//! on real threads (`tests/stat/stress.rs`, and `compact.rs`'s own tests).

// Each file's `tests` module covers that file's concept.
mod admission;
mod array_metric;
mod bucket;
mod compact;
mod counts;
mod histogram;
mod leap_array;
mod minute;
mod node;
mod occupy;
mod view;
mod windows;

pub use crate::error::ConfigError;
pub use array_metric::ArrayMetric;
pub use array_metric::OccupiableBucketLeapArray;
pub use bucket::MetricBucket;
pub use counts::MetricEvent;
pub use counts::{BucketSnapshot, MetricNode};
pub use leap_array::{BucketLeapArray, BucketValue, LeapArray, WindowWrap};
pub use node::StatisticNode;
pub use occupy::FutureBucketLeapArray;
pub use view::MinuteWindow;

pub(crate) use admission::Placed;
pub(crate) use compact::{CompactShape, CompactWindow, COMPACT_MAX_BUCKETS, COMPACT_MAX_LIMIT};
pub(crate) use counts::Counts;
#[cfg(feature = "prometheus")]
pub(crate) use histogram::RtHistogram;
pub(crate) use histogram::RtSlot;
#[cfg(feature = "prometheus")]
pub(crate) use histogram::{RtCounts, DEFAULT_RT_BUCKETS};
#[cfg_attr(not(feature = "prometheus"), allow(unused_imports))]
pub(crate) use minute::want_lifetime_totals;
pub(crate) use windows::{ExtraWindow, ExtraWindows, WindowShape};
// Part of the crate-internal interface (snapshots that merge several nodes
// divide their own sums); `Counts::avg_rt` is the clamped form.
#[allow(unused_imports)]
pub(crate) use counts::average_rt;
pub(crate) use leap_array::validate as validate_window;
