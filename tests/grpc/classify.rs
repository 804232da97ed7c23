//! Which gRPC completions `.grpc()` counts as exceptions: every
//! `grpc-status` but 0, read from the response head (a trailers-only
//! answer) or from the trailers at the end of the body.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tonic::codegen::tokio_stream;
use tower::{service_fn, Layer, ServiceExt};
use tower_sliding_window::breaker::{Breaker, BreakerState};
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::SlidingWindowLayer;

type Frames = Vec<Result<Frame<Bytes>, Infallible>>;

/// The test service's body: its frames, one after the other.
type Framed = StreamBody<tokio_stream::Iter<<Frames as IntoIterator>::IntoIter>>;

/// How the test's service ends its answer.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// `grpc-status` in the head, no body (trailers-only).
    Head(&'static str),
    /// A message, then `grpc-status` in the trailers.
    Trailers(&'static str),
    /// A message and no trailers at all.
    NoStatus,
}

fn respond(answer: Answer) -> Response<Framed> {
    let mut frames: Frames = Vec::new();
    let mut response = Response::builder().header("content-type", "application/grpc");
    match answer {
        Answer::Head(status) => response = response.header("grpc-status", status),
        Answer::Trailers(status) => {
            frames.push(Ok(Frame::data(Bytes::from_static(b"\0\0\0\0\0"))));
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static(status));
            frames.push(Ok(Frame::trailers(trailers)));
        }
        Answer::NoStatus => frames.push(Ok(Frame::data(Bytes::from_static(b"\0\0\0\0\0")))),
    }
    response
        .body(StreamBody::new(tokio_stream::iter(frames)))
        .expect("a response")
}

#[tokio::test]
async fn every_code_but_ok_is_an_exception_in_the_head_or_the_trailers() {
    let layer = SlidingWindowLayer::qps(1_000)
        .clock(ManualClock::new(1_000_000))
        .grpc();
    let stats = layer.handle();
    let service = layer.layer(service_fn(|request: Request<Answer>| async move {
        Ok::<_, Infallible>(respond(*request.body()))
    }));

    let cases = [
        (Answer::Head("0"), false),
        (Answer::Trailers("0"), false),
        (Answer::NoStatus, false),
        (Answer::Head("5"), true),
        (Answer::Trailers("5"), true),
        (Answer::Head("1"), true),
        (Answer::Trailers("13"), true),
        (Answer::Trailers("14"), true),
    ];
    let mut exceptions = 0;
    for (answer, failed) in cases {
        let response = service
            .clone()
            .oneshot(Request::new(answer))
            .await
            .expect("infallible");
        response.into_body().collect().await.expect("no error");
        exceptions += u64::from(failed);
        let total = stats.total();
        assert_eq!(total.exception, exceptions, "after {answer:?}");
        assert_eq!(total.concurrency, 0, "after {answer:?}");
    }
}

/// A status in the trailers is only known at the end of the body: the
/// breaker opens on failures that a head-only classification cannot see.
#[tokio::test]
async fn failures_in_the_trailers_open_a_breaker() {
    let layer = SlidingWindowLayer::qps(1_000)
        .clock(ManualClock::new(1_000_000))
        .breaker(
            // Open on more than 1 failure, i.e. the second.
            Breaker::error_count(1)
                .min_requests(2)
                .open_for(Duration::from_secs(5)),
        )
        .grpc();
    let stats = layer.handle();
    let service = layer.layer(service_fn(|_: Request<()>| async move {
        Ok::<_, Infallible>(respond(Answer::Trailers("13")))
    }));

    for _ in 0..2 {
        let response = service
            .clone()
            .oneshot(Request::new(()))
            .await
            .expect("infallible");
        assert!(response.headers().get("grpc-status").is_none(), "passed");
        response.into_body().collect().await.expect("no error");
    }
    assert_eq!(
        stats.breakers(&()),
        [BreakerState::Open {
            half_open_in: Duration::from_secs(5)
        }]
    );
    let refused = service.oneshot(Request::new(())).await.expect("infallible");
    assert_eq!(refused.headers()["grpc-status"], "14");
    assert_eq!(refused.headers()["retry-after"], "5");
    let body = refused.into_body().collect().await.expect("no error");
    assert!(body.to_bytes().is_empty(), "trailers-only: no body");
}
