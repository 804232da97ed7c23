//! The compact table's key hash: the table's randomly seeded SipHash, fed
//! in one write.
//!
//! A key's `Hash` impl makes several small writes: `Option<IpAddr>` writes
//! two discriminants and the address, `Option<String>` a discriminant, the
//! bytes and a terminator. SipHash pays a call and its tail bookkeeping for
//! each. [`Gathered`] copies the writes of a short key into a buffer on the
//! stack and hands SipHash the lot in one write when the hash is taken, so
//! that a key costs one pass; a key longer than the buffer is written as it
//! comes. Both forms of a key (owned and borrowed) go through the same
//! gathering, so they still hash alike, as `K: Borrow<Q>` requires.

use std::hash::{BuildHasher, DefaultHasher, Hash, Hasher, RandomState};

/// Bytes gathered before they are written: room for any address key and
/// for the string keys most clients send.
const GATHER: usize = 64;

/// Builds [`Gathered`] hashers on one random SipHash key.
#[derive(Debug, Clone, Default)]
pub(crate) struct GatherState(
    // Unread under loom, whose models hash with fixed keys.
    #[cfg_attr(loom, allow(dead_code))] RandomState,
);

impl GatherState {
    pub(crate) fn new() -> Self {
        GatherState(RandomState::new())
    }

    /// The hash of `key`: what `hash_one` gives, without the copy of
    /// SipHash's state that `Hasher::finish` (which borrows) must make.
    #[inline]
    pub(crate) fn hash_key<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        let mut hasher = self.build_hasher();
        key.hash(&mut hasher);
        let Gathered {
            mut inner,
            buffer,
            len,
        } = hasher;
        inner.write(&buffer[..len]);
        inner.finish()
    }
}

impl BuildHasher for GatherState {
    type Hasher = Gathered;

    #[inline]
    fn build_hasher(&self) -> Gathered {
        // Under loom, SipHash's fixed keys: a model must take the same
        // path on every execution it explores, and a key's groups and home
        // slot come from its hash.
        #[cfg(loom)]
        let inner = DefaultHasher::new();
        #[cfg(not(loom))]
        let inner = self.0.build_hasher();
        Gathered {
            inner,
            buffer: [0; GATHER],
            len: 0,
        }
    }
}

/// A SipHash hasher that gathers short writes (see the module docs).
pub(crate) struct Gathered {
    inner: DefaultHasher,
    buffer: [u8; GATHER],
    /// Bytes of `buffer` in use.
    len: usize,
}

impl Gathered {
    /// Writes what was gathered.
    #[inline]
    fn flush(&mut self) {
        self.inner.write(&self.buffer[..self.len]);
        self.len = 0;
    }
}

impl Hasher for Gathered {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if end <= GATHER {
            self.buffer[self.len..end].copy_from_slice(bytes);
            self.len = end;
            return;
        }
        self.flush();
        if bytes.len() <= GATHER {
            self.buffer[..bytes.len()].copy_from_slice(bytes);
            self.len = bytes.len();
        } else {
            self.inner.write(bytes);
        }
    }

    #[inline]
    fn finish(&self) -> u64 {
        let mut inner = self.inner.clone();
        inner.write(&self.buffer[..self.len]);
        inner.finish()
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

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
        // the same sequence, cut anywhere, hashes alike.
        let state = GatherState::new();
        let bytes: Vec<u8> = (0..200u8).collect();
        for cut in [0, 1, 17, 63, 64, 65, 130, 200] {
            for second in [cut, (cut + 70).min(200), 200] {
                let mut pieces = state.build_hasher();
                pieces.write(&bytes[..cut]);
                pieces.write(&bytes[cut..second]);
                pieces.write(&bytes[second..]);
                let mut whole = state.build_hasher();
                whole.write(&bytes);
                assert_eq!(
                    pieces.finish(),
                    whole.finish(),
                    "cuts at {cut} and {second}"
                );
            }
        }
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
}
