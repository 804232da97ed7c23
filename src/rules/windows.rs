//! The `windows` section of a rules document: the default and per-key
//! limits of the layer's further windows
//! ([`limit_per`](crate::SlidingWindowLayer::limit_per)).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use super::error::{route_rule_name, rule_name, RulesError};
use super::{check_limit, check_route, RuleKey, Rules};

/// The limits of one further window in a rules document (see
/// [`Rules::windows`]).
#[derive(Clone, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(deny_unknown_fields)
)]
#[non_exhaustive]
pub struct WindowRules {
    /// The window's limit for every key without its own; `None`: the limit
    /// the layer's [`limit_per`](crate::SlidingWindowLayer::limit_per) gave
    /// it.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub default: Option<u64>,
    /// Each key's own limit in this window, the key written as text (see
    /// [`RuleKey`]).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "BTreeMap::is_empty")
    )]
    pub limits: BTreeMap<String, u64>,
    /// Each route's limit in this window for every client of it
    /// separately, the route written as text, for a layer keyed by a pair
    /// `(client, route)` (see
    /// [Per-client limits per route](super#per-client-limits-per-route)).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "BTreeMap::is_empty")
    )]
    pub routes: BTreeMap<String, u64>,
}

impl fmt::Debug for WindowRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowRules")
            .field("default", &self.default)
            .field("limits", &self.limits)
            .field("routes", &self.routes)
            .finish()
    }
}

/// How a document writes an interval: whole milliseconds, seconds, minutes,
/// hours or days.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::rules::interval_text;
///
/// assert_eq!(interval_text(Duration::from_secs(60)), "60s");
/// assert_eq!(interval_text(Duration::from_millis(1_500)), "1500ms");
/// ```
pub fn interval_text(interval: Duration) -> String {
    let ms = interval.as_millis();
    if ms % 1_000 == 0 {
        format!("{}s", ms / 1_000)
    } else {
        format!("{ms}ms")
    }
}

/// Reads an interval written `<n>ms`, `<n>s`, `<n>m`, `<n>h` or `<n>d` into
/// milliseconds.
fn parse_interval(text: &str) -> Result<u64, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let scale: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(
                "interval must be a whole number with a unit: ms, s, m, h or d (as \"60s\")"
                    .to_owned(),
            );
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| "interval must start with a whole number (as \"60s\")".to_owned())?;
    n.checked_mul(scale)
        .ok_or_else(|| "interval is too long".to_owned())
}

/// How an error names a window's rule: `windows["60s"]`, its `.default`,
/// or its `.limits["<key>"]`.
fn window_name(interval: &str, rest: &str) -> String {
    let mut end = interval.len().min(32);
    while !interval.is_char_boundary(end) {
        end -= 1;
    }
    let shown: String = interval[..end].escape_debug().collect();
    format!("windows[\"{shown}\"]{rest}")
}

/// How an error names a route rule of a window:
/// `windows["60s"].routes["POST /login"]`.
pub(crate) fn window_route_rule_name(interval: &str, route: &str) -> String {
    window_name(interval, &format!(".{}", route_rule_name(route)))
}

/// A `windows` section checked against a layer's further windows: one
/// default per window (`None`: the layer's own), each key's limits and
/// each route's.
pub(crate) struct CheckedWindows<K> {
    pub(crate) defaults: Vec<Option<u64>>,
    pub(crate) per_key: HashMap<K, Box<[Option<u64>]>>,
    pub(crate) per_route: HashMap<String, Box<[Option<u64>]>>,
}

