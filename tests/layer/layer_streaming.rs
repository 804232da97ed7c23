//! Streamed response bodies: when a request completes with the default body
//! mode (at the response head) and with `track_body` (at the end of the
//! body), what a client that goes away mid-body leaves behind, and failures
//! that only the end of the stream can tell (gRPC trailers, a body error).

use crate::support;

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body as AxumBody;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tower::{service_fn, Layer, ServiceExt};
use tower_http::classify::{GrpcErrorsAsFailures, SharedClassifier};
use tower_sliding_window::body::{BodyKind, DefaultEos};
use tower_sliding_window::breaker::{Breaker, BreakerState};
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::{SlidingWindowLayer, StatsHandle};

use support::{at, clock, ms};

/// A body fed frame by frame from a channel: a slow stream the test
/// drives. The sender's drop ends it.
struct Fed(mpsc::UnboundedReceiver<Result<Frame<Bytes>, &'static str>>);

impl Body for Fed {
    type Data = Bytes;
    type Error = &'static str;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx)
    }
}

/// A rejection's text as a `Fed` body: one data frame, then the end. This
/// lets the default body mode (the inner body type) answer with `Fed`.
impl From<Bytes> for Fed {
    fn from(text: Bytes) -> Fed {
        let (feed, body) = mpsc::unbounded_channel();
        feed.send(Ok(Frame::data(text))).expect("the body is alive");
        Fed(body)
    }
}

type Feed = mpsc::UnboundedSender<Result<Frame<Bytes>, &'static str>>;

/// A service that answers every request with a `Fed` body, handing the
/// sending side to the test through `feeds`.
fn streaming_service(
    feeds: mpsc::UnboundedSender<Feed>,
) -> impl tower::Service<Request<()>, Response = Response<Fed>, Error = Infallible, Future = impl Send>
       + Clone {
    service_fn(move |_: Request<()>| {
        let feeds = feeds.clone();
        async move {
            let (feed, body) = mpsc::unbounded_channel();
            feeds.send(feed).expect("the test holds the receiver");
            Ok::<_, Infallible>(Response::new(Fed(body)))
        }
    })
}

fn data(text: &'static str) -> Result<Frame<Bytes>, &'static str> {
    Ok(Frame::data(Bytes::from_static(text.as_bytes())))
}

/// One request through `layer` around a streaming service: the response,
/// the sending side of its body, and the layer's handle.
async fn stream_one<R>(
    layer: SlidingWindowLayer<
        tower_sliding_window::GlobalKey,
        tower_sliding_window::DefaultClassifier,
        R,
    >,
) -> (
    Response<<R as BodyKind<Fed, DefaultEos>>::Body>,
    Feed,
    StatsHandle<()>,
)
where
    R: BodyKind<Fed, DefaultEos>,
{
    let stats = layer.handle();
    let (feeds, mut fed) = mpsc::unbounded_channel();
    let service = layer.layer(streaming_service(feeds));
    let response = service.oneshot(Request::new(())).await.expect("infallible");
    let feed = fed.recv().await.expect("a feed per request");
    (response, feed, stats)
}

fn concurrency<K: Clone + Eq + std::hash::Hash + Send + Sync + 'static>(
    stats: &StatsHandle<K>,
) -> u64 {
    stats.total().concurrency
}

/// `track_body`: a slowly streamed body keeps its request in flight until
/// the last frame, and its response time covers the whole body.
#[tokio::test]
async fn a_tracked_stream_is_in_flight_until_its_end() {
    let clock = clock();
    let (response, feed, stats) = stream_one(
        SlidingWindowLayer::qps(10)
            .clock(clock.clone())
            .track_body(),
    )
    .await;
    let mut body = response.into_body();
    assert_eq!(
        concurrency(&stats),
        1,
        "head sent, body not: {}",
        at(&clock)
    );

    clock.advance(ms(300));
    feed.send(data("first")).expect("body alive");
    let frame = body.frame().await.expect("a frame").expect("no error");
    assert_eq!(frame.into_data().expect("data"), "first");
    assert_eq!(concurrency(&stats), 1, "mid-body: {}", at(&clock));
    assert_eq!(stats.total().success, 0, "not complete yet: {}", at(&clock));

    clock.advance(ms(200));
    drop(feed);
    assert!(body.frame().await.is_none(), "the stream ended");
    let total = stats.total();
    assert_eq!(total.concurrency, 0, "{}", at(&clock));
    assert_eq!((total.pass, total.success, total.exception), (1, 1, 0));
    assert_eq!(
        total.avg_rt,
        Some(ms(500)),
        "RT covers the body: {}",
        at(&clock)
    );
}

