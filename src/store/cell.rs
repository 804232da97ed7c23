//! The limiter state of one layer: settings until the first use, then the
//! key table built from them.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, OnceLock};

use super::compact::CompactKeys;
use super::routes::RouteOf;
use super::windows::LimitPer;
use super::Registry;
use crate::clock::SharedClock;
use crate::flow::breaker::Breaker;
use crate::flow::Behaviours;
use crate::sync::{read, write, RwLock};
use crate::system::SystemRule;

/// Default `max_keys`: see `SlidingWindowLayer::max_keys`.
pub(crate) const DEFAULT_MAX_KEYS: usize = 4096;

/// Default `max_keys` of a compact layer: see `SlidingWindowLayer::compact`.
pub(crate) const COMPACT_DEFAULT_MAX_KEYS: usize = 1 << 20;

/// Shape of every key's second window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) sample_count: usize,
    pub(crate) interval_ms: u64,
    /// Admission also counts the bucket that has just left the window
    /// (`SlidingWindowLayer::strict`).
    pub(crate) strict: bool,
    /// The flow behaviours every key runs besides the window.
    pub(crate) behaviours: Behaviours,
}

impl Window {
    /// Length of one bucket, in milliseconds.
    pub(crate) fn bucket_ms(&self) -> u64 {
        self.interval_ms / self.sample_count as u64
    }
}

impl Default for Window {
    /// 10 buckets of 100 ms over one second.
    fn default() -> Self {
        Window {
            sample_count: 10,
            interval_ms: 1000,
            strict: false,
            behaviours: Behaviours::default(),
        }
    }
}

/// What the key table is built from. Every field was validated by the
/// builder method that set it.
#[derive(Debug, Clone)]
pub(crate) struct Settings<K> {
    pub(crate) default_limit: u64,
    /// The overflow entry's limit; `None`: the default limit.
    pub(crate) overflow_limit: Option<u64>,
    pub(crate) window: Window,
    pub(crate) clock: SharedClock,
    pub(crate) max_keys: usize,
    /// `max_keys` was given (not the default): `compact` keeps it.
    pub(crate) max_keys_given: bool,
    pub(crate) rules: HashMap<K, u64>,
    /// Every key's circuit breakers are built from these, in this order
    /// (`SlidingWindowLayer::breaker`).
    pub(crate) breakers: Vec<Breaker>,
    /// Keys keep only what admission needs, in a compact table
    /// (`SlidingWindowLayer::compact`).
    pub(crate) compact: bool,
    /// The layer's adaptive protection (`SlidingWindowLayer::system`).
    pub(crate) system: Option<SystemRule>,
    /// Per-route limits that every key of the route gets separately
    /// (`SlidingWindowLayer::route_rule`).
    pub(crate) route_rules: HashMap<String, u64>,
    /// The route part of a key, for a key type that has one (set with the
    /// first route rule).
    pub(crate) route_of: Option<RouteOf<K>>,
    /// Every key's further windows (`SlidingWindowLayer::limit_per`).
    pub(crate) limit_per: LimitPer<K>,
}

impl<K> Settings<K> {
    pub(crate) fn new(default_limit: u64) -> Self {
        Settings {
            default_limit,
            overflow_limit: None,
            window: Window::default(),
            clock: SharedClock::system(),
            max_keys: DEFAULT_MAX_KEYS,
            max_keys_given: false,
            rules: HashMap::new(),
            breakers: Vec::new(),
            compact: false,
            system: None,
            route_rules: HashMap::new(),
            route_of: None,
            limit_per: LimitPer::default(),
        }
    }

    /// The same settings for another key type. A rule carries over when the
    /// key types are the same; otherwise it could not name any key of the
    /// new type, and is left out.
    pub(crate) fn rekey<L: Eq + Hash + 'static>(self) -> Settings<L>
    where
        K: 'static,
    {
        let given = self.rules.len();
        let rules: HashMap<L, u64> = self
            .rules
            .into_iter()
            .filter_map(|(key, limit)| {
                let key: Box<dyn Any> = Box::new(key);
                key.downcast::<L>().ok().map(|key| (*key, limit))
            })
            .collect();
        if rules.len() < given {
            tracing::warn!(
                dropped = given - rules.len(),
                "SlidingWindowLayer::key: rules given before `key` name keys of the previous \
                 key type and are dropped; give rules after `key`"
            );
        }
        // Route rules name routes of a pair key: they carry over when the
        // new key type has the same route part (the same key type).
        let route_of: Option<RouteOf<L>> = self.route_of.and_then(|route_of| {
            let route_of: Box<dyn Any> = Box::new(route_of);
            route_of.downcast::<RouteOf<L>>().ok().map(|f| *f)
        });
        let route_rules = if route_of.is_some() {
            self.route_rules
        } else {
            if !self.route_rules.is_empty() {
                tracing::warn!(
                    dropped = self.route_rules.len(),
                    "SlidingWindowLayer::key: route rules given before `key` name routes of the \
                     previous key type and are dropped; give route rules after `key`"
                );
            }
            HashMap::new()
        };
        let mut limit_per = rekey_limit_per(self.limit_per);
        if route_of.is_none() && !limit_per.routes.is_empty() {
            tracing::warn!(
                dropped = limit_per.routes.len(),
                "SlidingWindowLayer::key: route rules of further windows (`route_rule_per`) given \
                 before `key` name routes of the previous key type and are dropped; give them \
                 after `key`"
            );
            limit_per.routes.clear();
        }
        Settings {
            default_limit: self.default_limit,
            overflow_limit: self.overflow_limit,
            window: self.window,
            clock: self.clock,
            max_keys: self.max_keys,
            max_keys_given: self.max_keys_given,
            rules,
            breakers: self.breakers,
            compact: self.compact,
            system: self.system,
            route_rules,
            route_of,
            limit_per,
        }
    }
}

