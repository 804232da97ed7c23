//! The tower `Service` contract, checked against `tower_test`'s mock inner
//! service: `poll_ready` forwards readiness and reserves nothing, `call`
//! answers a refused request without `poll_ready` and without touching the
//! inner service, and the inner service's errors (from `poll_ready` and from
//! its future) reach the caller unchanged, counted as completions that
//! failed.

use crate::support;

use std::task::Poll;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio_test::{assert_pending, assert_ready_ok};
use tower_sliding_window::SlidingWindowLayer;
use tower_test::mock;

use support::at;

type Mock = mock::Mock<Request<&'static str>, Response<Full<Bytes>>>;
type Handle = mock::Handle<Request<&'static str>, Response<Full<Bytes>>>;

fn limited(
    limit: u64,
) -> (
    mock::Spawn<tower_sliding_window::SlidingWindow<Mock>>,
    Handle,
    tower_sliding_window::StatsHandle<()>,
    tower_sliding_window::clock::ManualClock,
) {
    let clock = support::clock();
    let layer = SlidingWindowLayer::qps(limit).clock(clock.clone());
    let stats = layer.handle();
    let (service, handle) = mock::spawn_layer(layer);
    (service, handle, stats, clock)
}

#[tokio::test]
async fn poll_ready_follows_the_inner_service_and_reserves_nothing() {
    let (mut service, mut handle, stats, clock) = limited(1);

    // The inner service is not ready: neither is the limiter.
    handle.allow(0);
    assert_pending!(service.poll_ready());
    // Ready as soon as the inner service is, as often as asked, and no
    // quota is taken for it.
    handle.allow(1);
    for _ in 0..10 {
        assert_ready_ok!(service.poll_ready());
    }
    let counted = stats.snapshot(&()).map_or(0, |s| s.pass + s.block);
    assert_eq!(counted, 0, "poll_ready recorded a request {}", at(&clock));

    // The one pass of the window is still there for a call.
    let response = service.call(Request::new("first"));
    let (request, send) = handle
        .next_request()
        .await
        .expect("the inner service is called");
    assert_eq!(*request.body(), "first");
    send.send_response(Response::new(Full::new(Bytes::from_static(b"ok"))));
    let response = response.await.expect("the inner response");
    assert_eq!(response.status(), StatusCode::OK, "{}", at(&clock));
}

#[tokio::test]
async fn a_refused_call_needs_no_poll_ready_and_never_reaches_the_inner_service() {
    let (mut service, mut handle, stats, clock) = limited(0);
    // The inner service would not even be ready.
    handle.allow(0);

    for _ in 0..3 {
        let response = service
            .call(Request::new("refused"))
            .await
            .expect("a refusal is a response, not an error");
        assert_eq!(
            response.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{}",
            at(&clock)
        );
    }
    // Nothing reached the mock: with no request waiting, its handle is
    // still pending.
    let mut next = tokio_test::task::spawn(handle.next_request());
    assert_pending!(next.poll(), "a refused request reached the inner service");
    drop(next);
    let snapshot = stats.snapshot(&()).expect("the key has statistics");
    assert_eq!((snapshot.pass, snapshot.block), (0, 3), "{}", at(&clock));
}

#[tokio::test]
async fn inner_errors_pass_through_unchanged() {
    let (mut service, mut handle, stats, clock) = limited(10);

    // An error from the inner service's readiness.
    handle.send_error("inner not ready: overloaded");
    let error = match service.poll_ready() {
        Poll::Ready(Err(error)) => error,
        other => panic!("expected the inner readiness error, got {other:?}"),
    };
    assert_eq!(error.to_string(), "inner not ready: overloaded");

    // An error from the inner service's future, for an admitted request:
    // the same error value, and the request counted as an exception.
    handle.allow(1);
    assert_ready_ok!(service.poll_ready());
    let response = service.call(Request::new("fails"));
    let (_, send) = handle.next_request().await.expect("called");
    send.send_error(std::io::Error::other("backend gone"));
    let error = response.await.expect_err("the inner error");
    assert_eq!(error.to_string(), "backend gone");
    let io = error
        .downcast_ref::<std::io::Error>()
        .expect("the very error value the inner service returned");
    assert_eq!(io.kind(), std::io::ErrorKind::Other);
    let snapshot = stats.snapshot(&()).expect("the key has statistics");
    assert_eq!(
        (snapshot.pass, snapshot.success, snapshot.exception),
        (1, 1, 1),
        "{}",
        at(&clock)
    );
}
