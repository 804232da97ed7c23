//! Over real sockets: `axum::serve` on 127.0.0.1:0 exactly as a user writes
//! it and a plain hyper 1 server through `hyper_util`'s tower adapter, with
//! hyper 1 clients on many connections at once. The limit holds across
//! connections, and the 429 with its header fields is what goes on the wire.

use crate::support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Barrier;
use tower::{Layer, ServiceBuilder};
use tower_sliding_window::{PeerIpKey, SlidingWindowLayer};

use support::{at, clock, connect, fetch, read, Answer};

/// Wraps a layer and counts the calls to `Layer::layer`.
#[derive(Clone)]
struct CountLayerCalls<L> {
    inner: L,
    calls: Arc<AtomicUsize>,
}

impl<S, L: Layer<S>> Layer<S> for CountLayerCalls<L> {
    type Service = L::Service;

    fn layer(&self, inner: S) -> Self::Service {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.layer(inner)
    }
}

async fn hello() -> &'static str {
    "hello"
}

/// Binds 127.0.0.1:0 and serves `app` with `axum::serve`, as in axum's docs.
async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("bound address");
    tokio::spawn(async move {
        axum::serve(listener, app).await.expect("server runs");
    });
    addr
}

/// Opens `connections` connections, waits until all are open, then sends
/// `per_connection` requests on each, connections in parallel.
async fn load(addr: SocketAddr, connections: usize, per_connection: usize) -> Vec<Answer> {
    let barrier = Arc::new(Barrier::new(connections));
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(addr).await;
            barrier.wait().await;
            let mut answers = Vec::new();
            for _ in 0..per_connection {
                answers.push(fetch(&mut sender, addr, "/").await);
            }
            answers
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("client task"));
    }
    all
}

fn assert_wire_429(answer: &Answer, limit: u64, clock: &tower_sliding_window::clock::ManualClock) {
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        at(clock)
    );
    assert_eq!(answer.retry_after(), 1, "{}", at(clock));
    assert_eq!(
        answer.header("ratelimit-policy"),
        format!(r#""default";q={limit};w=1"#)
    );
    assert_eq!(answer.header("ratelimit"), r#""default";r=0;t=1"#);
    assert!(answer.header("content-type").starts_with("text/plain"));
    assert_eq!(
        answer.header("content-length"),
        answer.body.len().to_string(),
        "the body's length is known"
    );
    assert!(
        answer.body.contains("Too Many Requests"),
        "{:?}",
        answer.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_limit_holds_across_connections_of_axum_serve() {
    const LIMIT: u64 = 30;
    const CONNECTIONS: usize = 50;
    const PER_CONNECTION: usize = 3;
    let clock = clock();
    let layer = SlidingWindowLayer::qps(LIMIT).clock(clock.clone());
    let stats = layer.handle();
    let calls = Arc::new(AtomicUsize::new(0));
    // Served without `.with_state(())`: axum then applies the layer to the
    // route once per connection. The state must not be per connection.
    let app = Router::new().route("/", get(hello)).layer(CountLayerCalls {
        inner: layer,
        calls: Arc::clone(&calls),
    });
    let addr = serve(app).await;

    let answers = load(addr, CONNECTIONS, PER_CONNECTION).await;
    assert!(
        calls.load(Ordering::SeqCst) >= CONNECTIONS,
        "the per-connection `Layer::layer` path was taken ({} calls)",
        calls.load(Ordering::SeqCst)
    );

    let ok = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .count();
    assert_eq!(ok as u64, LIMIT, "200s across connections {}", at(&clock));
    for answer in answers.iter().filter(|a| a.status != StatusCode::OK) {
        assert_wire_429(answer, LIMIT, &clock);
    }
    for answer in answers.iter().filter(|a| a.status == StatusCode::OK) {
        assert_eq!(answer.body, "hello");
    }
    let s = stats.snapshot(&()).expect("global key");
    assert_eq!(s.pass, LIMIT, "{}", at(&clock));
    assert_eq!(s.block as usize, CONNECTIONS * PER_CONNECTION - ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_limit_holds_with_a_finished_router_too() {
    const LIMIT: u64 = 10;
    let clock = clock();
    let layer = SlidingWindowLayer::qps(LIMIT).clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route("/", get(hello))
        .layer(layer)
        .with_state(());
    let addr = serve(app).await;

    let answers = load(addr, 20, 2).await;
    let ok = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .count();
    assert_eq!(ok as u64, LIMIT, "{}", at(&clock));
    for answer in answers.iter().filter(|a| a.status != StatusCode::OK) {
        assert_wire_429(answer, LIMIT, &clock);
    }
    assert_eq!(stats.snapshot(&()).map(|s| s.pass), Some(LIMIT));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pooling_client_sees_the_same_limit() {
    use hyper_util::client::legacy::Client;

    const LIMIT: u64 = 20;
    const REQUESTS: usize = 60;
    let clock = clock();
    let layer = SlidingWindowLayer::qps(LIMIT).clock(clock.clone());
    let stats = layer.handle();
    let addr = serve(Router::new().route("/", get(hello)).layer(layer)).await;

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut tasks = Vec::new();
    for _ in 0..REQUESTS {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let uri = format!("http://{addr}/").parse().expect("uri");
            read(client.get(uri).await.expect("response")).await
        }));
    }
    let mut ok = 0;
    for task in tasks {
        let answer = task.await.expect("client task");
        if answer.status == StatusCode::OK {
            ok += 1;
        } else {
            assert_wire_429(&answer, LIMIT, &clock);
        }
    }
    assert_eq!(ok, LIMIT, "{}", at(&clock));
    let s = stats.snapshot(&()).expect("global key");
    assert_eq!((s.pass, s.block), (LIMIT, REQUESTS as u64 - LIMIT));
}

/// With the crate's `axum` feature, `PeerIpKey` reads the `ConnectInfo` that
/// `into_make_service_with_connect_info` provides.
#[cfg(feature = "axum")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_ip_key_with_connect_info_over_a_socket() {
    const LIMIT: u64 = 4;
    let clock = clock();
    let layer = SlidingWindowLayer::qps(LIMIT)
        .key(PeerIpKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new().route("/", get(hello)).layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("bound address");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("server runs");
    });

    // Five connections, each from its own port: one IP, one limit.
    let answers = load(addr, 5, 2).await;
    let ok = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .count();
    assert_eq!(ok as u64, LIMIT, "{}", at(&clock));
    assert_eq!(stats.keys(), [Some(IpAddr::V4(Ipv4Addr::LOCALHOST))]);
}

/// A plain hyper 1 server: the accept loop puts the peer's `SocketAddr` in
/// the request extensions, which `PeerIpKey` reads; the tower stack runs
/// through `TowerToHyperService`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plain_hyper_server_through_the_tower_adapter() {
    const LIMIT: u64 = 12;
    let clock = clock();
    let layer = SlidingWindowLayer::qps(LIMIT)
        .key(PeerIpKey)
        .clock(clock.clone());
    let stats = layer.handle();

    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("bound address");
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.expect("accept");
            let service = ServiceBuilder::new()
                .map_request(move |mut request: Request<Incoming>| {
                    request.extensions_mut().insert(peer);
                    request
                })
                .layer(layer.clone())
                .service_fn(|_request: Request<Incoming>| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(
                        b"hello",
                    ))))
                });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                    .await;
            });
        }
    });

    let answers = load(addr, 16, 2).await;
    let ok = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .count();
    assert_eq!(ok as u64, LIMIT, "{}", at(&clock));
    for answer in answers.iter().filter(|a| a.status != StatusCode::OK) {
        assert_wire_429(answer, LIMIT, &clock);
    }
    for answer in answers.iter().filter(|a| a.status == StatusCode::OK) {
        assert_eq!(answer.body, "hello");
    }
    let localhost = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
    assert_eq!(stats.keys(), [localhost]);
    let s = stats.snapshot(&localhost).expect("the peer's key");
    assert_eq!((s.pass, s.block, s.concurrency), (LIMIT, 32 - LIMIT, 0));
}