/// Checks the `windows` section of `rules` against the layer's further
/// windows (`index_of` finds a window by its interval in ms, among `count`):
/// every interval must name one, each limit be at most `MAX_LIMIT`, each
/// key read into `K`, each route at most `MAX_KEY_BYTES` of a key type with
/// a route part, no window named twice. The error names the rule and the
/// field (`interval`, `limit`, `key` or `route`).
pub(crate) fn check_windows<K: RuleKey + Clone + Eq + Hash>(
    rules: &Rules,
    count: usize,
    index_of: impl Fn(u64) -> Option<usize>,
) -> Result<CheckedWindows<K>, RulesError> {
    let mut defaults = vec![None; count];
    let mut per_key: HashMap<K, Box<[Option<u64>]>> = HashMap::new();
    let mut per_route: HashMap<String, Box<[Option<u64>]>> = HashMap::new();
    let mut seen: HashMap<usize, &str> = HashMap::new();
    for (text, window) in &rules.windows {
        let name = || window_name(text, "");
        let ms = parse_interval(text)
            .map_err(|reason| RulesError::invalid(name(), "interval", reason))?;
        let Some(i) = index_of(ms) else {
            return Err(RulesError::invalid(
                name(),
                "interval",
                format!("the layer has no `limit_per` window of {ms} ms"),
            ));
        };
        if let Some(first) = seen.insert(i, text) {
            return Err(RulesError::invalid(
                name(),
                "interval",
                format!("names the same window as {}", window_name(first, "")),
            ));
        }
        if let Some(limit) = window.default {
            check_limit(limit).map_err(|reason| {
                RulesError::invalid(window_name(text, ".default"), "limit", reason)
            })?;
            defaults[i] = Some(limit);
        }
        for (key_text, &limit) in &window.limits {
            let rule = || window_name(text, &format!(".{}", rule_name(key_text)));
            let key = K::from_rule_key(key_text)
                .map_err(|reason| RulesError::invalid(rule(), "key", reason))?;
            check_limit(limit).map_err(|reason| RulesError::invalid(rule(), "limit", reason))?;
            let slots = per_key
                .entry(key)
                .or_insert_with(|| vec![None; count].into_boxed_slice());
            if slots[i].is_some() {
                return Err(RulesError::invalid(
                    rule(),
                    "key",
                    "key names the same key as another rule of this window",
                ));
            }
            slots[i] = Some(limit);
        }
        for (route, &limit) in &window.routes {
            let rule = || window_route_rule_name(text, route);
            if K::route_of_key().is_none() {
                return Err(RulesError::invalid(
                    rule(),
                    "route",
                    "the layer's keys have no route part: route rules need a key made of a \
                     client and a route (`ClientRouteKey`)",
                ));
            }
            check_route(route).map_err(|reason| RulesError::invalid(rule(), "route", reason))?;
            check_limit(limit).map_err(|reason| RulesError::invalid(rule(), "limit", reason))?;
            // Routes are text: two routes of one window are two rules (the
            // map's keys are distinct).
            per_route
                .entry(route.clone())
                .or_insert_with(|| vec![None; count].into_boxed_slice())[i] = Some(limit);
        }
    }
    Ok(CheckedWindows {
        defaults,
        per_key,
        per_route,
    })
}

/// # Further windows
impl Rules {
    /// Sets the default limit of the layer's further window of `interval`
    /// (added with [`limit_per`](crate::SlidingWindowLayer::limit_per)).
    pub fn window_default(mut self, interval: Duration, limit: u64) -> Self {
        self.windows
            .entry(interval_text(interval))
            .or_default()
            .default = Some(limit);
        self
    }

    /// Sets `route`'s limit in the layer's further window of `interval`, for
    /// every client of the route separately (a layer keyed by client and
    /// route; see [Per-client limits per route](crate::rules#per-client-limits-per-route)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::rules::Rules;
    ///
    /// let rules = Rules::new().window_route_limit(Duration::from_secs(60), "POST /login", 5);
    /// assert_eq!(rules.windows["60s"].routes["POST /login"], 5);
    /// ```
    pub fn window_route_limit(
        mut self,
        interval: Duration,
        route: impl Into<String>,
        limit: u64,
    ) -> Self {
        self.windows
            .entry(interval_text(interval))
            .or_default()
            .routes
            .insert(route.into(), limit);
        self
    }

    /// Sets `key`'s own limit in the layer's further window of `interval`
    /// (the key as the document writes it).
    pub fn window_limit(mut self, interval: Duration, key: impl Into<String>, limit: u64) -> Self {
        self.windows
            .entry(interval_text(interval))
            .or_default()
            .limits
            .insert(key.into(), limit);
        self
    }
}
