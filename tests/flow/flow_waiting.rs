//! The behaviours that make a request wait before it reaches the inner
//! service (`throttle`, `prioritized`) and `warm_up`, through axum's `Router`
//! and on real threads. Waits run on tokio's paused clock, decisions on a
//! `ManualClock`, so nothing here depends on how fast the machine is.

use crate::support;

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tokio::sync::Semaphore;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::response::Rejection;
use tower_sliding_window::{HeaderKey, SlidingWindowLayer};

use support::{clock, ms, req, req_with, send};

fn app(layer: SlidingWindowLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "hi" }))
        .layer(layer)
}

/// Sends `n` requests at once and counts the statuses.
async fn burst(app: &Router, n: usize) -> (usize, usize) {
    let tasks: Vec<_> = (0..n)
        .map(|_| tokio::spawn(app.clone().oneshot(req("/"))))
        .collect();
    let (mut ok, mut refused) = (0, 0);
    for task in tasks {
        match task.await.unwrap().unwrap().status() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("unexpected {other}"),
        }
    }
    (ok, refused)
}

/// Lets spawned requests run up to their waits.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

// ---------------------------------------------------------------- throttle

#[tokio::test(start_paused = true)]
async fn throttle_lets_through_the_turns_within_max_wait_and_refuses_the_rest() {
    // 10 per second: turns at +0, +100, +200 ms fit a 250 ms wait (turns
    // are taken up to 1 ms inside it, the timer's resolution).
    let layer = SlidingWindowLayer::qps(10).throttle(ms(250)).clock(clock());
    let stats = layer.handle();
    let app = app(layer);
    assert_eq!(burst(&app, 10).await, (3, 7));
    let snapshot = stats.snapshot(&()).unwrap();
    assert_eq!((snapshot.pass, snapshot.block), (3, 7));
    assert_eq!(snapshot.waiting, 0);
    assert_eq!(snapshot.concurrency, 0);
}

