//! Reading live statistics and changing limits at run time.

#[cfg(any(feature = "prometheus", feature = "dashboard"))]
mod export;
mod snapshot;
mod windows;

#[cfg(feature = "dashboard")]
pub(crate) use export::total as rows_total;
#[cfg(feature = "dashboard")]
pub(crate) use export::KeyRow;
#[cfg(feature = "prometheus")]
pub(crate) use export::Lifetime;
pub use snapshot::Snapshot;
pub use windows::WindowCount;

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use crate::flow::breaker::BreakerState;
use crate::key::IntoKey;
use crate::rules::{RuleKey, Rules, RulesError, RulesStatus};
use crate::stat::{Counts, MetricNode};
use crate::store::{effective_now, CompactKeys, Entry, Registry, RemoteSlot, Store};

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
/// On a [`compact`](crate::SlidingWindowLayer::compact) layer the table is
/// in groups of 16 slots, each behind its lock, and the same reads work: a
/// key's [`Snapshot`] has its window's `pass` and `block` and its `limit`
/// (the rest is 0 or `None`), [`history`](Self::history) and
/// [`breakers`](Self::breakers) are empty, and the visits
/// ([`keys`](Self::keys), [`snapshots`](Self::snapshots),
/// [`for_each`](Self::for_each), [`total`](Self::total)) clone the keys of
/// one group at a time under its read lock (keys are stored in the table
/// itself) and run the caller's code with no lock held.
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

    /// The compact table, if the layer is compact.
    fn compact(&self) -> Option<&CompactKeys<K>> {
        self.store.compact().map(|keys| &**keys)
    }

    /// Calls `f` with every key of a compact layer and its snapshot at
    /// `now`, a group of the table at a time: the keys of a group are
    /// cloned under its read lock, and `f` runs with no lock held.
    fn for_each_compact(&self, keys: &CompactKeys<K>, now: u64, mut f: impl FnMut(&K, Snapshot)) {
        keys.table().for_each(
            |key, place| {
                let place = keys.routed(key, place);
                let snapshot = Snapshot::compact(keys.counts(&place, now), place.limit);
                (key.clone(), snapshot)
            },
            |(key, snapshot)| f(&key, snapshot),
        );
    }

    /// Statistics of `key` in its current window, or `None` if the key has
    /// no entry (never seen, evicted, or sharing the overflow entry).
    pub fn snapshot<Q>(&self, key: &Q) -> Option<Snapshot>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(keys) = self.compact() {
            let now = self.now();
            return keys.table().get_keyed(key, |key, place| {
                let place = keys.routed(key, place);
                Snapshot::compact(keys.counts(&place, now), place.limit)
            });
        }
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
        if self.compact().is_some() {
            return Vec::new();
        }
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
        if self.compact().is_some() {
            return Vec::new();
        }
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
        if let Some(compact) = self.compact() {
            let mut keys = Vec::new();
            compact
                .table()
                .for_each(|key, _| key.clone(), |key| keys.push(key));
            return keys;
        }
        let mut keys = Vec::new();
        self.registry()
            .for_each_entry(|key, _| keys.push(K::clone(key)));
        keys
    }

    /// Every key that has an entry, with its statistics.
    pub fn snapshots(&self) -> Vec<(K, Snapshot)> {
        let now = self.now();
        let mut all = Vec::new();
        if let Some(keys) = self.compact() {
            self.for_each_compact(keys, now, |key, snapshot| all.push((key.clone(), snapshot)));
            return all;
        }
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
    /// during the visit may or may not be seen. On a compact layer each key
    /// is cloned (see [`StatsHandle`]).
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
        if let Some(keys) = self.compact() {
            return self.for_each_compact(keys, now, f);
        }
        self.registry()
            .for_each_entry(|key, entry| f(key, Snapshot::of(entry, now)));
    }

    /// Statistics of the overflow entry: keys that found no room (see
    /// [`max_keys`](crate::SlidingWindowLayer::max_keys)).
    pub fn overflow(&self) -> Snapshot {
        if let Some(keys) = self.compact() {
            let place = keys.table().overflow_place();
            return Snapshot::compact(keys.counts(&place, self.now()), place.limit);
        }
        Snapshot::of(self.registry().overflow(), self.now())
    }

    /// Number of entries: keys with their own statistics, plus one for the
    /// overflow entry while it is in use (anything in flight or in its
    /// windows). Never more than `max_keys` + 1 + keys with their own limit.
    pub fn len(&self) -> usize {
        if let Some(keys) = self.compact() {
            let in_use = !keys.overflow_idle(self.now());
            return keys.table().len() + usize::from(in_use);
        }
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

    /// All entries summed, the overflow entries included (the layer's, and
    /// on a full layer those of routes with a rule): counts and
    /// concurrency add up, `limit` is the sum of the limits, `min_rt` is the
    /// smallest and `avg_rt` is weighted by successes. No key is cloned.
    pub fn total(&self) -> Snapshot {
        let now = self.now();
        if let Some(keys) = self.compact() {
            let (mut pass, mut block, mut limit) = (0u64, 0u64, 0u64);
            let mut add = |snapshot: Snapshot| {
                pass = pass.saturating_add(snapshot.pass);
                block = block.saturating_add(snapshot.block);
                limit = limit.saturating_add(snapshot.limit);
            };
            keys.table().for_each(
                |key, place| {
                    let place = keys.routed(key, place);
                    Snapshot::compact(keys.counts(&place, now), place.limit)
                },
                &mut add,
            );
            if !keys.overflow_idle(now) {
                let place = keys.table().overflow_place();
                add(Snapshot::compact(keys.counts(&place, now), place.limit));
            }
            return Snapshot::compact((pass, block), limit);
        }
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
        // The overflow entries of routes with a rule, likewise.
        registry.routes().for_each_overflow(|overflow| {
            if !overflow.node.is_idle_at(effective_now(overflow, now)) {
                add(overflow);
            }
        });
        registry.windows().for_each_route_overflow(|_, overflow| {
            if !overflow.node.is_idle_at(effective_now(overflow, now)) {
                add(overflow);
            }
        });
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
    /// that [converts into the key type](IntoKey). On a
    /// [`compact`](crate::SlidingWindowLayer::compact) layer a limit above
    /// 65 535 (the most a compact window counts) is taken as 65 535, with a
    /// `warn` event; it never panics.
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
        if let Some(keys) = self.compact() {
            return keys.set_limit(key, limit, self.now());
        }
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
        if let Some(keys) = self.compact() {
            return keys.remove_limit(key, self.now());
        }
        self.registry().remove_limit(key)
    }
}

