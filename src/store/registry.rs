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
//!   no event left in the second window; a key's minute-window history goes
//!   with it); sweeps run at most once per bucket length, so a
//!   flood of new keys cannot turn every request into a full scan. If no
//!   entry can be freed, the key shares the overflow entry, which is limited
//!   with the default limit: varying the key never gets past the limit and
//!   never grows memory.
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

use super::{Entry, Settings, Window};
use crate::clock::SharedClock;
use crate::sync::{read, write, AtomicU64, AtomicUsize, Ordering, RwLock};

/// Number of table shards. A power of two comfortably above the core count
/// of the machines this runs on keeps writers (new keys, sweeps) from
/// blocking most readers.
const SHARDS: usize = 16;

/// One shard of the key table.
type Shard<K> = RwLock<HashTable<(K, Arc<Entry>)>>;

pub(crate) struct Registry<K> {
    shards: Box<[Shard<K>]>,
    hasher: RandomState,
    /// The one entry of a zero-sized key type.
    single: OnceLock<(K, Arc<Entry>)>,
    overflow: Arc<Entry>,
    /// Keys holding an entry that count against `max_keys` (all but pinned).
    counted: AtomicUsize,
    max_keys: usize,
    /// Per-key limits set by rules and `set_limit`. Apart from the entries,
    /// so they survive eviction.
    limits: RwLock<HashMap<K, u64>>,
    default_limit: u64,
    window: Window,
    clock: SharedClock,
    /// Clock time (ms) of the last sweep; sweeps are at most one per bucket.
    last_sweep: AtomicU64,
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> Registry<K> {
    pub(crate) fn new(settings: &Settings<K>) -> Self {
        let Settings {
            default_limit,
            window,
            ref clock,
            max_keys,
            ref rules,
        } = *settings;
        let hasher = RandomState::new();
        let overflow = Arc::new(Entry::new(
            window,
            clock.clone(),
            default_limit,
            None,
            false,
        ));
        Registry {
            shards: (0..SHARDS).map(|_| RwLock::new(HashTable::new())).collect(),
            hasher,
            single: OnceLock::new(),
            overflow,
            counted: AtomicUsize::new(0),
            max_keys,
            limits: RwLock::new(rules.clone()),
            default_limit,
            window,
            clock: clock.clone(),
            last_sweep: AtomicU64::new(0),
        }
    }

    pub(crate) fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// The shape of every key's window.
    pub(crate) fn window(&self) -> Window {
        self.window
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
        if Self::is_single() {
            return Arc::clone(
                &self
                    .single
                    .get_or_init(|| {
                        let hash = self.hasher.hash_one(&key);
                        // The single key never counts against `max_keys`.
                        self.create(key, hash, true)
                    })
                    .1,
            );
        }
        let hash = self.hasher.hash_one(&key);
        {
            let table = read(self.shard(hash));
            if let Some((_, entry)) = table.find(hash, |(k, _)| *k == key) {
                return Arc::clone(entry);
            }
        }
        self.insert(key, hash, now)
    }

    /// A new entry for `key`. `pinned`: the entry holds no counted slot of
    /// `max_keys` (decided by the caller, who reserved one or not).
    fn create(&self, key: K, hash: u64, pinned: bool) -> (K, Arc<Entry>) {
        let rule = read(&self.limits).get(&key).copied();
        let entry = Entry::new(
            self.window,
            self.clock.clone(),
            rule.unwrap_or(self.default_limit),
            rule.map(|_| hash),
            pinned,
        );
        (key, Arc::new(entry))
    }

    #[cold]
    fn insert(&self, key: K, hash: u64, now: u64) -> Arc<Entry> {
        let pinned = read(&self.limits).contains_key(&key);
        if !pinned && !self.reserve(now) {
            return Arc::clone(&self.overflow);
        }
        let mut table = write(self.shard(hash));
        if let Some((_, entry)) = table.find(hash, |(k, _)| *k == key) {
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
        let (key, entry) = self.create(key, hash, pinned);
        let found = Arc::clone(&entry);
        table.insert_unique(hash, (key, entry), |(k, _)| self.hasher.hash_one(k));
        found
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
    fn sweep(&self, now: u64) -> bool {
        let every = self.window.bucket_ms().max(1);
        let last = self.last_sweep.load(Ordering::Relaxed);
        if now < last.saturating_add(every)
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
    pub(crate) fn evict_idle(&self, now: u64) -> usize {
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut table = write(shard);
            table.retain(|(_, entry)| {
                // Holding the write lock, nobody can look the entry up; a
                // strong count of 1 means no request holds it either.
                let evict = Arc::strong_count(entry) == 1 && entry.node.is_idle_at(now);
                if evict {
                    removed += 1;
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
                .filter(|(k, _)| k.borrow() == key)
                .map(|(_, e)| Arc::clone(e));
        }
        let hash = self.hasher.hash_one(key);
        read(self.shard(hash))
            .find(hash, |(k, _)| k.borrow() == key)
            .map(|(_, e)| Arc::clone(e))
    }

    /// Every key holding an entry, with it.
    pub(crate) fn entries(&self) -> Vec<(K, Arc<Entry>)> {
        if Self::is_single() {
            return self.single.get().cloned().into_iter().collect();
        }
        let mut all = Vec::new();
        for shard in self.shards.iter() {
            let table = read(shard);
            all.extend(table.iter().map(|(k, e)| (k.clone(), Arc::clone(e))));
        }
        all
    }

    /// Number of keys holding an entry.
    pub(crate) fn entries_len(&self) -> usize {
        if Self::is_single() {
            return usize::from(self.single.get().is_some());
        }
        self.shards.iter().map(|shard| read(shard).len()).sum()
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
        if let Some((_, entry)) = table.find(hash, |(k, _)| *k == key) {
            entry.set_limit(limit, Some(hash));
        }
    }

    /// Removes `key`'s own limit: the key goes back to the default limit,
    /// now and for every later entry of it. Returns whether it had one.
    pub(crate) fn remove_limit<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let had = write(&self.limits).remove(key).is_some();
        let hash = self.hasher.hash_one(key);
        if Self::is_single() {
            if let Some((_, entry)) = self.single.get() {
                entry.set_limit(self.default_limit, None);
            }
            return had;
        }
        // Same ordering against `insert` as in `set_limit`.
        let table = write(self.shard(hash));
        if let Some((_, entry)) = table.find(hash, |(k, _)| k.borrow() == key) {
            entry.set_limit(self.default_limit, None);
        }
        had
    }
}

impl<K> fmt::Debug for Registry<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("default_limit", &self.default_limit)
            .field("window", &self.window)
            .field("max_keys", &self.max_keys)
            .field("rules", &read(&self.limits).len())
            .field("keys", &self.counted.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}
