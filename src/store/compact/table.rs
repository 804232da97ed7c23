//! `CompactTable`: a fixed-capacity table of keys stored inline next to
//! their admission state, in groups of [`GROUP`] slots with one lock each.
//!
//! # Layout
//!
//! The table is an array of groups, made when the table is built: a
//! group is its read-write lock, two lifetime counters (passes and blocks
//! of every key that has lived in the group, for exporters' counters) and
//! its slots' tags, in its header (64 bytes, one cache line: 4 bytes a
//! slot), and its [`GROUP`] slots, in one block made when the group's
//! first key is inserted: a group no key has used costs its header, not
//! its slots. For the key forms read without the lock (address and text
//! keys), the blocks come from the table's pool (`Blocks`), made 64 at a
//! time and handed out in order, and a group finds its block by a 4-byte
//! index the pool keeps per group (see "Reading a key's slots early"); a
//! group of any other key form keeps its block behind its lock.
//! A slot is its key and the value `V` (one key's admission state).
//! Its tag, a byte in the header (0: empty; otherwise 7 bits of the key's
//! hash with the high bit set), is compared before the key: a lookup
//! compares the 16 tags of a group at once, on the header's cache line,
//! and reads only the slots whose tag matches, so a key that lives in its
//! second group costs no read of its first group's slots.
//!
//! A slot holds its key in the form its key type calls for (`form.rs`),
//! chosen at compile time from `K`:
//!
//! - `Option<String>` (`HeaderKey`'s keys): `AtomicText`, 68 bytes: a
//!   state word (kind, length and version) and sixteen 32-bit atomics
//!   holding a text of up to 64 bytes. A longer text (keys past
//!   `MAX_KEY_BYTES` are already a digest form of at most 100 bytes) is a
//!   `Box<str>` of its own, listed in its group's `Spilled` texts beside
//!   the slots (24 bytes a group, and 256 more once the group has held a
//!   long key). A `String` would cost 24 bytes in the slot and a heap
//!   block besides (80 bytes for 64 bytes of text on glibc: its size
//!   header and the rounding to 16). A slot is 96 bytes, a group's block
//!   1 560 (64 blocks to an allocation, so no allocator's header each):
//!   111 bytes per key at a load of 7/8, whatever the text's length up to
//!   64 bytes.
//! - `Option<IpAddr>` (the address extractors' keys): `AtomicAddr`, the
//!   address in four 32-bit atomics and a state word (kind and version),
//!   20 bytes, as the key and its padding took: a slot is 48 bytes.
//!
//! The groups of both keep their slots beside the lock (`Shared`), where
//! a request reads them without it (see "Lookups without the lock").
//!
//! - Any other type: the key as it is (`Plain<K>`, inline: `Option<Plain<K>>`
//!   costs no byte more than `K` for the key types of the crate's
//!   extractors).
//!
//! Every form is looked up by the same hash of the key (as `K`, or the
//! form a lookup borrows it in): an owned key is compared with a cell in
//! atomics without making a key from it (`KeyCell::probe`); a borrowed one, which
//! only an extractor of its own can give for `Option<String>` keys, with
//! the key made from the slot.
//!
//! A table for keys with further windows (`limit_per`) also keeps, made
//! with it, an array of `further_count` compact windows per slot (the
//! slot's key's further windows, under its group's lock as its value), and
//! as many beside each key of the side map and beside the overflow value;
//! a table without further windows keeps nothing for them.
//!
//! # Placement
//!
//! A key may live in either of two groups, chosen by the two 32-bit halves
//! of a randomly seeded hash of the key (so client-chosen keys cannot be
//! crafted to fall in the same groups). A lookup reads the first group's
//! tags and a word of the second's without a lock (the two header lines
//! are fetched at once), then read-locks the first group, or the second
//! first if the first's tags show no candidate and the second holds keys,
//! comparing tags then keys, then the other. The caller's closure runs
//! with that group's read lock held, so the slot it is given cannot be
//! emptied or reused while it runs. A new key write-locks both groups
//! (lower index first, so two inserts never deadlock), checks again that
//! nobody inserted it meanwhile, and takes an empty slot of the group with
//! more empty slots (the first from the key's home slot, four bits of its
//! hash); with none, an idle slot (as the caller's `idle` judges
//! it) of either group, whose key is dropped and whose value is reset
//! (idleness is asked only when no empty slot will do). Each of the
//! `2 * GROUP` slots of the two groups is examined twice at most: a new key
//! never pays for a scan of the table. With neither, the key is counted on
//! the overflow value, shared by every key that found no room.
//!
//! # Lookups without the lock
//!
//! A request of an address key, or of a text key of up to 64 bytes, that
//! passes at once (no RateLimit fields to answer, no route rule, further
//! window or key with its own limit in the table) takes no lock:
//! `pass_unlocked` (`pass_text_unlocked`) compares the key's candidates
//! in its two groups, records the pass on the slot's window by the
//! window's own compare-and-swap, and checks the slot's key again. Both
//! read-modify-writes of a read lock are spared, which is what a request
//! of a client's key otherwise spent beyond the decision itself, and
//! requests of one key on several cores no longer take turns at its
//! group's lock word. A longer text key is compared, and its text read,
//! only under the group's lock.
//! Anything else (a refusal, a key not found, a slot that changed keys)
//! records nothing and takes the locked lookup.
//!
//! What makes the pass the key's, with no lock keeping the slot:
//!
//! - A slot changes keys only under its group's write lock, with its
//!   window *sealed* first (`SlotValue`): the window's rotation lock taken
//!   and kept, so that every decision begun on it fails its swap. An idle
//!   key is evicted only if the seal is taken from the very head its
//!   idleness was judged on (`CompactWindow::seal_if`): a pass recorded
//!   after the judgement changed the head, the seal fails, and the key
//!   stays. The new key's words, then its state (`Release`), are stored
//!   under the seal; emptying the window unseals it (`Release` store of
//!   the head).
//! - A lookup loads the slot's state (`Acquire`), compares the words,
//!   records its pass by a swap of the head (`AcqRel`), then loads the
//!   state again (`Acquire`). In the head's order, its swap came either
//!   before the seal, and then the seal failed (an eviction) or the
//!   moved value holds the pass (a key given its own limit, see below),
//!   or after the unsealing store, which it read from: the new state,
//!   stored before, is then what its second load sees, so the pass is
//!   refused as the key's. The words it compared were stored before the
//!   state it first loaded, or by a change whose state it then sees.
//! - A pass found not to be the key's stays where it landed (on the
//!   slot's new key, counted once more: stricter for that key, never
//!   looser), and the request is decided again by the locked lookup.
//! - A key moved to the side map (`set_limit`) leaves its slot *vacant*:
//!   its value sealed and copied out, its key marked gone with its
//!   version kept (`PutKey::vacate`). No lookup finds it there any more; a
//!   lookup that found it before records nothing on the sealed window; and
//!   one that recorded its pass before the seal finds the version
//!   unchanged, its pass being in the copy. The slot is taken again as an
//!   empty one, its window still sealed (`SlotValue::seal_vacant`), by a
//!   new key with a new version.
//!
//! The loom models in `compact/mod.rs` run a pass without the lock against
//! an eviction, against another pass at the limit, and against a limit of
//! the key's own, each for address keys and for text keys; a text key is
//! evicted both by a key of its length (its words rewritten under the
//! lookup) and by a long one (spilled beside the slots). The eviction
//! models fail if the second state load is left out, and the one with a
//! key of the same length also if the words are not compared.
//!
//! # Keys with their own limit
//!
//! Keys given a limit of their own (a rule, `set_limit`) live in a side map
//! instead, never evicted and never sent to the overflow value, as in the
//! full key table: a flood of other keys cannot dilute a strict rule. Their
//! number is bounded by the limits the operator sets. The side map is
//! consulted only while it is not empty.
//!
//! # Lock order
//!
//! A group's lock is never taken while another group's lock is held, except
//! for the two groups of one key, taken in index order. The side map's lock
//! is taken with those held (inserts look in the side map again, limit
//! changes move a key between the two), and no group lock is ever taken
//! while the side map's is held. A lookup holds one group lock at a time.
//! A group's spilled texts (`Spilled`, the long text keys) have a lock of
//! their own, taken only with the group's lock held (read under its read
//! lock, written under its write lock) and released before anything else
//! is taken.
//!
//! # Why not one zeroed allocation
//!
//! The crate forbids `unsafe` code, and keys stored inline in a table
//! allocated zeroed (so that its pages become resident only once touched)
//! need it. The slots of a group are allocated instead when its first key
//! arrives: memory still grows with the keys seen, a chunk of 64 blocks at
//! a time.
//!
//! # Reading a key's slots early
//!
//! In a table far larger than the caches (a million clients: 75 000
//! groups, 57 MB of slots for address keys), a lookup of a random key
//! misses twice, one miss after the other: its groups' headers, whose
//! tags say which slot to compare, then that slot. A lookup without the
//! lock (`pass_in`) shortens that: where each group's block is comes from
//! the groups' block indexes (4 bytes a group, 300 kB for a million keys,
//! which stay in a core's cache where the headers do not) and the pool's
//! 64-block chunks (a few kB), so the lookup loads the key's home slot in
//! both of its groups (the slot an insert tries first, four bits of its
//! hash; most keys sit there) while the header lines are still on their
//! way. When the tags then name the home slot, it is in the cache or
//! arriving. The early loads are dropped: they only bring lines in, and
//! the slot is read again, under the key cell's protocol, for its key.
//! The load in the group that does not hold the key is wasted, and the
//! decision's compare-and-swap waits for it as for any earlier load; on
//! a table of a million keys the two together still save most of a miss
//! (`perf/benches/keyed.rs`). A table whose keys fit in a core's cache
//! gains nothing from them, and pays their instructions: the loads are
//! made only once 1 024 groups have taken blocks (`Blocks::spread`).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;

use super::hash::GatherState;

pub(crate) use super::form::GROUP;
use super::form::{
    atomic_addr, atomic_text, At, AtomicAddr, AtomicText, Cell, KeyCell, Plain, SharedCell,
    TextProbe,
};
use super::slots::{Blocks, LockedSlots, PutKey, Shared, SlotValue, Slots, SlotsOf, Store};
use crate::stat::CompactWindow;
use crate::store::registry::{Owned, PendingKey};
use crate::sync::{read, write, AtomicBool, AtomicU64, AtomicUsize, Ordering, RwLock};

/// Lifetime totals of the keys counted in one place (a group, the side map,
/// the overflow value). Relaxed: counters, each read on its own; they only
/// grow. Only the Prometheus collector reads them: built without the
/// `prometheus` feature, nothing is counted and a pass pays no atomic add
/// for them.
#[derive(Debug)]
pub(crate) struct Totals {
    pass: AtomicU64,
    block: AtomicU64,
}

impl Totals {
    fn new() -> Self {
        Totals {
            pass: AtomicU64::new(0),
            block: AtomicU64::new(0),
        }
    }

