use std::collections::HashMap;
use std::hash::Hash;

use crate::clock::SharedClock;
use crate::http::response::ResponseConfig;
use crate::registry::{Registry, Window};

/// Default `max_keys`: see [`SlidingWindowLayer::max_keys`](crate::SlidingWindowLayer::max_keys).
pub(crate) const DEFAULT_MAX_KEYS: usize = 4096;

/// Everything a layer is configured with.
#[derive(Debug, Clone)]
pub(crate) struct Settings<K> {
    pub(crate) default_limit: u64,
    pub(crate) window: Window,
    pub(crate) clock: SharedClock,
    pub(crate) max_keys: usize,
    pub(crate) rules: HashMap<K, u64>,
    pub(crate) response: ResponseConfig,
}

impl<K> Settings<K> {
    pub(crate) fn new(default_limit: u64) -> Self {
        Settings {
            default_limit,
            window: Window {
                sample_count: 10,
                interval_ms: 1000,
            },
            clock: SharedClock::system(),
            max_keys: DEFAULT_MAX_KEYS,
            rules: HashMap::new(),
            response: ResponseConfig::default(),
        }
    }
}

/// The state shared by a layer, its clones, every service it makes and every
/// handle: one per layer, built when the layer is configured, never in
/// `Layer::layer`.
pub(crate) struct Shared<K> {
    pub(crate) settings: Settings<K>,
    pub(crate) registry: Registry<K>,
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> Shared<K> {
    pub(crate) fn new(settings: Settings<K>) -> Self {
        let registry = Registry::new(
            settings.window,
            settings.clock.clone(),
            settings.default_limit,
            settings.max_keys,
            settings.rules.clone(),
        );
        Shared { settings, registry }
    }
}

impl<K> std::fmt::Debug for Shared<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("default_limit", &self.settings.default_limit)
            .field("window", &self.settings.window)
            .field("max_keys", &self.settings.max_keys)
            .field("rules", &self.settings.rules.len())
            .finish_non_exhaustive()
    }
}
