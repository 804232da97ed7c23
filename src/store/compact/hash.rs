//! The compact table's key hash: SipHash-1-3 under a random key, the
//! function and strength of std's `RandomState`, with the key's bytes
//! gathered into whole words in registers.
//!
//! A key's `Hash` impl makes several small writes: `Option<IpAddr>` writes
//! two discriminants and the address, `Option<String>` a discriminant, the
//! bytes and a terminator. std's SipHash takes each write through its
//! byte-stream bookkeeping (a call, the carried-over tail, the length).
//! [`Gathered`] shifts each write into the word being filled instead, and
//! compresses a word when it is full: the writes of a key are inlined into
//! one function, where the sizes of most of them are constants, so an
//! address key's words are put together in registers and the message
//! never passes through memory. (Gathering the bytes in a buffer on the
//! stack and reading them back as words costs a stalled load per word: a
//! load that spans several smaller stores still in flight cannot take its
//! bytes from them and waits for them to reach the cache.)
//!
//! The hash is the SipHash-1-3 of the bytes the key writes, in order,
//! however the writes are cut, so a key and its borrowed form hash alike,
//! as `K: Borrow<Q>` requires. One thing differs from std's byte stream:
//! discriminants and lengths below 255 (nearly all of them) are one byte,
//! not eight, in a code that keeps distinct keys' streams distinct (see
//! [`Gathered::small`]): fewer words to compress. The key of the function
//! is drawn once per table from std's `RandomState` (the system's
//! randomness), so a client cannot choose keys that land in one group.

use std::hash::{BuildHasher, Hash, Hasher};

/// SipHash's initial state constants ("somepseudorandomlygeneratedbytes").
const INIT: [u64; 4] = [
    0x736f_6d65_7073_6575,
    0x646f_7261_6e64_6f6d,
    0x6c79_6765_6e65_7261,
    0x7465_6462_7974_6573,
];

/// The four words of SipHash's state.
#[derive(Clone, Copy)]
struct Sip([u64; 4]);

impl Sip {
    #[inline]
    fn new([k0, k1]: [u64; 2]) -> Sip {
        Sip([INIT[0] ^ k0, INIT[1] ^ k1, INIT[2] ^ k0, INIT[3] ^ k1])
    }

    /// One SipRound.
    #[inline(always)]
    fn round(&mut self) {
        let [v0, v1, v2, v3] = &mut self.0;
        *v0 = v0.wrapping_add(*v1);
        *v1 = v1.rotate_left(13) ^ *v0;
        *v0 = v0.rotate_left(32);
        *v2 = v2.wrapping_add(*v3);
        *v3 = v3.rotate_left(16) ^ *v2;
        *v0 = v0.wrapping_add(*v3);
        *v3 = v3.rotate_left(21) ^ *v0;
        *v2 = v2.wrapping_add(*v1);
        *v1 = v1.rotate_left(17) ^ *v2;
        *v2 = v2.rotate_left(32);
    }

    /// Absorbs one message word with `C` rounds.
    #[inline(always)]
    fn compress<const C: usize>(&mut self, m: u64) {
        self.0[3] ^= m;
        for _ in 0..C {
            self.round();
        }
        self.0[0] ^= m;
    }

    /// Absorbs the whole words of `words` (a multiple of 8 bytes).
    #[cfg(test)]
    fn compress_words<const C: usize>(&mut self, words: &[u8]) {
        for word in words.chunks_exact(8) {
            let word: [u8; 8] = word.try_into().expect("chunks of 8 bytes");
            self.compress::<C>(u64::from_le_bytes(word));
        }
    }

    /// Absorbs the final block (`tail`: the message's last `len % 8`
    /// bytes, in the low bytes of a word whose other bytes may be
    /// anything, and the low byte of the message's length) and finishes
    /// with `D` rounds.
    #[inline(always)]
    fn finish<const C: usize, const D: usize>(mut self, tail: u64, len: usize) -> u64 {
        let kept = (len % 8) as u32 * 8;
        let tail = tail & ((1u64 << kept) - 1);
        let last = tail | ((len as u64) << 56);
        self.compress::<C>(last);
        self.0[2] ^= 0xff;
        for _ in 0..D {
            self.round();
        }
        let [v0, v1, v2, v3] = self.0;
        v0 ^ v1 ^ v2 ^ v3
    }
}

