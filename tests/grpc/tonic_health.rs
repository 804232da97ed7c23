//! A tonic server with the layer and tonic's health service, called by
//! tonic's health client over loopback: what a gRPC client makes of each
//! refusal, with and without `.grpc()`.

use std::time::Duration;

use prost::Message;
use tonic::codegen::tokio_stream::{self, StreamExt};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::HealthReporter;
use tonic_types::StatusExt;
use tower_sliding_window::breaker::{Breaker, BreakerState};
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::SlidingWindowLayer;

/// A tonic server on a free loopback port, stopped when dropped.
struct Running {
    addr: std::net::SocketAddr,
    /// Kept so that the health statuses stay as set.
    _reporter: HealthReporter,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Running {
    async fn channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("a valid URI")
            .connect()
            .await
            .expect("the server accepts")
    }

    async fn client(&self) -> HealthClient<Channel> {
        HealthClient::new(self.channel().await)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Serves tonic's health service behind `$layer` (a macro: the layer's
/// type differs from test to test, and tonic's bounds on it are many).
macro_rules! serve {
    ($layer:expr) => {{
        let (reporter, health) = tonic_health::server::health_reporter();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            tonic::transport::Server::builder()
                .layer($layer)
                .add_service(health)
                .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                    let _ = stopped.await;
                }),
        );
        Running {
            addr,
            _reporter: reporter,
            stop: Some(stop),
        }
    }};
}

fn check(service: &str) -> HealthCheckRequest {
    HealthCheckRequest {
        service: service.to_string(),
    }
}

/// Calls `check` for the server's overall health (`""`), which tonic's
/// health service reports as serving.
async fn serving(client: &mut HealthClient<Channel>) -> Result<(), Status> {
    let response = client.check(check("")).await?;
    assert_eq!(
        response.into_inner().status,
        ServingStatus::Serving as i32,
        "the RPC reached the service"
    );
    Ok(())
}

/// The retry delay a client reads from the status details, decoded with
/// tonic-types (the google.rpc decoders), after checking that the details
/// repeat the status's code and message.
fn retry_delay(status: &Status) -> Duration {
    let details = tonic_types::Status::decode(status.details()).expect("a google.rpc.Status");
    assert_eq!(details.code, status.code() as i32);
    assert_eq!(details.message, status.message());
    status
        .get_details_retry_info()
        .expect("a RetryInfo in the details")
        .retry_delay
        .expect("a retry delay")
}

fn metadata<'a>(status: &'a Status, name: &str) -> Option<&'a str> {
    status
        .metadata()
        .get(name)
        .map(|value| value.to_str().expect("ASCII metadata"))
}

