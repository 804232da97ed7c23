//! The flow behaviours of [`SlidingWindowLayer`]: Sentinel's control
//! behaviours and grades as builder methods. What each combination does is
//! in the crate docs ("Flow behaviours").

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
}