    #[inline]
    pub(crate) fn add_pass(&self) {
        #[cfg(any(test, feature = "prometheus"))]
        self.pass.fetch_add(1, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn add_block(&self) {
        #[cfg(any(test, feature = "prometheus"))]
        self.block.fetch_add(1, Ordering::Relaxed);
    }

    /// (passes, blocks) so far.
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    pub(crate) fn get(&self) -> (u64, u64) {
        (
            self.pass.load(Ordering::Relaxed),
            self.block.load(Ordering::Relaxed),
        )
    }
}

/// A group of slots, allocated on its first key, in its store `St`. Tags
/// and keys are read under the read lock and written under the write lock
/// (the keys of [`Shared`] groups, address and text keys, are also read
/// without it, see the module docs); a value's
/// atomics are updated by the caller's closure under the read lock, so a
/// slot is never emptied or reused while a request uses it.
///
/// Aligned to a cache line, which its header fills: a lookup's lock and
/// tags are one line. (What the store keeps out of the header, a shared
/// group's block index, is in the [`Groups`]' array beside.)
#[repr(align(64))]
struct Group<St> {
    slots: St,
    tags: Tags,
    totals: Totals,
}

/// A group of `Option<String>` keys, held as [`AtomicText`].
type TextGroup<V> = Group<Shared<AtomicText, V>>;

/// A group of `Option<IpAddr>` keys, held as [`AtomicAddr`].
type AddrGroup<V> = Group<Shared<AtomicAddr, V>>;

/// The store of a group of keys held as they are.
type PlainGroupStore<K, V> = LockedSlots<Option<Plain<K>>, V>;

/// A group of keys held as they are.
type PlainGroup<K, V> = Group<PlainGroupStore<K, V>>;

impl<St> Group<St> {
    fn new<C: Cell, V>() -> Self
    where
        St: Store<C, V>,
    {
        Group {
            slots: St::new(),
            tags: Tags::new(),
            totals: Totals::new(),
        }
    }
}

/// A table's groups of one form: their headers, and what they share
/// (`P`, the store's [`Pool`](Store::Pool)).
struct Groups<'a, St, P> {
    headers: &'a [Group<St>],
    pool: &'a P,
}

impl<St, P> Clone for Groups<'_, St, P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<St, P> Copy for Groups<'_, St, P> {}

impl<'a, St, P> Groups<'a, St, P> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.headers.len()
    }

    /// Group `index`'s slots, read-locked.
    #[inline]
    fn read<C: Cell, V>(&self, index: usize) -> St::Read<'a>
    where
        St: Store<C, V, Pool = P>,
    {
        self.headers[index].slots.read_slots(index, self.pool)
    }

    /// Group `index`'s slots, write-locked.
    fn write<C: Cell, V>(&self, index: usize) -> St::Write<'a>
    where
        St: Store<C, V, Pool = P>,
    {
        self.headers[index].slots.write_slots(index, self.pool)
    }
}

impl<St, P> std::ops::Index<usize> for Groups<'_, St, P> {
    type Output = Group<St>;

    #[inline(always)]
    fn index(&self, index: usize) -> &Group<St> {
        &self.headers[index]
    }
}

/// `n` groups of store `St`, and their pool.
fn new_groups<C: Cell, V, St: Store<C, V>>(n: usize) -> (Box<[Group<St>]>, St::Pool) {
    ((0..n).map(|_| Group::new()).collect(), St::pool(n))
}

/// The tags of a group's slots, a byte each, slot `i` in byte `i % 8` of
/// word `i / 8`: 0 for an empty slot, else `0x80 | (hash & 0x7F)` of its
/// key. Written only under the group's write lock and read under its read
/// lock (or write lock), which order those accesses: the atomics are
/// `Relaxed`. A lookup without the lock (`pass_in`) reads them too, with
/// nothing ordering its read: a tag it reads stale only makes it compare
/// the wrong slots, whose key cells' own protocol then finds nothing (or a
/// key it then proves is still there), and it falls back to the locked
/// lookup.
struct Tags([AtomicU64; 2]);

/// Every byte of a word.
const BYTES: u64 = 0x0101_0101_0101_0101;
/// The high bit of every byte of a word.
const HIGH: u64 = 0x8080_8080_8080_8080;

impl Tags {
    fn new() -> Self {
        Tags([AtomicU64::new(0), AtomicU64::new(0)])
    }

    /// Sets slot `at`'s tag (under the write lock).
    fn set(&self, at: usize, tag: u8) {
        let word = &self.0[at / 8];
        let shift = (at % 8) * 8;
        let bytes = word.load(Ordering::Relaxed);
        word.store(
            (bytes & !(0xFF << shift)) | (u64::from(tag) << shift),
            Ordering::Relaxed,
        );
    }

    /// Slot `at`'s tag (0: vacant).
    fn get(&self, at: usize) -> u8 {
        (self.0[at / 8].load(Ordering::Relaxed) >> ((at % 8) * 8)) as u8
    }

    /// Whether any of the first eight slots holds a key, from one word:
    /// exact under the group's lock, a hint without it.
    #[inline]
    fn some_filled(&self) -> bool {
        self.0[0].load(Ordering::Relaxed) != 0
    }

    /// The slots whose tag is `tag`, bit `i` for slot `i`: exact under
    /// the group's lock; read without it (as a lookup does to choose which
    /// group to search first), a view that may be stale.
    #[inline]
    fn matching(&self, tag: u8) -> u16 {
        let mut slots = 0u16;
        for (w, word) in self.0.iter().enumerate() {
            // Bytes equal to `tag` are the zero bytes of `x`. Per byte,
            // `(b & 0x7F) + 0x7F` sets the high bit exactly when `b & 0x7F`
            // is not 0, and never carries into the next byte; or-ed with
            // `b`, the high bit is set exactly when `b` is not 0.
            let x = word.load(Ordering::Relaxed) ^ (u64::from(tag) * BYTES);
            let zero = !(((x & !HIGH) + !HIGH) | x) & HIGH;
            slots |= u16::from(high_bits(zero)) << (8 * w);
        }
        slots
    }
}

/// The high bit of each byte of `word` (whose other bits are 0), byte `i`'s
/// as bit `i`. Bit `8i` of `word >> 7` times bit `56 - 7j` of the constant
/// lands on bit `56 + 8i - 7j`: on `56 + i` for `j = i`; below 56, each on
/// a place of its own (so nothing carries), for `i < j`; past 63 for
/// `i > j`.
#[inline]
fn high_bits(word: u64) -> u8 {
    ((word >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8
}

/// A key with a limit of its own, in the side map.
pub(crate) struct Own<V> {
    /// The key's limit. Relaxed: read once per request on its own; written
    /// under the side map's write lock.
    limit: AtomicU64,
    /// The key's policy tag, or [`LAPSED`] once its own limit was removed
    /// while its window still held passes and no slot was free (it then
    /// runs on the default limit until it is idle; see
    /// [`CompactTable::remove_limit`]). Relaxed, as `limit`.
    policy: AtomicU64,
    /// The key has had a request (or a window, moved from its slot): until
    /// then the handle does not show it, as a full table shows no entry for
    /// a rule's key before its first request. Relaxed: a flag read alone,
    /// set once.
    seen: AtomicBool,
    value: V,
    /// The key's further windows (`limit_per`); empty without them.
    further: Box<[CompactWindow]>,
}

/// The policy of an [`Own`] entry back on the default limit.
const LAPSED: u64 = u64::MAX;

impl<V> Own<V> {
    fn new(limit: u64, tag: u32, value: V, further: Box<[CompactWindow]>, seen: bool) -> Self {
        Own {
            limit: AtomicU64::new(limit),
            policy: AtomicU64::new(u64::from(tag)),
            seen: AtomicBool::new(seen),
            value,
            further,
        }
    }

    fn seen(&self) -> bool {
        self.seen.load(Ordering::Relaxed)
    }

    /// Marks the key as seen, on its requests: one load once it is.
    #[inline]
    fn see(&self) {
        if !self.seen() {
            self.seen.store(true, Ordering::Relaxed);
        }
    }

    fn lapsed(&self) -> bool {
        self.policy.load(Ordering::Relaxed) == LAPSED
    }
}

/// Where a key is counted, handed to the caller's closure: its value, the
/// lifetime totals it adds to, and the limit and policy it runs on.
pub(crate) struct Place<'a, V> {
    pub(crate) value: &'a V,
    pub(crate) totals: &'a Totals,
    pub(crate) limit: u64,
    /// The key's own policy's tag; `None` on the default limit.
    pub(crate) tag: Option<u32>,
    /// The key found no room and shares the overflow value.
    pub(crate) overflow: bool,
    /// The key's further windows (`limit_per`), in the layer's order;
    /// empty without them.
    pub(crate) further: &'a [CompactWindow],
}

/// `T` on a cache line of its own (64 bytes), so that writes to it (the
/// overflow window during a flood, the count of keys on every insert) do
/// not slow down the reads of the table's fixed fields that every request
/// makes.
#[repr(align(64))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// A text key's lookup ([`CompactTable::text_lookup`]), made once for a
/// request: the key's hash and its probe.
pub(crate) struct TextLookup<'a> {
    text: &'a str,
    hash: u64,
    probe: TextProbe<'a>,
}

/// A fixed-capacity table of keys `K` with a value `V` each; see the module
/// docs.
///
/// `repr(C)`, in this order: the fields every request of an address key
/// reads (the address groups, the hasher, the default limit, the side
/// map's count, then the pool: its first chunk in place, the count of
/// blocks taken, the groups' block indexes) take the table's first two
/// cache lines (the table is 64-byte aligned by its padded fields), so a
/// request touches two lines of the table besides its groups' headers,
/// indexes and slots, and on a table whose keys fit in the first chunk's
/// 64 groups, no other line of the pool. A text key's request reads its
/// groups, indexes and pool further on (the slices and the words do not
/// fit in the first lines).
#[repr(C)]
pub(crate) struct CompactTable<K, V> {
    /// The groups of a table of `Option<IpAddr>` keys, held in atomics
    /// ([`AtomicAddr`]); empty (no allocation) for any other key type.
    addr_groups: Box<[AddrGroup<V>]>,
    hasher: GatherState,
    /// The limit of keys in slots. Relaxed: read once per request on its
    /// own; written by a rules document (`apply`), which a request sees
    /// from its next read, as any limit change.
    default_limit: AtomicU64,
    /// Entries of `own`, so that a lookup skips the side map while it is
    /// empty. Written under the side map's write lock, which is taken with
    /// the key's group locks held (see `set_limit`); read Relaxed before
    /// taking the side map's read lock. A lookup that reads 0 while
    /// `set_limit` moves its key into the side map finds the key in its
    /// group (before the move) or not at all, and then goes to `insert`,
    /// which looks in the side map again under the group locks, after the
    /// move.
    own_count: AtomicUsize,
    /// The address groups' blocks of slots, and which group has which
    /// (with the first chunk, within the table's first two lines).
    addr_blocks: Blocks<AtomicAddr, V>,
    /// Further windows per key (`limit_per`): 0 without them.
    further_count: usize,
    /// At most this many keys in slots (see `occupied`).
    max_keys: usize,
    /// The groups of a table of `Option<String>` keys, held as
    /// [`AtomicText`]; empty for any other key type.
    text_groups: Box<[TextGroup<V>]>,
    /// The groups of a table whose keys are held as they are (neither
    /// `Option<String>` nor `Option<IpAddr>`); empty for those.
    groups: Box<[PlainGroup<K, V>]>,
    /// The text groups' blocks of slots, and which group has which.
    text_blocks: Blocks<AtomicText, V>,
    /// The limit of keys without room. Relaxed, as `default_limit`.
    overflow_limit: AtomicU64,
    /// The further windows of every slot, `further_count` a slot, slot
    /// `at` of group `g` from `(g * GROUP + at) * further_count` on; empty
    /// without further windows, so a layer without them keeps nothing
    /// here. Made with the table. A slot's further windows belong to the
    /// slot's key, under its group's lock as its value: they are cleared
    /// (or filled from the side map) whenever the slot takes a key, and
    /// copied out with the value when a key leaves its slot for the side
    /// map, so an empty slot's further windows are always empty.
    further: Box<[CompactWindow]>,
    /// The overflow value's further windows.
    overflow_further: Box<[CompactWindow]>,
    /// Keys in slots, at most `max_keys`: an insert into an empty slot
    /// first claims one with a compare-and-swap that fails at `max_keys`
    /// (inserts in other groups race for it), and gives it back if it took
    /// no empty slot; emptying a slot gives one back. Relaxed: a count, no
    /// other memory is published through it.
    occupied: Padded<AtomicUsize>,
    overflow: Padded<V>,
    overflow_totals: Padded<Totals>,
    /// Keys with their own limit.
    own: Padded<RwLock<HashMap<K, Own<V>>>>,
    /// Lifetime totals of the keys of the side map.
    own_totals: Padded<Totals>,
    /// Slots examined by inserts and limit changes, for the tests that bound
    /// the work of one insert.
    #[cfg(test)]
    examined: AtomicUsize,
}