/// Waits (up to a generous bound, polling) until `done` holds. A liveness
/// wait, not a timing assertion: it returns as soon as the condition holds.
async fn eventually(mut done: impl FnMut() -> bool) -> bool {
    for _ in 0..1_000 {
        if done() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    done()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_hangs_up_releases_the_concurrency_gauge() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10).clock(clock.clone());
    let stats = layer.handle();
    let started = Arc::new(tokio::sync::Notify::new());
    let notify = Arc::clone(&started);
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let notify = Arc::clone(&notify);
                async move {
                    notify.notify_one();
                    std::future::pending::<()>().await;
                    "never"
                }
            }),
        )
        .layer(layer);
    let addr = serve(app).await;

    let mut sender = connect(addr).await;
    let request = Request::get("/")
        .header(header::HOST, addr.to_string())
        .body(Empty::new())
        .expect("request");
    let pending = tokio::spawn(async move { sender.send_request(request).await });
    started.notified().await;
    assert_eq!(
        stats.snapshot(&()).map(|s| (s.pass, s.concurrency)),
        Some((1, 1)),
        "in flight {}",
        at(&clock)
    );

    // The client gives up: the request is dropped, so hyper's client closes
    // the connection, and the server drops the request's future.
    pending.abort();
    let released = eventually(|| stats.snapshot(&()).is_some_and(|s| s.concurrency == 0)).await;
    let s = stats.snapshot(&()).expect("global key");
    assert!(released, "gauge still {} {}", s.concurrency, at(&clock));
    assert_eq!(
        (s.pass, s.success, s.exception),
        (1, 0, 0),
        "{}",
        at(&clock)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_panic_under_axum_serve_counts_one_exception() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10).clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                if true {
                    panic!("handler panicked on purpose");
                }
                "never"
            }),
        )
        .route("/ok", get(hello))
        .layer(layer);
    let addr = serve(app).await;

    let mut sender = connect(addr).await;
    sender.ready().await.expect("ready");
    let request = Request::get("/")
        .header(header::HOST, addr.to_string())
        .body(Empty::new())
        .expect("request");
    assert!(
        sender.send_request(request).await.is_err(),
        "the connection closes without a response"
    );

    // The client may see the connection close before the server task has
    // finished unwinding: wait for the guard to be dropped.
    let released = eventually(|| stats.snapshot(&()).is_some_and(|s| s.concurrency == 0)).await;
    assert!(released, "gauge not released {}", at(&clock));
    let s = stats.snapshot(&()).expect("global key");
    assert_eq!(
        (s.pass, s.success, s.exception, s.concurrency),
        (1, 0, 1, 0),
        "{}",
        at(&clock)
    );
    // The server and the limiter keep working.
    let answer = fetch(&mut connect(addr).await, addr, "/ok").await;
    assert_eq!(answer.status, StatusCode::OK);
}
