//! Limits as data: a [`Rules`] document states the default limit and the
//! per-key limits, and [`StatsHandle::apply_rules`](crate::StatsHandle::apply_rules)
//! applies all of it at once, or nothing, while the layer serves.
//!
//! With the `rules-file` feature,
//! [`StatsHandle::watch_rules`](crate::StatsHandle::watch_rules) re-applies
//! a file whenever it changes (see [`RulesWatcher`]).
//!
//! # The document
//!
//! Three fields, all optional; any other field is an error that names it,
//! so that a misspelt setting never silently does nothing.
//!
//! - `default`: the limit of every key without a rule of its own (per
//!   window, as [`qps`](crate::SlidingWindowLayer::qps) sets it). Absent:
//!   the layer's own default, the one it was built with.
//! - `limits`: a map from a key, written as text, to that key's limit.
//!   Keys with a rule now that are absent from the map go back to the
//!   default.
//! - `routes`: a map from a route to its limit for every client of it
//!   separately, for a layer keyed by client and route (see
//!   [below](self#per-client-limits-per-route)). Routes with a rule now
//!   that are absent go back to the default.
//!
//! Both name the key's first window. A layer with further windows
//! ([`limit_per`](crate::SlidingWindowLayer::limit_per)) also reads a
//! `windows` section (see [Further windows](#further-windows)).
//!
//! Applying a document sets the whole state, whatever was set before it
//! (by an earlier document, [`rule`](crate::SlidingWindowLayer::rule) or
//! [`set_limit`](crate::StatsHandle::set_limit)): applying the same
//! document twice, or after anything else, ends in the same limits.
//!
//! Limits are whole numbers from 0 (the key is refused entirely) to
//! [`MAX_LIMIT`] (2^53, the largest integer that every JSON and YAML reader
//! keeps exactly). A larger number is refused when the document is applied,
//! with an error naming the rule and the field; a negative or fractional
//! number, or text, is not a document at all, and the format's reader
//! refuses it (TOML's and YAML's errors quote the line).
//!
//! The same document in TOML, JSON and YAML (a [`PathKey`](crate::PathKey)
//! layer: keys are paths):
//!
//! ```toml
//! default = 100
//!
//! [limits]
//! "/login" = 5
//! "/search" = 20
//! ```
//!
//! ```json
//! { "default": 100, "limits": { "/login": 5, "/search": 20 } }
//! ```
//!
//! ```yaml
//! default: 100
//! limits:
//!   /login: 5
//!   /search: 20
//! ```
//!
//! # Further windows
//!
//! A layer with further windows
//! ([`limit_per`](crate::SlidingWindowLayer::limit_per)) reads a third
//! optional field, `windows`: a map from a window's interval to that
//! window's `default` and `limits`, as above. The interval is a whole
//! number with a unit, `ms`, `s`, `m`, `h` or `d` (`"60s"`, `"1m"` and
//! `"60000ms"` name the same window), and must name a `limit_per` window of
//! the layer. `default` and `limits` at the top of the document keep naming
//! the first window. A window absent from `windows` goes back to the limit
//! its `limit_per` gave it, with no per-key limits, as `default` does.
//! A window's section may also hold `routes`, a route's limit in that
//! window for every client separately (see
//! [below](self#per-client-limits-per-route)). Errors name the window's
//! rule: `windows["60s"]` (field `interval`), `windows["60s"].default`
//! (field `limit`), `windows["60s"].limits["/login"]` (field `key` or
//! `limit`), or `windows["60s"].routes["POST /login"]` (field `route` or
//! `limit`).
//!
//! ```toml
//! default = 10             # per second: the first window
//!
//! [windows."1m"]
//! default = 300
//!
//! [windows."1m".limits]
//! "/export" = 20
//! ```
//!
//! ```
//! use std::time::Duration;
//! use tower_sliding_window::rules::Rules;
//! use tower_sliding_window::{PathKey, SlidingWindowLayer};
//!
//! let minute = Duration::from_secs(60);
//! let layer = SlidingWindowLayer::qps(10).key(PathKey).limit_per(minute, 600);
//! let stats = layer.handle();
//! let rules: Rules = serde_json::from_str(
//!     r#"{ "default": 10, "windows": { "60s": { "default": 300, "limits": { "/export": 20 } } } }"#,
//! ).unwrap();
//! assert_eq!(rules, Rules::new().default_limit(10).window_default(minute, 300).window_limit(minute, "/export", 20));
//! stats.apply_rules(&rules).unwrap();
//! assert_eq!(stats.limits_per(&"/export".to_owned())[1], (minute, 20));
//!
//! // A window the layer does not have: nothing applied, the rule named.
//! let err = stats.apply_rules(&Rules::new().window_default(Duration::from_secs(7), 1)).unwrap_err();
//! assert_eq!(err.rule(), Some(r#"windows["7s"]"#));
//! assert_eq!(err.field(), Some("interval"));
//! assert_eq!(stats.limits_per(&"/export".to_owned())[1], (minute, 20));
//! ```
//!
//! # How keys are written
//!
//! A key is text in the document, read into the layer's key type through
//! [`RuleKey`]:
//!
//! | extractor | key type | a key in the document |
//! |---|---|---|
//! | [`PathKey`](crate::PathKey) | `String` | the path: `"/login"` |
//! | [`MethodPathKey`](crate::MethodPathKey), `MatchedPathKey` | `String` | method, space, path: `"POST /login"`, `"GET /users/{id}"` |
//! | [`HeaderKey`](crate::HeaderKey) | `Option<String>` | the header's value: `"tenant-a"` (requests without the header are on the default limit) |
//! | [`PeerIpKey`](crate::PeerIpKey), [`ForwardedIpKey`](crate::ForwardedIpKey) | `Option<IpAddr>` | the address as the layer keys it: `"10.0.0.7"`; for IPv6, the network address of the client's prefix: `"2001:db8::"` for any address of `2001:db8::/64` (see [`PeerIpKey::key_of`](crate::PeerIpKey::key_of)) |
//! | [`ClientRouteKey`](crate::ClientRouteKey) | `(C, String)` | the client part as above, `, `, the route: `"10.0.0.7, POST /login"` (the route alone, in `routes`: `"POST /login"`) |
//! | [`GlobalKey`](crate::GlobalKey) | `()` | none: only `default` applies |
//!
//! For example, per client address:
//!
//! ```toml
//! default = 50
//!
//! [limits]
//! "10.0.0.7" = 500
//! "2001:db8:0:7::" = 0   # every address of 2001:db8:0:7::/64
//! ```
//!
//! Text keys are at most [`MAX_KEY_BYTES`](crate::key::MAX_KEY_BYTES)
//! bytes: the built-in extractors key a longer value by its digest, which
//! a rule could never name. Two keys that read as the same key (`"::1"`
//! and `"0::1"`, or `"::ffff:10.0.0.7"` and `"10.0.0.7"`) are an error.
//!
//! # Per-client limits per route
//!
//! For a layer keyed by a pair `(client, route)`
//! ([`ClientRouteKey`](crate::ClientRouteKey)), `routes` names routes as
//! the route extractor writes them (`"POST /login"`, `"GET /users/{id}"`
//! with `MatchedPathKey`), and each key of the route gets the route's limit
//! with a count of its own. A key in `limits` names one client of one
//! route, written as the exporters show the pair: `"client, route"` (see
//! [`RuleKey`] for pairs); it wins over its route's rule.
//!
//! ```toml
//! default = 100
//!
//! [routes]
//! "POST /login" = 5          # each client: 5 logins per window
//!
//! [limits]
//! "10.0.0.7, POST /login" = 50   # this client: 50
//! ```
//!
//! The route rules of a further window
//! ([`limit_per`](crate::SlidingWindowLayer::limit_per)) are in that
//! window's section, with the same precedence in each window: the key's
//! own limit there, else its route's, else the window's default. The
//! per-client rule "5 logins per minute, 100 per second elsewhere", for a
//! layer of `qps(100)` and `limit_per(60 s, 6_000)`:
//!
//! ```toml
//! default = 100                 # per second: the first window
//!
//! [windows."60s".routes]
//! "POST /login" = 5             # each client: 5 logins per minute
//!
//! [windows."60s".limits]
//! "10.0.0.7, POST /login" = 50  # this client: 50
//! ```
//!
//! A route is at most [`MAX_KEY_BYTES`](crate::key::MAX_KEY_BYTES) bytes;
//! a route rule for a layer whose keys have no route part is an error
//! (field `route`), as is a limit above [`MAX_LIMIT`] (field `limit`); the
//! rule is named `routes["<route>"]`. On a
//! [`compact`](crate::SlidingWindowLayer::compact) layer, limits above
//! 65 535 are taken as 65 535, with a `warn` event.
//!
//! ```
//! use tower_sliding_window::rules::Rules;
//! use tower_sliding_window::{ClientRouteKey, MatchedPathKey, PeerIpKey, SlidingWindowLayer};
//!
//! let layer = SlidingWindowLayer::qps(100).key(ClientRouteKey::new(PeerIpKey, MatchedPathKey));
//! let stats = layer.handle();
//! let rules: Rules = serde_json::from_str(
//!     r#"{ "routes": { "POST /login": 5 }, "limits": { "10.0.0.7, POST /login": 50 } }"#,
//! ).unwrap();
//! assert_eq!(stats.apply_rules(&rules), Ok(1));
//! assert_eq!(stats.route_limits(), [("POST /login".to_owned(), 5)]);
//!
//! let err = stats.apply_rules(&Rules::new().route_limit("x".repeat(300), 5)).unwrap_err();
//! assert_eq!(err.field(), Some("route"));
//! assert_eq!(stats.route_limits(), [("POST /login".to_owned(), 5)]);
//! ```
//!
//! # Room to grow
//!
//! A rule is a number today. Later versions may accept a table in its
//! place; a number will keep meaning what it means now.
//!
//! # Example
//!
//! ```
//! use tower_sliding_window::rules::Rules;
//! use tower_sliding_window::{PathKey, SlidingWindowLayer};
//!
//! let layer = SlidingWindowLayer::qps(100).key(PathKey);
//! let stats = layer.handle();
//!
//! let rules = Rules::new().default_limit(50).limit("/login", 5);
//! stats.apply_rules(&rules).unwrap();
//! assert_eq!(stats.rules_status().version, 1);
//!
//! // All or nothing: the invalid rule leaves every limit as it was.
//! let bad = Rules::new().default_limit(10).limit(&"x".repeat(300), 1);
//! let err = stats.apply_rules(&bad).unwrap_err();
//! assert_eq!(err.field(), Some("key"));
//! assert_eq!(stats.rules_status().version, 1);
//! ```

