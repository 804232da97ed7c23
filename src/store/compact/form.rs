//! How a slot of a `CompactTable` holds its key: the key itself
//! ([`Plain`]), or, for `Option<String>` keys (`HeaderKey`'s), the text
//! inline in the slot ([`InlineText`]), which spares a short key the heap
//! block of its own a `String` needs (a 64-byte value costs an 80-byte
//! block on glibc: its size header and the rounding to 16 bytes).
//!
//! The table picks the form from its key type (see [`inline_text`] and
//! [`atomic_addr`]): the choice is made by the compiler for each key type
//! (a comparison of two constant type ids), so a table of address keys has
//! no branch for it.
//!
//! A slot's key is a [`KeyCell`]: `Option<S>` of a form `S`, read and
//! written under the group's lock, or, for `Option<IpAddr>` keys (the
//! address extractors'), an [`AtomicAddr`], the address in atomics that a
//! request compares without the lock (see the table's module docs,
//! "Lookups without the lock").

use std::any::{Any, TypeId};
use std::borrow::{Borrow, Cow};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::sync::{AtomicU32, Ordering};

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

/// Bytes of text an [`InlineText`] holds in the slot: as many as fit
/// beside its two bytes of length and variant in the 72 bytes the
/// variant holding a longer key's pointer needs anyway (8-byte aligned).
pub(crate) const INLINE_BYTES: usize = 70;

/// An `Option<String>` key in a slot: `None`, the text inline when it is at
/// most [`INLINE_BYTES`] long, else the text in a heap block of its own
/// (`Box<str>`: its length, not a `String`'s capacity too). A key has one
/// form only: inline exactly when short enough.
#[derive(Debug)]
pub(crate) enum InlineText {
    /// `None`.
    Absent,
    /// `Some` of the first `len` bytes of `bytes` (valid UTF-8, copied
    /// from a `str`).
    Inline { len: u8, bytes: [u8; INLINE_BYTES] },
    /// `Some` of a text longer than [`INLINE_BYTES`].
    Heap(Box<str>),
}

impl InlineText {
    /// The form of `key`: inline (copied, and the `String` dropped) when
    /// short enough, else the `String` as the heap form (no copy when its
    /// capacity is its length, as the crate's extractors make it).
    pub(crate) fn of(key: Option<String>) -> Self {
        match key {
            None => InlineText::Absent,
            Some(text) if text.len() <= INLINE_BYTES => {
                let mut bytes = [0u8; INLINE_BYTES];
                bytes[..text.len()].copy_from_slice(text.as_bytes());
                InlineText::Inline {
                    // At most `INLINE_BYTES` (70): fits a byte.
                    len: text.len() as u8,
                    bytes,
                }
            }
            Some(text) => InlineText::Heap(text.into_boxed_str()),
        }
    }

    /// The key as `Option<&str>`.
    pub(crate) fn text(&self) -> Option<Cow<'_, str>> {
        match self {
            InlineText::Absent => None,
            InlineText::Inline { len, bytes } => {
                // Copied from a `str` whole: always valid, borrowed.
                Some(String::from_utf8_lossy(&bytes[..usize::from(*len)]))
            }
            InlineText::Heap(text) => Some(Cow::Borrowed(text)),
        }
    }

    /// Whether this is the key `key`, without making a `String`.
    #[inline(always)]
    pub(crate) fn is_text(&self, key: Option<&str>) -> bool {
        match (self, key) {
            (InlineText::Absent, None) => true,
            (InlineText::Inline { len, bytes }, Some(text)) => {
                equal_short(&bytes[..usize::from(*len)], text.as_bytes())
            }
            (InlineText::Heap(held), Some(text)) => **held == *text,
            _ => false,
        }
    }
}

/// `a == b` without a call for up to 32 bytes: two overlapping
/// comparisons of a fixed size, as `memcmp` does inside. Every lookup of
/// a string key compares it with the slot's text this way.
#[inline(always)]
fn equal_short(a: &[u8], b: &[u8]) -> bool {
    fn word<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
        bytes[at..at + N].try_into().expect("N bytes from `at`")
    }
    let n = a.len();
    if b.len() != n {
        return false;
    }
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => word::<4>(a, 0) == word::<4>(b, 0) && word::<4>(a, n - 4) == word::<4>(b, n - 4),
        8..=16 => word::<8>(a, 0) == word::<8>(b, 0) && word::<8>(a, n - 8) == word::<8>(b, n - 8),
        17..=32 => {
            word::<16>(a, 0) == word::<16>(b, 0) && word::<16>(a, n - 16) == word::<16>(b, n - 16)
        }
        _ => a == b,
    }
}

/// Whether a table with keys `K` holds them as [`InlineText`]: exactly
/// for `Option<String>`. Both type ids are constants of the build, so the
/// comparison is folded away.
#[inline(always)]
pub(crate) fn inline_text<K: 'static>() -> bool {
    TypeId::of::<K>() == TypeId::of::<Option<String>>()
}

