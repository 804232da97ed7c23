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

    /// Visits the key itself, lent by reference: a key table clones it
    /// only if it keeps it. The provided method visits it as its own
    /// borrowed form ([`borrowed`](Self::borrowed) with `Clone::clone`); a
    /// visitor that can use the key as it is overrides it.
    #[inline]
    fn referenced(self, key: &K) -> Self::Output
    where
        Self: Sized,
        K: Clone + Hash + Eq,
    {
        self.borrowed(key, K::clone)
    }

    /// Visits the key `Some(text)` of a text key type (`Option<String>`,
    /// what [`HeaderKey`](super::HeaderKey) keys by), the text lent as it
    /// is: a key table compares its keys with the text and makes the key
    /// only if it keeps it.
    ///
    /// The provided method copies the text into a buffer kept per thread
    /// and visits that by reference ([`referenced`](Self::referenced)), so
    /// that it allocates nothing either; a visitor that can compare the
    /// keys it holds with a text overrides it (the compact key table does,
    /// and is spared the copy).
    #[inline]
    fn some_text(self, text: &str) -> Self::Output
    where
        Self: Sized,
        K: TextKey,
    {
        K::visit_copied(text, self)
    }
}

/// A key type that is an optional text: `Option<String>`, the key of
/// [`HeaderKey`](super::HeaderKey), which extractors hand to a visitor
/// with [`KeyVisitor::some_text`]. Sealed: implemented for
/// `Option<String>` only.
pub trait TextKey: Clone + Hash + Eq + sealed::Sealed {
    /// Visits `Some(text)` by reference to a copy of `text` kept per
    /// thread (what [`KeyVisitor::some_text`] does unless overridden).
    #[doc(hidden)]
    fn visit_copied<V: KeyVisitor<Self>>(text: &str, visitor: V) -> V::Output;

    /// The key `Some(text)`, made owned.
    #[doc(hidden)]
    fn some_owned(text: &str) -> Self;
}

impl TextKey for Option<String> {
    #[inline]
    fn visit_copied<V: KeyVisitor<Self>>(text: &str, visitor: V) -> V::Output {
        super::visit_some_text(text, visitor)
    }

    #[inline]
    fn some_owned(text: &str) -> Self {
        Some(text.to_owned())
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for Option<String> {}
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

/// Visits the key of `$request` (a `Request` binding, reassigned only when
/// the extractor declines) with `$visitor`, and evaluates to the visit's
/// output: through [`KeyExtractor::visit_request`], which reads the request
/// where it is, or, when the extractor declines, through its head split off
/// and put back. A macro rather than a function, so that a request whose
/// key is read in place is not moved at all.
///
/// [`KeyExtractor::visit_request`]: super::KeyExtractor::visit_request
///
/// `visit_key!(consume extractor, request, visitor)` takes a request no
/// longer needed.
macro_rules! visit_key {
    (consume $extractor:expr, $request:expr, $visitor:expr) => {{
        let request = $request;
        match $crate::key::KeyExtractor::visit_request($extractor, &request, $visitor) {
            Ok(output) => output,
            Err(visitor) => {
                let (parts, _) = request.into_parts();
                $crate::key::KeyExtractor::visit($extractor, &parts, visitor)
            }
        }
    }};
    ($extractor:expr, $request:ident, $visitor:expr) => {
        match $crate::key::KeyExtractor::visit_request($extractor, &$request, $visitor) {
            Ok(output) => output,
            Err(visitor) => {
                let (parts, body) = $request.into_parts();
                let output = $crate::key::KeyExtractor::visit($extractor, &parts, visitor);
                $request = http::Request::from_parts(parts, body);
                output
            }
        }
    };
}
pub(crate) use visit_key;