/// `n` empty compact windows (no allocation for 0).
fn windows(n: usize) -> Box<[CompactWindow]> {
    (0..n).map(|_| CompactWindow::new()).collect()
}

/// The two groups and the tag of a hash, for a table of `n` groups.
#[inline]
fn place_of(hash: u64, n: usize) -> (usize, usize, u8) {
    // Each 32-bit half scaled to [0, n): independent halves of a keyed
    // hash, so the two groups of a key are independent of each other.
    let scale = |half: u64| ((half * n as u64) >> 32) as usize;
    let first = scale(hash & 0xFFFF_FFFF);
    let second = scale(hash >> 32);
    // The low bits of the first half barely move its group (its high bits
    // decide): a filter mostly independent of the placement.
    let tag = 0x80 | (hash as u8 & 0x7F);
    (first, second, tag)
}

/// Bytes of a group's header (its lock, tags and totals).
#[cfg(test)]
pub(crate) fn group_bytes<St>() -> usize {
    std::mem::size_of::<Group<St>>()
}

/// Groups for `max_keys` keys at a load of at most 7/8.
pub(crate) fn groups_for(max_keys: usize) -> usize {
    let slots = max_keys.saturating_mul(8).div_ceil(7).max(1);
    slots.div_ceil(GROUP)
}

/// The index of the slot among `slots` whose key `is` recognises, of
/// those whose tag matched (`candidates`, from [`Tags::matching`]). A key
/// is in one slot of a group at most.
#[inline(always)]
fn position<C: Cell, V>(
    slots: &Slots<C, V>,
    mut candidates: u16,
    is: impl Fn(&C, At<'_, C::Spill>) -> bool,
) -> Option<usize> {
    while candidates != 0 {
        let at = candidates.trailing_zeros() as usize;
        if is(&slots[at].key, slots.at(at)) {
            return Some(at);
        }
        candidates &= candidates - 1;
    }
    None
}

/// The key with hash `hash` that `is` recognises among its candidates
/// (slots whose tag matches), searched in its two groups of `groups`:
/// the group's index, its slots read-locked, and the slot's index.
///
/// Which group is searched first is read before either lock is taken:
/// the first group's tags and one word of the second's, so that the two
/// header lines are fetched at once. A lock's acquisition is a full
/// barrier on x86-64: a search that locked the first group before it read
/// anything of the second waited for one cache miss after the other, and
/// a key living in its second group (about half of them in a full table)
/// paid both. The second group goes first when the first's tags show no
/// candidate and the second holds keys. This only orders the search,
/// which compares tags and keys under each group's lock, both groups if
/// need be. The first group's tags as read early serve its search: a key
/// they miss because it was inserted since is found by the insert, which
/// searches both groups again under their write locks.
#[inline(always)]
fn search<'a, C: Cell, V, St: Store<C, V>>(
    groups: Groups<'a, St, St::Pool>,
    hash: u64,
    is: impl Fn(&C, At<'_, C::Spill>) -> bool,
) -> Option<(usize, St::Read<'a>, usize)> {
    let (first, second, tag) = place_of(hash, groups.len());
    let in_first = groups[first].tags.matching(tag);
    let second_filled = groups[second].tags.some_filled();
    let (nearer, further) = if (in_first == 0) & second_filled {
        (second, first)
    } else {
        (first, second)
    };
    for index in [nearer, further] {
        let group = &groups[index];
        let slots = groups.read(index);
        if let Some(at) = slots.slots().and_then(|held| {
            let candidates = if index == first {
                in_first
            } else {
                group.tags.matching(tag)
            };
            // A closure of its own, not `&is`: handed on by reference, the
            // predicate made a header key's lookup 22 instructions longer
            // (`perf/counts/layer.rs`).
            position(held, candidates, |k, at| is(k, at))
        }) {
            return Some((index, slots, at));
        }
        if first == second {
            break;
        }
    }
    None
}

/// A key's home slot in either of its groups: four bits of its hash that
/// neither its tag (the low seven) nor its groups (the high bits of each
/// half, which the scaling keeps) are made of.
#[inline]
fn home_of(hash: u64) -> usize {
    (hash >> 7) as usize % GROUP
}

/// Write-locks groups `a` and `b` of `groups` (once if they are the same),
/// the lower index first.
fn lock_pair<'a, C: Cell, V, St: Store<C, V>>(
    groups: Groups<'a, St, St::Pool>,
    a: usize,
    b: usize,
) -> Locked<St::Write<'a>> {
    let (low, high) = (a.min(b), a.max(b));
    let first = (low, groups.write(low));
    if high == low {
        Locked::One([first])
    } else {
        Locked::Two([first, (high, groups.write(high))])
    }
}

/// A key's one or two groups, write-locked (guards `W`), as (index, guard)
/// pairs in index order: a slice without an allocation, which every
/// insert makes.
enum Locked<W> {
    One([(usize, W); 1]),
    Two([(usize, W); 2]),
}

impl<W> std::ops::Deref for Locked<W> {
    type Target = [(usize, W)];

    fn deref(&self) -> &Self::Target {
        match self {
            Locked::One(one) => one,
            Locked::Two(two) => two,
        }
    }
}

impl<W> std::ops::DerefMut for Locked<W> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Locked::One(one) => one,
            Locked::Two(two) => two,
        }
    }
}

/// Runs `$body` with `$groups` bound to the table's groups, in the form
/// its key type is held in (a choice folded away at compile time: see
/// [`atomic_text`] and [`atomic_addr`]).
macro_rules! on_groups {
    ($table:expr, |$groups:ident| $body:expr) => {
        if atomic_text::<K>() {
            let $groups = $table.text();
            $body
        } else if atomic_addr::<K>() {
            let $groups = $table.addr();
            $body
        } else {
            let $groups = $table.plain();
            $body
        }
    };
}

impl<K, V: SlotValue> CompactTable<K, V> {
    /// The address groups (empty for other key types).
    #[inline(always)]
    fn addr(&self) -> Groups<'_, Shared<AtomicAddr, V>, Blocks<AtomicAddr, V>> {
        Groups {
            headers: &self.addr_groups,
            pool: &self.addr_blocks,
        }
    }

    /// The text groups (empty for other key types).
    #[inline(always)]
    fn text(&self) -> Groups<'_, Shared<AtomicText, V>, Blocks<AtomicText, V>> {
        Groups {
            headers: &self.text_groups,
            pool: &self.text_blocks,
        }
    }

    /// The groups of keys held as they are (empty for address and text
    /// keys).
    #[inline(always)]
    fn plain(&self) -> Groups<'_, PlainGroupStore<K, V>, ()> {
        Groups {
            headers: &self.groups,
            pool: &(),
        }
    }
}

