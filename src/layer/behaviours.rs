//! The flow behaviours of [`SlidingWindowLayer`]: Sentinel's control
//! behaviours and grades as builder methods. What each combination does is
//! in the crate docs ("Flow behaviours").

use std::num::NonZeroU64;
#[cfg(feature = "tokio")]
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "tokio")]
use http::request::Parts;

use crate::flow::breaker::{Breaker, MAX_BREAKERS};
use crate::flow::WarmUpSettings;
use crate::key::KeyExtractor;

use super::builder::SlidingWindowLayer;
use super::refusals::{refuse_on_compact, BREAKER_WHY, CONCURRENCY_WHY, WARM_UP_WHY};
#[cfg(feature = "tokio")]
use super::refusals::{PRIORITIZED_WHY, THROTTLE_WHY};

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
    ///
    /// # Panics
    ///
    /// When the window's interval plus one bucket is more than `u64::MAX`
    /// milliseconds (admission adds the two).
    pub fn strict(self) -> Self {
        let window = self.current_window();
        super::builder::check_strict_span("strict", window.interval_ms, window.sample_count);
        let strict = crate::store::Window {
            strict: true,
            ..window
        };
        super::refusals::check_all_further("strict", &self.store_settings(), &strict);
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
        self.configure(|s| {
            refuse_on_compact(s.compact, "max_concurrency", CONCURRENCY_WHY);
            s.window.behaviours.max_concurrency = Some(n)
        })
    }

    /// Paces each key's passes uniformly, `interval / limit` apart
    /// (Sentinel's rate limiter), instead of letting a window's worth through
    /// at once. A request whose turn is near enough waits for it inside its
    /// response future (no thread is blocked, nothing happens in
    /// `poll_ready`), then reaches the inner service; a request whose turn is
    /// further away is refused at once with `Retry-After` (the time until a
    /// turn would be near enough).
    ///
    /// Near enough means at most `max_wait` minus one millisecond away:
    /// tokio's timer fires on millisecond ticks, so a sleep can end up to a
    /// millisecond after its deadline, and the whole wait then stays within
    /// `max_wait` (while the runtime keeps up: a runtime whose threads are
    /// all busy wakes sleepers late, whatever the timer).
    ///
    /// - Turns are taken with one compare-and-swap on the key's latest turn:
    ///   concurrent requests never share a turn and never skip one.
    /// - Time is kept in nanoseconds, so spacing below a millisecond is exact
    ///   (3 000 per second paces at 333 334 ns).
    /// - A request dropped while it waits (client gone, timeout) gives its
    ///   turn back if no later turn was handed out meanwhile; otherwise its
    ///   turn stays unused, which only spaces the later passes further apart,
    ///   until the last waiting request of the key has left: the next one is
    ///   then spaced from the latest turn used, as if nobody had queued.
    /// - At most `max_wait * limit / interval + 1` requests of a key wait at
    ///   once (each holds its own turn within `max_wait`);
    ///   [`Snapshot::waiting`](crate::Snapshot::waiting) shows how many do.
    /// - The limit (per key, with [`rule`](Self::rule) and `set_limit`) sets
    ///   the spacing; the window's pass count is not checked on top: pacing
    ///   is stricter than [`strict`](Self::strict), since no interval of the
    ///   window's length can hold more than `limit` turns.
    /// - The response time starts when the wait ends.
    /// - Waiting needs a tokio runtime's timer (the `tokio` feature, on by
    ///   default). Outside a runtime only a turn that is due at once passes.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use axum::{body::Body, routing::get, Router};
    /// use http::{Request, StatusCode};
    /// use tower::ServiceExt;
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// // Ten per second, a turn every 100 ms; wait at most 250 ms.
    /// let layer = SlidingWindowLayer::qps(10).throttle(Duration::from_millis(250));
    /// let stats = layer.handle();
    /// let app = Router::new().route("/", get(|| async { "hi" })).layer(layer);
    /// let send = || app.clone().oneshot(Request::get("/").body(Body::empty()).unwrap());
    ///
    /// // Four at once: turns now, +100 ms and +200 ms wait; +300 ms is too far.
    /// let (a, b, c, d) = tokio::join!(send(), send(), send(), send());
    /// let statuses = [a, b, c, d].map(|r| r.unwrap().status());
    /// let passed = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    /// assert_eq!(passed, 3);
    /// assert!(statuses.contains(&StatusCode::TOO_MANY_REQUESTS));
    /// assert_eq!(stats.snapshot(&()).unwrap().waiting, 0);
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn throttle(self, max_wait: Duration) -> Self {
        self.configure(|s| {
            refuse_on_compact(s.compact, "throttle", THROTTLE_WHY);
            super::refusals::refuse_with_windows(
                !s.limit_per.windows.is_empty(),
                "throttle",
                "throttle",
                super::refusals::FURTHER_THROTTLE_WHY,
            );
            s.window.behaviours.throttle = Some(max_wait)
        })
    }

    /// Warms each key up after it has been idle (Sentinel's warm-up
    /// controller, Guava's `SmoothWarmingUp` with a cold factor of 3): a cold
    /// key may pass a third of its limit per window, and sustained load
    /// raises that to the full limit over `period`; idle time cools it down
    /// again. Keys start cold.
    ///
    /// Only the limit moves: admission stays the window's one
    /// compare-and-swap against it, so every count stays exact. The curve
    /// follows Sentinel's integer arithmetic with every figure per window
    /// (the same as per second for the default window); module
    /// `flow::warm_up` in the source has the formulas. With
    /// [`throttle`](Self::throttle), the spacing follows the warmed limit.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use axum::{body::Body, routing::get, Router};
    /// use http::{Request, StatusCode};
    /// use tower::ServiceExt;
    /// use tower_sliding_window::clock::ManualClock;
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// let clock = ManualClock::new(10_000);
    /// let layer = SlidingWindowLayer::qps(30)
    ///     .warm_up(Duration::from_secs(10))
    ///     .clock(clock.clone());
    /// let app = Router::new().route("/", get(|| async { "hi" })).layer(layer);
    /// let mut passed_per_second = Vec::new();
    /// for _ in 0..30 {
    ///     let mut passed = 0;
    ///     for _ in 0..60 {
    ///         let request = Request::get("/").body(Body::empty()).unwrap();
    ///         if app.clone().oneshot(request).await.unwrap().status() == StatusCode::OK {
    ///             passed += 1;
    ///         }
    ///     }
    ///     passed_per_second.push(passed);
    ///     clock.advance(Duration::from_secs(1));
    /// }
    /// // Cold: a third of the limit; warm after sustained load: all of it.
    /// assert_eq!(passed_per_second[0], 10);
    /// assert_eq!(*passed_per_second.last().unwrap(), 30);
    /// assert!(passed_per_second.windows(2).all(|w| w[0] <= w[1]));
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// When `period` is zero.
    pub fn warm_up(self, period: Duration) -> Self {
        let period_ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX);
        if period_ms == 0 {
            panic!(
                "SlidingWindowLayer::warm_up: invalid `period`: must be at least 1 ms (got \
                 {period:?})"
            );
        }
        self.configure(|s| {
            refuse_on_compact(s.compact, "warm_up", WARM_UP_WHY);
            s.window.behaviours.warm_up = Some(WarmUpSettings {
                period_ms,
                cold_factor: crate::flow::warm_up::DEFAULT_COLD_FACTOR,
            })
        })
    }

    /// Lets requests for which `pred` is true borrow a pass from a later
    /// bucket when the window is full (Sentinel's occupy for prioritized
    /// calls): such a request waits, inside its response future, until the
    /// bucket it borrowed from opens (at most the occupy timeout, 500 ms,
    /// or the window's length if shorter), then reaches the inner service,
    /// instead of being refused. When nothing can be borrowed in time it is
    /// refused like any other.
    ///
    /// The borrowed pass is counted in the bucket it came from, so the
    /// requests that come after it in that bucket find less quota: borrowing
    /// moves passes later, it does not add any. Sentinel's arithmetic
    /// decides (`StatisticNode::try_occupy_next`): the wait fits if, once it
    /// is over, the window's passes and everything already borrowed stay
    /// within the limit. The check and the reservation are two steps, as in
    /// Sentinel, so requests that borrow at the same instant may together
    /// borrow a little more than fits. A request dropped while it waits
    /// leaves its pass borrowed (the bucket then admits one fewer).
    /// [`Snapshot::waiting`](crate::Snapshot::waiting) counts the requests
    /// waiting. Needs the `tokio` feature (on by default) and a tokio
    /// runtime; elsewhere nothing is borrowed.
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
    /// let clock = ManualClock::new(10_050);
    /// let layer = SlidingWindowLayer::qps(2)
    ///     .prioritized(|parts: &http::request::Parts| parts.headers.contains_key("x-priority"))
    ///     .clock(clock.clone());
    /// let app = Router::new().route("/", get(|| async { "hi" })).layer(layer);
    /// let send = |priority: bool| {
    ///     let mut request = Request::get("/");
    ///     if priority {
    ///         request = request.header("x-priority", "1");
    ///     }
    ///     app.clone().oneshot(request.body(Body::empty()).unwrap())
    /// };
    /// assert_eq!(send(false).await.unwrap().status(), StatusCode::OK);
    /// assert_eq!(send(false).await.unwrap().status(), StatusCode::OK);
    /// // 550 ms later the window is still full (its passes leave it at
    /// // 11 000 ms): an ordinary request is refused...
    /// clock.set(10_600);
    /// assert_eq!(send(false).await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    /// // ...a prioritized one waits 400 ms for a pass of the bucket at 11 000.
    /// assert_eq!(send(true).await.unwrap().status(), StatusCode::OK);
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn prioritized<P>(mut self, pred: P) -> Self
    where
        P: Fn(&Parts) -> bool + Clone + Send + Sync + 'static,
    {
        if self.is_compact() {
            refuse_on_compact(true, "prioritized", PRIORITIZED_WHY);
        }
        super::refusals::refuse_with_windows(
            !self.store_settings().limit_per.windows.is_empty(),
            "prioritized",
            "prioritized",
            super::refusals::FURTHER_PRIORITIZED_WHY,
        );
        self.priority = Some(Arc::new(pred));
        self
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
            refuse_on_compact(s.compact, "breaker", BREAKER_WHY);
            assert!(
                s.breakers.len() < MAX_BREAKERS,
                "SlidingWindowLayer::breaker: invalid `breaker`: at most {MAX_BREAKERS} per \
                 layer"
            );
            s.breakers.push(breaker);
        })
    }
}