/// The default mode completes at the head: the gauge drops while the body
/// still streams, and the response time is the time to the head.
#[tokio::test]
async fn by_default_a_stream_completes_at_its_head() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10).clock(clock.clone());
    let stats = layer.handle();
    let (feeds, mut fed) = mpsc::unbounded_channel();
    let service = layer.layer(streaming_service(feeds));

    let response = service.oneshot(Request::new(())).await.expect("infallible");
    let feed = fed.recv().await.expect("a feed per request");
    let total = stats.total();
    assert_eq!((total.concurrency, total.success), (0, 1), "{}", at(&clock));
    assert_eq!(total.avg_rt, Some(Duration::ZERO));

    clock.advance(ms(300));
    feed.send(data("late")).expect("body alive");
    drop(feed);
    let bytes = response.into_body().collect().await.expect("no error");
    assert_eq!(bytes.to_bytes(), "late");
    assert_eq!(stats.total().avg_rt, Some(Duration::ZERO), "{}", at(&clock));
}

/// A client that goes away mid-body drops the body: the slot is released
/// and nothing more is recorded (no success, no exception).
#[tokio::test]
async fn a_body_dropped_mid_stream_releases_its_slot() {
    let clock = clock();
    let (response, feed, stats) = stream_one(
        SlidingWindowLayer::qps(10)
            .clock(clock.clone())
            .track_body(),
    )
    .await;
    let mut body = response.into_body();
    feed.send(data("one")).expect("body alive");
    body.frame().await.expect("a frame").expect("no error");
    drop(body);

    let total = stats.total();
    assert_eq!(total.concurrency, 0, "{}", at(&clock));
    assert_eq!((total.pass, total.success, total.exception), (1, 0, 0));
    assert!(feed.send(data("two")).is_err(), "the body is gone");
}

/// A body that fails mid-stream is an exception with `track_body`.
#[tokio::test]
async fn a_body_error_mid_stream_is_an_exception() {
    let clock = clock();
    let (response, feed, stats) = stream_one(
        SlidingWindowLayer::qps(10)
            .clock(clock.clone())
            .track_body(),
    )
    .await;
    feed.send(data("one")).expect("body alive");
    feed.send(Err("disk gone")).expect("body alive");
    let error = response
        .into_body()
        .collect()
        .await
        .expect_err("the body fails");
    assert_eq!(error, "disk gone");
    let total = stats.total();
    assert_eq!(
        (total.success, total.exception, total.concurrency),
        (1, 1, 0)
    );
}

fn trailers(status: &'static str) -> Result<Frame<Bytes>, &'static str> {
    let mut map = HeaderMap::new();
    map.insert("grpc-status", HeaderValue::from_static(status));
    Ok(Frame::trailers(map))
}

/// gRPC puts its status in the trailers: with `track_body`, tower-http's
/// `GrpcErrorsAsFailures` is asked at the end of the stream, so
/// `grpc-status: 13` (internal) counts as an exception and `0` does not.
#[tokio::test]
async fn grpc_trailers_are_classified_at_the_end_of_the_stream() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .clock(clock.clone())
        .classify(SharedClassifier::new(GrpcErrorsAsFailures::new()))
        .track_body();
    let stats = layer.handle();
    let (feeds, mut fed) = mpsc::unbounded_channel();
    let service = layer.layer(streaming_service(feeds));

    for (status, exceptions) in [("0", 0), ("13", 1)] {
        let request = Request::builder()
            .header("content-type", "application/grpc")
            .body(())
            .expect("request");
        let response = service.clone().oneshot(request).await.expect("infallible");
        let feed = fed.recv().await.expect("a feed per request");
        feed.send(data("message")).expect("body alive");
        feed.send(trailers(status)).expect("body alive");
        drop(feed);
        response.into_body().collect().await.expect("no error");
        let total = stats.total();
        assert_eq!(total.exception, exceptions, "after grpc-status {status}");
        assert_eq!(total.concurrency, 0);
    }
}

