//! `SlidingWindowLayer`: the layer's configuration, a plain value.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use tower_http::classify::{GrpcErrorsAsFailures, ServerErrorsAsFailures, SharedClassifier};
use tower_layer::Layer;

use super::body::{InnerBody, TrackBody};
use super::priority::Priority;
use super::refusals::{
    check_compact_buckets, check_compact_limit, check_compact_shape, refuse_on_compact,
};
use super::service::SlidingWindow;
use crate::clock::{Clock, SharedClock};
use crate::handle::StatsHandle;
use crate::key::{GlobalKey, IntoKey, KeyExtractor};
use crate::response::{validate_policy_name, Rejection, ResponseConfig};
use crate::stat::validate_window;
use crate::store::{RemoteSlot, Settings, Store, Window, COMPACT_DEFAULT_MAX_KEYS};

/// The classifier used unless [`classify`](SlidingWindowLayer::classify) picks
/// another: 5xx responses and inner errors are failures.
pub type DefaultClassifier = SharedClassifier<ServerErrorsAsFailures>;

/// A [`Layer`] that limits requests per key with a sliding window and records
/// Sentinel's statistics for every key.
///
/// See the [crate docs](crate) for an overview and examples.
///
/// # A configuration value
///
/// The layer is a plain value: its builder methods are cheap, can be called
/// in any order, and each changes only the value it is called on. Cloning a
/// layer and configuring the clone never changes the original:
///
/// ```
/// use tower_sliding_window::{PathKey, SlidingWindowLayer};
///
/// let base = SlidingWindowLayer::qps(100).key(PathKey);
/// let strict = base.clone().rule("/login", 5); // /login: 5 per second
/// let loose = base.clone().rule("/login", 50); // /login: 50 per second
/// // `base` still has no rule for /login.
/// # let _ = (strict, loose);
/// ```
///
/// # Shared state
///
/// The limiter state (the key table, with every key's windows and limit) is
/// built once, when the layer is first used: when it makes its first
/// service ([`Layer::layer`]) or its first [`StatsHandle`]
/// ([`handle`](Self::handle)). From then on it is shared by that layer
/// value, the clones made of it before or after, every service they make
/// and every handle: cloning the layer does not create new windows.
///
/// This matters under axum, which calls [`Layer::layer`] once per route and
/// method (and, for a router served without `with_state(())`, once per
/// connection): a limiter that built its state in `layer` would turn one
/// limit into one per route or per connection. Build two layers for two
/// independent limits.
///
/// A limiter setting ([`window`](Self::window), [`rule`](Self::rule),
/// [`max_keys`](Self::max_keys), [`clock`](Self::clock), the flow
/// behaviours and breakers) called on a layer whose state is built or
/// shared starts a new state, built from the same settings plus the new
/// one, for the value it is called on; the services, handles and clones of
/// the old state keep it. So configure first, then take handles and serve.
/// The response settings ([`status`](Self::status),
/// [`reject_with`](Self::reject_with), the header options,
/// [`classify`](Self::classify) and the body mode) belong to each layer
/// value and are copied into the services it makes.
///
/// # Panics
///
/// The builder methods panic, with a message naming the setting, when a
/// setting is invalid. Nothing panics once requests flow.
pub struct SlidingWindowLayer<X: KeyExtractor = GlobalKey, M = DefaultClassifier, R = InnerBody> {
    extractor: X,
    make_classifier: M,
    response: Arc<ResponseConfig>,
    store: Arc<Store<X::Key>>,
    /// Which requests may borrow quota ([`prioritized`](Self::prioritized)).
    pub(super) priority: Option<Priority>,
    /// The shared store and its failure policy (feature `redis`).
    pub(super) remote: RemoteSlot<X::Key>,
    body: PhantomData<fn() -> R>,
}

/// # Constructor
impl SlidingWindowLayer {
    /// Admits at most `limit` requests per window for one global key.
    ///
    /// The default window is 1 s in 10 buckets of 100 ms, so this reads as
    /// requests per second. After [`window`](Self::window) it is `limit` per
    /// window: `.window(Duration::from_secs(10), 10)` makes it `limit` per
    /// 10 s, and `RateLimit-Policy` then says `q=limit;w=10`.
    ///
    /// ```
    /// use axum::{routing::get, Router};
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// let limit = SlidingWindowLayer::qps(100);
    /// let stats = limit.handle();
    /// let app: Router = Router::new().route("/", get(|| async { "hi" })).layer(limit);
    /// # let _ = (app, stats);
    /// ```
    pub fn qps(limit: u64) -> Self {
        SlidingWindowLayer {
            extractor: GlobalKey,
            make_classifier: SharedClassifier::new(ServerErrorsAsFailures::new()),
            response: Arc::new(ResponseConfig::default()),
            store: Arc::new(Store::new(Settings::new(limit))),
            priority: None,
            remote: RemoteSlot::none(),
            body: PhantomData,
        }
    }
}

/// # Keys and limits
impl<X: KeyExtractor, M, R> SlidingWindowLayer<X, M, R> {
    /// The window the limiter settings hold now.
    pub(super) fn current_window(&self) -> Window {
        self.store.settings().window
    }

    /// A copy of the limiter settings as they are now.
    pub(super) fn store_settings(&self) -> Settings<X::Key> {
        self.store.settings()
    }

    /// Whether the limiter settings are compact now.
    pub(super) fn is_compact(&self) -> bool {
        self.store.settings().compact
    }

    /// Applies a change to the limiter settings (see "Shared state").
    pub(super) fn configure(mut self, change: impl FnOnce(&mut Settings<X::Key>)) -> Self {
        self.store = Store::configure(self.store, change);
        self
    }

