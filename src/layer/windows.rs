//! Several windows per key: [`SlidingWindowLayer::limit_per`] and the
//! per-key limits of its windows.

use std::time::Duration;

use super::builder::SlidingWindowLayer;
use super::refusals::{
    check_compact_limit, check_compact_windows, check_further, interval_ms,
    FURTHER_PRIORITIZED_WHY, FURTHER_THROTTLE_WHY, MAX_FURTHER_WINDOWS,
};
use crate::key::{IntoKey, KeyExtractor};

/// # Several windows
impl<X: KeyExtractor, M, R> SlidingWindowLayer<X, M, R> {
    /// Adds a further window to every key: at most `limit` passes per
    /// `interval`, besides the first window's limit. Call it as often as
    /// needed, one window per interval:
    /// `SlidingWindowLayer::qps(10).limit_per(Duration::from_secs(60), 300)`
    /// admits at most 10 requests of a key per second **and** 300 per
    /// minute.
    ///
    /// A request passes only if every window admits it, and is charged to
    /// all of them or to none: a request one window refuses is counted in
    /// no window, and once requests have finished, each window holds
    /// exactly the passes of the requests that were admitted, under any
    /// concurrency. (The further windows are asked first, each pass taken
    /// with one compare-and-swap, then the first window; a refusal gives
    /// back what was taken. While it does, another request may find those
    /// passes still there and be refused too: the layer can refuse a
    /// little more at that instant, never admit more.)
    ///
    /// Each further window has as many buckets as the first
    /// ([`window`](Self::window), 10 by default), so its interval must be a
    /// multiple of that many milliseconds; its limit is exact in every
    /// bucket-aligned window, and under [`strict`](Self::strict) in every
    /// interval, as the first window's. A refusal by any window is a
    /// [`Reason::Window`](crate::flow::Reason::Window) refusal (or
    /// `Overflow` on the overflow entry) counted as one block of the key;
    /// its `Retry-After` is the longest wait among the windows that
    /// refused. `RateLimit-Policy` lists every window (the further ones
    /// named `"<policy>-<interval in ms>ms"`), and `RateLimit` reports the
    /// tightest: the window with the least quota left, the longest wait on
    /// a tie.
    ///
    /// [`rule`](Self::rule), [`StatsHandle::set_limit`](crate::StatsHandle::set_limit)
    /// and a rules document's `default` and `limits` change the **first**
    /// window's limit. A key's own limit in a further window is set with
    /// [`rule_per`](Self::rule_per) or
    /// [`StatsHandle::set_limit_per`](crate::StatsHandle::set_limit_per), or
    /// in a rules document's `windows` section (see
    /// [`rules`](crate::rules)); [`StatsHandle::windows`](crate::StatsHandle::windows)
    /// reads each window's passes and limit. Warm-up moves the first
    /// window's limit only.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use axum::{body::Body, routing::get, Router};
    /// use http::{Request, StatusCode};
    /// use tower::ServiceExt;
    /// use tower_sliding_window::clock::ManualClock;
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// let clock = ManualClock::new(0);
    /// // 2 per second, and 3 per minute.
    /// let layer = SlidingWindowLayer::qps(2)
    ///     .limit_per(Duration::from_secs(60), 3)
    ///     .clock(clock.clone());
    /// let stats = layer.handle();
    /// let app = Router::new().route("/", get(|| async { "hi" })).layer(layer);
    /// let send = || async {
    ///     let request = Request::get("/").body(Body::empty()).unwrap();
    ///     app.clone().oneshot(request).await.unwrap()
    /// };
    ///
    /// assert_eq!(send().await.status(), StatusCode::OK);
    /// assert_eq!(send().await.status(), StatusCode::OK);
    /// // The second's window is full.
    /// assert_eq!(send().await.status(), StatusCode::TOO_MANY_REQUESTS);
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(send().await.status(), StatusCode::OK);
    /// clock.advance(Duration::from_secs(1));
    /// // The minute's window is full: wait until its first passes leave it.
    /// let refused = send().await;
    /// assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(refused.headers()["retry-after"], "58");
    /// assert_eq!(
    ///     refused.headers()["ratelimit-policy"],
    ///     r#""default";q=2;w=1, "default-60000ms";q=3;w=60"#
    /// );
    /// assert_eq!(refused.headers()["ratelimit"], r#""default-60000ms";r=0;t=58"#);
    ///
    /// // Each window's passes: the refusals were charged to none.
    /// let windows = stats.windows(&()).unwrap();
    /// assert_eq!(windows.len(), 2);
    /// assert_eq!((windows[0].pass, windows[0].limit), (0, 2));
    /// assert_eq!((windows[1].pass, windows[1].limit), (3, 3));
    /// # }
    /// ```
    ///
    /// # Memory
    ///
    /// Every key with its own entry keeps, per further window, a ring of
    /// `sample_count` buckets with the sums it caches: measured with the
    /// default 10 buckets, 981 bytes per window, 1 063 for the first one
    /// (it also opens the box a key's optional state lives in), 1 144 for
    /// the first one under `strict` (`cargo test --test memory further --
    /// --nocapture` prints these figures). A layer without `limit_per`
    /// keeps nothing for them: its keys stay the size
    /// [`max_keys`](Self::max_keys) gives.
    ///
    /// On a [`compact`](Self::compact) layer, each further window of a key
    /// is one more 28-byte compact window, kept beside every slot of the
    /// table (made with the table) and beside each key with its own limit:
    /// measured, 32.0 bytes per key of `max_keys` and further window (8/7
    /// slots per key; `cargo test --test memory compact -- --nocapture`
    /// prints the figure). A compact layer without `limit_per` keeps
    /// nothing for them.
    ///
    /// # On a compact layer
    ///
    /// A [`compact`](Self::compact) key has further windows too, charged
    /// all or none as a full key's, with the same answers (`Retry-After`,
    /// `RateLimit-Policy`, `RateLimit`) for the same requests at the same
    /// times. Its further windows obey the compact limits: each window's
    /// default and every key's own limit in it (`rule_per`) at most 65 535,
    /// each bucket at most 2^29 ms, or the layer panics when configured,
    /// naming the setting; a larger limit given at run time
    /// ([`StatsHandle::set_limit_per`](crate::StatsHandle::set_limit_per),
    /// a rules document) is taken as 65 535, with a `warn` event. A compact
    /// key is evicted only when it is idle in every window, and a key that
    /// takes a slot starts with every window empty. A key's own limit in a
    /// further window does not keep it out of the overflow window (its
    /// first window's own limit, [`rule`](Self::rule), does). When the
    /// clock steps back by more than the first window, a compact key's
    /// further windows move back with it, as a full key's keep running with
    /// its first window under its skew; one difference remains, within one
    /// further window of the clock's time 0 only: a compact window cannot
    /// start before that time, so there its buckets may turn at other
    /// times than a full key's.
    ///
    /// # With a shared store
    ///
    /// With a Redis `store` (feature `redis`), every window of a key is
    /// shared across replicas and decided in Redis in the same script
    /// call, one per admission: each window's count is checked against its
    /// limit, and the pass is recorded in all of them or in none (a refusal
    /// waits the longest among the windows). A further window's buckets
    /// share the key's hash tag, so a key stays in one Redis Cluster slot.
    /// A key with further windows never leases passes. A key's own limit in
    /// a further window (`rule_per`, `set_limit_per`, a rules document) is
    /// this replica's, sent with every call as the window's default is; the
    /// first window's shared limit is as without further windows (the
    /// store's `set_limit`). A pass Redis grants must also fit every window
    /// of this replica's own.
    ///
    /// # Not with
    ///
    /// `limit_per` and [`throttle`](Self::throttle)
    /// (pacing follows the first window's limit) or
    /// [`prioritized`](Self::prioritized) (a borrowed pass is taken from
    /// the first window alone) panic when configured, in either order,
    /// with a message naming both settings.
    ///
    /// # Panics
    ///
    /// When `interval` is zero, not a whole number of milliseconds, not a
    /// multiple of the window's `sample_count` milliseconds, equal to the
    /// first window's interval or to another `limit_per` window's; under
    /// `strict`, when the interval plus one bucket is more than `u64::MAX`
    /// ms; when the layer would have more than 1 024 further windows; on a
    /// compact layer, when `limit` is above 65 535 or a bucket of the
    /// window longer than 2^29 ms; and with the settings above.
    pub fn limit_per(self, interval: Duration, limit: u64) -> Self {
        let ms = interval_ms("limit_per", interval);
        let settings = self.store_settings();
        check_further("limit_per", ms, &settings.window);
        if settings.limit_per.index_of(ms).is_some() {
            panic!(
                "SlidingWindowLayer::limit_per: invalid `interval`: the layer has a window of \
                 {ms} ms already; change its limit with another interval or `rule_per`"
            );
        }
        if settings.limit_per.windows.len() >= MAX_FURTHER_WINDOWS {
            panic!(
                "SlidingWindowLayer::limit_per: invalid `limit_per`: at most \
                 {MAX_FURTHER_WINDOWS} further windows per layer"
            );
        }
        if settings.compact {
            check_compact_windows("limit_per", &[(ms, limit)], &settings.window);
        }
        let conflicts = [
            (
                settings.window.behaviours.throttle.is_some(),
                "throttle",
                FURTHER_THROTTLE_WHY,
            ),
            (
                self.priority.is_some(),
                "prioritized",
                FURTHER_PRIORITIZED_WHY,
            ),
        ];
        for (set, setting, why) in conflicts {
            if set {
                panic!(
                    "SlidingWindowLayer::limit_per: invalid `limit_per` with `{setting}`: {why}; \
                     drop `limit_per` or `{setting}`"
                );
            }
        }
        self.configure(move |s| s.limit_per.windows.push((ms, limit)))
    }

