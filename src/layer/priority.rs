//! `Priority`: the predicate of
//! [`prioritized`](super::SlidingWindowLayer::prioritized), held by the
//! layer's configuration and asked by the service.

use std::sync::Arc;

use http::request::Parts;

/// Which requests may borrow quota under
/// [`prioritized`](super::SlidingWindowLayer::prioritized).
pub(crate) type Priority = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;
