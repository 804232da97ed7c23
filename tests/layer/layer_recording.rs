//! What a passed request records when it completes, fails, is cancelled or
//! panics: success, exception, response time and the concurrency gauge.
//!
//! Sentinel's meaning is kept: a success is a completed request (with a
//! response or an inner `Err`), an exception is a completed request
//! classified as a failure, counted on top of its success.

use crate::support;

use std::future::Future;
use std::io;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_http::classify::{SharedClassifier, StatusInRangeAsFailures};
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::{PathKey, SlidingWindowLayer, Snapshot, StatsHandle};

use support::{at, clock, ms, req, send};

fn snap<K: Clone + Eq + std::hash::Hash + Send + Sync + 'static>(
    stats: &StatsHandle<K>,
    key: &K,
) -> Snapshot {
    stats.snapshot(key).expect("the key has an entry")
}

/// Routes whose handlers advance the manual clock by a set time, so
/// response times are exact.
fn timed_routes(clock: &ManualClock) -> Router {
    let route = |status: StatusCode, took: Duration| {
        let clock = clock.clone();
        get(move || {
            let clock = clock.clone();
            async move {
                clock.advance(took);
                (status, "done")
            }
        })
    };
    Router::new()
        .route("/ok", route(StatusCode::OK, Duration::from_micros(7_250)))
        .route("/ok2", route(StatusCode::OK, ms(2)))
        .route("/ok8", route(StatusCode::OK, ms(8)))
        .route("/created", route(StatusCode::CREATED, ms(1)))
        .route("/missing", route(StatusCode::NOT_FOUND, ms(1)))
        .route("/teapot", route(StatusCode::IM_A_TEAPOT, ms(1)))
        .route("/fail", route(StatusCode::INTERNAL_SERVER_ERROR, ms(3)))
        .route(
            "/unavailable",
            route(StatusCode::SERVICE_UNAVAILABLE, ms(1)),
        )
}

#[tokio::test]
async fn response_time_is_measured_in_microseconds_from_admission() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(100)
        .key(PathKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = timed_routes(&clock).layer(layer);

    assert_eq!(send(&app, req("/ok")).await.status, StatusCode::OK);
    let s = snap(&stats, &"/ok".to_owned());
    assert_eq!(
        (s.pass, s.success, s.exception),
        (1, 1, 0),
        "{}",
        at(&clock)
    );
    assert_eq!(
        s.avg_rt,
        Some(Duration::from_micros(7_250)),
        "{}",
        at(&clock)
    );
    assert_eq!(
        s.min_rt,
        Some(Duration::from_micros(7_250)),
        "{}",
        at(&clock)
    );
    assert_eq!(s.concurrency, 0);
}

#[tokio::test]
async fn server_errors_are_exceptions_on_top_of_successes() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(100)
        .key(PathKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = timed_routes(&clock).layer(layer);

    for path in [
        "/fail",
        "/fail",
        "/unavailable",
        "/missing",
        "/teapot",
        "/created",
    ] {
        send(&app, req(path)).await;
    }
    let fail = snap(&stats, &"/fail".to_owned());
    assert_eq!(
        (fail.pass, fail.success, fail.exception),
        (2, 2, 2),
        "{}",
        at(&clock)
    );
    assert_eq!(fail.avg_rt, Some(ms(3)), "failures record their RT too");
    let unavailable = snap(&stats, &"/unavailable".to_owned());
    assert_eq!((unavailable.success, unavailable.exception), (1, 1));
    // 4xx and 2xx are not failures by default.
    for path in ["/missing", "/teapot", "/created"] {
        let s = snap(&stats, &path.to_owned());
        assert_eq!((s.success, s.exception), (1, 0), "{path} {}", at(&clock));
    }
    let total = stats.total();
    assert_eq!((total.pass, total.success, total.exception), (6, 6, 3));
}

#[tokio::test]
async fn a_custom_classifier_decides_what_fails() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(100)
        .key(PathKey)
        .clock(clock.clone())
        .classify(SharedClassifier::new(StatusInRangeAsFailures::new(
            400..=499,
        )));
    let stats = layer.handle();
    let app = timed_routes(&clock).layer(layer);

    for path in ["/missing", "/teapot", "/fail", "/ok"] {
        send(&app, req(path)).await;
    }
    let exceptions = |path: &str| snap(&stats, &path.to_owned()).exception;
    assert_eq!(exceptions("/missing"), 1, "{}", at(&clock));
    assert_eq!(exceptions("/teapot"), 1, "{}", at(&clock));
    assert_eq!(exceptions("/fail"), 0, "5xx is outside 400..=499");
    assert_eq!(exceptions("/ok"), 0);
    assert_eq!(stats.total().success, 4);
}

