//! Crate-private reads for the exporters (`crate::export`): lifetime totals
//! for counters, and snapshots with their history in one visit.

use std::hash::Hash;

#[cfg(feature = "dashboard")]
use super::Snapshot;
use super::StatsHandle;
#[cfg(feature = "prometheus")]
use crate::stat::Counts;
#[cfg(feature = "dashboard")]
use crate::stat::MetricNode;
#[cfg(feature = "dashboard")]
use crate::store::effective_now;
#[cfg(feature = "prometheus")]
use crate::store::Entry;

/// One entry's counts since it was made, with its gauges now.
#[cfg(feature = "prometheus")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lifetime {
    pub(crate) counts: Counts,
    pub(crate) concurrency: u64,
    pub(crate) limit: u64,
}

#[cfg(feature = "prometheus")]
impl Lifetime {
    fn of(entry: &Entry) -> Self {
        Lifetime {
            counts: entry.node.lifetime_counts(),
            concurrency: entry.node.cur_concurrency(),
            limit: entry.limit(),
        }
    }
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> StatsHandle<K> {
    /// The clock's reading now, in milliseconds.
    #[cfg(feature = "dashboard")]
    pub(crate) fn now_ms(&self) -> u64 {
        self.now()
    }

    /// Length of every key's window, in milliseconds.
    #[cfg(feature = "dashboard")]
    pub(crate) fn window_ms(&self) -> u64 {
        self.registry().window().interval_ms
    }

    /// The lifetime totals of every entry evicted so far, summed.
    #[cfg(feature = "prometheus")]
    pub(crate) fn evicted_lifetime(&self) -> Counts {
        self.registry().evicted_totals()
    }

    /// Calls `f` with every key holding an entry and its lifetime totals.
    #[cfg(feature = "prometheus")]
    pub(crate) fn for_each_lifetime(&self, mut f: impl FnMut(&K, Lifetime)) {
        self.registry()
            .for_each_entry(|key, entry| f(key, Lifetime::of(entry)));
    }

    /// The overflow entry's lifetime totals.
    #[cfg(feature = "prometheus")]
    pub(crate) fn overflow_lifetime(&self) -> Lifetime {
        Lifetime::of(self.registry().overflow())
    }

    /// Calls `f` with every key holding an entry, its snapshot and its
    /// history (see [`history`](Self::history)), all read at one time.
    #[cfg(feature = "dashboard")]
    pub(crate) fn for_each_with_history(
        &self,
        now: u64,
        mut f: impl FnMut(&K, Snapshot, Vec<MetricNode>),
    ) {
        self.registry().for_each_entry(|key, entry| {
            f(
                key,
                Snapshot::of(entry, now),
                entry.node.history(effective_now(entry, now)),
            );
        });
    }

    /// The overflow entry's snapshot and history, if it is in use (anything
    /// in flight or in its windows) or has history.
    #[cfg(feature = "dashboard")]
    pub(crate) fn overflow_with_history(&self, now: u64) -> Option<(Snapshot, Vec<MetricNode>)> {
        let overflow = self.registry().overflow();
        let at = effective_now(overflow, now);
        let history = overflow.node.history(at);
        if history.is_empty() && overflow.node.is_idle_at(at) {
            return None;
        }
        Some((Snapshot::of(overflow, now), history))
    }
}