mod error;
mod key;
mod status;
#[cfg(feature = "rules-file")]
mod watch;
mod windows;

use std::collections::BTreeMap;
use std::fmt;

pub(crate) use error::route_rule_name;
pub use error::{RulesError, RulesErrorKind};
pub use key::RuleKey;
pub use status::RulesStatus;
pub(crate) use status::{lock, Status};
#[cfg(feature = "rules-file")]
#[cfg_attr(docsrs, doc(cfg(feature = "rules-file")))]
pub use watch::{RulesParser, RulesWatcher, RulesWatcherBuilder, MAX_RULES_FILE_BYTES};
pub(crate) use windows::{check_windows, window_route_rule_name};
pub use windows::{interval_text, WindowRules};

/// The largest limit a rule may set: 2^53, the largest integer that every
/// JSON and YAML reader keeps exactly (and the largest a Redis store's
/// script counts to).
pub const MAX_LIMIT: u64 = 1 << 53;

/// A rules document: the default limit, the per-key limits and the
/// per-route limits (see the
/// [module docs](self) for the format).
///
/// Built in code with [`new`](Self::new), [`default_limit`](Self::default_limit)
/// and [`limit`](Self::limit), or read with serde (feature `serde`) from
/// TOML, JSON, YAML or any other format. Nothing is checked until it is
/// applied: [`StatsHandle::apply_rules`](crate::StatsHandle::apply_rules)
/// validates the whole document against the layer's key type first.
///
/// ```
/// use tower_sliding_window::rules::Rules;
///
/// let rules: Rules = serde_json::from_str(r#"{ "limits": { "/login": 5 } }"#).unwrap();
/// assert_eq!(rules, Rules::new().limit("/login", 5));
///
/// let typo = serde_json::from_str::<Rules>(r#"{ "defualt": 5 }"#).unwrap_err();
/// assert!(typo.to_string().contains("unknown field `defualt`"));
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields)
)]
#[non_exhaustive]
pub struct Rules {
    /// The limit of every key without its own rule; `None`: the layer's
    /// own default.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub default: Option<u64>,
    /// Each key's own limit, the key written as text (see [`RuleKey`]).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "BTreeMap::is_empty")
    )]
    pub limits: BTreeMap<String, u64>,
    /// Each route's limit for every client separately, the route written
    /// as text (see [Per-client limits per route](self#per-client-limits-per-route)).
    /// Only for layers keyed by a pair `(client, route)`.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "BTreeMap::is_empty")
    )]
    pub routes: BTreeMap<String, u64>,
    /// The limits of the layer's further windows
    /// ([`limit_per`](crate::SlidingWindowLayer::limit_per)), by interval
    /// written as text (`"60s"`, `"1h"`, `"500ms"`; see
    /// [the module docs](self#further-windows)).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "BTreeMap::is_empty")
    )]
    pub windows: BTreeMap<String, WindowRules>,
}

