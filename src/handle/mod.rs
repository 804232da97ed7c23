//! Reading live statistics and changing limits at run time.

#[cfg(any(feature = "prometheus", feature = "dashboard"))]
mod export;
mod snapshot;

#[cfg(feature = "dashboard")]
pub(crate) use export::total as rows_total;
#[cfg(feature = "dashboard")]
pub(crate) use export::KeyRow;
#[cfg(feature = "prometheus")]
pub(crate) use export::Lifetime;
pub use snapshot::Snapshot;

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use crate::flow::breaker::BreakerState;
use crate::key::IntoKey;
use crate::stat::{Counts, MetricNode};
use crate::store::{effective_now, Entry, Registry, RemoteSlot, Store};

/// A cloneable handle on a [`SlidingWindowLayer`](crate::SlidingWindowLayer)'s
/// live statistics and limits.
///
/// Every handle, the layer, its clones and its services share one state
/// (built on first use, see the layer's
/// [shared state](crate::SlidingWindowLayer#shared-state)).
///
/// The key table is split into shards, each behind a read-write lock.
/// Requests for a known key take one shard's read lock; a request for a new
/// key, an eviction sweep and `set_limit` take one shard's write lock,
/// briefly. A read here takes one shard's read lock to find a key, then
/// reads the key's counters without locking; [`keys`](Self::keys),
/// [`snapshots`](Self::snapshots), [`for_each`](Self::for_each) and
/// [`total`](Self::total) visit every shard in turn, holding its lock only
/// to copy pointers, never while cloning keys or reading counters.
///
/// Statistics are read at the later of the clock's reading and the start of
/// the key's newest bucket: after a clock steps back, a key's snapshot still
/// shows the passes and blocks that admission counts against it.
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
    store: Arc<Store<K>>,
    /// The layer's shared store, if it has one (feature `redis`).
    remote: RemoteSlot<K>,
}

impl<K> StatsHandle<K> {
    pub(crate) fn new(store: Arc<Store<K>>) -> Self {
        StatsHandle {
            store,
            remote: RemoteSlot::none(),
        }
    }

    /// The same handle, aware of the layer's shared store.
    pub(crate) fn with_remote(mut self, remote: RemoteSlot<K>) -> Self {
        self.remote = remote;
        self
    }
}

impl<K> Clone for StatsHandle<K> {
    fn clone(&self) -> Self {
        StatsHandle {
            store: Arc::clone(&self.store),
            remote: self.remote.clone(),
        }
    }
}

impl<K> fmt::Debug for StatsHandle<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatsHandle")
            .field("state", &self.store)
            .finish()
    }
}

