//! Benches of the HTTP layer: one request through an axum `Router`, called
//! in process as a tower `Service` on a current-thread Tokio runtime (no
//! sockets, no HTTP parsing), with and without each layer.
//!
//! Every contender serves the same app (`/` and `/items/{id}`, one handler
//! answering `"ok"`) and is sent the same request, `GET /items/7`. Each
//! request is built, sent with `ready().call()`, and its body read to the
//! end, as a server would. The router is prepared with `with_state(())`, as
//! `axum::serve` prepares it for each connection. Only the layer differs:
//!
//! | id                  | layer                                                    |
//! |---------------------|----------------------------------------------------------|
//! | `bare_router`       | none                                                     |
//! | `noop_layer`        | a `Router::layer` whose service only forwards            |
//! | `ours_global`       | `SlidingWindowLayer::qps(u64::MAX / 4)`, the global key  |
//! | `ours_matched_path` | the same with the matched route as the key (`"GET /items/{id}"`) |
//! | `tower_governor`    | `GovernorLayer`, global key, one cell per ns, burst `u32::MAX` |
//!
//! No contender ever rejects: each is checked when it is built.
//!
//! - `sequential`: the criterion group `layer`, one contender after another.
//! - `paired`: the criterion group `layer_paired`, which runs all contenders
//!   in short interleaved rounds and prints the per-round cost beyond the
//!   no-op layer.

pub(crate) mod paired;
pub(crate) mod sequential;

use std::convert::Infallible;
use std::hint::black_box;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use governor::clock::QuantaInstant;
use governor::middleware::NoOpMiddleware;
use http_body_util::BodyExt;
use tokio::runtime::Runtime;
use tower::{Layer, Service, ServiceExt};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::GlobalKeyExtractor;
use tower_governor::GovernorLayer;
use tower_sliding_window::{KeyExtractor, SlidingWindowLayer};

/// Our limit: far above anything one thread can send in a window.
const NEVER_REJECT: u64 = u64::MAX / 4;

/// The request every contender is sent.
const PATH: &str = "/items/7";

/// Requests each contender must answer with 200 when it is built.
const CHECK_REQUESTS: usize = 1_000;

/// One way of serving the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Contender {
    Bare,
    Noop,
    OursGlobal,
    OursGlobalWrapBody,
    OursMatchedPath,
    TowerGovernor,
}

impl Contender {
    /// Every contender, in the order of the reports. The no-op layer must
    /// stay in the list: the paired figures are taken against it.
    pub(crate) const ALL: [Contender; 6] = [
        Contender::Bare,
        Contender::Noop,
        Contender::OursGlobal,
        Contender::OursGlobalWrapBody,
        Contender::OursMatchedPath,
        Contender::TowerGovernor,
    ];

    /// The benchmark id within a group.
    pub(crate) fn id(self) -> &'static str {
        match self {
            Contender::Bare => "bare_router",
            Contender::Noop => "noop_layer",
            Contender::OursGlobal => "ours_global",
            Contender::OursGlobalWrapBody => "ours_global_wrap_body",
            Contender::OursMatchedPath => "ours_matched_path",
            Contender::TowerGovernor => "tower_governor",
        }
    }

    /// The app with this contender's layer, checked to answer 200 with the
    /// handler's body.
    pub(crate) fn app(self, runtime: &Runtime) -> Router {
        let app = base();
        let app = match self {
            Contender::Bare => app,
            Contender::Noop => app.layer(NoopLayer),
            Contender::OursGlobal => app.layer(SlidingWindowLayer::qps(NEVER_REJECT)),
            // The body wrapped in `ResponseBody`, which axum then boxes.
            Contender::OursGlobalWrapBody => {
                app.layer(SlidingWindowLayer::qps(NEVER_REJECT).wrap_body())
            }
            Contender::OursMatchedPath => {
                app.layer(SlidingWindowLayer::qps(NEVER_REJECT).key(matched_path_key()))
            }
            Contender::TowerGovernor => app.layer(governor_never_rejecting()),
        };
        // What `axum::serve` does once per connection. Without it, a router
        // called as a service turns each handler into a route on every
        // request, calling every `Layer::layer` and boxing the result again
        // per request: a cost no served app pays.
        let mut app = app.with_state(());
        runtime.block_on(check(self, &mut app));
        app
    }
}