/// The point of `.grpc()`: a refusal reads as `RESOURCE_EXHAUSTED`, not
/// the `UNAVAILABLE` that gRPC makes of a 429, and the client finds the
/// retry time to the millisecond in the status details, with
/// `Retry-After` and the RateLimit fields as metadata.
#[tokio::test]
async fn a_refused_rpc_is_resource_exhausted_with_its_retry_delay() {
    let clock = ManualClock::new(1_000_000);
    let layer = SlidingWindowLayer::qps(2)
        .window(Duration::from_secs(10), 10)
        .clock(clock.clone())
        .grpc();
    let stats = layer.handle();
    let server = serve!(layer);
    let mut client = server.client().await;

    serving(&mut client).await.expect("first of 2");
    serving(&mut client).await.expect("second of 2");
    clock.advance(Duration::from_millis(2_300));
    let status = serving(&mut client)
        .await
        .expect_err("the third is refused");

    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), "rate limit reached: retry in 8 s");
    // Both passes were in the bucket [1 000 000, 1 001 000) ms, which
    // leaves the 10 s window at 1 011 000 ms: 7.7 s after the refusal.
    assert_eq!(retry_delay(&status), Duration::from_millis(7_700));
    assert_eq!(metadata(&status, "retry-after"), Some("8"));
    assert_eq!(
        metadata(&status, "ratelimit-policy"),
        Some(r#""default";q=2;w=10"#)
    );
    assert_eq!(metadata(&status, "ratelimit"), Some(r#""default";r=0;t=8"#));
    let total = stats.total();
    assert_eq!((total.pass, total.block), (2, 1));

    // Once the window has moved on, the client gets through again.
    clock.advance(Duration::from_millis(7_700));
    serving(&mut client)
        .await
        .expect("the window has room again");
}

/// Without `.grpc()` the same refusal is an HTTP 429 with a text body. A
/// gRPC client maps a body-less 429 to `UNAVAILABLE` (gRPC's HTTP-to-status
/// mapping), which retry policies retry at once; tonic, which reads the
/// text as a gRPC frame first, reports `INTERNAL`. Either way there is no
/// retry delay: the behaviour `.grpc()` exists to replace.
#[tokio::test]
async fn without_grpc_a_refusal_reads_as_a_transport_failure_without_a_delay() {
    let clock = ManualClock::new(1_000_000);
    let layer = SlidingWindowLayer::qps(1).clock(clock.clone()).track_body();
    let server = serve!(layer);
    let mut client = server.client().await;

    serving(&mut client).await.expect("the first passes");
    let status = serving(&mut client).await.expect_err("refused");
    assert!(
        matches!(status.code(), Code::Internal | Code::Unavailable),
        "{status:?}"
    );
    assert!(status.message().contains("429"), "{status:?}");
    assert!(status.get_details_retry_info().is_none(), "{status:?}");
}

/// Failing RPCs (a health check of an unknown service is `NOT_FOUND`,
/// sent in an HTTP 200) count as exceptions under `.grpc()` and open the
/// breaker; the next RPC reads `UNAVAILABLE` with the time until the
/// breaker turns half-open, and no RateLimit fields (the refusal is not
/// about the client's quota).
#[tokio::test]
async fn failing_rpcs_open_the_breaker_and_the_client_sees_unavailable() {
    let clock = ManualClock::new(1_000_000);
    let layer = SlidingWindowLayer::qps(1_000)
        .clock(clock.clone())
        .breaker(
            // Open on more than 2 failures, i.e. the third.
            Breaker::error_count(2)
                .min_requests(3)
                .open_for(Duration::from_secs(30)),
        )
        .grpc();
    let stats = layer.handle();
    let server = serve!(layer);
    let mut client = server.client().await;

    for _ in 0..3 {
        let status = client
            .check(check("no.such.Service"))
            .await
            .expect_err("an unknown service");
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
    }
    assert_eq!(stats.total().exception, 3);
    assert_eq!(
        stats.breakers(&()),
        [BreakerState::Open {
            half_open_in: Duration::from_secs(30)
        }]
    );

    let status = serving(&mut client).await.expect_err("the breaker is open");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "circuit breaker open: retry in 30 s");
    assert_eq!(retry_delay(&status), Duration::from_secs(30));
    assert_eq!(metadata(&status, "retry-after"), Some("30"));
    assert_eq!(metadata(&status, "ratelimit"), None);
    assert_eq!(metadata(&status, "ratelimit-policy"), None);

    // Half-open after 30 s: a healthy probe closes it.
    clock.advance(Duration::from_secs(30));
    serving(&mut client).await.expect("the probe passes");
    assert_eq!(stats.breakers(&()), [BreakerState::Closed]);
}

/// Without `.grpc()` the layer sees those RPCs as HTTP 200s: they are no
/// exceptions and the breaker never opens.
#[tokio::test]
async fn without_grpc_failing_rpcs_are_not_exceptions() {
    let layer = SlidingWindowLayer::qps(1_000)
        .clock(ManualClock::new(1_000_000))
        .breaker(Breaker::error_count(3).min_requests(3))
        .track_body();
    let stats = layer.handle();
    let server = serve!(layer);
    let mut client = server.client().await;

    for _ in 0..4 {
        let status = client
            .check(check("no.such.Service"))
            .await
            .expect_err("an unknown service");
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
    }
    assert_eq!(stats.total().exception, 0);
    assert_eq!(stats.breakers(&()), [BreakerState::Closed]);
}

/// A retry time past the largest `google.protobuf.Duration` (10 000 years)
/// reaches the client as that duration, which decodes; `Retry-After`
/// keeps the real figure.
#[tokio::test]
async fn a_huge_retry_time_is_sent_as_the_largest_duration() {
    // A window of 12 000 years, in one bucket.
    let window = Duration::from_secs(12_000 * 365 * 86_400);
    let clock = ManualClock::new(1_000_000);
    let layer = SlidingWindowLayer::qps(1)
        .window(window, 1)
        .clock(clock.clone())
        .grpc();
    let server = serve!(layer);
    let mut client = server.client().await;

    serving(&mut client).await.expect("the first passes");
    let status = serving(&mut client).await.expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(retry_delay(&status), Duration::from_secs(315_576_000_000));
    let retry_after: u64 = metadata(&status, "retry-after")
        .expect("Retry-After")
        .parse()
        .expect("seconds");
    assert!(retry_after > 315_576_000_000, "{retry_after}");
    assert!(retry_after <= window.as_secs(), "{retry_after}");
}

/// A builder's message with `%`, control and non-ASCII characters reaches
/// the client whole: percent-encoded in `grpc-message`, as it is in the
/// details.
#[tokio::test]
async fn a_builders_message_with_control_and_non_ascii_characters_arrives_whole() {
    const MESSAGE: &str = "quota 100% spent\r\n\t\u{7f}: réessayez 稍后 🙂";
    let layer = SlidingWindowLayer::qps(1)
        .clock(ManualClock::new(1_000_000))
        .grpc()
        .reject_with(|rejection| rejection.grpc_response(rejection.grpc_code(), MESSAGE));
    let server = serve!(layer);
    let mut client = server.client().await;

    serving(&mut client).await.expect("the first passes");
    let status = serving(&mut client).await.expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), MESSAGE);
    // `retry_delay` checks that the details carry the same message.
    assert_eq!(retry_delay(&status), Duration::from_secs(1));
    // The layer still adds `Retry-After` to the builder's response.
    assert_eq!(metadata(&status, "retry-after"), Some("1"));
}

