//! The layer as a plain tower middleware: `ServiceBuilder` + `service_fn`,
//! any request and response body, `poll_ready` that only forwards, shared
//! state across `Layer::layer` calls and clones, and axum's
//! `MethodRouter::layer`.

use crate::support;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};
use tower_sliding_window::{PathKey, SlidingWindowLayer};

use support::{at, clock, ok_then_429, read, statuses, Answer};

async fn echo(request: Request<String>) -> Result<Response<String>, Infallible> {
    Ok(Response::new(format!("echo: {}", request.into_body())))
}

/// Sends a `POST /` with `body` through `svc`, waiting for readiness first.
async fn call<S, B>(svc: &mut S, body: &str) -> Answer
where
    S: Service<Request<String>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
    B::Error: std::fmt::Debug,
{
    let request = Request::post("/").body(body.to_owned()).expect("request");
    let ready = svc.ready().await.expect("ready");
    read(ready.call(request).await.expect("response")).await
}

#[tokio::test]
async fn service_builder_with_service_fn() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(2).clock(clock.clone()).track_body();
    let stats = layer.handle();
    let mut svc = ServiceBuilder::new().layer(layer).service_fn(echo);

    for body in ["a", "b"] {
        let answer = call(&mut svc, body).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", at(&clock));
        assert_eq!(answer.body, format!("echo: {body}"));
    }
    let answer = call(&mut svc, "c").await;
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        at(&clock)
    );
    assert_eq!(answer.retry_after(), 1, "{}", at(&clock));
    assert_eq!(answer.header("ratelimit-policy"), r#""default";q=2;w=1"#);
    assert_eq!(answer.header("ratelimit"), r#""default";r=0;t=1"#);
    assert!(
        answer.body.starts_with("Too Many Requests"),
        "{:?}",
        answer.body
    );
    assert_eq!(stats.snapshot(&()).map(|s| (s.pass, s.block)), Some((2, 1)));
}

/// A response body that yields its chunks one frame at a time.
struct Chunks(VecDeque<&'static str>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let chunk = self.get_mut().0.pop_front();
        Poll::Ready(chunk.map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes())))))
    }
}

#[tokio::test]
async fn a_streaming_body_passes_through_untouched() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(5).clock(clock.clone()).track_body();
    let svc = layer.layer(service_fn(|_: Request<()>| async {
        let body = Chunks(VecDeque::from(["one,", "two,", "three"]));
        Ok::<_, Infallible>(Response::new(body))
    }));
    let answer = read(svc.oneshot(Request::new(())).await.expect("response")).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", at(&clock));
    assert_eq!(answer.body, "one,two,three");
}

/// A service that is ready only while its gate is open, and counts calls.
#[derive(Clone)]
struct Gated {
    open: Arc<AtomicBool>,
    fail: Arc<AtomicBool>,
    calls: Arc<AtomicUsize>,
}

impl Service<Request<String>> for Gated {
    type Response = Response<String>;
    type Error = io::Error;
    type Future = std::future::Ready<Result<Response<String>, io::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        if self.fail.load(Ordering::SeqCst) {
            return Poll::Ready(Err(io::Error::other("inner not ready")));
        }
        if self.open.load(Ordering::SeqCst) {
            Poll::Ready(Ok(()))
        } else {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    fn call(&mut self, _request: Request<String>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(Response::new("ok".to_owned())))
    }
}

/// A waker that does nothing: the test polls by hand.
struct NoWake;

impl std::task::Wake for NoWake {
    fn wake(self: Arc<Self>) {}
}

