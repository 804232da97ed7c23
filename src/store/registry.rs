//! The per-key table: bounded, evicting idle keys, with one overflow entry
//! when every slot is busy.
//!
//! - Keys that fit in zero bytes (`()` from [`GlobalKey`](crate::GlobalKey))
//!   can only ever be one key; they skip the table entirely, so the global
//!   limiter's hot path hashes nothing and takes no lock.
//! - Other keys live in a sharded hash table (randomly seeded SipHash, so
//!   client-chosen keys cannot be crafted to collide). A lookup takes one
//!   shard's read lock.
//! - At most `max_keys` keys hold an entry. A new key beyond that first
//!   triggers a sweep that evicts idle keys (nothing in flight or reserved,
//!   no event left in the second window, no breaker open before its open
//!   time is over; a key's minute-window history goes with it); sweeps run
//!   at most once per bucket length, so a
//!   flood of new keys cannot turn every request into a full scan. If no
//!   entry can be freed, the key shares the overflow entry, which is limited
//!   with the default limit: varying the key never gets past the limit and
//!   never grows memory. The overflow entry's policy is named `"overflow"`
//!   in RateLimit fields, and a `warn` event (one per
//!   [`OVERFLOW_WARN_EVERY_MS`] at most) tells the operator the table is
//!   full.
//! - Eviction never drops a key with events newer than the sweep's time:
//!   each entry is judged at the later of the sweep's clock reading and the
//!   start of its own newest bucket, so a sweep whose thread read the clock
//!   and was then preempted cannot evict a key that passed meanwhile (which
//!   would then pass again, past its limit). A sweep whose clock reads a
//!   whole window behind the last sweep (a clock stepped back, or one
//!   reading far ahead before) runs and restarts the schedule from there.
//! - The table holds keys as `Arc<K>`: one allocation when a key is
//!   inserted, none per request. Reads for the handle copy the `Arc`s of one
//!   shard under its read lock and look at keys and statistics after
//!   releasing it, so a read never holds a lock that a request needs for
//!   longer than it takes to copy pointers.
//! - Keys with their own limit (a rule or `set_limit`) are never sent to the
//!   overflow entry, so a flood of other keys cannot dilute a strict rule.
//!   They do not count against `max_keys`; their number is bounded by the
//!   rules the operator sets. Their limits live apart from the statistics
//!   and survive eviction.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::{Arc, OnceLock};

use hashbrown::HashTable;

use super::{Entry, RouteLimit, RouteOf, Routes, Settings, TopBlocked, Window, WindowLimits};
use crate::clock::SharedClock;
use crate::flow::breaker::Breaker;
use crate::key::KeyVisitor;
use crate::rules::Status;
use crate::stat::{Counts, MetricBucket, RtSlot};
use crate::sync::{fence, read, write, AtomicU64, AtomicUsize, Ordering, RwLock};
use crate::system::System;

/// At most one overflow warning per this many milliseconds of the clock.
pub(crate) const OVERFLOW_WARN_EVERY_MS: u64 = 60_000;

/// Number of table shards. A power of two comfortably above the core count
/// of the machines this runs on keeps writers (new keys, sweeps) from
/// blocking most readers.
const SHARDS: usize = 16;

/// One shard of the key table.
type Shard<K> = RwLock<HashTable<(Arc<K>, Arc<Entry>)>>;

/// A key on its way into the table: looked up by reference, made owned only
/// when a new entry is inserted.
pub(crate) trait PendingKey<K> {
    /// The form the key is looked up in.
    type Q: Hash + Eq + ?Sized;
    fn key(&self) -> &Self::Q;
    fn into_owned(self) -> K;
    /// The key itself when it is at hand (owned), for a table that compares
    /// it in another form than the lookup form; `None` for a borrowed one.
    #[inline]
    fn as_key(&self) -> Option<&K> {
        None
    }
}

/// An owned key.
pub(crate) struct Owned<K>(pub(crate) K);

impl<K: Hash + Eq> PendingKey<K> for Owned<K> {
    type Q = K;
    fn key(&self) -> &K {
        &self.0
    }
    fn into_owned(self) -> K {
        self.0
    }
    #[inline]
    fn as_key(&self) -> Option<&K> {
        Some(&self.0)
    }
}

/// A borrowed form of a key and how to make the key from it.
pub(crate) struct Borrowed<'a, Q: ?Sized, K>(pub(crate) &'a Q, pub(crate) fn(&Q) -> K);

