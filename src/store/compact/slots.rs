//! Where a compact table's groups keep their slots: the value a slot
//! holds for its key ([`SlotValue`]), the slots of a group in one block
//! ([`Block`]), and the stores a group's block lives in ([`Store`]):
//! behind the group's lock ([`LockedSlots`], for keys held as they are),
//! or beside it ([`Shared`], for the key cells in atomics that a request
//! reads without the lock), taken from the table's pool of blocks
//! ([`Blocks`]), which keeps a 4-byte index per group ([`BlockCell`]) saying
//! which block is the group's.
//! The table (`table.rs`) decides which slot a key takes; this module
//! only keeps them.

use super::form::{At, Cell, SharedCell, GROUP};
use crate::sync::{
    read, write, AtomicU32, AtomicUsize, Ordering, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

/// The table's state for one key.
///
/// A key changes in a slot only with the slot's value *sealed*: a value
/// that a request may be deciding on without the group's lock (see the
/// table's module docs, "Lookups without the lock") must then refuse every
/// decision until it is unsealed, by [`reset`](Self::reset) or
/// [`restore`](Self::restore). A value used only under the lock needs no
/// seal: the default methods seal nothing.
pub(crate) trait SlotValue: Send + Sync + Sized {
    /// The value of a key that has just been inserted.
    fn empty() -> Self;

    /// Seals the value if `idle` judges it idle, atomically with the
    /// judgement (a decision recorded since makes the seal fail); whether
    /// it did. Under the group's write lock.
    fn seal_if(&self, idle: impl Fn(&Self) -> bool) -> bool {
        idle(self)
    }

    /// Seals the value, whatever it holds. Under the group's write lock.
    fn seal(&self) {}

    /// Seals the value of a vacant slot (see [`PutKey::vacate`]) unless it
    /// still is: a vacant slot's value is either sealed since its key left
    /// or has never been used, and no request holds it meanwhile. Under the
    /// group's write lock.
    fn seal_vacant(&self) {}

    /// Makes a sealed value [`empty`](Self::empty) again, unsealing it, for
    /// a slot given to another key.
    fn reset(&self);

    /// A copy of a sealed value, which stays sealed: a key's value moved
    /// out of its slot.
    fn copy_sealed(&self) -> Self;

    /// Makes a sealed value hold what `from` holds, unsealing it: a key's
    /// value moved into a slot.
    fn restore(&self, from: &Self);
}

/// One slot: a key cell `C` (empty, or a key in the slot's form, see the
/// table's module docs) and its value.
pub(crate) struct Slot<C, V> {
    pub(super) key: C,
    pub(super) value: V,
}

impl<C: SharedCell, V: SlotValue> Slot<C, V> {
    /// Loads the key's state word and drops it: the slot's line is on its
    /// way to the cache when the lookup reads the slot for what it holds
    /// (see "Reading a key's slots early" in `table.rs`). Nothing
    /// under loom, where the load would only add states.
    #[inline(always)]
    pub(super) fn touch(&self) {
        #[cfg(not(loom))]
        {
            let _ = self.key.state().load(Ordering::Relaxed);
        }
    }
}

/// A group's slots, and what their cells spill beside them (the texts of
/// long keys for [`AtomicText`] cells; nothing for the others).
pub(crate) struct Block<C: Cell, V> {
    slots: [Slot<C, V>; GROUP],
    spill: C::Spill,
}

impl<C: Cell, V> Block<C, V> {
    /// Slot `at`'s place, which its cell reads a spilled key with.
    #[inline(always)]
    pub(super) fn at(&self, at: usize) -> At<'_, C::Spill> {
        At {
            spill: &self.spill,
            at,
        }
    }
}

impl<C: Cell, V> std::ops::Deref for Block<C, V> {
    type Target = [Slot<C, V>; GROUP];

    #[inline(always)]
    fn deref(&self) -> &Self::Target {
        &self.slots
    }
}

impl<C: Cell, V> std::ops::DerefMut for Block<C, V> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.slots
    }
}

pub(crate) type Slots<C, V> = Block<C, V>;

/// Where a group keeps its slots, allocated with its first key: behind its
/// lock ([`LockedSlots`]), or beside it ([`Shared`]), for key cells that a
/// request reads without the lock.
pub(crate) trait Store<C: Cell, V>: Send + Sync {
    /// What the groups of a table share: the blocks of slots of shared
    /// groups and which group has which ([`Blocks`]), nothing for the
    /// others.
    type Pool: Send + Sync;
    /// The slots, read-locked.
    type Read<'a>: SlotsOf<C, V>
    where
        Self: 'a;
    /// The slots, write-locked.
    type Write<'a>: SlotsOf<C, V> + PutKey<C, V>
    where
        Self: 'a;

