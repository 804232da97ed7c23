//! Route rules: a limit named by the route part of a key, which every key
//! of that route gets separately (one count per client), unless the key has
//! a rule of its own.
//!
//! - The rules are a map from the route text to its limit, so finding a new
//!   key's rule is one hash lookup of its route part (borrowed from the
//!   key: no allocation), whatever the number of rules or keys. Nothing is
//!   kept per key: a flood of distinct clients on one route costs the keys
//!   themselves and nothing here.
//! - Which part of a key is its route is a function of the key type
//!   (`RouteOf`), set by the builder or the handle method that gives the
//!   first rule: only pair keys `(C, String)` have one.
//! - A full key table reads a key's route rule when it creates the key's
//!   entry, and the rule's changes are written to the live entries of the
//!   route (one pass over the table, on the operator's call, never on a
//!   request). A compact table, whose slots keep no limit, reads the rule
//!   on every request of a key while any route rule exists (one read lock
//!   and one hash lookup of the route part of the key the table holds;
//!   none while there is no route rule).
//! - Lock order: the rules' lock is taken last, with a key table's locks
//!   held (a shard's and the limits' in a full table, a group's in a
//!   compact one) or alone; it is written only alone, so a writer never
//!   waits for a lock while holding it.
//! - Keys of a route that find no room in a full table share the route's
//!   own overflow entry, limited by the route's limit, created on the
//!   route's first overflow: a flood that fills the table never lifts a
//!   client onto the looser default overflow limit.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, OnceLock};

use super::Entry;
use crate::sync::{read, write, AtomicUsize, Ordering, RwLock};

/// The route part of a key.
pub(crate) type RouteOf<K> = for<'a> fn(&'a K) -> &'a str;

/// One route's rule.
struct Route {
    limit: u64,
    /// Names the route's policy in RateLimit fields: a keyed hash of the
    /// route (every key of the route runs on the same policy).
    tag: u64,
    /// The entry that keys of this route share when a full table has no
    /// room for them, made on the first such request.
    overflow: OnceLock<Arc<Entry>>,
}

/// A route rule as a key sees it: its limit and policy tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RouteLimit {
    pub(crate) limit: u64,
    pub(crate) tag: u64,
}

/// The route rules of one layer, shared by its full and compact tables.
pub(crate) struct Routes<K> {
    route_of: OnceLock<RouteOf<K>>,
    rules: RwLock<HashMap<Box<str>, Route>>,
    /// Entries of `rules`, so that a lookup skips the lock while there are
    /// none. Written under `rules`' write lock, read Relaxed on its own: a
    /// request that reads 0 while the first rule is being added is treated
    /// as having started before it (the change is complete when the call
    /// that adds it returns, and a request that starts after reads it).
    count: AtomicUsize,
    hasher: RandomState,
}

impl<K> Routes<K> {
    /// The rules given to the builder (`route_of` is set when there are
    /// any).
    pub(crate) fn new(route_of: Option<RouteOf<K>>, rules: &HashMap<String, u64>) -> Self {
        let hasher = RandomState::new();
        let map: HashMap<Box<str>, Route> = rules
            .iter()
            .map(|(route, &limit)| {
                let tag = hasher.hash_one(route.as_str());
                (Box::from(route.as_str()), Route::new(limit, tag))
            })
            .collect();
        let slot = OnceLock::new();
        if let Some(route_of) = route_of {
            let _ = slot.set(route_of);
        }
        Routes {
            route_of: slot,
            count: AtomicUsize::new(map.len()),
            rules: RwLock::new(map),
            hasher,
        }
    }