impl<Q: Hash + Eq + ?Sized, K> PendingKey<K> for Borrowed<'_, Q, K> {
    type Q = Q;
    fn key(&self) -> &Q {
        self.0
    }
    fn into_owned(self) -> K {
        (self.1)(self.0)
    }
}

/// A key lent by reference: compared as the key itself, and cloned only
/// if the table keeps it (see `KeyVisitor::referenced`).
pub(crate) struct ByRef<'a, K>(pub(crate) &'a K);

impl<K: Clone + Hash + Eq> PendingKey<K> for ByRef<'_, K> {
    type Q = K;
    fn key(&self) -> &K {
        self.0
    }
    fn into_owned(self) -> K {
        self.0.clone()
    }
    #[inline]
    fn as_key(&self) -> Option<&K> {
        Some(self.0)
    }
}

/// Looks a request's key up in a [`Registry`]: the visitor an extractor
/// hands its key to (see `KeyExtractor::visit`).
pub(crate) struct Lookup<'a, K> {
    pub(crate) registry: &'a Registry<K>,
    /// The request's clock reading.
    pub(crate) now: u64,
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> KeyVisitor<K> for Lookup<'_, K> {
    type Output = Arc<Entry>;

    #[inline]
    fn owned(self, key: K) -> Arc<Entry> {
        self.registry.entry(key, self.now)
    }

    #[inline]
    fn borrowed<Q>(self, key: &Q, to_owned: fn(&Q) -> K) -> Arc<Entry>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.registry.entry_borrowed(key, to_owned, self.now)
    }
}

/// The time `entry` is read, decided and judged idle at (see
/// `StatisticNode::effective_now`).
#[inline]
pub(crate) fn effective_now(entry: &Entry, now: u64) -> u64 {
    entry.node.effective_now(now)
}

