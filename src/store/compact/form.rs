//! How a slot of a `CompactTable` holds its key: the key itself
//! ([`Plain`]), or, for the keys of the crate's two common client
//! extractors, the key in atomics that a request compares without the
//! group's lock (see the table's module docs, "Lookups without the
//! lock"):
//!
//! - `Option<IpAddr>` (the address extractors'): [`AtomicAddr`], the
//!   address in four words and a state word.
//! - `Option<String>` (`HeaderKey`'s): [`AtomicText`], a text of up to 64
//!   bytes in sixteen words and a state word, in the slot itself (which
//!   spares it the heap block of its own a `String` needs: a 64-byte value
//!   costs an 80-byte block on glibc, its size header and the rounding to
//!   16 bytes). A longer text is kept in its group's [`Spilled`] texts and
//!   compared only under the group's lock.
//!
//! The table picks the form from its key type (see [`atomic_text`] and
//! [`atomic_addr`]): the choice is made by the compiler for each key type
//! (a comparison of two constant type ids), so a table of address keys has
//! no branch for it.
//!
//! A slot's key is a [`KeyCell`]: `Option<S>` of a form `S`, read and
//! written under the group's lock, or one of the two cells in atomics
//! ([`SharedCell`]).

use std::any::{Any, TypeId};
use std::borrow::{Borrow, Cow};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::sync::{read, write, AtomicU32, Ordering, RwLock};

/// Slots per group of the table (and per lock): what a group's
/// [`Spilled`] texts are sized by.
pub(crate) const GROUP: usize = 16;

/// How a slot holds a key of type `K`.
pub(crate) trait Form<K: Clone>: Sized + Send + Sync {
    /// What a lookup with the key at hand (owned) compares slots with,
    /// made once per lookup.
    type Probe<'a>
    where
        K: 'a;

    /// The probe of `key`; `None` when this form compares with the lookup
    /// form of the key instead.
    fn probe(key: &K) -> Option<Self::Probe<'_>>;

    /// The key in `key` in this form, taking it; `None`, leaving it, if
    /// this form cannot hold it (a key of another type: never, as the table
    /// picks the form from the type).
    fn store(key: &mut Option<K>) -> Option<Self>;

    /// Whether this is the key `key` (with `probe`, its probe, when the
    /// lookup has it).
    fn is<Q: Eq + ?Sized>(&self, probe: Option<&Self::Probe<'_>>, key: &Q) -> bool
    where
        K: Borrow<Q>;

    /// The key, borrowed when the slot holds it as it is, else made from
    /// the slot (`None` only for a form that does not hold a `K`, never).
    fn key(&self) -> Option<Cow<'_, K>>;

    /// The key to show a request: `own` (the request's own key, equal to
    /// this one) when the form would have to make it, else this one.
    #[inline]
    fn shown<'a>(&'a self, own: Option<&'a K>) -> Option<Cow<'a, K>> {
        match own {
            Some(own) => Some(Cow::Borrowed(own)),
            None => self.key(),
        }
    }
}

/// A key held as it is.
#[derive(Debug)]
pub(crate) struct Plain<K>(pub(crate) K);

impl<K: Clone + Eq + Send + Sync> Form<K> for Plain<K> {
    type Probe<'a>
        = ()
    where
        K: 'a;

    #[inline]
    fn probe(_: &K) -> Option<()> {
        None
    }

    #[inline]
    fn store(key: &mut Option<K>) -> Option<Self> {
        key.take().map(Plain)
    }

    #[inline]
    fn is<Q: Eq + ?Sized>(&self, _: Option<&()>, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.0.borrow() == key
    }

    #[inline]
    fn key(&self) -> Option<Cow<'_, K>> {
        Some(Cow::Borrowed(&self.0))
    }

    #[inline]
    fn shown<'a>(&'a self, _: Option<&'a K>) -> Option<Cow<'a, K>> {
        // The slot's own copy, as the table always showed it.
        Some(Cow::Borrowed(&self.0))
    }
}

/// A slot's key cell, whatever its key type: what it takes, and its empty
/// state. Whether a slot holds a key is its tag's to say (a vacant shared
/// slot keeps the key it had, see the table's `PutKey::vacate`).
pub(crate) trait Cell: Sized {
    /// A key as the cell takes it, made before the slot is touched.
    type Stored;

    /// What a group of these cells keeps beside its slots for keys too
    /// large for a cell ([`Spilled`] for [`AtomicText`]; nothing for the
    /// others).
    type Spill: Send + Sync;

    /// An empty cell.
    fn empty() -> Self;

    /// A group's empty [`Spill`](Self::Spill).
    fn spill() -> Self::Spill;
}

/// A cell's place: its group's [`Spill`](Cell::Spill) and its slot's
/// index, which a cell that spills long keys reads them with.
#[derive(Debug)]
pub(crate) struct At<'a, S> {
    pub(crate) spill: &'a S,
    pub(crate) at: usize,
}

impl<S> Clone for At<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for At<'_, S> {}