/// # Reading statistics
impl<K: Clone + Eq + Hash + Send + Sync + 'static> StatsHandle<K> {
    fn registry(&self) -> &Registry<K> {
        self.store.registry()
    }

    fn now(&self) -> u64 {
        use crate::clock::Clock;
        self.registry().clock().now_millis()
    }

    /// Statistics of `key` in its current window, or `None` if the key has
    /// no entry (never seen, evicted, or sharing the overflow entry).
    pub fn snapshot<Q>(&self, key: &Q) -> Option<Snapshot>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let entry = self.registry().get(key)?;
        Some(Snapshot::of(&entry, self.now()))
    }

    /// The finished seconds of the last minute for `key`, oldest first, as
    /// [`MetricNode`]s (pass, block, success, exception and average
    /// response time per second); seconds without events are skipped and
    /// the current second is never included. Empty for a key without an
    /// entry (never seen, evicted, or sharing the overflow entry).
    ///
    /// A read, not a drain: every call returns the whole minute (unlike
    /// [`StatisticNode::metrics`](crate::stat::StatisticNode::metrics)). A
    /// key's history goes with its entry when an idle key is evicted.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{routing::get, Router};
    /// use tower::ServiceExt;
    /// use tower_sliding_window::clock::ManualClock;
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let clock = ManualClock::new(10_000);
    /// let layer = SlidingWindowLayer::qps(2).clock(clock.clone());
    /// let stats = layer.handle();
    /// let app = Router::new().route("/", get(|| async { "hi" })).layer(layer);
    /// for _ in 0..3 {
    ///     let request = http::Request::get("/").body(axum::body::Body::empty()).unwrap();
    ///     app.clone().oneshot(request).await.unwrap();
    /// }
    /// clock.advance(Duration::from_secs(1));
    /// let history = stats.history(&());
    /// assert_eq!(history.len(), 1);
    /// assert_eq!(history[0].timestamp_ms, 10_000);
    /// assert_eq!((history[0].pass, history[0].block), (2, 1));
    /// # }
    /// ```
    pub fn history<Q>(&self, key: &Q) -> Vec<MetricNode>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.registry().get(key) {
            Some(entry) => entry.node.history(self.now()),
            None => Vec::new(),
        }
    }

    /// Who is being limited: the `n` keys with the most blocks over the
    /// last minute, most first, with their counts (ties in no particular
    /// order). Every refusal of the layer counts, whatever refused it (the
    /// window, `throttle`, a concurrency limit, a breaker, the shared
    /// store), under the request's own key, also when that key shares the
    /// overflow entry or was evicted since. `n = 0` is empty; an `n` past
    /// the keys held returns every key held. With a Redis store the counts
    /// are this replica's refusals, as every statistic is.
    ///
    /// # The last minute
    ///
    /// The layer's clock is cut into 10-second periods; the counts cover
    /// the current period so far and the five before it: the blocks from
    /// the start of the current period minus 50 s up to now, so between
    /// the last 50 and the last 60 seconds (the layer's windows count the
    /// same way). A block older than that is not counted.
    ///
    /// # Bounded memory, and how exact
    ///
    /// Memory does not grow with the number of keys: each period is a
    /// Space-Saving summary (Metwally et al.) of at most 1 024 keys, split
    /// by key hash into 16 shards of 64 keys, each shard behind its own
    /// lock so that a flood of refusals is not serialized on one. Nothing
    /// is allocated before the first block; at most, with `String` keys,
    /// about 480 KiB plus the bytes of the (at most 6 144) keys held. A
    /// block allocates nothing for a key that holds a counter, and makes
    /// the key owned once for one that does not.
    ///
    /// - Counts are **exact** while no shard has seen more distinct keys
    ///   blocked in one period than its 64 counters: always with fewer
    ///   than 64 distinct blocked keys, and typically up to a few hundred
    ///   (keys are spread over the shards by a randomly seeded hash).
    /// - Otherwise a count is **never under** the key's true number of
    ///   blocks, and over it by at most `N / 64`, where `N` is the number of
    ///   blocks the covered periods saw among the keys of the key's shard
    ///   (at most the layer's blocks in the minute): more precisely, by at
    ///   most the sum of the smallest counts of the shard's full periods.
    /// - Any key with more blocks than that bound is listed. So a few
    ///   heavy clients stand out among any number of light ones, while
    ///   keys with a handful of blocks each may be missing or over-counted
    ///   among thousands.
    ///
    /// The counts are not a [`Snapshot`]'s `block` (which covers the
    /// key's current window, and only while the key has an entry); they
    /// say who was refused most, not what the limiter decides on.
    ///
    /// ```
    /// use axum::{body::Body, routing::get, Router};
    /// use tower::ServiceExt;
    /// use tower_sliding_window::clock::ManualClock;
    /// use tower_sliding_window::{PathKey, SlidingWindowLayer};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// // A clock that stands still: all in one window.
    /// let clock = ManualClock::new(10_000);
    /// let layer = SlidingWindowLayer::qps(1).key(PathKey).clock(clock);
    /// let stats = layer.handle();
    /// let app = Router::new()
    ///     .route("/{*path}", get(|| async { "hi" }))
    ///     .layer(layer);
    /// // Each path passes once in its second, then is refused.
    /// for (path, sent) in [("/search", 4), ("/login", 2), ("/about", 1)] {
    ///     for _ in 0..sent {
    ///         let request = http::Request::get(path).body(Body::empty()).unwrap();
    ///         app.clone().oneshot(request).await.unwrap();
    ///     }
    /// }
    /// assert_eq!(
    ///     stats.top_blocked(10),
    ///     [("/search".to_owned(), 3), ("/login".to_owned(), 1)]
    /// );
    /// assert!(stats.top_blocked(0).is_empty());
    /// # }
    /// ```
    pub fn top_blocked(&self, n: usize) -> Vec<(K, u64)> {
        self.registry().blocked().top(n, self.now())
    }

    /// The state of `key`'s circuit breakers, one per
    /// [`breaker`](crate::SlidingWindowLayer::breaker) of the layer, in the
    /// order they were given. Empty when the layer has none, or when the key
    /// has no entry (never seen, evicted, or sharing the overflow entry):
    /// such a key's breakers are closed. An entry whose breaker is not
    /// closed is never evicted.
    ///
    /// ```
    /// use tower_sliding_window::breaker::{Breaker, BreakerState};
    /// use tower_sliding_window::{PathKey, SlidingWindowLayer};
    ///
    /// let layer = SlidingWindowLayer::qps(100)
    ///     .key(PathKey)
    ///     .breaker(Breaker::error_ratio(0.5));
    /// let stats = layer.handle();
    /// let open = stats
    ///     .breakers("/search")
    ///     .iter()
    ///     .any(|state| matches!(state, BreakerState::Open { .. }));
    /// assert!(!open);
    /// ```
    pub fn breakers<Q>(&self, key: &Q) -> Vec<BreakerState>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.registry().get(key) {
            Some(entry) => entry.breakers.states(effective_now(&entry, self.now())),
            None => Vec::new(),
        }
    }

    /// Every key that has an entry.
    ///
    /// The keys are cloned after each shard's lock is released (see
    /// [`for_each`](Self::for_each)).
    pub fn keys(&self) -> Vec<K> {
        let mut keys = Vec::new();
        self.registry()
            .for_each_entry(|key, _| keys.push(K::clone(key)));
        keys
    }

    /// Every key that has an entry, with its statistics.
    pub fn snapshots(&self) -> Vec<(K, Snapshot)> {
        let now = self.now();
        let mut all = Vec::new();
        self.registry().for_each_entry(|key, entry| {
            all.push((K::clone(key), Snapshot::of(entry, now)));
        });
        all
    }

    /// Calls `f` with every key that has an entry and its statistics,
    /// cloning no key: for exporters that write each key out as they go.
    ///
    /// The table is visited one shard at a time; a shard's lock is held only
    /// to copy pointers to its keys and entries, and `f` runs with no lock
    /// held, so a slow `f` delays no request. Keys inserted or evicted
    /// during the visit may or may not be seen.
    ///
    /// ```
    /// use std::fmt::Write;
    /// use tower_sliding_window::{PathKey, SlidingWindowLayer};
    ///
    /// let layer = SlidingWindowLayer::qps(100).key(PathKey);
    /// let stats = layer.handle();
    ///
    /// // Prometheus text format, one line per key and count.
    /// let mut out = String::new();
    /// stats.for_each(|path: &String, snapshot| {
    ///     let _ = writeln!(out, "requests_passed{{path={path:?}}} {}", snapshot.pass);
    ///     let _ = writeln!(out, "requests_blocked{{path={path:?}}} {}", snapshot.block);
    /// });
    /// # assert!(out.is_empty());
    /// ```
    pub fn for_each(&self, mut f: impl FnMut(&K, Snapshot)) {
        let now = self.now();
        self.registry()
            .for_each_entry(|key, entry| f(key, Snapshot::of(entry, now)));
    }

    /// Statistics of the overflow entry: keys that found no room (see
    /// [`max_keys`](crate::SlidingWindowLayer::max_keys)).
    pub fn overflow(&self) -> Snapshot {
        Snapshot::of(self.registry().overflow(), self.now())
    }

    /// Number of entries: keys with their own statistics, plus one for the
    /// overflow entry while it is in use (anything in flight or in its
    /// windows). Never more than `max_keys` + 1 + keys with their own limit.
    pub fn len(&self) -> usize {
        let overflow = self.registry().overflow();
        let in_use = !overflow
            .node
            .is_idle_at(effective_now(overflow, self.now()));
        self.registry().entries_len() + usize::from(in_use)
    }

    /// Whether no key has an entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All entries summed, the overflow entry included: counts and
    /// concurrency add up, `limit` is the sum of the limits, `min_rt` is the
    /// smallest and `avg_rt` is weighted by successes. No key is cloned.
    pub fn total(&self) -> Snapshot {
        let now = self.now();
        let registry = self.registry();
        let mut counts = Counts::default();
        let (mut concurrency, mut waiting, mut limit) = (0u64, 0u64, 0u64);
        let mut add = |entry: &Entry| {
            counts.merge(&entry.node.window_counts(effective_now(entry, now)));
            concurrency = concurrency.saturating_add(entry.node.cur_concurrency());
            waiting = waiting.saturating_add(entry.waiting());
            limit = limit.saturating_add(entry.limit());
        };
        registry.for_each_entry(|_, entry| add(entry));
        let overflow = registry.overflow();
        if !overflow.node.is_idle_at(effective_now(overflow, now)) {
            add(overflow);
        }
        let mut total = Snapshot::from_counts(&counts, concurrency, limit);
        total.waiting = waiting;
        total
    }

    /// The state of the layer's [`system`](crate::SlidingWindowLayer::system)
    /// rule: the CPU use and the layer-wide totals its checks read now, and
    /// its refusals per check so far. `None` when the layer has no system
    /// rule.
    ///
    /// ```
    /// use tower_sliding_window::system::{SystemCheck, SystemRule};
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// let layer = SlidingWindowLayer::qps(100).system(SystemRule::bbr().cpu_source(|| 0.25));
    /// let system = layer.handle().system().expect("a system rule is set");
    /// assert_eq!(system.cpu, 0.25);
    /// assert!(!system.bbr_active);
    /// assert_eq!(system.refusals_of(SystemCheck::Bbr), 0);
    /// assert!(SlidingWindowLayer::qps(100).handle().system().is_none());
    /// ```
    pub fn system(&self) -> Option<crate::system::SystemStatus> {
        self.registry().system().map(|system| system.status())
    }
}