pub(crate) struct Registry<K> {
    shards: Box<[Shard<K>]>,
    hasher: RandomState,
    /// The one entry of a zero-sized key type.
    single: OnceLock<(Arc<K>, Arc<Entry>)>,
    overflow: Arc<Entry>,
    /// Keys holding an entry that count against `max_keys` (all but pinned).
    counted: AtomicUsize,
    max_keys: usize,
    /// Per-key limits set by rules and `set_limit`. Apart from the entries,
    /// so they survive eviction.
    limits: RwLock<HashMap<K, u64>>,
    /// The limit of keys without their own. Written only with `limits`'
    /// write lock held and read with its read lock held (or for a sole
    /// load), so that a reader sees the rules and the default of the same
    /// document; Relaxed, as the lock orders it.
    default_limit: AtomicU64,
    /// The default the layer was built with: rules without a default go
    /// back to it.
    built_default: u64,
    /// The overflow entry runs on the default limit (no `overflow_limit`
    /// was set), and follows it when rules change it.
    overflow_on_default: bool,
    /// Applied rules documents and the last failed one.
    rules: Status,
    window: Window,
    clock: SharedClock,
    /// Clock time (ms) of the last sweep; sweeps are at most one per bucket.
    last_sweep: AtomicU64,
    /// When the last overflow warning was logged: clock time in ms plus one
    /// (0: never). Relaxed, with a compare-and-swap so that of racing
    /// requests one logs.
    overflow_warned: AtomicU64,
    /// Requests sent to the overflow entry since the last overflow warning
    /// (reported by the next one). Relaxed: a count, read alone.
    overflowed: AtomicU64,
    /// Every entry's circuit breakers are built from these.
    breakers: Arc<[Breaker]>,
    /// The lifetime totals of every evicted entry, summed: added once per
    /// eviction (under the shard's write lock, never on a request's path),
    /// so that exporters' counters summed over keys never lose what an
    /// evicted key had counted.
    evicted: MetricBucket,
    /// The layer's response-time histogram, once an exporter installs it;
    /// every entry holds the slot.
    rt_histogram: RtSlot,
    /// The keys refused most over the last minute (every refusal path
    /// records into it, see [`blocked`](Self::blocked)).
    blocked: TopBlocked<K>,
    /// The layer's system rule, built with the table (its CPU sampler
    /// subscription lives as long as the table); every entry holds it.
    system: Option<Arc<System>>,
    /// Route rules: the limit of every key of a route without a rule of
    /// its own (shared with the compact table of a compact layer). Lock
    /// order: a shard's lock, then `limits`, then the routes' lock.
    routes: Arc<Routes<K>>,
    /// The further windows' limits (`SlidingWindowLayer::limit_per`);
    /// empty without them.
    windows: WindowLimits<K>,
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> Registry<K> {
    pub(crate) fn new(settings: &Settings<K>) -> Self {
        let Settings {
            default_limit,
            overflow_limit,
            window,
            ref clock,
            max_keys,
            ref rules,
            ref breakers,
            compact: _,
            max_keys_given: _,
            ref system,
            ref route_rules,
            route_of,
            ref limit_per,
        } = *settings;
        let windows = WindowLimits::new(limit_per, window.sample_count, window.strict);
        let system = system
            .as_ref()
            .map(|rule| Arc::new(System::new(rule, clock.clone())));
        let breakers: Arc<[Breaker]> = Arc::from(breakers.as_slice());
        let hasher = RandomState::new();
        let rt_histogram = RtSlot::default();
        let overflow = Arc::new(
            Entry::new(
                window,
                clock.clone(),
                overflow_limit.unwrap_or(default_limit),
                None,
                false,
                &breakers,
                &rt_histogram,
                system.as_ref(),
                windows.build(None, None),
            )
            .into_overflow(),
        );
        Registry {
            shards: (0..SHARDS).map(|_| RwLock::new(HashTable::new())).collect(),
            hasher,
            single: OnceLock::new(),
            overflow,
            counted: AtomicUsize::new(0),
            max_keys,
            limits: RwLock::new(rules.clone()),
            default_limit: AtomicU64::new(default_limit),
            built_default: default_limit,
            overflow_on_default: overflow_limit.is_none(),
            rules: Status::default(),
            window,
            clock: clock.clone(),
            last_sweep: AtomicU64::new(0),
            overflow_warned: AtomicU64::new(0),
            overflowed: AtomicU64::new(0),
            breakers,
            evicted: MetricBucket::new(),
            rt_histogram,
            blocked: TopBlocked::new(),
            system,
            routes: Arc::new(Routes::new(route_of, route_rules)),
            windows,
        }
    }

    /// The layer's route rules.
    pub(crate) fn routes(&self) -> &Arc<Routes<K>> {
        &self.routes
    }

    /// The limit and policy tag of `key` when it has no rule of its own:
    /// its route's rule, else the default.
    fn fallback(&self, key: &K) -> (u64, Option<u64>) {
        match self.routes.lookup(key) {
            Some(RouteLimit { limit, tag }) => (limit, Some(tag)),
            None => (self.default_limit.load(Ordering::Relaxed), None),
        }
    }

    /// The layer's system rule, if it has one.
    #[inline]
    pub(crate) fn system(&self) -> Option<&Arc<System>> {
        self.system.as_ref()
    }

    /// The layer's top-blocked summary: a refusal path records the refused
    /// request's key with `blocked().record(key, at)`, or hands the
    /// extractor a `RecordBlocked` visitor, at the refusal's time.
    pub(crate) fn blocked(&self) -> &TopBlocked<K> {
        &self.blocked
    }

    /// The layer's response-time histogram slot.
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    pub(crate) fn rt_histogram(&self) -> &RtSlot {
        &self.rt_histogram
    }

    pub(crate) fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// The shape of every key's window.
    #[inline]
    pub(crate) fn window(&self) -> &Window {
        &self.window
    }

    #[inline]
    fn is_single() -> bool {
        std::mem::size_of::<K>() == 0
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Shard<K> {
        // The high bits pick the shard; the table uses the low ones.
        &self.shards[(hash >> 59) as usize % SHARDS]
    }

    /// The entry a request with `key` is counted under, created if needed.
    #[inline]
    pub(crate) fn entry(&self, key: K, now: u64) -> Arc<Entry> {
        self.entry_for(Owned(key), now)
    }

    /// [`entry`](Self::entry) for a borrowed form of the key: the owned key
    /// is made with `to_owned` only if a new entry is inserted.
    #[inline]
    pub(crate) fn entry_borrowed<Q>(&self, key: &Q, to_owned: fn(&Q) -> K, now: u64) -> Arc<Entry>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.entry_for(Borrowed(key, to_owned), now)
    }

    #[inline]
    fn entry_for<P: PendingKey<K>>(&self, key: P, now: u64) -> Arc<Entry>
    where
        K: Borrow<P::Q>,
    {
        if Self::is_single() {
            if let Some((_, entry)) = self.single.get() {
                return Arc::clone(entry);
            }
            return self.init_single(key);
        }
        // `K: Borrow<Q>` promises that `Q` hashes as `K` does.
        let hash = self.hasher.hash_one(key.key());
        {
            let table = read(self.shard(hash));
            if let Some((_, entry)) = table.find(hash, |(k, _)| (**k).borrow() == key.key()) {
                return Arc::clone(entry);
            }
        }
        self.insert(key, hash, now)
    }

    /// The single key's entry, on the first request (and those racing it).
    #[cold]
    fn init_single<P: PendingKey<K>>(&self, key: P) -> Arc<Entry> {
        let (key, entry) = self.single.get_or_init(|| {
            let key = key.into_owned();
            let hash = self.hasher.hash_one(&key);
            // The single key never counts against `max_keys`.
            self.create(key, hash, true)
        });
        // Read the limit again now that the entry is published:
        // `apply_rules` writes the rules, then looks for the entry. Either
        // it finds it, or it looked before the publication above, so after
        // its write, and this read (with the lock held while the limit is
        // stored, so that an older read cannot land after a newer apply)
        // sees its rules.
        let limits = read(&self.limits);
        match limits.get(&**key) {
            Some(&limit) => entry.set_limit(limit, Some(self.hasher.hash_one(&**key))),
            None => entry.set_limit(self.default_limit.load(Ordering::Relaxed), None),
        }
        if let Some(windows) = entry.windows() {
            // The same for the further windows' limits (see
            // `set_window_limit`).
            // A zero-sized key has no route part.
            self.windows.refresh(Some(key), None, windows);
        }
        Arc::clone(entry)
    }

    /// A new entry for `key`. `pinned`: the entry holds no counted slot of
    /// `max_keys` (decided by the caller, who reserved one or not).
    fn create(&self, key: K, hash: u64, pinned: bool) -> (Arc<K>, Arc<Entry>) {
        // A key's own rule wins over its route's rule, which wins over the
        // default. The route's rule is one hash lookup of the key's route
        // part (see `Routes::lookup`), read with `limits` still locked, in
        // the lock order `set_route_limit` takes.
        let (limit, tag) = {
            let limits = read(&self.limits);
            match limits.get(&key) {
                Some(&rule) => (rule, Some(hash)),
                None => self.fallback(&key),
            }
        };
        let entry = Entry::new(
            self.window,
            self.clock.clone(),
            limit,
            tag,
            pinned,
            &self.breakers,
            &self.rt_histogram,
            self.system.as_ref(),
            self.windows.build(Some(&key), self.routes.route_of(&key)),
        );
        (Arc::new(key), Arc::new(entry))
    }

    #[cold]
    fn insert<P: PendingKey<K>>(&self, key: P, hash: u64, now: u64) -> Arc<Entry>
    where
        K: Borrow<P::Q>,
    {
        let pinned = read(&self.limits).contains_key(key.key()) || self.windows.has_own(key.key());
        if !pinned && !self.reserve(now) {
            self.note_overflow(now);
            if self.routes.active() || self.windows.routes_active() {
                // A key of a route with a rule shares its route's overflow
                // entry, limited as the route is in every window: filling
                // the table never moves a client onto the default limits.
                let key = key.into_owned();
                if let Some(entry) = self.routes.overflow(&key, |limit| {
                    self.overflow_entry(limit, self.routes.route_of(&key))
                }) {
                    return entry;
                }
                // A route with rules in further windows only: its own
                // overflow entry, on the shared one's first-window limit.
                if let Some(entry) = self.routes.route_of(&key).and_then(|route| {
                    self.windows.route_overflow(route, |windows| {
                        self.overflow_entry_with(self.overflow.limit(), Some(windows))
                    })
                }) {
                    return entry;
                }
            }
            return Arc::clone(&self.overflow);
        }
        let mut table = write(self.shard(hash));
        if let Some((_, entry)) = table.find(hash, |(k, _)| (**k).borrow() == key.key()) {
            // Another request inserted it first.
            if !pinned {
                self.counted.fetch_sub(1, Ordering::Relaxed);
            }
            return Arc::clone(entry);
        }
        // The limit is read with the shard locked: `set_limit` writes the
        // limits table before it takes this lock to update a live entry, so
        // either it finds this entry or this read sees its limit. Whether
        // the entry counts against `max_keys` stays what was decided above,
        // even if a rule arrived meanwhile, so that eviction gives back
        // exactly the slot that was reserved.
        let (key, entry) = self.create(key.into_owned(), hash, pinned);
        let found = Arc::clone(&entry);
        table.insert_unique(hash, (key, entry), |(k, _)| self.hasher.hash_one(&**k));
        found
    }

    /// Counts a request at `now` sent to the overflow entry, and tells the
    /// operator: one `warn` event per [`OVERFLOW_WARN_EVERY_MS`] at most
    /// (the first at once), naming `max_keys` and how many requests went to
    /// the overflow entry since the last one. A clock stepped back by more
    /// than that interval logs again rather than going quiet.
    #[cold]
    pub(crate) fn note_overflow(&self, now: u64) {
        self.overflowed.fetch_add(1, Ordering::Relaxed);
        let last = self.overflow_warned.load(Ordering::Relaxed);
        let due = last == 0 || now.abs_diff(last - 1) >= OVERFLOW_WARN_EVERY_MS;
        if !due
            || self
                .overflow_warned
                .compare_exchange(
                    last,
                    now.saturating_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        let requests = self.overflowed.swap(0, Ordering::Relaxed);
        tracing::warn!(
            max_keys = self.max_keys,
            overflow_requests = requests,
            every_s = OVERFLOW_WARN_EVERY_MS / 1_000,
            "key table full (max_keys): requests of new keys share the overflow \
             entry's limit, and their RateLimit fields name the policy \"overflow\""
        );
    }

    /// Claims room for one more counted key, sweeping if the table is full.
    fn reserve(&self, now: u64) -> bool {
        let mut swept = false;
        loop {
            let n = self.counted.load(Ordering::Relaxed);
            if n < self.max_keys {
                if self
                    .counted
                    .compare_exchange(n, n + 1, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                {
                    return true;
                }
                continue;
            }
            if swept || !self.sweep(now) {
                return false;
            }
            swept = true;
        }
    }

    /// Evicts idle keys, at most once per bucket length. Returns whether
    /// this call swept.
    ///
    /// A reading a whole window behind the last sweep is taken as a clock
    /// that stepped back (or a last sweep at a reading far ahead): it sweeps,
    /// and the schedule restarts from it. A thread's reading that is merely
    /// stale (it read the clock, then waited) is less than a window behind,
    /// and waits for the schedule like any other.
    fn sweep(&self, now: u64) -> bool {
        let every = self.window.bucket_ms().max(1);
        let last = self.last_sweep.load(Ordering::Relaxed);
        let due = now >= last.saturating_add(every)
            || now.saturating_add(self.window.interval_ms) <= last;
        if !due
            || self
                .last_sweep
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        self.evict_idle(now);
        true
    }

    /// Removes every idle entry nobody holds. Returns how many went.
    ///
    /// An entry is judged at [`effective_now`]: never at a time before its
    /// newest bucket, so a stale `now` cannot make a key that passed
    /// meanwhile look idle.
    pub(crate) fn evict_idle(&self, now: u64) -> usize {
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut table = write(shard);
            table.retain(|(_, entry)| {
                // Holding the write lock, nobody can look the entry up; a
                // strong count of 1 means no request holds it either.
                if Arc::strong_count(entry) != 1 {
                    return true;
                }
                // Pairs with the release decrement of the last request that
                // dropped its clone, so its events are visible below.
                fence(Ordering::Acquire);
                let at = effective_now(entry, now);
                // A key whose latest used turn is less than a window ago
                // keeps its pacer: a new entry would hand out a turn early.
                // Turns given back do not count (nobody holds the entry, so
                // the next caller would be spaced from the used one), nor
                // does a used turn more than a window ahead of the clock
                // (turns are on the clock's own time, not the key's): the
                // clock went back, and the key is not pinned for the step.
                let interval = self.window().interval_ms;
                let paced_recently =
                    entry
                        .pacer()
                        .and_then(|pacer| pacer.used_ns())
                        .is_some_and(|ns| {
                            let ms = ns / 1_000_000;
                            ms.saturating_add(interval) > now && ms <= now.saturating_add(interval)
                        });
                // An entry whose breaker is open keeps it too: eviction must
                // not cut an open time short. A breaker whose open time is
                // over (or whose probe was dropped) waits for a probe that
                // any new request would make anyway, so it is idle: an open
                // breaker pins its key for at most `open_for` plus a window.
                // A key with passes left in a further window keeps its
                // entry: a new one would admit them again.
                let evict = !paced_recently
                    && entry.node.is_idle_at(at)
                    && entry.breakers.idle_at(at)
                    && entry.windows().is_none_or(|w| w.idle_at(at));
                if evict {
                    removed += 1;
                    // Nobody holds the entry and it is idle: its totals are
                    // final (see `evicted`).
                    self.evicted.absorb(&entry.node.lifetime_counts());
                    if !entry.pinned {
                        self.counted.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                !evict
            });
        }
        removed
    }

    // --- reads for the handle -------------------------------------------------

    /// The entry of `key`, if it holds one (the overflow entry is not one).
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<Arc<Entry>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if Self::is_single() {
            return self
                .single
                .get()
                .filter(|(k, _)| (**k).borrow() == key)
                .map(|(_, e)| Arc::clone(e));
        }
        let hash = self.hasher.hash_one(key);
        read(self.shard(hash))
            .find(hash, |(k, _)| (**k).borrow() == key)
            .map(|(_, e)| Arc::clone(e))
    }

    /// Calls `f` with every key holding an entry, and its entry.
    ///
    /// Each shard's read lock is held only to copy its pointers into one
    /// buffer, reused from shard to shard; `f` runs with no lock held, so it
    /// may take as long as it likes (clone keys, read statistics) without
    /// delaying a request.
    pub(crate) fn for_each_entry(&self, mut f: impl FnMut(&Arc<K>, &Arc<Entry>)) {
        if Self::is_single() {
            if let Some((k, e)) = self.single.get() {
                f(k, e);
            }
            return;
        }
        let mut buffer: Vec<(Arc<K>, Arc<Entry>)> = Vec::new();
        for shard in self.shards.iter() {
            {
                let table = read(shard);
                buffer.reserve(table.len());
                buffer.extend(table.iter().map(|(k, e)| (Arc::clone(k), Arc::clone(e))));
            }
            for (k, e) in buffer.drain(..) {
                f(&k, &e);
            }
        }
    }

    /// Number of keys holding an entry.
    pub(crate) fn entries_len(&self) -> usize {
        if Self::is_single() {
            return usize::from(self.single.get().is_some());
        }
        self.shards.iter().map(|shard| read(shard).len()).sum()
    }

    /// The lifetime totals of every entry evicted so far, summed.
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    pub(crate) fn evicted_totals(&self) -> Counts {
        self.evicted.counts()
    }

    /// The entry shared by keys that found no room.
    pub(crate) fn overflow(&self) -> &Arc<Entry> {
        &self.overflow
    }

    /// Sets `key`'s own limit, now and for every later entry of it.
    pub(crate) fn set_limit(&self, key: K, limit: u64) {
        write(&self.limits).insert(key.clone(), limit);
        let hash = self.hasher.hash_one(&key);
        if Self::is_single() {
            // Initialise the one entry here if no request has yet: an entry
            // a request is creating concurrently either reads the limit
            // written above, or is the one `get_or_init` returns and is
            // updated below. Updating only an entry `get` returns would lose
            // the limit to a first request racing with this call.
            let (_, entry) = self.single.get_or_init(|| self.create(key, hash, true));
            entry.set_limit(limit, Some(hash));
            return;
        }
        // Taking the shard lock orders this update against `insert`, which
        // reads the limits table with the same lock held.
        let table = write(self.shard(hash));
        if let Some((_, entry)) = table.find(hash, |(k, _)| **k == key) {
            entry.set_limit(limit, Some(hash));
        }
    }

    /// The owned form of `key`, if the key has its own limit.
    #[cfg(feature = "redis")]
    pub(crate) fn own_limit_key<Q>(&self, key: &Q) -> Option<K>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        read(&self.limits)
            .get_key_value(key)
            .map(|(owned, _)| owned.clone())
    }

    /// Removes `key`'s own limit: the key goes back to the default limit,
    /// now and for every later entry of it. Returns whether it had one.
    pub(crate) fn remove_limit<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let removed = write(&self.limits).remove_entry(key);
        let had = removed.is_some();
        let hash = self.hasher.hash_one(key);
        if Self::is_single() {
            // As in `set_limit`: a first request racing with this call may
            // be building the one entry from the rule read before it was
            // removed. `get_or_init` waits for that entry (or builds it,
            // from the owned key the rule was stored under) so the reset
            // below reaches it. Without a rule there is nothing to undo.
            if let Some((owned, _)) = removed {
                let (_, entry) = self.single.get_or_init(|| self.create(owned, hash, true));
                entry.set_limit(self.default_limit.load(Ordering::Relaxed), None);
            }
            return had;
        }
        // Same ordering against `insert` as in `set_limit`. The key goes
        // back to its route's rule if it has one, else to the default.
        let table = write(self.shard(hash));
        if let Some((k, entry)) = table.find(hash, |(k, _)| (**k).borrow() == key) {
            let (limit, tag) = self.fallback(k);
            entry.set_limit(limit, tag);
        }
        had
    }

    /// A new overflow entry limited to `limit` (a route's), with the
    /// further windows' limits of `route`.
    fn overflow_entry(&self, limit: u64, route: Option<&str>) -> Entry {
        self.overflow_entry_with(limit, self.windows.build(None, route))
    }

    /// A new overflow entry limited to `limit`, with further windows
    /// `windows`.
    fn overflow_entry_with(&self, limit: u64, windows: Option<crate::stat::ExtraWindows>) -> Entry {
        Entry::new(
            self.window,
            self.clock.clone(),
            limit,
            None,
            false,
            &self.breakers,
            &self.rt_histogram,
            self.system.as_ref(),
            windows,
        )
        .into_overflow()
    }

    /// Sets `route`'s rule, `None` removes it, and brings every live key of
    /// the route that has no rule of its own to its new limit (its window
    /// as it is: no burst). Returns whether the route had a rule.
    ///
    /// The caller holds `rules().applying`, so route changes and rules
    /// documents never interleave. The rule is written first; then each
    /// shard is read-locked in turn, so that an entry created before the
    /// write (under its shard's write lock) is visited, and one created
    /// after it read the new rule itself.
    pub(crate) fn set_route_limit(
        &self,
        route_of: RouteOf<K>,
        route: &str,
        limit: Option<u64>,
    ) -> bool {
        let had = self.routes.lookup_route(route).is_some();
        match limit {
            Some(limit) => {
                self.routes.set(route_of, route, limit);
            }
            None => {
                self.routes.remove(route);
            }
        }
        if Self::is_single() {
            // A zero-sized key has no route part.
            return had;
        }
        for shard in self.shards.iter() {
            let table = read(shard);
            let limits = read(&self.limits);
            for (key, entry) in table.iter() {
                if !limits.contains_key(&**key) && self.routes.is_route(key, route) {
                    let (limit, tag) = self.fallback(key);
                    entry.set_limit(limit, tag);
                }
            }
        }
        had
    }

    /// Replaces every route rule with `routes` (before
    /// [`apply_rules`](Self::apply_rules), which brings live entries to
    /// them). The caller holds `rules().applying`.
    pub(crate) fn replace_routes(
        &self,
        route_of: Option<RouteOf<K>>,
        routes: HashMap<String, u64>,
    ) {
        self.routes.replace(route_of, routes);
    }

    /// The first window's limit of `key` now: its own, or the default.
    pub(crate) fn limit_of<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let limits = read(&self.limits);
        limits
            .get(key)
            .copied()
            .unwrap_or_else(|| self.default_limit.load(Ordering::Relaxed))
    }

