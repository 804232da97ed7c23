//! Crate-private reads for the exporters (`crate::export`): lifetime totals
//! for counters, and snapshots with their history in one visit.

use std::hash::Hash;

#[cfg(feature = "dashboard")]
use super::Snapshot;
use super::StatsHandle;
#[cfg(feature = "dashboard")]
use crate::breaker::BreakerState;
#[cfg(any(feature = "prometheus", feature = "dashboard"))]
use crate::stat::Counts;
#[cfg(feature = "dashboard")]
use crate::stat::MetricNode;
#[cfg(feature = "dashboard")]
use crate::store::effective_now;
use crate::store::Entry;
#[cfg(feature = "dashboard")]
use std::sync::Arc;

/// One entry's counts since it was made, with its gauges now.
#[cfg(feature = "prometheus")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lifetime {
    pub(crate) counts: Counts,
    pub(crate) concurrency: u64,
    pub(crate) limit: u64,
    /// The entry's circuit breakers that are open or half-open.
    pub(crate) breakers_not_closed: u64,
    /// The key has a limit of its own (a rule or `set_limit`).
    pub(crate) own_limit: bool,
}

#[cfg(feature = "prometheus")]
impl Lifetime {
    fn of(entry: &Entry) -> Self {
        Lifetime {
            counts: entry.node.lifetime_counts(),
            concurrency: entry.node.cur_concurrency(),
            limit: entry.limit(),
            breakers_not_closed: entry.breakers.not_closed(),
            own_limit: entry.policy_tag().is_some(),
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

    /// Whether the layer is compact (`SlidingWindowLayer::compact`).
    #[cfg(feature = "prometheus")]
    pub(crate) fn is_compact(&self) -> bool {
        self.compact().is_some()
    }

    /// The lifetime totals of every entry evicted so far, summed. A compact
    /// layer keeps no lifetime totals per key: every key's passes and
    /// blocks (in the table or with their own limit, evicted or not) are
    /// counted here, the overflow's apart.
    #[cfg(feature = "prometheus")]
    pub(crate) fn evicted_lifetime(&self) -> Counts {
        if let Some(keys) = self.compact() {
            let (pass, block) = keys.keys_lifetime();
            return Counts {
                pass,
                block,
                ..Counts::default()
            };
        }
        self.registry().evicted_totals()
    }

    /// Calls `f` with every key holding an entry and its lifetime totals
    /// (none for a compact layer: see [`evicted_lifetime`](Self::evicted_lifetime)).
    #[cfg(feature = "prometheus")]
    pub(crate) fn for_each_lifetime(&self, mut f: impl FnMut(&K, Lifetime)) {
        if self.compact().is_some() {
            return;
        }
        self.registry()
            .for_each_entry(|key, entry| f(key, Lifetime::of(entry)));
    }

    /// The layer's response-time histogram slot, shared by its entries.
    #[cfg(feature = "prometheus")]
    pub(crate) fn rt_slot(&self) -> &crate::stat::RtSlot {
        self.registry().rt_histogram()
    }

    /// The overflow entry's lifetime totals.
    #[cfg(feature = "prometheus")]
    pub(crate) fn overflow_lifetime(&self) -> Lifetime {
        if let Some(keys) = self.compact() {
            let place = keys.table().overflow_place();
            let (pass, block) = place.totals.get();
            return Lifetime {
                counts: Counts {
                    pass,
                    block,
                    ..Counts::default()
                },
                concurrency: 0,
                limit: place.limit,
                breakers_not_closed: 0,
                own_limit: false,
            };
        }
        Lifetime::of(self.registry().overflow())
    }

    /// Every key holding an entry, with its snapshot read at `now` and
    /// `key(k)` as its [`KeyRow::key`] (say, the key's label copied where
    /// the caller wants it): the key is visited while its entry is at hand
    /// and is neither cloned nor kept. Each row can read its history
    /// afterwards (see [`KeyRow::history`]), so a caller reads histories
    /// only for the rows it keeps.
    #[cfg(feature = "dashboard")]
    pub(crate) fn rows<T>(&self, now: u64, mut key: impl FnMut(&K) -> T) -> Vec<KeyRow<T>> {
        if let Some(keys) = self.compact() {
            let mut rows = Vec::new();
            keys.table().for_each(
                |k, place| {
                    let (pass, block) = keys.counts(&place, now);
                    let counts = Counts {
                        pass,
                        block,
                        ..Counts::default()
                    };
                    KeyRow {
                        key: Some(key(k)),
                        snapshot: Snapshot::compact((pass, block), place.limit),
                        counts,
                        in_total: true,
                        entry: None,
                    }
                },
                |row| rows.push(row),
            );
            return rows;
        }
        // Room for every entry and the overflow row: no regrowth.
        let mut rows = Vec::with_capacity(self.registry().entries_len() + 1);
        self.registry().for_each_entry(|k, entry| {
            rows.push(KeyRow::read(Some(key(k)), entry, now, true));
        });
        rows
    }

    /// The overflow entry's row (`key` is `None`), if it is in use
    /// (anything in flight or in its windows) or has history.
    #[cfg(feature = "dashboard")]
    pub(crate) fn overflow_row<T>(&self, now: u64) -> Option<KeyRow<T>> {
        if let Some(keys) = self.compact() {
            if keys.overflow_idle(now) {
                return None;
            }
            let place = keys.table().overflow_place();
            let (pass, block) = keys.counts(&place, now);
            return Some(KeyRow {
                key: None,
                snapshot: Snapshot::compact((pass, block), place.limit),
                counts: Counts {
                    pass,
                    block,
                    ..Counts::default()
                },
                in_total: true,
                entry: None,
            });
        }
        let overflow = self.registry().overflow();
        let at = effective_now(overflow, now);
        if overflow.node.is_idle_at(at) && overflow.node.history(at).is_empty() {
            return None;
        }
        // In the total only while in use, as in `StatsHandle::total`.
        let in_use = !overflow.node.is_idle_at(at);
        Some(KeyRow::read(None, overflow, now, in_use))
    }
}

/// One entry as the dashboard lists it.
#[cfg(feature = "dashboard")]
pub(crate) struct KeyRow<T> {
    /// What [`StatsHandle::rows`] made of the key; `None` for the overflow
    /// entry.
    pub(crate) key: Option<T>,
    pub(crate) snapshot: Snapshot,
    /// The window's counts behind `snapshot`, for a total read in the same
    /// pass.
    counts: Counts,
    /// Whether [`total`] counts this row (the idle overflow entry does not).
    in_total: bool,
    /// The full entry (`None` for a compact key: no breakers, no history).
    entry: Option<Arc<Entry>>,
}

/// Every row that counts summed, as [`StatsHandle::total`] sums the
/// entries it visits: counts, concurrency, waiting and limits add up, with
/// one window read per entry shared with the rows' snapshots.
#[cfg(feature = "dashboard")]
pub(crate) fn total<T>(rows: &[KeyRow<T>]) -> Snapshot {
    let mut counts = Counts::default();
    let (mut concurrency, mut waiting, mut limit) = (0u64, 0u64, 0u64);
    for row in rows.iter().filter(|row| row.in_total) {
        counts.merge(&row.counts);
        concurrency = concurrency.saturating_add(row.snapshot.concurrency);
        waiting = waiting.saturating_add(row.snapshot.waiting);
        limit = limit.saturating_add(row.snapshot.limit);
    }
    let mut total = Snapshot::from_counts(&counts, concurrency, limit);
    total.waiting = waiting;
    total
}

#[cfg(feature = "dashboard")]
impl<T> KeyRow<T> {
    /// `entry`'s row, read at `now` (or at its newest bucket, if later).
    fn read(key: Option<T>, entry: &Arc<Entry>, now: u64, in_total: bool) -> Self {
        let at = effective_now(entry, now);
        // An idle key (most of a large table, at any moment) has nothing in
        // its window: its newest bucket start says so without a read of
        // every bucket.
        let counts = if entry.node.is_idle_at(at) {
            Counts::default()
        } else {
            entry.node.window_counts(at)
        };
        let mut snapshot =
            Snapshot::from_counts(&counts, entry.node.cur_concurrency(), entry.limit());
        snapshot.waiting = entry.waiting();
        KeyRow {
            key,
            snapshot,
            counts,
            in_total,
            entry: Some(Arc::clone(entry)),
        }
    }

    /// The state of the entry's circuit breakers at `now`, the worst
    /// first: `open` if any is open, else `half_open` if any is, else
    /// `closed`; `None` when the layer has no breakers.
    pub(crate) fn breaker(&self, now: u64) -> Option<&'static str> {
        let entry = self.entry.as_ref()?;
        if entry.breakers.is_empty() {
            return None;
        }
        let states = entry.breakers.states(effective_now(entry, now));
        let rank = |state: &BreakerState| match state {
            BreakerState::Open { .. } => 2,
            BreakerState::HalfOpen => 1,
            BreakerState::Closed => 0,
        };
        states
            .iter()
            .max_by_key(|s| rank(s))
            .map(BreakerState::name)
    }

    /// The entry's history at `now` (see [`StatsHandle::history`]).
    pub(crate) fn history(&self, now: u64) -> Vec<MetricNode> {
        match &self.entry {
            Some(entry) => entry.node.history(effective_now(entry, now)),
            None => Vec::new(),
        }
    }
}