    /// Gives `key` its own limit in the further window of `interval` (added
    /// with [`limit_per`](Self::limit_per)), instead of that window's
    /// default. The first window's limit of a key is [`rule`](Self::rule)'s.
    /// Change it later with
    /// [`StatsHandle::set_limit_per`](crate::StatsHandle::set_limit_per). A
    /// key with its own limit in any window is never sent to the overflow
    /// entry, as with `rule`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::{PathKey, SlidingWindowLayer};
    ///
    /// let minute = Duration::from_secs(60);
    /// // 10 per second and 300 per minute for every path; /export: 5 per
    /// // second and 20 per minute.
    /// let layer = SlidingWindowLayer::qps(10)
    ///     .key(PathKey)
    ///     .limit_per(minute, 300)
    ///     .rule("/export", 5)
    ///     .rule_per("/export", minute, 20);
    /// let stats = layer.handle();
    /// let windows = stats.limits_per(&"/export".to_owned());
    /// assert_eq!(windows, vec![(Duration::from_secs(1), 5), (minute, 20)]);
    /// ```
    ///
    /// # Panics
    ///
    /// When the layer has no further window of `interval` (call
    /// [`limit_per`](Self::limit_per) first); on a
    /// [`compact`](Self::compact) layer, when `limit` is above 65 535.
    pub fn rule_per(self, key: impl IntoKey<X::Key>, interval: Duration, limit: u64) -> Self {
        let ms = interval_ms("rule_per", interval);
        let settings = self.store_settings();
        if settings.limit_per.index_of(ms).is_none() {
            panic!(
                "SlidingWindowLayer::rule_per: invalid `interval`: the layer has no `limit_per` \
                 window of {ms} ms (add it with `limit_per` before `rule_per`)"
            );
        }
        if settings.compact {
            check_compact_limit("rule_per", "limit", limit);
        }
        let key = key.into_key();
        self.configure(move |s| {
            s.limit_per.rules.entry(key).or_default().insert(ms, limit);
        })
    }
}