    fn new() -> Self;
    /// The pool of a table of `groups` groups.
    fn pool(groups: usize) -> Self::Pool;
    /// The slots of this group, group `index` of the table, read-locked.
    fn read_slots<'a>(&'a self, index: usize, pool: &'a Self::Pool) -> Self::Read<'a>;
    /// The slots of this group, group `index` of the table,
    /// write-locked.
    fn write_slots<'a>(&'a self, index: usize, pool: &'a Self::Pool) -> Self::Write<'a>;
}

/// A group's slots as a guard gives them: `None` until its first key.
pub(crate) trait SlotsOf<C: Cell, V> {
    fn slots(&self) -> Option<&Slots<C, V>>;
}

/// Changes a slot's key, under the group's write lock, with the slot's
/// value sealed: the slots, allocated if they were not, with `key` in slot
/// `at` (nothing for `None`).
pub(crate) trait PutKey<C: Cell, V> {
    fn put(&mut self, at: usize, key: Option<C::Stored>) -> &Slots<C, V>;

    /// Leaves slot `at` (whose value is sealed, and copied out by the
    /// caller) vacant: what a lookup may still find there must not count.
    /// A slot behind the lock is emptied (no lookup runs meanwhile); a
    /// shared slot's key is marked gone, keeping its version, and its
    /// value stays sealed: no lookup finds the key any more, one that
    /// found it before records nothing on the sealed value, and one that
    /// recorded a pass before the seal sees its key's version unchanged
    /// (that pass is in the copy). The slot's tag, cleared by the caller,
    /// marks it vacant.
    fn vacate(&mut self, at: usize);
}

fn new_slots<C: Cell, V: SlotValue>() -> Slots<C, V> {
    Block {
        slots: std::array::from_fn(|_| Slot {
            key: C::empty(),
            value: V::empty(),
        }),
        spill: C::spill(),
    }
}

/// Slots behind the group's lock: read under its read lock, written under
/// its write lock, as `&mut`.
pub(crate) type LockedSlots<C, V> = RwLock<Option<Box<Slots<C, V>>>>;

impl<S: Send + Sync, V: SlotValue> Store<Option<S>, V> for LockedSlots<Option<S>, V> {
    type Pool = ();
    type Read<'a>
        = RwLockReadGuard<'a, Option<Box<Slots<Option<S>, V>>>>
    where
        Self: 'a;
    type Write<'a>
        = RwLockWriteGuard<'a, Option<Box<Slots<Option<S>, V>>>>
    where
        Self: 'a;

    fn new() -> Self {
        RwLock::new(None)
    }

    fn pool(_: usize) {}

    #[inline]
    fn read_slots<'a>(&'a self, _: usize, _: &'a ()) -> Self::Read<'a> {
        read(self)
    }

    fn write_slots<'a>(&'a self, _: usize, _: &'a ()) -> Self::Write<'a> {
        write(self)
    }
}

impl<C: Cell, V> SlotsOf<C, V> for RwLockReadGuard<'_, Option<Box<Slots<C, V>>>> {
    #[inline]
    fn slots(&self) -> Option<&Slots<C, V>> {
        self.as_deref()
    }
}

impl<C: Cell, V> SlotsOf<C, V> for RwLockWriteGuard<'_, Option<Box<Slots<C, V>>>> {
    #[inline]
    fn slots(&self) -> Option<&Slots<C, V>> {
        self.as_deref()
    }
}

impl<S: Send + Sync, V: SlotValue> PutKey<Option<S>, V>
    for RwLockWriteGuard<'_, Option<Box<Slots<Option<S>, V>>>>
{
    fn put(&mut self, at: usize, key: Option<S>) -> &Slots<Option<S>, V> {
        let slots = self.get_or_insert_with(|| Box::new(new_slots()));
        slots[at].key = key;
        slots
    }

    fn vacate(&mut self, at: usize) {
        if let Some(slots) = self.as_mut() {
            slots[at].key = None;
            slots[at].value.reset();
        }
    }
}

/// Slots beside the group's lock, for key cells in atomics
/// ([`SharedCell`]: [`AtomicAddr`], [`AtomicText`]): read under the read
/// lock, or by a lookup without it; their keys written under the write
/// lock (with the slot's value sealed, see the table's module docs). A block of
/// the table's [`Blocks`], taken under the write lock with the group's
/// first key and kept until the table goes; which one is the group's
/// [`BlockCell`] in the pool (see "Reading a key's slots early" in
/// `table.rs`).
pub(crate) struct Shared<C: Cell, V> {
    lock: RwLock<()>,
    cells: std::marker::PhantomData<fn() -> (C, V)>,
}

/// Which block of the table's [`Blocks`] a shared group's slots are: 0
/// until the group's first key, then the block's index plus one. Stored
/// once, `Release`, after the block's chunk is made (under the group's
/// write lock); loaded `Acquire`, so a lookup that reads an index finds
/// its chunk made.
pub(crate) type BlockCell = AtomicU32;