    /// Keys requests with `extractor`: each key gets its own window and
    /// limit. See [`key`](crate::key) for the built-in extractors; a closure
    /// `Fn(&http::request::Parts) -> K` works too.
    ///
    /// ```
    /// use tower_sliding_window::{PathKey, SlidingWindowLayer};
    ///
    /// let layer = SlidingWindowLayer::qps(20).key(PathKey).rule("/login", 3);
    /// # let _ = layer;
    /// ```
    ///
    /// Every other setting carries over. Rules given before, and a
    /// [`store`](Self::store) set before (feature `redis`), carry over when
    /// the new extractor has the same key type. With another key type they
    /// could not name any key of the new extractor: they are dropped, and a
    /// `tracing` warning says so. Call `key` first, then
    /// [`rule`](Self::rule) and [`store`](Self::store). A [`StatsHandle`]
    /// taken before `key` belongs to the old key type and sees none of the
    /// new layer's requests: take handles after `key`.
    pub fn key<Y: KeyExtractor>(self, extractor: Y) -> SlidingWindowLayer<Y, M, R> {
        SlidingWindowLayer {
            extractor,
            make_classifier: self.make_classifier,
            response: self.response,
            store: Arc::new(Store::new(self.store.settings().rekey())),
            priority: self.priority,
            remote: self.remote.rekey(),
            body: PhantomData,
        }
    }

    /// Sets the window: `sample_count` buckets over `interval` (default 1 s
    /// and 10). The limit applies per `interval`.
    ///
    /// The limit is exact in every bucket-aligned window: the passes of the
    /// `sample_count` buckets that make up any window never exceed it. An
    /// interval of the same length that starts inside a bucket can hold up to
    /// twice the limit under bursts (a full window's passes at the end of
    /// one window, and again at the start of the next); more buckets make
    /// such bursts less likely, not impossible.
    ///
    /// Memory: every key with its own statistics keeps a ring of
    /// `sample_count` buckets of 64 bytes each (see
    /// [`max_keys`](Self::max_keys) for the whole cost of a key).
    ///
    /// # Panics
    ///
    /// When `interval` is not a whole number of milliseconds, or is zero, or
    /// not a multiple of `sample_count` milliseconds; when `sample_count` is
    /// 0 or above the maximum [`LeapArray::new`](crate::stat::LeapArray::new)
    /// accepts; under [`strict`](Self::strict), when the interval plus one
    /// bucket is more than `u64::MAX` milliseconds.
    pub fn window(self, interval: Duration, sample_count: usize) -> Self {
        assert!(
            interval.subsec_nanos() % 1_000_000 == 0,
            "SlidingWindowLayer::window: invalid `interval`: must be a whole number of \
             milliseconds (got {interval:?})"
        );
        let Ok(interval_ms) = u64::try_from(interval.as_millis()) else {
            panic!("SlidingWindowLayer::window: invalid `interval`: too long (got {interval:?})");
        };
        if let Err(err) = validate_window(sample_count, interval_ms) {
            panic!("SlidingWindowLayer::window: {err}");
        }
        if self.current_window().strict {
            check_strict_span("window", interval_ms, sample_count);
        }
        super::refusals::check_all_further(
            "window",
            &self.store.settings(),
            &Window {
                sample_count,
                interval_ms,
                ..self.current_window()
            },
        );
        if self.is_compact() {
            check_compact_buckets("window", sample_count);
            let window = Window {
                sample_count,
                interval_ms,
                ..self.current_window()
            };
            check_compact_shape("window", &window);
            super::refusals::check_compact_further("window", &self.store.settings(), &window);
        }
        self.configure(|s| {
            s.window = Window {
                sample_count,
                interval_ms,
                ..s.window
            }
        })
    }

    /// Gives `key` its own limit instead of the default one. Such keys are
    /// never sent to the overflow entry (see [`max_keys`](Self::max_keys)).
    /// Change it later with [`StatsHandle::set_limit`], remove it with
    /// [`StatsHandle::remove_limit`].
    ///
    /// `key` is anything that [converts into the key type](IntoKey): a
    /// `&str` for a [`PathKey`](crate::PathKey) or a
    /// [`HeaderKey`](crate::HeaderKey), an address for a
    /// [`PeerIpKey`](crate::PeerIpKey).
    pub fn rule(self, key: impl IntoKey<X::Key>, limit: u64) -> Self {
        let key = key.into_key();
        if self.is_compact() {
            check_compact_limit("rule", "limit", limit);
        }
        self.configure(move |s| {
            s.rules.insert(key, limit);
        })
    }