/// # Per-client limits per route, in further windows
///
/// For a layer keyed by a pair `(client, route)`, such as
/// [`ClientRouteKey`](crate::ClientRouteKey): see the
/// [crate docs](crate#per-client-limits-per-route).
impl<C, X, M, R> SlidingWindowLayer<X, M, R>
where
    X: KeyExtractor<Key = (C, String)>,
    C: Clone + Eq + std::hash::Hash + Send + Sync + 'static,
{
    /// Gives `route` its own limit in the further window of `interval`
    /// (added with [`limit_per`](Self::limit_per)) for **every client
    /// separately**, as [`route_rule`](Self::route_rule) does for the first
    /// window: each key `(client, route)` is limited to `limit` in that
    /// window, counted apart from the other clients of the route. This
    /// makes the per-client rule "5 logins per minute, 100 per second
    /// elsewhere" one layer:
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::{ClientRouteKey, ForwardedIpKey, MatchedPathKey, SlidingWindowLayer};
    ///
    /// let minute = Duration::from_secs(60);
    /// // Per client: 100 per second on every route (and 6 000 per minute,
    /// // which 100 per second never exceeds), and 5 logins per minute.
    /// let layer = SlidingWindowLayer::qps(100)
    ///     .key(ClientRouteKey::new(ForwardedIpKey::trusted_hops(1), MatchedPathKey))
    ///     .limit_per(minute, 6_000)
    ///     .route_rule_per("POST /login", minute, 5);
    /// let stats = layer.handle();
    /// assert_eq!(stats.route_limits_per(minute).unwrap(), [("POST /login".to_owned(), 5)]);
    /// ```
    ///
    /// # Precedence, in each window
    ///
    /// 1. The key's own limit in that window ([`rule_per`](Self::rule_per)
    ///    with the pair, [`StatsHandle::set_limit_per`](crate::StatsHandle::set_limit_per),
    ///    a document's `windows."60s".limits`).
    /// 2. Else the route's rule in that window (this method,
    ///    [`StatsHandle::set_route_limit_per`](crate::StatsHandle::set_route_limit_per),
    ///    a document's `windows."60s".routes`).
    /// 3. Else the window's default ([`limit_per`](Self::limit_per)).
    ///
    /// A request passes only if every window admits it, so a login above
    /// is refused by the minute's window after 5, with the minute window's
    /// wait in `Retry-After`, and by the second's window after 100 in a
    /// second. Finding a new key's rules is one hash lookup of its route
    /// part for all further windows (none while no route has a further
    /// window's rule); nothing is kept per client. When the table is full,
    /// a new key of a route that also has a first-window
    /// [`route_rule`](Self::route_rule) shares the route's overflow entry,
    /// which has the route's limits in every window; a key of a route with
    /// further windows' rules only shares the layer's overflow entry, with
    /// the windows' defaults (give the route a `route_rule` too, at the
    /// first window's default, to keep its own overflow entry).
    ///
    /// On a [`compact`](Self::compact) layer too: a compact key reads its
    /// route's limits on every request; the clients its table has no room
    /// for share its one overflow window, limited in each further window
    /// by the smaller of the window's default and the client's route limit.
    ///
    /// # Panics
    ///
    /// When the layer has no further window of `interval` (call
    /// [`limit_per`](Self::limit_per) first), or when `route` is longer
    /// than [`MAX_KEY_BYTES`](crate::key::MAX_KEY_BYTES) (the built-in
    /// route extractors key a longer route by its digest form, which a rule
    /// cannot name).
    #[track_caller]
    pub fn route_rule_per(self, route: impl Into<String>, interval: Duration, limit: u64) -> Self {
        let ms = interval_ms("route_rule_per", interval);
        let route = route.into();
        if let Err(reason) = crate::rules::check_route(&route) {
            panic!("SlidingWindowLayer::route_rule_per: invalid `route`: {reason}");
        }
        let settings = self.store_settings();
        if settings.limit_per.index_of(ms).is_none() {
            panic!(
                "SlidingWindowLayer::route_rule_per: invalid `interval`: the layer has no \
                 `limit_per` window of {ms} ms (add it with `limit_per` before `route_rule_per`)"
            );
        }
        self.configure(move |s| {
            s.route_of = Some(crate::key::route_part::<C>);
            s.limit_per
                .routes
                .entry(route)
                .or_default()
                .insert(ms, limit);
        })
    }
}