#[tokio::test(start_paused = true)]
async fn throttle_waits_are_spaced_by_interval_over_limit() {
    // A manual clock decides the turns and tokio's paused clock the waits:
    // on the system clock, the real time between two requests' calls (a
    // stall of the machine) shortened the later one's wait by as much.
    let layer = SlidingWindowLayer::qps(10)
        .throttle(ms(1_000))
        .clock(clock());
    let app = app(layer);
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let response = app.oneshot(req("/")).await.unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                tokio::time::Instant::now() - start
            })
        })
        .collect();
    let mut done = Vec::new();
    for task in tasks {
        done.push(task.await.unwrap());
    }
    done.sort();
    // Each wait is within the timer's millisecond of its 100 ms step.
    for (i, at) in done.iter().enumerate() {
        let want = ms(100 * i as u64);
        let off = at.abs_diff(want);
        assert!(off <= ms(2), "turn {i} came at {at:?}, want {want:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn throttle_spacing_below_a_millisecond_is_kept_in_nanoseconds() {
    // 3 000 per second: 333 334 ns apart; within 1 ms (a 2 ms wait less the
    // timer's 1 ms), turns at 0, 333 334 and 666 668 ns fit, 1 000 002 ns
    // does not (alibaba/Sentinel#1615).
    let layer = SlidingWindowLayer::qps(3_000)
        .throttle(ms(2))
        .clock(clock());
    let app = app(layer);
    assert_eq!(burst(&app, 10).await, (3, 7));
}

#[tokio::test(start_paused = true)]
async fn throttle_answers_a_refusal_with_the_time_until_a_turn_fits() {
    let layer = SlidingWindowLayer::qps(1).throttle(ms(300)).clock(clock());
    let app = app(layer);
    assert_eq!(send(&app, req("/")).await.status, StatusCode::OK);
    // Next turn in 1 s; within 300 ms of it in 700 ms: Retry-After 1 s.
    let refused = send(&app, req("/")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.retry_after(), 1);
}

#[tokio::test(start_paused = true)]
async fn reject_with_sees_a_throttle_refusal_with_its_reason() {
    let layer = SlidingWindowLayer::qps(1)
        .throttle(ms(300))
        .clock(clock())
        .reject_with(|rejection: &Rejection| {
            let body = format!(
                "{:?} {}",
                rejection.reason(),
                rejection.retry_after.as_millis()
            );
            let mut response = Response::new(Bytes::from(body));
            *response.status_mut() = rejection.status;
            response
        });
    let app = app(layer);
    assert_eq!(send(&app, req("/")).await.status, StatusCode::OK);
    let refused = send(&app, req("/")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    // The next turn is 1 000 ms away, 701 ms past the longest wait (300 ms
    // less the timer's 1 ms tick).
    assert_eq!(refused.body, "Throttle 701");
}

#[tokio::test(start_paused = true)]
async fn throttle_with_a_zero_limit_refuses_everything() {
    let layer = SlidingWindowLayer::qps(0).throttle(ms(500)).clock(clock());
    let app = app(layer);
    let refused = send(&app, req("/")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.retry_after(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_gives_its_turn_back() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .throttle(ms(150))
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);
    // Turn now (passes), turn +100 ms (waits).
    assert_eq!(send(&app, req("/")).await.status, StatusCode::OK);
    let waiter = tokio::spawn(app.clone().oneshot(req("/")));
    settle().await;
    assert_eq!(stats.snapshot(&()).unwrap().waiting, 1);
    // A third would need +200 ms: refused.
    assert_eq!(
        send(&app, req("/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The client of the waiting request goes away.
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    assert_eq!(stats.snapshot(&()).unwrap().waiting, 0);
    // Its turn (+100 ms) is free again: the next request gets it and
    // passes after its wait.
    assert_eq!(send(&app, req("/")).await.status, StatusCode::OK);
    let snapshot = stats.snapshot(&()).unwrap();
    assert_eq!((snapshot.pass, snapshot.block, snapshot.waiting), (2, 1, 0));
}

#[tokio::test(start_paused = true)]
async fn throttle_follows_per_key_rules_and_set_limit() {
    let name = http::HeaderName::from_static("x-tenant");
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .key(HeaderKey::new(name))
        .rule("big", 20)
        .throttle(ms(250))
        .clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route("/", get(|| async { "hi" }))
        .layer(layer);
    let tenant = |t: &'static str| {
        let app = app.clone();
        async move {
            let tasks: Vec<_> = (0..10)
                .map(|_| tokio::spawn(app.clone().oneshot(req_with("/", "x-tenant", t))))
                .collect();
            let mut ok = 0;
            for task in tasks {
                ok += usize::from(task.await.unwrap().unwrap().status() == StatusCode::OK);
            }
            ok
        }
    };
    // Turns up to 249 ms away: 10/s: 0, 100, 200 ms; 20/s: 0, 50, ..., 200.
    assert_eq!(tenant("small").await, 3);
    assert_eq!(tenant("big").await, 5);
    stats.set_limit("small", 40);
    // A second later, 25 ms apart: 0, 25, ..., 225 ms fit, 250 does not.
    clock.advance(ms(1_000));
    assert_eq!(tenant("small").await, 10);
    assert_eq!(tenant("small").await, 0);
}

#[tokio::test(start_paused = true)]
async fn max_concurrency_holds_its_place_through_the_wait() {
    let gate = Arc::new(Semaphore::new(0));
    let handler = {
        let gate = Arc::clone(&gate);
        move || async move {
            gate.acquire().await.unwrap().forget();
            "done"
        }
    };
    let layer = SlidingWindowLayer::qps(10)
        .throttle(ms(500))
        .max_concurrency(2)
        .clock(clock());
    let stats = layer.handle();
    let app = Router::new().route("/", get(handler)).layer(layer);
    let first = tokio::spawn(app.clone().oneshot(req("/")));
    let second = tokio::spawn(app.clone().oneshot(req("/")));
    settle().await;
    // One in the handler, one waiting for its turn: both hold a place.
    let snapshot = stats.snapshot(&()).unwrap();
    assert_eq!(snapshot.concurrency, 2);
    assert_eq!(
        send(&app, req("/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    gate.add_permits(2);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(second.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(stats.snapshot(&()).unwrap().concurrency, 0);
}

#[tokio::test(start_paused = true)]
async fn a_handler_that_panics_after_a_wait_is_recorded_as_a_failure() {
    let svc = service_fn(|_req: Request<Body>| async move {
        if true {
            panic!("handler bug");
        }
        Ok::<_, Infallible>(Response::new(Body::empty()))
    });
    let layer = SlidingWindowLayer::qps(10).throttle(ms(500)).clock(clock());
    let stats = layer.handle();
    let svc = layer.layer(svc);
    // The first turn is now, the second 100 ms away: both handlers panic.
    let at_once = tokio::spawn(svc.clone().oneshot(req("/")));
    let waited = tokio::spawn(svc.clone().oneshot(req("/")));
    assert!(at_once.await.unwrap_err().is_panic());
    assert!(waited.await.unwrap_err().is_panic());
    let snapshot = stats.snapshot(&()).unwrap();
    assert_eq!(snapshot.exception, 2);
    assert_eq!((snapshot.concurrency, snapshot.waiting), (0, 0));
}

#[test]
fn throttle_on_real_threads_never_shares_or_skips_a_turn() {
    // A frozen manual clock: exactly the turns within `max_wait` are handed
    // out, however many threads race for them (10 per second, 1 s of wait
    // less the timer's 1 ms: turns 0, 100, ..., 900 ms).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .start_paused(false)
        .build()
        .unwrap();
    runtime.block_on(async {
        let layer = SlidingWindowLayer::qps(10)
            .throttle(Duration::from_secs(1))
            .clock(ManualClock::new(5_000));
        let stats = layer.handle();
        let app = app(layer);
        let (ok, refused) = burst(&app, 200).await;
        assert_eq!((ok, refused), (10, 190));
        assert_eq!(stats.snapshot(&()).unwrap().pass, 10);
    });
}

/// A minimal executor with no tokio runtime around it.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

#[test]
fn outside_a_tokio_runtime_nothing_waits_and_nothing_panics() {
    let svc = service_fn(|_req: Request<Body>| async move {
        Ok::<_, Infallible>(Response::new(Body::from("hi")))
    });
    let layer = SlidingWindowLayer::qps(10)
        .throttle(ms(500))
        .prioritized(|_: &http::request::Parts| true)
        .clock(clock());
    let stats = layer.handle();
    let mut svc = layer.layer(svc);
    let statuses: Vec<_> = (0..3)
        .map(|_| {
            block_on(async {
                let ready = svc.ready().await.unwrap();
                ready.call(req("/")).await.unwrap().status()
            })
        })
        .collect();
    // The turn due now passes; the ones that would wait are refused.
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(stats.snapshot(&()).unwrap().waiting, 0);
}

// ------------------------------------------------------------- prioritized

fn priority_app(
    limit: u64,
    clock: &ManualClock,
) -> (Router, tower_sliding_window::StatsHandle<()>) {
    let layer = SlidingWindowLayer::qps(limit)
        .prioritized(|parts: &http::request::Parts| parts.headers.contains_key("x-priority"))
        .clock(clock.clone());
    let stats = layer.handle();
    (app(layer), stats)
}

#[tokio::test(start_paused = true)]
async fn a_prioritized_request_over_the_limit_waits_for_a_borrowed_pass() {
    let clock = clock();
    let (app, stats) = priority_app(2, &clock);
    assert_eq!(send(&app, req("/")).await.status, StatusCode::OK);
    assert_eq!(send(&app, req("/")).await.status, StatusCode::OK);
    // At 10 600 ms the two passes leave the window in 400 ms, within the
    // occupy timeout.
    clock.set(10_600);
    assert_eq!(
        send(&app, req("/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let waiting = tokio::spawn(app.clone().oneshot(req_with("/", "x-priority", "1")));
    settle().await;
    assert_eq!(stats.snapshot(&()).unwrap().waiting, 1);
    // The borrowed pass is in the bucket where the first two leave the
    // window (11 000 ms): at most the occupy timeout away.
    tokio::time::advance(ms(500)).await;
    assert_eq!(waiting.await.unwrap().unwrap().status(), StatusCode::OK);
    let snapshot = stats.snapshot(&()).unwrap();
    assert_eq!((snapshot.block, snapshot.waiting), (1, 0));
    // When that bucket opens, the borrowed pass counts there: one more
    // ordinary request fits, not two.
    clock.set(11_000);
    assert_eq!(send(&app, req("/")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, req("/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(stats.snapshot(&()).unwrap().pass, 2);
}

#[tokio::test(start_paused = true)]
async fn a_prioritized_request_is_refused_when_nothing_can_be_borrowed_in_time() {
    let clock = clock();
    let (app, stats) = priority_app(2, &clock);
    // Passes at 10 050 and 10 650 ms: at 10 700, the earliest frees at
    // 11 000 (300 ms), the next at 11 600 (900 ms, past the timeout).
    assert_eq!(send(&app, req("/")).await.status, StatusCode::OK);
    clock.set(10_650);
    assert_eq!(send(&app, req("/")).await.status, StatusCode::OK);
    clock.set(10_700);
    let first = tokio::spawn(app.clone().oneshot(req_with("/", "x-priority", "1")));
    settle().await;
    let second = send(&app, req_with("/", "x-priority", "1")).await;
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
    tokio::time::advance(ms(500)).await;
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(stats.snapshot(&()).unwrap().waiting, 0);
}

#[tokio::test(start_paused = true)]
async fn prioritized_flood_borrows_at_most_the_next_window() {
    let clock = clock();
    let (app, stats) = priority_app(5, &clock);
    let tasks: Vec<_> = (0..50)
        .map(|_| tokio::spawn(app.clone().oneshot(req_with("/", "x-priority", "1"))))
        .collect();
    let mut ok = 0;
    for task in tasks {
        ok += usize::from(task.await.unwrap().unwrap().status() == StatusCode::OK);
    }
    // Five pass now; a frozen clock can lend one window's worth more.
    assert!((5..=10).contains(&ok), "{ok}");
    assert_eq!(stats.snapshot(&()).unwrap().waiting, 0);
}

// ----------------------------------------------------------------- warm-up

#[tokio::test]
async fn warm_up_starts_at_a_third_and_reaches_the_limit_then_cools_down() {
    // Sentinel's example: count 10, period 10 s, cold factor 3.
    let clock = ManualClock::new(100_000);
    let layer = SlidingWindowLayer::qps(10)
        .warm_up(Duration::from_secs(10))
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);
    let mut per_second = Vec::new();
    for _ in 0..40 {
        let (ok, _) = burst(&app, 30).await;
        per_second.push(ok);
        clock.advance(Duration::from_secs(1));
    }
    // Cold: 1 / (50 * 0.004 + 0.1) = 3.33 per second.
    assert_eq!(per_second[0], 3);
    assert_eq!(*per_second.last().unwrap(), 10);
    assert!(
        per_second.windows(2).all(|w| w[0] <= w[1]),
        "{per_second:?}"
    );
    assert!(stats.snapshot(&()).unwrap().pass <= 10);
    // Idle for the warm-up period: cold again.
    clock.advance(Duration::from_secs(10));
    assert_eq!(burst(&app, 30).await.0, 3);
}

#[tokio::test(start_paused = true)]
async fn warm_up_with_throttle_paces_at_the_warming_rate() {
    let clock = ManualClock::new(100_000);
    let layer = SlidingWindowLayer::qps(30)
        .warm_up(Duration::from_secs(10))
        .throttle(ms(1_000))
        .clock(clock.clone());
    let app = app(layer);
    // Cold: 10 per second, so turns 100 ms apart: 10 fit in a 1 s wait
    // (0 to 900 ms; 1 000 ms is not within 999).
    assert_eq!(burst(&app, 40).await.0, 10);
}

#[test]
#[should_panic(expected = "SlidingWindowLayer::warm_up: invalid `period`")]
fn a_zero_warm_up_period_is_rejected() {
    let _ = SlidingWindowLayer::qps(1).warm_up(Duration::ZERO);
}

#[tokio::test]
async fn counters_stay_consistent_under_a_flood_of_waiting_and_refused_requests() {
    let counted = Arc::new(AtomicU64::new(0));
    let svc = {
        let counted = Arc::clone(&counted);
        service_fn(move |_req: Request<Body>| {
            let counted = Arc::clone(&counted);
            async move {
                counted.fetch_add(1, Ordering::Relaxed);
                Ok::<_, Infallible>(Response::new(Body::empty()))
            }
        })
    };
    let layer = SlidingWindowLayer::qps(1_000).throttle(ms(20));
    let stats = layer.handle();
    let svc = layer.layer(svc);
    let tasks: Vec<_> = (0..500)
        .map(|_| tokio::spawn(svc.clone().oneshot(req("/"))))
        .collect();
    let mut ok = 0u64;
    for task in tasks {
        ok += u64::from(task.await.unwrap().unwrap().status() == StatusCode::OK);
    }
    let snapshot = stats.total();
    // Every request that passed reached the handler once, and the window
    // counted each request once, as a pass or a block.
    assert_eq!(counted.load(Ordering::Relaxed), ok);
    assert_eq!(snapshot.pass + snapshot.block, 500);
    assert_eq!((snapshot.waiting, snapshot.concurrency), (0, 0));
}

#[test]
fn a_runtime_without_timers_refuses_instead_of_panicking() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let layer = SlidingWindowLayer::qps(10).throttle(ms(500)).clock(clock());
        let stats = layer.handle();
        let app = app(layer);
        let mut statuses = Vec::new();
        for _ in 0..3 {
            statuses.push(app.clone().oneshot(req("/")).await.unwrap().status());
        }
        assert_eq!(
            statuses,
            [
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::TOO_MANY_REQUESTS
            ]
        );
        let snapshot = stats.snapshot(&()).unwrap();
        assert_eq!((snapshot.pass, snapshot.block, snapshot.waiting), (1, 2, 0));
    });
}

/// Queues `n` requests on `qps(1000).throttle(10 s)`, cancels every one of
/// them (`newest_first` or oldest first), then times the next request.
async fn wait_after_abandoned_queue(n: usize, newest_first: bool) -> Duration {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1_000)
        .throttle(Duration::from_secs(10))
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);
    let mut waiters: Vec<_> = (0..n)
        .map(|_| tokio::spawn(app.clone().oneshot(req("/"))))
        .collect();
    // The first passes at once; the rest wait for turns 1 ms apart.
    let queued = n as u64 - 1;
    for _ in 0..1_000 {
        if stats.snapshot(&()).map_or(0, |s| s.waiting) == queued {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(stats.snapshot(&()).unwrap().waiting, queued);
    if newest_first {
        waiters.reverse();
    }
    for waiter in waiters {
        waiter.abort();
        // The one that passed at once has finished already.
        let _ = waiter.await;
    }
    let snapshot = stats.snapshot(&()).unwrap();
    assert_eq!((snapshot.waiting, snapshot.pass), (0, 1));
    let start = tokio::time::Instant::now();
    assert_eq!(send(&app, req("/")).await.status, StatusCode::OK);
    start.elapsed()
}

#[tokio::test(start_paused = true)]
async fn a_queue_abandoned_newest_first_leaves_no_wait_behind() {
    let waited = wait_after_abandoned_queue(10_000, true).await;
    assert!(waited < ms(50), "waited {waited:?}");
}

#[tokio::test(start_paused = true)]
async fn a_queue_abandoned_oldest_first_leaves_no_wait_behind() {
    let waited = wait_after_abandoned_queue(10_000, false).await;
    assert!(waited < ms(50), "waited {waited:?}");
}
