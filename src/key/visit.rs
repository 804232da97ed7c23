//! `KeyVisitor`: how an extractor hands its key to the key table without
//! building an owned key for every request.

use std::borrow::Borrow;
use std::hash::Hash;

/// Receives a request's key from [`KeyExtractor::visit`](super::KeyExtractor::visit).
///
/// The key table implements it: with [`owned`](Self::owned) it looks the key
/// up and keeps it if the key is new; with [`borrowed`](Self::borrowed) it
/// looks the borrowed form up and calls `to_owned` only when it inserts a new
/// entry, so a request for a key already in the table allocates nothing.
/// An extractor calls exactly one of the two.
pub trait KeyVisitor<K> {
    /// What visiting produces.
    type Output;

    /// Visits an owned key.
    fn owned(self, key: K) -> Self::Output;

    /// Visits a borrowed form of the key. `key` must hash and compare as the
    /// owned key `to_owned(key)` would: what the [`Borrow`] contract requires
    /// of `K: Borrow<Q>` (`String` and `str`, for example).
    fn borrowed<Q>(self, key: &Q, to_owned: fn(&Q) -> K) -> Self::Output
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized;
}

/// A visitor that returns the owned key: what [`KeyExtractor::extract`]
/// returns, built from [`KeyExtractor::visit`] (for tests of an extractor's
/// two forms).
///
/// [`KeyExtractor::extract`]: super::KeyExtractor::extract
/// [`KeyExtractor::visit`]: super::KeyExtractor::visit
#[derive(Debug, Clone, Copy, Default)]
pub struct ToOwnedKey;

impl<K> KeyVisitor<K> for ToOwnedKey {
    type Output = K;

    fn owned(self, key: K) -> K {
        key
    }

    fn borrowed<Q>(self, key: &Q, to_owned: fn(&Q) -> K) -> K
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        to_owned(key)
    }
}