/// A server-streaming RPC (`watch`) that is refused: the client's call
/// fails at once with the refusal, before any message.
#[tokio::test]
async fn a_refused_server_streaming_rpc_fails_with_its_status() {
    let layer = SlidingWindowLayer::qps(1)
        .clock(ManualClock::new(1_000_000))
        .grpc();
    let server = serve!(layer);
    let mut client = server.client().await;

    let mut stream = client
        .watch(check(""))
        .await
        .expect("the first passes")
        .into_inner();
    let first = stream
        .message()
        .await
        .expect("a status")
        .expect("a message");
    assert_eq!(first.status, ServingStatus::Serving as i32);

    let status = client.watch(check("")).await.expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(retry_delay(&status), Duration::from_secs(1));
}

/// A client-streaming call whose request stream never ends: the layer
/// answers without reading it, and the client reads the refusal while it is
/// still streaming (the test bounds the wait; the call must not hang until
/// the stream ends).
#[tokio::test]
async fn a_request_refused_while_the_client_is_still_streaming() {
    let layer = SlidingWindowLayer::qps(0)
        .clock(ManualClock::new(1_000_000))
        .grpc();
    let stats = layer.handle();
    let server = serve!(layer);
    let mut grpc = tonic::client::Grpc::new(server.channel().await);
    grpc.ready().await.expect("the channel is ready");

    let endless = tokio_stream::once(check("")).chain(tokio_stream::pending());
    let call = grpc.client_streaming(
        tonic::Request::new(endless),
        http::uri::PathAndQuery::from_static("/grpc.health.v1.Health/Check"),
        tonic_prost::ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default(),
    );
    let status = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the refusal arrives while the request still streams")
        .expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.get_details_retry_info().is_some());
    assert_eq!(stats.total().block, 1);
}
