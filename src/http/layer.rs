use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use tower_http::classify::{ServerErrorsAsFailures, SharedClassifier};
use tower_layer::Layer;

use crate::clock::{Clock, SharedClock};
use crate::handle::StatsHandle;
use std::marker::PhantomData;

use crate::http::body::{InnerBody, WrapBody};
use crate::http::key::{GlobalKey, KeyExtractor};
use crate::http::response::{validate_policy_name, Rejection};
use crate::http::service::SlidingWindow;
use crate::http::shared::{Settings, Shared};
use crate::registry::Window;
use crate::stat::validate_window;

/// The classifier used unless [`classify`](SlidingWindowLayer::classify) picks
/// another: 5xx responses and inner errors are failures.
pub type DefaultClassifier = SharedClassifier<ServerErrorsAsFailures>;

/// A [`Layer`] that limits requests per key with a sliding window and records
/// Sentinel's statistics for every key.
///
/// See the [crate docs](crate) for an overview and examples.
///
/// # Shared state
///
/// The windows, limits and statistics live in one shared state, created when
/// the layer is configured. Cloning the layer, every service it makes and
/// every [`handle`](Self::handle) share that state: cloning this layer does
/// not create new windows. This matters under axum, which calls
/// [`Layer::layer`] once per route and method (and, for a router served
/// without `with_state(())`, once per connection): a limiter that built its
/// state in `layer` would turn one limit into one per route or per
/// connection. Build two layers for two independent limits.
///
/// # Panics
///
/// The builder methods panic, with a message naming the setting, when a
/// setting is invalid or when the layer is configured after it was cloned or
/// its handle taken (the clones would silently keep the old configuration).
/// Nothing panics once requests flow.
pub struct SlidingWindowLayer<X: KeyExtractor = GlobalKey, M = DefaultClassifier, R = WrapBody> {
    extractor: X,
    make_classifier: M,
    shared: Arc<Shared<X::Key>>,
    body: PhantomData<fn() -> R>,
}

impl SlidingWindowLayer {
    /// Admits at most `limit` requests per window for one global key.
    ///
    /// The default window is 1 s in 10 buckets of 100 ms, so this reads as
    /// requests per second. After [`window`](Self::window) it is `limit` per
    /// window: `.window(Duration::from_secs(10), 10)` makes it `limit` per
    /// 10 s, and `RateLimit-Policy` then says `q=limit;w=10`.
    ///
    /// ```
    /// use axum::{routing::get, Router};
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// let limit = SlidingWindowLayer::qps(100);
    /// let stats = limit.handle();
    /// let app: Router = Router::new().route("/", get(|| async { "hi" })).layer(limit);
    /// # let _ = (app, stats);
    /// ```
    pub fn qps(limit: u64) -> Self {
        SlidingWindowLayer {
            extractor: GlobalKey,
            make_classifier: SharedClassifier::new(ServerErrorsAsFailures::new()),
            shared: Arc::new(Shared::new(Settings::new(limit))),
            body: PhantomData,
        }
    }
}

impl<X: KeyExtractor, M, R> SlidingWindowLayer<X, M, R> {
    /// Applies a change of settings, rebuilding the (still unused) state.
    fn configure(mut self, setting: &str, change: impl FnOnce(&mut Settings<X::Key>)) -> Self {
        let Some(shared) = Arc::get_mut(&mut self.shared) else {
            panic!(
                "SlidingWindowLayer::{setting}: the layer was already cloned or its handle \
                 taken; finish configuring it first"
            );
        };
        let mut settings = shared.settings.clone();
        change(&mut settings);
        *shared = Shared::new(settings);
        self
    }

    /// Keys requests with `extractor`: each key gets its own window and
    /// limit. See [`key`](crate::key) for the built-in extractors; a closure
    /// `Fn(&http::request::Parts) -> K` works too.
    ///
    /// ```
    /// use tower_sliding_window::{PathKey, SlidingWindowLayer};
    ///
    /// let layer = SlidingWindowLayer::qps(20).key(PathKey).rule("/login", 3);
    /// # let _ = layer;
    /// ```
    ///
    /// # Panics
    ///
    /// After [`rule`](Self::rule) (rules are keyed by the old key type), or
    /// after the layer was cloned or its handle taken.
    pub fn key<Y: KeyExtractor>(self, extractor: Y) -> SlidingWindowLayer<Y, M, R> {
        let Some(shared) = Arc::into_inner(self.shared) else {
            panic!(
                "SlidingWindowLayer::key: the layer was already cloned or its handle taken; \
                 finish configuring it first"
            );
        };
        let old = shared.settings;
        assert!(
            old.rules.is_empty(),
            "SlidingWindowLayer::key: call `key` before `rule`, whose keys have the old key type"
        );
        let settings = Settings {
            default_limit: old.default_limit,
            window: old.window,
            clock: old.clock,
            max_keys: old.max_keys,
            rules: Default::default(),
            response: old.response,
        };
        SlidingWindowLayer {
            extractor,
            make_classifier: self.make_classifier,
            shared: Arc::new(Shared::new(settings)),
            body: PhantomData,
        }
    }