    /// Whether any route rule exists (a sole Relaxed load).
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.count.load(Ordering::Relaxed) != 0
    }

    /// The route part of `key`, if route rules can name it.
    #[inline]
    pub(crate) fn route_of<'k>(&self, key: &'k K) -> Option<&'k str> {
        self.route_of.get().map(|route_of| route_of(key))
    }

    /// The rule of `key`'s route, if it has one: one hash lookup of the
    /// route part under the read lock, nothing allocated.
    #[inline]
    pub(crate) fn lookup(&self, key: &K) -> Option<RouteLimit> {
        if !self.active() {
            return None;
        }
        let route = self.route_of(key)?;
        self.lookup_route(route)
    }

    /// The rule of `route`, if it has one.
    pub(crate) fn lookup_route(&self, route: &str) -> Option<RouteLimit> {
        read(&self.rules).get(route).map(|rule| RouteLimit {
            limit: rule.limit,
            tag: rule.tag,
        })
    }

    /// The overflow entry of `key`'s route, made with `make(limit)` on the
    /// route's first overflow; `None` when the route has no rule.
    pub(crate) fn overflow(&self, key: &K, make: impl FnOnce(u64) -> Entry) -> Option<Arc<Entry>> {
        if !self.active() {
            return None;
        }
        let route = self.route_of(key)?;
        let rules = read(&self.rules);
        let rule = rules.get(route)?;
        Some(Arc::clone(
            rule.overflow.get_or_init(|| Arc::new(make(rule.limit))),
        ))
    }

    /// Sets `route`'s limit (the key type's route part is `route_of`);
    /// returns the rule as keys see it. A route that had a rule keeps its
    /// overflow entry, with the new limit (its window as it is).
    pub(crate) fn set(&self, route_of: RouteOf<K>, route: &str, limit: u64) -> RouteLimit {
        let _ = self.route_of.set(route_of);
        let mut rules = write(&self.rules);
        let tag = match rules.get_mut(route) {
            Some(rule) => {
                rule.set_limit(limit);
                rule.tag
            }
            None => {
                let tag = self.hasher.hash_one(route);
                rules.insert(Box::from(route), Route::new(limit, tag));
                tag
            }
        };
        self.count.store(rules.len(), Ordering::Relaxed);
        RouteLimit { limit, tag }
    }

    /// Removes `route`'s rule; whether it had one.
    pub(crate) fn remove(&self, route: &str) -> bool {
        let mut rules = write(&self.rules);
        let had = rules.remove(route).is_some();
        self.count.store(rules.len(), Ordering::Relaxed);
        had
    }

    /// Replaces every rule with `new`. Routes in both keep their overflow
    /// entry (with the new limit); the others' go.
    pub(crate) fn replace(&self, route_of: Option<RouteOf<K>>, new: HashMap<String, u64>) {
        if let Some(route_of) = route_of {
            let _ = self.route_of.set(route_of);
        }
        let mut rules = write(&self.rules);
        let mut old = std::mem::take(&mut *rules);
        for (route, limit) in new {
            let rule = match old.remove_entry(route.as_str()) {
                Some((_, mut rule)) => {
                    rule.set_limit(limit);
                    rule
                }
                None => Route::new(limit, self.hasher.hash_one(route.as_str())),
            };
            rules.insert(route.into_boxed_str(), rule);
        }
        self.count.store(rules.len(), Ordering::Relaxed);
    }

    /// Sets the route part of keys, for a rule that does not go through
    /// [`set`](Self::set) (a further window's route rule).
    pub(crate) fn set_route_of(&self, route_of: RouteOf<K>) {
        let _ = self.route_of.set(route_of);
    }

    /// Calls `f` with every route's overflow entry made so far and its
    /// route (under the rules' read lock: `f` must not take a key table's
    /// lock, nor this one's write lock).
    pub(crate) fn for_each_route_overflow(&self, mut f: impl FnMut(&str, &Entry)) {
        for (route, rule) in read(&self.rules).iter() {
            if let Some(entry) = rule.overflow.get() {
                f(route, entry);
            }
        }
    }

    /// Calls `f` with every route's overflow entry made so far (under the
    /// rules' read lock: `f` must not take a key table's lock).
    pub(crate) fn for_each_overflow(&self, mut f: impl FnMut(&Entry)) {
        for rule in read(&self.rules).values() {
            if let Some(entry) = rule.overflow.get() {
                f(entry);
            }
        }
    }

    /// Every route rule, as (route, limit), in no particular order.
    pub(crate) fn list(&self) -> Vec<(String, u64)> {
        read(&self.rules)
            .iter()
            .map(|(route, rule)| (route.to_string(), rule.limit))
            .collect()
    }

    /// Whether `key`'s route is `route`.
    pub(crate) fn is_route<Q>(&self, key: &K, route: &Q) -> bool
    where
        str: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.route_of(key)
            .is_some_and(|own| <str as Borrow<Q>>::borrow(own) == route)
    }
}

impl Route {
    fn new(limit: u64, tag: u64) -> Self {
        Route {
            limit,
            tag,
            overflow: OnceLock::new(),
        }
    }

    fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
        if let Some(entry) = self.overflow.get() {
            entry.set_limit_only(limit);
        }
    }
}

impl<K> fmt::Debug for Routes<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Routes")
            .field("rules", &self.count.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn second(key: &(u8, String)) -> &str {
        &key.1
    }

    #[test]
    fn a_rule_is_found_by_the_route_part_and_kept_per_route() {
        let routes: Routes<(u8, String)> = Routes::new(None, &HashMap::new());
        assert_eq!(routes.lookup(&(1, "POST /login".to_owned())), None);
        let set = routes.set(second, "POST /login", 5);
        for client in 0..=u8::MAX {
            assert_eq!(
                routes.lookup(&(client, "POST /login".to_owned())),
                Some(set)
            );
        }
        assert_eq!(routes.lookup(&(1, "GET /".to_owned())), None);
        assert_eq!(routes.list(), [("POST /login".to_owned(), 5)]);
        assert!(routes.remove("POST /login"));
        assert!(!routes.active());
        assert_eq!(routes.lookup(&(1, "POST /login".to_owned())), None);
    }

    #[test]
    fn replacing_keeps_tags_of_routes_that_stay() {
        let mut given = HashMap::new();
        given.insert("POST /login".to_owned(), 5);
        given.insert("GET /a".to_owned(), 7);
        let routes: Routes<(u8, String)> = Routes::new(Some(second), &given);
        let before = routes.lookup_route("POST /login").unwrap();
        let mut next = HashMap::new();
        next.insert("POST /login".to_owned(), 9);
        routes.replace(None, next);
        let after = routes.lookup_route("POST /login").unwrap();
        assert_eq!((after.limit, after.tag), (9, before.tag));
        assert_eq!(routes.lookup_route("GET /a"), None);
    }
}