/// A slot's key: nothing, or one key in the slot's form.
pub(crate) trait KeyCell<K: Clone>: Cell {
    /// What a lookup with the key at hand (owned) compares cells with.
    type Probe<'a>
    where
        K: 'a;

    /// The probe of `key`; `None` when this cell compares with the lookup
    /// form of the key instead.
    fn probe(key: &K) -> Option<Self::Probe<'_>>;

    /// The key in `key` as this cell takes it, taking it; `None`, leaving
    /// it, if the cell cannot hold it (never, as the table picks the cell
    /// from the key type).
    fn store(key: &mut Option<K>) -> Option<Self::Stored>;

    /// Whether the cell (at `at`) holds the key `key` (with `probe`, its
    /// probe, when the lookup has it).
    fn is<Q: Eq + ?Sized>(
        &self,
        at: At<'_, Self::Spill>,
        probe: Option<&Self::Probe<'_>>,
        key: &Q,
    ) -> bool
    where
        K: Borrow<Q>;

    /// The key held, borrowed when held as it is, else made.
    fn key(&self, at: At<'_, Self::Spill>) -> Option<Cow<'_, K>>;

    /// The key to show a request: `own` (the request's own key, equal to
    /// the one held) when the cell would have to make it, else the held
    /// one.
    #[inline]
    fn shown<'a>(&'a self, at: At<'_, Self::Spill>, own: Option<&'a K>) -> Option<Cow<'a, K>> {
        match own {
            Some(own) => Some(Cow::Borrowed(own)),
            None => self.key(at),
        }
    }
}

/// A key cell in atomics, which a request compares without its group's
/// lock ([`AtomicAddr`], [`AtomicText`]); see the table's module docs,
/// "Lookups without the lock".
pub(crate) trait SharedCell: Cell + Send + Sync {
    /// What a lookup without the lock compares the cell with.
    type Seen<'a>;

    /// The cell's state word: its kind in the low two bits, [`VACANT`],
    /// and its version in the high bits (with more between them for some
    /// cells), written with `Release` after the key's words.
    fn state(&self) -> &AtomicU32;

    /// If the cell holds the key of `probe` (and a lookup without the lock
    /// may take it there), the state it was seen in, for
    /// [`unchanged`](Self::unchanged) once the decision is recorded. Never
    /// for a vacant cell: the key it keeps is not in the slot.
    fn seen(&self, probe: &Self::Seen<'_>) -> Option<u32>;

    /// Whether the cell still holds the key of `seen` (a state
    /// [`seen`](Self::seen) returned), loaded after a decision recorded on
    /// the slot's value (see the table's module docs). A key that left
    /// since counts as held: it left with its value sealed after the
    /// decision, which the moved value therefore holds.
    #[inline(always)]
    fn unchanged(&self, seen: u32) -> bool {
        // Acquire: a key change whose value store the decision's swap read
        // (or came after) is seen here.
        self.state().load(Ordering::Acquire) & !VACANT == seen
    }

    /// Marks the key as gone (under the group's write lock, with the
    /// slot's value sealed and moved out), keeping its version; the state
    /// it had.
    fn mark_vacant(&self) -> u32 {
        let state = self.state().load(Ordering::Relaxed);
        self.state().store(state | VACANT, Ordering::Release);
        state
    }

    /// Makes `key` the cell's key (empty for `None`): under the group's
    /// write lock, with the slot's value sealed. The cell is slot `at` of
    /// a group whose spill is `spill`.
    fn put(&self, key: Option<Self::Stored>, spill: &Self::Spill, at: usize);

    /// Marks the cell's key gone, keeping its version (see the table's
    /// `PutKey::vacate`).
    fn vacate(&self, spill: &Self::Spill, at: usize);
}

/// A form's key behind the group's lock: written only under its write
/// lock, which gives the table `&mut` access.
impl<S> Cell for Option<S> {
    type Stored = S;
    type Spill = ();

    fn empty() -> Self {
        None
    }

    fn spill() {}
}

impl<K: Clone, S: Form<K>> KeyCell<K> for Option<S> {
    type Probe<'a>
        = S::Probe<'a>
    where
        K: 'a;

    #[inline]
    fn probe(key: &K) -> Option<S::Probe<'_>> {
        S::probe(key)
    }

    #[inline]
    fn store(key: &mut Option<K>) -> Option<S> {
        S::store(key)
    }

    #[inline(always)]
    fn is<Q: Eq + ?Sized>(&self, _: At<'_, ()>, probe: Option<&S::Probe<'_>>, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.as_ref().is_some_and(|held| held.is(probe, key))
    }

    #[inline]
    fn key(&self, _: At<'_, ()>) -> Option<Cow<'_, K>> {
        self.as_ref().and_then(Form::key)
    }

    #[inline]
    fn shown<'a>(&'a self, _: At<'_, ()>, own: Option<&'a K>) -> Option<Cow<'a, K>> {
        self.as_ref().and_then(|held| held.shown(own))
    }
}