    /// Sets the window: `sample_count` buckets over `interval` (default 1 s
    /// and 10). The limit applies per `interval`; more buckets make the
    /// window slide more smoothly. The limit is exact in every bucket-aligned
    /// window; an interval that is not aligned to bucket starts can see up to
    /// twice the limit under bursts.
    ///
    /// # Panics
    ///
    /// When `interval` is not a whole number of milliseconds, or is zero, or
    /// not a multiple of `sample_count` milliseconds; when `sample_count` is 0.
    pub fn window(self, interval: Duration, sample_count: usize) -> Self {
        let ms = interval.as_millis();
        assert!(
            interval.subsec_nanos() % 1_000_000 == 0,
            "SlidingWindowLayer::window: invalid `interval`: must be a whole number of \
             milliseconds (got {interval:?})"
        );
        let Ok(interval_ms) = u64::try_from(ms) else {
            panic!("SlidingWindowLayer::window: invalid `interval`: too long (got {interval:?})");
        };
        if let Err(err) = validate_window(sample_count, interval_ms) {
            panic!("SlidingWindowLayer::window: {err}");
        }
        self.configure("window", |s| {
            s.window = Window {
                sample_count,
                interval_ms,
            }
        })
    }

    /// Gives `key` its own limit instead of the default one. Such keys are
    /// never sent to the overflow entry (see [`max_keys`](Self::max_keys)).
    /// Change it later with [`StatsHandle::set_limit`].
    pub fn rule(self, key: impl Into<X::Key>, limit: u64) -> Self {
        let key = key.into();
        self.configure("rule", move |s| {
            s.rules.insert(key, limit);
        })
    }

    /// Bounds the number of keys with their own statistics (default 4096).
    ///
    /// Each key costs about 4.9 KiB (a second and a minute window, see
    /// [`StatisticNode`](crate::stat::StatisticNode)), so the default bounds
    /// the table near 20 MiB: enough for the distinct clients a single
    /// instance sees in a minute, small enough for any deployment. Idle keys
    /// (nothing in flight or reserved, no event left in their second window;
    /// their minute-window history is dropped with them) are evicted when
    /// room is needed, with no background task. When every key is busy, new
    /// keys share one overflow entry, limited with the default limit:
    /// varying the key gets no one past the limit, and memory stays bounded.
    /// Keys with a [`rule`](Self::rule) do not count against this bound.
    ///
    /// # Panics
    ///
    /// When `n` is 0.
    pub fn max_keys(self, n: usize) -> Self {
        assert!(
            n > 0,
            "SlidingWindowLayer::max_keys: invalid `max_keys`: must be greater than 0 (got 0)"
        );
        self.configure("max_keys", |s| s.max_keys = n)
    }

    /// Reads time from `clock` (default: [`SystemClock`](crate::clock::SystemClock)).
    /// With a [`ManualClock`](crate::clock::ManualClock), tests decide exactly
    /// when windows slide.
    pub fn clock(self, clock: impl Clock) -> Self {
        let clock = SharedClock::new(clock);
        self.configure("clock", |s| s.clock = clock)
    }

    /// Answers rejected requests with `status` instead of 429.
    pub fn status(self, status: StatusCode) -> Self {
        self.configure("status", |s| s.response.status = status)
    }

    /// Builds the response for rejected requests with `build`. `Retry-After`
    /// and the RateLimit fields are added unless the response has them.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{header, Response, StatusCode};
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// let layer = SlidingWindowLayer::qps(10).reject_with(|rejection| {
    ///     let body = format!(r#"{{"error":"rate_limited","limit":{}}}"#, rejection.limit);
    ///     Response::builder()
    ///         .status(StatusCode::TOO_MANY_REQUESTS)
    ///         .header(header::CONTENT_TYPE, "application/json")
    ///         .body(Bytes::from(body))
    ///         .expect("valid response")
    /// });
    /// # let _ = layer;
    /// ```
    pub fn reject_with<F>(self, build: F) -> Self
    where
        F: Fn(&Rejection) -> Response<Bytes> + Send + Sync + 'static,
    {
        let build = Arc::new(build);
        self.configure("reject_with", |s| s.response.reject_with = Some(build))
    }