impl<K: Clone + 'static> Form<K> for InlineText {
    type Probe<'a>
        = Option<&'a str>
    where
        K: 'a;

    #[inline]
    fn probe(key: &K) -> Option<Option<&str>> {
        (key as &dyn Any)
            .downcast_ref::<Option<String>>()
            .map(Option::as_deref)
    }

    fn store(key: &mut Option<K>) -> Option<Self> {
        let key = (key as &mut dyn Any).downcast_mut::<Option<Option<String>>>()?;
        key.take().map(InlineText::of)
    }

    #[inline]
    fn is<Q: Eq + ?Sized>(&self, probe: Option<&Option<&str>>, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        match probe {
            Some(probe) => self.is_text(*probe),
            // A lookup by another form of the key (not made by the crate's
            // extractors): compared with the key made from the slot.
            None => <Self as Form<K>>::key(self).is_some_and(|held| (*held).borrow() == key),
        }
    }

    fn key(&self) -> Option<Cow<'_, K>> {
        let mut key = Some(self.text().map(Cow::into_owned));
        (&mut key as &mut dyn Any)
            .downcast_mut::<Option<K>>()
            .and_then(Option::take)
            .map(Cow::Owned)
    }
}

/// A slot's key cell, whatever its key type: what it takes, and its empty
/// state. Whether a slot holds a key is its tag's to say (a vacant shared
/// slot keeps the key it had, see the table's `PutKey::vacate`).
pub(crate) trait Cell: Sized + Send + Sync {
    /// A key as the cell takes it, made before the slot is touched.
    type Stored;

    /// An empty cell.
    fn empty() -> Self;
}

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

    /// Whether the cell holds the key `key` (with `probe`, its probe, when
    /// the lookup has it).
    fn is<Q: Eq + ?Sized>(&self, probe: Option<&Self::Probe<'_>>, key: &Q) -> bool
    where
        K: Borrow<Q>;

    /// The key held, borrowed when held as it is, else made.
    fn key(&self) -> Option<Cow<'_, K>>;

    /// The key to show a request: `own` (the request's own key, equal to
    /// the one held) when the cell would have to make it, else the held
    /// one.
    #[inline]
    fn shown<'a>(&'a self, own: Option<&'a K>) -> Option<Cow<'a, K>> {
        match own {
            Some(own) => Some(Cow::Borrowed(own)),
            None => self.key(),
        }
    }
}

/// A form's key behind the group's lock: written only under its write
/// lock, which gives the table `&mut` access.
impl<S: Send + Sync> Cell for Option<S> {
    type Stored = S;

    fn empty() -> Self {
        None
    }
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
    fn is<Q: Eq + ?Sized>(&self, probe: Option<&S::Probe<'_>>, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.as_ref().is_some_and(|held| held.is(probe, key))
    }

    #[inline]
    fn key(&self) -> Option<Cow<'_, K>> {
        self.as_ref().and_then(Form::key)
    }

    #[inline]
    fn shown<'a>(&'a self, own: Option<&'a K>) -> Option<Cow<'a, K>> {
        self.as_ref().and_then(|held| held.shown(own))
    }
}