/// # Changing limits
impl<K: Clone + Eq + Hash + Send + Sync + 'static> StatsHandle<K> {
    /// Sets `key`'s limit. It applies from the next request, against the
    /// window as it is (no burst: passes already counted stay counted), also
    /// to a key not seen yet, and it survives eviction of the key's
    /// statistics. A limit of 0 blocks the key entirely. `key` is anything
    /// that [converts into the key type](IntoKey).
    ///
    /// ```
    /// use http::HeaderName;
    /// use tower_sliding_window::{HeaderKey, SlidingWindowLayer};
    ///
    /// let layer = SlidingWindowLayer::qps(10)
    ///     .key(HeaderKey::new(HeaderName::from_static("x-tenant")));
    /// let stats = layer.handle();
    /// stats.set_limit("internal", 1_000);
    /// assert!(stats.remove_limit(&Some("internal".to_owned())));
    /// ```
    ///
    /// With a [`store`](crate::SlidingWindowLayer::store) (feature `redis`),
    /// the limit is also written to Redis, where it overrides the limit of
    /// every replica that shares the key (see
    /// [`RedisStore::set_limit`](crate::store::RedisStore::set_limit)). The
    /// write runs in the background on the current tokio runtime; outside
    /// one, or if it fails, it is logged and only this replica's limit
    /// changes. Await `RedisStore::set_limit` for a confirmed write.
    pub fn set_limit(&self, key: impl IntoKey<K>, limit: u64) {
        let key = key.into_key();
        #[cfg(feature = "redis")]
        self.write_remote_limit(&key, Some(limit));
        self.registry().set_limit(key, limit);
    }

    /// Removes `key`'s own limit (from a [`rule`](crate::SlidingWindowLayer::rule)
    /// or [`set_limit`](Self::set_limit)): the key is limited by the default
    /// limit again, from the next request. Returns whether it had its own
    /// limit. With a store, when the key had its own limit here, the limit
    /// in Redis is removed too (in the background, as
    /// [`set_limit`](Self::set_limit) writes it).
    pub fn remove_limit<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        #[cfg(feature = "redis")]
        if let Some(owned) = self.registry().own_limit_key(key) {
            self.write_remote_limit(&owned, None);
        }
        self.registry().remove_limit(key)
    }
}