/// Whether a table with keys `K` holds them as [`AtomicAddr`]: exactly
/// for `Option<IpAddr>`, a constant of the build as for [`atomic_text`].
#[inline(always)]
pub(crate) fn atomic_addr<K: 'static>() -> bool {
    TypeId::of::<K>() == TypeId::of::<Option<IpAddr>>()
}

/// `state`: the cell holds no key.
const EMPTY: u32 = 0;
/// `state`: the key `None` (a request with no address).
const NO_ADDR: u32 = 1;
/// `state`: an IPv4 address, in `words[0]`.
const V4: u32 = 2;
/// `state`: an IPv6 address, in the four words, most significant first.
const V6: u32 = 3;
/// `state`: the kind's bits.
const KIND: u32 = 0b11;
/// `state`: the key left the slot (its value moved out, sealed); the
/// version is above this bit.
const VACANT: u32 = 0b100;
/// `state`: where the version starts.
const VERSION_SHIFT: u32 = 3;

/// An `Option<IpAddr>` key as an [`AtomicAddr`] holds it: its kind (one
/// of the `state` kinds, never [`EMPTY`]) and its words (0 where unused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AddrBits {
    kind: u32,
    words: [u32; 4],
}

impl AddrBits {
    /// The bits of `key`. An IPv4 address and the IPv4-mapped IPv6 address
    /// of it are different keys, as they are as `IpAddr`s (the extractors
    /// give IPv4 clients as IPv4).
    #[inline]
    pub(crate) fn of(key: &Option<IpAddr>) -> AddrBits {
        match key {
            None => AddrBits {
                kind: NO_ADDR,
                words: [0; 4],
            },
            Some(IpAddr::V4(v4)) => AddrBits {
                kind: V4,
                words: [u32::from(*v4), 0, 0, 0],
            },
            Some(IpAddr::V6(v6)) => {
                let bits = u128::from(*v6);
                AddrBits {
                    kind: V6,
                    words: [
                        (bits >> 96) as u32,
                        (bits >> 64) as u32,
                        (bits >> 32) as u32,
                        bits as u32,
                    ],
                }
            }
        }
    }

    /// The key these bits are of.
    fn key(&self) -> Option<IpAddr> {
        match self.kind {
            V4 => Some(IpAddr::V4(Ipv4Addr::from(self.words[0]))),
            V6 => {
                let bits = self
                    .words
                    .iter()
                    .fold(0u128, |bits, &word| (bits << 32) | u128::from(word));
                Some(IpAddr::V6(Ipv6Addr::from(bits)))
            }
            _ => None,
        }
    }
}

/// An `Option<IpAddr>` key in atomics (20 bytes, as the key itself with
/// its padding in a slot), so that a request can compare it with no lock
/// held.
///
/// Written only under the group's write lock, with the slot's value
/// sealed (see the table's module docs): the words first, then `state`.
/// A lookup without the lock loads `state`, compares the words, decides on
/// the value, then loads `state` again; an unchanged state (version
/// included) proves that the slot held this key when the decision was
/// recorded.
pub(crate) struct AtomicAddr {
    /// `[version:29][vacant:1][kind:2]`. The version grows by one with
    /// every key the cell takes, so a state seen twice is the same key's
    /// unless 2^29 keys came and went in this one slot between the two
    /// loads. `vacant` is set when the key leaves (its value sealed and
    /// moved out, see the table's `PutKey::vacate`); the key stays until
    /// the next one. `Release` stores after the words, `Acquire` loads: a
    /// lookup that loads a state sees the words stored before it.
    state: AtomicU32,
    /// The address, as [`AddrBits`] lays it out. `Relaxed`: ordered by
    /// `state`; a lookup racing a change may read a mix of two keys' words,
    /// which its second load of `state` then rejects.
    words: [AtomicU32; 4],
}

impl AtomicAddr {
    fn new() -> Self {
        AtomicAddr {
            state: AtomicU32::new(EMPTY),
            words: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    /// The key held, if any.
    fn bits(&self) -> Option<AddrBits> {
        let state = self.state.load(Ordering::Acquire);
        let kind = state & KIND;
        (kind != EMPTY && state & VACANT == 0).then(|| AddrBits {
            kind,
            words: std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed)),
        })
    }

    /// Makes the cell hold `bits` (nothing for `None`), under the group's
    /// write lock with the slot's value sealed.
    pub(crate) fn put(&self, bits: Option<&AddrBits>) {
        let (kind, words) = bits.map_or((EMPTY, [0; 4]), |bits| (bits.kind, bits.words));
        for (cell, word) in self.words.iter().zip(words) {
            cell.store(word, Ordering::Relaxed);
        }
        let version = (self.state.load(Ordering::Relaxed) >> VERSION_SHIFT).wrapping_add(1);
        // Release: the words above are visible to whoever loads this.
        self.state
            .store((version << VERSION_SHIFT) | kind, Ordering::Release);
    }
}

impl std::fmt::Debug for AtomicAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AtomicAddr")
            .field(&self.bits().map(|bits| bits.key()))
            .finish()
    }
}

