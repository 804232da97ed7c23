//! The compact key tier (`SlidingWindowLayer::compact`): a fixed-capacity
//! table whose keys keep only what admission needs, their window's passes
//! and blocks ([`CompactWindow`]).
//!
//! - `CompactTable` (`table.rs`): the table, generic over what a slot holds.
//! - `CompactKeys`: the table of one layer, with its window's shape: what
//!   the service admits on and the handle reads.

mod form;
mod hash;
mod slots;
mod table;

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

pub(crate) use slots::SlotValue;
pub(crate) use table::{CompactTable, Place, TextLookup, Totals};

use form::atomic_addr;

use super::registry::{Borrowed, ByRef, Owned, PendingKey};
use super::{RouteLimit, Routes, Settings, Window};
use crate::key::{KeyVisitor, TextKey};
use crate::stat::{CompactShape, CompactWindow, COMPACT_MAX_LIMIT};

/// A compact window is sealed by its own rotation lock: every decision
/// on a sealed window fails its swap or waits (see `CompactWindow::seal`).
impl SlotValue for CompactWindow {
    fn empty() -> Self {
        CompactWindow::new()
    }

    fn seal_if(&self, idle: impl Fn(&Self) -> bool) -> bool {
        CompactWindow::seal_if(self, idle)
    }

    fn seal(&self) {
        CompactWindow::seal(self);
    }

    fn seal_vacant(&self) {
        CompactWindow::seal_vacant(self);
    }

    fn reset(&self) {
        self.clear();
    }

    fn copy_sealed(&self) -> Self {
        let copy = CompactWindow::new();
        copy.copy_from(self);
        copy
    }

    fn restore(&self, from: &Self) {
        self.copy_from(from);
    }
}