/// # Rules as data
impl<K: Clone + Eq + Hash + Send + Sync + 'static> StatsHandle<K> {
    /// Applies a rules document: its default limit and every per-key limit,
    /// all of it or nothing (see [`rules`](crate::rules) for the document).
    ///
    /// Every rule is checked first (each limit at most
    /// [`MAX_LIMIT`](crate::rules::MAX_LIMIT), each key read into the key
    /// type through [`RuleKey`], no key named twice). On the first that is
    /// wrong, nothing changes and the error names the rule and the field:
    /// `rules: limits["/login"]: limit must be at most ...`. Otherwise the
    /// document replaces the limits as a whole: the default becomes
    /// `default` (absent: the layer's own), each key in `limits` gets its
    /// limit, and every key that had its own limit (from earlier rules,
    /// [`rule`](crate::SlidingWindowLayer::rule) or
    /// [`set_limit`](Self::set_limit)) and is absent goes back to the
    /// default. The overflow entry follows the default unless
    /// [`overflow_limit`](crate::SlidingWindowLayer::overflow_limit) set
    /// its own. Returns the new [`version`](RulesStatus::version).
    ///
    /// For a layer keyed by client and route
    /// ([`ClientRouteKey`](crate::ClientRouteKey)), `routes` replaces the
    /// route rules likewise: each route in it gets its limit for every
    /// client separately, and routes with a rule that are absent (given by
    /// [`route_rule`](crate::SlidingWindowLayer::route_rule) or
    /// [`set_route_limit`](Self::set_route_limit) included) go back to the
    /// default. A document with `routes` for a layer whose keys have no
    /// route part is refused (`routes["..."]`, field `route`). On a
    /// [`compact`](crate::SlidingWindowLayer::compact) layer, limits above
    /// 65 535 are taken as 65 535, with a `warn` event.
    ///
    /// # No burst, and what a concurrent request sees
    ///
    /// Each key's window is kept: passes already counted stay counted, so a
    /// lower limit refuses at once and a higher one admits only the
    /// difference, exactly as [`set_limit`](Self::set_limit). Documents
    /// applied at once (from two threads, or a watcher and code) are
    /// applied one after the other. A request that starts after this
    /// returns sees the whole new document. While it runs, the keys are
    /// brought to their new limits one part of the table after another: a
    /// request then sees either its key's old limit or its new one, never
    /// anything else, and two requests for two keys may see one the old
    /// and the other the new document. Nothing is allocated or locked on a
    /// request's path for this.
    ///
    /// With a [`store`](crate::SlidingWindowLayer::store) (feature
    /// `redis`), each per-key limit set or removed is written to Redis in
    /// the background, as [`set_limit`](Self::set_limit) writes it.
    ///
    /// ```
    /// use std::net::{IpAddr, Ipv4Addr};
    /// use tower_sliding_window::rules::Rules;
    /// use tower_sliding_window::{PeerIpKey, SlidingWindowLayer};
    ///
    /// let stats = SlidingWindowLayer::qps(10).key(PeerIpKey).handle();
    /// let rules: Rules = serde_json::from_str(
    ///     r#"{ "default": 20, "limits": { "10.0.0.7": 500 } }"#,
    /// ).unwrap();
    /// assert_eq!(stats.apply_rules(&rules), Ok(1));
    ///
    /// // A later document without the rule: 10.0.0.7 is back on the default.
    /// assert_eq!(stats.apply_rules(&Rules::new().default_limit(30)), Ok(2));
    /// assert!(!stats.remove_limit(&Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7)))));
    /// ```
    pub fn apply_rules(&self, rules: &Rules) -> Result<u64, RulesError>
    where
        K: RuleKey,
    {
        let registry = self.registry();
        let status = registry.rules();
        let _applying = crate::rules::lock(&status.applying);
        let checked = match crate::rules::check::<K>(rules) {
            Ok(checked) => checked,
            Err(err) => {
                status.failed(&err);
                return Err(err);
            }
        };
        let routes = match crate::rules::check_routes::<K>(rules) {
            Ok(routes) => routes,
            Err(err) => {
                status.failed(&err);
                return Err(err);
            }
        };
        // The further windows' section is checked before anything applies.
        let further = registry.windows();
        let mut checked_windows =
            match crate::rules::check_windows::<K>(rules, further.len(), |ms| further.index_of(ms))
            {
                Ok(checked) => checked,
                Err(err) => {
                    status.failed(&err);
                    return Err(err);
                }
            };
        let limits: std::collections::HashMap<K, u64> = checked.limits.into_iter().collect();
        #[cfg(feature = "redis")]
        let written = limits.clone();
        // The route rules first: `apply_rules` below brings every live
        // entry to its new limit, its route's included.
        registry.replace_routes(K::route_of_key(), self.route_limits_for_tier(routes));
        if let Some(keys) = self.compact() {
            keys.apply_rules(checked.default, limits.clone(), self.now());
            // A compact key's further windows count at most 65 535 passes
            // each, as its first: larger limits are taken as that maximum.
            let clamp = |limit: &mut Option<u64>| {
                if let Some(limit) = limit {
                    *limit = CompactKeys::<K>::clamp_limit(*limit);
                }
            };
            checked_windows.defaults.iter_mut().for_each(clamp);
            for limits in checked_windows.per_key.values_mut() {
                limits.iter_mut().for_each(clamp);
            }
        }
        let _replaced = registry.apply_rules(checked.default, limits);
        registry.apply_window_rules(
            &checked_windows.defaults,
            checked_windows.per_key,
            checked_windows.per_route,
        );
        #[cfg(feature = "redis")]
        {
            for (key, &limit) in &written {
                self.write_remote_limit(key, Some(limit));
            }
            for key in _replaced.keys().filter(|key| !written.contains_key(*key)) {
                self.write_remote_limit(key, None);
            }
        }
        Ok(status.applied())
    }

    /// `routes` as this layer keeps them: on a compact layer, a limit above
    /// 65 535 is taken as 65 535 (with a `warn` event), as `set_limit`
    /// takes it.
    fn route_limits_for_tier(
        &self,
        mut routes: std::collections::HashMap<String, u64>,
    ) -> std::collections::HashMap<String, u64> {
        if self.compact().is_some() {
            for limit in routes.values_mut() {
                *limit = CompactKeys::<K>::clamp_limit(*limit);
            }
        }
        routes
    }

    /// How many rules documents were applied, and why the latest attempt
    /// failed if it did (see [`RulesStatus`]).
    pub fn rules_status(&self) -> RulesStatus {
        self.registry().rules().get()
    }

    /// Records a failed attempt to read rules (a watcher's file error).
    #[cfg_attr(not(feature = "rules-file"), allow(dead_code))]
    pub(crate) fn rules_failed(&self, error: &RulesError) {
        self.registry().rules().failed(error);
    }
}