#[tokio::test]
async fn an_inner_error_is_a_success_and_an_exception() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let inner_clock = clock.clone();
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service_fn(move |request: Request<Full<Bytes>>| {
                let clock = inner_clock.clone();
                async move {
                    clock.advance(ms(4));
                    if request.uri().path() == "/err" {
                        Err(io::Error::new(io::ErrorKind::BrokenPipe, "backend gone"))
                    } else {
                        Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
                    }
                }
            });
    let call = |path: &str| {
        let request = Request::get(path).body(Full::default()).expect("request");
        svc.clone().oneshot(request)
    };

    let error = call("/err")
        .await
        .expect_err("the inner error is passed on");
    assert_eq!(error.kind(), io::ErrorKind::BrokenPipe);
    assert_eq!(error.to_string(), "backend gone");
    call("/ok").await.expect("ok");

    let err = snap(&stats, &"/err".to_owned());
    assert_eq!(
        (err.pass, err.success, err.exception, err.concurrency),
        (1, 1, 1, 0),
        "{}",
        at(&clock)
    );
    assert_eq!(err.avg_rt, Some(ms(4)), "{}", at(&clock));
    let ok = snap(&stats, &"/ok".to_owned());
    assert_eq!((ok.success, ok.exception), (1, 0));
}

#[tokio::test]
async fn response_time_is_recorded_with_the_system_clock() {
    const SLEEP: Duration = Duration::from_millis(50);
    let layer = SlidingWindowLayer::qps(100);
    let stats = layer.handle();
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                tokio::time::sleep(SLEEP).await;
                "slept"
            }),
        )
        .layer(layer);

    let (a, b) = tokio::join!(send(&app, req("/")), send(&app, req("/")));
    assert_eq!((a.status, b.status), (StatusCode::OK, StatusCode::OK));
    let s = snap(&stats, &());
    assert_eq!(s.success, 2);
    let avg = s.avg_rt.expect("an average RT");
    let min = s.min_rt.expect("a minimum RT");
    // Only lower bounds: a loaded machine may take any time longer.
    assert!(
        min >= SLEEP,
        "min RT {min:?} shorter than the {SLEEP:?} sleep"
    );
    assert!(avg >= min, "avg {avg:?} below min {min:?}");
}

#[tokio::test]
async fn the_handle_sums_keys() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(5)
        .key(PathKey)
        .rule("/ok8", 3)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = timed_routes(&clock).layer(layer);

    send(&app, req("/ok2")).await;
    for _ in 0..4 {
        send(&app, req("/ok8")).await;
    }
    let total = stats.total();
    assert_eq!(
        (total.pass, total.block, total.success),
        (4, 1, 4),
        "{}",
        at(&clock)
    );
    assert_eq!(total.limit, 5 + 3, "limits add up");
    assert_eq!(total.min_rt, Some(ms(2)));
    // (2 + 3 × 8) / 4 ms, weighted by successes.
    assert_eq!(total.avg_rt, Some(Duration::from_micros(6_500)));

    let mut all = stats.snapshots();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let summary: Vec<_> = all
        .iter()
        .map(|(k, s)| (k.as_str(), s.pass, s.limit))
        .collect();
    assert_eq!(summary, [("/ok2", 1, 5), ("/ok8", 3, 3)]);
    assert_eq!(stats.len(), 2);
    assert!(!stats.is_empty());
}

/// A router whose `/hang` handler never finishes (it marks that it started)
/// and whose `/panic` handler panics; `/ok` answers at once.
fn hanging_app(started: Arc<AtomicBool>, layer: SlidingWindowLayer) -> Router {
    Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route(
            "/hang",
            get(move || {
                let started = Arc::clone(&started);
                async move {
                    started.store(true, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                    "never"
                }
            }),
        )
        .route(
            "/panic",
            get(|| async {
                if true {
                    panic!("handler panicked on purpose");
                }
                "never"
            }),
        )
        .layer(layer)
}

/// Polls `future` once.
async fn poll_once<F: Future>(future: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    let mut future = Some(future);
    std::future::poll_fn(move |cx| {
        let f = future.take().expect("polled once");
        Poll::Ready(f.poll(cx))
    })
    .await
}

#[tokio::test]
async fn a_cancelled_request_releases_its_place_and_keeps_only_its_pass() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10).clock(clock.clone());
    let stats = layer.handle();
    let started = Arc::new(AtomicBool::new(false));
    let app = hanging_app(Arc::clone(&started), layer);

    {
        let mut future = pin!(app.clone().oneshot(req("/hang")));
        assert!(poll_once(future.as_mut()).await.is_pending());
        assert!(started.load(Ordering::SeqCst), "the handler runs");
        clock.advance(ms(30));
        let s = snap(&stats, &());
        assert_eq!((s.pass, s.concurrency), (1, 1), "in flight {}", at(&clock));
        // The client goes away: the future is dropped mid-flight.
    }

    let s = snap(&stats, &());
    assert_eq!(s.concurrency, 0, "the gauge is released {}", at(&clock));
    assert_eq!(s.pass, 1, "the pass stays counted {}", at(&clock));
    assert_eq!(
        (s.success, s.exception, s.avg_rt, s.min_rt),
        (0, 0, None, None),
        "a cancelled request is neither a success nor an exception {}",
        at(&clock)
    );
}