    /// Bounds the number of keys with their own statistics (default 4096;
    /// 1 048 576 on a [`compact`](Self::compact) layer, whose keys cost a
    /// few dozen bytes: see there).
    ///
    /// # Memory
    ///
    /// Each key costs at most about 5.2 KiB with the default window: its
    /// entry (a [`StatisticNode`](crate::stat::StatisticNode) with a second
    /// and a minute window, 4 952 bytes, plus its limit and the small state
    /// of the flow behaviours, about 5 043 bytes in all), the key (held in an `Arc`: 16 bytes, the key's own size and
    /// its heap) and its slot in the table (a pair of pointers and a control
    /// byte, at hashbrown's load factor). The built-in string extractors keep
    /// at most [`MAX_KEY_BYTES`](crate::key::MAX_KEY_BYTES) (256) bytes of a
    /// key whatever a client sends (see [long keys](crate::key#long-keys)):
    /// measured, a [`HeaderKey`](crate::HeaderKey) key costs 5 362 bytes in
    /// all with 256-byte values, 5 204 bytes with 16 KiB values, 5 109 with
    /// short ones. So the default table holds at most about 21 MiB (20.94),
    /// however hostile its keys (`cargo test --test memory -- --nocapture`
    /// prints these figures). Every bucket beyond the default 10 adds 64
    /// bytes per key (see [`window`](Self::window)).
    ///
    /// # Eviction and the overflow entry
    ///
    /// Idle keys (nothing in flight or reserved, no event left in their
    /// second window, no circuit breaker still open; their minute of
    /// history goes with them) are evicted when room is needed, with no
    /// background task. When every key
    /// is busy, new keys share one overflow entry, limited with
    /// [`overflow_limit`](Self::overflow_limit) (default: the default
    /// limit): varying the key gets no one past the limit, and memory stays
    /// bounded. Keys with a [`rule`](Self::rule) do not count against this
    /// bound and are never sent to the overflow entry.
    ///
    /// An overflow is visible: the RateLimit fields of a request counted on
    /// the overflow entry name the policy `"overflow"` (whatever the
    /// [`policy_name`](Self::policy_name)), so a client refused there knows
    /// that the table was full, not its own quota spent; and the layer logs
    /// a `warn` event naming `max_keys` when a request finds no room, at
    /// most once a minute (of the layer's clock), with the number of
    /// requests sent to the overflow entry since the previous one.
    ///
    /// The price is paid by new clients during a flood: while an attacker
    /// keeps every slot busy with distinct keys, a client that is not yet in
    /// the table shares the overflow entry's limit with the attacker's
    /// excess keys, and gets few of its requests through. To keep serving
    /// clients that matter:
    ///
    /// - give known clients a [`rule`](Self::rule): they then always have
    ///   their own entry;
    /// - key by something the attacker cannot vary freely: a key that groups
    ///   attackers (a tenant, a verified account) rather than a raw header,
    ///   or [`PeerIpKey`](crate::PeerIpKey) (one key per address: varying it
    ///   takes many addresses) behind an outer per-address limit;
    /// - make the overflow entry stricter (so a flood gains nothing) or
    ///   looser (so new clients are served while the flood lasts) with
    ///   [`overflow_limit`](Self::overflow_limit);
    /// - raise `max_keys` to the number of clients you must tell apart.
    ///
    /// # Panics
    ///
    /// When `n` is 0.
    pub fn max_keys(self, n: usize) -> Self {
        assert!(
            n > 0,
            "SlidingWindowLayer::max_keys: invalid `max_keys`: must be greater than 0 (got 0)"
        );
        self.configure(|s| {
            s.max_keys = n;
            s.max_keys_given = true;
        })
    }