/// # The shared store (feature `redis`)
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
impl<K: Clone + Eq + Hash + Send + Sync + 'static> StatsHandle<K> {
    /// The layer's [`RedisStore`](crate::store::RedisStore) status: whether
    /// admissions are decided in Redis or by the failure policy now, and
    /// its counters. `None` when the layer has no store (or the handle was
    /// taken before [`store`](crate::SlidingWindowLayer::store)).
    pub fn store_status(&self) -> Option<crate::store::StoreStatus> {
        self.remote
            .remote
            .as_ref()
            .map(|remote| remote.store.status())
    }

    /// Writes (`Some`) or removes (`None`) `key`'s limit in Redis, in the
    /// background.
    fn write_remote_limit(&self, key: &K, limit: Option<u64>) {
        let Some((store, id)) = self.remote.identity_of(key) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "StatsHandle: a limit change was not written to Redis (no tokio runtime here); \
                 only this replica's limit changed"
            );
            return;
        };
        // The limit is named after the layer's window (a builder's store
        // has not taken it yet): the one its requests are admitted on.
        let window = crate::store::redis::RemoteWindow::of(self.registry().window());
        let store = store.clone().with_window(window);
        runtime.spawn(async move {
            let written = match limit {
                Some(limit) => store.set_limit_id(id, limit).await,
                None => store.remove_limit_id(id).await.map(|_| ()),
            };
            if let Err(err) = written {
                tracing::warn!(error = %err, "StatsHandle: a limit change was not written to Redis");
            }
        });
    }
}
