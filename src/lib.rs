#![doc = include_str!("../docs/crate.md")]
#![forbid(unsafe_code)]
#![deny(missing_docs, missing_debug_implementations, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod clock;
mod error;
pub mod flow;
mod handle;
mod http;
mod registry;
pub mod stat;
mod sync;

pub use error::ConfigError;
pub use handle::{Snapshot, StatsHandle};
pub use http::layer::{DefaultClassifier, SlidingWindowLayer};
pub use http::service::SlidingWindow;

/// Built-in [`KeyExtractor`]s and the trait itself.
pub mod key {
    #[doc(inline)]
    pub use crate::http::key::*;
}

/// The rejection response and the RateLimit header fields.
pub mod response {
    #[doc(inline)]
    pub use crate::http::body::{BodyKind, InnerBody, ResponseBody, WrapBody};
    #[doc(inline)]
    pub use crate::http::response::Rejection;
}

/// The response future of [`SlidingWindow`].
pub mod future {
    #[doc(inline)]
    pub use crate::http::future::ResponseFuture;
}

#[cfg(feature = "axum")]
pub use key::MatchedPathKey;
pub use key::{GlobalKey, HeaderKey, KeyExtractor, MethodPathKey, PathKey, PeerIpKey};

// The README's code blocks run as doc tests (src/readme.rs).
#[cfg(doctest)]
mod readme;
