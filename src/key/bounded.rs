//! What a built-in string key may cost, and how header bytes become a key.
//!
//! A key lives as long as its entry, so a client that chooses keys chooses
//! memory. The built-in string extractors ([`PathKey`](super::PathKey),
//! [`MethodPathKey`](super::MethodPathKey), [`HeaderKey`](super::HeaderKey),
//! `MatchedPathKey`) bound it here: a key of up to [`MAX_KEY_BYTES`] is kept
//! as it reads; a longer one becomes a short digest of all its bytes (see
//! the [module docs](super#long-keys)).

use std::fmt::Write as _;
use std::hash::{BuildHasher, RandomState};

use highway::{HighwayHash, HighwayHasher, Key};
use std::sync::OnceLock;

/// Longest key, in bytes, that the built-in string extractors keep as it
/// reads. A longer one is replaced by its digest form, at most
/// [`MAX_DIGEST_KEY_BYTES`] long (see the [module docs](super#long-keys)).
pub const MAX_KEY_BYTES: usize = 256;

/// Bytes of a long key kept readable at the start of its digest form (cut
/// back to a character boundary).
const PREFIX_BYTES: usize = 64;

/// Length of the digest form's tail: `…` (3 bytes), `#` and 32 hex digits.
const DIGEST_TAIL_BYTES: usize = 3 + 1 + 32;

/// Longest digest form of a long key, in bytes: a readable prefix of at
/// most 64 bytes, then `…#` and 32 hex digits.
pub const MAX_DIGEST_KEY_BYTES: usize = PREFIX_BYTES + DIGEST_TAIL_BYTES;

/// Marks a header value that is not valid UTF-8. An `http::HeaderValue`
/// never contains DEL, so no valid value's key can start with it.
const NOT_UTF8: char = '\x7f';

/// The HighwayHash key of this process: 256 random bits, drawn once from
/// std's randomly seeded `RandomState`.
fn key() -> Key {
    static KEY: OnceLock<Key> = OnceLock::new();
    *KEY.get_or_init(|| {
        let random = RandomState::new();
        Key([0u64, 1, 2, 3].map(|lane| random.hash_one(lane)))
    })
}

/// A 128-bit keyed hash of the concatenation of `parts`: one pass of
/// HighwayHash (a keyed pseudorandom function that uses the CPU's vector
/// instructions where it has them, several times faster than SipHash over
/// long inputs), then the length.
fn digest(parts: &[&[u8]]) -> u128 {
    let mut hasher = HighwayHasher::new(key());
    let mut len = 0u64;
    for part in parts {
        hasher.append(part);
        len = len.saturating_add(part.len() as u64);
    }
    hasher.append(&len.to_le_bytes());
    let [high, low] = hasher.finalize128();
    (u128::from(high) << 64) | u128::from(low)
}

/// The digest form of the byte string made of `parts`: its first bytes
/// rendered readably, then `…#` and the 128-bit keyed hash of all its bytes
/// in hex.
fn digest_key(parts: &[&[u8]]) -> String {
    let mut key = String::with_capacity(MAX_DIGEST_KEY_BYTES);
    let mut head = [0u8; PREFIX_BYTES];
    let mut filled = 0;
    for part in parts {
        let take = part.len().min(PREFIX_BYTES - filled);
        head[filled..filled + take].copy_from_slice(&part[..take]);
        filled += take;
    }
    escape_into(&mut key, &head[..filled], PREFIX_BYTES);
    key.push('…');
    key.push('#');
    // Writing to a `String` cannot fail.
    let _ = write!(key, "{:032x}", digest(parts));
    key
}

/// Appends `bytes` to `out` with `\` as `\\` and every byte that is not
/// part of valid UTF-8 as `\xNN` (lowercase hex), stopping before `out`
/// would exceed `limit` bytes.
fn escape_into(out: &mut String, bytes: &[u8], limit: usize) {
    let push = |out: &mut String, piece: &str| {
        if out.len() + piece.len() > limit {
            return false;
        }
        out.push_str(piece);
        true
    };
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            let mut buf = [0u8; 4];
            let piece = if c == '\\' {
                "\\\\"
            } else {
                c.encode_utf8(&mut buf)
            };
            if !push(out, piece) {
                return;
            }
        }
        for byte in chunk.invalid() {
            let hex = [
                b'\\',
                b'x',
                HEX[usize::from(byte >> 4)],
                HEX[usize::from(byte & 0xf)],
            ];
            let piece = std::str::from_utf8(&hex).unwrap_or("\\x??");
            if !push(out, piece) {
                return;
            }
        }
    }
}

