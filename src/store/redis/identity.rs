//! The identity of a key in Redis: the same on every replica.
//!
//! A key's Redis name must not depend on the process that computes it, so
//! it cannot come from `Hash` (whose output is not promised stable across
//! builds) nor from a per-process random hasher. Instead each key type
//! writes a stable byte form of itself ([`StoreKey`]), and the name is the
//! SHA-256 digest of those bytes: 64 hex digits, whatever the key's length
//! or bytes.
//!
//! The digest is a cryptographic hash, not a keyed one: a keyed hash would
//! need its key on every replica, and a key shipped in the crate is
//! published, which lets anyone search offline for two client keys that
//! share one window in Redis. Finding two byte forms with one SHA-256
//! digest is out of reach, and so is finding a second one for a given
//! key; the name keeps all 256 bits.

use std::fmt::Write as _;
use std::net::IpAddr;

use sha2::{Digest, Sha256};

use super::RemoteWindow;

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
    hasher: Sha256,
    len: u64,
}

impl std::fmt::Debug for KeyBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyBytes")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// Hashed before a key's bytes, so that these digests name nothing but
/// this crate's keys. Changing it renames every key in Redis.
const IDENTITY_CONTEXT: &[u8] = b"tower-sliding-window/redis key v2\0";

impl KeyBytes {
    fn new() -> Self {
        let mut hasher = Sha256::new();
        hasher.update(IDENTITY_CONTEXT);
        KeyBytes { hasher, len: 0 }
    }

    /// Writes raw bytes. Use it for parts of a fixed length; write a length
    /// first for parts whose length varies.
    pub fn write(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
        self.len = self.len.saturating_add(bytes.len() as u64);
    }

    /// Writes one tag byte, naming the kind of the part that follows.
    pub fn tag(&mut self, tag: u8) {
        self.write(&[tag]);
    }

    fn finish(mut self) -> KeyId {
        // The total length last: byte forms that one key type writes
        // cannot be the start of another's with the same digest.
        let len = self.len;
        self.hasher.update(len.to_le_bytes());
        KeyId(self.hasher.finalize().into())
    }
}

/// A key's identity in Redis: the SHA-256 digest of its byte form.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct KeyId([u8; 32]);

impl std::fmt::Debug for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.hex())
    }
}

impl KeyId {
    /// A byte of the digest, to spread keys over shards.
    pub(crate) fn shard_byte(&self) -> u8 {
        self.0[0]
    }

    fn hex(&self) -> String {
        let mut hex = String::with_capacity(64);
        for byte in self.0 {
            // Writing to a `String` cannot fail.
            let _ = write!(hex, "{byte:02x}");
        }
        hex
    }
}

/// The identity of `key`.
pub(crate) fn identity<K: StoreKey + ?Sized>(key: &K) -> KeyId {
    let mut out = KeyBytes::new();
    key.write_bytes(&mut out);
    out.finish()
}

/// The Redis names of a key's buckets and of its shared limit under
/// `window`: `<prefix>{<64 hex digits>}:<bucket ms>x<sample count>` (and
/// `+1` when strict), and the same with `:limit`.
///
/// The window's shape is part of the name: layers with different windows
/// on one key keep apart, each with its own buckets (a script that cut
/// buckets of another length would drop or miscount them) and its own
/// shared limit (a limit means nothing without its window). The braces
/// make the digits the hash tag, so both names land in one Redis Cluster
/// slot.
pub(crate) fn redis_names(prefix: &str, id: KeyId, window: &RemoteWindow) -> (String, String) {
    let mut name = String::with_capacity(prefix.len() + 100);
    name.push_str(prefix);
    name.push('{');
    name.push_str(&id.hex());
    // Writing to a `String` cannot fail.
    let _ = write!(name, "}}:{}x{}", window.bucket_ms(), window.sample_count);
    if window.strict {
        name.push_str("+1");
    }
    let limit = format!("{name}:limit");
    (name, limit)
}