/// The app every contender wraps.
fn base() -> Router {
    Router::new()
        .route("/", get(handler))
        .route("/items/{id}", get(handler))
}

async fn handler() -> &'static str {
    "ok"
}

/// The matched route plus the method, as `MatchedPathKey` builds it.
#[cfg(feature = "axum")]
fn matched_path_key() -> impl KeyExtractor<Key = String> {
    tower_sliding_window::MatchedPathKey
}

/// Without the `axum` feature: a closure building the same key from axum's
/// `MatchedPath` extension, so the contender exists in every build.
#[cfg(not(feature = "axum"))]
fn matched_path_key() -> impl KeyExtractor<Key = String> {
    |parts: &axum::http::request::Parts| {
        let Some(path) = parts.extensions.get::<axum::extract::MatchedPath>() else {
            return String::from("<unmatched>");
        };
        let (method, path) = (parts.method.as_str(), path.as_str());
        let mut key = String::with_capacity(method.len() + 1 + path.len());
        key.push_str(method);
        key.push(' ');
        key.push_str(path);
        key
    }
}

/// tower_governor on one global key with a quota no bench can exhaust: a
/// new cell every nanosecond and a burst of `u32::MAX` cells (its
/// `per_second(n)` would mean one cell every `n` seconds, hence `period`).
fn governor_never_rejecting(
) -> GovernorLayer<GlobalKeyExtractor, NoOpMiddleware<QuantaInstant>, Body> {
    let config = GovernorConfigBuilder::default()
        .period(Duration::from_nanos(1))
        .burst_size(u32::MAX)
        .key_extractor(GlobalKeyExtractor)
        .finish()
        .expect("a non-zero period and burst");
    GovernorLayer::new(config)
}

/// A layer that wraps each route in a service that only forwards: the least
/// any `Router::layer` costs.
#[derive(Debug, Clone, Copy)]
struct NoopLayer;

impl<S> Layer<S> for NoopLayer {
    type Service = Forward<S>;

    fn layer(&self, inner: S) -> Forward<S> {
        Forward(inner)
    }
}

/// The service of [`NoopLayer`].
#[derive(Debug, Clone)]
struct Forward<S>(S);

impl<S: Service<R>, R> Service<R> for Forward<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        self.0.call(request)
    }
}

fn request() -> Request<Body> {
    Request::get(PATH)
        .body(Body::empty())
        .expect("a valid request")
}

/// Sends one request through `app` and reads its body to the end; returns
/// the status.
#[inline]
pub(crate) async fn serve_one(app: &mut Router) -> StatusCode {
    let ready = ServiceExt::<Request<Body>>::ready(app)
        .await
        .unwrap_or_else(|never: Infallible| match never {});
    let response = ready
        .call(request())
        .await
        .unwrap_or_else(|never| match never {});
    let status = response.status();
    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        black_box(frame.expect("the handler's body cannot fail"));
    }
    status
}

/// Panics unless `app` answers every one of [`CHECK_REQUESTS`] requests with
/// 200 and the handler's body.
async fn check(contender: Contender, app: &mut Router) {
    for n in 0..CHECK_REQUESTS {
        let response = ServiceExt::<Request<Body>>::oneshot(app.clone(), request())
            .await
            .unwrap_or_else(|never| match never {});
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("the handler's body cannot fail")
            .to_bytes();
        assert!(
            status == StatusCode::OK && body == "ok",
            "{}: request {n} answered {status} {body:?}; no contender may reject",
            contender.id()
        );
    }
    assert_eq!(serve_one(app).await, StatusCode::OK);
}

/// The runtime every layer bench runs on: one thread, the caller's.
pub(crate) fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
}
