//! Who is being limited: the keys with the most blocks over the last
//! minute, in memory that does not grow with the number of keys.
//!
//! # Implementation details
//!
//! - **Space-Saving** (Metwally, Agrawal and El Abbadi, 2005). A summary
//!   holds at most `c` counters, each a key with a count and an error. A
//!   block of a key that holds a counter adds one to it. A block of a new
//!   key takes a free counter (count 1, error 0) or, when all `c` are
//!   taken, the counter with the smallest count `m`: the old key goes, the
//!   new one gets count `m + 1` and error `m`. Then every count is at least
//!   the key's true number of blocks and at most that plus its error, which
//!   is at most the smallest count `m` (and `m <= N / c` for `N` blocks in
//!   the summary), and every key with more than `m` blocks holds a counter.
//!   A summary that never filled up has evicted no one: its counts are
//!   exact. The counters sit in a fixed array with a min-heap of their
//!   places beside it (the smallest count at the root) and a hash index
//!   from key to place; all three get their full capacity the first time a
//!   summary records, and are never grown: the index is made for twice
//!   the counters, so that its deleted marks are always cleared in place
//!   (a table under half full rehashes in place, without allocating).
//! - **The last minute.** Time is cut into periods of [`PERIOD_MS`] (10 s)
//!   of the layer's clock, each recorded in a summary of its own, on a ring
//!   of [`PERIODS`] (6). A read at time `t` merges the summaries of the
//!   periods whose starts lie in `(start(t) - 60 s, start(t)]`, where
//!   `start(t)` is the start of `t`'s period: the blocks from
//!   `start(t) - 50 s` up to `t`, so between 50 and 60 s of them (the
//!   layer's own windows count the same way). A period's summary is
//!   cleared when its slot on the ring is next written, six periods on.
//!   Merging adds a key's counts; for a full summary where the key holds
//!   no counter it adds that summary's smallest count (what the key may
//!   have had there), so a merged count still never under-reports, and is
//!   over by at most the sum of the smallest counts of the full summaries
//!   merged.
//! - **Shards.** The block path is what a flood of refused clients hits,
//!   so the summaries are split by key hash into [`SHARDS`] (16) shards,
//!   each behind its own lock, with `capacity / SHARDS` counters per
//!   period: a key always lands in the same shard, so no key is split
//!   between shards, and the bounds above hold per shard, with `c` the
//!   shard's counters and `N` the blocks of that shard's keys. Counts are
//!   exact while no shard has seen more distinct keys blocked in one
//!   period than its counters (64 by default; always so with fewer than 64
//!   distinct keys, and with keys spread by hash, up to several hundred
//!   typically). The hash is the key table's kind of randomly seeded
//!   SipHash, so clients cannot choose keys that crowd one shard.
//! - **Cost of a block.** One hash of the key (a borrowed form where the
//!   extractor has one), one shard's write lock, one index probe and a
//!   heap step of `log2(64)` swaps at most; a key that holds a counter
//!   allocates nothing, a new key is made owned once (and replaces the
//!   key it evicts, which is dropped after the lock is released). Clearing
//!   an old period drops its keys, once per period and shard. A timestamp
//!   behind the newest period recorded (a clock stepped back, a slow
//!   thread) is counted in that newest period: never lost, never a panic;
//!   a read timed behind it reads the minute up to it.
//! - **Memory.** Nothing until the first block; then, per shard and period
//!   recorded, `c` counters (the key, a hash, a count, an error and a heap
//!   place: the key's size plus 32 bytes), `c` heap places (4 bytes) and
//!   an index of 256 buckets of a 4-byte place and a one-byte control word
//!   (the smallest hashbrown table for `2c = 128` entries): with `String`
//!   keys and `c = 64`, 5 136 bytes per shard and period, 16 x 6 of them,
//!   about 480 KiB at most, plus the keys' own bytes (at most 6 144 keys
//!   held).

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::OnceLock;

use hashbrown::HashTable;

use super::registry::{Borrowed, Owned, PendingKey};
use crate::key::KeyVisitor;
use crate::sync::{read, write, AtomicU64, Ordering, RwLock};

/// Counters over all shards, per period: the keys a period tells apart
/// exactly, at most (see the module notes for how shards share them).
pub(crate) const DEFAULT_CAPACITY: usize = 1024;

