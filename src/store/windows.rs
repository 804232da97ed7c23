//! The further windows of every key (`SlidingWindowLayer::limit_per`):
//! their settings until the table is built, then their default and per-key
//! limits in the table.
//!
//! Kept apart from the first window's limits (`Registry::limits`), which
//! keep their behaviour: `rule`, `set_limit` and a rules document's
//! `default` and `limits` name the first window only.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::{Arc, OnceLock};

use super::Entry;
use crate::stat::{ExtraWindows, WindowShape};
use crate::sync::{read, write, AtomicU64, AtomicUsize, Ordering, RwLock};

/// The further windows as the builder sets them.
#[derive(Debug, Clone)]
pub(crate) struct LimitPer<K> {
    /// Every further window, in the order given: its interval in
    /// milliseconds and its default limit. Intervals are distinct, and
    /// distinct from the first window's.
    pub(crate) windows: Vec<(u64, u64)>,
    /// Per-key limits of further windows: key, then interval, then limit.
    pub(crate) rules: HashMap<K, BTreeMap<u64, u64>>,
    /// Route rules of further windows (`SlidingWindowLayer::route_rule_per`):
    /// route, then interval, then the limit every key of the route gets.
    pub(crate) routes: HashMap<String, BTreeMap<u64, u64>>,
}

impl<K> Default for LimitPer<K> {
    fn default() -> Self {
        LimitPer {
            windows: Vec::new(),
            rules: HashMap::new(),
            routes: HashMap::new(),
        }
    }
}

impl<K> LimitPer<K> {
    /// The index of the further window of `interval_ms`.
    pub(crate) fn index_of(&self, interval_ms: u64) -> Option<usize> {
        self.windows.iter().position(|&(ms, _)| ms == interval_ms)
    }
}

/// Per-key limits of the further windows, one slot per window (`None`: the
/// window's default).
pub(crate) type KeyLimits = Box<[Option<u64>]>;

/// One route's rules in the further windows.
struct RouteWindows {
    limits: KeyLimits,
    /// The entry keys of the route share when a full table has no room for
    /// them and the route has no first-window rule (which has its own, see
    /// `Routes`), made on the first such request: a flood that fills the
    /// table never lifts a client onto the windows' defaults.
    overflow: OnceLock<Arc<Entry>>,
}

impl RouteWindows {
    fn new(limits: KeyLimits) -> Self {
        RouteWindows {
            limits,
            overflow: OnceLock::new(),
        }
    }
}

/// The further windows' limits in a built table.
pub(crate) struct WindowLimits<K> {
    /// Every further window's shape; empty without `limit_per`.
    shapes: Box<[WindowShape]>,
    /// Each window's default limit now. Written only with `per_key`'s write
    /// lock held (a rules document), so that a reader holding its read lock
    /// sees defaults and per-key limits of one document.
    defaults: Box<[AtomicU64]>,
    /// The defaults the layer was built with: a rules document without a
    /// window's default goes back to it.
    built_defaults: Box<[u64]>,
    /// Per-key limits. Apart from the entries, so they survive eviction.
    per_key: RwLock<HashMap<K, KeyLimits>>,
    /// Route rules: one slot per window (`None`: no rule in that window)
    /// for every key of the route, found by one hash lookup of a key's
    /// route part; nothing is kept per client. Lock order: `per_key`, then
    /// this one; it is written alone or with `per_key`'s write lock held.
    per_route: RwLock<HashMap<Box<str>, RouteWindows>>,
    /// Entries of `per_route`, so that a key of a layer without route rules
    /// in further windows skips its lock. Written under `per_route`'s write
    /// lock, read Relaxed on its own: a key built while the first rule is
    /// being added either sees it, or is visited by the walk the caller
    /// makes after the write (see `Registry::set_route_window_limit`).
    route_count: AtomicUsize,
    strict: bool,
}