/// Blocks in a chunk of [`Blocks`].
const CHUNK: usize = 64;

/// [`CHUNK`] blocks of [`Blocks`] (fewer in a table's last chunk), made
/// when the first of them is taken.
type Chunk<C, V> = std::sync::OnceLock<Box<[Slots<C, V>]>>;

/// Blocks taken from which a table is [`spread`](Blocks::spread): 1 024
/// groups' headers and slots, 850 kB with address keys, about what a
/// core's private cache holds.
const SPREAD_BLOCKS: usize = 1024;

/// The blocks of slots of a table's shared groups, handed out in order,
/// one to each group that takes a key, and made [`CHUNK`] at a time: a
/// table holds the blocks of the groups that have had keys, and at most
/// one chunk's worth more, whichever groups they are. A group finds its
/// block from its [`BlockCell`], four bytes, in the pool's array of them:
/// small enough to stay in a core's cache where the groups' headers (64
/// bytes each) do not, so a lookup learns where its slots are without a
/// miss.
#[repr(C)]
pub(crate) struct Blocks<C: Cell, V> {
    /// The first chunk, held here rather than behind `chunks`, so that a
    /// lookup on a table of up to 64 groups with keys reads no line of
    /// the pool beyond this one.
    first: Chunk<C, V>,
    /// The chunks after the first.
    chunks: Box<[Chunk<C, V>]>,
    /// Blocks handed out. Relaxed: it only hands out indexes; a block is
    /// published by its chunk's `OnceLock` and the group's cell.
    taken: AtomicUsize,
    /// Group `i`'s block, at index `i`: one cell per group, as many as
    /// there are blocks.
    cells: Box<[BlockCell]>,
}

impl<C: Cell, V: SlotValue> Blocks<C, V> {
    fn new(groups: usize) -> Self {
        Blocks {
            first: std::sync::OnceLock::new(),
            chunks: (1..groups.div_ceil(CHUNK))
                .map(|_| std::sync::OnceLock::new())
                .collect(),
            taken: AtomicUsize::new(0),
            cells: (0..groups).map(|_| BlockCell::new(0)).collect(),
        }
    }

    /// Whether so many groups have taken blocks that a lookup's headers and
    /// slots are unlikely to be in a core's cache: then a lookup without
    /// the lock loads its home slots early (see "Reading a key's slots
    /// early" in `table.rs`). Blocks are never given back, so a table
    /// that has been spread once stays so.
    #[inline(always)]
    pub(super) fn spread(&self) -> bool {
        self.taken.load(Ordering::Relaxed) >= SPREAD_BLOCKS
    }

    /// Chunk `n` of the pool.
    #[inline(always)]
    fn chunk(&self, n: usize) -> Option<&Chunk<C, V>> {
        match n.checked_sub(1) {
            None => Some(&self.first),
            Some(later) => self.chunks.get(later),
        }
    }

    /// The block of group `group`, if it has one.
    #[inline(always)]
    pub(super) fn get(&self, group: usize) -> Option<&Slots<C, V>> {
        let index = self
            .cells
            .get(group)?
            .load(Ordering::Acquire)
            .checked_sub(1)? as usize;
        self.chunk(index / CHUNK)?.get()?.get(index % CHUNK)
    }

    /// The block of group `group`, taken now if it had none: under the
    /// group's write lock, so a group takes one block at most, and no
    /// more are taken than there are groups.
    fn take(&self, group: usize) -> &Slots<C, V> {
        if let Some(block) = self.get(group) {
            return block;
        }
        let index = self.taken.fetch_add(1, Ordering::Relaxed);
        let start = index / CHUNK * CHUNK;
        // Blocks are taken only while `taken` is below the number of
        // groups (one per group, under its write lock), so the chunk is
        // there.
        let len = self.cells.len();
        let Some(chunk) = self.chunk(index / CHUNK) else {
            unreachable!("block {index} of a pool of {len} blocks");
        };
        let chunk = chunk.get_or_init(|| {
            (start..len.min(start + CHUNK))
                .map(|_| new_slots())
                .collect()
        });
        // The table has fewer than `u32::MAX` groups (`CompactTable::new`),
        // and `group` is one of them (the table passes only its groups'
        // indexes, as it indexes their headers).
        self.cells[group].store(index as u32 + 1, Ordering::Release);
        &chunk[index % CHUNK]
    }
}

/// [`Shared`] slots with their group's lock held.
pub(crate) struct SharedGuard<'a, C: Cell, V, G> {
    _lock: G,
    /// The group's index in the table.
    group: usize,
    blocks: &'a Blocks<C, V>,
}