/// Shards of the summary, each behind its own lock.
pub(crate) const SHARDS: usize = 16;

/// Length of one period of the ring, in milliseconds of the layer's clock.
pub(crate) const PERIOD_MS: u64 = 10_000;

/// Periods on the ring: together the last minute.
pub(crate) const PERIODS: usize = 6;

/// The top-blocked summary of one layer (see the module notes).
pub(crate) struct TopBlocked<K> {
    /// Made at the first block: a layer that never refuses pays nothing.
    shards: OnceLock<Box<[RwLock<Shard<K>>]>>,
    hasher: RandomState,
    /// Counters per shard and period.
    per_shard: usize,
    /// The newest period any shard has recorded in, so that every shard is
    /// read at the same period. Relaxed: it only moves the period a block
    /// or a read is timed at forward (each shard also keeps its own, under
    /// its lock, which orders the counts); raised with `fetch_max` only
    /// when a block's period is past it, so the block path reads the line
    /// and writes it once per period.
    newest: AtomicU64,
}

/// One shard: its ring of periods.
struct Shard<K> {
    /// The newest period recorded here: a block timed behind it is counted
    /// in it. Written under the shard's write lock only.
    newest: u64,
    ring: [Summary<K>; PERIODS],
}

/// The Space-Saving summary of one period of one shard.
struct Summary<K> {
    /// The period whose blocks it holds; `None`: it never recorded.
    period: Option<u64>,
    /// The counters, in the order they were taken.
    counters: Vec<Counter<K>>,
    /// Places in `counters`, a min-heap on their counts: the root is the
    /// counter a new key takes once all are in use. `counters[heap[i]].at
    /// == i` for every `i`.
    heap: Vec<u32>,
    /// Places in `counters`, found by key (hashed with the summary's
    /// hasher; each counter keeps its hash, for moves inside the table).
    index: HashTable<u32>,
}

struct Counter<K> {
    key: K,
    hash: u64,
    /// Blocks counted for `key`, `error` of them perhaps another key's.
    count: u64,
    /// The smallest count when `key` took the counter over (0 for a
    /// counter taken free).
    error: u64,
    /// This counter's place in the heap.
    at: u32,
}

impl<K> TopBlocked<K> {
    /// An empty summary with [`DEFAULT_CAPACITY`] counters per period.
    pub(crate) fn new() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }

    /// An empty summary with `capacity` counters per period, shared by the
    /// shards (at least one each).
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        TopBlocked {
            shards: OnceLock::new(),
            hasher: RandomState::new(),
            per_shard: capacity.div_ceil(SHARDS).clamp(1, u32::MAX as usize),
            newest: AtomicU64::new(0),
        }
    }
}

impl<K: Eq + Hash> TopBlocked<K> {
    fn shards(&self) -> &[RwLock<Shard<K>>] {
        self.shards.get_or_init(|| {
            (0..SHARDS)
                .map(|_| {
                    RwLock::new(Shard {
                        newest: 0,
                        ring: std::array::from_fn(|_| Summary::empty()),
                    })
                })
                .collect()
        })
    }

    /// The shard of a key's hash. The middle bits pick it: hashbrown uses
    /// the low bits for the bucket and the top seven for its control word.
    fn shard(&self, hash: u64) -> &RwLock<Shard<K>> {
        &self.shards()[(hash >> 32) as usize % SHARDS]
    }

    /// Records one block of `key` at `now` (ms on the layer's clock).
    pub(crate) fn record(&self, key: K, now: u64) {
        self.record_pending(Owned(key), now);
    }

    /// [`record`](Self::record) for a borrowed form of the key: the owned
    /// key is made with `to_owned` only if it takes a counter.
    pub(crate) fn record_borrowed<Q>(&self, key: &Q, to_owned: fn(&Q) -> K, now: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.record_pending(Borrowed(key, to_owned), now);
    }

    fn record_pending<P: PendingKey<K>>(&self, key: P, now: u64)
    where
        K: Borrow<P::Q>,
    {
        // `K: Borrow<Q>` promises that `Q` hashes as `K` does.
        let hash = self.hasher.hash_one(key.key());
        let period = self.period(now);
        let evicted = {
            let mut shard = write(self.shard(hash));
            let period = period.max(shard.newest);
            shard.newest = period;
            let summary = &mut shard.ring[slot(period)];
            if summary.period != Some(period) {
                summary.start(period, self.per_shard);
            }
            summary.add(hash, key, self.per_shard)
        };
        // The key a new one replaced is dropped outside the lock.
        drop(evicted);
    }