impl<K: Clone + Eq + Hash> WindowLimits<K> {
    /// From the settings: each window gets `sample_count` buckets (the
    /// first window's count; the builder checked that it divides each
    /// interval).
    pub(crate) fn new(settings: &LimitPer<K>, sample_count: usize, strict: bool) -> Self {
        let shapes = settings
            .windows
            .iter()
            .map(|&(interval_ms, _)| WindowShape {
                sample_count,
                interval_ms,
            })
            .collect();
        let per_key = settings
            .rules
            .iter()
            .map(|(key, limits)| (key.clone(), key_limits(&settings.windows, limits)))
            .collect();
        let per_route: HashMap<Box<str>, RouteWindows> = settings
            .routes
            .iter()
            .map(|(route, limits)| {
                (
                    Box::from(route.as_str()),
                    RouteWindows::new(key_limits(&settings.windows, limits)),
                )
            })
            .collect();
        WindowLimits {
            route_count: AtomicUsize::new(per_route.len()),
            per_route: RwLock::new(per_route),
            shapes,
            defaults: settings
                .windows
                .iter()
                .map(|&(_, limit)| AtomicU64::new(limit))
                .collect(),
            built_defaults: settings.windows.iter().map(|&(_, limit)| limit).collect(),
            per_key: RwLock::new(per_key),
            strict,
        }
    }

    /// Whether the layer has further windows.
    #[inline]
    pub(crate) fn any(&self) -> bool {
        !self.shapes.is_empty()
    }

    /// Number of further windows.
    pub(crate) fn len(&self) -> usize {
        self.shapes.len()
    }

    /// The index of the further window of `interval_ms`.
    pub(crate) fn index_of(&self, interval_ms: u64) -> Option<usize> {
        self.shapes
            .iter()
            .position(|s| s.interval_ms == interval_ms)
    }

    /// Window `i`'s default limit now.
    pub(crate) fn default_of(&self, i: usize) -> u64 {
        self.defaults[i].load(Ordering::Relaxed)
    }