/// The further windows for another key type: the windows carry over, and
/// their per-key limits as rules do (see `Settings::rekey`).
fn rekey_limit_per<K: 'static, L: Eq + Hash + 'static>(limit_per: LimitPer<K>) -> LimitPer<L> {
    let given = limit_per.rules.len();
    let rules: HashMap<L, _> = limit_per
        .rules
        .into_iter()
        .filter_map(|(key, limits)| {
            let key: Box<dyn Any> = Box::new(key);
            key.downcast::<L>().ok().map(|key| (*key, limits))
        })
        .collect();
    if rules.len() < given {
        tracing::warn!(
            dropped = given - rules.len(),
            "SlidingWindowLayer::key: per-window rules (`rule_per`) given before `key` name keys \
             of the previous key type and are dropped; give them after `key`"
        );
    }
    LimitPer {
        windows: limit_per.windows,
        rules,
        routes: limit_per.routes,
    }
}

/// One limiter's state: its settings until something needs the key table,
/// then the table, built once from them.
///
/// A layer value owns its `Store` until it is first used. Cloning the layer
/// shares the `Store`, and a builder method on a layer whose `Store` is
/// shared (by a clone, a service or a handle) or already built changes a
/// copy of the settings in a new `Store` for that layer value alone: a
/// setter on one value never reaches another. The table is built when the
/// layer makes a service or a handle, and shared from then on by every
/// clone that still holds this `Store`.
pub(crate) struct Store<K> {
    /// Written only through `configure` on a `Store` no one else holds, and
    /// read when the table is built; the lock makes both safe without
    /// relying on that.
    settings: RwLock<Settings<K>>,
    built: OnceLock<Built<K>>,
}

/// What a store builds from its settings.
struct Built<K> {
    /// The full key table. A compact layer's holds no key: its window and
    /// clock are the layer's, and its overflow warnings are the layer's.
    registry: Arc<Registry<K>>,
    /// The compact table, for a compact layer.
    compact: Option<Arc<CompactKeys<K>>>,
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> Store<K> {
    pub(crate) fn new(settings: Settings<K>) -> Self {
        Store {
            settings: RwLock::new(settings),
            built: OnceLock::new(),
        }
    }

    /// The key table, built from the settings on first use.
    pub(crate) fn registry(&self) -> &Arc<Registry<K>> {
        &self.built().registry
    }

    /// The compact table, if the layer is compact (built on first use, as
    /// the registry).
    pub(crate) fn compact(&self) -> Option<&Arc<CompactKeys<K>>> {
        self.built().compact.as_ref()
    }

    fn built(&self) -> &Built<K> {
        self.built.get_or_init(|| {
            let settings = read(&self.settings);
            let registry = Arc::new(Registry::new(&settings));
            Built {
                compact: settings
                    .compact
                    .then(|| Arc::new(CompactKeys::new(&settings, Arc::clone(registry.routes())))),
                registry,
            }
        })
    }

    /// Applies `change` to the settings: in place when `store` is this
    /// layer value's alone and not built yet, else to a copy in a new
    /// store, which is returned.
    pub(crate) fn configure(
        mut store: Arc<Self>,
        change: impl FnOnce(&mut Settings<K>),
    ) -> Arc<Self> {
        if let Some(own) = Arc::get_mut(&mut store) {
            if own.built.get().is_none() {
                change(&mut write(&own.settings));
                return store;
            }
        }
        let mut copy = store.settings();
        change(&mut copy);
        Arc::new(Store::new(copy))
    }

    /// A copy of the settings, for a store of another key type.
    pub(crate) fn settings(&self) -> Settings<K> {
        read(&self.settings).clone()
    }
}

impl<K> fmt::Debug for Store<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("Store");
        match self.built.get() {
            // Once built, the table is the truth: limits set at run time
            // count, and the settings' rules are only where it started.
            Some(Built {
                compact: Some(compact),
                ..
            }) => out.field("compact", compact),
            Some(built) => out.field("registry", &built.registry),
            None => {
                let settings = read(&self.settings);
                out.field("default_limit", &settings.default_limit)
                    .field("overflow_limit", &settings.overflow_limit)
                    .field("window", &settings.window)
                    .field("max_keys", &settings.max_keys)
                    .field("rules", &settings.rules.len())
                    .field("breakers", &settings.breakers)
                    .field("compact", &settings.compact)
                    .field("built", &false)
            }
        };
        out.finish()
    }
}