/// Through a real server: a client reads the head and the first chunk of a
/// streamed response, then closes the connection; the server notices when
/// it writes the next chunk, drops the body, and the slot is released.
#[tokio::test]
async fn a_client_that_disconnects_mid_body_over_tcp() {
    let clock = ManualClock::new(0);
    let layer = SlidingWindowLayer::qps(10)
        .clock(clock.clone())
        .track_body();
    let stats = layer.handle();
    let (feeds, mut fed) = mpsc::unbounded_channel::<Feed>();
    let app = axum::Router::new()
        .route(
            "/stream",
            axum::routing::get(move || {
                let feeds = feeds.clone();
                async move {
                    let (feed, body) = mpsc::unbounded_channel();
                    feeds.send(feed).expect("the test holds the receiver");
                    Response::new(AxumBody::new(Fed(body).map_err(axum::Error::new)))
                }
            }),
        )
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free loopback port");
    let addr = listener.local_addr().expect("bound");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    let connection = tokio::spawn(connection);
    let response = sender
        .send_request(
            Request::get("/stream")
                .body(http_body_util::Empty::<Bytes>::new())
                .expect("request"),
        )
        .await
        .expect("response head");
    assert_eq!(response.status(), StatusCode::OK);
    let feed = fed.recv().await.expect("a feed per request");
    feed.send(data("first")).expect("body alive");
    let mut body = response.into_body();
    body.frame().await.expect("a frame").expect("no error");
    assert_eq!(stats.total().concurrency, 1);

    // The client goes away.
    drop(body);
    drop(sender);
    connection.abort();
    let _ = connection.await;

    // The server finds out when it writes again; bounded, no timing.
    let mut rounds = 0;
    while stats.total().concurrency != 0 {
        rounds += 1;
        assert!(rounds < 10_000, "the slot was never released");
        let _ = feed.send(data("more"));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let total = stats.total();
    assert_eq!((total.pass, total.success, total.exception), (1, 0, 0));
    server.abort();
}

/// A layer around the streaming service, and the receiving side of its
/// feeds: one request at a time, through [`Streams::start`].
struct Streams<S> {
    service: S,
    fed: mpsc::UnboundedReceiver<Feed>,
}

impl<S, B> Streams<S>
where
    S: tower::Service<Request<()>, Response = Response<B>, Error = Infallible> + Clone,
{
    /// Sends one request: `Ok` with the response and its feed when the
    /// layer passed it, `Err` with the status when the layer answered.
    async fn start(&mut self) -> Result<(Response<B>, Feed), StatusCode> {
        let response = self
            .service
            .clone()
            .oneshot(Request::new(()))
            .await
            .expect("infallible");
        if response.status() != StatusCode::OK {
            return Err(response.status());
        }
        let feed = self.fed.recv().await.expect("a feed per passed request");
        Ok((response, feed))
    }
}

/// Ends a response's stream after `frame` and reads it to the end.
async fn finish<B: Body>(
    response: Response<B>,
    feed: Feed,
    frame: Result<Frame<Bytes>, &'static str>,
) where
    B::Error: std::fmt::Debug,
{
    feed.send(frame).expect("body alive");
    drop(feed);
    let _ = response.into_body().collect().await;
}

/// The probe of a `slow_ratio` breaker answers with a stream that never
/// ends (`track_body`: it completes at the end of its body). Once a request
/// finds the probe out for longer than `max_rt`, the probe is known to be
/// slow and has failed: the breaker is open again for `open_for`, the next
/// probe closes it. Without that, all 59 requests of 3 s (one every 50 ms)
/// got 503 while the stream went on.
#[tokio::test]
async fn a_never_ending_probe_of_a_slow_ratio_breaker_is_slow() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1_000)
        .clock(clock.clone())
        .track_body()
        .breaker(
            Breaker::slow_ratio(ms(20), 0.5)
                .min_requests(1)
                .open_for(ms(500)),
        );
    let stats = layer.handle();
    let (feeds, fed) = mpsc::unbounded_channel();
    let mut streams = Streams {
        service: layer.layer(streaming_service(feeds)),
        fed,
    };
    // One slow stream (30 ms) opens it.
    let (response, feed) = streams.start().await.expect("closed");
    clock.advance(ms(30));
    finish(response, feed, data("slow")).await;
    assert!(matches!(
        stats.breakers(&())[..],
        [BreakerState::Open { .. }]
    ));

    // Half-open: the probe's stream never ends.
    clock.advance(ms(500));
    let (probe, probe_feed) = streams.start().await.expect("the probe");
    probe_feed.send(data("first")).expect("body alive");
    let mut probe_body = probe.into_body();
    probe_body
        .frame()
        .await
        .expect("a frame")
        .expect("no error");

    let mut refused = 0;
    for _ in 0..59 {
        clock.advance(ms(50));
        match streams.start().await {
            Ok((response, feed)) => finish(response, feed, data("fast")).await,
            Err(status) => {
                assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
                refused += 1;
            }
        }
    }
    // The first request fails the probe (out 50 ms, over 20 ms) and opens
    // the breaker for 500 ms: it and the 9 after it are refused; the 11th
    // probes, fast, and closes it.
    assert_eq!(refused, 10, "of 59 requests over 3 s, {}", at(&clock));
    assert_eq!(stats.breakers(&()), [BreakerState::Closed]);

    // The old probe ends at last: a slow completion like any other, which
    // decides nothing for the breaker it no longer probes (1 slow of 50).
    clock.advance(ms(50));
    drop(probe_feed);
    assert!(probe_body.frame().await.is_none());
    assert_eq!(stats.breakers(&()), [BreakerState::Closed]);
    let (response, feed) = streams.start().await.expect("closed");
    finish(response, feed, data("fast")).await;
    assert_eq!(stats.total().concurrency, 0);
}