#[cfg(test)]
/// The word at `at` of `bytes`, little-endian, with zeros past the end.
#[inline(always)]
fn word_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    let end = bytes.len().min(at + 8);
    word[..end - at].copy_from_slice(&bytes[at..end]);
    u64::from_le_bytes(word)
}

/// Builds [`Gathered`] hashers on one random SipHash key.
#[derive(Clone)]
pub(crate) struct GatherState {
    key: [u64; 2],
}

impl std::fmt::Debug for GatherState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs: with it, keys that share a group
        // could be searched for offline.
        f.debug_struct("GatherState").finish_non_exhaustive()
    }
}

impl Default for GatherState {
    fn default() -> Self {
        Self::new()
    }
}

impl GatherState {
    /// A state on a fresh random key; under loom, on the zero key (a
    /// model must take the same path on every execution it explores, and
    /// a key's groups and home slot come from its hash).
    pub(crate) fn new() -> Self {
        #[cfg(loom)]
        let key = [0, 0];
        #[cfg(not(loom))]
        let key = {
            // Two outputs of std's randomly keyed SipHash: 128 bits no
            // one outside the process can predict.
            let random = std::hash::RandomState::new();
            [random.hash_one(0u8), random.hash_one(1u8)]
        };
        GatherState { key }
    }

    /// The state on a given key: for checking the hash against known
    /// values.
    #[cfg(test)]
    fn with_key(key: [u64; 2]) -> Self {
        GatherState { key }
    }

    /// The hash of `key`: what `hash_one` gives. Out of line, for the
    /// table's general lookup and its inserts: inlined into the general
    /// lookup, an address key's hash made a request 40 instructions
    /// longer (`perf/counts/layer.rs`).
    #[inline(never)]
    pub(crate) fn hash_key<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hash_inline(key)
    }

    /// [`hash_key`](Self::hash_key), inlined into the caller: for the
    /// table's plain lookups, where the hash runs on the key where the
    /// request has it (82 instructions fewer per request with a 9-byte
    /// header key, 12 with an address key, `perf/counts/layer.rs`).
    #[inline(always)]
    pub(crate) fn hash_inline<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        let mut hasher = self.build_hasher();
        key.hash(&mut hasher);
        hasher.hash()
    }
}

impl BuildHasher for GatherState {
    type Hasher = Gathered;

    #[inline]
    fn build_hasher(&self) -> Gathered {
        Gathered {
            sip: Sip::new(self.key),
            word: 0,
            filled: 0,
            len: 0,
        }
    }
}

/// A SipHash-1-3 hasher that gathers writes into whole words (see the
/// module docs).
pub(crate) struct Gathered {
    /// The state after every whole word so far.
    sip: Sip,
    /// The bytes after the last whole word, in its low `filled` bytes
    /// (little-endian); its other bytes are zero.
    word: u64,
    /// How many bytes of `word` are filled: `len % 8`, below 8.
    filled: usize,
    /// Bytes written so far (SipHash keeps only the low byte).
    len: usize,
}

/// `bytes` (at most 8 of them) as the low bytes of a little-endian word
/// whose other bytes are zero, read with at most two loads of a fixed
/// size, overlapping when the length is not a power of two.
#[inline(always)]
fn short_word(bytes: &[u8]) -> u64 {
    fn at<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
        bytes[at..at + N].try_into().expect("N bytes from `at`")
    }
    let n = bytes.len();
    match n {
        8 => u64::from_le_bytes(at::<8>(bytes, 0)),
        // The two halves agree where they overlap, so or-ing them is
        // the whole.
        4..=7 => {
            let low = u64::from(u32::from_le_bytes(at::<4>(bytes, 0)));
            let high = u64::from(u32::from_le_bytes(at::<4>(bytes, n - 4)));
            low | high << (8 * (n - 4))
        }
        2..=3 => {
            let low = u64::from(u16::from_le_bytes(at::<2>(bytes, 0)));
            let high = u64::from(u16::from_le_bytes(at::<2>(bytes, n - 2)));
            low | high << (8 * (n - 2))
        }
        1 => u64::from(bytes[0]),
        _ => 0,
    }
}