    /// The further windows' limits.
    pub(crate) fn windows(&self) -> &WindowLimits<K> {
        &self.windows
    }

    /// Sets (`Some`) or removes (`None`) `key`'s own limit in further
    /// window `i`, now and for every later entry of it (as
    /// [`set_limit`](Self::set_limit) for the first window).
    pub(crate) fn set_window_limit(&self, key: K, i: usize, limit: Option<u64>) {
        self.windows.set(&key, i, limit);
        let hash = self.hasher.hash_one(&key);
        if Self::is_single() {
            // As in `set_limit`: reach an entry a first request is building.
            let (key, entry) = self.single.get_or_init(|| self.create(key, hash, true));
            if let Some(windows) = entry.windows() {
                self.windows.refresh(Some(key), None, windows);
            }
            return;
        }
        // The shard's lock orders this against `insert` (see `set_limit`).
        let table = write(self.shard(hash));
        if let Some((key, entry)) = table.find(hash, |(k, _)| **k == key) {
            if let Some(windows) = entry.windows() {
                self.windows
                    .refresh(Some(key), self.routes.route_of(key), windows);
            }
        }
    }

    /// Sets (`Some`) or removes (`None`) `route`'s rule in further window
    /// `i`, and brings every live key of the route to it (its window as it
    /// is: no burst; a key's own limit in that window stays). Returns
    /// whether the route had a rule there.
    ///
    /// The caller holds `rules().applying`. The rule is written first; then
    /// each shard is read-locked in turn, so that an entry created before
    /// the write (under its shard's write lock) is visited, and one created
    /// after it read the new rule itself (see `set_route_limit`).
    pub(crate) fn set_route_window_limit(
        &self,
        route_of: RouteOf<K>,
        route: &str,
        i: usize,
        limit: Option<u64>,
    ) -> bool {
        self.routes.set_route_of(route_of);
        let had = self.windows.set_route(route, i, limit);
        self.routes.for_each_route_overflow(|name, entry| {
            if name == route {
                if let Some(windows) = entry.windows() {
                    self.windows.refresh(None, Some(name), windows);
                }
            }
        });
        self.windows.refresh_route_overflows();
        if Self::is_single() {
            return had;
        }
        for shard in self.shards.iter() {
            let table = read(shard);
            for (key, entry) in table.iter() {
                if let Some(windows) = entry.windows() {
                    if self.routes.is_route(key, route) {
                        self.windows.refresh(Some(key), Some(route), windows);
                    }
                }
            }
        }
        had
    }