    /// Makes every key keep only what admission needs: its window's passes
    /// and blocks, in a fixed-size table whose slots hold the key itself,
    /// so that a per-client limit on a public listener (one key per
    /// address or API key, a million of them) costs a few dozen bytes per
    /// key instead of a full key's statistics (about 5 KiB, see
    /// [`max_keys`](Self::max_keys)).
    ///
    /// # Which tier
    ///
    /// - **Full** (the default): for keys you know and want to watch
    ///   (routes, tenants): every key records its window's passes, blocks,
    ///   successes, exceptions, response times and concurrency, a minute
    ///   of history, and can have breakers, a concurrency limit, warm-up,
    ///   pacing, borrowing and a shared store.
    /// - **Compact**: for many keys you only limit (client addresses, API
    ///   keys): admission is exactly a full key's (same window and buckets,
    ///   [`strict`](Self::strict), [`rule`](Self::rule),
    ///   [`StatsHandle::set_limit`], further windows with
    ///   [`limit_per`](Self::limit_per), the same `Retry-After` and RateLimit
    ///   fields for the same requests at the same times, exact under
    ///   concurrency), and the key records its window's passes and blocks.
    ///
    /// # What a compact key records
    ///
    /// A [`Snapshot`](crate::Snapshot) of a compact key has `pass` (its
    /// window's passes, exactly), `block` (the refusals of its newest
    /// bucket, saturating at 65 535: there is no room for a count per
    /// bucket) and `limit`; `success`, `exception`, `concurrency` and
    /// `waiting` are 0 and the response times `None`. [`StatsHandle::history`] and
    /// [`StatsHandle::breakers`] are empty. [`StatsHandle::total`] sums
    /// those passes and blocks over the keys in the table. A Prometheus collector
    /// of a compact layer exports the layer's lifetime passes and blocks
    /// (every key's, evicted keys' and the overflow's included) without a
    /// key label; the dashboard lists each key's passes and blocks.
    ///
    /// # Keys and memory
    ///
    /// The table is made once with room for [`max_keys`](Self::max_keys)
    /// keys (default for a compact layer: 1 048 576 = 2^20, unless
    /// `max_keys` is given) at a load of at most 7/8: 8/7 slots per key,
    /// in groups of 16 slots that share a lock. A group's slots are
    /// allocated when its first key arrives, so memory grows with the keys
    /// seen, up to the table's size, and never beyond it. A key may live in
    /// one of two groups (chosen by a randomly seeded hash); a new key
    /// takes an empty slot there, or evicts an idle key there (one with no
    /// pass left in any of its windows, the bucket `strict` counts
    /// included: an
    /// evicted client never comes back with a fresh allowance), looking at
    /// those 32 slots only (twice at most), never at the rest of the
    /// table. With neither, it shares the overflow entry, as in a full
    /// table: limited by [`overflow_limit`](Self::overflow_limit) and named
    /// `"overflow"` in its RateLimit fields. Because a key looks at two
    /// groups only, a table filled to exactly `max_keys` busy keys can send
    /// a few of them there although other groups have room: 6 to 9 in a
    /// million, measured (`cargo run --release -p perf --bin load --
    /// memory`); give `max_keys` some headroom over the clients you expect
    /// at once. Keys with their own limit (a
    /// [`rule`](Self::rule), [`StatsHandle::set_limit`]) live apart, are
    /// never evicted or overflowed, and do not count against `max_keys`.
    ///
    /// # Memory
    ///
    /// A slot is 48 bytes with an address key
    /// ([`PeerIpKey`](crate::PeerIpKey), [`ForwardedIpKey`](crate::ForwardedIpKey):
    /// `Option<IpAddr>`, 17 bytes); 96 bytes with an `Option<String>` key
    /// ([`HeaderKey`](crate::HeaderKey)'s), whose text is kept in the slot
    /// when it is at most 64 bytes long (a longer one, at most
    /// [`MAX_KEY_BYTES`](crate::key::MAX_KEY_BYTES) or its digest form, in a
    /// heap block of its own besides, listed in a table of 16 pointers its
    /// group makes for its first long key); and 56 bytes with a `String` key
    /// ([`PathKey`](crate::PathKey)), whose text is on the heap besides. The
    /// key's window is 28 of those bytes. A group of 16 slots adds a 64-byte
    /// header, one cache line (its lock, its slots' tags, its lifetime
    /// counters), and the index of its block of slots (4 bytes; with address
    /// and header keys the blocks come 64 at a time in one allocation, with
    /// `String` keys each block is an allocation of its own, with the
    /// allocator's header). The default table (2^20 keys: 74 899 groups,
    /// 1 198 384 slots) costs 4.8 MB of headers when the layer is built, and
    /// at most 62.6 MB (59.7 bytes per key) with address keys once every group
    /// is in use, 121.9 MB (116.3 bytes per key) with header keys of up to 64
    /// bytes whatever their length, and 73.1 MB with `String` keys plus their
    /// text (`cargo test --lib the_documented_sizes -- --nocapture` prints
    /// these figures). Each further window ([`limit_per`](Self::limit_per))
    /// adds one 28-byte compact window per slot, made with the table: 32.0
    /// bytes per key of `max_keys`.
    ///
    /// # Limits
    ///
    /// A compact key counts at most 65 535 passes per bucket and per
    /// window, and keeps at most 10 buckets: the default limit, rules and
    /// the overflow limit must be at most 65 535 and the window at most 10
    /// buckets, as must the further windows' limits
    /// ([`limit_per`](Self::limit_per), [`rule_per`](Self::rule_per)). A
    /// limit above 65 535 given at run time with
    /// [`StatsHandle::set_limit`] or
    /// [`StatsHandle::set_limit_per`] is taken as 65 535 (a `warn` event
    /// says so); it never panics.
    ///
    /// # Not with compact
    ///
    /// [`breaker`](Self::breaker), [`max_concurrency`](Self::max_concurrency),
    /// `warm_up`, `prioritized` and `throttle` need per-key state that a
    /// compact key does not keep (completions, a gauge of requests in
    /// flight, warm-up tokens, borrowed passes, pacing turns); the shared
    /// `store` (feature `redis`) needs the local window its failure policy
    /// falls back on and the statistics it records per key; the
    /// [`system`](Self::system) rule reads completions a compact layer does
    /// not record (give it to a full layer behind the compact one). Use a
    /// full layer for them: a layer with `compact` and any of them panics when
    /// it is configured, whatever the order of the calls, with a message
    /// naming both.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use axum::{body::Body, routing::get, Router};
    /// use http::{HeaderName, Request, StatusCode};
    /// use tower::ServiceExt;
    /// use tower_sliding_window::{HeaderKey, SlidingWindowLayer};
    ///
    /// // Two requests per second per API key, for up to a million keys.
    /// let layer = SlidingWindowLayer::qps(2)
    ///     .key(HeaderKey::new(HeaderName::from_static("x-api-key")))
    ///     .compact();
    /// let stats = layer.handle();
    /// let app = Router::new().route("/", get(|| async { "hi" })).layer(layer);
    /// let send = |key: &str| {
    ///     let request = Request::get("/").header("x-api-key", key);
    ///     app.clone().oneshot(request.body(Body::empty()).unwrap())
    /// };
    /// assert_eq!(send("a").await.unwrap().status(), StatusCode::OK);
    /// assert_eq!(send("a").await.unwrap().status(), StatusCode::OK);
    /// let refused = send("a").await.unwrap();
    /// assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert!(refused.headers().contains_key("retry-after"));
    /// assert_eq!(send("b").await.unwrap().status(), StatusCode::OK);
    ///
    /// let a = stats.snapshot(&Some("a".to_owned())).unwrap();
    /// assert_eq!((a.pass, a.block, a.limit), (2, 1, 2));
    /// assert_eq!(a.success, 0); // a compact key records no completions
    /// assert_eq!(stats.len(), 2);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// When the layer has a breaker, `max_concurrency`, `warm_up`,
    /// `prioritized`, `throttle`, a `system` rule or a `store`; when the window has more than
    /// 10 buckets; when the default limit, a rule, the overflow limit or a
    /// further window's limit (`limit_per`, `rule_per`) is above 65 535, or
    /// a further window's bucket longer than 2^29 ms.
    pub fn compact(self) -> Self {
        use super::refusals::{
            BREAKER_WHY, CONCURRENCY_WHY, PRIORITIZED_WHY, SYSTEM_WHY, THROTTLE_WHY, WARM_UP_WHY,
        };
        let settings = self.store.settings();
        let conflicts = [
            (!settings.breakers.is_empty(), "breaker", BREAKER_WHY),
            (
                settings.window.behaviours.max_concurrency.is_some(),
                "max_concurrency",
                CONCURRENCY_WHY,
            ),
            (
                settings.window.behaviours.warm_up.is_some(),
                "warm_up",
                WARM_UP_WHY,
            ),
            (
                settings.window.behaviours.throttle.is_some(),
                "throttle",
                THROTTLE_WHY,
            ),
            (self.priority.is_some(), "prioritized", PRIORITIZED_WHY),
            (settings.system.is_some(), "system", SYSTEM_WHY),
        ];
        for (set, setting, why) in conflicts {
            if set {
                panic!(
                    "SlidingWindowLayer::compact: invalid `compact` with `{setting}`: {why}; \
                     drop `compact` (a full key records everything) or `{setting}`"
                );
            }
        }
        #[cfg(feature = "redis")]
        if self.remote.remote.is_some() {
            panic!(
                "SlidingWindowLayer::compact: invalid `compact` with `store`: {}; drop `compact` \
                 (a full key records everything) or `store`",
                super::refusals::STORE_WHY
            );
        }
        check_compact_buckets("compact", settings.window.sample_count);
        check_compact_shape("compact", &settings.window);
        check_compact_limit("compact", "limit (qps)", settings.default_limit);
        if let Some(limit) = settings.overflow_limit {
            check_compact_limit("compact", "overflow_limit", limit);
        }
        if let Some(limit) = settings.rules.values().copied().max() {
            check_compact_limit("compact", "rule", limit);
        }
        if let Some(limit) = settings.route_rules.values().copied().max() {
            check_compact_limit("compact", "route_rule", limit);
        }
        super::refusals::check_compact_further("compact", &settings, &settings.window);
        self.configure(|s| {
            s.compact = true;
            if !s.max_keys_given {
                s.max_keys = COMPACT_DEFAULT_MAX_KEYS;
            }
        })
    }