/// An address key in atomics, for tables of `Option<IpAddr>` keys (the
/// table picks it by [`atomic_addr`]; for any other `K`, every method
/// finds or makes nothing).
impl Cell for AtomicAddr {
    type Stored = AddrBits;
    type Spill = ();

    fn empty() -> Self {
        AtomicAddr::new()
    }

    fn spill() {}
}

impl SharedCell for AtomicAddr {
    type Seen<'a> = AddrBits;

    #[inline(always)]
    fn state(&self) -> &AtomicU32 {
        &self.state
    }

    #[inline(always)]
    fn seen(&self, bits: &AddrBits) -> Option<u32> {
        // Acquire: the words of this state are visible below.
        let state = self.state.load(Ordering::Acquire);
        let same = (state & (KIND | VACANT) == bits.kind)
            & (self.words[0].load(Ordering::Relaxed) == bits.words[0])
            & (self.words[1].load(Ordering::Relaxed) == bits.words[1])
            & (self.words[2].load(Ordering::Relaxed) == bits.words[2])
            & (self.words[3].load(Ordering::Relaxed) == bits.words[3]);
        same.then_some(state)
    }

    fn put(&self, key: Option<AddrBits>, _: &(), _: usize) {
        AtomicAddr::put(self, key.as_ref());
    }

    fn vacate(&self, _: &(), _: usize) {
        self.mark_vacant();
    }
}

impl<K: Clone + 'static> KeyCell<K> for AtomicAddr {
    type Probe<'a>
        = AddrBits
    where
        K: 'a;

    #[inline(always)]
    fn probe(key: &K) -> Option<AddrBits> {
        (key as &dyn Any)
            .downcast_ref::<Option<IpAddr>>()
            .map(AddrBits::of)
    }

    fn store(key: &mut Option<K>) -> Option<AddrBits> {
        let key = (key as &mut dyn Any).downcast_mut::<Option<Option<IpAddr>>>()?;
        key.take().map(|key| AddrBits::of(&key))
    }

    #[inline(always)]
    fn is<Q: Eq + ?Sized>(&self, at: At<'_, ()>, probe: Option<&AddrBits>, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        match probe {
            Some(bits) => self.seen(bits).is_some(),
            // A lookup by another form of the key (not made by the crate's
            // extractors): compared with the key made from the cell.
            None => <Self as KeyCell<K>>::key(self, at).is_some_and(|held| (*held).borrow() == key),
        }
    }

    fn key(&self, _: At<'_, ()>) -> Option<Cow<'_, K>> {
        let mut key = Some(self.bits()?.key());
        (&mut key as &mut dyn Any)
            .downcast_mut::<Option<K>>()
            .and_then(Option::take)
            .map(Cow::Owned)
    }
}

/// Whether a table with keys `K` holds them as [`AtomicText`]: exactly
/// when `K` is `Option<String>` (`HeaderKey`'s keys). A constant for each
/// `K`, folded away by the compiler.
#[inline(always)]
pub(crate) fn atomic_text<K: 'static>() -> bool {
    TypeId::of::<K>() == TypeId::of::<Option<String>>()
}

/// Bytes of text an [`AtomicText`] holds in its own words. A longer text
/// (up to the crate's `MAX_KEY_BYTES`, 256) is kept in its group's
/// [`Spilled`] texts instead.
pub(crate) const WORD_TEXT_BYTES: usize = 64;

/// Words of an [`AtomicText`].
const TEXT_WORDS: usize = WORD_TEXT_BYTES / 4;

// The state word of an `AtomicText`: its kind (the low two bits, `EMPTY`
// or one of the three below), `VACANT`, the length of a text held in its
// words (seven bits), and its version (the rest, 22 bits). The version
// tells a lookup without the lock that its slot changed keys between its
// two loads of the state; it could mistake a changed slot for its own
// only if the slot took 2^22 (4 194 304) keys in between, each under the
// group's write lock, and the last of them had the same length.

/// Holds `None`.
const NO_TEXT: u32 = 1;
/// Holds a text of at most [`WORD_TEXT_BYTES`] in its words.
const SHORT: u32 = 2;
/// Holds a longer text, kept in the group's [`Spilled`] texts.
const LONG: u32 = 3;
const LEN_SHIFT: u32 = 3;
const LEN: u32 = 0x7F << LEN_SHIFT;
const TEXT_VERSION_SHIFT: u32 = 10;
/// A probe's state for a long text: a length no cell's state has, so that
/// only the locked comparison ([`AtomicText::is_text`]) ever finds it.
const LONG_PROBE: u32 = LONG | LEN;

/// The four bytes of `bytes` from `4 * i`, zero past its end, as a word.
#[inline(always)]
fn words_of(bytes: &[u8]) -> [u32; TEXT_WORDS] {
    let mut padded = [0u8; WORD_TEXT_BYTES];
    padded[..bytes.len()].copy_from_slice(bytes);
    std::array::from_fn(|i| {
        u32::from_le_bytes([
            padded[4 * i],
            padded[4 * i + 1],
            padded[4 * i + 2],
            padded[4 * i + 3],
        ])
    })
}