impl Rules {
    /// An empty document: the layer's own default, no per-key limit.
    pub fn new() -> Self {
        Rules::default()
    }

    /// Sets the default limit.
    pub fn default_limit(mut self, limit: u64) -> Self {
        self.default = Some(limit);
        self
    }

    /// Sets `key`'s own limit (the key as the document writes it).
    pub fn limit(mut self, key: impl Into<String>, limit: u64) -> Self {
        self.limits.insert(key.into(), limit);
        self
    }

    /// Sets `route`'s limit, for every client of the route separately (see
    /// [Per-client limits per route](self#per-client-limits-per-route)).
    pub fn route_limit(mut self, route: impl Into<String>, limit: u64) -> Self {
        self.routes.insert(route.into(), limit);
        self
    }
}

impl fmt::Debug for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rules")
            .field("default", &self.default)
            .field("limits", &self.limits)
            .field("routes", &self.routes)
            .field("windows", &self.windows)
            .finish()
    }
}

/// A document checked against a key type: what the key table applies.
#[derive(Debug)]
pub(crate) struct Checked<K> {
    pub(crate) default: Option<u64>,
    pub(crate) limits: Vec<(K, u64)>,
}

/// Checks every value of `rules` and reads every key into `K`, or names the
/// first rule and field that is wrong.
pub(crate) fn check<K: RuleKey + Clone + Eq + std::hash::Hash>(
    rules: &Rules,
) -> Result<Checked<K>, RulesError> {
    if let Some(limit) = rules.default {
        check_limit(limit).map_err(|reason| RulesError::invalid("default", "limit", reason))?;
    }
    let mut seen: std::collections::HashMap<K, &str> =
        std::collections::HashMap::with_capacity(rules.limits.len());
    let mut limits = Vec::with_capacity(rules.limits.len());
    for (text, &limit) in &rules.limits {
        let rule = || error::rule_name(text);
        let key =
            K::from_rule_key(text).map_err(|reason| RulesError::invalid(rule(), "key", reason))?;
        check_limit(limit).map_err(|reason| RulesError::invalid(rule(), "limit", reason))?;
        if let Some(first) = seen.get(&key) {
            return Err(RulesError::invalid(
                rule(),
                "key",
                format!("key names the same key as {}", error::rule_name(first)),
            ));
        }
        seen.insert(key.clone(), text);
        limits.push((key, limit));
    }
    Ok(Checked {
        default: rules.default,
        limits,
    })
}