    /// The period a block at `now` is recorded in: `now`'s, or the newest
    /// recorded if `now` is behind it.
    fn period(&self, now: u64) -> u64 {
        let period = now / PERIOD_MS;
        let newest = self.newest.load(Ordering::Relaxed);
        if period > newest {
            self.newest.fetch_max(period, Ordering::Relaxed);
            return period;
        }
        newest
    }

    /// The `n` keys with the most blocks in the periods that cover the last
    /// minute at `now`, most first, with their merged counts (see the
    /// module notes). Ties come in no particular order.
    pub(crate) fn top(&self, n: usize, now: u64) -> Vec<(K, u64)>
    where
        K: Clone,
    {
        let Some(shards) = self.shards.get().filter(|_| n > 0) else {
            return Vec::new();
        };
        // Read as the next block would be timed, without moving the period.
        let period = (now / PERIOD_MS).max(self.newest.load(Ordering::Relaxed));
        let mut top = Vec::new();
        for shard in shards.iter() {
            read(shard).top(n, period, self.per_shard, &mut top);
        }
        top.sort_unstable_by_key(|&(_, count)| std::cmp::Reverse(count));
        top.truncate(n);
        top
    }
}

/// The ring slot of `period`.
fn slot(period: u64) -> usize {
    (period % PERIODS as u64) as usize
}

impl<K: Eq + Hash> Shard<K> {
    /// Appends this shard's `n` keys with the most blocks over the minute
    /// that ends in `period` to `out`, with their merged counts.
    fn top(&self, n: usize, period: u64, capacity: usize, out: &mut Vec<(K, u64)>)
    where
        K: Clone,
    {
        // A reader whose clock is behind the newest block reads at that
        // block's period, as the block was recorded there.
        let newest = period.max(self.newest);
        let covered = |summary: &&Summary<K>| {
            summary
                .period
                .is_some_and(|p| p <= newest && p + PERIODS as u64 > newest)
        };
        let summaries: Vec<&Summary<K>> = self.ring.iter().filter(covered).collect();
        // A key's merged count: its counts in the summaries that hold it,
        // plus each full summary's smallest count where it holds none.
        struct Merged<'a, K> {
            key: &'a K,
            hash: u64,
            count: u64,
            /// Bit `i`: `summaries[i]` holds the key.
            held: u8,
        }
        let mut merged: Vec<Merged<'_, K>> = Vec::new();
        let mut index: HashTable<usize> = HashTable::new();
        for (i, summary) in summaries.iter().enumerate() {
            for counter in &summary.counters {
                let found = index.find(counter.hash, |&m| *merged[m].key == counter.key);
                match found {
                    Some(&m) => {
                        merged[m].count = merged[m].count.saturating_add(counter.count);
                        merged[m].held |= 1 << i;
                    }
                    None => {
                        index.insert_unique(counter.hash, merged.len(), |&m| merged[m].hash);
                        merged.push(Merged {
                            key: &counter.key,
                            hash: counter.hash,
                            count: counter.count,
                            held: 1 << i,
                        });
                    }
                }
            }
        }
        let floors: Vec<(u8, u64)> = summaries
            .iter()
            .enumerate()
            .filter(|(_, summary)| summary.counters.len() >= capacity)
            .map(|(i, summary)| (1 << i, summary.smallest()))
            .collect();
        if !floors.is_empty() {
            for m in &mut merged {
                for &(bit, floor) in &floors {
                    if m.held & bit == 0 {
                        m.count = m.count.saturating_add(floor);
                    }
                }
            }
        }
        merged.sort_unstable_by_key(|m| std::cmp::Reverse(m.count));
        out.extend(merged.into_iter().take(n).map(|m| (m.key.clone(), m.count)));
    }
}

impl<K: Eq + Hash> Summary<K> {
    fn empty() -> Self {
        Summary {
            period: None,
            counters: Vec::new(),
            heap: Vec::new(),
            index: HashTable::new(),
        }
    }

