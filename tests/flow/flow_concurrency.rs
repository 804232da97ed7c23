//! `.max_concurrency(n)`: an exact in-flight limit per key, through axum's
//! `Router` and on real threads.

use crate::support;

use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tokio::sync::Semaphore;
use tower::{service_fn, Layer, ServiceExt};
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::response::Rejection;
use tower_sliding_window::{PathKey, SlidingWindowLayer};

use support::{req, send};

/// A router whose `/slow` and `/other` handlers wait for a permit of `gate`.
fn gated(layer: SlidingWindowLayer<PathKey>, gate: &Arc<Semaphore>) -> Router {
    let handler = |gate: Arc<Semaphore>| {
        move || async move {
            gate.acquire().await.expect("open").forget();
            "done"
        }
    };
    Router::new()
        .route("/slow", get(handler(Arc::clone(gate))))
        .route("/other", get(handler(Arc::clone(gate))))
        .layer(layer)
}

/// Lets the spawned requests reach their handlers.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn reject_with_sees_a_concurrency_refusal_with_its_reason() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = SlidingWindowLayer::qps(100)
        .key(PathKey)
        .max_concurrency(1)
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .reject_with(|rejection: &Rejection| {
            let body = format!("{:?} {}", rejection.reason(), rejection.limit);
            let mut response = Response::new(Bytes::from(body));
            *response.status_mut() = rejection.status;
            response
        });
    let app = gated(layer, &gate);
    let held = tokio::spawn(app.clone().oneshot(req("/slow")));
    settle().await;

    let refused = send(&app, req("/slow")).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.body, "Concurrency 100");
    assert_eq!(refused.retry_after(), 1);
    assert_eq!(refused.header("ratelimit-policy"), r#""default";q=100;w=1"#);
    gate.add_permits(1);
    let done = held.await.expect("no panic").expect("infallible");
    assert_eq!(done.status(), StatusCode::OK);
}

