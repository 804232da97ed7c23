//! Reading live statistics and changing limits at run time.

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use crate::http::shared::Shared;
use crate::registry::Entry;
use crate::stat::Counts;

/// A cloneable handle on a [`SlidingWindowLayer`](crate::SlidingWindowLayer)'s
/// live statistics and limits.
///
/// Every handle, the layer, its clones and its services share one state.
/// A read takes one shard's read lock to find a key (requests only read
/// those locks too), then reads the key's counters without locking;
/// [`keys`](Self::keys), [`snapshots`](Self::snapshots) and
/// [`total`](Self::total) visit every shard in turn. `set_limit` takes one
/// shard's write lock briefly.
///
/// ```
/// use tower_sliding_window::{PathKey, SlidingWindowLayer};
///
/// let layer = SlidingWindowLayer::qps(100).key(PathKey);
/// let stats = layer.handle();
///
/// // Later, from an admin endpoint or a background task:
/// stats.set_limit("/search", 20);
/// if let Some(snapshot) = stats.snapshot("/search") {
///     println!("{} passed, {} blocked", snapshot.pass, snapshot.block);
/// }
/// println!("{} keys, {:?}", stats.len(), stats.total());
/// ```
pub struct StatsHandle<K> {
    shared: Arc<Shared<K>>,
}

impl<K> StatsHandle<K> {
    pub(crate) fn new(shared: Arc<Shared<K>>) -> Self {
        StatsHandle { shared }
    }
}

impl<K> Clone for StatsHandle<K> {
    fn clone(&self) -> Self {
        StatsHandle {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K> fmt::Debug for StatsHandle<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatsHandle")
            .field("state", &self.shared)
            .finish()
    }
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> StatsHandle<K> {
    fn now(&self) -> u64 {
        use crate::clock::Clock;
        self.shared.registry.clock().now_millis()
    }

    /// Statistics of `key` in its current window, or `None` if the key has
    /// no entry (never seen, evicted, or sharing the overflow entry).
    pub fn snapshot<Q>(&self, key: &Q) -> Option<Snapshot>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let entry = self.shared.registry.get(key)?;
        Some(Snapshot::of(&entry, self.now()))
    }

    /// Every key that has an entry.
    pub fn keys(&self) -> Vec<K> {
        self.shared
            .registry
            .entries()
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }

    /// Every key that has an entry, with its statistics.
    pub fn snapshots(&self) -> Vec<(K, Snapshot)> {
        let now = self.now();
        self.shared
            .registry
            .entries()
            .into_iter()
            .map(|(k, e)| (k, Snapshot::of(&e, now)))
            .collect()
    }

    /// Statistics of the overflow entry: keys that found no room (see
    /// [`max_keys`](crate::SlidingWindowLayer::max_keys)).
    pub fn overflow(&self) -> Snapshot {
        Snapshot::of(self.shared.registry.overflow(), self.now())
    }

    /// Number of entries: keys with their own statistics, plus one for the
    /// overflow entry while it is in use (anything in flight or in its
    /// windows). Never more than `max_keys` + 1 + keys with their own limit.
    pub fn len(&self) -> usize {
        let overflow = !self.shared.registry.overflow().node.is_idle_at(self.now());
        self.shared.registry.entries_len() + usize::from(overflow)
    }

    /// Whether no key has an entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All entries summed, the overflow entry included: counts and
    /// concurrency add up, `limit` is the sum of the limits, `min_rt` is the
    /// smallest and `avg_rt` is weighted by successes.
    pub fn total(&self) -> Snapshot {
        let now = self.now();
        let registry = &self.shared.registry;
        let overflow = registry.overflow();
        let entries = registry.entries();
        let overflow_used = !overflow.node.is_idle_at(now);
        let mut counts = Counts::default();
        let (mut concurrency, mut limit) = (0u64, 0u64);
        let all = entries
            .iter()
            .map(|(_, e)| e)
            .chain(overflow_used.then_some(overflow));
        for entry in all {
            counts.merge(&window_counts(entry, now));
            concurrency = concurrency.saturating_add(entry.node.cur_concurrency());
            limit = limit.saturating_add(entry.limit());
        }
        Snapshot::from_counts(&counts, concurrency, limit)
    }

    /// Sets `key`'s limit. It applies from the next request, against the
    /// window as it is (no burst: passes already counted stay counted), also
    /// to a key not seen yet, and it survives eviction of the key's
    /// statistics. A limit of 0 blocks the key entirely.
    pub fn set_limit(&self, key: impl Into<K>, limit: u64) {
        self.shared.registry.set_limit(key.into(), limit);
    }
}

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
    pub(crate) fn of(entry: &Entry, now: u64) -> Snapshot {
        Snapshot::from_counts(
            &window_counts(entry, now),
            entry.node.cur_concurrency(),
            entry.limit(),
        )
    }

    fn from_counts(counts: &Counts, concurrency: u64, limit: u64) -> Snapshot {
        Snapshot {
            pass: counts.pass,
            block: counts.block,
            success: counts.success,
            exception: counts.exception,
            concurrency,
            limit,
            // Over all successes summed: weighted by successes for `total`.
            avg_rt: counts.avg_rt(),
            min_rt: counts.min_rt(),
        }
    }
}

/// An entry's counts over its second window at `now`.
fn window_counts(entry: &Entry, now: u64) -> Counts {
    entry.node.window_counts(now)
}