/// An `Option<String>` key as an [`AtomicText`] takes it, made before the
/// slot is touched.
#[derive(Debug)]
pub(crate) enum TextBits {
    /// `None`.
    Absent,
    /// A text of at most [`WORD_TEXT_BYTES`]: its state bits (kind and
    /// length) and words.
    Short { head: u32, words: [u32; TEXT_WORDS] },
    /// A longer text, for the group's [`Spilled`] texts.
    Long(Box<str>),
}

impl TextBits {
    fn of(key: Option<String>) -> TextBits {
        match key {
            None => TextBits::Absent,
            Some(text) if text.len() <= WORD_TEXT_BYTES => {
                let probe = TextProbe::of(Some(&text));
                TextBits::Short {
                    head: probe.head,
                    words: probe.words,
                }
            }
            Some(text) => TextBits::Long(text.into_boxed_str()),
        }
    }
}

/// What a lookup compares [`AtomicText`] cells with: the state bits a
/// cell holding the text has, its words, and the text itself (for a long
/// one).
#[derive(Debug)]
pub(crate) struct TextProbe<'a> {
    head: u32,
    /// Words of the text that hold some of it: `len.div_ceil(4)`.
    used: usize,
    words: [u32; TEXT_WORDS],
    text: Option<&'a str>,
}

impl<'a> TextProbe<'a> {
    /// The probe of the key `text` (`None` for the absent key).
    #[inline(always)]
    pub(crate) fn of(text: Option<&'a str>) -> Self {
        match text {
            Some(short) if short.len() <= WORD_TEXT_BYTES => TextProbe {
                // At most 64: seven bits.
                head: SHORT | ((short.len() as u32) << LEN_SHIFT),
                used: short.len().div_ceil(4),
                words: words_of(short.as_bytes()),
                text,
            },
            Some(_) => TextProbe {
                head: LONG_PROBE,
                used: 0,
                words: [0; TEXT_WORDS],
                text,
            },
            None => TextProbe {
                head: NO_TEXT,
                used: 0,
                words: [0; TEXT_WORDS],
                text,
            },
        }
    }
}

/// The texts of a group's long keys (longer than [`WORD_TEXT_BYTES`]),
/// slot by slot, allocated with the group's first long key. Beside the
/// group's slots, under a lock of its own: written under the group's
/// write lock and read under its read lock, each time with this lock too
/// (a lookup without the group's lock never reads it: a long key is
/// always looked up with the lock). Its 24 bytes a group are 1.5 bytes a
/// slot.
#[derive(Debug)]
pub(crate) struct Spilled(RwLock<Option<Box<LongTexts>>>);

/// A group's long texts, slot by slot.
type LongTexts = [Option<Box<str>>; GROUP];

impl Spilled {
    fn new() -> Self {
        Spilled(RwLock::new(None))
    }

    /// `f` of slot `at`'s long text, if it has one.
    fn with<R>(&self, at: usize, f: impl FnOnce(Option<&str>) -> R) -> R {
        let texts = read(&self.0);
        f(texts.as_ref().and_then(|texts| texts[at].as_deref()))
    }

    /// Makes `text` slot `at`'s long text (none for `None`).
    fn put(&self, at: usize, text: Option<Box<str>>) {
        let mut texts = write(&self.0);
        match (texts.as_mut(), text) {
            (Some(texts), text) => texts[at] = text,
            (None, None) => {}
            (None, Some(text)) => {
                let mut new: Box<LongTexts> = Box::default();
                new[at] = Some(text);
                *texts = Some(new);
            }
        }
    }
}

/// An `Option<String>` key in atomics, so that a request can compare it
/// with no lock held: a state word and sixteen words of text, 68 bytes
/// (4-byte aligned: with the 28-byte window, a 96-byte slot). A text of
/// at most [`WORD_TEXT_BYTES`] (an API key, a tenant name, a token's
/// digest) is held in the words; a longer one in its group's [`Spilled`]
/// texts, and compared only under the group's lock.
///
/// The same protocol as [`AtomicAddr`]: written only under the group's
/// write lock, with the slot's value sealed, the words first, then
/// `state`. A lookup without the lock loads `state`, compares the words,
/// decides on the value, then loads `state` again; an unchanged state
/// (version included) proves that the slot held this key when the
/// decision was recorded.
pub(crate) struct AtomicText {
    /// Kind, vacant bit, length and version (see the constants above).
    state: AtomicU32,
    /// The text's bytes, four a word in little-endian order, zero past its
    /// end; only the first `len.div_ceil(4)` words mean anything.
    words: [AtomicU32; TEXT_WORDS],
}