    /// Sets the limit of the overflow entry, which the keys that found no
    /// room share while every slot of the table is busy (default: the
    /// default limit). See [`max_keys`](Self::max_keys).
    ///
    /// A limit of 0 refuses every request that found no room.
    ///
    /// ```
    /// use tower_sliding_window::{HeaderKey, SlidingWindowLayer};
    ///
    /// // 100 per second per API key; during a flood of unknown keys, all of
    /// // them together get 20 per second.
    /// let layer = SlidingWindowLayer::qps(100)
    ///     .key(HeaderKey::new(http::HeaderName::from_static("x-api-key")))
    ///     .overflow_limit(20);
    /// # let _ = layer;
    /// ```
    pub fn overflow_limit(self, limit: u64) -> Self {
        if self.is_compact() {
            check_compact_limit("overflow_limit", "limit", limit);
        }
        self.configure(|s| s.overflow_limit = Some(limit))
    }

    /// Reads time from `clock` (default: [`SystemClock`](crate::clock::SystemClock)).
    /// With a [`ManualClock`](crate::clock::ManualClock), tests decide exactly
    /// when windows slide.
    pub fn clock(self, clock: impl Clock) -> Self {
        let clock = SharedClock::new(clock);
        self.configure(|s| s.clock = clock)
    }

    /// A handle on the layer's live statistics and limits. Taking it builds
    /// the layer's state if nothing has yet, and shares it (see "Shared
    /// state"): take it once the layer is configured.
    pub fn handle(&self) -> StatsHandle<X::Key> {
        self.store.registry();
        StatsHandle::new(Arc::clone(&self.store)).with_remote(self.remote.clone())
    }
}

/// # Per-client limits per route
///
/// For a layer keyed by a pair `(client, route)`, such as
/// [`ClientRouteKey`](crate::ClientRouteKey): see the
/// [crate docs](crate#per-client-limits-per-route).
impl<C, X, M, R> SlidingWindowLayer<X, M, R>
where
    X: KeyExtractor<Key = (C, String)>,
    C: Clone + Eq + std::hash::Hash + Send + Sync + 'static,
{
    /// Gives `route` its own limit for **every client separately**: each
    /// key `(client, route)` is limited to `limit` per window, and counted
    /// apart from the other clients of the route (one client cannot use up
    /// another's quota, nor lock it out).
    ///
    /// `route` is the route part of the key as the layer's route extractor
    /// writes it: `"POST /login"` or `"GET /users/{id}"` with
    /// `MatchedPathKey`; `"<unmatched>"` limits each client's requests
    /// that matched no route. A route no request has is never matched and
    /// costs its entry in the rules only.
    ///
    /// # Precedence
    ///
    /// 1. A rule for the exact key ([`rule`](Self::rule) with the pair,
    ///    [`StatsHandle::set_limit`]) wins: that one client of that route.
    /// 2. Else the route's rule (this method,
    ///    [`StatsHandle::set_route_limit`], a document's `routes`).
    /// 3. Else the default limit ([`qps`](SlidingWindowLayer::qps)).
    ///
    /// The limit is per window of the layer ([`window`](Self::window)):
    /// "5 per minute" is a layer whose window is a minute, or a layer with a
    /// minute's further window ([`limit_per`](Self::limit_per)) and the
    /// route's limit in it ([`route_rule_per`](Self::route_rule_per)),
    /// which keeps a per-second limit on every route. Keys of a route
    /// with a rule are ordinary keys otherwise: they count against
    /// [`max_keys`](Self::max_keys) and idle ones are evicted (the route's
    /// rule applies again when the client comes back); when the table is
    /// full, a new key of the route shares an overflow entry limited to
    /// the route's limit, never the looser default one (counted in
    /// [`StatsHandle::total`]; on a compact layer, the overflow window with
    /// the smaller of the two limits). Works the same on a
    /// [`compact`](Self::compact) layer.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::{ClientRouteKey, MatchedPathKey, PeerIpKey, SlidingWindowLayer};
    ///
    /// // Per client: 5 logins per minute, 600 requests per minute elsewhere.
    /// let layer = SlidingWindowLayer::qps(600)
    ///     .window(Duration::from_secs(60), 6)
    ///     .key(ClientRouteKey::new(PeerIpKey, MatchedPathKey))
    ///     .route_rule("POST /login", 5)
    ///     .compact();
    /// # let _ = layer;
    /// ```
    ///
    /// # Panics
    ///
    /// When `route` is longer than
    /// [`MAX_KEY_BYTES`](crate::key::MAX_KEY_BYTES) (the built-in route
    /// extractors key a longer route by its digest form, which a rule
    /// cannot name); on a compact layer, when `limit` is above 65 535.
    #[track_caller]
    pub fn route_rule(self, route: impl Into<String>, limit: u64) -> Self {
        let route = route.into();
        if let Err(reason) = crate::rules::check_route(&route) {
            panic!("SlidingWindowLayer::route_rule: invalid `route`: {reason}");
        }
        if self.is_compact() {
            check_compact_limit("route_rule", "limit", limit);
        }
        self.configure(move |s| {
            s.route_of = Some(crate::key::route_part::<C>);
            s.route_rules.insert(route, limit);
        })
    }
}