impl Gathered {
    /// The hash of the bytes written so far.
    #[inline(always)]
    fn hash(&self) -> u64 {
        self.sip.finish::<1, 3>(self.word, self.len)
    }

    /// Appends the `n` bytes (at most 8) in the low bytes of `bytes`,
    /// whose other bytes are zero; compresses the word they fill.
    #[inline(always)]
    fn push(&mut self, bytes: u64, n: usize) {
        debug_assert!(n <= 8 && (n == 8 || bytes >> (8 * n) == 0));
        self.len = self.len.wrapping_add(n);
        let filled = self.filled;
        // `filled` is below 8: the shift is at most 56.
        let word = self.word | bytes << (8 * filled);
        if filled + n < 8 {
            self.word = word;
            self.filled = filled + n;
        } else {
            self.sip.compress::<1>(word);
            // What did not fit: the top `filled + n - 8` bytes of `bytes`.
            self.word = if filled == 0 {
                0
            } else {
                bytes >> (8 * (8 - filled))
            };
            self.filled = filled + n - 8;
        }
    }

    /// Writes `value` in one byte if it is below 255, else as the byte 255
    /// and its eight bytes: a code no value's bytes are a prefix of
    /// another's, so distinct sequences of writes stay distinct streams.
    /// Discriminants and lengths, written as 8 bytes by default, are
    /// nearly always small: an IPv4 key is 6 bytes instead of 20 (one
    /// SipHash block instead of three), an IPv6 key 18 instead of 32.
    #[inline(always)]
    fn small(&mut self, value: u64) {
        if value < 0xFF {
            self.push(value, 1);
        } else {
            self.push(0xFF, 1);
            self.push(value, 8);
        }
    }

    /// Writes more than 8 bytes: a word at a time, then the rest.
    #[inline]
    fn long(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let word: [u8; 8] = word.try_into().expect("chunks of 8 bytes");
            self.push(u64::from_le_bytes(word), 8);
        }
        let rest = words.remainder();
        self.push(short_word(rest), rest.len());
    }
}

impl Hasher for Gathered {
    #[inline(always)]
    fn write(&mut self, bytes: &[u8]) {
        if bytes.len() <= 8 {
            self.push(short_word(bytes), bytes.len());
        } else {
            self.long(bytes);
        }
    }

    /// Lengths (of slices, of collections) are written here: see
    /// [`Gathered::small`].
    #[inline(always)]
    fn write_usize(&mut self, value: usize) {
        self.small(value as u64);
    }