#[tokio::test]
async fn poll_ready_only_forwards_and_reserves_nothing() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(3).clock(clock.clone()).track_body();
    let stats = layer.handle();
    let inner = Gated {
        open: Arc::new(AtomicBool::new(false)),
        fail: Arc::new(AtomicBool::new(false)),
        calls: Arc::new(AtomicUsize::new(0)),
    };
    let mut svc = layer.layer(inner.clone());
    let waker = std::task::Waker::from(Arc::new(NoWake));
    let mut cx = Context::from_waker(&waker);

    // Not ready while the inner service is not.
    assert!(svc.poll_ready(&mut cx).is_pending());
    inner.open.store(true, Ordering::SeqCst);
    // Readiness many times over consumes no quota.
    for _ in 0..50 {
        assert!(matches!(svc.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    }
    assert!(
        stats
            .snapshot(&())
            .is_none_or(|s| s.pass == 0 && s.block == 0),
        "poll_ready recorded something {}",
        at(&clock)
    );

    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(call(&mut svc, "").await.status);
    }
    assert_eq!(got, ok_then_429(3, 2), "{}", at(&clock));
    assert_eq!(
        inner.calls.load(Ordering::SeqCst),
        3,
        "blocked: inner not called"
    );

    // The inner service's readiness error comes through unchanged.
    inner.fail.store(true, Ordering::SeqCst);
    match svc.poll_ready(&mut cx) {
        Poll::Ready(Err(error)) => assert_eq!(error.to_string(), "inner not ready"),
        other => panic!("expected the inner error, got {other:?}"),
    }
}

#[tokio::test]
async fn every_service_a_layer_makes_shares_one_state() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(4).clock(clock.clone()).track_body();
    let stats = layer.handle();
    let mut one = layer.layer(service_fn(echo));
    let mut two = layer.clone().layer(service_fn(echo));
    let mut three = one.clone();

    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(call(&mut one, "").await.status);
        got.push(call(&mut two, "").await.status);
        got.push(call(&mut three, "").await.status);
    }
    assert_eq!(got, ok_then_429(4, 2), "{}", at(&clock));
    assert_eq!(stats.snapshot(&()).map(|s| s.pass), Some(4));
    // A handle from a service is the same state too.
    assert_eq!(three.handle().snapshot(&()).map(|s| s.block), Some(2));
}

#[tokio::test]
async fn the_inner_service_is_reachable() {
    let layer = SlidingWindowLayer::qps(1).track_body();
    let mut svc = layer.layer(Gated {
        open: Arc::new(AtomicBool::new(true)),
        fail: Arc::new(AtomicBool::new(false)),
        calls: Arc::new(AtomicUsize::new(0)),
    });
    svc.get_mut().calls.store(7, Ordering::SeqCst);
    assert_eq!(svc.get_ref().calls.load(Ordering::SeqCst), 7);
    let inner = svc.into_inner();
    assert_eq!(inner.calls.load(Ordering::SeqCst), 7);
}

#[tokio::test]
async fn method_router_layer_limits_only_that_route() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(2).key(PathKey).clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route("/limited", get(|| async { "limited" }).layer(layer))
        .route("/free", get(|| async { "free" }));

    assert_eq!(
        statuses(&app, "/limited", 3).await,
        ok_then_429(2, 1),
        "{}",
        at(&clock)
    );
    assert_eq!(statuses(&app, "/free", 5).await, ok_then_429(5, 0));
    assert_eq!(stats.keys(), ["/limited"]);
}

#[tokio::test]
async fn a_closure_key_sees_what_outer_layers_did() {
    // A layer added after ours runs first: here it sets the header the key
    // closure reads, and a rule gives that key its own limit.
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1)
        .key(|parts: &http::request::Parts| parts.headers.contains_key("x-vip"))
        .rule(true, 100)
        .clock(clock.clone());
    let app = Router::new()
        .route("/", get(|| async { "hi" }))
        .layer(layer)
        .layer(tower::util::MapRequestLayer::new(
            |mut request: Request<axum::body::Body>| {
                if request.uri().query() == Some("vip") {
                    request
                        .headers_mut()
                        .insert("x-vip", http::HeaderValue::from_static("1"));
                }
                request
            },
        ));

    assert_eq!(
        statuses(&app, "/?vip", 5).await,
        ok_then_429(5, 0),
        "{}",
        at(&clock)
    );
    assert_eq!(
        statuses(&app, "/", 2).await,
        ok_then_429(1, 1),
        "{}",
        at(&clock)
    );
}
