//! Reading and changing the windows of a key
//! ([`SlidingWindowLayer::limit_per`](crate::SlidingWindowLayer::limit_per)).

use std::borrow::Borrow;
use std::hash::Hash;
use std::time::Duration;

use super::StatsHandle;
use crate::error::ConfigError;
use crate::key::IntoKey;
use crate::rules::{interval_text, RulesError};
use crate::stat::COMPACT_MAX_LIMIT;
use crate::store::effective_now;

/// One window of a key: its interval, the key's limit in it and the passes
/// it holds, as [`StatsHandle::windows`] reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct WindowCount {
    /// The window's length: the first window's
    /// ([`window`](crate::SlidingWindowLayer::window), 1 s by default), or a
    /// [`limit_per`](crate::SlidingWindowLayer::limit_per) interval.
    pub interval: Duration,
    /// The key's limit in this window now (its own, or the window's
    /// default).
    pub limit: u64,
    /// Admitted requests in the window now.
    pub pass: u64,
}

/// # Several windows
impl<K: Clone + Eq + Hash + Send + Sync + 'static> StatsHandle<K> {
    /// Every window of `key` with its limit and passes now: the first
    /// window first (the one [`snapshot`](Self::snapshot) reports), then
    /// each [`limit_per`](crate::SlidingWindowLayer::limit_per) window in
    /// the order the layer was given them. `None` for a key without
    /// statistics (never seen, evicted, or counted on the overflow entry),
    /// as [`snapshot`](Self::snapshot).
    ///
    /// Every admitted request is counted in every window, and a refused
    /// one in none; so while no window has slid, the passes are the same
    /// in each.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// let layer = SlidingWindowLayer::qps(10).limit_per(Duration::from_secs(3600), 500);
    /// let stats = layer.handle();
    /// assert!(stats.windows(&()).is_none()); // no request yet
    /// ```
    pub fn windows<Q>(&self, key: &Q) -> Option<Vec<WindowCount>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(keys) = self.compact() {
            // The first window as the snapshot reads it; the further ones
            // from the key's place, with the limits the registry keeps for
            // them.
            let snapshot = self.snapshot(key)?;
            let first = WindowCount {
                interval: Duration::from_millis(self.registry().window().interval_ms),
                limit: snapshot.limit,
                pass: snapshot.pass,
            };
            if keys.further_shapes().is_empty() {
                return Some(vec![first]);
            }
            let now = self.now();
            let registry = self.registry();
            return keys.table().get_keyed(key, |held, place| {
                // The limits the key is decided under: its own, its
                // route's, or the default, in each further window.
                let route = registry.routes().route_of(held);
                let mut limits = vec![0; keys.further_shapes().len()];
                registry
                    .windows()
                    .fill_limits(Some(held), route, &mut limits);
                let at = keys.anchor(place.value, place.further, now);
                std::iter::once(first)
                    .chain(
                        place
                            .further
                            .iter()
                            .zip(keys.further_shapes())
                            .zip(&limits)
                            .map(|((window, shape), &limit)| WindowCount {
                                interval: Duration::from_millis(shape.interval_ms),
                                limit,
                                pass: window.window_counts(shape, at).0,
                            }),
                    )
                    .collect()
            });
        }
        let entry = self.registry().get(key)?;
        let at = effective_now(&entry, self.now());
        let mut windows = vec![WindowCount {
            interval: Duration::from_millis(self.registry().window().interval_ms),
            limit: entry.limit(),
            pass: entry.node.window_counts(at).pass,
        }];
        if let Some(further) = entry.windows() {
            windows.extend(further.iter().map(|window| WindowCount {
                interval: Duration::from_millis(window.interval_ms()),
                limit: window.limit(),
                pass: window.pass(at),
            }));
        }
        Some(windows)
    }

    /// The limit `key` has in every window, seen or not: the first window
    /// first, then each [`limit_per`](crate::SlidingWindowLayer::limit_per)
    /// window, as `(interval, limit)`. See
    /// [`rule_per`](crate::SlidingWindowLayer::rule_per) for an example.
    /// (On a [`compact`](crate::SlidingWindowLayer::compact) layer, for a
    /// key its table does not hold, the first window's limit read is the
    /// one the layer was built with for it.)
    ///
    /// The limits read are the key's own or the window's default: a route
    /// rule ([`route_rule_per`](crate::SlidingWindowLayer::route_rule_per),
    /// [`route_rule`](crate::SlidingWindowLayer::route_rule)) is not in
    /// them. [`windows`](Self::windows) reads the limits a key in the table
    /// runs on, route rules included, and
    /// [`route_limits_per`](Self::route_limits_per) lists a window's route
    /// rules.
    pub fn limits_per<Q>(&self, key: &Q) -> Vec<(Duration, u64)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let registry = self.registry();
        // A compact layer keeps its keys' limits in its own table: the one
        // of a key it holds is read there.
        let held = self
            .compact()
            .and_then(|keys| keys.table().get(key, |place| place.limit));
        let first = (
            Duration::from_millis(registry.window().interval_ms),
            held.unwrap_or_else(|| registry.limit_of(key)),
        );
        std::iter::once(first)
            .chain(
                registry
                    .windows()
                    .limits_of(Some(key))
                    .into_iter()
                    .map(|(ms, limit)| (Duration::from_millis(ms), limit)),
            )
            .collect()
    }

    /// Sets `key`'s own limit in the window of `interval` (added with
    /// [`limit_per`](crate::SlidingWindowLayer::limit_per)), from the next
    /// request, also for a key not seen yet; it survives eviction of the
    /// key's statistics, as [`set_limit`](Self::set_limit)'s. The passes
    /// the window holds stay counted (no burst). The first window's limit
    /// is [`set_limit`](Self::set_limit)'s.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::{PathKey, SlidingWindowLayer};
    ///
    /// let hour = Duration::from_secs(3600);
    /// let layer = SlidingWindowLayer::qps(10).key(PathKey).limit_per(hour, 1_000);
    /// let stats = layer.handle();
    /// stats.set_limit_per("/report", hour, 50).unwrap();
    /// assert_eq!(stats.limits_per(&"/report".to_owned())[1], (hour, 50));
    /// assert!(stats.remove_limit_per("/report", hour).unwrap());
    /// assert_eq!(stats.limits_per(&"/report".to_owned())[1], (hour, 1_000));
    ///
    /// // No window of that interval: an error naming the setting.
    /// let err = stats.set_limit_per("/report", Duration::from_secs(7), 5).unwrap_err();
    /// assert_eq!(err.field(), "interval");
    /// ```
    ///
    /// # Errors
    ///
    /// When the layer has no `limit_per` window of `interval`.
    pub fn set_limit_per(
        &self,
        key: impl IntoKey<K>,
        interval: Duration,
        limit: u64,
    ) -> Result<(), ConfigError> {
        let i = self.window_index(interval)?;
        let limit = if self.compact().is_some() && limit > COMPACT_MAX_LIMIT {
            tracing::warn!(
                limit,
                max = COMPACT_MAX_LIMIT,
                "StatsHandle::set_limit_per: a compact layer counts at most {COMPACT_MAX_LIMIT} \
                 passes per window; the key's limit is set to that maximum"
            );
            COMPACT_MAX_LIMIT
        } else {
            limit
        };
        self.registry()
            .set_window_limit(key.into_key(), i, Some(limit));
        Ok(())
    }

    /// Removes `key`'s own limit in the window of `interval`: the key is
    /// limited there by the window's default again, from the next request.
    /// Returns whether it had its own limit there.
    ///
    /// # Errors
    ///
    /// When the layer has no `limit_per` window of `interval`.
    pub fn remove_limit_per(
        &self,
        key: impl IntoKey<K>,
        interval: Duration,
    ) -> Result<bool, ConfigError> {
        let i = self.window_index(interval)?;
        let key = key.into_key();
        let registry = self.registry();
        let had = registry.windows().own_limit(&key, i).is_some();
        if had {
            registry.set_window_limit(key, i, None);
        }
        Ok(had)
    }

    /// The index of the further window of `interval`, or an error naming
    /// the setting.
    fn window_index(&self, interval: Duration) -> Result<usize, ConfigError> {
        let ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
        self.registry()
            .windows()
            .index_of(ms)
            .filter(|_| interval.subsec_nanos() % 1_000_000 == 0)
            .ok_or_else(|| {
                ConfigError::new(
                    "interval",
                    "must be the interval of a `limit_per` window of the layer",
                    format!("got {interval:?}"),
                )
            })
    }
}

