//! Circuit breaking on the same statistics (Sentinel's degrade rules).
//!
//! When a key's requests turn slow or start failing, its breaker opens: the
//! layer stops sending that key's requests to the inner service for a
//! while, then lets one request probe whether it has recovered. A
//! [`Breaker`] is the setting, given to a layer with
//! [`SlidingWindowLayer::breaker`](crate::SlidingWindowLayer::breaker);
//! several may be given, and every key gets its own breakers built from
//! them (a failing route does not cut off the healthy ones).
//!
//! Three kinds, each with [`min_requests`](Breaker::min_requests) (default
//! 5), [`stat_interval`](Breaker::stat_interval) (default 1 s) and
//! [`open_for`](Breaker::open_for) (default 10 s):
//!
//! | breaker | opens when, within the stat interval |
//! |---|---|
//! | [`Breaker::slow_ratio(max_rt, ratio)`](Breaker::slow_ratio) | more than `ratio` of the completions took longer than `max_rt` |
//! | [`Breaker::error_ratio(ratio)`](Breaker::error_ratio) | more than `ratio` of the completions failed |
//! | [`Breaker::error_count(count)`](Breaker::error_count) | more than `count` completions failed |
//!
//! What counts as a failure is the layer's classifier's decision
//! ([`classify`](crate::SlidingWindowLayer::classify)): by default a 5xx
//! response or an error of the inner service, never a 4xx, so a storm of
//! bad requests from clients does not cut a route off.
//!
//! # States
//!
//! - **Closed**: requests pass. Their completions are counted over the
//!   breaker's `stat_interval` (see [Statistics](#statistics)). When at
//!   least `min_requests` requests completed in it and the measure is
//!   strictly over the threshold (a ratio of 1.0 is met only by 100%), the
//!   breaker opens.
//! - **Open**: every request of the key is answered
//!   `503 Service Unavailable` with `Retry-After` (whole seconds until
//!   half-open, at least 1) and counted as a block; the inner service is
//!   not called. After `open_for`, the breaker is half-open.
//! - **Half-open**: exactly one request, the probe, goes through; every
//!   other request gets 503 (`Retry-After: 1`) meanwhile. If the probe
//!   succeeds (not a failure and, for `slow_ratio`, took at most `max_rt`),
//!   the breaker closes with fresh statistics. If it fails, the breaker is
//!   open again for `open_for`. If it never completes, because it was
//!   dropped (client gone, timeout) or refused by a flow rule of the layer
//!   (the window, `max_concurrency`), the probe slot is freed at once and
//!   the next request probes. A probe still running has a bounded time to
//!   decide: for `slow_ratio`, a request that finds it out for longer than
//!   `max_rt` knows it is slow; for every kind, a probe out for longer than
//!   the longer of `stat_interval` and `open_for` counts as failed. Either
//!   way that request finds the breaker open again for `open_for` (a
//!   handler that never answers, or under
//!   [`track_body`](crate::SlidingWindowLayer::track_body) a body that never
//!   ends, holds a breaker half-open for that long at most; the probe's
//!   time counts from when it took the slot, a wait for its turn under
//!   `throttle` included). The late completion of such a probe is counted
//!   as an ordinary one and moves nothing: a half-open breaker cannot be
//!   stuck, nor closed by a probe it gave up on.
//!
//! A key whose breakers are open stays in the key table (eviction never
//! cuts an open time short). Once every breaker's open time is over (or
//! its probe slot is free again) and the key has seen no request for a
//! window, the key is idle like any other and may be evicted: the next
//! request for it would have been the probe, and a new key lets it through
//! as the probe would have.
//!
//! The breakers come before every flow rule, and no request bypasses them.
//! Requests that were let through before a breaker opened still complete:
//! they are counted when they complete (a slow call is seen only then, not
//! while it is still running), but only a probe moves an open or
//! half-open breaker. The state of a key's breakers is read with
//! [`StatsHandle::breakers`](crate::StatsHandle::breakers), and each
//! transition is one `tracing` event (`warn` when a breaker opens, `info`
//! when it turns half-open or closes), which names the kind of breaker,
//! never the key.
//!
//! # Statistics
//!
//! A breaker whose `stat_interval` is the layer's window interval (the
//! default: both are 1 s for [`qps`](crate::SlidingWindowLayer::qps))
//! counts on the key's own statistics: the key's window already counts
//! every completion and every failure, bucket by bucket, so the breaker
//! reads them instead of counting them again. Its measure is then the
//! key's sliding window: the last `stat_interval`, in the window's buckets.
//! Only what the key's window does not count is counted by the breaker, in
//! a window of the same buckets: the slow completions of a `slow_ratio`
//! breaker, and requests whose handler panicked (the key counts those as
//! exceptions without a completion; the breaker counts them as failed
//! completions). "Fresh statistics" after a successful probe means that
//! the breaker counts from the probe's completion on: older buckets, and
//! what the probe's bucket held by then, are left out.
//!
//! A breaker with any other `stat_interval` keeps its own window of one
//! bucket of `stat_interval`, as Sentinel's degrade rules do: every
//! completion is counted in it, and a close resets it.
//!
//! # Cost
//!
//! A layer without breakers pays one check per request. With breakers, a
//! request reads one atomic word per breaker while they are closed. When it
//! completes well (not a failure, not slow, no panic), a breaker counting
//! on the key's statistics does nothing more; a bad completion reads the
//! key's window buckets and compares with the threshold. A breaker with its
//! own stat interval adds one or two counts to its bucket on every
//! completion.