/// # Shared limits across replicas
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
impl<X: KeyExtractor, M, R> SlidingWindowLayer<X, M, R> {
    /// Decides every admission in Redis through `store`, so that every
    /// replica sharing the Redis server and the same limits admits at most
    /// the limit per window in total (exactly the limit under overload).
    /// See [`store::redis`](crate::store::redis) for how.
    ///
    /// The store takes this layer's window ([`window`](Self::window),
    /// [`strict`](Self::strict)); each request sends its key's limit here
    /// (the default, a [`rule`](Self::rule), a
    /// [`set_limit`](crate::StatsHandle::set_limit)), unless a limit was set
    /// in Redis ([`RedisStore::set_limit`](crate::store::RedisStore::set_limit),
    /// or a handle's `set_limit`, which writes it there too). A key known
    /// to be blocked is refused at once; any other request waits for the
    /// store's answer (at most its timeout) before it reaches the inner
    /// service. The key's statistics stay in this replica, and count what
    /// Redis decided. [`max_concurrency`](Self::max_concurrency) still
    /// applies in this replica; `throttle`, `warm_up` and `prioritized`
    /// are local pacing and are not applied with a store (the window in
    /// Redis decides).
    ///
    /// When Redis cannot decide, [`on_store_error`](Self::on_store_error)
    /// does.
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use axum::{routing::get, Router};
    /// use tower_sliding_window::store::{RedisStore, StoreFailure};
    /// use tower_sliding_window::{PathKey, SlidingWindowLayer};
    ///
    /// let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
    /// let limit = SlidingWindowLayer::qps(100)
    ///     .key(PathKey)
    ///     .store(store)
    ///     .on_store_error(StoreFailure::Local);
    /// let stats = limit.handle();
    /// let app: Router = Router::new().route("/", get(|| async { "hi" })).layer(limit);
    /// # let _ = (app, stats);
    /// # Ok(())
    /// # }
    /// ```
    pub fn store(mut self, store: crate::store::RedisStore) -> Self
    where
        X::Key: crate::store::StoreKey,
    {
        if self.is_compact() {
            refuse_on_compact(true, "store", super::refusals::STORE_WHY);
        }
        self.remote = self.remote.with_store(store);
        self
    }

    /// What to do while Redis cannot decide (an error, no answer within the
    /// store's timeout, the store in fallback between probes, a lazy store
    /// not connected yet, a server that evicts keys, or this key's data in
    /// Redis unusable); see
    /// [`StoreFailure`](crate::store::StoreFailure). Default:
    /// [`StoreFailure::Local`](crate::store::StoreFailure::Local), this
    /// replica's own window with the same limit.
    pub fn on_store_error(mut self, policy: crate::store::StoreFailure) -> Self {
        self.remote.policy = policy;
        self
    }
}

/// # Responses
impl<X: KeyExtractor, M, R> SlidingWindowLayer<X, M, R> {
    fn respond(mut self, change: impl FnOnce(&mut ResponseConfig)) -> Self {
        change(Arc::make_mut(&mut self.response));
        self
    }

    /// Answers rate-limit refusals (the window, concurrency, throttle, the
    /// shared store, the overflow entry) with `status` instead of 429. A
    /// refusal by an open circuit breaker stays `503 Service Unavailable`:
    /// it is about the upstream, not the client's quota (see the
    /// [response docs](crate::response)). The default body names the
    /// status: `"<reason phrase>: retry in <n> s"`.
    ///
    /// With [`reject_with`](Self::reject_with), the builder makes the whole
    /// response and decides its status; it finds this one (or 503 for a
    /// breaker) in [`Rejection::status`]. Under [`grpc`](Self::grpc) the
    /// layer's refusals are `200 OK` with a `grpc-status`, whatever this
    /// status.
    ///
    /// # Panics
    ///
    /// When `status` is not a client or server error (4xx or 5xx): a
    /// rejection answered `200 OK` would read as served, and `101` would
    /// switch protocols.
    pub fn status(self, status: StatusCode) -> Self {
        if !(status.is_client_error() || status.is_server_error()) {
            panic!(
                "SlidingWindowLayer::status: invalid `status`: must be a client or server error \
                 (4xx or 5xx) (got {status})"
            );
        }
        self.respond(|r| r.status = status)
    }

