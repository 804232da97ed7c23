//! The further windows of every key (`SlidingWindowLayer::limit_per`):
//! their settings until the table is built, then their default and per-key
//! limits in the table.
//!
//! Kept apart from the first window's limits (`Registry::limits`), which
//! keep their behaviour: `rule`, `set_limit` and a rules document's
//! `default` and `limits` name the first window only.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use crate::stat::{ExtraWindows, WindowShape};
use crate::sync::{read, write, AtomicU64, Ordering, RwLock};

/// The further windows as the builder sets them.
#[derive(Debug, Clone)]
pub(crate) struct LimitPer<K> {
    /// Every further window, in the order given: its interval in
    /// milliseconds and its default limit. Intervals are distinct, and
    /// distinct from the first window's.
    pub(crate) windows: Vec<(u64, u64)>,
    /// Per-key limits of further windows: key, then interval, then limit.
    pub(crate) rules: HashMap<K, BTreeMap<u64, u64>>,
}

impl<K> Default for LimitPer<K> {
    fn default() -> Self {
        LimitPer {
            windows: Vec::new(),
            rules: HashMap::new(),
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
        WindowLimits {
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

    /// The further windows of a new entry for `key` (`None` for none):
    /// each with the key's own limit, or the window's default.
    pub(crate) fn build(&self, key: Option<&K>) -> Option<ExtraWindows> {
        if !self.any() {
            return None;
        }
        let per_key = read(&self.per_key);
        let own = key.and_then(|key| per_key.get(key));
        let windows = ExtraWindows::new(&self.shapes, self.strict, |i| {
            own.and_then(|limits| limits[i])
                .unwrap_or_else(|| self.default_of(i))
        })
        .expect("the further windows were validated when the layer was built");
        Some(windows)
    }

    /// Brings `windows` (the entry of `key`, `None` for the overflow entry)
    /// to the limits now in force.
    pub(crate) fn refresh(&self, key: Option<&K>, windows: &ExtraWindows) {
        let per_key = read(&self.per_key);
        self.refresh_locked(&per_key, key, windows);
    }

    fn refresh_locked(
        &self,
        per_key: &HashMap<K, KeyLimits>,
        key: Option<&K>,
        windows: &ExtraWindows,
    ) {
        let own = key.and_then(|key| per_key.get(key));
        for (i, window) in windows.iter().enumerate() {
            let limit = own
                .and_then(|limits| limits[i])
                .unwrap_or_else(|| self.default_of(i));
            window.set_limit(limit);
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
    /// built with) and every per-key limit; returns nothing, as the caller
    /// then walks the table with [`refresh`](Self::refresh).
    pub(crate) fn replace(&self, defaults: &[Option<u64>], per_key: HashMap<K, KeyLimits>) {
        let mut table = write(&self.per_key);
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