/// For the other measures a probe has until the longer of `stat_interval`
/// and `open_for` to decide; after that it counts as failed. Its late
/// success then does not close the breaker it lost.
#[tokio::test]
async fn a_probe_out_past_its_deadline_failed_and_its_late_success_closes_nothing() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1_000)
        .clock(clock.clone())
        .track_body()
        .breaker(Breaker::error_count(0).min_requests(1).open_for(ms(500)));
    let stats = layer.handle();
    let (feeds, fed) = mpsc::unbounded_channel();
    let mut streams = Streams {
        service: layer.layer(streaming_service(feeds)),
        fed,
    };
    // A stream that fails opens it.
    let (response, feed) = streams.start().await.expect("closed");
    finish(response, feed, Err("upstream reset")).await;
    assert!(matches!(
        stats.breakers(&())[..],
        [BreakerState::Open { .. }]
    ));

    clock.advance(ms(500));
    let (probe, probe_feed) = streams.start().await.expect("the probe");
    // Out for 999 ms of the 1 000 (the default stat interval): still
    // deciding, every other request waits for it.
    clock.advance(ms(999));
    assert_eq!(
        streams.start().await.err(),
        Some(StatusCode::SERVICE_UNAVAILABLE)
    );
    assert_eq!(stats.breakers(&()), [BreakerState::HalfOpen]);
    // At 1 000 ms it has failed: open again for 500 ms.
    clock.advance(ms(1));
    assert_eq!(
        streams.start().await.err(),
        Some(StatusCode::SERVICE_UNAVAILABLE)
    );
    assert_eq!(
        stats.breakers(&()),
        [BreakerState::Open {
            half_open_in: ms(500)
        }],
        "{}",
        at(&clock)
    );
    // Its stream ends well now: it probes nothing any more.
    finish(probe, probe_feed, data("late")).await;
    assert_eq!(
        stats.breakers(&()),
        [BreakerState::Open {
            half_open_in: ms(500)
        }],
        "{}",
        at(&clock)
    );
    // The next probe decides.
    clock.advance(ms(500));
    let (response, feed) = streams.start().await.expect("the next probe");
    finish(response, feed, data("fine")).await;
    assert_eq!(stats.breakers(&()), [BreakerState::Closed]);
}