impl AtomicText {
    fn new() -> Self {
        AtomicText {
            state: AtomicU32::new(EMPTY),
            words: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    /// Whether the cell holds `probe`'s text, long texts included: under
    /// the group's lock.
    #[inline(always)]
    pub(crate) fn is_text(&self, at: At<'_, Spilled>, probe: &TextProbe<'_>) -> bool {
        if self.seen(probe).is_some() {
            return true;
        }
        probe.head == LONG_PROBE
            && self.state.load(Ordering::Acquire) & (KIND | VACANT) == LONG
            && at.spill.with(at.at, |held| held == probe.text)
    }

    /// The key held (`None` for an empty or vacated cell): under the
    /// group's lock.
    fn text(&self, at: At<'_, Spilled>) -> Option<Option<String>> {
        let state = self.state.load(Ordering::Acquire);
        if state & VACANT != 0 {
            return None;
        }
        match state & KIND {
            NO_TEXT => Some(None),
            SHORT => {
                let len = ((state & LEN) >> LEN_SHIFT) as usize;
                let mut bytes: Vec<u8> = self.words[..len.div_ceil(4)]
                    .iter()
                    .flat_map(|word| word.load(Ordering::Relaxed).to_le_bytes())
                    .collect();
                bytes.truncate(len);
                // Copied from a `str` under the lock: valid UTF-8.
                Some(Some(String::from_utf8_lossy(&bytes).into_owned()))
            }
            LONG => at
                .spill
                .with(at.at, |text| text.map(|text| Some(text.to_owned()))),
            _ => None,
        }
    }
}

impl std::fmt::Debug for AtomicText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.load(Ordering::Acquire);
        f.debug_struct("AtomicText")
            .field("kind", &(state & KIND))
            .field("len", &((state & LEN) >> LEN_SHIFT))
            .field("vacant", &(state & VACANT != 0))
            .finish()
    }
}

impl Cell for AtomicText {
    type Stored = TextBits;
    type Spill = Spilled;

    fn empty() -> Self {
        AtomicText::new()
    }

    fn spill() -> Spilled {
        Spilled::new()
    }
}

impl SharedCell for AtomicText {
    type Seen<'a> = TextProbe<'a>;

    #[inline(always)]
    fn state(&self) -> &AtomicU32 {
        &self.state
    }

    /// Only a text held in the words: never a long one.
    #[inline(always)]
    fn seen(&self, probe: &TextProbe<'_>) -> Option<u32> {
        // Acquire: the words stored before this state are read below.
        let state = self.state.load(Ordering::Acquire);
        if state & (KIND | VACANT | LEN) != probe.head {
            return None;
        }
        let same = self.words[..probe.used]
            .iter()
            .zip(&probe.words[..probe.used])
            .fold(true, |same, (cell, word)| {
                same & (cell.load(Ordering::Relaxed) == *word)
            });
        same.then_some(state)
    }

    fn put(&self, key: Option<TextBits>, spill: &Spilled, at: usize) {
        let was_long = self.state.load(Ordering::Relaxed) & KIND == LONG;
        let head = match key {
            None => EMPTY,
            Some(TextBits::Absent) => NO_TEXT,
            Some(TextBits::Short { head, words }) => {
                let used = (((head & LEN) >> LEN_SHIFT) as usize).div_ceil(4);
                for (cell, word) in self.words[..used].iter().zip(words) {
                    cell.store(word, Ordering::Relaxed);
                }
                head
            }
            Some(TextBits::Long(text)) => {
                spill.put(at, Some(text));
                LONG
            }
        };
        if was_long && head != LONG {
            spill.put(at, None);
        }
        let version = (self.state.load(Ordering::Relaxed) >> TEXT_VERSION_SHIFT).wrapping_add(1);
        // Release: the words (and the spilled text) before the state.
        self.state
            .store((version << TEXT_VERSION_SHIFT) | head, Ordering::Release);
    }

    fn vacate(&self, spill: &Spilled, at: usize) {
        if self.mark_vacant() & KIND == LONG {
            spill.put(at, None);
        }
    }
}