    /// Also sends `RateLimit-Policy` and `RateLimit` on passed responses
    /// (default: only on rejections).
    pub fn headers_on_pass(self, enabled: bool) -> Self {
        self.configure("headers_on_pass", |s| s.response.headers_on_pass = enabled)
    }

    /// Also sends the legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining`
    /// and `X-RateLimit-Reset` (seconds) wherever the RateLimit fields go.
    pub fn legacy_headers(self, enabled: bool) -> Self {
        self.configure("legacy_headers", |s| s.response.legacy_headers = enabled)
    }

    /// Names the default policy in the RateLimit fields (default
    /// `"default"`). Keys with their own limit are named
    /// `"<name>-<8 hex digits>"`; see [`response`](crate::response).
    ///
    /// # Panics
    ///
    /// When `name` is empty or not printable ASCII without `"` and `\`.
    pub fn policy_name(self, name: impl Into<String>) -> Self {
        let name = name.into();
        if let Err(rule) = validate_policy_name(&name) {
            panic!("SlidingWindowLayer::policy_name: invalid `policy_name`: {rule} (got {name:?})");
        }
        self.configure("policy_name", |s| s.response.policy_name = Arc::from(name))
    }

    /// Decides which completed requests count as exceptions, with a
    /// tower-http [`MakeClassifier`](tower_http::classify::MakeClassifier)
    /// (default: [`ServerErrorsAsFailures`], i.e. 5xx and inner errors).
    ///
    /// ```
    /// use tower_http::classify::{SharedClassifier, StatusInRangeAsFailures};
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// // Count 4xx and 5xx as exceptions.
    /// let layer = SlidingWindowLayer::qps(10)
    ///     .classify(SharedClassifier::new(StatusInRangeAsFailures::new(400..=599)));
    /// # let _ = layer;
    /// ```
    pub fn classify<N>(self, make_classifier: N) -> SlidingWindowLayer<X, N, R> {
        SlidingWindowLayer {
            extractor: self.extractor,
            make_classifier,
            shared: self.shared,
            body: PhantomData,
        }
    }

    /// Answers with the inner service's own body type instead of wrapping
    /// it in [`ResponseBody`](crate::response::ResponseBody): the body type
    /// must implement `From<Bytes>` (axum's `Body` and
    /// `http_body_util::Full<Bytes>` do), which turns a rejection's text into
    /// a body.
    ///
    /// Recommended under axum: axum boxes every response body that is not its
    /// own `Body`, so the default wrapper costs an allocation per request.
    ///
    /// ```
    /// use axum::{routing::get, Router};
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// let app: Router = Router::new()
    ///     .route("/", get(|| async { "hi" }))
    ///     .layer(SlidingWindowLayer::qps(100).inner_body());
    /// # let _ = app;
    /// ```
    pub fn inner_body(self) -> SlidingWindowLayer<X, M, InnerBody> {
        SlidingWindowLayer {
            extractor: self.extractor,
            make_classifier: self.make_classifier,
            shared: self.shared,
            body: PhantomData,
        }
    }

    /// A handle on the layer's live statistics and limits. Take it after
    /// configuring the layer.
    pub fn handle(&self) -> StatsHandle<X::Key> {
        StatsHandle::new(Arc::clone(&self.shared))
    }
}

impl<X: KeyExtractor, M: Clone, R> Clone for SlidingWindowLayer<X, M, R> {
    fn clone(&self) -> Self {
        SlidingWindowLayer {
            extractor: self.extractor.clone(),
            make_classifier: self.make_classifier.clone(),
            shared: Arc::clone(&self.shared),
            body: PhantomData,
        }
    }
}

impl<S, X: KeyExtractor, M: Clone, R> Layer<S> for SlidingWindowLayer<X, M, R> {
    type Service = SlidingWindow<S, X, M, R>;

    fn layer(&self, inner: S) -> Self::Service {
        SlidingWindow::from_parts(
            inner,
            self.extractor.clone(),
            self.make_classifier.clone(),
            Arc::clone(&self.shared),
        )
    }
}

impl<X: KeyExtractor + fmt::Debug, M, R> fmt::Debug for SlidingWindowLayer<X, M, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlidingWindowLayer")
            .field("key", &self.extractor)
            .field("state", &self.shared)
            .finish_non_exhaustive()
    }
}