//! # Examples
//!
//! An error ratio: more than half of at least 4 completions in 1 s failed.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::time::Duration;
//! use axum::{body::Body, http::StatusCode, routing::get, Router};
//! use tower::ServiceExt;
//! use tower_sliding_window::breaker::{Breaker, BreakerState};
//! use tower_sliding_window::clock::ManualClock;
//! use tower_sliding_window::SlidingWindowLayer;
//!
//! let clock = ManualClock::new(0);
//! let layer = SlidingWindowLayer::qps(1_000)
//!     .clock(clock.clone())
//!     .breaker(Breaker::error_ratio(0.5).min_requests(4).open_for(Duration::from_secs(5)));
//! let stats = layer.handle();
//! let app = Router::new()
//!     .route("/", get(|| async { StatusCode::INTERNAL_SERVER_ERROR }))
//!     .layer(layer);
//! let send = || async {
//!     let request = http::Request::get("/").body(Body::empty()).unwrap();
//!     app.clone().oneshot(request).await.unwrap()
//! };
//!
//! for _ in 0..4 {
//!     assert_eq!(send().await.status(), StatusCode::INTERNAL_SERVER_ERROR);
//! }
//! // Four failures of four: open. The handler is not called any more.
//! let refused = send().await;
//! assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
//! assert_eq!(refused.headers()["retry-after"], "5");
//! assert!(matches!(stats.breakers(&())[..], [BreakerState::Open { .. }]));
//! // Five seconds later one probe goes through; it fails, so open again.
//! clock.advance(Duration::from_secs(5));
//! assert_eq!(send().await.status(), StatusCode::INTERNAL_SERVER_ERROR);
//! assert_eq!(send().await.status(), StatusCode::SERVICE_UNAVAILABLE);
//! # }
//! ```
//!
//! A slow-call ratio: more than 20% of the calls took over 100 ms. The probe
//! must itself be fast to close the breaker.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::time::Duration;
//! use axum::{body::Body, http::StatusCode, routing::get, Router};
//! use tower::ServiceExt;
//! use tower_sliding_window::breaker::{Breaker, BreakerState};
//! use tower_sliding_window::clock::ManualClock;
//! use tower_sliding_window::SlidingWindowLayer;
//!
//! let clock = ManualClock::new(0);
//! let layer = SlidingWindowLayer::qps(1_000)
//!     .clock(clock.clone())
//!     .breaker(Breaker::slow_ratio(Duration::from_millis(100), 0.2).min_requests(1));
//! let stats = layer.handle();
//! // A handler that takes 250 ms of the manual clock.
//! let slow = {
//!     let clock = clock.clone();
//!     move || async move {
//!         clock.advance(Duration::from_millis(250));
//!         "slow"
//!     }
//! };
//! let app = Router::new().route("/", get(slow)).layer(layer);
//! let request = || http::Request::get("/").body(Body::empty()).unwrap();
//!
//! assert_eq!(app.clone().oneshot(request()).await.unwrap().status(), StatusCode::OK);
//! assert!(matches!(stats.breakers(&())[..], [BreakerState::Open { .. }]));
//! let refused = app.oneshot(request()).await.unwrap();
//! assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
//! # }
//! ```
//!
//! An error count, next to a rate limit: more than 10 failures in 10 s.
//!
//! ```
//! use std::time::Duration;
//! use tower_sliding_window::breaker::Breaker;
//! use tower_sliding_window::{PathKey, SlidingWindowLayer};
//!
//! let layer = SlidingWindowLayer::qps(100)
//!     .key(PathKey)
//!     .breaker(
//!         Breaker::error_count(10)
//!             .stat_interval(Duration::from_secs(10))
//!             .open_for(Duration::from_secs(30)),
//!     );
//! // Every path has its own breaker; none is open before it has failed.
//! assert!(layer.handle().breakers("/search").is_empty());
//! ```

mod circuit;
mod rule;
mod set;
mod state;

pub(crate) use circuit::Completion;
pub use circuit::{CircuitBreaker, Permit};
pub use rule::Breaker;
pub(crate) use set::{Breakers, ProbeSet, MAX_BREAKERS};
pub use state::BreakerState;