/// # Per-client limits per route, in further windows
///
/// For a layer keyed by a pair `(client, route)`, such as
/// [`ClientRouteKey`](crate::ClientRouteKey), with further windows
/// ([`limit_per`](crate::SlidingWindowLayer::limit_per)).
impl<C: Clone + Eq + Hash + Send + Sync + 'static> StatsHandle<(C, String)> {
    /// Sets `route`'s limit in the window of `interval` (added with
    /// [`limit_per`](crate::SlidingWindowLayer::limit_per)) for every
    /// client of it separately, as
    /// [`route_rule_per`](crate::SlidingWindowLayer::route_rule_per) does in
    /// the builder; [`set_route_limit`](Self::set_route_limit) is the first
    /// window's. It applies from the next request to every key of the route
    /// without its own limit in that window
    /// ([`set_limit_per`](Self::set_limit_per),
    /// [`rule_per`](crate::SlidingWindowLayer::rule_per)), against each
    /// key's window as it is (no burst: passes already counted stay
    /// counted, so a lower limit refuses at once and a higher one admits
    /// only the difference), also to clients not seen yet, and survives
    /// eviction. Nothing is stored per client.
    ///
    /// Route changes and [`apply_rules`](Self::apply_rules) are applied one
    /// at a time; a request during the change sees its key's old limit or
    /// its new one, never another.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::{ClientRouteKey, MatchedPathKey, PeerIpKey, SlidingWindowLayer};
    ///
    /// let minute = Duration::from_secs(60);
    /// let layer = SlidingWindowLayer::qps(100)
    ///     .key(ClientRouteKey::new(PeerIpKey, MatchedPathKey))
    ///     .limit_per(minute, 6_000);
    /// let stats = layer.handle();
    /// stats.set_route_limit_per("POST /login", minute, 5).unwrap();
    /// assert_eq!(
    ///     stats.route_limits_per(minute).unwrap(),
    ///     [("POST /login".to_owned(), 5)]
    /// );
    ///
    /// // No window of that interval: an error naming the field.
    /// let err = stats
    ///     .set_route_limit_per("POST /login", Duration::from_secs(7), 5)
    ///     .unwrap_err();
    /// assert_eq!(err.field(), Some("interval"));
    /// assert!(stats.remove_route_limit_per("POST /login", minute).unwrap());
    /// assert!(stats.route_limits_per(minute).unwrap().is_empty());
    /// ```
    ///
    /// # Errors
    ///
    /// When the layer has no `limit_per` window of `interval` (field
    /// `interval`), or when `route` is longer than
    /// [`MAX_KEY_BYTES`](crate::key::MAX_KEY_BYTES) (field `route`, as
    /// [`set_route_limit`](Self::set_route_limit)); nothing changes then.
    /// The error names the rule as a rules document does:
    /// `windows["60s"].routes["POST /login"]`.
    ///
    /// # On a compact layer
    ///
    /// A [`compact`](crate::SlidingWindowLayer::compact) key reads its
    /// limits on every request, so a change applies at its next request.
    /// The keys its table has no room for share one overflow window, whose
    /// limit in each further window is the smaller of the window's default
    /// and the key's own or route limit.
    pub fn set_route_limit_per(
        &self,
        route: &str,
        interval: Duration,
        limit: u64,
    ) -> Result<(), RulesError> {
        let i = self.route_window_index(route, interval)?;
        crate::rules::check_route(route).map_err(|reason| {
            RulesError::invalid(
                crate::rules::window_route_rule_name(&interval_text(interval), route),
                "route",
                reason,
            )
        })?;
        let registry = self.registry();
        let _applying = crate::rules::lock(&registry.rules().applying);
        registry.set_route_window_limit(crate::key::route_part::<C>, route, i, Some(limit));
        Ok(())
    }

    /// Removes `route`'s rule in the window of `interval`: its keys without
    /// their own limit there go back to the window's default from the next
    /// request (their windows as they are). Returns whether the route had
    /// a rule there.
    ///
    /// # Errors
    ///
    /// When the layer has no `limit_per` window of `interval` (field
    /// `interval`).
    pub fn remove_route_limit_per(
        &self,
        route: &str,
        interval: Duration,
    ) -> Result<bool, RulesError> {
        let i = self.route_window_index(route, interval)?;
        let registry = self.registry();
        let _applying = crate::rules::lock(&registry.rules().applying);
        Ok(registry.set_route_window_limit(crate::key::route_part::<C>, route, i, None))
    }

    /// Every route rule of the window of `interval`, as (route, limit),
    /// sorted by route.
    ///
    /// # Errors
    ///
    /// When the layer has no `limit_per` window of `interval` (field
    /// `interval`).
    pub fn route_limits_per(&self, interval: Duration) -> Result<Vec<(String, u64)>, ConfigError> {
        let i = self.window_index(interval)?;
        let mut routes = self.registry().windows().route_rules_of(i);
        routes.sort_unstable();
        Ok(routes)
    }

    /// [`window_index`](Self::window_index) as an error of the route rule.
    fn route_window_index(&self, route: &str, interval: Duration) -> Result<usize, RulesError> {
        self.window_index(interval).map_err(|_| {
            RulesError::invalid(
                crate::rules::window_route_rule_name(&interval_text(interval), route),
                "interval",
                format!("the layer has no `limit_per` window of {interval:?}"),
            )
        })
    }
}