impl<K: Clone + 'static> KeyCell<K> for AtomicText {
    type Probe<'a>
        = TextProbe<'a>
    where
        K: 'a;

    #[inline(always)]
    fn probe(key: &K) -> Option<TextProbe<'_>> {
        (key as &dyn Any)
            .downcast_ref::<Option<String>>()
            .map(|key| TextProbe::of(key.as_deref()))
    }

    fn store(key: &mut Option<K>) -> Option<TextBits> {
        let key = (key as &mut dyn Any).downcast_mut::<Option<Option<String>>>()?;
        key.take().map(TextBits::of)
    }

    #[inline(always)]
    fn is<Q: Eq + ?Sized>(
        &self,
        at: At<'_, Spilled>,
        probe: Option<&TextProbe<'_>>,
        key: &Q,
    ) -> bool
    where
        K: Borrow<Q>,
    {
        match probe {
            Some(probe) => self.is_text(at, probe),
            // A lookup by another form of the key: compared with the key
            // made from the cell.
            None => <Self as KeyCell<K>>::key(self, at).is_some_and(|held| (*held).borrow() == key),
        }
    }

    fn key(&self, at: At<'_, Spilled>) -> Option<Cow<'_, K>> {
        let mut key = Some(self.text(at)?);
        (&mut key as &mut dyn Any)
            .downcast_mut::<Option<K>>()
            .and_then(Option::take)
            .map(Cow::Owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_cell_takes_no_more_than_the_inline_text_it_replaced() {
        // A state word and sixteen words: 68 bytes, 4-byte aligned.
        assert_eq!(std::mem::size_of::<AtomicText>(), 68);
        assert_eq!(std::mem::align_of::<AtomicText>(), 4);
    }

    type Text = Option<String>;

    /// The place of a cell that spills nothing.
    const NO_SPILL: At<'static, ()> = At { spill: &(), at: 0 };

    /// A cell's place in a group of its own (slot 5 of `spill`).
    fn at(spill: &Spilled) -> At<'_, Spilled> {
        At { spill, at: 5 }
    }

    fn text_keys() -> Vec<Text> {
        let mut keys: Vec<Text> = [0usize, 1, 3, 4, 5, 63, 64, 65, 70, 71, 72, 255, 256]
            .into_iter()
            .map(|len| Some("k".repeat(len)))
            .collect();
        // Multi-byte characters ending at and across the 64 bytes a cell
        // holds, a key the header extractor made of invalid bytes, and two
        // texts that differ only in their last byte, and only in length.
        keys.push(Some("é".repeat(32)));
        keys.push(Some(format!("k{}", "é".repeat(32))));
        keys.push(Some("\x7facme\\xff".to_owned()));
        keys.push(Some(format!("{}a", "k".repeat(63))));
        keys.push(Some(format!("{}\0", "k".repeat(3))));
        keys.push(None);
        keys
    }

    /// Texts around the 64 bytes a cell holds in its words, multi-byte
    /// characters ending at and across that length, and the absent key:
    /// each reads back as stored, is found by its own probe and by
    /// reference and by no other key's, is seen without the lock exactly
    /// when it is held in the words, is not found once vacated (its long
    /// text dropped), and takes a new version when the slot is taken again.
    #[test]
    fn a_text_cell_holds_its_key_and_tells_every_other_apart() {
        let keys = text_keys();
        let spill = Spilled::new();
        let cell = <AtomicText as Cell>::empty();
        for key in &keys {
            let stored = <AtomicText as KeyCell<Text>>::store(&mut Some(key.clone()))
                .expect("an Option<String>");
            let long = key
                .as_ref()
                .is_some_and(|text| text.len() > WORD_TEXT_BYTES);
            assert_eq!(matches!(stored, TextBits::Long(_)), long, "{key:?}");
            cell.put(Some(stored), &spill, 5);
            assert_eq!(
                <AtomicText as KeyCell<Text>>::key(&cell, at(&spill)).as_deref(),
                Some(key)
            );
            assert_eq!(spill.with(5, |held| held.is_some()), long, "{key:?}");
            let probe = TextProbe::of(key.as_deref());
            let seen = cell.seen(&probe);
            assert_eq!(seen.is_some(), !long, "{key:?} seen without the lock");
            for other in &keys {
                let probe = TextProbe::of(other.as_deref());
                let by_probe = KeyCell::<Text>::is(&cell, at(&spill), Some(&probe), other);
                let by_reference = KeyCell::<Text>::is(&cell, at(&spill), None, other);
                assert_eq!(by_probe, key == other, "{key:?} against {other:?}");
                assert_eq!(by_reference, key == other, "{key:?} against {other:?}");
                if key != other {
                    assert!(cell.seen(&probe).is_none(), "{key:?} as {other:?}");
                }
            }
            SharedCell::vacate(&cell, &spill, 5);
            assert!(cell.seen(&probe).is_none(), "{key:?} vacated");
            assert!(!cell.is_text(at(&spill), &probe), "{key:?} vacated");
            assert!(spill.with(5, |held| held.is_none()), "{key:?}'s text kept");
            assert_eq!(<AtomicText as KeyCell<Text>>::key(&cell, at(&spill)), None);
            if let Some(seen) = seen {
                assert!(cell.unchanged(seen), "a vacated key keeps its version");
                let stored = <AtomicText as KeyCell<Text>>::store(&mut Some(key.clone()));
                cell.put(stored, &spill, 5);
                assert!(!cell.unchanged(seen), "{key:?} taken again: a new version");
            }
        }
    }

    /// A long key replaced by a short one (the slot's key evicted) leaves
    /// no text behind; an empty cell holds nothing.
    #[test]
    fn a_text_cell_drops_its_long_text_with_its_key() {
        let spill = Spilled::new();
        let cell = <AtomicText as Cell>::empty();
        assert_eq!(<AtomicText as KeyCell<Text>>::key(&cell, at(&spill)), None);
        let long: Text = Some("l".repeat(200));
        cell.put(
            <AtomicText as KeyCell<Text>>::store(&mut Some(long.clone())),
            &spill,
            5,
        );
        assert!(spill.with(5, |held| held.is_some()));
        let short: Text = Some("s".to_owned());
        cell.put(
            <AtomicText as KeyCell<Text>>::store(&mut Some(short.clone())),
            &spill,
            5,
        );
        assert!(spill.with(5, |held| held.is_none()));
        assert!(!KeyCell::<Text>::is(&cell, at(&spill), None, &long));
        assert!(KeyCell::<Text>::is(&cell, at(&spill), None, &short));
        cell.put(None, &spill, 5);
        assert_eq!(<AtomicText as KeyCell<Text>>::key(&cell, at(&spill)), None);
    }

    /// A cell is never given a key of another type (the table picks it from
    /// the type); if it were, it would leave the key where it was.
    #[test]
    fn a_text_cell_takes_no_key_of_another_type() {
        let mut key = Some(String::from("k"));
        assert!(<AtomicText as KeyCell<String>>::store(&mut key).is_none());
        assert_eq!(key.as_deref(), Some("k"));
        assert!(<AtomicText as KeyCell<String>>::probe(&"k".to_owned()).is_none());
    }

    /// At every length a cell holds, one byte changed anywhere, or one byte
    /// more or less, is another key.
    #[test]
    fn a_text_cell_compares_every_byte_at_every_length() {
        let text: String = ('a'..='z').cycle().take(WORD_TEXT_BYTES + 1).collect();
        let spill = Spilled::new();
        let cell = <AtomicText as Cell>::empty();
        for n in 0..=WORD_TEXT_BYTES {
            let key = &text[..n];
            cell.put(Some(TextBits::of(Some(key.to_owned()))), &spill, 5);
            assert!(cell.seen(&TextProbe::of(Some(key))).is_some(), "length {n}");
            for i in 0..n {
                let mut other = key.as_bytes().to_vec();
                other[i] = b'_';
                let other = String::from_utf8(other).expect("ASCII");
                assert!(
                    cell.seen(&TextProbe::of(Some(&other))).is_none(),
                    "length {n}, byte {i}"
                );
            }
            assert!(cell.seen(&TextProbe::of(Some(&text[..n + 1]))).is_none());
            if n > 0 {
                assert!(cell.seen(&TextProbe::of(Some(&text[..n - 1]))).is_none());
            }
            assert!(cell.seen(&TextProbe::of(None)).is_none());
        }
    }

    /// Address keys at the edges of both families, and pairs whose words
    /// are the same but not their kind (1.2.3.4 and `102:304::`; the
    /// IPv4-mapped form of an IPv4 address): each reads back as stored, and
    /// a cell holding one is seen by its own bits and no other's, not once
    /// it is vacated, and again (with a new version) once it takes a key.
    #[test]
    fn an_address_cell_holds_its_key_and_tells_every_other_apart() {
        let keys: Vec<Option<IpAddr>> = vec![
            None,
            Some(Ipv4Addr::UNSPECIFIED.into()),
            Some(Ipv4Addr::BROADCAST.into()),
            Some(Ipv4Addr::new(1, 2, 3, 4).into()),
            Some(Ipv6Addr::new(0x102, 0x304, 0, 0, 0, 0, 0, 0).into()),
            Some(Ipv4Addr::new(1, 2, 3, 4).to_ipv6_mapped().into()),
            Some(Ipv6Addr::UNSPECIFIED.into()),
            Some(Ipv6Addr::from(u128::MAX).into()),
            Some(Ipv6Addr::new(0x2001, 0xdb8, 0, 7, 0, 0, 0, 0).into()),
        ];
        type Key = Option<IpAddr>;
        let cell = <AtomicAddr as Cell>::empty();
        for key in &keys {
            let bits = <AtomicAddr as KeyCell<Key>>::store(&mut Some(*key)).expect("an address");
            assert_eq!(bits.key(), *key);
            cell.put(Some(&bits));
            assert_eq!(
                <AtomicAddr as KeyCell<Key>>::key(&cell, NO_SPILL).as_deref(),
                Some(key)
            );
            let seen = cell.seen(&bits).expect("its own key");
            for other in keys.iter().filter(|other| *other != key) {
                assert!(
                    cell.seen(&AddrBits::of(other)).is_none(),
                    "{key:?} as {other:?}"
                );
                assert!(!KeyCell::<Key>::is(
                    &cell,
                    NO_SPILL,
                    Some(&AddrBits::of(other)),
                    other
                ));
                assert!(!KeyCell::<Key>::is(&cell, NO_SPILL, None, other));
            }
            assert!(KeyCell::<Key>::is(&cell, NO_SPILL, None, key));
            SharedCell::vacate(&cell, &(), 0);
            assert!(cell.seen(&bits).is_none(), "{key:?} vacated");
            assert!(cell.unchanged(seen), "a vacated key keeps its version");
            assert_eq!(<AtomicAddr as KeyCell<Key>>::key(&cell, NO_SPILL), None);
            cell.put(Some(&bits));
            assert!(!cell.unchanged(seen), "{key:?} taken again: a new version");
        }
    }

    #[test]
    fn only_option_string_keys_are_held_as_atomic_text() {
        assert!(atomic_text::<Option<String>>());
        assert!(!atomic_text::<String>());
        assert!(!atomic_text::<Option<std::net::IpAddr>>());
        assert!(!atomic_text::<Option<Box<str>>>());
    }
}