    /// Enum discriminants (`Option`'s, `IpAddr`'s) are written here: see
    /// [`Gathered::small`].
    #[inline(always)]
    fn write_isize(&mut self, value: isize) {
        self.small(value as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash()
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    /// SipHash-2-4 of `bytes` on `key`, on this module's rounds.
    fn sip24(key: [u64; 2], bytes: &[u8]) -> u64 {
        let mut sip = Sip::new(key);
        let whole = bytes.len() - bytes.len() % 8;
        sip.compress_words::<2>(&bytes[..whole]);
        sip.finish::<2, 4>(word_at(bytes, whole), bytes.len())
    }

    /// A header key's text, lent as `Option<&str>`, hashes as its key
    /// `Option<String>` (the compact table looks it up by that hash).
    #[test]
    fn a_lent_text_hashes_as_its_owned_key() {
        let state = GatherState::new();
        for len in 0..=80 {
            let text: String = (0..len)
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect();
            assert_eq!(
                state.hash_key(&Some(text.as_str())),
                state.hash_key(&Some(text.clone())),
                "length {len}"
            );
        }
        let wide = "é".repeat(40);
        assert_eq!(
            state.hash_key(&Some(wide.as_str())),
            state.hash_key(&Some(wide.clone()))
        );
        assert_eq!(
            state.hash_key(&None::<&str>),
            state.hash_key(&None::<String>)
        );
        assert_ne!(state.hash_key(&Some("")), state.hash_key(&None::<&str>));
    }

    #[test]
    fn the_rounds_give_the_reference_siphash_2_4_values() {
        // The reference vectors of the SipHash paper (Aumasson and
        // Bernstein, appendix A): key 00 01 .. 0f, messages 00 01 .. (n-1).
        let key = [0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908];
        let message: Vec<u8> = (0..64).collect();
        let expected: [(usize, u64); 4] = [
            (0, 0x726f_db47_dd0e_0e31),
            (1, 0x74f8_39c5_93dc_67fd),
            (8, 0x93f5_f579_9a93_2462),
            (15, 0xa129_ca61_49be_45e5),
        ];
        for (len, hash) in expected {
            assert_eq!(sip24(key, &message[..len]), hash, "length {len}");
        }
    }

    #[test]
    #[allow(deprecated)]
    fn siphash_2_4_agrees_with_std_at_every_length() {
        // std still exposes SipHash-2-4 (`SipHasher`, deprecated): the
        // same rounds and padding at every length and key.
        let message: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for key in [[0, 0], [1, 2], [u64::MAX, 0x0123_4567_89ab_cdef]] {
            for len in 0..message.len() {
                let mut std = std::hash::SipHasher::new_with_keys(key[0], key[1]);
                std.write(&message[..len]);
                assert_eq!(sip24(key, &message[..len]), std.finish(), "length {len}");
            }
        }
    }

    #[test]
    fn on_the_zero_key_the_hash_is_stds_default_hasher() {
        // std's `DefaultHasher::new()` is SipHash-1-3 on the zero key
        // today; the gathered hash of any cut of any message is the same.
        let state = GatherState::with_key([0, 0]);
        let message: Vec<u8> = (0..300u32).map(|i| (i * 13 + 1) as u8).collect();
        for len in 0..message.len() {
            let mut std = std::hash::DefaultHasher::new();
            std.write(&message[..len]);
            let mut ours = state.build_hasher();
            ours.write(&message[..len]);
            assert_eq!(ours.finish(), std.finish(), "length {len}");
        }
    }

    /// The SipHash-1-3 of `bytes` on the zero key (std's today).
    fn std_of(bytes: &[u8]) -> u64 {
        let mut std = std::hash::DefaultHasher::new();
        std.write(bytes);
        std.finish()
    }

    #[test]
    fn a_discriminant_or_length_below_255_is_one_byte_and_any_other_nine() {
        let state = GatherState::with_key([0, 0]);
        let hashed = |write: &dyn Fn(&mut Gathered)| {
            let mut hasher = state.build_hasher();
            write(&mut hasher);
            hasher.finish()
        };
        for value in [0usize, 1, 7, 254] {
            assert_eq!(hashed(&|h| h.write_usize(value)), std_of(&[value as u8]));
            assert_eq!(
                hashed(&|h| h.write_isize(value as isize)),
                std_of(&[value as u8])
            );
        }
        for value in [255u64, 256, 1 << 40, u64::MAX] {
            let mut marked = vec![0xFF];
            marked.extend_from_slice(&value.to_le_bytes());
            assert_eq!(hashed(&|h| h.write_usize(value as usize)), std_of(&marked));
            assert_eq!(hashed(&|h| h.write_isize(value as isize)), std_of(&marked));
        }
        // A key's text: its discriminant, its bytes, str's terminator.
        let text = Some(String::from("client-42"));
        assert_eq!(state.hash_key(&text), std_of(b"\x01client-42\xff"));
        assert_eq!(state.hash_key(&None::<String>), std_of(&[0]));
    }

    #[test]
    fn address_keys_of_every_kind_hash_apart() {
        // No two of these keys share a hash: IPv4, IPv6 with the same low
        // bits, IPv4-mapped forms, and no address at all.
        let state = GatherState::new();
        let mut keys: Vec<Option<IpAddr>> = vec![None];
        for i in 0..2_000u32 {
            keys.push(Some(IpAddr::from(std::net::Ipv4Addr::from(i))));
            keys.push(Some(IpAddr::from(std::net::Ipv6Addr::from(u128::from(i)))));
            keys.push(Some(IpAddr::from(
                std::net::Ipv4Addr::from(i).to_ipv6_mapped(),
            )));
        }
        let hashes: std::collections::HashSet<u64> =
            keys.iter().map(|key| state.hash_key(key)).collect();
        assert_eq!(hashes.len(), keys.len());
    }

    #[test]
    fn a_key_and_its_borrowed_form_hash_alike_whatever_their_length() {
        let state = GatherState::new();
        for len in [0, 1, 7, 8, 9, 55, 56, 63, 64, 65, 127, 128, 300] {
            let text = "k".repeat(len);
            assert_eq!(
                state.hash_one(text.clone()),
                state.hash_one(text.as_str()),
                "length {len}"
            );
            assert_eq!(
                state.hash_key(text.as_str()),
                state.hash_one(text.as_str()),
                "length {len}"
            );
            assert_eq!(
                state.hash_key(&Some(text.clone())),
                state.hash_one(Some(text)),
                "length {len}"
            );
        }
    }

    #[test]
    fn the_gathered_hash_is_the_hash_of_the_bytes_written_in_one_piece() {
        // Gathering changes how the bytes reach SipHash, not which bytes:
        // the same sequence, cut anywhere, hashes alike. Every pair of
        // cuts of a message of up to 40 bytes starts a write at every
        // filling of the word with every length up to 40, then longer
        // messages with cuts around word and 64-byte boundaries.
        let state = GatherState::new();
        let bytes: Vec<u8> = (0..200u8).map(|i| i.wrapping_mul(151) ^ 0x5a).collect();
        let whole = |bytes: &[u8]| {
            let mut hasher = state.build_hasher();
            hasher.write(bytes);
            hasher.finish()
        };
        let cut = |bytes: &[u8], first: usize, second: usize| {
            let mut pieces = state.build_hasher();
            pieces.write(&bytes[..first]);
            pieces.write(&bytes[first..second]);
            pieces.write(&bytes[second..]);
            pieces.finish()
        };
        for len in 0..=40 {
            let message = &bytes[..len];
            let expected = whole(message);
            for first in 0..=len {
                for second in first..=len {
                    assert_eq!(
                        cut(message, first, second),
                        expected,
                        "length {len}, cuts at {first} and {second}"
                    );
                }
            }
        }
        for first in [0, 1, 17, 63, 64, 65, 130, 200] {
            for second in [first, (first + 70).min(200), 200] {
                assert_eq!(
                    cut(&bytes, first, second),
                    whole(&bytes),
                    "cuts at {first} and {second}"
                );
            }
        }
    }

    #[test]
    fn fixed_size_writes_are_their_little_endian_bytes() {
        // std sends `write_u8` to `write_u64` to `write` with the value's
        // bytes in the machine's order; on a little-endian machine that
        // is the byte stream SipHash reads.
        let state = GatherState::with_key([0, 0]);
        let mut hasher = state.build_hasher();
        hasher.write_u8(0x11);
        hasher.write_u16(0x2233);
        hasher.write_u32(0x4455_6677);
        hasher.write_u64(0x8899_aabb_ccdd_eeff);
        let mut expected = vec![0x11];
        expected.extend_from_slice(&0x2233u16.to_ne_bytes());
        expected.extend_from_slice(&0x4455_6677u32.to_ne_bytes());
        expected.extend_from_slice(&0x8899_aabb_ccdd_eeffu64.to_ne_bytes());
        assert_eq!(hasher.finish(), std_of(&expected));
    }

    #[test]
    fn distinct_keys_hash_apart_and_seeds_differ() {
        let state = GatherState::new();
        let a: Option<IpAddr> = Some("10.0.0.1".parse().unwrap());
        let b: Option<IpAddr> = Some("10.0.0.2".parse().unwrap());
        assert_ne!(state.hash_one(a), state.hash_one(b));
        assert_ne!(state.hash_one(a), state.hash_one(None::<IpAddr>));
        assert_ne!(GatherState::new().hash_one(a), state.hash_one(a));
    }

    #[test]
    fn the_debug_form_shows_no_key() {
        let state = GatherState::with_key([0x1234_5678, 0x9abc_def0]);
        let shown = format!("{state:?}");
        assert!(
            !shown.contains("305419896") && !shown.contains("12345678"),
            "{shown}"
        );
    }
}