/// Checks every route rule of `rules` against a key type, or names the
/// first that is wrong: the key type must have a route part
/// ([`RuleKey::route_of_key`]), each route at most
/// [`MAX_KEY_BYTES`](crate::key::MAX_KEY_BYTES) bytes, each limit at most
/// [`MAX_LIMIT`].
pub(crate) fn check_routes<K: RuleKey>(
    rules: &Rules,
) -> Result<std::collections::HashMap<String, u64>, RulesError> {
    let mut routes = std::collections::HashMap::with_capacity(rules.routes.len());
    for (route, &limit) in &rules.routes {
        let rule = || error::route_rule_name(route);
        if K::route_of_key().is_none() {
            return Err(RulesError::invalid(
                rule(),
                "route",
                "the layer's keys have no route part: route rules need a key made of a client \
                 and a route (`ClientRouteKey`)",
            ));
        }
        check_route(route).map_err(|reason| RulesError::invalid(rule(), "route", reason))?;
        check_limit(limit).map_err(|reason| RulesError::invalid(rule(), "limit", reason))?;
        routes.insert(route.clone(), limit);
    }
    Ok(routes)
}

/// A route a rule can name: at most [`MAX_KEY_BYTES`](crate::key::MAX_KEY_BYTES)
/// bytes, as the built-in route extractors key a longer route by its
/// digest form.
pub(crate) fn check_route(route: &str) -> Result<(), String> {
    let max = crate::key::MAX_KEY_BYTES;
    if route.len() > max {
        return Err(format!(
            "route must be at most {max} bytes, as a longer route is keyed by its digest (got {} \
             bytes)",
            route.len()
        ));
    }
    Ok(())
}

fn check_limit(limit: u64) -> Result<(), String> {
    if limit > MAX_LIMIT {
        return Err(format!("limit must be at most {MAX_LIMIT} (got {limit})"));
    }
    Ok(())
}
