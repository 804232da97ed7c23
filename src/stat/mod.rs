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
//! - **No lost updates and exact admission** under concurrency, described
//!   next.
//!
//! # Implementation details
//!
//! ## Rotation
//!
//! A [`LeapArray`] slot is a window stamp (the start of the window its
//! bucket holds) next to the bucket's counters. Recording at time `t`:
//!
//! 1. Load the stamp of slot `(t / len) % sample_count` (`Acquire`). If it is
//!    `start(t)` or newer, add to the counters in place (`Relaxed`
//!    `fetch_add`s) and stop.
//! 2. Otherwise the slot holds an older window. Take the array's rotation
//!    lock: a bit in one `AtomicU64` that also holds the newest window start
//!    ever opened, taken with a compare-and-swap (`Acquire`). If it is held,
//!    back off and go to 1.
//! 3. Re-load the stamp: the previous holder may have opened this very
//!    bucket. If so, release and use it.
//! 4. Reset the counters, then publish the new start with a `Release` store
//!    to the stamp, then release the lock (`Release`, recording the newest
//!    start).
//!
//! Why no event is lost or counted twice:
//!
//! - A writer **of the new window** adds only after loading the new stamp with
//!   `Acquire`, which synchronises with the `Release` publication that
//!   follows the reset. The reset happens-before its add, so the reset cannot
//!   overwrite it. (Sentinel publishes the new start *before* resetting, and
//!   resets without re-checking, so concurrent writes of the new window can
//!   be wiped: alibaba/Sentinel#2230.)
//! - Only one thread at a time can open buckets in an array, and it re-checks
//!   under the lock, so a bucket is reset once per window, never twice.
//! - A **late writer** (it loaded the old stamp, then was delayed past the
//!   rotation) adds either before the reset, so the event counts in the old
//!   window, which has just slid out, or after it, so it counts in the new
//!   one, as any write behind its slot does. Each `fetch_add` lands exactly
//!   once in exactly one window.
//!
//! The lock is held only to open a bucket (at most once per bucket length per
//! array) and covers a few stores; recording within a bucket never touches
//! it. A thread that needs the bucket being opened waits for those stores;
//! a thread writing into any other bucket does not wait at all.
//!
//! Readers do not lock. They may observe a bucket mid-reset and so see a
//! window whose counts are torn across buckets, but never a count from a
//! window that is not in range: a bucket counts only if its stamp, loaded with
//! `Acquire` before its counters, is in the window.
//!
//! ## Exact admission
//!
//! [`ArrayMetric::try_pass`] admits `n` if the window's pass count plus `n`
//! stays within a limit. Sentinel checks and then adds, so two threads can
//! both see room for one (alibaba/Sentinel#1592). Here the decision and the
//! record are one compare-and-swap on the pass counter of the newest bucket.
//! The pass counter packs three fields:
//!
//! ```text
//!  63     62 ........ 47  46 ............. 0
//! [SEALED][ round tag  ][     count        ]
//! ```
//!
//! 1. The caller moves its time forward to the newest opened bucket if its
//!    clock lags behind it, and opens that bucket (rotation above).
//! 2. It takes the passes of the older buckets in the window. Those are final
//!    for admission: whenever a newer bucket is opened, the opener sets the
//!    `SEALED` bit on every older bucket *before* publishing the new one, and
//!    an admission only succeeds on an unsealed word. So the opener sums them
//!    once, under the rotation lock, and caches the sum beside the slot; the
//!    admissions of that bucket reuse it. A pass recorded into a sealed
//!    bucket (by `add_pass` from a clock behind the newest bucket) bumps a
//!    straggler counter (`Release`) after landing; the cache is stamped with
//!    that counter, and an admission that reads (`Acquire`) a different value
//!    sums the buckets again (without writing the cache back: only the
//!    opener knows which window of the slot a sum belongs to). Either the
//!    late pass was complete before the
//!    admission began, and the admission sees the bump, or the two were
//!    concurrent and the admission may be ordered first.
//! 3. It loads the current bucket's word (`Acquire`). If the word is sealed
//!    or its round tag is not this window's, a newer bucket exists: back to 1.
//!    Otherwise it compares `older + count + n` with the limit and, if it
//!    fits, swaps in `count + n` (`AcqRel`). A failed swap re-decides with
//!    the value it returned.
//!
//! So every admission is decided against the whole window as it is at the
//! moment of its swap: the older buckets cannot gain an admission after being
//! sealed, and the current one cannot change between the load and the
//! successful swap. The round tag (the window start divided by the interval,
//! modulo 2^16 - 1, plus one) changes every time the slot is reused, so a
//! caller delayed across whole rotations cannot succeed with a stale word
//! that happens to hold the same count (ABA), unless it slept through 65 535
//! of them. It is never 0, so no valid word equals the 0 a reset briefly
//! leaves in the word before the new round's word is stored.
//!
//! Passes recorded with `add_pass` (not through admission) still count in
//! the window; they are simply not limited.
//!
//! ## The minute window
//!
//! A [`StatisticNode`] records only into its second window. When the second
//! window reuses a slot, the opener swaps every counter of the old bucket
//! out (`swap`: a late writer's add is either taken or left for the new
//! bucket, never both) and adds them to the second of the minute window the
//! bucket started in. Reads of the minute window add the second window's
//! buckets not rolled up yet. A sequence lock (an `AtomicU64`, odd while a
//! bucket moves and until the new window is published; `Release` fences on
//! the write side, `Acquire` on the read side) makes readers retry if a
//! bucket moved while they read, so a bucket is never counted in both places
//! or in neither. Recording a request thus writes one bucket, not two.
//!
//! These properties are model-checked with loom (`tests/loom.rs`) and
//! stress-tested on real threads (`tests/stress.rs`).

mod array_metric;
pub(crate) mod bucket;
mod event;
mod leap_array;
pub(crate) mod metric_array;
mod metric_node;
mod minute;
mod node;
mod occupiable;
mod window_wrap;

pub use crate::error::ConfigError;
pub use array_metric::ArrayMetric;
pub use bucket::MetricBucket;
pub use event::MetricEvent;
pub use leap_array::{BucketLeapArray, BucketValue, LeapArray};
pub use metric_node::MetricNode;
pub use minute::MinuteWindow;
pub use node::StatisticNode;
pub use occupiable::{FutureBucketLeapArray, OccupiableBucketLeapArray};
pub use window_wrap::WindowWrap;

pub(crate) use bucket::Counts;
pub(crate) use leap_array::validate as validate_window;
pub(crate) use metric_node::average_rt;