/// One compact layer's keys: the table and the shape of every key's window.
pub(crate) struct CompactKeys<K> {
    table: CompactTable<K, CompactWindow>,
    shape: CompactShape,
    /// The shapes of the further windows (`limit_per`), in the layer's
    /// order: as many buckets as the first window, and its `strict`. Their
    /// limits are the registry's (`Registry::windows`), read on each
    /// request of a key with them, so `set_limit_per`, `remove_limit_per`
    /// and a rules document's `windows` section apply to compact keys as
    /// to full ones.
    further_shapes: Box<[CompactShape]>,
    /// The layer's route rules (shared with its full table). A slot keeps
    /// no limit, so a key's route rule is read on each of its requests
    /// while any exists (see [`routed`]).
    routes: Arc<Routes<K>>,
    /// The default limit the layer was built with: a rules document
    /// without a default goes back to it.
    built_default: u64,
    /// The overflow value runs on the default limit (no `overflow_limit`
    /// was given) and follows it when a document changes it.
    overflow_on_default: bool,
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
    CompactShape::new(window.sample_count, window.interval_ms, window.strict)
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> CompactKeys<K> {
    /// The table the settings describe (validated by the builder: limits at
    /// most [`COMPACT_MAX_LIMIT`], at most `COMPACT_MAX_BUCKETS` buckets).
    pub(crate) fn new(settings: &Settings<K>, routes: Arc<Routes<K>>) -> Self {
        let default_limit = settings.default_limit;
        // A key type of zero bytes (the global key) has one key: one group.
        let max_keys = if std::mem::size_of::<K>() == 0 {
            1
        } else {
            settings.max_keys
        };
        let shape = shape_of(&settings.window);
        let further_shapes: Box<[CompactShape]> = settings
            .limit_per
            .windows
            .iter()
            .map(|&(interval_ms, _)| {
                CompactShape::new(shape.sample_count, interval_ms, shape.strict)
            })
            .collect();
        CompactKeys {
            table: CompactTable::new(
                max_keys,
                default_limit,
                settings.overflow_limit.unwrap_or(default_limit),
                &settings.rules,
                further_shapes.len(),
            ),
            shape,
            further_shapes,
            routes,
            built_default: default_limit,
            overflow_on_default: settings.overflow_limit.is_none(),
        }
    }

    /// The place `key` is counted in, with its route's rule applied (see
    /// [`routed`]).
    #[inline]
    pub(crate) fn routed<'a>(
        &self,
        key: &K,
        place: Place<'a, CompactWindow>,
    ) -> Place<'a, CompactWindow> {
        routed(place, self.routes.lookup(key))
    }

    /// A limit as a compact window counts it: above [`COMPACT_MAX_LIMIT`],
    /// that maximum, with a `warn` event (as [`set_limit`](Self::set_limit)
    /// takes it).
    pub(crate) fn clamp_limit(limit: u64) -> u64 {
        if limit > COMPACT_MAX_LIMIT {
            tracing::warn!(
                limit,
                max = COMPACT_MAX_LIMIT,
                "StatsHandle: a compact layer counts at most {COMPACT_MAX_LIMIT} passes per \
                 window; a route's limit or a rules document's limit is set to that maximum"
            );
            return COMPACT_MAX_LIMIT;
        }
        limit
    }

    pub(crate) fn table(&self) -> &CompactTable<K, CompactWindow> {
        &self.table
    }

    /// The shapes of the further windows (`limit_per`); empty without them.
    #[inline]
    pub(crate) fn further_shapes(&self) -> &[CompactShape] {
        &self.further_shapes
    }

    /// Whether a key's windows (its first and `further`) hold nothing that
    /// can count at `now`: a key may be evicted only when every window of
    /// it is idle.
    fn idle(&self, now: u64) -> impl Fn(&CompactWindow, &[CompactWindow]) -> bool + '_ {
        move |window, further| {
            if further.is_empty() {
                return window.is_idle(&self.shape, now);
            }
            let at = self.anchor(window, further, now);
            window.is_idle(&self.shape, at)
                && further
                    .iter()
                    .zip(self.further_shapes.iter())
                    .all(|(window, shape)| window.is_idle(shape, at))
        }
    }

    /// The time the windows of a key (its first `window` and `further`)
    /// are read at for a clock reading `now` (see `flow::anchor`): the
    /// first window's effective time, its further windows moved with it
    /// when a clock step back re-anchors it.
    pub(crate) fn anchor(
        &self,
        window: &CompactWindow,
        further: &[CompactWindow],
        now: u64,
    ) -> u64 {
        let shapes = &self.further_shapes;
        crate::flow::anchor(
            window,
            &self.shape,
            further.len().min(shapes.len()),
            &|i| crate::flow::CompactFurther {
                window: &further[i],
                shape: &shapes[i],
                limit: 0,
            },
            now,
        )
    }

    /// Calls `f` with the place of `key` at `now` (inserting the key if it
    /// is new; see [`CompactTable::with`]).
    #[inline]
    fn with<P: PendingKey<K>, R>(
        &self,
        key: P,
        now: u64,
        f: impl FnOnce(Place<'_, CompactWindow>, &CompactShape, Option<&K>) -> R,
    ) -> R
    where
        K: Borrow<P::Q>,
    {
        let shape = &self.shape;
        let idle = self.idle(now);
        if self.routes.active() {
            // The key's route rule is read from the key as the table holds
            // it (a key sent to the overflow window is made owned for it:
            // the cold path of a full table).
            return self.table.with_keyed(key, idle, true, |place, key| {
                let route = key.and_then(|key| self.routes.lookup(key));
                f(routed(place, route), shape, key)
            });
        }
        if !self.further_shapes.is_empty() {
            // The key's own and route limits in further windows are read
            // from the key as the table holds it (a key sent to the
            // overflow window is made owned for it: the cold path of a full
            // table), the overflow window never above its defaults.
            return self
                .table
                .with_keyed(key, idle, true, |place, key| f(place, shape, key));
        }
        self.table.with(key, idle, |place| f(place, shape, None))
    }

    /// [`with`](Self::with) for an owned key, out of line: the lookup of a
    /// layer with route rules, further windows or keys with their own
    /// limits is larger than all of a plain lookup's pass at once (about
    /// 8 KiB of code for an address key), and inlined into the service's
    /// `call` it was laid out among that pass's instructions, spreading
    /// them over twice as much code (see `docs/performance.md`, "the
    /// service's code in the instruction cache"). A request that takes it
    /// pays one call more.
    ///
    /// Not `with` itself made out of line: the service's caller (tower's
    /// `MapFuture`, boxing our future) then copied the future once more,
    /// 368 bytes a request (`perf/counts/layer.rs`, 60 instructions).
    #[inline(never)]
    fn with_general<R>(
        &self,
        key: K,
        now: u64,
        f: impl FnOnce(Place<'_, CompactWindow>, &CompactShape, Option<&K>) -> R,
    ) -> R {
        self.with(Owned(key), now, f)
    }

    /// Whether a request's key can take the plain lookup
    /// ([`with_owned`](Self::with_owned), [`with_text`](Self::with_text):
    /// the slots searched for the key as the request has it, nothing else
    /// read): with no route rule, no further window and no key with its
    /// own limit. Otherwise the lookup reads the key as the table holds it
    /// or looks in the side map, as [`with`](Self::with) does.
    #[inline]
    fn plain_lookup(&self) -> bool {
        !self.routes.active() && self.further_shapes.is_empty() && !self.table.has_own()
    }

    /// [`with`](Self::with) for an owned key (see
    /// [`CompactTable::with_owned`]); for a layer where
    /// [`plain_lookup`](Self::plain_lookup) holds.
    ///
    /// Cold and out of line, as [`with_text`](Self::with_text): the
    /// locked lookup, taken when a pass at once is not
    /// ([`pass_unlocked`](Self::pass_unlocked): a refusal, a key not yet
    /// in the table, a layer that answers a pass with RateLimit fields),
    /// with its insert and eviction paths. Inlined, they were laid out
    /// among the instructions of a pass at once in the service's `call`;
    /// out of line, the single-thread bench's compact contender by
    /// address ran 2% to 18% faster in three code layouts
    /// (`docs/performance.md`, "the locked lookups made cold"). A request
    /// that takes it pays one call more.
    #[cold]
    #[inline(never)]
    fn with_owned<R>(
        &self,
        key: K,
        hash: u64,
        now: u64,
        f: impl FnOnce(Place<'_, CompactWindow>, &CompactShape, Option<&K>) -> R,
    ) -> R {
        let shape = &self.shape;
        self.table
            .with_hashed(key, hash, self.idle(now), |place| f(place, shape, None))
    }

    /// One pass at once for `key`, recorded without its group's lock (see
    /// [`CompactTable::pass_unlocked`]): the totals of the key's group, or
    /// `None`, having recorded nothing for the key, when the request is to
    /// be decided by [`with_owned`](Self::with_owned). For a layer where
    /// [`plain_lookup`](Self::plain_lookup) holds.
    #[inline(always)]
    fn pass_unlocked(&self, key: &K, hash: u64, now: u64) -> Option<&Totals> {
        let shape = &self.shape;
        self.table.pass_unlocked(key, hash, |window, limit| {
            window.pass_now(shape, now, limit)
        })
    }

    /// [`with`](Self::with) for the key `Some(text)` (`lookup`, its
    /// [`CompactTable::text_lookup`]), the text lent (see
    /// [`CompactTable::with_text`]); for a layer where
    /// [`plain_lookup`](Self::plain_lookup) holds. Cold and out of line,
    /// as [`with_owned`](Self::with_owned).
    #[cold]
    #[inline(never)]
    fn with_text<R>(
        &self,
        lookup: &TextLookup<'_>,
        now: u64,
        f: impl FnOnce(Place<'_, CompactWindow>, &CompactShape, Option<&K>) -> R,
    ) -> R
    where
        K: TextKey,
    {
        let shape = &self.shape;
        self.table
            .with_text(lookup, K::some_owned, self.idle(now), |place| {
                f(place, shape, None)
            })
    }

    /// [`pass_unlocked`](Self::pass_unlocked) for the key `Some(text)`
    /// (`lookup`, its [`CompactTable::text_lookup`]; see
    /// [`CompactTable::pass_text_unlocked`]).
    #[inline(always)]
    fn pass_text_unlocked(&self, lookup: &TextLookup<'_>, now: u64) -> Option<&Totals> {
        let shape = &self.shape;
        self.table
            .pass_text_unlocked(lookup, |window, limit| window.pass_now(shape, now, limit))
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
        self.table.set_limit(key, limit, self.idle(now));
    }

    /// Applies a rules document's default (`None`: the layer's own) and
    /// per-key limits; limits above [`COMPACT_MAX_LIMIT`] are taken as
    /// that maximum, with a `warn` event, as [`set_limit`](Self::set_limit)
    /// takes them.
    pub(crate) fn apply_rules(&self, default: Option<u64>, limits: HashMap<K, u64>, now: u64) {
        let clamp = |limit: u64| Self::clamp_limit(limit);
        let default = clamp(default.unwrap_or(self.built_default));
        let overflow = self.overflow_on_default.then_some(default);
        let limits = limits
            .into_iter()
            .map(|(key, limit)| (key, clamp(limit)))
            .collect();
        self.table.apply(default, overflow, limits, self.idle(now));
    }

    /// Removes `key`'s own limit; whether it had one.
    pub(crate) fn remove_limit<Q>(&self, key: &Q, now: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.table.remove_limit(key, self.idle(now))
    }

    /// Lifetime (passes, blocks) of every key but the overflow's.
    #[cfg(feature = "prometheus")]
    pub(crate) fn keys_lifetime(&self) -> (u64, u64) {
        self.table.keys_totals()
    }

    /// Whether the overflow value has nothing in its windows at `now`.
    pub(crate) fn overflow_idle(&self, now: u64) -> bool {
        let place = self.table.overflow_place();
        self.idle(now)(place.value, place.further)
    }

    /// (pass, block) in `place`'s window at `now` (or at its newest bucket,
    /// if later; its further windows moved with it, see
    /// [`anchor`](Self::anchor)).
    pub(crate) fn counts(&self, place: &Place<'_, CompactWindow>, now: u64) -> (u64, u64) {
        let at = self.anchor(place.value, place.further, now);
        place.value.window_counts(&self.shape, at)
    }
}

/// Looks a request's key up in a compact layer's keys and runs `decide` on
/// its place: the visitor an extractor hands its key to.
pub(crate) struct CompactLookup<'a, K, F, P> {
    pub(crate) keys: &'a CompactKeys<K>,
    /// The request's clock reading.
    pub(crate) now: u64,
    pub(crate) decide: F,
    /// The answer to a pass at once, given the totals it counts in, for a
    /// layer that answers such a pass with nothing more (no RateLimit
    /// fields): an address key, or a header key's text of up to 64
    /// bytes, may then pass without its group's lock
    /// ([`CompactTable::pass_unlocked`],
    /// [`CompactTable::pass_text_unlocked`]). `None`: every request goes
    /// to `decide`.
    pub(crate) passed: Option<P>,
}

impl<K, F, P, R> KeyVisitor<K> for CompactLookup<'_, K, F, P>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
    F: FnOnce(Place<'_, CompactWindow>, &CompactShape, Option<&K>) -> R,
    P: FnOnce(&Totals) -> R,
{
    type Output = R;

    #[inline]
    fn owned(self, key: K) -> R {
        let CompactLookup {
            keys,
            now,
            decide,
            passed,
        } = self;
        if keys.plain_lookup() {
            // Hashed once, for both lookups.
            let hash = keys.table.hash_owned(&key);
            // Of owned keys, only address keys are looked up without the
            // lock (a constant of the build: other key types compile to
            // the locked lookup alone). A header key's text is, when it is
            // lent (`some_text`); an owned one (absent, or made of escaped
            // bytes or a digest) takes the locked lookup.
            if let Some(passed) = passed.filter(|_| atomic_addr::<K>()) {
                if let Some(totals) = keys.pass_unlocked(&key, hash, now) {
                    return passed(totals);
                }
            }
            return keys.with_owned(key, hash, now, decide);
        }
        keys.with_general(key, now, decide)
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

    /// The key itself, lent: a slot holding it in another form (a header
    /// key's text in atomics) compares with it as it is, making nothing.
    #[inline]
    fn referenced(self, key: &K) -> R {
        self.keys.with(ByRef(key), self.now, self.decide)
    }

    /// A header key's text, lent: compared as it is with the texts the
    /// slots hold, with no copy, and passed without the group's lock when
    /// it can be (see [`CompactKeys::with_text`] and
    /// [`CompactKeys::pass_text_unlocked`]).
    #[inline]
    fn some_text(self, text: &str) -> R
    where
        K: TextKey,
    {
        if !self.keys.plain_lookup() {
            return K::visit_copied(text, self);
        }
        let CompactLookup {
            keys,
            now,
            decide,
            passed,
        } = self;
        // Hashed and made into its probe once, for both lookups.
        let lookup = keys.table.text_lookup(text);
        if let Some(passed) = passed {
            if let Some(totals) = keys.pass_text_unlocked(&lookup, now) {
                return passed(totals);
            }
        }
        keys.with_text(&lookup, now, decide)
    }
}

/// `place` under its key's route rule `route`: a key with its own limit
/// keeps it (an exact rule wins); a key in a slot runs on the route's
/// limit and policy; a key sent to the overflow window runs on the smaller
/// of the overflow limit and the route's, so that filling the table never
/// lifts a client of the route past its route's limit.
#[inline]
pub(crate) fn routed<'a>(
    place: Place<'a, CompactWindow>,
    route: Option<RouteLimit>,
) -> Place<'a, CompactWindow> {
    match route {
        None => place,
        Some(_) if place.tag.is_some() => place,
        Some(route) if place.overflow => Place {
            limit: place.limit.min(route.limit),
            ..place
        },
        Some(route) => Place {
            limit: route.limit,
            tag: Some(route.tag as u32),
            ..place
        },
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::form::{AtomicAddr, AtomicText, Plain};
    use super::slots::{block_bytes, slot_bytes, Shared};
    use super::table::{group_bytes, groups_for, GROUP};
    use super::*;

    /// The figures `SlidingWindowLayer::compact` documents: bytes of a slot
    /// with an address key and with a string key, of a group's header and
    /// block of slots, and the whole table of the default 2^20 keys with
    /// address keys.
    #[test]
    fn the_documented_sizes() {
        assert_eq!(std::mem::size_of::<CompactWindow>(), 28);
        // `Option<IpAddr>` keys, in atomics: the state word and the
        // address's four words take what the key and its padding took.
        assert_eq!(slot_bytes::<AtomicAddr, CompactWindow>(), 48);
        assert_eq!(
            slot_bytes::<Option<Plain<Option<IpAddr>>>, CompactWindow>(),
            48
        );
        assert_eq!(block_bytes::<AtomicAddr, CompactWindow>(), GROUP * 48);
        // `Option<String>` keys (`HeaderKey`'s): up to 64 bytes of text in
        // the slot's words, and a group's longer texts beside its slots
        // (24 bytes a group until its first long key).
        assert_eq!(slot_bytes::<AtomicText, CompactWindow>(), 96);
        let text_block = block_bytes::<AtomicText, CompactWindow>();
        assert_eq!(text_block, GROUP * 96 + 24);
        // One cache line: lock, tags and totals.
        let header = group_bytes::<Shared<AtomicAddr, CompactWindow>>();
        assert_eq!(header, 64);
        assert_eq!(group_bytes::<Shared<AtomicText, CompactWindow>>(), 64);
        let groups = groups_for(crate::store::COMPACT_DEFAULT_MAX_KEYS);
        assert_eq!(groups, 74_899);
        // Slots (in chunks of 64 blocks: one allocation a chunk), group
        // headers, and each group's 4-byte block index.
        let bytes = groups * (GROUP * 48 + header + 4);
        let per_key = bytes as f64 / crate::store::COMPACT_DEFAULT_MAX_KEYS as f64;
        assert!(per_key < 64.0, "{per_key} bytes per key");
        // Keys of other types keep their block behind the lock, allocated
        // on its own (16 bytes of the allocator's header).
        let strings =
            groups * (GROUP * slot_bytes::<Option<Plain<String>>, CompactWindow>() + header + 16);
        let texts = groups * (text_block + header + 4);
        let text_per_key = texts as f64 / crate::store::COMPACT_DEFAULT_MAX_KEYS as f64;
        assert!(text_per_key < 128.0, "{text_per_key} bytes per key");
        println!(
            "{header} B per group header ({} B for the default table's), {bytes} B in all with \
             address keys ({per_key:.1} B per key), {texts} B with header keys of up to 64 bytes \
             ({text_per_key:.1} B per key), {strings} B with `String` keys and their text apart",
            groups * header,
        );
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use std::collections::HashMap;

    use loom::sync::Arc;
    use loom::thread;

    use super::*;
    use crate::flow::Decision;

    const SHAPE: CompactShape = CompactShape::new(2, 2, false);

    /// A request's decision on its place at `now`, as the layer makes it:
    /// whether it passed, and whether on the overflow window.
    fn admitted(place: Place<'_, CompactWindow>, now: u64) -> (bool, bool) {
        let (_, _, decision) = place.value.admit(&SHAPE, now, place.limit, place.overflow);
        (matches!(decision, Decision::Pass(_)), place.overflow)
    }

    /// A request of `key` at `now` through the table and the key's compact
    /// window, by the locked lookup.
    fn request(table: &CompactTable<u64, CompactWindow>, key: u64, now: u64) -> (bool, bool) {
        table.with(
            Owned(key),
            |window, _| window.is_idle(&SHAPE, now),
            |place| admitted(place, now),
        )
    }

    /// A request as the layer under test makes it: `request(table, key,
    /// now)`, whether it passed and whether on the overflow window.
    type Request<K> = fn(&CompactTable<K, CompactWindow>, K, u64) -> (bool, bool);

    /// A table of `max_keys` keys, limit `limit` (`overflow` on the
    /// overflow window), where `key` has passed once at 0 by `request`.
    fn passed_once<K>(
        max_keys: usize,
        limit: u64,
        overflow: u64,
        key: K,
        request: Request<K>,
    ) -> Arc<CompactTable<K, CompactWindow>>
    where
        K: Eq + Hash + Clone + Send + Sync + 'static,
    {
        let table = Arc::new(CompactTable::new(
            max_keys,
            limit,
            overflow,
            &HashMap::new(),
            0,
        ));
        assert_eq!(request(&table, key, 0), (true, false));
        table
    }

    /// The passes in `key`'s window at `now`, if the key has a place.
    fn passes<K>(table: &CompactTable<K, CompactWindow>, key: &K, now: u64) -> Option<u64>
    where
        K: Eq + Hash + Clone + Send + Sync + 'static,
    {
        table.get(key, |p| p.value.window_counts(&SHAPE, now).0)
    }

    /// The answers of `request` for `keys[0]` and `keys[1]` at `now`, made
    /// on two threads at once, in that order.
    fn racing<K>(
        table: &Arc<CompactTable<K, CompactWindow>>,
        keys: [K; 2],
        request: Request<K>,
        now: u64,
    ) -> Vec<(bool, bool)>
    where
        K: Eq + Hash + Clone + Send + Sync + 'static,
    {
        let threads: Vec<_> = keys
            .into_iter()
            .map(|key| {
                let table = Arc::clone(table);
                thread::spawn(move || request(&table, key, now))
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    /// Key 1 passed at 0 (a window of two 1 ms buckets: idle from 2 on; a
    /// limit of 2 in the slot, 1 on the overflow window). At 2, a request
    /// of key 1 races key 2, which needs the table's only slot and may
    /// evict key 1 only while it is idle. One passes in the slot under its
    /// own key, the other on the overflow window; no pass is lost or
    /// counted as the other key's. `key(n)` is key `n`; `request` makes a
    /// request as the layer under test does.
    ///
    /// The slot's limit leaves room for a second pass: a pass of key 1
    /// without the lock that lands on key 2's window (begun before the
    /// eviction, recorded after key 2's first pass) must then be found
    /// out by the key's version and decided again, on the overflow
    /// window; it stays counted on key 2's window (stricter for key 2,
    /// never looser), which therefore holds one or two passes.
    fn admission_racing_an_insert<K>(key: fn(u8) -> K, request: Request<K>)
    where
        K: Eq + Hash + Clone + Send + Sync + 'static,
    {
        loom::model(move || {
            let table = passed_once(1, 2, 1, key(1), request);
            let answers = racing(&table, [key(1), key(2)], request, 2);
            assert!(answers.iter().all(|(passed, _)| *passed), "{answers:?}");
            assert_eq!(answers.iter().filter(|(_, o)| *o).count(), 1, "{answers:?}");
            let in_slot = if answers[0].1 { 2 } else { 1 };
            let held = passes(&table, &key(in_slot), 2);
            if in_slot == 1 {
                assert_eq!(held, Some(1));
            } else {
                assert!(matches!(held, Some(1 | 2)), "{held:?}");
            }
            assert_eq!(passes(&table, &key(3 - in_slot), 2), None);
            assert_eq!(table.overflow_place().value.window_counts(&SHAPE, 2).0, 1);
        });
    }

    /// [`admission_racing_an_insert`], key 1 rotating its window under the
    /// group's read lock.
    #[test]
    fn a_compact_window_admission_racing_an_insert() {
        admission_racing_an_insert(u64::from, request);
    }

    type AddrTable = CompactTable<Option<std::net::IpAddr>, CompactWindow>;

    fn addr(n: u8) -> Option<std::net::IpAddr> {
        Some(std::net::Ipv4Addr::new(10, 0, 0, n).into())
    }

    /// A request of an address key as the layer makes it for a layer with
    /// no RateLimit fields on passes: a pass at once without the group's
    /// lock if it can, else the locked lookup.
    fn addr_request(table: &AddrTable, key: Option<std::net::IpAddr>, now: u64) -> (bool, bool) {
        let hash = table.hash_owned(&key);
        let pass = |window: &CompactWindow, limit| window.pass_now(&SHAPE, now, limit);
        if table.pass_unlocked(&key, hash, pass).is_some() {
            return (true, false);
        }
        table.with_hashed(
            key,
            hash,
            |window, _| window.is_idle(&SHAPE, now),
            |place| admitted(place, now),
        )
    }

    /// [`admission_racing_an_insert`] with address keys: the request of key
    /// 1 passes without the group's lock (rotating its window) while key
    /// 2's insert may evict key 1 only while it is idle, sealing its window
    /// with the judgement.
    #[test]
    fn a_pass_without_the_lock_racing_an_eviction() {
        admission_racing_an_insert(addr, addr_request);
    }

    /// Two requests of one key at one clock reading, both free to pass
    /// without the lock, against a limit of 2 with one pass already
    /// counted: exactly one passes. `key` and `request` as for
    /// [`admission_racing_an_insert`].
    fn passes_without_the_lock_stopping_at_the_limit<K>(key: fn(u8) -> K, request: Request<K>)
    where
        K: Eq + Hash + Clone + Send + Sync + 'static,
    {
        loom::model(move || {
            let table = passed_once(16, 2, 2, key(1), request);
            let answers = racing(&table, [key(1), key(1)], request, 0);
            let passed = answers.iter().filter(|(passed, _)| *passed).count();
            assert_eq!(passed, 1, "{answers:?}");
            assert_eq!(passes(&table, &key(1), 0), Some(2));
        });
    }

    #[test]
    fn passes_without_the_lock_stop_at_the_limit() {
        passes_without_the_lock_stopping_at_the_limit(addr, addr_request);
    }

    type TextTable = CompactTable<Option<String>, CompactWindow>;

    /// Text key `n`: key 2 longer than a cell holds (kept in its group's
    /// spilled texts, and never looked up without the lock).
    fn text(n: u8) -> Option<String> {
        if n == 2 {
            return Some(format!("client-{}", "2".repeat(80)));
        }
        Some(format!("client-{n}"))
    }

    /// A request of a text key as the layer makes it for a layer with no
    /// RateLimit fields on passes: a pass at once without the group's lock
    /// if it can, else the locked lookup.
    fn text_request(table: &TextTable, key: Option<String>, now: u64) -> (bool, bool) {
        let text = key.as_deref().expect("a text key");
        let lookup = table.text_lookup(text);
        let pass = |window: &CompactWindow, limit| window.pass_now(&SHAPE, now, limit);
        if table.pass_text_unlocked(&lookup, pass).is_some() {
            return (true, false);
        }
        table.with_text(
            &lookup,
            |text| Some(text.to_owned()),
            |window, _| window.is_idle(&SHAPE, now),
            |place| admitted(place, now),
        )
    }

    /// [`admission_racing_an_insert`] with text keys: the request of key
    /// 1 passes without the group's lock while key 2, a long key, may
    /// evict it only while it is idle, its text spilled beside the slots
    /// under the seal.
    #[test]
    fn a_text_pass_without_the_lock_racing_a_long_keys_eviction() {
        admission_racing_an_insert(text, text_request);
    }

    #[test]
    fn text_passes_without_the_lock_stop_at_the_limit() {
        passes_without_the_lock_stopping_at_the_limit(text, text_request);
    }

    /// A request of key 1, free to pass without the lock, while the key is
    /// given a limit of its own (its window moves to the side map): the
    /// request passes once and is counted once, whether its pass landed
    /// before the move (and moved with the window) or after it. `key` and
    /// `request` as for [`admission_racing_an_insert`].
    fn pass_racing_a_limit_of_its_own<K>(key: fn(u8) -> K, request: Request<K>)
    where
        K: Eq + Hash + Clone + Send + Sync + 'static,
    {
        loom::model(move || {
            let table = passed_once(16, 3, 3, key(1), request);
            let passing = {
                let table = Arc::clone(&table);
                thread::spawn(move || request(&table, key(1), 0))
            };
            let limit = {
                let table = Arc::clone(&table);
                thread::spawn(move || table.set_limit(key(1), 5, |w, _| w.is_idle(&SHAPE, 0)))
            };
            limit.join().unwrap();
            assert_eq!(passing.join().unwrap(), (true, false));
            assert_eq!(passes(&table, &key(1), 0), Some(2));
            assert_eq!(table.get(&key(1), |p| p.limit), Some(5));
        });
    }

    #[test]
    fn a_pass_without_the_lock_racing_a_limit_of_its_own() {
        pass_racing_a_limit_of_its_own(addr, addr_request);
    }

    #[test]
    fn a_text_pass_without_the_lock_racing_a_limit_of_its_own() {
        pass_racing_a_limit_of_its_own(text, text_request);
    }

    /// Text key `n` as [`text`], key 2 as short as key 1: an eviction
    /// rewrites the words a lookup without the lock compares, under a
    /// state of the same length.
    fn short_text(n: u8) -> Option<String> {
        Some(format!("client-{n}"))
    }

    /// [`admission_racing_an_insert`] with text keys of one length: the
    /// request of key 1 passes without the group's lock while key 2's
    /// insert may evict it only while it is idle, rewriting the slot's
    /// words (a lookup may read a mix of both keys' words, and must not
    /// count a pass as key 1's on key 2's window).
    #[test]
    fn a_text_pass_without_the_lock_racing_a_short_keys_eviction() {
        admission_racing_an_insert(short_text, text_request);
    }
}