impl<C: SharedCell, V: SlotValue> Store<C, V> for Shared<C, V> {
    type Pool = Blocks<C, V>;
    type Read<'a>
        = SharedGuard<'a, C, V, RwLockReadGuard<'a, ()>>
    where
        Self: 'a;
    type Write<'a>
        = SharedGuard<'a, C, V, RwLockWriteGuard<'a, ()>>
    where
        Self: 'a;

    fn new() -> Self {
        Shared {
            lock: RwLock::new(()),
            cells: std::marker::PhantomData,
        }
    }

    fn pool(groups: usize) -> Self::Pool {
        Blocks::new(groups)
    }

    #[inline]
    fn read_slots<'a>(&'a self, group: usize, blocks: &'a Blocks<C, V>) -> Self::Read<'a> {
        SharedGuard {
            _lock: read(&self.lock),
            group,
            blocks,
        }
    }

    fn write_slots<'a>(&'a self, group: usize, blocks: &'a Blocks<C, V>) -> Self::Write<'a> {
        SharedGuard {
            _lock: write(&self.lock),
            group,
            blocks,
        }
    }
}

impl<C: Cell, V: SlotValue, G> SlotsOf<C, V> for SharedGuard<'_, C, V, G> {
    #[inline]
    fn slots(&self) -> Option<&Slots<C, V>> {
        self.blocks.get(self.group)
    }
}

impl<C: SharedCell, V: SlotValue> PutKey<C, V> for SharedGuard<'_, C, V, RwLockWriteGuard<'_, ()>> {
    fn put(&mut self, at: usize, key: Option<C::Stored>) -> &Slots<C, V> {
        // Taken here only, under the write lock: never two at once.
        let slots = self.blocks.take(self.group);
        slots[at].key.put(key, &slots.spill, at);
        slots
    }

    fn vacate(&mut self, at: usize) {
        // The key (marked gone) and the sealed value stay until the slot
        // is taken again (see the trait).
        if let Some(slots) = self.blocks.get(self.group) {
            slots[at].key.vacate(&slots.spill, at);
        }
    }
}

/// Bytes of one slot with a key in form `S` and value `V`.
#[cfg(test)]
pub(crate) fn slot_bytes<S, V>() -> usize {
    std::mem::size_of::<Slot<S, V>>()
}

/// Bytes of a group's block of slots (taken with its first key), with
/// keys in cells `C` and values `V`: its slots and its cells' spill.
#[cfg(test)]
pub(crate) fn block_bytes<C: Cell, V>() -> usize {
    std::mem::size_of::<Block<C, V>>()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::stat::CompactWindow;
    use crate::store::compact::form::AtomicAddr;

    /// Groups take blocks of slots in the order they take their first
    /// key, whichever groups they are, a chunk of 64 made at a time (the
    /// last chunk holds what is left); a group keeps its block; and a
    /// table counts as spread only from 1 024 blocks taken.
    #[test]
    fn groups_take_blocks_in_order_a_chunk_at_a_time() {
        let groups = CHUNK + 6;
        let blocks = Blocks::<AtomicAddr, CompactWindow>::new(groups);
        assert_eq!(blocks.cells.len(), groups);
        assert!(blocks.get(40).is_none());
        assert!(blocks.get(groups).is_none(), "no group past the last");
        // Group 40 first, then group 3: blocks 0 and 1 of the first chunk.
        let first = blocks.take(40) as *const _;
        let second = blocks.take(3) as *const _;
        assert_eq!(blocks.cells[40].load(Ordering::Relaxed), 1);
        assert_eq!(blocks.cells[3].load(Ordering::Relaxed), 2);
        assert!(blocks.chunks[0].get().is_none(), "one chunk made");
        assert_eq!(blocks.first.get().map(|chunk| chunk.len()), Some(CHUNK));
        // A group keeps its block, taken again or read.
        assert_eq!(blocks.take(40) as *const _, first);
        assert_eq!(blocks.get(3).map(|b| b as *const _), Some(second));
        // Every other group: the second chunk is the 6 blocks left.
        for group in 0..groups {
            if group != 40 && group != 3 {
                blocks.take(group);
            }
        }
        assert_eq!(blocks.chunks[0].get().map(|chunk| chunk.len()), Some(6));
        assert_eq!(blocks.taken.load(Ordering::Relaxed), groups);
        let mut indexes: Vec<u32> = blocks
            .cells
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        indexes.sort_unstable();
        assert_eq!(indexes, (1..=groups as u32).collect::<Vec<_>>());
        assert!(!blocks.spread());

        let many = Blocks::<AtomicAddr, CompactWindow>::new(SPREAD_BLOCKS + 1);
        for group in 0..SPREAD_BLOCKS - 1 {
            many.take(group);
        }
        assert!(!many.spread());
        many.take(SPREAD_BLOCKS - 1);
        assert!(many.spread());
    }
}