/// # Per-client limits per route
///
/// For a layer keyed by a pair `(client, route)`, such as
/// [`ClientRouteKey`](crate::ClientRouteKey): see the
/// [crate docs](crate#per-client-limits-per-route).
impl<C: Clone + Eq + Hash + Send + Sync + 'static> StatsHandle<(C, String)> {
    /// Sets `route`'s limit for every client of it separately, as
    /// [`route_rule`](crate::SlidingWindowLayer::route_rule) does in the
    /// builder. It applies from the next request to every key of the route
    /// without a rule of its own, against each key's window as it is (no
    /// burst: passes already counted stay counted, so a lower limit
    /// refuses at once and a higher one admits only the difference), also
    /// to clients not seen yet, and survives eviction. Keys with their own
    /// limit ([`set_limit`](Self::set_limit), an exact
    /// [`rule`](crate::SlidingWindowLayer::rule)) keep it. On a
    /// [`compact`](crate::SlidingWindowLayer::compact) layer a limit above
    /// 65 535 is taken as 65 535, with a `warn` event.
    ///
    /// Route changes and [`apply_rules`](Self::apply_rules) are applied one
    /// at a time; a request during the change sees its key's old limit or
    /// its new one, never another. A route rule is this replica's own: it
    /// is not written to a Redis store.
    ///
    /// # Errors
    ///
    /// When `route` is longer than [`MAX_KEY_BYTES`](crate::key::MAX_KEY_BYTES)
    /// (no built-in route extractor writes one: they key a longer route by
    /// its digest form); nothing changes then. The error names the rule
    /// (`routes["..."]`) and the field (`route`).
    ///
    /// ```
    /// use tower_sliding_window::{ClientRouteKey, MatchedPathKey, PeerIpKey, SlidingWindowLayer};
    ///
    /// let layer = SlidingWindowLayer::qps(100).key(ClientRouteKey::new(PeerIpKey, MatchedPathKey));
    /// let stats = layer.handle();
    /// stats.set_route_limit("POST /login", 5).unwrap();
    /// assert_eq!(stats.route_limits(), [("POST /login".to_owned(), 5)]);
    /// let err = stats.set_route_limit(&"x".repeat(300), 5).unwrap_err();
    /// assert_eq!(err.field(), Some("route"));
    /// assert!(stats.remove_route_limit("POST /login"));
    /// assert!(stats.route_limits().is_empty());
    /// ```
    pub fn set_route_limit(&self, route: &str, limit: u64) -> Result<(), RulesError> {
        crate::rules::check_route(route).map_err(|reason| {
            RulesError::invalid(crate::rules::route_rule_name(route), "route", reason)
        })?;
        let limit = if self.compact().is_some() {
            CompactKeys::<(C, String)>::clamp_limit(limit)
        } else {
            limit
        };
        let registry = self.registry();
        let _applying = crate::rules::lock(&registry.rules().applying);
        registry.set_route_limit(crate::key::route_part::<C>, route, Some(limit));
        Ok(())
    }

    /// Removes `route`'s rule: its keys without a rule of their own go back
    /// to the default limit from the next request (their windows as they
    /// are). Returns whether the route had a rule.
    pub fn remove_route_limit(&self, route: &str) -> bool {
        let registry = self.registry();
        let _applying = crate::rules::lock(&registry.rules().applying);
        registry.set_route_limit(crate::key::route_part::<C>, route, None)
    }

    /// Every route rule, as (route, limit), sorted by route.
    pub fn route_limits(&self) -> Vec<(String, u64)> {
        let mut routes = self.registry().routes().list();
        routes.sort_unstable();
        routes
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