#[tokio::test]
async fn the_request_over_the_limit_is_refused_at_once_with_retry_after_1() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = SlidingWindowLayer::qps(100).key(PathKey).max_concurrency(2);
    let stats = layer.handle();
    let app = gated(layer, &gate);
    let held: Vec<_> = (0..2)
        .map(|_| tokio::spawn(app.clone().oneshot(req("/slow"))))
        .collect();
    settle().await;
    assert_eq!(stats.snapshot("/slow").unwrap().concurrency, 2);

    let refused = send(&app, req("/slow")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.retry_after(), 1);
    let snapshot = stats.snapshot("/slow").unwrap();
    assert_eq!(
        (snapshot.pass, snapshot.block),
        (2, 1),
        "a refusal is a block, not a pass"
    );
    assert_eq!(snapshot.concurrency, 2);

    // Another key has its own places.
    let other = tokio::spawn(app.clone().oneshot(req("/other")));
    settle().await;
    assert_eq!(stats.snapshot("/other").unwrap().concurrency, 1);

    gate.add_permits(3);
    for request in held {
        assert_eq!(request.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    assert_eq!(other.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(stats.snapshot("/slow").unwrap().concurrency, 0);
    gate.add_permits(1);
    assert_eq!(send(&app, req("/slow")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_request_the_window_refuses_gives_its_place_back() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = SlidingWindowLayer::qps(1).key(PathKey).max_concurrency(3);
    let stats = layer.handle();
    let app = gated(layer, &gate);
    let held = tokio::spawn(app.clone().oneshot(req("/slow")));
    settle().await;
    for _ in 0..5 {
        let refused = send(&app, req("/slow")).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    }
    let snapshot = stats.snapshot("/slow").unwrap();
    assert_eq!(snapshot.concurrency, 1, "refused requests hold no place");
    assert_eq!((snapshot.pass, snapshot.block), (1, 5));
    gate.add_permits(1);
    held.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_cancelled_request_gives_its_place_back() {
    let gate = Arc::new(Semaphore::new(0));
    let layer = SlidingWindowLayer::qps(100).key(PathKey).max_concurrency(1);
    let stats = layer.handle();
    let app = gated(layer, &gate);
    let held = tokio::spawn(app.clone().oneshot(req("/slow")));
    settle().await;
    assert_eq!(
        send(&app, req("/slow")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    held.abort();
    let _ = held.await;
    assert_eq!(stats.snapshot("/slow").unwrap().concurrency, 0);
    gate.add_permits(1);
    assert_eq!(send(&app, req("/slow")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_panicking_handler_gives_its_place_back() {
    let layer = SlidingWindowLayer::qps(100).max_concurrency(1);
    let stats = layer.handle();
    let svc = layer.layer(service_fn(|request: Request<Body>| async move {
        if request.uri().path() == "/panic" {
            panic!("handler failed");
        }
        Ok::<_, Infallible>(Response::new(Body::empty()))
    }));
    let panicked = tokio::spawn(svc.clone().oneshot(req("/panic"))).await;
    assert!(panicked.is_err_and(|e| e.is_panic()));
    let total = stats.total();
    assert_eq!((total.concurrency, total.exception), (0, 1));
    let ok = svc.clone().oneshot(req("/")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    // A panic in the inner `call` itself (not its future) also unwinds
    // through the guard.
    let layer = SlidingWindowLayer::qps(100).max_concurrency(1);
    let stats = layer.handle();
    let mut svc = layer.layer(service_fn(
        |_: Request<Body>| -> std::future::Ready<Result<Response<Body>, Infallible>> {
            panic!("call failed")
        },
    ));
    let unwound = std::panic::catch_unwind(AssertUnwindSafe(|| {
        drop(tower::Service::call(&mut svc, req("/")));
    }));
    assert!(unwound.is_err());
    assert_eq!(stats.total().concurrency, 0);
}

#[test]
#[should_panic(expected = "SlidingWindowLayer::max_concurrency: invalid `max_concurrency`")]
fn zero_panics_at_construction() {
    let _ = SlidingWindowLayer::qps(10).max_concurrency(0);
}

#[tokio::test]
async fn set_limit_and_rules_still_apply_to_the_window() {
    let gate = Arc::new(Semaphore::new(100));
    let layer = SlidingWindowLayer::qps(100)
        .key(PathKey)
        .rule("/other", 2)
        .max_concurrency(10);
    let stats = layer.handle();
    let app = gated(layer, &gate);
    assert_eq!(send(&app, req("/other")).await.status, StatusCode::OK);
    assert_eq!(send(&app, req("/other")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, req("/other")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    stats.set_limit("/slow", 1);
    assert_eq!(send(&app, req("/slow")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, req("/slow")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// Real threads: 4 runtime workers, 64 tasks sending 40 requests each to a
/// handler that yields while it counts how many run at once. Never more
/// than `n`, and every place comes back.
#[test]
fn stress_never_more_than_n_in_flight() {
    const N: u64 = 3;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .expect("runtime");
    let running = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    // A frozen clock: the totals below are one window's.
    let layer = SlidingWindowLayer::qps(u64::MAX / 2)
        .max_concurrency(N)
        .clock(ManualClock::new(0));
    let stats = layer.handle();
    let svc = {
        let (running, most) = (Arc::clone(&running), Arc::clone(&most));
        layer.layer(service_fn(move |_: Request<Body>| {
            let (running, most) = (Arc::clone(&running), Arc::clone(&most));
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                running.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, Infallible>(Response::new(Body::empty()))
            }
        }))
    };
    let (passed, refused) = runtime.block_on(async {
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let svc = svc.clone();
                tokio::spawn(async move {
                    let (mut passed, mut refused) = (0u64, 0u64);
                    for _ in 0..40 {
                        let status = svc.clone().oneshot(req("/")).await.unwrap().status();
                        if status == StatusCode::OK {
                            passed += 1;
                        } else {
                            refused += 1;
                        }
                    }
                    (passed, refused)
                })
            })
            .collect();
        let mut sum = (0, 0);
        for task in tasks {
            let (p, r) = task.await.unwrap();
            sum = (sum.0 + p, sum.1 + r);
        }
        sum
    });
    let most = most.load(Ordering::SeqCst);
    println!("{passed} passed, {refused} refused, at most {most} in the handler at once");
    assert!(most <= N, "{most} in flight, limit {N}");
    assert_eq!(passed + refused, 64 * 40);
    assert!(passed >= N, "{passed} passed");
    let total = stats.total();
    assert_eq!(total.concurrency, 0);
    assert_eq!((total.pass, total.block), (passed, refused));
}
