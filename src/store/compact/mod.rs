//! The compact key tier (`SlidingWindowLayer::compact`): a fixed-capacity
//! table whose keys keep only what admission needs, their window's passes
//! and blocks ([`CompactWindow`]).
//!
//! - `CompactTable` (`table.rs`): the table, generic over what a slot holds.
//! - `CompactKeys`: the table of one layer, with its window's shape: what
//!   the service admits on and the handle reads.

mod table;

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;

pub(crate) use table::{CompactTable, Place, SlotValue};

use super::registry::{Borrowed, Owned, PendingKey};
use super::{Settings, Window};
use crate::key::KeyVisitor;
use crate::stat::compact::{CompactShape, CompactWindow, COMPACT_MAX_LIMIT};

impl SlotValue for CompactWindow {
    fn empty() -> Self {
        CompactWindow::new()
    }
}

/// One compact layer's keys: the table and the shape of every key's window.
pub(crate) struct CompactKeys<K> {
    table: CompactTable<K, CompactWindow>,
    shape: CompactShape,
}

impl<K> fmt::Debug for CompactKeys<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompactKeys")
            .field("table", &self.table)
            .field("shape", &self.shape)
            .finish()
    }
}

/// The shape of a compact key's window.
pub(crate) fn shape_of(window: &Window) -> CompactShape {
    CompactShape {
        sample_count: window.sample_count,
        interval_ms: window.interval_ms,
        strict: window.strict,
    }
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> CompactKeys<K> {
    /// The table the settings describe (validated by the builder: limits at
    /// most [`COMPACT_MAX_LIMIT`], at most `COMPACT_MAX_BUCKETS` buckets).
    pub(crate) fn new(settings: &Settings<K>) -> Self {
        let default_limit = settings.default_limit;
        CompactKeys {
            table: CompactTable::new(
                settings.max_keys,
                default_limit,
                settings.overflow_limit.unwrap_or(default_limit),
                &settings.rules,
            ),
            shape: shape_of(&settings.window),
        }
    }

    pub(crate) fn table(&self) -> &CompactTable<K, CompactWindow> {
        &self.table
    }

    /// Calls `f` with the place of `key` at `now` (inserting the key if it
    /// is new; see [`CompactTable::with`]).
    #[inline]
    fn with<P: PendingKey<K>, R>(
        &self,
        key: P,
        now: u64,
        f: impl FnOnce(Place<'_, CompactWindow>, &CompactShape) -> R,
    ) -> R
    where
        K: Borrow<P::Q>,
    {
        let shape = &self.shape;
        self.table
            .with(key, |window| window.is_idle(shape, now), |place| f(place, shape))
    }

    /// Gives `key` its own limit. A limit above [`COMPACT_MAX_LIMIT`] is
    /// taken as that maximum (a compact window counts at most that many
    /// passes), with a `warn` event saying so.
    pub(crate) fn set_limit(&self, key: K, limit: u64, now: u64) {
        let limit = if limit > COMPACT_MAX_LIMIT {
            tracing::warn!(
                limit,
                max = COMPACT_MAX_LIMIT,
                "StatsHandle::set_limit: a compact layer counts at most {COMPACT_MAX_LIMIT} \
                 passes per window; the key's limit is set to that maximum"
            );
            COMPACT_MAX_LIMIT
        } else {
            limit
        };
        let shape = &self.shape;
        self.table
            .set_limit(key, limit, |window| window.is_idle(shape, now));
    }

    /// Removes `key`'s own limit; whether it had one.
    pub(crate) fn remove_limit<Q>(&self, key: &Q, now: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let shape = &self.shape;
        self.table
            .remove_limit(key, |window| window.is_idle(shape, now))
    }

    /// Lifetime (passes, blocks) of every key but the overflow's.
    #[cfg(feature = "prometheus")]
    pub(crate) fn keys_lifetime(&self) -> (u64, u64) {
        self.table.keys_totals()
    }

    /// Whether the overflow value has nothing in its window at `now`.
    pub(crate) fn overflow_idle(&self, now: u64) -> bool {
        self.table.overflow_place().value.is_idle(&self.shape, now)
    }

    /// (pass, block) in `place`'s window at `now` (or at its newest bucket,
    /// if later).
    pub(crate) fn counts(&self, window: &CompactWindow, now: u64) -> (u64, u64) {
        let at = window.effective_now(&self.shape, now);
        window.window_counts(&self.shape, at)
    }
}

/// Looks a request's key up in a compact layer's keys and runs `decide` on
/// its place: the visitor an extractor hands its key to.
pub(crate) struct CompactLookup<'a, K, F> {
    pub(crate) keys: &'a CompactKeys<K>,
    /// The request's clock reading.
    pub(crate) now: u64,
    pub(crate) decide: F,
}

impl<K, F, R> KeyVisitor<K> for CompactLookup<'_, K, F>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    F: FnOnce(Place<'_, CompactWindow>, &CompactShape) -> R,
{
    type Output = R;

    #[inline]
    fn owned(self, key: K) -> R {
        self.keys.with(Owned(key), self.now, self.decide)
    }

    #[inline]
    fn borrowed<Q>(self, key: &Q, to_owned: fn(&Q) -> K) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.keys
            .with(Borrowed(key, to_owned), self.now, self.decide)
    }
}