    /// Whether `key` has a limit of its own in any further window.
    pub(crate) fn has_own<Q>(&self, key: &Q) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.any() && read(&self.per_key).contains_key(key)
    }

    /// Whether any route rule of a further window exists (a sole Relaxed
    /// load).
    #[inline]
    pub(crate) fn routes_active(&self) -> bool {
        self.route_count.load(Ordering::Relaxed) != 0
    }

    /// The limit in window `i` of a key with own limits `own` and route
    /// rules `by_route`: its own, else its route's, else the default.
    #[inline]
    fn pick(&self, own: Option<&KeyLimits>, by_route: Option<&KeyLimits>, i: usize) -> u64 {
        own.and_then(|limits| limits[i])
            .or_else(|| by_route.and_then(|limits| limits[i]))
            .unwrap_or_else(|| self.default_of(i))
    }

    /// Calls `f` with the route rules of `route` (`None`: no rule, or no
    /// route part): one hash lookup under the read lock, skipped while
    /// there is no route rule.
    fn with_route<T>(&self, route: Option<&str>, f: impl FnOnce(Option<&KeyLimits>) -> T) -> T {
        match route {
            Some(route) if self.routes_active() => {
                f(read(&self.per_route).get(route).map(|rule| &rule.limits))
            }
            _ => f(None),
        }
    }

    /// The limit of `key` (of route `route`) in each further window, into
    /// `out` (one slot a window): its own, else its route's, else the
    /// window's default. What a compact key, which keeps no limits of its
    /// own windows, is decided under on every request.
    pub(crate) fn fill_limits(&self, key: Option<&K>, route: Option<&str>, out: &mut [u64]) {
        let per_key = read(&self.per_key);
        let own = key.and_then(|key| per_key.get(key));
        self.with_route(route, |by_route| {
            for (i, limit) in out.iter_mut().enumerate() {
                *limit = self.pick(own, by_route, i);
            }
        });
    }

    /// The further windows of a new entry for `key` (`None` for none) of
    /// route `route`: each with the key's own limit, else its route's,
    /// else the window's default.
    pub(crate) fn build(&self, key: Option<&K>, route: Option<&str>) -> Option<ExtraWindows> {
        if !self.any() {
            return None;
        }
        let per_key = read(&self.per_key);
        let own = key.and_then(|key| per_key.get(key));
        let windows = self.with_route(route, |by_route| {
            ExtraWindows::new(&self.shapes, self.strict, |i| self.pick(own, by_route, i))
        });
        Some(windows.expect("the further windows were validated when the layer was built"))
    }

    /// Brings `windows` (the entry of `key` of route `route`, `None` for
    /// the overflow entry) to the limits now in force.
    pub(crate) fn refresh(&self, key: Option<&K>, route: Option<&str>, windows: &ExtraWindows) {
        let per_key = read(&self.per_key);
        let own = key.and_then(|key| per_key.get(key));
        self.with_route(route, |by_route| {
            for (i, window) in windows.iter().enumerate() {
                window.set_limit(self.pick(own, by_route, i));
            }
        });
    }

    /// Sets `route`'s rule in window `i` (`None`: removes it). Returns
    /// whether the route had a rule there. The caller then brings the
    /// route's live entries up to date ([`refresh`](Self::refresh)).
    pub(crate) fn set_route(&self, route: &str, i: usize, limit: Option<u64>) -> bool {
        let mut per_route = write(&self.per_route);
        let had = per_route
            .get(route)
            .is_some_and(|rule| rule.limits[i].is_some());
        match per_route.get_mut(route) {
            Some(rule) => {
                rule.limits[i] = limit;
                if rule.limits.iter().all(Option::is_none) {
                    per_route.remove(route);
                }
            }
            None => {
                if limit.is_some() {
                    let mut slots = vec![None; self.shapes.len()].into_boxed_slice();
                    slots[i] = limit;
                    per_route.insert(Box::from(route), RouteWindows::new(slots));
                }
            }
        }
        self.route_count.store(per_route.len(), Ordering::Relaxed);
        had
    }

    /// Every route rule of window `i`, as (route, limit), in no particular
    /// order.
    pub(crate) fn route_rules_of(&self, i: usize) -> Vec<(String, u64)> {
        read(&self.per_route)
            .iter()
            .filter_map(|(route, rule)| rule.limits[i].map(|limit| (route.to_string(), limit)))
            .collect()
    }

    /// The overflow entry of `route` when it has a rule in a further
    /// window, made with `make` (given the route's further windows) on the
    /// route's first overflow; `None` when it has none.
    pub(crate) fn route_overflow(
        &self,
        route: &str,
        make: impl FnOnce(ExtraWindows) -> Entry,
    ) -> Option<Arc<Entry>> {
        if !self.routes_active() {
            return None;
        }
        let per_route = read(&self.per_route);
        let rule = per_route.get(route)?;
        let entry = rule.overflow.get_or_init(|| {
            let windows = ExtraWindows::new(&self.shapes, self.strict, |i| {
                self.pick(None, Some(&rule.limits), i)
            })
            .expect("the further windows were validated when the layer was built");
            Arc::new(make(windows))
        });
        Some(Arc::clone(entry))
    }

    /// Calls `f` with every route overflow entry made so far and its route
    /// (under the route rules' read lock: `f` must not take this table's
    /// locks, nor a key table's).
    pub(crate) fn for_each_route_overflow(&self, mut f: impl FnMut(&str, &Entry)) {
        for (route, rule) in read(&self.per_route).iter() {
            if let Some(entry) = rule.overflow.get() {
                f(route, entry);
            }
        }
    }

    /// Brings every route overflow entry's further windows to the limits
    /// now in force.
    pub(crate) fn refresh_route_overflows(&self) {
        for rule in read(&self.per_route).values() {
            if let Some(windows) = rule.overflow.get().and_then(|entry| entry.windows()) {
                for (i, window) in windows.iter().enumerate() {
                    window.set_limit(self.pick(None, Some(&rule.limits), i));
                }
            }
        }
    }

    /// Sets `key`'s own limit in window `i` (`None`: back to the default).
    /// Returns whether the key still has a limit of its own in any further
    /// window. The caller then brings the key's live entry up to date
    /// ([`refresh`](Self::refresh)) under its shard's lock.
    pub(crate) fn set(&self, key: &K, i: usize, limit: Option<u64>) -> bool {
        let mut per_key = write(&self.per_key);
        let slots = per_key
            .entry(key.clone())
            .or_insert_with(|| vec![None; self.shapes.len()].into_boxed_slice());
        slots[i] = limit;
        if slots.iter().all(Option::is_none) {
            per_key.remove(key);
            return false;
        }
        true
    }

    /// Replaces every default (`None` in `defaults`: the one the layer was
    /// built with), every per-key limit and every route rule; returns
    /// nothing, as the caller then walks the table with
    /// [`refresh`](Self::refresh).
    pub(crate) fn replace(
        &self,
        defaults: &[Option<u64>],
        per_key: HashMap<K, KeyLimits>,
        per_route: HashMap<String, KeyLimits>,
    ) {
        let mut table = write(&self.per_key);
        {
            // Routes in both keep their overflow entry (brought to the new
            // limits by the caller); the others' go.
            let mut routes = write(&self.per_route);
            let mut old = std::mem::take(&mut *routes);
            for (route, limits) in per_route {
                let rule = match old.remove_entry(route.as_str()) {
                    Some((_, mut rule)) => {
                        rule.limits = limits;
                        rule
                    }
                    None => RouteWindows::new(limits),
                };
                routes.insert(route.into_boxed_str(), rule);
            }
            self.route_count.store(routes.len(), Ordering::Relaxed);
        }
        for (i, default) in self.defaults.iter().enumerate() {
            let value = defaults
                .get(i)
                .copied()
                .flatten()
                .unwrap_or(self.built_defaults[i]);
            default.store(value, Ordering::Relaxed);
        }
        *table = per_key;
    }

    /// `key`'s own limit in window `i`, if it has one.
    pub(crate) fn own_limit(&self, key: &K, i: usize) -> Option<u64> {
        read(&self.per_key).get(key).and_then(|limits| limits[i])
    }

    /// Each further window's interval and the limit `key` has in it now
    /// (its own, or the default).
    pub(crate) fn limits_of<Q>(&self, key: Option<&Q>) -> Vec<(u64, u64)>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let per_key = read(&self.per_key);
        let own = key.and_then(|key| per_key.get(key));
        self.shapes
            .iter()
            .enumerate()
            .map(|(i, shape)| {
                let limit = own
                    .and_then(|limits| limits[i])
                    .unwrap_or_else(|| self.default_of(i));
                (shape.interval_ms, limit)
            })
            .collect()
    }
}