    /// Clears the summary for `period`; gives it its full capacity the
    /// first time, once and for all.
    fn start(&mut self, period: u64, capacity: usize) {
        self.period = Some(period);
        self.counters.clear();
        self.heap.clear();
        self.index.clear();
        if self.counters.capacity() < capacity {
            self.counters.reserve_exact(capacity);
            self.heap.reserve_exact(capacity);
            // Twice the counters: the table never holds more than half its
            // buckets, so it clears its deleted marks in place (see the
            // module notes) and never allocates again.
            self.index = HashTable::with_capacity(capacity.saturating_mul(2));
        }
    }

    /// The smallest count (0 when empty).
    fn smallest(&self) -> u64 {
        self.heap
            .first()
            .map_or(0, |&c| self.counters[c as usize].count)
    }

    /// Counts one block of `key`; returns the key it evicted, if any.
    fn add<P: PendingKey<K>>(&mut self, hash: u64, key: P, capacity: usize) -> Option<K>
    where
        K: Borrow<P::Q>,
    {
        let Summary {
            counters,
            heap,
            index,
            ..
        } = self;
        if let Some(&c) = index.find(hash, |&c| counters[c as usize].key.borrow() == key.key()) {
            let counter = &mut counters[c as usize];
            counter.count = counter.count.saturating_add(1);
            let at = counter.at as usize;
            sift_down(counters, heap, at);
            return None;
        }
        // Made owned before anything changes, so that a panic in it leaves
        // the summary as it was.
        let key = key.into_owned();
        if counters.len() < capacity {
            // A free counter. Places fit in `u32`: `capacity` is clamped.
            let c = counters.len() as u32;
            let at = heap.len();
            counters.push(Counter {
                key,
                hash,
                count: 1,
                error: 0,
                at: at as u32,
            });
            heap.push(c);
            index.insert_unique(hash, c, |&c| counters[c as usize].hash);
            sift_up(counters, heap, at);
            return None;
        }
        // Every counter is taken: the key takes the smallest one over.
        let &c = heap.first()?;
        let counter = &mut counters[c as usize];
        if let Ok(place) = index.find_entry(counter.hash, |&other| other == c) {
            place.remove();
        }
        let evicted = std::mem::replace(&mut counter.key, key);
        counter.hash = hash;
        counter.error = counter.count;
        counter.count = counter.count.saturating_add(1);
        index.insert_unique(hash, c, |&c| counters[c as usize].hash);
        sift_down(counters, heap, 0);
        Some(evicted)
    }
}

/// Swaps heap places `a` and `b`, keeping each counter's `at`.
fn swap<K>(counters: &mut [Counter<K>], heap: &mut [u32], a: usize, b: usize) {
    heap.swap(a, b);
    counters[heap[a] as usize].at = a as u32;
    counters[heap[b] as usize].at = b as u32;
}

fn count<K>(counters: &[Counter<K>], heap: &[u32], at: usize) -> u64 {
    counters[heap[at] as usize].count
}

/// Moves the counter at heap place `at` down while a child counts less.
fn sift_down<K>(counters: &mut [Counter<K>], heap: &mut [u32], mut at: usize) {
    loop {
        let (left, right) = (2 * at + 1, 2 * at + 2);
        let mut least = at;
        if left < heap.len() && count(counters, heap, left) < count(counters, heap, least) {
            least = left;
        }
        if right < heap.len() && count(counters, heap, right) < count(counters, heap, least) {
            least = right;
        }
        if least == at {
            return;
        }
        swap(counters, heap, at, least);
        at = least;
    }
}

/// Moves the counter at heap place `at` up while its parent counts more.
fn sift_up<K>(counters: &mut [Counter<K>], heap: &mut [u32], mut at: usize) {
    while at > 0 {
        let parent = (at - 1) / 2;
        if count(counters, heap, parent) <= count(counters, heap, at) {
            return;
        }
        swap(counters, heap, at, parent);
        at = parent;
    }
}

/// Records a refused request's key in a [`TopBlocked`]: the visitor an
/// extractor hands its key to on the refusal path (see
/// `KeyExtractor::visit`), so that a key that already holds a counter is
/// looked up by its borrowed form and allocates nothing.
pub(crate) struct Record<'a, K> {
    pub(crate) blocked: &'a TopBlocked<K>,
    /// The refusal's time (ms on the layer's clock).
    pub(crate) now: u64,
}