    /// Replaces the further windows' defaults and per-key limits (a rules
    /// document), and brings every live entry to them, as
    /// [`apply_rules`](Self::apply_rules) does for the first window.
    pub(crate) fn apply_window_rules(
        &self,
        defaults: &[Option<u64>],
        per_key: HashMap<K, super::KeyLimits>,
        per_route: HashMap<String, super::KeyLimits>,
    ) {
        if !self.windows.any() {
            return;
        }
        self.windows.replace(defaults, per_key, per_route);
        if let Some(windows) = self.overflow.windows() {
            self.windows.refresh(None, None, windows);
        }
        self.routes.for_each_route_overflow(|route, entry| {
            if let Some(windows) = entry.windows() {
                self.windows.refresh(None, Some(route), windows);
            }
        });
        self.windows.refresh_route_overflows();
        if Self::is_single() {
            if let Some((key, entry)) = self.single.get() {
                if let Some(windows) = entry.windows() {
                    self.windows.refresh(Some(key), None, windows);
                }
            }
            return;
        }
        for shard in self.shards.iter() {
            let table = read(shard);
            for (key, entry) in table.iter() {
                if let Some(windows) = entry.windows() {
                    self.windows
                        .refresh(Some(key), self.routes.route_of(key), windows);
                }
            }
        }
    }

