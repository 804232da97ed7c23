#![doc = include_str!("../docs/crate.md")]
#![forbid(unsafe_code)]
#![deny(missing_docs, missing_debug_implementations, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod clock;
mod error;
#[cfg(any(feature = "prometheus", feature = "dashboard"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "prometheus", feature = "dashboard"))))]
pub mod export;
pub mod flow;
mod handle;
pub mod key;
mod layer;
pub mod response;
pub mod rules;
pub mod stat;
// Public with the `redis` feature (the Redis store); without it the module
// holds only the crate's own key table, and has nothing to show.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod store;
#[cfg(not(feature = "redis"))]
mod store;
mod sync;
pub mod system;

pub use error::ConfigError;
#[cfg(feature = "dashboard")]
#[cfg_attr(docsrs, doc(cfg(feature = "dashboard")))]
pub use export::dashboard;
pub use flow::breaker;
pub use handle::{Snapshot, StatsHandle, WindowCount};
pub use layer::body;
pub use layer::future;
pub use layer::{DefaultClassifier, SlidingWindow, SlidingWindowLayer};

#[cfg(feature = "axum")]
pub use key::MatchedPathKey;
pub use key::{
    ClientRouteKey, ForwardedIpKey, GlobalKey, HeaderKey, KeyExtractor, MethodPathKey, PathKey,
    PeerIpKey,
};

// The README's code blocks run as doc tests (src/readme.rs).
#[cfg(doctest)]
mod readme;