/// Whether a table with keys `K` holds them as [`AtomicAddr`]: exactly
/// for `Option<IpAddr>`, a constant of the build as for [`inline_text`].
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

    /// The cell's state if it holds the key of `bits`, for a lookup without
    /// the lock: pass it to [`unchanged`](Self::unchanged) once the
    /// decision is recorded.
    #[inline(always)]
    pub(crate) fn seen(&self, bits: &AddrBits) -> Option<u32> {
        // Acquire: the words of this state are visible below.
        let state = self.state.load(Ordering::Acquire);
        // Never for a vacant cell: the key it keeps is not in the slot.
        let same = (state & (KIND | VACANT) == bits.kind)
            & (self.words[0].load(Ordering::Relaxed) == bits.words[0])
            & (self.words[1].load(Ordering::Relaxed) == bits.words[1])
            & (self.words[2].load(Ordering::Relaxed) == bits.words[2])
            & (self.words[3].load(Ordering::Relaxed) == bits.words[3]);
        same.then_some(state)
    }

    /// Whether the cell still holds the key of `seen` (a state
    /// [`seen`](Self::seen) returned), loaded after a decision recorded on
    /// the slot's value (see the table's module docs). A key that left
    /// since counts as held: it left with its value sealed after the
    /// decision, which the moved value therefore holds.
    #[inline(always)]
    pub(crate) fn unchanged(&self, seen: u32) -> bool {
        // Acquire: a key change whose value store the decision's swap read
        // (or came after) is seen here.
        self.state.load(Ordering::Acquire) & !VACANT == seen
    }

    /// Marks the key as gone (under the group's write lock, with the
    /// slot's value sealed and moved out), keeping its version.
    pub(crate) fn vacate(&self) {
        let state = self.state.load(Ordering::Relaxed);
        self.state.store(state | VACANT, Ordering::Release);
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

    fn empty() -> Self {
        AtomicAddr::new()
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
    fn is<Q: Eq + ?Sized>(&self, probe: Option<&AddrBits>, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        match probe {
            Some(bits) => self.seen(bits).is_some(),
            // A lookup by another form of the key (not made by the crate's
            // extractors): compared with the key made from the cell.
            None => <Self as KeyCell<K>>::key(self).is_some_and(|held| (*held).borrow() == key),
        }
    }

    fn key(&self) -> Option<Cow<'_, K>> {
        let mut key = Some(self.bits()?.key());
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
    fn an_inline_text_is_no_larger_than_a_pointer_variant_needs() {
        assert_eq!(std::mem::size_of::<InlineText>(), 72);
        assert_eq!(std::mem::size_of::<Option<InlineText>>(), 72);
    }

    type Key = Option<String>;

    fn stored(key: &Key) -> InlineText {
        <InlineText as Form<Key>>::store(&mut Some(key.clone())).expect("an Option<String>")
    }

    /// Texts around the inline limit (70 bytes), multi-byte characters
    /// ending at and across it, and the absent key: each is stored in the
    /// form its length calls for, reads back as it was, and is found by
    /// its probe and by reference, and by no other key's.
    #[test]
    fn option_string_keys_read_back_as_stored_in_either_form() {
        let mut keys: Vec<Key> = [0usize, 1, 63, 64, 65, 69, 70, 71, 72, 255, 256, 4096]
            .into_iter()
            .map(|len| Some("k".repeat(len)))
            .collect();
        keys.push(Some("é".repeat(35)));
        keys.push(Some(format!("k{}", "é".repeat(35))));
        keys.push(Some("\x7facme\\xff".to_owned()));
        keys.push(None);
        for key in &keys {
            let held = stored(key);
            let inline = key.as_ref().is_some_and(|text| text.len() <= INLINE_BYTES);
            assert_eq!(matches!(held, InlineText::Inline { .. }), inline, "{key:?}");
            assert_eq!(
                matches!(held, InlineText::Heap(_)),
                key.as_ref().is_some_and(|text| text.len() > INLINE_BYTES),
                "{key:?}"
            );
            assert_eq!(<InlineText as Form<Key>>::key(&held).as_deref(), Some(key));
            for other in &keys {
                let probe = <InlineText as Form<Key>>::probe(other);
                assert!(probe.is_some());
                let by_probe = <InlineText as Form<Key>>::is(&held, probe.as_ref(), other);
                let by_reference = <InlineText as Form<Key>>::is(&held, None, other);
                assert_eq!(by_probe, key == other, "{key:?} against {other:?}");
                assert_eq!(by_reference, key == other, "{key:?} against {other:?}");
            }
        }
    }

    /// A form is never given a key of another type (the table picks it from
    /// the type); if it were, it would leave the key where it was.
    #[test]
    fn an_inline_text_takes_no_key_of_another_type() {
        let mut key = Some(String::from("k"));
        assert!(<InlineText as Form<String>>::store(&mut key).is_none());
        assert_eq!(key.as_deref(), Some("k"));
        assert!(<InlineText as Form<String>>::probe(&"k".to_owned()).is_none());
    }

    #[test]
    fn a_short_comparison_agrees_with_slice_equality_at_every_length() {
        let a: Vec<u8> = (1..=80).collect();
        for n in 0..=80 {
            assert!(equal_short(&a[..n], &a[..n]), "length {n}");
            // One byte changed anywhere, and one byte more or less.
            for i in 0..n {
                let mut b = a[..n].to_vec();
                b[i] ^= 0x80;
                assert!(!equal_short(&a[..n], &b), "length {n}, byte {i}");
            }
            if n > 0 {
                assert!(!equal_short(&a[..n], &a[..n - 1]), "length {n}");
            }
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
                <AtomicAddr as KeyCell<Key>>::key(&cell).as_deref(),
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
                    Some(&AddrBits::of(other)),
                    other
                ));
                assert!(!KeyCell::<Key>::is(&cell, None, other));
            }
            assert!(KeyCell::<Key>::is(&cell, None, key));
            cell.vacate();
            assert!(cell.seen(&bits).is_none(), "{key:?} vacated");
            assert!(cell.unchanged(seen), "a vacated key keeps its version");
            assert_eq!(<AtomicAddr as KeyCell<Key>>::key(&cell), None);
            cell.put(Some(&bits));
            assert!(!cell.unchanged(seen), "{key:?} taken again: a new version");
        }
    }

    #[test]
    fn only_option_string_keys_are_held_inline() {
        assert!(inline_text::<Option<String>>());
        assert!(!inline_text::<String>());
        assert!(!inline_text::<Option<std::net::IpAddr>>());
        assert!(!inline_text::<Option<Box<str>>>());
    }
}