    /// The layer's rules state.
    pub(crate) fn rules(&self) -> &Status {
        &self.rules
    }

    /// Replaces every per-key limit with `limits` and the default with
    /// `default` (`None`: the default the layer was built with), and brings
    /// every live entry to its new limit. Returns the limits replaced.
    ///
    /// The caller holds `rules().applying`, so documents never interleave.
    /// A request that starts after this returns sees the new limits. While
    /// it runs, entries are updated one shard after another: a request may
    /// meet the new limit on one key and the old one on another, never a
    /// limit that is in neither document. Each entry's limit is one
    /// relaxed store, and its window is left as it is (no burst: passes
    /// already counted stay counted, as with `set_limit`).
    pub(crate) fn apply_rules(
        &self,
        default: Option<u64>,
        limits: HashMap<K, u64>,
    ) -> HashMap<K, u64> {
        let default = default.unwrap_or(self.built_default);
        let old = {
            let mut table = write(&self.limits);
            self.default_limit.store(default, Ordering::Relaxed);
            std::mem::replace(&mut *table, limits)
        };
        if self.overflow_on_default {
            self.overflow.set_limit_only(default);
            // The overflow entries of routes with further windows' rules
            // only are on the shared one's first-window limit.
            self.windows
                .for_each_route_overflow(|_, entry| entry.set_limit_only(default));
        }
        // Each entry's limit is stored with the limits' read lock held, so
        // that a `set_limit` racing this (which writes the table, then the
        // entry) cannot be undone by a limit read before it.
        let update = |limits: &HashMap<K, u64>, key: &K, entry: &Entry| match limits.get(key) {
            Some(&limit) => entry.set_limit(limit, Some(self.hasher.hash_one(key))),
            None => {
                let (limit, tag) = self.fallback(key);
                entry.set_limit(limit, tag);
            }
        };
        if Self::is_single() {
            // See `init_single` for a first request racing this.
            if let Some((key, entry)) = self.single.get() {
                update(&read(&self.limits), key, entry);
            }
            return old;
        }
        // Every entry created before the write above is visited below: an
        // entry is created with its shard's write lock held and reads its
        // limit under that lock, so the read lock taken here waits for it.
        // One created after the write read the new limits itself. The
        // shard's lock is taken before the limits' lock, in the order
        // `insert` takes them.
        for shard in self.shards.iter() {
            let table = read(shard);
            let limits = read(&self.limits);
            for (key, entry) in table.iter() {
                update(&limits, key, entry);
            }
        }
        old
    }
}

impl<K> fmt::Debug for Registry<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("default_limit", &self.default_limit.load(Ordering::Relaxed))
            .field("window", &self.window)
            .field("max_keys", &self.max_keys)
            .field("rules", &read(&self.limits).len())
            .field("keys", &self.counted.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}
