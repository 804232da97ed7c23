//! `Snapshot`: one key's statistics at a moment, as plain numbers.

use std::time::Duration;

use crate::stat::Counts;
use crate::store::{effective_now, Entry};

/// One key's statistics at a moment: counts over its current window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Snapshot {
    /// Admitted requests in the window.
    pub pass: u64,
    /// Rejected requests in the window.
    pub block: u64,
    /// Completed requests in the window (failed ones included).
    pub success: u64,
    /// Completed requests classified as failures, in the window.
    pub exception: u64,
    /// Requests in flight now.
    pub concurrency: u64,
    /// Requests waiting now before they reach the inner service: for their
    /// turn under [`throttle`](crate::SlidingWindowLayer::throttle), or for
    /// borrowed quota under
    /// [`prioritized`](crate::SlidingWindowLayer::prioritized).
    pub waiting: u64,
    /// The key's limit per window.
    pub limit: u64,
    /// Average response time of the window's completions.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "avg_rt_us", serialize_with = "micros")
    )]
    pub avg_rt: Option<Duration>,
    /// Smallest response time in the window.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "min_rt_us", serialize_with = "micros")
    )]
    pub min_rt: Option<Duration>,
}

/// Durations serialize as whole microseconds under `*_us` names (`null`
/// when absent).
#[cfg(feature = "serde")]
fn micros<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
        None => s.serialize_none(),
    }
}

impl Snapshot {
    /// `entry`'s statistics as read at `now`, or at the start of its newest
    /// bucket if that is later (see `effective_now`).
    pub(crate) fn of(entry: &Entry, now: u64) -> Snapshot {
        let mut snapshot = Snapshot::from_counts(
            &entry.node.window_counts(effective_now(entry, now)),
            entry.node.cur_concurrency(),
            entry.limit(),
        );
        snapshot.waiting = entry.waiting();
        snapshot
    }

    /// A compact key's statistics: its window's passes and blocks and its
    /// limit; nothing else is recorded (see `SlidingWindowLayer::compact`).
    pub(crate) fn compact((pass, block): (u64, u64), limit: u64) -> Snapshot {
        Snapshot {
            pass,
            block,
            limit,
            ..Snapshot::default()
        }
    }

    pub(crate) fn from_counts(counts: &Counts, concurrency: u64, limit: u64) -> Snapshot {
        Snapshot {
            pass: counts.pass,
            block: counts.block,
            success: counts.success,
            exception: counts.exception,
            concurrency,
            waiting: 0,
            limit,
            // Over all successes summed: weighted by successes for `total`;
            // never below the minimum (see `Counts::avg_rt`).
            avg_rt: counts.avg_rt(),
            min_rt: counts.min_rt(),
        }
    }
}