/// A key's limits by interval as one slot per further window.
fn key_limits(windows: &[(u64, u64)], limits: &BTreeMap<u64, u64>) -> KeyLimits {
    windows
        .iter()
        .map(|(interval_ms, _)| limits.get(interval_ms).copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: u64 = 60_000;
    const HOUR: u64 = 3_600_000;

    fn limits_of(windows: &ExtraWindows) -> Vec<u64> {
        windows.iter().map(|w| w.limit()).collect()
    }

    /// A minute (default 100) and an hour (default 1 000); `"own"` has its
    /// own hour limit, and `POST /login` a rule in both windows.
    fn table() -> WindowLimits<String> {
        let mut settings = LimitPer::<String> {
            windows: vec![(MINUTE, 100), (HOUR, 1_000)],
            ..LimitPer::default()
        };
        settings
            .rules
            .insert("own".to_owned(), BTreeMap::from([(HOUR, 7)]));
        settings.routes.insert(
            "POST /login".to_owned(),
            BTreeMap::from([(MINUTE, 5), (HOUR, 20)]),
        );
        WindowLimits::new(&settings, 10, false)
    }

    #[test]
    fn each_window_takes_the_keys_own_limit_then_its_routes_then_the_default() {
        let table = table();
        let own = "own".to_owned();
        let other = "other".to_owned();
        let login = Some("POST /login");
        let built = |key: &String, route| limits_of(&table.build(Some(key), route).unwrap());
        assert_eq!(built(&own, login), [5, 7]);
        assert_eq!(built(&other, login), [5, 20]);
        assert_eq!(built(&other, Some("GET /")), [100, 1_000]);
        assert_eq!(built(&other, None), [100, 1_000]);
        assert_eq!(limits_of(&table.build(None, login).unwrap()), [5, 20]);
    }

    #[test]
    fn a_route_without_a_rule_in_any_window_is_gone_and_lookups_stop() {
        let table = table();
        assert!(table.routes_active());
        assert!(table.set_route("POST /login", 0, None));
        assert_eq!(table.route_rules_of(0), []);
        assert_eq!(table.route_rules_of(1), [("POST /login".to_owned(), 20)]);
        assert!(table.routes_active());
        assert!(table.set_route("POST /login", 1, None));
        assert!(!table.set_route("POST /login", 1, None));
        assert!(!table.routes_active());
        let windows = table.build(None, Some("POST /login")).unwrap();
        assert_eq!(limits_of(&windows), [100, 1_000]);
        // Set again, then a live entry is brought to it.
        assert!(!table.set_route("POST /login", 0, Some(u64::MAX)));
        table.refresh(None, Some("POST /login"), &windows);
        assert_eq!(limits_of(&windows), [u64::MAX, 1_000]);
    }
}