impl<K: Eq + Hash> KeyVisitor<K> for Record<'_, K> {
    type Output = ();

    fn owned(self, key: K) {
        self.blocked.record(key, self.now);
    }

    fn borrowed<Q>(self, key: &Q, to_owned: fn(&Q) -> K)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.blocked.record_borrowed(key, to_owned, self.now);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Checks a summary's invariants: the heap order, each counter's heap
    /// place, the index, and counts against errors.
    fn check<K: Eq + Hash + std::fmt::Debug>(summary: &Summary<K>) {
        let Summary {
            counters,
            heap,
            index,
            ..
        } = summary;
        assert_eq!(counters.len(), heap.len());
        assert_eq!(index.len(), counters.len());
        for (at, &c) in heap.iter().enumerate() {
            assert_eq!(counters[c as usize].at as usize, at);
            if at > 0 {
                assert!(count(counters, heap, (at - 1) / 2) <= count(counters, heap, at));
            }
        }
        for (c, counter) in counters.iter().enumerate() {
            assert!(counter.error < counter.count, "{:?}", counter.key);
            let found = index.find(counter.hash, |&i| counters[i as usize].key == counter.key);
            assert_eq!(found, Some(&(c as u32)));
        }
    }

    fn summary_of(top: &TopBlocked<u64>, key: u64, period: u64) -> (u64, usize, usize) {
        let hash = top.hasher.hash_one(key);
        let shard = read(top.shard(hash));
        let summary = &shard.ring[slot(period)];
        check(summary);
        (
            summary.period.unwrap_or(u64::MAX),
            summary.counters.capacity(),
            summary.index.allocation_size(),
        )
    }

    #[test]
    fn exact_while_the_counters_suffice() {
        let top = TopBlocked::with_capacity(SHARDS * 64);
        // 60 keys: fewer than one shard's counters, so exact whatever the
        // hash; key k blocked 3k + 1 times, in interleaved order.
        for round in 0..=3 * 59 {
            for k in 0..60u64 {
                if round <= 3 * k {
                    top.record(k, 1_000 + round);
                }
            }
        }
        let got = top.top(usize::MAX, 2_000);
        let want: Vec<(u64, u64)> = (0..60u64).rev().map(|k| (k, 3 * k + 1)).collect();
        assert_eq!(got, want);
        assert_eq!(top.top(5, 2_000), want[..5]);
        assert!(top.top(0, 2_000).is_empty());
    }

    /// The figure of the module notes: what one shard's period takes
    /// with `String` keys, from the capacities it was given.
    #[test]
    fn a_period_of_string_keys_takes_the_documented_bytes() {
        let top: TopBlocked<String> = TopBlocked::new();
        top.record("a".to_owned(), 0);
        let hash = top.hasher.hash_one("a");
        let shard = read(top.shard(hash));
        let summary = &shard.ring[0];
        assert_eq!(std::mem::size_of::<Counter<String>>(), 24 + 32);
        assert_eq!(summary.counters.capacity(), 64);
        assert_eq!(summary.heap.capacity(), 64);
        // hashbrown holds 7/8 of its buckets: 224 of 256.
        assert_eq!(summary.index.capacity(), 224);
        let buckets = 256;
        // Control words: one per bucket, plus one group (16) repeated.
        let index = buckets * std::mem::size_of::<u32>() + buckets + 16;
        let bytes = 64 * (24 + 32) + 64 * 4 + index;
        assert_eq!(bytes, 5_136);
        assert_eq!(bytes * SHARDS * PERIODS / 1024, 481);
    }

    #[test]
    fn nothing_is_made_before_the_first_block() {
        let top: TopBlocked<String> = TopBlocked::new();
        assert!(top.shards.get().is_none());
        assert!(top.top(10, 0).is_empty());
        assert!(top.shards.get().is_none());
    }

    /// A flood of distinct keys in one shard's period: counts stay within
    /// the Space-Saving bound, heavy keys stay on top, and the storage
    /// never grows past what the first block gave it.
    #[test]
    fn a_flood_keeps_its_size_and_the_bound() {
        let top = TopBlocked::with_capacity(SHARDS * 64);
        let heavy = [u64::MAX, u64::MAX - 1, u64::MAX - 2];
        let mut truth: HashMap<u64, u64> = HashMap::new();
        let before: Vec<_> = heavy
            .iter()
            .map(|&k| {
                top.record(k, 0);
                *truth.entry(k).or_default() += 1;
                summary_of(&top, k, 0)
            })
            .collect();
        for i in 0..100_000u64 {
            top.record(i, 5_000);
            *truth.entry(i).or_default() += 1;
            if i % 40 == 0 {
                for (h, &k) in heavy.iter().enumerate() {
                    for _ in 0..=h {
                        top.record(k, 5_000);
                        *truth.entry(k).or_default() += 1;
                    }
                }
            }
        }
        let after: Vec<_> = heavy.iter().map(|&k| summary_of(&top, k, 0)).collect();
        assert_eq!(
            before, after,
            "(period, counter capacity, bytes allocated by the index)"
        );
        assert_eq!(after[0].1, 64);
        let total: u64 = truth.values().sum();
        let got = top.top(usize::MAX, 9_999);
        assert!(got.len() <= SHARDS * 64, "{} keys held", got.len());
        let firsts: Vec<u64> = got[..3].iter().map(|&(k, _)| k).collect();
        assert_eq!(firsts, [u64::MAX - 2, u64::MAX - 1, u64::MAX]);
        for (key, count) in &got {
            let exact = truth[key];
            assert!(*count >= exact, "{key}: {count} < {exact}");
            // Over by at most the smallest count, at most N / c.
            assert!(count - exact <= total / 64, "{key}: {count} for {exact}");
        }
    }

    #[test]
    fn old_periods_drop_out_and_slots_are_reused() {
        // Four counters a shard: however the three keys fall into shards,
        // none is evicted, so the counts are exact.
        let top = TopBlocked::with_capacity(SHARDS * 4);
        top.record(1u64, 0);
        top.record(1, 9_999);
        top.record(2, 10_000);
        assert_eq!(top.top(5, 10_000), [(1, 2), (2, 1)]);
        // Period 0 is covered up to the start of period 6.
        assert_eq!(top.top(5, 59_999), [(1, 2), (2, 1)]);
        assert_eq!(top.top(5, 60_000), [(2, 1)]);
        assert_eq!(top.top(5, 70_000), []);
        // Period 6 reuses period 0's slot, cleared.
        top.record(3, 60_000);
        let mut got = top.top(5, 60_000);
        got.sort_unstable();
        assert_eq!(got, [(2, 1), (3, 1)]);
    }

    #[test]
    fn a_clock_behind_counts_in_the_newest_period() {
        let top = TopBlocked::with_capacity(SHARDS);
        top.record(7u64, 100_000);
        // Behind by more than the minute: counted in period 10, not lost.
        top.record(7, 1_000);
        assert_eq!(top.top(1, 100_000), [(7, 2)]);
        // A reader behind reads at the newest period too.
        assert_eq!(top.top(1, 0), [(7, 2)]);
        assert_eq!(top.top(1, 160_000), []);
    }

    #[test]
    fn merged_periods_never_under_report() {
        // One counter per shard: every new key in a shard's period evicts.
        let top = TopBlocked::with_capacity(SHARDS);
        let mut truth: HashMap<u64, u64> = HashMap::new();
        for (period, keys) in [(0u64, 0..50u64), (1, 25..75), (2, 0..100)] {
            for k in keys {
                for _ in 0..(k % 7 + 1) {
                    top.record(k, period * PERIOD_MS);
                    *truth.entry(k).or_default() += 1;
                }
            }
        }
        for (key, count) in top.top(usize::MAX, 2 * PERIOD_MS) {
            assert!(count >= truth[&key], "{key}: {count} < {}", truth[&key]);
        }
    }

    #[test]
    fn borrowed_keys_find_their_counters() {
        let top: TopBlocked<String> = TopBlocked::new();
        Record {
            blocked: &top,
            now: 5,
        }
        .borrowed("/a", str::to_owned);
        Record {
            blocked: &top,
            now: 6,
        }
        .owned("/a".to_owned());
        assert_eq!(top.top(3, 7), [("/a".to_owned(), 2)]);
    }
}
