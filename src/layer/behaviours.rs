//! The flow behaviours of [`SlidingWindowLayer`]: Sentinel's control
//! behaviours and grades as builder methods. What each combination does is
//! in the crate docs ("Flow behaviours").

use std::num::NonZeroU64;

use crate::flow::breaker::{Breaker, MAX_BREAKERS};
use crate::key::KeyExtractor;

use super::builder::SlidingWindowLayer;

/// # Flow behaviours
impl<X: KeyExtractor, M, R> SlidingWindowLayer<X, M, R> {
    /// Makes the limit hold in every interval, not only in bucket-aligned
    /// windows: admission counts the passes of the window **and** of the
    /// bucket that has just left it (the last `sample_count + 1` buckets).
    /// No interval of the window's length, starting anywhere (measured on the
    /// layer's clock), then holds more than the limit, under any concurrency
    /// and any arrival pattern. Admission stays one compare-and-swap.
    ///
    /// The price: a pass is held against the limit one bucket longer. Under
    /// steady overload a key gets at least `limit * n / (n + 1)` passes per
    /// window on the long run, with `n` the window's `sample_count` (at
    /// least 90.9 per second for `qps(100)` with the default 10 buckets); in
    /// the worst case (every pass at the start of a bucket) exactly that.
    ///
    /// Without `strict`, the limit is exact in every bucket-aligned window,
    /// and an interval that starts inside a bucket can hold up to twice the
    /// limit under bursts (the end of one window and the start of the next).
    ///
    /// Statistics ([`Snapshot`](crate::Snapshot), the minute history) still
    /// cover the `sample_count` buckets of the window, and `Retry-After`
    /// counts the extra bucket.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use axum::{body::Body, routing::get, Router};
    /// use http::{Request, StatusCode};
    /// use tower::ServiceExt;
    /// use tower_sliding_window::clock::ManualClock;
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// let clock = ManualClock::new(0);
    /// let layer = SlidingWindowLayer::qps(10).strict().clock(clock.clone());
    /// let app = Router::new().route("/", get(|| async { "hi" })).layer(layer);
    /// let send = || async {
    ///     let request = Request::get("/").body(Body::empty()).unwrap();
    ///     app.clone().oneshot(request).await.unwrap().status()
    /// };
    ///
    /// // Ten passes at 950 ms, in the bucket [900, 1000)...
    /// clock.set(950);
    /// for _ in 0..10 {
    ///     assert_eq!(send().await, StatusCode::OK);
    /// }
    /// // ...have left the window at 1 950 (it starts at 1 000 then), but
    /// // [950, 1950) is one second: without `strict` an eleventh would pass.
    /// clock.set(1_950);
    /// assert_eq!(send().await, StatusCode::TOO_MANY_REQUESTS);
    /// // Once the bucket [900, 1000) has left the last 11 buckets, it passes.
    /// clock.set(2_000);
    /// assert_eq!(send().await, StatusCode::OK);
    /// # }
    /// ```
    pub fn strict(self) -> Self {
        self.configure(|s| s.window.strict = true)
    }

    /// Admits at most `n` requests of a key in flight at once (Sentinel's
    /// thread grade), on top of the window's limit: a request must get both
    /// a place and a pass.
    ///
    /// Exact under concurrency: the place is taken with one compare-and-swap
    /// that fails at `n`, so no key ever has `n + 1` requests in flight. It
    /// is given back when the request completes (its response head, or the
    /// end of its body with [`track_body`](Self::track_body)), when its
    /// future or body is dropped, or when the handler panics. The request
    /// over it is answered at once (no waiting for a place) with the
    /// rejection response and `Retry-After: 1`, counts as a block and
    /// records no pass. A request the window refuses gives its place back at
    /// once. [`Snapshot::concurrency`](crate::Snapshot::concurrency) shows
    /// the places taken.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use axum::{body::Body, routing::get, Router};
    /// use http::{Request, StatusCode};
    /// use std::sync::Arc;
    /// use tokio::sync::Semaphore;
    /// use tower::ServiceExt;
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// // A handler that waits until the test lets it finish.
    /// let gate = Arc::new(Semaphore::new(0));
    /// let handler = {
    ///     let gate = Arc::clone(&gate);
    ///     move || async move {
    ///         gate.acquire().await.unwrap().forget();
    ///         "done"
    ///     }
    /// };
    /// let app = Router::new()
    ///     .route("/", get(handler))
    ///     .layer(SlidingWindowLayer::qps(100).max_concurrency(1));
    /// let get = || Request::get("/").body(Body::empty()).unwrap();
    ///
    /// // The first request holds the only place while its handler waits...
    /// let first = tokio::spawn(app.clone().oneshot(get()));
    /// tokio::task::yield_now().await;
    /// let second = app.clone().oneshot(get()).await.unwrap();
    /// assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    /// assert_eq!(second.headers()["retry-after"], "1");
    /// // ...and gives it back when it completes.
    /// gate.add_permits(2);
    /// assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    /// assert_eq!(app.oneshot(get()).await.unwrap().status(), StatusCode::OK);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// When `n` is 0.
    pub fn max_concurrency(self, n: u64) -> Self {
        let Some(n) = NonZeroU64::new(n) else {
            panic!(
                "SlidingWindowLayer::max_concurrency: invalid `max_concurrency`: must be greater \
                 than 0 (got 0)"
            );
        };
        self.configure(|s| s.window.behaviours.max_concurrency = Some(n))
    }

    /// Adds a circuit breaker: every key gets its own, built from `breaker`
    /// (Sentinel's degrade rules; see [`breaker`](crate::breaker) for the
    /// state machine and an example of each kind). Several may be given;
    /// a request passes only if every breaker of its key lets it through.
    ///
    /// While a key's breaker is open, its requests are answered
    /// `503 Service Unavailable` with `Retry-After` (whole seconds until
    /// half-open, at least 1) without calling the inner service, and count
    /// as blocks. The breakers come before every flow rule; a failure is
    /// what the layer's [classifier](Self::classify) says it is (by default
    /// a 5xx or an inner error, not a 4xx). Read the state with
    /// [`StatsHandle::breakers`](crate::StatsHandle::breakers). Keys that
    /// share the overflow entry (see [`max_keys`](Self::max_keys)) share its
    /// breakers too, as they share its limit; a key whose breaker is not
    /// closed is never evicted.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_sliding_window::breaker::Breaker;
    /// use tower_sliding_window::{MethodPathKey, SlidingWindowLayer};
    ///
    /// let layer = SlidingWindowLayer::qps(100)
    ///     .key(MethodPathKey)
    ///     .breaker(Breaker::error_ratio(0.5))
    ///     .breaker(Breaker::slow_ratio(Duration::from_millis(500), 0.8).min_requests(20));
    /// ```
    ///
    /// # Panics
    ///
    /// When the layer would have more than 64 breakers.
    pub fn breaker(self, breaker: Breaker) -> Self {
        self.configure(|s| {
            assert!(
                s.breakers.len() < MAX_BREAKERS,
                "SlidingWindowLayer::breaker: invalid `breaker`: at most {MAX_BREAKERS} per \
                 layer"
            );
            s.breakers.push(breaker);
        })
    }
}