impl<K: Eq + Hash + Clone + Send + Sync + 'static, V: SlotValue> CompactTable<K, V> {
    /// A table for at most `max_keys` keys in slots, plus the keys of
    /// `rules` with their own limit; keys without a slot are counted on the
    /// overflow value under `overflow_limit`.
    pub(crate) fn new(
        max_keys: usize,
        default_limit: u64,
        overflow_limit: u64,
        rules: &HashMap<K, u64>,
        further_count: usize,
    ) -> Self {
        // A group's block is found by a 32-bit index: at most
        // `u32::MAX - 1` groups (60 billion keys, far beyond any memory),
        // the rest of such a `max_keys` counted on the overflow value.
        let n = groups_for(max_keys).min(u32::MAX as usize - 1);
        let hasher = GatherState::new();
        let own: HashMap<K, Own<V>> = rules
            .iter()
            .map(|(key, &limit)| {
                let tag = hasher.hash_key(key) as u32;
                let further = windows(further_count);
                (
                    key.clone(),
                    Own::new(limit, tag, V::empty(), further, false),
                )
            })
            .collect();
        let (text, addr) = (atomic_text::<K>(), atomic_addr::<K>());
        let count = |this: bool| if this { n } else { 0 };
        let (addr_groups, addr_blocks) = new_groups(count(addr));
        let (text_groups, text_blocks) = new_groups(count(text));
        let (groups, ()) = new_groups(count(!text && !addr));
        CompactTable {
            addr_groups,
            addr_blocks,
            text_groups,
            text_blocks,
            groups,
            hasher,
            occupied: Padded(AtomicUsize::new(0)),
            max_keys,
            default_limit: AtomicU64::new(default_limit),
            overflow_limit: AtomicU64::new(overflow_limit),
            overflow: Padded(V::empty()),
            overflow_totals: Padded(Totals::new()),
            own_count: AtomicUsize::new(own.len()),
            own: Padded(RwLock::new(own)),
            own_totals: Padded(Totals::new()),
            further_count,
            further: windows(n * GROUP * further_count),
            overflow_further: windows(further_count),
            #[cfg(test)]
            examined: AtomicUsize::new(0),
        }
    }

    /// Number of slots.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn capacity(&self) -> usize {
        self.group_count() * GROUP
    }

    /// Number of groups.
    #[inline]
    fn group_count(&self) -> usize {
        on_groups!(self, |groups| groups.len())
    }

    /// The overflow value, its totals and limit.
    pub(crate) fn overflow_place(&self) -> Place<'_, V> {
        Place {
            value: &self.overflow.0,
            totals: &self.overflow_totals.0,
            limit: self.overflow_limit.load(Ordering::Relaxed),
            tag: None,
            overflow: true,
            further: &self.overflow_further,
        }
    }

    fn own_place<'a>(&'a self, own: &'a Own<V>) -> Place<'a, V> {
        let policy = own.policy.load(Ordering::Relaxed);
        Place {
            value: &own.value,
            totals: &self.own_totals.0,
            limit: own.limit.load(Ordering::Relaxed),
            tag: (policy != LAPSED).then_some(policy as u32),
            overflow: false,
            further: &own.further,
        }
    }

    /// The place of slot `at` of group `index` (whose totals are
    /// `totals`).
    #[inline]
    fn slot_place<'a, S: Cell>(
        &'a self,
        totals: &'a Totals,
        slots: &'a Slots<S, V>,
        index: usize,
        at: usize,
    ) -> Place<'a, V> {
        Place {
            value: &slots[at].value,
            totals,
            limit: self.default_limit.load(Ordering::Relaxed),
            tag: None,
            overflow: false,
            further: self.further_of(index, at),
        }
    }

    /// The further windows of slot `at` of group `index` (empty without
    /// further windows: one predictable branch).
    #[inline]
    fn further_of(&self, index: usize, at: usize) -> &[CompactWindow] {
        if self.further_count == 0 {
            return &[];
        }
        let from = (index * GROUP + at) * self.further_count;
        &self.further[from..from + self.further_count]
    }

    /// Empties slot `at` of group `index`'s further windows, for a key that
    /// takes the slot (under the group's write lock).
    fn clear_further(&self, index: usize, at: usize) {
        self.further_of(index, at)
            .iter()
            .for_each(CompactWindow::clear);
    }

    /// Calls `f` with the place `key` is counted in, inserting the key if
    /// it is new (the owned key is made only then). `idle` judges whether a
    /// slot's key may be evicted to make room; it is asked with the slot's
    /// group write-locked, so no request is using the slot.
    ///
    /// `f` runs with the lock of the key's group held (for reading, or for
    /// writing when the key was just inserted) or the side map's read lock:
    /// the place stays the key's until `f` returns. It must not call back
    /// into the table.
    #[inline]
    pub(crate) fn with<P: PendingKey<K>, R>(
        &self,
        pending: P,
        idle: impl Fn(&V, &[CompactWindow]) -> bool,
        f: impl FnOnce(Place<'_, V>) -> R,
    ) -> R
    where
        K: Borrow<P::Q>,
    {
        on_groups!(self, |groups| self.with_in(
            groups,
            pending,
            idle,
            false,
            false,
            |place, _| f(place)
        ))
    }

    /// [`with`](Self::with), with the key as the table holds it: `f` gets
    /// `Some(key)` for a key in a slot or the side map (for a key held in
    /// another form than `K`, the request's own key when it is owned, else
    /// one made from the slot); for a key sent to the overflow value,
    /// `Some` of the owned key when `key_on_overflow` (made for the call:
    /// an allocation for a borrowed key), else `None`.
    #[inline]
    pub(crate) fn with_keyed<P: PendingKey<K>, R>(
        &self,
        pending: P,
        idle: impl Fn(&V, &[CompactWindow]) -> bool,
        key_on_overflow: bool,
        f: impl FnOnce(Place<'_, V>, Option<&K>) -> R,
    ) -> R
    where
        K: Borrow<P::Q>,
    {
        on_groups!(self, |groups| self.with_in(
            groups,
            pending,
            idle,
            true,
            key_on_overflow,
            f
        ))
    }

    /// [`with`](Self::with) for an owned key of a table that holds keys as
    /// they are or in atomics (not `Option<String>`), with no key in its
    /// side map (the caller checks [`has_own`](Self::has_own), as for
    /// [`with_text`](Self::with_text)): the hash inlined and the search
    /// comparing the key as it is, the key moved into its slot only if
    /// inserted.
    #[cfg(test)]
    pub(crate) fn with_owned<R>(
        &self,
        key: K,
        idle: impl Fn(&V, &[CompactWindow]) -> bool,
        f: impl FnOnce(Place<'_, V>) -> R,
    ) -> R {
        let hash = self.hash_owned(&key);
        self.with_hashed(key, hash, idle, f)
    }

    /// The hash [`with_hashed`](Self::with_hashed) and
    /// [`pass_unlocked`](Self::pass_unlocked) take, made once for both
    /// (inlined: the key is hashed where the request has it); 0, unused,
    /// for a table of `Option<String>` keys.
    #[inline(always)]
    pub(crate) fn hash_owned(&self, key: &K) -> u64 {
        if atomic_text::<K>() {
            return 0;
        }
        self.hasher.hash_inline(key)
    }

    /// [`with_owned`](Self::with_owned), with the key's
    /// [`hash_owned`](Self::hash_owned).
    #[inline]
    pub(crate) fn with_hashed<R>(
        &self,
        key: K,
        hash: u64,
        idle: impl Fn(&V, &[CompactWindow]) -> bool,
        f: impl FnOnce(Place<'_, V>) -> R,
    ) -> R {
        if atomic_text::<K>() {
            return self.with(Owned(key), idle, f);
        }
        if atomic_addr::<K>() {
            let probe = <AtomicAddr as KeyCell<K>>::probe(&key);
            return self.with_found(
                self.addr(),
                key,
                hash,
                |held: &AtomicAddr, at, key| KeyCell::<K>::is(held, at, probe.as_ref(), key),
                idle,
                f,
            );
        }
        self.with_found(
            self.plain(),
            key,
            hash,
            |held: &Option<Plain<K>>, _, key| held.as_ref().is_some_and(|held| held.0 == *key),
            idle,
            f,
        )
    }

    /// [`with_hashed`](Self::with_hashed) on `groups`, whose cells `is`
    /// compares with the key: the key's place if a slot holds it, else
    /// the place the key is inserted in.
    #[inline(always)]
    fn with_found<C: KeyCell<K>, St: Store<C, V>, R>(
        &self,
        groups: Groups<'_, St, St::Pool>,
        key: K,
        hash: u64,
        is: impl Fn(&C, At<'_, C::Spill>, &K) -> bool,
        idle: impl Fn(&V, &[CompactWindow]) -> bool,
        f: impl FnOnce(Place<'_, V>) -> R,
    ) -> R {
        if let Some((index, slots, at)) = search(groups, hash, |held, at| is(held, at, &key)) {
            let slots = slots
                .slots()
                .expect("`search` found the key in these slots");
            return f(self.slot_place(&groups[index].totals, slots, index, at));
        }
        self.insert(groups, Owned(key), hash, idle, false, false, |place, _| {
            f(place)
        })
    }

    /// One pass for `key` (of hash [`hash_owned`](Self::hash_owned))
    /// without the group's lock, for a table of `Option<IpAddr>` keys with
    /// no key in its side map: if the key is in a slot and `attempt`
    /// records a pass on its value under the default limit, the totals of
    /// the key's group, once the pass is proven the key's (see the module
    /// docs, "Lookups without the lock"). `None` when the key is not found,
    /// when `attempt` records nothing, or when the slot changed keys
    /// meanwhile (the pass then counts against the slot's new key, and the
    /// caller decides the request again by the locked path).
    #[inline(always)]
    pub(crate) fn pass_unlocked(
        &self,
        key: &K,
        hash: u64,
        attempt: impl FnOnce(&V, u64) -> bool,
    ) -> Option<&Totals> {
        if !atomic_addr::<K>() {
            return None;
        }
        let bits = <AtomicAddr as KeyCell<K>>::probe(key)?;
        Self::pass_in(self.addr(), &bits, hash, &self.default_limit, attempt)
    }

    /// [`pass_unlocked`](Self::pass_unlocked) for a text key of a table of
    /// `Option<String>` keys, with its [`text_lookup`](Self::text_lookup).
    /// Always `None` for a text longer than 64 bytes, which is compared
    /// only under the lock.
    #[inline(always)]
    pub(crate) fn pass_text_unlocked(
        &self,
        lookup: &TextLookup<'_>,
        attempt: impl FnOnce(&V, u64) -> bool,
    ) -> Option<&Totals> {
        if !atomic_text::<K>() {
            return None;
        }
        Self::pass_in(
            self.text(),
            &lookup.probe,
            lookup.hash,
            &self.default_limit,
            attempt,
        )
    }

    /// The pass without the lock of [`pass_unlocked`](Self::pass_unlocked)
    /// on `groups`, for the key `probe` of hash `hash`.
    #[inline(always)]
    fn pass_in<'t, C: SharedCell>(
        groups: Groups<'t, Shared<C, V>, Blocks<C, V>>,
        probe: &C::Seen<'_>,
        hash: u64,
        default_limit: &AtomicU64,
        attempt: impl FnOnce(&V, u64) -> bool,
    ) -> Option<&'t Totals> {
        let (first, second, tag) = place_of(hash, groups.len());
        let slots_of = |index: usize| groups.pool.get(index);
        if groups.pool.spread() {
            // A load of the key's home slot in both groups, before the
            // headers' tags, so that the home slots' lines are fetched with
            // the header lines rather than after them (see "Reading a key's
            // slots early" in the module docs).
            let home = home_of(hash);
            for index in [first, second] {
                if let Some(slots) = slots_of(index) {
                    slots[home].touch();
                }
            }
        }
        let in_first = groups[first].tags.matching(tag);
        let in_second = groups[second].tags.matching(tag);
        for (index, mut candidates) in [(first, in_first), (second, in_second)] {
            let group = &groups.headers[index];
            if let Some(slots) = slots_of(index).filter(|_| candidates != 0) {
                while candidates != 0 {
                    let at = candidates.trailing_zeros() as usize;
                    let slot = &slots[at];
                    if let Some(seen) = slot.key.seen(probe) {
                        let limit = default_limit.load(Ordering::Relaxed);
                        let valid = attempt(&slot.value, limit) && slot.key.unchanged(seen);
                        return valid.then_some(&group.totals);
                    }
                    candidates &= candidates - 1;
                }
            }
            if first == second {
                break;
            }
        }
        None
    }

    /// The lookup of the text key `Some(text)`: its hash and probe, made
    /// once for [`pass_text_unlocked`](Self::pass_text_unlocked) and
    /// [`with_text`](Self::with_text).
    #[inline(always)]
    pub(crate) fn text_lookup<'a>(&self, text: &'a str) -> TextLookup<'a> {
        if !atomic_text::<K>() {
            return TextLookup {
                text,
                hash: 0,
                probe: TextProbe::of(None),
            };
        }
        // `Option<&str>` hashes as `Option<String>`: the discriminant, then
        // the text's bytes and terminator.
        TextLookup {
            text,
            hash: self.hasher.hash_inline(&Some(text)),
            probe: TextProbe::of(Some(text)),
        }
    }

    /// [`with`](Self::with) for the key `Some(text)` of a table of
    /// `Option<String>` keys (`lookup`, its
    /// [`text_lookup`](Self::text_lookup)), the text lent: compared with
    /// the texts the slots hold as it is, the key made (`to_key`) only to
    /// be inserted. For a table with no key in its side map: the caller
    /// checks [`has_own`](Self::has_own) first (a key moved there since is
    /// found by `insert`, which looks in the side map under the group
    /// locks, as for `with`).
    #[inline]
    pub(crate) fn with_text<R>(
        &self,
        lookup: &TextLookup<'_>,
        to_key: impl FnOnce(&str) -> K,
        idle: impl Fn(&V, &[CompactWindow]) -> bool,
        f: impl FnOnce(Place<'_, V>) -> R,
    ) -> R {
        if !atomic_text::<K>() {
            // Not a table of `Option<String>` keys (the callers' key type
            // is): the key is made and looked up as it is.
            return self.with(Owned(to_key(lookup.text)), idle, f);
        }
        let groups = self.text();
        let found = search(groups, lookup.hash, |held: &AtomicText, at| {
            held.is_text(at, &lookup.probe)
        });
        if let Some((index, slots, at)) = found {
            let slots = slots
                .slots()
                .expect("`search` found the key in these slots");
            return f(self.slot_place(&groups[index].totals, slots, index, at));
        }
        let pending = Owned(to_key(lookup.text));
        self.insert(
            groups,
            pending,
            lookup.hash,
            idle,
            false,
            false,
            |place, _| f(place),
        )
    }

    /// Whether any key has its own limit (is in the side map).
    #[inline]
    pub(crate) fn has_own(&self) -> bool {
        self.own_count.load(Ordering::Relaxed) != 0
    }

    /// [`with`](Self::with) and [`with_keyed`](Self::with_keyed) (`keyed`)
    /// on the table's `groups`.
    #[inline]
    fn with_in<C: KeyCell<K>, St: Store<C, V>, P: PendingKey<K>, R>(
        &self,
        groups: Groups<'_, St, St::Pool>,
        pending: P,
        idle: impl Fn(&V, &[CompactWindow]) -> bool,
        keyed: bool,
        key_on_overflow: bool,
        f: impl FnOnce(Place<'_, V>, Option<&K>) -> R,
    ) -> R
    where
        K: Borrow<P::Q>,
    {
        let key = pending.key();
        if self.has_own() {
            let own = read(&self.own.0);
            if let Some((owned, own)) = own.get_key_value(key) {
                own.see();
                return f(self.own_place(own), Some(owned));
            }
        }
        // `K: Borrow<Q>` promises that `Q` hashes as `K` does.
        let hash = self.hasher.hash_key(key);
        let request_key = pending.as_key();
        let probe = request_key.and_then(C::probe);
        if let Some((index, slots, at)) = search(groups, hash, |held: &C, at| {
            held.is(at, probe.as_ref(), key)
        }) {
            let slots = slots
                .slots()
                .expect("`search` found the key in these slots");
            let shown = if keyed {
                slots[at].key.shown(slots.at(at), request_key)
            } else {
                None
            };
            return f(
                self.slot_place(&groups[index].totals, slots, index, at),
                shown.as_deref(),
            );
        }
        drop(probe);
        self.insert(groups, pending, hash, idle, keyed, key_on_overflow, f)
    }

    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn insert<C: KeyCell<K>, St: Store<C, V>, P: PendingKey<K>, R>(
        &self,
        groups: Groups<'_, St, St::Pool>,
        pending: P,
        hash: u64,
        idle: impl Fn(&V, &[CompactWindow]) -> bool,
        keyed: bool,
        key_on_overflow: bool,
        f: impl FnOnce(Place<'_, V>, Option<&K>) -> R,
    ) -> R
    where
        K: Borrow<P::Q>,
    {
        let key = pending.key();
        let (first, second, tag) = place_of(hash, groups.len());
        let mut locked = lock_pair(groups, first, second);
        // Another request may have inserted the key, or `set_limit` moved
        // it to the side map, since the lookup.
        let request_key = pending.as_key();
        let probe = request_key.and_then(C::probe);
        for (index, slots) in locked.iter() {
            if let Some((slots, at)) = slots.slots().and_then(|slots| {
                let candidates = groups[*index].tags.matching(tag);
                Some((
                    slots,
                    position(slots, candidates, |k, at| k.is(at, probe.as_ref(), key))?,
                ))
            }) {
                let shown = if keyed {
                    slots[at].key.shown(slots.at(at), request_key)
                } else {
                    None
                };
                let totals = &groups[*index].totals;
                return f(self.slot_place(totals, slots, *index, at), shown.as_deref());
            }
        }
        drop(probe);
        if self.has_own() {
            let own = read(&self.own.0);
            if let Some((owned, own)) = own.get_key_value(key) {
                own.see();
                return f(self.own_place(own), Some(owned));
            }
        }
        let room = self.claim();
        let Some((which, at)) =
            self.free_slot(groups, &mut locked, first, home_of(hash), room, &idle)
        else {
            self.unclaim(room);
            if key_on_overflow {
                let owned = pending.into_owned();
                return f(self.overflow_place(), Some(&owned));
            }
            return f(self.overflow_place(), None);
        };
        // The slot's value is sealed (an idle key's, by `free_slot`) or the
        // slot is vacant (tag 0).
        let index = locked[which].0;
        let evicted = groups[index].tags.get(at) != 0;
        // The key in its slot's form, made before the slot is touched.
        let mut owned = Some(pending.into_owned());
        let Some(stored) = C::store(&mut owned) else {
            // A cell takes every key of its table's type: not reached.
            if let Some(slots) = locked[which].1.slots() {
                slots[at].value.reset();
            }
            self.unclaim(room);
            return f(
                self.overflow_place(),
                owned.as_ref().filter(|_| key_on_overflow),
            );
        };
        if evicted {
            self.unclaim(room);
        } else if let Some(slots) = locked[which].1.slots() {
            slots[at].value.seal_vacant();
        }
        let slots = locked[which].1.put(at, Some(stored));
        // Evicted: its key is dropped above, its value emptied (unsealed)
        // here, and its further windows (idle as its value) emptied.
        slots[at].value.reset();
        if evicted {
            self.clear_further(index, at);
        }
        groups[index].tags.set(at, tag);
        let slots = locked[which].1.slots().expect("allocated above");
        let shown = if keyed {
            slots[at].key.shown(slots.at(at), None)
        } else {
            None
        };
        f(
            self.slot_place(&groups[index].totals, slots, index, at),
            shown.as_deref(),
        )
    }

    /// Claims room for one more key in a slot; whether there was room.
    fn claim(&self) -> bool {
        self.occupied
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_keys).then_some(n + 1)
            })
            .is_ok()
    }

    /// Gives back the room [`claim`](Self::claim) took (if it took any),
    /// for a key that took no empty slot.
    fn unclaim(&self, claimed: bool) {
        if claimed {
            self.occupied.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// A slot for a new key in the `locked` groups: an empty one of the
    /// group with more empty slots, the key's `first` group on a tie (if
    /// `room`: the table holds fewer than `max_keys` keys), else an idle
    /// one, as (index in `locked`, slot). A lookup reads the first group
    /// first: a key found there takes one read lock, in its second group
    /// two.
    /// Idleness is asked only when no empty slot will do: judging a key
    /// reads its window at the request's clock reading. An idle slot is
    /// returned with its value sealed (see [`SlotValue`]). Examines each
    /// slot of the two groups twice at most (its tag, then its idleness).
    fn free_slot<C: Cell, St: Store<C, V>>(
        &self,
        groups: Groups<'_, St, St::Pool>,
        locked: &mut [(usize, St::Write<'_>)],
        first: usize,
        home: usize,
        room: bool,
        idle: &impl Fn(&V, &[CompactWindow]) -> bool,
    ) -> Option<(usize, usize)> {
        if room {
            // (empty slots, index in `locked`, first empty slot)
            let mut best: Option<(usize, usize, usize)> = None;
            // The key's first group first: a tie goes to it.
            let order = match locked {
                [(low, _), _] if *low != first => [1, 0],
                _ => [0, 1],
            };
            for which in order.into_iter().filter(|&which| which < locked.len()) {
                let (index, slots) = &locked[which];
                let (empties, first) = match slots.slots() {
                    // A group no key has used: every slot is empty.
                    None => {
                        #[cfg(test)]
                        self.examined.fetch_add(1, Ordering::Relaxed);
                        (GROUP, home)
                    }
                    Some(_) => {
                        #[cfg(test)]
                        self.examined.fetch_add(GROUP, Ordering::Relaxed);
                        // The empty slots are the tags of 0: counted, and
                        // the first from the key's home on found, on the
                        // header's line, without reading the slots.
                        let empty = groups[*index].tags.matching(0);
                        let from_home = empty.rotate_right(home as u32);
                        let first = (from_home != 0)
                            .then(|| (home + from_home.trailing_zeros() as usize) % GROUP);
                        (empty.count_ones() as usize, first.unwrap_or(home))
                    }
                };
                if empties > 0 && best.is_none_or(|(most, _, _)| empties > most) {
                    best = Some((empties, which, first));
                }
            }
            if let Some((_, which, at)) = best {
                return Some((which, at));
            }
        }
        for (which, (index, slots)) in locked.iter().enumerate() {
            let Some(slots) = slots.slots() else {
                continue;
            };
            // From the key's home on: a scan from the group's first slot
            // would pass over the same busy keys every time, as the idle
            // ones it evicts near the front are taken by new, busy keys.
            for at in (0..GROUP).map(|i| (home + i) % GROUP) {
                let slot = &slots[at];
                #[cfg(test)]
                self.examined.fetch_add(1, Ordering::Relaxed);
                // A key is idle only when every window of it is. Sealed
                // with the judgement: no pass recorded since counts on it.
                let further = self.further_of(*index, at);
                let filled = groups[*index].tags.get(at) != 0;
                if filled && slot.value.seal_if(|value| idle(value, further)) {
                    return Some((which, at));
                }
            }
        }
        None
    }

    // --- reads -----------------------------------------------------------

    /// Calls `f` with `key`'s place if the key has one (in a slot or the
    /// side map; the overflow value is nobody's), under its lock.
    #[cfg_attr(not(all(test, loom)), allow(dead_code))]
    pub(crate) fn get<Q, R>(&self, key: &Q, f: impl FnOnce(Place<'_, V>) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get_keyed(key, |_, place| f(place))
    }

    /// [`get`](Self::get), with the key as the table holds it.
    pub(crate) fn get_keyed<Q, R>(
        &self,
        key: &Q,
        f: impl FnOnce(&K, Place<'_, V>) -> R,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.has_own() {
            let own = read(&self.own.0);
            if let Some((owned, own)) = own.get_key_value(key) {
                return own.seen().then(|| f(owned, self.own_place(own)));
            }
        }
        let hash = self.hasher.hash_key(key);
        on_groups!(self, |groups| {
            let (index, slots, at) = search(groups, hash, |held, at| {
                KeyCell::<K>::is(held, at, None, key)
            })?;
            let slots = slots
                .slots()
                .expect("`search` found the key in these slots");
            let owned = KeyCell::<K>::key(&slots[at].key, slots.at(at))?;
            let place = self.slot_place(&groups[index].totals, slots, index, at);
            Some(f(&owned, place))
        })
    }

    /// Calls `read_one` with every key that has a place and its place, and
    /// `f` with what `read_one` made of it, a group (or the side map) at a
    /// time: `read_one` runs under the group's read lock (it should copy
    /// what it needs: a clone of the key, a few counts), `f` with no lock
    /// held, so a slow `f` delays no request.
    pub(crate) fn for_each<T>(
        &self,
        mut read_one: impl FnMut(&K, Place<'_, V>) -> T,
        mut f: impl FnMut(T),
    ) {
        let mut buffer = Vec::new();
        {
            let own = read(&self.own.0);
            buffer.extend(
                own.iter()
                    .filter(|(_, o)| o.seen())
                    .map(|(k, o)| read_one(k, self.own_place(o))),
            );
        }
        buffer.drain(..).for_each(&mut f);
        on_groups!(self, |groups| {
            for index in 0..groups.len() {
                let group = &groups[index];
                {
                    let slots = groups.read(index);
                    let Some(slots) = slots.slots() else {
                        continue;
                    };
                    for (at, slot) in slots.iter().enumerate() {
                        if group.tags.get(at) == 0 {
                            // Vacant (a shared slot keeps the key it had).
                            continue;
                        }
                        if let Some(key) = KeyCell::<K>::key(&slot.key, slots.at(at)) {
                            let place = self.slot_place(&group.totals, slots, index, at);
                            buffer.push(read_one(&key, place));
                        }
                    }
                }
                buffer.drain(..).for_each(&mut f);
            }
        })
    }

    /// Keys in slots, and keys in the side map that have had a request.
    pub(crate) fn len(&self) -> usize {
        let seen = read(&self.own.0).values().filter(|o| o.seen()).count();
        self.occupied.load(Ordering::Relaxed) + seen
    }

    /// Keys held: in slots and in the side map, seen or not.
    #[cfg(test)]
    fn stored(&self) -> usize {
        self.occupied.load(Ordering::Relaxed) + read(&self.own.0).len()
    }

    /// Lifetime (passes, blocks) of every key ever counted in a slot or the
    /// side map, evicted keys' included (the overflow value's apart, in
    /// [`overflow_place`](Self::overflow_place)).
    #[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
    pub(crate) fn keys_totals(&self) -> (u64, u64) {
        let mut sum = (0u64, 0u64);
        let mut add = |(p, b): (u64, u64)| {
            sum.0 = sum.0.saturating_add(p);
            sum.1 = sum.1.saturating_add(b);
        };
        on_groups!(self, |groups| groups
            .headers
            .iter()
            .for_each(|g| add(g.totals.get())));
        add(self.own_totals.get());
        sum
    }

    // --- limits ----------------------------------------------------------

    /// Gives `key` its own `limit`: the key moves to the side map with its
    /// value (passes already counted stay counted), or its limit there
    /// changes. `idle` judges side map entries back on the default limit,
    /// which are dropped once idle (see [`remove_limit`](Self::remove_limit)).
    pub(crate) fn set_limit(
        &self,
        key: K,
        limit: u64,
        idle: impl Fn(&V, &[CompactWindow]) -> bool,
    ) {
        on_groups!(self, |groups| self.set_limit_in(groups, key, limit, idle))
    }

    /// [`set_limit`](Self::set_limit) on the table's `groups`.
    fn set_limit_in<C: KeyCell<K>, St: Store<C, V>>(
        &self,
        groups: Groups<'_, St, St::Pool>,
        key: K,
        limit: u64,
        idle: impl Fn(&V, &[CompactWindow]) -> bool,
    ) {
        let hash = self.hasher.hash_key(&key);
        let (first, second, tag) = place_of(hash, groups.len());
        let mut locked = lock_pair(groups, first, second);
        let mut own = write(&self.own.0);
        if let Some(entry) = own.get(&key) {
            entry.limit.store(limit, Ordering::Relaxed);
            entry
                .policy
                .store(u64::from(hash as u32), Ordering::Relaxed);
        } else {
            let further = windows(self.further_count);
            let taken = self.take(groups, &mut locked, tag, &key, &further);
            let seen = taken.is_some();
            let value = taken.unwrap_or_else(V::empty);
            own.insert(key, Own::new(limit, hash as u32, value, further, seen));
        }
        own.retain(|_, entry| !(entry.lapsed() && idle(&entry.value, &entry.further)));
        self.own_count.store(own.len(), Ordering::Relaxed);
    }

    /// Removes `key`'s own limit: the key runs on the default limit again.
    /// A key that has had no request just leaves the side map. Otherwise
    /// its value goes back to a slot of its groups (an empty one if the
    /// table has room, else an idle one), so its passes stay counted; if
    /// none is free, it stays in the side map on the default limit until it
    /// is idle (dropped by a later limit change). Returns whether the key
    /// had its own limit.
    pub(crate) fn remove_limit<Q>(
        &self,
        key: &Q,
        idle: impl Fn(&V, &[CompactWindow]) -> bool,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        on_groups!(self, |groups| self.remove_limit_in(groups, key, idle))
    }

    /// [`remove_limit`](Self::remove_limit) on the table's `groups`.
    fn remove_limit_in<C: KeyCell<K>, St: Store<C, V>, Q>(
        &self,
        groups: Groups<'_, St, St::Pool>,
        key: &Q,
        idle: impl Fn(&V, &[CompactWindow]) -> bool,
    ) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_key(key);
        let (first, second, tag) = place_of(hash, groups.len());
        let mut locked = lock_pair(groups, first, second);
        let mut own = write(&self.own.0);
        let had = match own.get(key) {
            // A key that never had a request has no window to keep: it
            // leaves the side map and takes no slot until it has one.
            Some(entry) if !entry.lapsed() && !entry.seen() => {
                own.remove(key);
                true
            }
            Some(entry) if !entry.lapsed() => {
                let room = self.claim();
                let free = self.free_slot(groups, &mut locked, first, home_of(hash), room, &idle);
                // The key in its slot's form, made before the side map
                // gives the key up (a form takes every key of its table's
                // type: `None` only without a free slot).
                let stored = free.and_then(|_| {
                    let (owned, _) = own.get_key_value(key)?;
                    C::store(&mut Some(owned.clone()))
                });
                match free.zip(stored) {
                    Some(((which, at), stored)) => {
                        let (_, entry) = own.remove_entry(key).expect("the entry was found above");
                        // An idle key's slot comes sealed from `free_slot`;
                        // an empty one is sealed here.
                        let index = locked[which].0;
                        match locked[which].1.slots().map(|slots| &slots[at]) {
                            Some(_) if groups[index].tags.get(at) != 0 => self.unclaim(room),
                            Some(slot) => slot.value.seal_vacant(),
                            None => {}
                        }
                        let slots = locked[which].1.put(at, Some(stored));
                        slots[at].value.restore(&entry.value);
                        groups[index].tags.set(at, tag);
                        for (to, from) in self.further_of(index, at).iter().zip(&entry.further[..])
                        {
                            to.copy_from(from);
                        }
                    }
                    None => {
                        // `stored` is `None` only without a free slot: no
                        // slot was sealed.
                        self.unclaim(room);
                        entry.limit.store(
                            self.default_limit.load(Ordering::Relaxed),
                            Ordering::Relaxed,
                        );
                        entry.policy.store(LAPSED, Ordering::Relaxed);
                    }
                }
                true
            }
            _ => false,
        };
        own.retain(|_, entry| !(entry.lapsed() && idle(&entry.value, &entry.further)));
        self.own_count.store(own.len(), Ordering::Relaxed);
        had
    }

    /// Applies a rules document: `default` becomes the limit of keys
    /// without their own (and of the overflow value too when `overflow` is
    /// `Some`), every key of `limits` gets its limit, and every other key
    /// with its own limit goes back to the default, as
    /// [`remove_limit`](Self::remove_limit) sends it. Windows are kept (no
    /// burst). The caller applies documents one at a time.
    pub(crate) fn apply(
        &self,
        default: u64,
        overflow: Option<u64>,
        limits: HashMap<K, u64>,
        idle: impl Fn(&V, &[CompactWindow]) -> bool,
    ) {
        self.default_limit.store(default, Ordering::Relaxed);
        if let Some(limit) = overflow {
            self.overflow_limit.store(limit, Ordering::Relaxed);
        }
        let dropped: Vec<K> = {
            let own = read(&self.own.0);
            for entry in own.values().filter(|entry| entry.lapsed()) {
                entry.limit.store(default, Ordering::Relaxed);
            }
            own.keys()
                .filter(|key| !limits.contains_key(*key))
                .cloned()
                .collect()
        };
        for key in dropped {
            self.remove_limit(&key, &idle);
        }
        for (key, limit) in limits {
            self.set_limit(key, limit, &idle);
        }
    }

    /// Moves `key`'s value out of its slot in the `locked` groups, and its
    /// further windows into `further`, emptying the slot; `None` if it has
    /// none.
    fn take<C: KeyCell<K>, St: Store<C, V>>(
        &self,
        groups: Groups<'_, St, St::Pool>,
        locked: &mut [(usize, St::Write<'_>)],
        tag: u8,
        key: &K,
        further: &[CompactWindow],
    ) -> Option<V> {
        let probe = C::probe(key);
        for (index, slots) in locked.iter_mut() {
            let Some(at) = slots.slots().and_then(|held| {
                let candidates = groups[*index].tags.matching(tag);
                position(held, candidates, |k, at| k.is(at, probe.as_ref(), key))
            }) else {
                continue;
            };
            for (to, from) in further.iter().zip(self.further_of(*index, at)) {
                to.copy_from(from);
            }
            self.clear_further(*index, at);
            let value = {
                let held = &slots.slots().expect("the key was found in them")[at].value;
                held.seal();
                held.copy_sealed()
            };
            slots.vacate(at);
            groups[*index].tags.set(at, 0);
            self.occupied.fetch_sub(1, Ordering::Relaxed);
            return Some(value);
        }
        None
    }
}

impl<K, V> fmt::Debug for CompactTable<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompactTable")
            .field("max_keys", &self.max_keys)
            .field(
                "slots",
                &((self.groups.len() + self.text_groups.len() + self.addr_groups.len()) * GROUP),
            )
            .field("keys", &self.occupied.load(Ordering::Relaxed))
            .field("default_limit", &self.default_limit.load(Ordering::Relaxed))
            .field(
                "overflow_limit",
                &self.overflow_limit.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicIsize, AtomicU64 as StdU64, Ordering::SeqCst};
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::store::registry::{Borrowed, Owned};

    /// A fixed window of `WINDOW_MS` for the tests: (start, passes).
    #[derive(Debug)]
    struct Fixed(Mutex<(u64, u64)>);

    const WINDOW_MS: u64 = 1_000;

    impl SlotValue for Fixed {
        fn empty() -> Self {
            Fixed(Mutex::new((0, 0)))
        }

        fn reset(&self) {
            *self.0.lock().unwrap() = (0, 0);
        }

        fn copy_sealed(&self) -> Self {
            Fixed(Mutex::new(*self.0.lock().unwrap()))
        }

        fn restore(&self, from: &Self) {
            let from = *from.0.lock().unwrap();
            *self.0.lock().unwrap() = from;
        }
    }

    impl Fixed {
        /// Admits one at `now` under `limit`.
        fn admit(&self, now: u64, limit: u64) -> bool {
            let mut state = self.0.lock().unwrap();
            let start = now - now % WINDOW_MS;
            if state.0 != start {
                *state = (start, 0);
            }
            if state.1 < limit {
                state.1 += 1;
                true
            } else {
                false
            }
        }

        fn idle(&self, now: u64) -> bool {
            let state = self.0.lock().unwrap();
            state.1 == 0 || state.0 + WINDOW_MS <= now
        }

        fn passes(&self) -> u64 {
            self.0.lock().unwrap().1
        }
    }

    type Table = CompactTable<u64, Fixed>;

    fn table(max_keys: usize, limit: u64) -> Table {
        CompactTable::new(max_keys, limit, limit, &HashMap::new(), 0)
    }

    /// One request of `key` at `now`: whether it passed, and whether it was
    /// counted on the overflow value.
    fn request(table: &Table, key: u64, now: u64) -> (bool, bool) {
        table.with(
            Owned(key),
            |v, _| v.idle(now),
            |place| (place.value.admit(now, place.limit), place.overflow),
        )
    }

    #[test]
    fn a_groups_tags_match_exactly_the_slots_with_the_tag() {
        // Against a byte-by-byte oracle: every slot empty, full, or mixed
        // with tags that differ from the one sought by one bit (the high
        // bit, the low bit), over every slot position.
        let tags = Tags::new();
        let mut held = [0u8; GROUP];
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for round in 0..4_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let at = (state % GROUP as u64) as usize;
            let tag = match round % 5 {
                0 => 0,
                1 => 0x80,
                2 => 0xFF,
                3 => 0x81,
                _ => 0x80 | (state >> 20) as u8,
            };
            tags.set(at, tag);
            held[at] = tag;
            for sought in [0x80u8, 0x81, 0xFF, 0xFE, 0x80 | (state >> 40) as u8, tag] {
                let expected = (0..GROUP)
                    .filter(|&i| held[i] == sought)
                    .fold(0u16, |bits, i| bits | 1 << i);
                assert_eq!(tags.matching(sought), expected, "{held:?} for {sought:#x}");
            }
        }
    }

    #[test]
    fn high_bits_gathers_every_pattern() {
        for pattern in 0..=255u8 {
            let word = (0..8)
                .filter(|i| pattern & (1 << i) != 0)
                .fold(0u64, |word, i| word | 0x80 << (8 * i));
            assert_eq!(high_bits(word), pattern);
        }
    }

    /// The fields a request of an address key reads share the table's
    /// first two cache lines.
    #[test]
    fn a_request_reads_two_cache_lines_of_the_table() {
        type T = CompactTable<Option<std::net::IpAddr>, CompactWindow>;
        assert_eq!(std::mem::align_of::<T>(), 64);
        for end in [
            std::mem::offset_of!(T, addr_groups) + 16,
            std::mem::offset_of!(T, hasher) + std::mem::size_of::<GatherState>(),
            std::mem::offset_of!(T, default_limit) + 8,
            std::mem::offset_of!(T, own_count) + 8,
            // The pool: its first chunk, the others' array, the count
            // `spread` reads, the groups' block indexes.
            std::mem::offset_of!(T, addr_blocks)
                + std::mem::size_of::<Blocks<AtomicAddr, CompactWindow>>(),
        ] {
            assert!(end <= 128, "{end}");
        }
    }

    #[test]
    fn groups_hold_max_keys_at_seven_eighths() {
        assert_eq!(groups_for(1), 1);
        assert_eq!(groups_for(14), 1);
        assert_eq!(groups_for(15), 2);
        assert_eq!(
            groups_for(1 << 20),
            (((1usize << 20) * 8).div_ceil(7)).div_ceil(16)
        );
        assert!(table(1_000, 1).capacity() * 7 >= 1_000 * 8);
    }

    /// Whether `key` sits in a slot of group `index`.
    fn in_group(table: &Table, index: usize, key: u64) -> bool {
        read(&table.groups[index].slots)
            .as_ref()
            .is_some_and(|slots| {
                slots
                    .iter()
                    .any(|slot| slot.key.as_ref().is_some_and(|k| k.0 == key))
            })
    }

    #[test]
    fn a_new_key_goes_to_its_first_group_when_both_have_as_much_room() {
        // Every key of a fresh table meets two groups of 16 empty slots:
        // each must land in the group a lookup reads first, whichever of its
        // two groups has the lower index.
        let mut first_higher = 0;
        for key in 0..400u64 {
            let table = table(10_000, 5);
            let (first, second, _) = place_of(table.hasher.hash_key(&key), table.groups.len());
            if first == second {
                continue;
            }
            first_higher += usize::from(first > second);
            assert_eq!(request(&table, key, 0), (true, false));
            assert!(
                in_group(&table, first, key),
                "key {key}: groups {first}, {second}"
            );
            assert!(!in_group(&table, second, key), "key {key}");
        }
        // Both orders of the two groups were met.
        assert!(first_higher > 100, "{first_higher}");
    }

    #[test]
    fn a_flood_of_distinct_keys_never_grows_past_max_keys_nor_past_the_limits() {
        let limit = 3;
        let table = table(64, limit);
        // A known client spends its allowance first.
        for _ in 0..limit {
            assert_eq!(request(&table, u64::MAX, 5), (true, false));
        }
        // 20 000 distinct keys, all in the same window: each passes once
        // (in a slot or on the overflow value), so none is idle.
        let mut overflow_passes = 0;
        for key in 0..20_000 {
            let (passed, overflow) = request(&table, key, 5);
            assert!(table.len() <= 64, "{} keys", table.len());
            if overflow {
                overflow_passes += u64::from(passed);
            } else {
                assert!(passed);
            }
        }
        // The overflow value never let more than its limit through.
        assert_eq!(overflow_passes, limit);
        assert_eq!(table.overflow_place().value.passes(), limit);
        // The known client was never evicted: still refused, in its slot.
        assert_eq!(table.get(&u64::MAX, |p| p.value.passes()), Some(limit));
        assert_eq!(request(&table, u64::MAX, 5), (false, false));
    }

    #[test]
    fn every_key_of_a_full_table_is_found_again_without_an_insert() {
        let keys = 50_000u64;
        let table = table(keys as usize, 2);
        let held: Vec<u64> = (0..keys)
            .filter(|&key| request(&table, key, 5) == (true, false))
            .collect();
        assert!(held.len() as u64 * 100 >= keys * 99, "{} held", held.len());
        let examined = table.examined.load(SeqCst);
        // Each key held is found in its slot (its second pass), never by
        // the insert path, which would examine slots.
        for &key in &held {
            assert_eq!(request(&table, key, 5), (true, false), "key {key}");
        }
        assert_eq!(table.examined.load(SeqCst), examined);
        assert_eq!(table.len(), held.len());
    }

    #[test]
    fn only_idle_keys_are_evicted_and_an_evicted_key_starts_afresh_only_when_idle() {
        let table = table(16, 2);
        // Fill every slot the bound allows with keys that passed at 5.
        let mut held = Vec::new();
        let mut key = 0;
        while held.len() < 16 {
            if !request(&table, key, 5).1 {
                held.push(key);
            }
            key += 1;
        }
        // In the same window no slot frees up: a new key overflows.
        assert!(request(&table, 1_000_000, 500).1);
        for &k in &held {
            assert_eq!(table.get(&k, |p| p.value.passes()), Some(1));
        }
        // A window later every held key is idle: new keys take slots by
        // evicting them, and an evicted key coming back is a new key with
        // an empty window (its old passes had all left it).
        let mut placed = 0;
        for k in 2_000_000..2_000_200 {
            if !request(&table, k, 1_005).1 {
                placed += 1;
            }
        }
        assert!(placed >= 16, "{placed} new keys placed");
        assert!(table.len() <= 16);
    }

    #[test]
    fn an_insert_examines_the_slots_of_two_groups_twice_at_most() {
        let table = table(256, 1);
        for key in 0..50_000u64 {
            let before = table.examined.load(SeqCst);
            request(&table, key, 5);
            let examined = table.examined.load(SeqCst) - before;
            assert!(
                examined <= 2 * GROUP,
                "key {key}: {examined} slots examined"
            );
        }
        // And the flood had to look for room: inserts did examine slots.
        assert!(table.examined.load(SeqCst) > 50_000);
    }

    /// A key that counts its live copies.
    #[derive(Debug)]
    struct Tracked {
        id: u64,
        live: Arc<AtomicIsize>,
    }

    impl Tracked {
        fn new(id: u64, live: &Arc<AtomicIsize>) -> Self {
            live.fetch_add(1, SeqCst);
            Tracked {
                id,
                live: Arc::clone(live),
            }
        }
    }

    impl Clone for Tracked {
        fn clone(&self) -> Self {
            Tracked::new(self.id, &self.live)
        }
    }

    impl Drop for Tracked {
        fn drop(&mut self) {
            self.live.fetch_sub(1, SeqCst);
        }
    }

    impl PartialEq for Tracked {
        fn eq(&self, other: &Self) -> bool {
            self.id == other.id
        }
    }

    impl Eq for Tracked {}

    impl Hash for Tracked {
        fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
            self.id.hash(state);
        }
    }

    #[test]
    fn keys_are_dropped_exactly_once() {
        let live = Arc::new(AtomicIsize::new(0));
        {
            let table: CompactTable<Tracked, Fixed> =
                CompactTable::new(32, 1, 1, &HashMap::new(), 0);
            let mut now = 5;
            for round in 0..20u64 {
                for id in 0..100u64 {
                    let key = Tracked::new(round * 1_000 + id, &live);
                    table.with(Owned(key), |v, _| v.idle(now), |p| p.value.admit(now, 1));
                    // Every key not in the table is gone: evicted ones,
                    // and the keys that overflowed (never stored).
                    assert_eq!(live.load(SeqCst), table.stored() as isize);
                }
                // Limits move keys between the slots and the side map.
                table.set_limit(Tracked::new(round * 1_000, &live), 5, |v, _| v.idle(now));
                assert_eq!(live.load(SeqCst), table.stored() as isize);
                let probe = Tracked::new(round * 1_000, &live);
                assert!(table.remove_limit(&probe, |v, _| v.idle(now)));
                drop(probe);
                assert_eq!(live.load(SeqCst), table.stored() as isize);
                now += WINDOW_MS;
            }
            assert!(table.len() > 0);
        }
        // Dropping the table dropped the rest, once each.
        assert_eq!(live.load(SeqCst), 0);
    }

    #[test]
    fn a_borrowed_key_is_made_owned_only_when_inserted() {
        static MADE: StdU64 = StdU64::new(0);
        fn to_owned(key: &str) -> String {
            MADE.fetch_add(1, SeqCst);
            key.to_owned()
        }
        let table: CompactTable<String, Fixed> = CompactTable::new(8, 5, 5, &HashMap::new(), 0);
        for _ in 0..4 {
            table.with(
                Borrowed("k", to_owned),
                |v, _| v.idle(5),
                |p| p.value.admit(5, p.limit),
            );
        }
        assert_eq!(MADE.load(SeqCst), 1);
        assert_eq!(table.get("k", |p| p.value.passes()), Some(4));
    }

    /// A table of `Option<String>` keys (held in atomics) looked up by
    /// reference, as an extractor of its own may offer its key: the key is
    /// made only when inserted, found again in its slot by reference and
    /// owned, and read back as it was, short or long.
    #[test]
    fn option_string_keys_looked_up_by_reference_are_made_only_when_inserted() {
        static MADE: StdU64 = StdU64::new(0);
        fn to_owned(key: &Option<String>) -> Option<String> {
            MADE.fetch_add(1, SeqCst);
            key.clone()
        }
        let table: CompactTable<Option<String>, Fixed> =
            CompactTable::new(8, 5, 5, &HashMap::new(), 0);
        assert!(table.groups.is_empty());
        let keys = [Some("k".to_owned()), Some("l".repeat(200)), None];
        for key in &keys {
            for _ in 0..3 {
                table.with(
                    Borrowed(key, to_owned),
                    |v, _| v.idle(5),
                    |p| p.value.admit(5, p.limit),
                );
            }
            table.with(
                Owned(key.clone()),
                |v, _| v.idle(5),
                |p| p.value.admit(5, p.limit),
            );
            assert_eq!(table.get(key, |p| p.value.passes()), Some(4), "{key:?}");
        }
        assert_eq!(MADE.load(SeqCst), 3);
        let mut held = Vec::new();
        table.for_each(|key, _| key.clone(), |key| held.push(key));
        held.sort();
        let mut expected = keys.to_vec();
        expected.sort();
        assert_eq!(held, expected);
    }

    /// A text lent as it is (`with_text`) finds the slot of the key an
    /// owned lookup inserted and the other way round, for texts on both
    /// sides of the 64 bytes a cell holds and texts one byte apart;
    /// the key is made only when inserted; a key with its own limit is
    /// found in the side map.
    #[test]
    fn a_lent_text_and_its_owned_key_share_one_slot() {
        static MADE: StdU64 = StdU64::new(0);
        fn some_owned(text: &str) -> Option<String> {
            MADE.fetch_add(1, SeqCst);
            Some(text.to_owned())
        }
        let rules = HashMap::from([(Some("vip".to_owned()), 2)]);
        let table: CompactTable<Option<String>, Fixed> = CompactTable::new(64, 5, 5, &rules, 0);
        let by_text = |text: &str| {
            table.with_text(
                &table.text_lookup(text),
                some_owned,
                |v, _| v.idle(5),
                |p| (p.value.admit(5, p.limit), p.limit),
            )
        };
        let by_owned = |text: &str| {
            table.with(
                Owned(Some(text.to_owned())),
                |v, _| v.idle(5),
                |p| (p.value.admit(5, p.limit), p.limit),
            )
        };
        let texts: Vec<String> = [0usize, 1, 7, 8, 9, 16, 17, 63, 64, 65, 69, 70, 71, 200]
            .into_iter()
            .flat_map(|len| ["k".repeat(len), format!("{}j", "k".repeat(len))])
            .collect();
        for (i, text) in texts.iter().enumerate() {
            // Every other key is inserted by its text first.
            type Lookup<'a> = &'a dyn Fn(&str) -> (bool, u64);
            let (first, then): (Lookup<'_>, Lookup<'_>) = if i % 2 == 0 {
                (&by_text, &by_owned)
            } else {
                (&by_owned, &by_text)
            };
            for _ in 0..2 {
                assert_eq!(first(text), (true, 5), "{text:?}");
                assert_eq!(then(text), (true, 5), "{text:?}");
            }
            assert_eq!(first(text), (true, 5), "{text:?}");
            assert_eq!(then(text), (false, 5), "{text:?}: the sixth of one key");
            let key = Some(text.clone());
            assert_eq!(table.get(&key, |p| p.value.passes()), Some(5), "{text:?}");
        }
        assert_eq!(MADE.load(SeqCst), texts.len() as u64 / 2);
        assert_eq!(by_text("vip"), (true, 2));
        assert_eq!(by_text("vip"), (true, 2));
        assert_eq!(by_owned("vip"), (false, 2));
        // A key in the side map is found by the insert, with the key made
        // for it on every request (why the layer looks such a table up by
        // the key itself).
        assert_eq!(MADE.load(SeqCst), texts.len() as u64 / 2 + 2);
        let mut held = 0;
        table.for_each(|_, _| (), |()| held += 1);
        assert_eq!(held, texts.len() + 1);
    }

    /// The plain lookup (`with_owned`) finds the slot a general lookup
    /// inserted the key in and the other way round, sends keys past
    /// `max_keys` to the overflow value as the general lookup does, and
    /// finds a key with its own limit in the side map (through the
    /// insert).
    #[test]
    fn the_plain_lookup_and_the_general_one_share_every_slot() {
        let rules = HashMap::from([(7_000u64, 2)]);
        let table: Table = CompactTable::new(64, 3, 1, &rules, 0);
        let plain = |key: u64| {
            table.with_owned(
                key,
                |v, _| v.idle(5),
                |p| (p.value.admit(5, p.limit), p.overflow, p.limit),
            )
        };
        let general = |key: u64| {
            table.with(
                Owned(key),
                |v, _| v.idle(5),
                |p| (p.value.admit(5, p.limit), p.overflow, p.limit),
            )
        };
        for key in 0..64u64 {
            type Lookup<'a> = &'a dyn Fn(u64) -> (bool, bool, u64);
            let (first, then): (Lookup<'_>, Lookup<'_>) = if key % 2 == 0 {
                (&plain, &general)
            } else {
                (&general, &plain)
            };
            assert_eq!(first(key), (true, false, 3), "key {key}");
            assert_eq!(then(key), (true, false, 3), "key {key}");
            assert_eq!(first(key), (true, false, 3), "key {key}");
            assert_eq!(then(key), (false, false, 3), "key {key}: the fourth");
        }
        // The table is full of keys with passes in their window: a new key
        // is counted on the overflow value, by either lookup.
        assert_eq!(plain(1_000), (true, true, 1));
        assert_eq!(general(1_001), (false, true, 1));
        assert_eq!(plain(7_000), (true, false, 2));
        assert_eq!(general(7_000), (true, false, 2));
        assert_eq!(plain(7_000), (false, false, 2));
        let mut held = 0;
        table.for_each(|_, _| (), |()| held += 1);
        assert_eq!(held, 65);
    }

    #[test]
    fn own_limits_keep_the_window_when_set_and_removed() {
        let table = table(16, 2);
        assert_eq!(request(&table, 7, 5), (true, false));
        table.set_limit(7, 3, |v, _| v.idle(5));
        // The pass counted before the limit changed stays counted.
        let (limit, tag, passes) = table
            .get(&7, |p| (p.limit, p.tag, p.value.passes()))
            .unwrap();
        assert_eq!((limit, passes), (3, 1));
        assert_eq!(tag, Some(table.hasher.hash_key(&7u64) as u32));
        assert_eq!(request(&table, 7, 5), (true, false));
        assert_eq!(request(&table, 7, 5), (true, false));
        assert_eq!(request(&table, 7, 5), (false, false));
        // Back on the default limit with its three passes: still refused.
        assert!(table.remove_limit(&7, |v, _| v.idle(5)));
        assert!(!table.remove_limit(&7, |v, _| v.idle(5)));
        let (limit, tag, passes) = table
            .get(&7, |p| (p.limit, p.tag, p.value.passes()))
            .unwrap();
        assert_eq!((limit, tag, passes), (2, None, 3));
        assert_eq!(request(&table, 7, 5), (false, false));
    }

    // Removing the own limit of a key that never had a request moved it
    // into a slot: it took one of `max_keys` and the handle listed it, as
    // a full table (which makes no entry before a request) never does.
    #[test]
    fn a_key_whose_own_limit_goes_before_its_first_request_takes_no_slot() {
        let table = table(16, 2);
        table.set_limit(7, 3, |v, _| v.idle(5));
        assert!(table.remove_limit(&7, |v, _| v.idle(5)));
        assert_eq!(table.len(), 0);
        assert_eq!(table.stored(), 0);
        assert!(table.get(&7, |_| ()).is_none());
        // Its first request then finds a slot like any new key.
        assert_eq!(request(&table, 7, 5), (true, false));
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn keys_with_their_own_limit_are_never_overflowed() {
        let mut rules = HashMap::new();
        rules.insert(1_000_000u64, 2);
        let table: Table = CompactTable::new(16, 1, 1, &rules, 0);
        for key in 0..1_000 {
            request(&table, key, 5);
        }
        assert_eq!(request(&table, 1_000_000, 5), (true, false));
        assert_eq!(request(&table, 1_000_000, 5), (true, false));
        assert_eq!(request(&table, 1_000_000, 5), (false, false));
        assert_eq!(table.len(), 17);
    }

    #[test]
    fn concurrent_floods_never_hold_more_than_max_keys() {
        let table = Arc::new(table(64, 1));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let table = Arc::clone(&table);
                std::thread::spawn(move || {
                    for key in 0..5_000u64 {
                        request(&table, t * 1_000_000 + key, 5);
                        assert!(table.len() <= 64, "{} keys", table.len());
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(table.len(), 64);
        let mut counted = 0;
        table.for_each(|_, _| (), |()| counted += 1);
        assert_eq!(counted, 64);
    }

    #[test]
    fn concurrent_inserts_of_one_key_share_one_slot_and_its_limit() {
        let table = Arc::new(table(1_024, 100));
        let passed = Arc::new(StdU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let table = Arc::clone(&table);
                let passed = Arc::clone(&passed);
                std::thread::spawn(move || {
                    for key in 0..200u64 {
                        for _ in 0..60 {
                            if request(&table, key, 5).0 {
                                passed.fetch_add(1, SeqCst);
                            }
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(table.len(), 200);
        assert_eq!(passed.load(SeqCst), 200 * 100);
        let mut seen = 0;
        table.for_each(
            |k, p| (*k, p.value.passes()),
            |(_, passes)| {
                assert_eq!(passes, 100);
                seen += 1;
            },
        );
        assert_eq!(seen, 200);
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use loom::sync::Arc;
    use loom::thread;

    use super::*;
    use crate::store::registry::Owned;

    /// A one-bucket window of 1 000 ms in one atomic: its start (high
    /// bits) and passes (low 16 bits), admitted with a compare-and-swap.
    struct Packed(AtomicU64);

    impl SlotValue for Packed {
        fn empty() -> Self {
            Packed(AtomicU64::new(0))
        }

        fn reset(&self) {
            self.0.store(0, Ordering::Release);
        }

        fn copy_sealed(&self) -> Self {
            Packed(AtomicU64::new(self.0.load(Ordering::Acquire)))
        }

        fn restore(&self, from: &Self) {
            self.0
                .store(from.0.load(Ordering::Acquire), Ordering::Release);
        }
    }

    impl Packed {
        fn admit(&self, now: u64, limit: u64) -> bool {
            let start = now - now % 1_000;
            let mut current = self.0.load(Ordering::Acquire);
            loop {
                let passes = if current >> 16 == start {
                    current & 0xFFFF
                } else {
                    0
                };
                if passes >= limit {
                    return false;
                }
                let next = (start << 16) | (passes + 1);
                match self
                    .0
                    .compare_exchange(current, next, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => return true,
                    Err(seen) => current = seen,
                }
            }
        }

        fn passes(&self, now: u64) -> u64 {
            let current = self.0.load(Ordering::Acquire);
            if current >> 16 == now - now % 1_000 {
                current & 0xFFFF
            } else {
                0
            }
        }
    }

    /// Key 1 passed in an earlier window (idle now). At 2 000, a request
    /// of key 1 (found in its slot: admitted under the group's read lock)
    /// races a new key 2 that needs a slot (the table holds one key, so it
    /// may evict key 1 only if idle). Whatever the order, no pass is lost
    /// or lands on the other key's window: one of the two passes in the
    /// slot, under its own key, the other on the overflow value.
    #[test]
    fn an_insert_racing_an_admission_in_one_group() {
        loom::model(|| {
            let table: Arc<CompactTable<u64, Packed>> =
                Arc::new(CompactTable::new(1, 1, 1, &HashMap::new(), 0));
            let request = |table: &CompactTable<u64, Packed>, key: u64| {
                table.with(
                    Owned(key),
                    |v, _| v.passes(2_000) == 0,
                    |place| (place.value.admit(2_000, place.limit), place.overflow),
                )
            };
            assert!(table.with(Owned(1), |_, _| false, |p| p.value.admit(500, 1)));
            let threads: Vec<_> = [1u64, 2]
                .into_iter()
                .map(|key| {
                    let table = Arc::clone(&table);
                    thread::spawn(move || request(&table, key))
                })
                .collect();
            let answers: Vec<(bool, bool)> =
                threads.into_iter().map(|t| t.join().unwrap()).collect();
            // Both passed: one in the slot, one on the overflow value.
            assert!(answers.iter().all(|(passed, _)| *passed), "{answers:?}");
            assert_eq!(answers.iter().filter(|(_, o)| *o).count(), 1);
            let in_slot = if answers[0].1 { 2 } else { 1 };
            assert_eq!(table.get(&in_slot, |p| p.value.passes(2_000)), Some(1));
            assert_eq!(table.get(&(3 - in_slot), |p| p.value.passes(2_000)), None);
            assert_eq!(table.overflow_place().value.passes(2_000), 1);
            assert_eq!(table.len(), 1);
        });
    }

    /// The first two requests of one key, at once, in a table with room.
    /// A lookup reads its groups' tags before it takes a lock, so it may
    /// miss the key the other request is inserting; its own insert then
    /// finds that key under the write locks. Both pass, on one slot: the
    /// key is never held twice, and no pass goes to the overflow value.
    #[test]
    fn two_first_requests_of_one_key_share_one_slot() {
        loom::model(|| {
            let table: Arc<CompactTable<u64, Packed>> =
                Arc::new(CompactTable::new(64, 1, 1, &HashMap::new(), 0));
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let table = Arc::clone(&table);
                    thread::spawn(move || {
                        table.with(
                            Owned(7),
                            |v, _| v.passes(2_000) == 0,
                            |place| (place.value.admit(2_000, 5), place.overflow),
                        )
                    })
                })
                .collect();
            for thread in threads {
                assert_eq!(thread.join().unwrap(), (true, false));
            }
            assert_eq!(table.get(&7, |p| p.value.passes(2_000)), Some(2));
            assert_eq!(table.len(), 1);
            assert_eq!(table.overflow_place().value.passes(2_000), 0);
        });
    }
}
