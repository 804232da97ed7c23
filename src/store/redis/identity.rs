//! The identity of a key in Redis: the same on every replica.
//!
//! A key's Redis name must not depend on the process that computes it, so
//! it cannot come from `Hash` (whose output is not promised stable across
//! builds) nor from a per-process random hasher. Instead each key type
//! writes a stable byte form of itself ([`StoreKey`]), and the name is a
//! 128-bit HighwayHash of those bytes under a fixed, published hash key: 32
//! hex digits, whatever the key's length or bytes.

use std::fmt::Write as _;
use std::net::IpAddr;

use highway::{HighwayHash, HighwayHasher, Key};

/// A key type whose keys can be shared through a
/// [`RedisStore`](super::RedisStore): it writes a byte form of each key
/// that is the same on every replica, in every build.
///
/// Two keys that are equal must write the same bytes, and two keys that
/// differ should write different bytes (keys whose bytes are equal share
/// one window in Redis). The built-in key types implement it:
///
/// | key type | bytes written |
/// | --- | --- |
/// | `()` | tag `0` |
/// | `String`, `str` | tag `1`, length (8 bytes, little-endian), the bytes |
/// | `Option<T>` | tag `2` for `None`; tag `3` then `T`'s bytes for `Some` |
/// | `IpAddr` | tag `4` and 4 bytes (IPv4), or tag `6` and 16 bytes (IPv6) |
/// | `u64`, `u32`, `i64` | tag `8` and 8 bytes, little-endian (signed as two's complement) |
/// | `(A, B)` | `A`'s bytes, then `B`'s |
///
/// So a `PathKey` key `"/login"` and a `HeaderKey` key
/// `Some("/login")` are different keys, and a rule written as `"/login"`
/// (a `&str`) names the same key as the `String` the extractor returns.
///
/// A key type of your own implements it by writing its parts in order,
/// each in a form that cannot run into the next (lengths before bytes):
///
/// ```
/// use tower_sliding_window::store::{KeyBytes, StoreKey};
///
/// #[derive(Clone, PartialEq, Eq, Hash)]
/// struct Tenant {
///     name: String,
///     plan: u32,
/// }
///
/// impl StoreKey for Tenant {
///     fn write_bytes(&self, out: &mut KeyBytes) {
///         self.name.write_bytes(out);
///         self.plan.write_bytes(out);
///     }
/// }
/// ```
pub trait StoreKey {
    /// Writes this key's stable byte form to `out`.
    fn write_bytes(&self, out: &mut KeyBytes);
}

/// Where a [`StoreKey`] writes its bytes: they are hashed as they come, so
/// a long key costs no copy.
pub struct KeyBytes {
    hasher: HighwayHasher,
    len: u64,
}

impl std::fmt::Debug for KeyBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyBytes")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// The fixed HighwayHash key: the ASCII bytes of "tower-sliding-window/redis
/// key v1" and padding. Changing it renames every key in Redis.
const IDENTITY_KEY: Key = Key([
    0x7377_2d72_6577_6f74,
    0x772d_676e_6964_696c,
    0x6572_2f77_6f64_6e69,
    0x3176_2079_656b_2073,
]);

impl KeyBytes {
    fn new() -> Self {
        KeyBytes {
            hasher: HighwayHasher::new(IDENTITY_KEY),
            len: 0,
        }
    }

    /// Writes raw bytes. Use it for parts of a fixed length; write a length
    /// first for parts whose length varies.
    pub fn write(&mut self, bytes: &[u8]) {
        self.hasher.append(bytes);
        self.len = self.len.saturating_add(bytes.len() as u64);
    }

    /// Writes one tag byte, naming the kind of the part that follows.
    pub fn tag(&mut self, tag: u8) {
        self.write(&[tag]);
    }

    fn finish(mut self) -> u128 {
        let len = self.len;
        self.hasher.append(&len.to_le_bytes());
        let [high, low] = self.hasher.finalize128();
        (u128::from(high) << 64) | u128::from(low)
    }
}

/// The 128-bit identity of `key`.
pub(crate) fn identity<K: StoreKey + ?Sized>(key: &K) -> u128 {
    let mut out = KeyBytes::new();
    key.write_bytes(&mut out);
    out.finish()
}

/// The Redis names of a key's buckets and of its shared limit:
/// `<prefix>{<32 hex digits>}` and the same with `:limit`. The braces make
/// the digits the hash tag, so both land in one Redis Cluster slot.
pub(crate) fn redis_names(prefix: &str, id: u128) -> (String, String) {
    let mut window = String::with_capacity(prefix.len() + 34);
    window.push_str(prefix);
    // Writing to a `String` cannot fail.
    let _ = write!(window, "{{{id:032x}}}");
    let limit = format!("{window}:limit");
    (window, limit)
}

impl StoreKey for () {
    fn write_bytes(&self, out: &mut KeyBytes) {
        out.tag(0);
    }
}

impl StoreKey for str {
    fn write_bytes(&self, out: &mut KeyBytes) {
        out.tag(1);
        out.write(&(self.len() as u64).to_le_bytes());
        out.write(self.as_bytes());
    }
}

impl StoreKey for String {
    fn write_bytes(&self, out: &mut KeyBytes) {
        self.as_str().write_bytes(out);
    }
}

impl<T: StoreKey> StoreKey for Option<T> {
    fn write_bytes(&self, out: &mut KeyBytes) {
        match self {
            None => out.tag(2),
            Some(value) => {
                out.tag(3);
                value.write_bytes(out);
            }
        }
    }
}

impl StoreKey for IpAddr {
    fn write_bytes(&self, out: &mut KeyBytes) {
        match self {
            IpAddr::V4(v4) => {
                out.tag(4);
                out.write(&v4.octets());
            }
            IpAddr::V6(v6) => {
                out.tag(6);
                out.write(&v6.octets());
            }
        }
    }
}

impl StoreKey for u64 {
    fn write_bytes(&self, out: &mut KeyBytes) {
        out.tag(8);
        out.write(&self.to_le_bytes());
    }
}

impl StoreKey for u32 {
    fn write_bytes(&self, out: &mut KeyBytes) {
        u64::from(*self).write_bytes(out);
    }
}

impl StoreKey for i64 {
    fn write_bytes(&self, out: &mut KeyBytes) {
        (*self as u64).write_bytes(out);
    }
}

impl<T: StoreKey + ?Sized> StoreKey for &T {
    fn write_bytes(&self, out: &mut KeyBytes) {
        (**self).write_bytes(out);
    }
}

impl<A: StoreKey, B: StoreKey> StoreKey for (A, B) {
    fn write_bytes(&self, out: &mut KeyBytes) {
        self.0.write_bytes(out);
        self.1.write_bytes(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn str_and_string_name_the_same_key() {
        assert_eq!(identity("/login"), identity(&"/login".to_owned()));
    }

    #[test]
    fn kinds_and_boundaries_stay_apart() {
        let ids = [
            identity(&()),
            identity(""),
            identity(&None::<String>),
            identity(&Some(String::new())),
            identity(&Some("a".to_owned())),
            identity("a"),
            identity(&IpAddr::from([127, 0, 0, 1])),
            identity(&7u64),
            identity(&(7u64, 0u64)),
        ];
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn names_carry_the_prefix_and_one_hash_tag() {
        let (window, limit) = redis_names("app:", 0xab);
        assert_eq!(window, format!("app:{{{:032x}}}", 0xab));
        assert_eq!(limit, format!("{window}:limit"));
        assert_eq!(window.matches('{').count(), 1);
    }
}