    /// Builds the response for every refused request with `build`, an open
    /// breaker's included; [`Rejection::reason`] says why it was refused.
    /// `Retry-After` is added unless the response has it, and the RateLimit
    /// fields likewise, except on a breaker's refusal. The status the
    /// layer would have sent ([`status`](Self::status), or 503 for a
    /// breaker) is passed to `build` in [`Rejection::status`]; the response
    /// `build` returns is sent as it is. Every answer the layer can give is
    /// listed in the [response docs](crate::response).
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{header, Response, StatusCode};
    /// use tower_sliding_window::response::Reason;
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// let layer = SlidingWindowLayer::qps(10).reject_with(|rejection| {
    ///     let error = match rejection.reason {
    ///         Reason::Breaker => "unavailable",
    ///         _ => "rate_limited",
    ///     };
    ///     let body = format!(r#"{{"error":"{error}","limit":{}}}"#, rejection.limit);
    ///     Response::builder()
    ///         .status(rejection.status)
    ///         .header(header::CONTENT_TYPE, "application/json")
    ///         .body(Bytes::from(body))
    ///         .expect("valid response")
    /// });
    /// # let _ = layer;
    /// ```
    pub fn reject_with<F>(self, build: F) -> Self
    where
        F: Fn(&Rejection) -> Response<Bytes> + Send + Sync + 'static,
    {
        let build = Arc::new(build);
        self.respond(|r| r.reject_with = Some(build))
    }

    /// Also sends `RateLimit-Policy` and `RateLimit` on passed responses
    /// (default: only on rejections).
    pub fn headers_on_pass(self, enabled: bool) -> Self {
        self.respond(|r| r.headers_on_pass = enabled)
    }

    /// Also sends the legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining`
    /// and `X-RateLimit-Reset` (seconds) wherever the RateLimit fields go.
    pub fn legacy_headers(self, enabled: bool) -> Self {
        self.respond(|r| r.legacy_headers = enabled)
    }

    /// Names the default policy in the RateLimit fields (default
    /// `"default"`). Keys with their own limit are named
    /// `"<name>-<8 hex digits>"`; see [`response`](crate::response).
    ///
    /// # Panics
    ///
    /// When `name` is empty or not printable ASCII without `"` and `\`.
    pub fn policy_name(self, name: impl Into<String>) -> Self {
        let name = name.into();
        if let Err(rule) = validate_policy_name(&name) {
            panic!("SlidingWindowLayer::policy_name: invalid `policy_name`: {rule} (got {name:?})");
        }
        self.respond(|r| r.policy_name = Arc::from(name))
    }

    /// Decides which completed requests count as exceptions, with a
    /// tower-http [`MakeClassifier`](tower_http::classify::MakeClassifier)
    /// (default: [`ServerErrorsAsFailures`], i.e. 5xx and inner errors).
    ///
    /// A classifier that decides at the end of the stream (gRPC's
    /// `grpc-status` in trailers) is asked at the end of the body with
    /// [`track_body`](Self::track_body); without it the response head is all
    /// the layer sees, and such a response counts as no exception.
    ///
    /// ```
    /// use tower_http::classify::{SharedClassifier, StatusInRangeAsFailures};
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// // Count 4xx and 5xx as exceptions.
    /// let layer = SlidingWindowLayer::qps(10)
    ///     .classify(SharedClassifier::new(StatusInRangeAsFailures::new(400..=599)));
    /// # let _ = layer;
    /// ```
    pub fn classify<N>(self, make_classifier: N) -> SlidingWindowLayer<X, N, R> {
        SlidingWindowLayer {
            extractor: self.extractor,
            make_classifier,
            response: self.response,
            store: self.store,
            priority: self.priority,
            remote: self.remote,
            body: PhantomData,
        }
    }
}

/// # Response bodies
///
/// See [`body`](crate::body) for what each mode records and costs.
impl<X: KeyExtractor, M, R> SlidingWindowLayer<X, M, R> {
    fn body_kind<S>(self) -> SlidingWindowLayer<X, M, S> {
        SlidingWindowLayer {
            extractor: self.extractor,
            make_classifier: self.make_classifier,
            response: self.response,
            store: self.store,
            priority: self.priority,
            remote: self.remote,
            body: PhantomData,
        }
    }

    /// Records completion when the response body ends, not when its head is
    /// ready: concurrency counts a streamed response (server-sent events, a
    /// download) until its last frame, the response time covers the whole
    /// body, a body that fails mid-stream counts as an exception, and a
    /// classifier that reads trailers (gRPC) is asked at the end. The body is
    /// wrapped in [`ResponseBody`](crate::body::ResponseBody).
    ///
    /// ```
    /// use axum::{routing::get, Router};
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// let app: Router = Router::new()
    ///     .route("/events", get(|| async { "a long stream" }))
    ///     .layer(SlidingWindowLayer::qps(10).track_body());
    /// # let _ = app;
    /// ```
    pub fn track_body(self) -> SlidingWindowLayer<X, M, TrackBody> {
        self.body_kind()
    }
}