#[tokio::test]
async fn a_future_dropped_before_its_first_poll_releases_its_place() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10).clock(clock.clone());
    let stats = layer.handle();
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .service_fn(|_: Request<Full<Bytes>>| async {
            Ok::<_, io::Error>(Response::new(Full::<Bytes>::default()))
        });

    let ready = svc.ready().await.expect("ready");
    let future = ready.call(Request::new(Full::default()));
    assert_eq!(snap(&stats, &()).concurrency, 1, "{}", at(&clock));
    drop(future);
    let s = snap(&stats, &());
    assert_eq!(
        (s.pass, s.success, s.exception, s.concurrency),
        (1, 0, 0, 0),
        "{}",
        at(&clock)
    );
}

#[tokio::test]
async fn a_panicking_handler_in_a_task_counts_one_exception() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10).clock(clock.clone());
    let stats = layer.handle();
    let app = hanging_app(Arc::default(), layer);

    let joined = tokio::spawn(app.clone().oneshot(req("/panic"))).await;
    let error = joined.expect_err("the task panicked");
    assert!(error.is_panic());

    let s = snap(&stats, &());
    assert_eq!(s.concurrency, 0, "the gauge is released {}", at(&clock));
    assert_eq!(
        (s.pass, s.success, s.exception),
        (1, 0, 1),
        "one exception, no success {}",
        at(&clock)
    );
    // The limiter keeps working.
    assert_eq!(send(&app, req("/ok")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_panicking_handler_caught_with_catch_unwind_counts_one_exception() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10).clock(clock.clone());
    let stats = layer.handle();
    let app = hanging_app(Arc::default(), layer);

    let mut future = Box::pin(app.clone().oneshot(req("/panic")));
    let caught = std::future::poll_fn(|cx| {
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(_)) => Poll::Ready(false),
            Err(_) => Poll::Ready(true),
        }
    })
    .await;
    assert!(caught, "the handler panicked");
    // Until the future is dropped, the request is still in flight.
    assert_eq!(snap(&stats, &()).concurrency, 1, "{}", at(&clock));
    drop(future);

    let s = snap(&stats, &());
    assert_eq!(
        (s.pass, s.success, s.exception, s.concurrency),
        (1, 0, 1, 0),
        "{}",
        at(&clock)
    );
}

/// An inner service whose `call` panics before it returns any future.
#[derive(Clone)]
struct PanicsInCall;

impl tower::Service<Request<axum::body::Body>> for PanicsInCall {
    type Response = http::Response<axum::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, std::convert::Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> Poll<Result<(), std::convert::Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<axum::body::Body>) -> Self::Future {
        panic!("call panicked on purpose");
    }
}

#[test]
fn a_panic_in_the_inner_call_counts_one_exception_and_releases_the_gauge() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10).clock(clock.clone());
    let stats = layer.handle();
    let mut service = tower::Layer::layer(&layer, PanicsInCall);

    let panicked = std::panic::catch_unwind(AssertUnwindSafe(|| {
        tower::Service::call(&mut service, req("/"))
    }))
    .is_err();
    assert!(panicked, "the inner call panicked");

    let s = snap(&stats, &());
    assert_eq!(
        (s.pass, s.success, s.exception, s.concurrency),
        (1, 0, 1, 0),
        "{}",
        at(&clock)
    );
}

/// `history` is the finished seconds of the last minute per key, oldest
/// first, empty seconds skipped, never the current second; a read that
/// returns the same seconds again; nothing for an unknown key.
#[tokio::test]
async fn history_is_the_finished_seconds_of_the_last_minute() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(2).key(PathKey).clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route("/a", get(|| async { "a" }))
        .layer(layer);

    // Second 10: 2 passes, 1 block. Second 11: nothing. Second 12: 1 pass.
    for _ in 0..3 {
        send(&app, req("/a")).await;
    }
    clock.advance(ms(2_000));
    send(&app, req("/a")).await;
    assert_eq!(
        stats.history("/a").len(),
        1,
        "the current second is not reported: {}",
        at(&clock)
    );
    clock.advance(ms(1_000));
    for _ in 0..2 {
        let history = stats.history("/a");
        let seconds: Vec<(u64, u64, u64)> = history
            .iter()
            .map(|n| (n.timestamp_ms, n.pass, n.block))
            .collect();
        assert_eq!(seconds, [(10_000, 2, 1), (12_000, 1, 0)], "{}", at(&clock));
        assert!(history.iter().all(|n| n.success == n.pass));
    }
    assert!(stats.history("/unknown").is_empty());

    // After a minute the seconds have left the minute window.
    clock.advance(ms(60_000));
    assert!(stats.history("/a").is_empty(), "{}", at(&clock));
}