/// The Redis name of the buckets of a key's further window of
/// `interval_ms` (the layer's `limit_per`), for a layer whose first window
/// is `window`: the first window's buckets' name, then `/<interval ms>ms`,
/// for example `tsw:{<64 hex digits>}:100x10/60000ms`.
///
/// It starts with the first window's name, so it has the same hash tag
/// (one Redis Cluster slot for every window of a key) and differs from
/// the names of layers whose first window differs; the `/` sets it apart
/// from every first window's name (a layer of one window per minute keeps
/// `…:6000x10`, never `…/60000ms`).
pub(crate) fn further_name(
    prefix: &str,
    id: KeyId,
    window: &RemoteWindow,
    interval_ms: u64,
) -> String {
    let (mut name, _) = redis_names(prefix, id, window);
    // Writing to a `String` cannot fail.
    let _ = write!(name, "/{interval_ms}ms");
    name
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

    fn window(bucket_ms: u64, sample_count: usize, strict: bool) -> RemoteWindow {
        RemoteWindow {
            sample_count,
            interval_ms: bucket_ms * sample_count as u64,
            strict,
        }
    }

    #[test]
    fn names_carry_the_prefix_one_hash_tag_and_the_window() {
        let id = identity("/login");
        let (name, limit) = redis_names("app:", id, &window(100, 10, false));
        assert_eq!(name, format!("app:{{{}}}:100x10", id.hex()));
        assert_eq!(limit, format!("{name}:limit"));
        assert_eq!(name.matches('{').count(), 1);
        assert_eq!(id.hex().len(), 64);
    }

    #[test]
    fn every_part_of_the_window_shape_renames_the_key() {
        let id = identity("/login");
        let shapes = [
            window(100, 10, false),
            window(100, 10, true),
            window(1000, 60, false),
            window(1000, 10, false),
            window(100, 600, false),
        ];
        let names: Vec<_> = shapes
            .iter()
            .map(|shape| redis_names("tsw:", id, shape))
            .collect();
        for (i, (name, limit)) in names.iter().enumerate() {
            for (other, other_limit) in &names[i + 1..] {
                assert_ne!(name, other);
                assert_ne!(limit, other_limit);
            }
        }
    }

    #[test]
    fn further_windows_share_the_hash_tag_and_never_a_first_window_name() {
        let id = identity("/login");
        let second = window(100, 10, false);
        let minute = window(6000, 10, false);
        let further = further_name("tsw:", id, &second, 60_000);
        assert_eq!(further, format!("tsw:{{{}}}:100x10/60000ms", id.hex()));
        // One slot: the first brace pair is the hash tag of both.
        let tag = |name: &str| name[name.find('{').unwrap()..=name.find('}').unwrap()].to_owned();
        let (first, limit) = redis_names("tsw:", id, &second);
        assert_eq!(tag(&further), tag(&first));
        // A layer of one window per minute on the same key keeps apart.
        let (alone, alone_limit) = redis_names("tsw:", id, &minute);
        for name in [&first, &limit, &alone, &alone_limit] {
            assert_ne!(&further, name);
        }
        // The same further interval under another first window, or another
        // interval, is another name.
        assert_ne!(further, further_name("tsw:", id, &second, 120_000));
        assert_ne!(
            further,
            further_name("tsw:", id, &window(100, 10, true), 60_000)
        );
    }

    #[test]
    fn names_are_fixed_across_builds_and_platforms() {
        // SHA-256 of the context, the byte form (tag 1, the length in 8
        // bytes little-endian, the bytes) and its total length, computed
        // apart from this code: every replica, in every build, names a key
        // alike.
        assert_eq!(
            identity("").hex(),
            "2966f59b1e42e3b2acf80a2e65666bad8197f28092cd47a5ee88ba8a5632defa"
        );
        assert_eq!(
            identity("/login").hex(),
            "fbfa88cc1656fb75d57849c0193699cdb0407c762c5e11dd8c359cd360a2f1e3"
        );
    }
}