/// # gRPC
impl<X: KeyExtractor, M, R> SlidingWindowLayer<X, M, R> {
    /// Speaks gRPC: refusals become trailers-only gRPC responses, and
    /// completions are classified by their `grpc-status`.
    ///
    /// A gRPC client reads an HTTP 429 or 503 as `UNAVAILABLE`, which many
    /// retry policies retry at once. Under `grpc` every refusal is instead
    /// answered `200 OK` with `content-type: application/grpc`, no body,
    /// and its status in the headers: `grpc-status` 8
    /// (`RESOURCE_EXHAUSTED`) for every rate-limit refusal (window,
    /// concurrency, throttle, shared store, overflow entry), 14
    /// (`UNAVAILABLE`) for an open breaker; a `grpc-message`
    /// (percent-encoded) such as `rate limit reached: retry in 2 s`; and
    /// `grpc-status-details-bin`, a `google.rpc.Status` carrying a
    /// `google.rpc.RetryInfo` whose `retry_delay` is the retry time to the
    /// millisecond. `Retry-After` and the RateLimit fields are sent too,
    /// as metadata a client may read (see the
    /// [response docs](crate::response#grpc)).
    ///
    /// [`status`](Self::status) does not apply to these responses (a gRPC
    /// status must travel in a 200). A [`reject_with`](Self::reject_with)
    /// builder still makes the whole response: it shapes a gRPC one with
    /// [`Rejection::grpc_response`] and [`Rejection::grpc_code`].
    ///
    /// Completions: the classifier becomes tower-http's
    /// [`GrpcErrorsAsFailures`], and the body is tracked
    /// ([`track_body`](Self::track_body)) so that a `grpc-status` sent in
    /// the trailers is read at the end of the stream. Every code but `OK`
    /// counts as an exception (for the breakers and the statistics), as do
    /// an inner error and a body that fails mid-stream; a response with no
    /// `grpc-status` at all, in its head or its trailers, is not gRPC and
    /// counts as a success. To count some codes as successes, call
    /// [`classify`](Self::classify) after `grpc`:
    ///
    /// ```
    /// use tower_http::classify::{GrpcCode, GrpcErrorsAsFailures, SharedClassifier};
    /// use tower_sliding_window::breaker::Breaker;
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// let layer = SlidingWindowLayer::qps(100)
    ///     .breaker(Breaker::error_ratio(0.5))
    ///     .grpc()
    ///     // A missing record is the caller's business, not a failing upstream.
    ///     .classify(SharedClassifier::new(
    ///         GrpcErrorsAsFailures::new().with_success(GrpcCode::NotFound),
    ///     ));
    /// # let _ = layer;
    /// ```
    ///
    /// Every refusal of the layer is answered so, whatever the request: put
    /// a `grpc` layer in front of gRPC services only (under axum, with
    /// `route_layer` on their routes), and a plain one in front of the
    /// others. `examples/grpc.rs` serves a tonic service behind the layer.
    pub fn grpc(self) -> SlidingWindowLayer<X, SharedClassifier<GrpcErrorsAsFailures>, TrackBody> {
        self.respond(|r| r.grpc = true)
            .classify(GrpcErrorsAsFailures::make_classifier())
            .track_body()
    }
}

/// # Adaptive protection
impl<X: KeyExtractor, M, R> SlidingWindowLayer<X, M, R> {
    /// Guards the whole layer with `rule` (Sentinel's system rule, with
    /// Kratos's BBR check): before any rule of the key, a request is
    /// refused when the layer's totals reach a limit of the rule, or when
    /// the CPU is busy and more requests are in flight than the service can
    /// hold. Refusals are `503 Service Unavailable` with `Retry-After`
    /// (gRPC 14 under [`grpc`](Self::grpc)), counted as blocks of the key
    /// with [`Reason::System`](crate::flow::Reason::System). See
    /// [`system`](crate::system) for the checks and the CPU reading.
    ///
    /// Every request the layer passes then also records into one
    /// layer-wide statistics node; a layer without `system` keeps none.
    ///
    /// ```
    /// use tower_sliding_window::{system::SystemRule, SlidingWindowLayer};
    ///
    /// let layer = SlidingWindowLayer::qps(100).system(SystemRule::bbr().max_concurrency(256));
    /// # let _ = layer;
    /// ```
    ///
    /// # Panics
    ///
    /// Where the process's CPU use cannot be read (every platform but
    /// Linux), unless the rule reads its own
    /// [`CpuSource`](crate::system::CpuSource).
    pub fn system(self, rule: crate::system::SystemRule) -> Self {
        crate::system::check_platform(&rule);
        self.configure(|s| {
            refuse_on_compact(s.compact, "system", super::refusals::SYSTEM_WHY);
            s.system = Some(rule);
        })
    }
}

impl<X: KeyExtractor, M: Clone, R> Clone for SlidingWindowLayer<X, M, R> {
    fn clone(&self) -> Self {
        SlidingWindowLayer {
            extractor: self.extractor.clone(),
            make_classifier: self.make_classifier.clone(),
            response: Arc::clone(&self.response),
            store: Arc::clone(&self.store),
            priority: self.priority.clone(),
            remote: self.remote.clone(),
            body: PhantomData,
        }
    }
}

impl<S, X: KeyExtractor, M: Clone, R> Layer<S> for SlidingWindowLayer<X, M, R> {
    type Service = SlidingWindow<S, X, M, R>;

    fn layer(&self, inner: S) -> Self::Service {
        SlidingWindow::from_parts(
            inner,
            self.extractor.clone(),
            self.make_classifier.clone(),
            Arc::clone(&self.response),
            Arc::clone(&self.store),
            self.priority.clone(),
            self.remote.clone(),
        )
    }
}

impl<X: KeyExtractor + fmt::Debug, M, R> fmt::Debug for SlidingWindowLayer<X, M, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlidingWindowLayer")
            .field("key", &self.extractor)
            .field("state", &self.store)
            .field("response", &self.response)
            .finish_non_exhaustive()
    }
}

/// Panics, naming `interval`, when a strict window's span (its interval and
/// the bucket that has just left it, which admission counts too) is more
/// than `u64::MAX` milliseconds: admission adds the two on every request.
pub(super) fn check_strict_span(method: &str, interval_ms: u64, sample_count: usize) {
    let bucket_ms = interval_ms / sample_count as u64;
    if interval_ms.checked_add(bucket_ms).is_none() {
        panic!(
            "SlidingWindowLayer::{method}: invalid `interval`: under `strict`, the interval plus \
             one bucket must be at most u64::MAX ms (got {interval_ms} ms in {sample_count} \
             buckets)"
        );
    }
}