const HEX: [u8; 16] = *b"0123456789abcdef";

/// The key for the text made of `parts` (concatenated): verbatim up to
/// [`MAX_KEY_BYTES`], else its digest form. One allocation; the long form
/// copies nothing but its prefix.
pub(crate) fn text_key(parts: &[&str]) -> String {
    let len = parts.iter().fold(0usize, |n, p| n.saturating_add(p.len()));
    if len > MAX_KEY_BYTES {
        let mut bytes: [&[u8]; 4] = [&[]; 4];
        if parts.len() <= bytes.len() {
            for (slot, part) in bytes.iter_mut().zip(parts) {
                *slot = part.as_bytes();
            }
            return digest_key(&bytes[..parts.len()]);
        }
        let joined = parts.concat();
        return digest_key(&[joined.as_bytes()]);
    }
    let mut key = String::with_capacity(len);
    for part in parts {
        key.push_str(part);
    }
    key
}

/// The key for a header value: the value itself if it is valid UTF-8, else
/// DEL followed by its escaped form; either one in its digest form when it
/// would be longer than [`MAX_KEY_BYTES`].
pub(crate) fn header_key(value: &[u8]) -> String {
    if value.len() > MAX_KEY_BYTES {
        return digest_key(&[value]);
    }
    match std::str::from_utf8(value) {
        Ok(text) => text.to_owned(),
        Err(_) => {
            let mut key = String::with_capacity(value.len() + 16);
            key.push(NOT_UTF8);
            escape_into(&mut key, value, usize::MAX);
            if key.len() > MAX_KEY_BYTES {
                return digest_key(&[value]);
            }
            key
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_verbatim() {
        assert_eq!(text_key(&["GET", " ", "/a"]), "GET /a");
        let max = "x".repeat(MAX_KEY_BYTES);
        assert_eq!(text_key(&[&max]), max);
    }

    #[test]
    fn long_text_is_digested_whatever_the_split() {
        let long = "y".repeat(MAX_KEY_BYTES + 1);
        let key = text_key(&[&long]);
        assert!(key.len() <= MAX_DIGEST_KEY_BYTES, "{key}");
        assert!(key.starts_with(&"y".repeat(PREFIX_BYTES)), "{key}");
        assert_eq!(&key[PREFIX_BYTES..PREFIX_BYTES + 4], "…#");
        assert_eq!(text_key(&[&long[..10], &long[10..]]), key);
        let mut other = long.clone();
        other.push('z');
        assert_ne!(text_key(&[&other]), key);
        // Five parts go through a copy, with the same result.
        let five = [
            &long[..1],
            &long[1..2],
            &long[2..3],
            &long[3..4],
            &long[4..],
        ];
        assert_eq!(text_key(&five), key);
    }

    #[test]
    fn header_bytes_are_keyed_injectively() {
        let keys = [
            header_key(b"acme\xff"),
            header_key(b"acme\xfe"),
            header_key("acme\u{fffd}".as_bytes()),
            header_key(b"acme\\xff"),
            header_key(b"acme"),
        ];
        assert_eq!(keys[0], "\x7facme\\xff");
        assert_eq!(keys[1], "\x7facme\\xfe");
        assert_eq!(keys[2], "acme\u{fffd}");
        assert_eq!(keys[3], "acme\\xff");
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        // A backslash in an invalid value is doubled, so `\xff` written out
        // and the byte 0xff stay apart.
        assert_eq!(header_key(b"\\xff\xff"), "\x7f\\\\xff\\xff");
    }

    #[test]
    fn long_or_heavily_escaped_header_values_are_digested() {
        let long = vec![b'v'; 400 * 1024];
        let key = header_key(&long);
        assert!(key.len() <= MAX_DIGEST_KEY_BYTES);
        let invalid = vec![0xffu8; MAX_KEY_BYTES / 2];
        let key = header_key(&invalid);
        assert!(key.len() <= MAX_DIGEST_KEY_BYTES, "{key}");
        assert!(key.starts_with("\\xff"), "{key}");
        assert_ne!(header_key(&invalid[1..]), key);
    }
}
