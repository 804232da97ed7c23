//! Circuit breakers through the layer (an axum `Router` on a `ManualClock`):
//! every transition of the state machine, what a refused request looks
//! like, per-key state, the classifier deciding what a failure is, probes
//! that are refused or cancelled, and settings that panic.

use crate::support;

use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Response, StatusCode};
use tokio::sync::Semaphore;
use tower::ServiceExt;
use tower_sliding_window::breaker::{Breaker, BreakerState};
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::response::{Reason, Rejection};
use tower_sliding_window::{PathKey, SlidingWindowLayer, StatsHandle};

use support::{at, clock, ms, req, send, statuses};

/// A route whose status can be changed while it runs, and which counts how
/// often it was called.
#[derive(Clone)]
struct Flaky {
    status: Arc<AtomicU16>,
    calls: Arc<AtomicUsize>,
}

impl Flaky {
    fn new(status: StatusCode) -> Self {
        Flaky {
            status: Arc::new(AtomicU16::new(status.as_u16())),
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn set(&self, status: StatusCode) {
        self.status.store(status.as_u16(), Ordering::SeqCst);
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn router(&self, layer: SlidingWindowLayer<PathKey>) -> Router {
        let flaky = self.clone();
        let healthy = get(|| async { "fine" });
        Router::new()
            .route(
                "/flaky",
                get(move || {
                    let flaky = flaky.clone();
                    async move {
                        flaky.calls.fetch_add(1, Ordering::SeqCst);
                        StatusCode::from_u16(flaky.status.load(Ordering::SeqCst))
                            .expect("a valid status")
                    }
                }),
            )
            .route("/healthy", healthy)
            .layer(layer)
    }
}

fn layer(clock: &ManualClock, breaker: Breaker) -> SlidingWindowLayer<PathKey> {
    SlidingWindowLayer::qps(1_000)
        .key(PathKey)
        .clock(clock.clone())
        .breaker(breaker)
}

fn state(stats: &StatsHandle<String>, key: &str) -> BreakerState {
    match stats.breakers(key)[..] {
        [state] => state,
        ref other => panic!("expected one breaker for {key}, got {other:?}"),
    }
}

fn is_open(state: BreakerState) -> bool {
    matches!(state, BreakerState::Open { .. })
}

#[tokio::test]
async fn closed_opens_on_an_error_ratio_strictly_over_the_threshold() {
    let clock = clock();
    let flaky = Flaky::new(StatusCode::INTERNAL_SERVER_ERROR);
    let layer = layer(&clock, Breaker::error_ratio(0.5).min_requests(4));
    let stats = layer.handle();
    let app = flaky.router(layer);

    // Two failures, two successes: 50%, not over it.
    assert!(statuses(&app, "/flaky", 2)
        .await
        .iter()
        .all(|s| s.is_server_error()));
    flaky.set(StatusCode::OK);
    assert_eq!(statuses(&app, "/flaky", 2).await, [StatusCode::OK; 2]);
    assert_eq!(
        state(&stats, "/flaky"),
        BreakerState::Closed,
        "{}",
        at(&clock)
    );
    // One more failure: 3 of 5.
    flaky.set(StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(send(&app, req("/flaky")).await.status, 500);
    assert!(is_open(state(&stats, "/flaky")), "{}", at(&clock));
}

#[tokio::test]
async fn nothing_opens_below_min_requests() {
    let clock = clock();
    let flaky = Flaky::new(StatusCode::INTERNAL_SERVER_ERROR);
    let layer = layer(&clock, Breaker::error_ratio(0.1).min_requests(5));
    let stats = layer.handle();
    let app = flaky.router(layer);
    let got = statuses(&app, "/flaky", 4).await;
    assert!(got.iter().all(|s| *s == StatusCode::INTERNAL_SERVER_ERROR));
    assert_eq!(state(&stats, "/flaky"), BreakerState::Closed);
    // The stat interval ends: the four are forgotten, four more do not open.
    clock.advance(Duration::from_secs(1));
    let _ = statuses(&app, "/flaky", 4).await;
    assert_eq!(
        state(&stats, "/flaky"),
        BreakerState::Closed,
        "{}",
        at(&clock)
    );
    let _ = statuses(&app, "/flaky", 1).await;
    assert!(is_open(state(&stats, "/flaky")), "{}", at(&clock));
}

#[tokio::test]
async fn an_open_breaker_keeps_503_under_status_and_reject_with_sees_it() {
    let clock = clock();
    let flaky = Flaky::new(StatusCode::INTERNAL_SERVER_ERROR);
    let breaker = Breaker::error_count(2)
        .min_requests(1)
        .open_for(Duration::from_millis(2_500));
    // `status` sets the status of rate-limit refusals only.
    let app = flaky.router(layer(&clock, breaker).status(StatusCode::IM_A_TEAPOT));
    let _ = statuses(&app, "/flaky", 3).await;
    let refused = send(&app, req("/flaky")).await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        at(&clock)
    );
    assert_eq!(refused.body, "Service Unavailable: retry in 3 s\n");
    assert!(
        !refused.headers.contains_key("ratelimit"),
        "a breaker's refusal says nothing of the quota"
    );

    // A builder sees the breaker's refusal, its reason and its status, and
    // shapes it like any other.
    let clock = self::clock();
    let flaky = Flaky::new(StatusCode::INTERNAL_SERVER_ERROR);
    let layer = layer(&clock, breaker)
        .status(StatusCode::IM_A_TEAPOT)
        .reject_with(|rejection: &Rejection| {
            let body = format!(
                "{:?} {} {}",
                rejection.reason(),
                rejection.status.as_u16(),
                rejection.retry_after_secs()
            );
            let mut response = Response::new(Bytes::from(body));
            *response.status_mut() = match rejection.reason() {
                Reason::Breaker => StatusCode::BAD_GATEWAY,
                _ => rejection.status,
            };
            response
        });
    let stats = layer.handle();
    let app = flaky.router(layer);
    let _ = statuses(&app, "/flaky", 3).await;
    let before = stats.snapshot("/flaky").expect("seen").block;
    let refused = send(&app, req("/flaky")).await;
    assert_eq!(refused.status, StatusCode::BAD_GATEWAY, "{}", at(&clock));
    assert_eq!(refused.body, "Breaker 503 3");
    assert_eq!(refused.retry_after(), 3, "added to the builder's response");
    assert_eq!(flaky.calls(), 3, "the route is not called while open");
    assert_eq!(
        stats.snapshot("/flaky").expect("seen").block,
        before + 1,
        "recorded once"
    );
}

#[tokio::test]
async fn open_answers_503_with_retry_after_without_calling_the_route() {
    let clock = clock();
    let flaky = Flaky::new(StatusCode::INTERNAL_SERVER_ERROR);
    let breaker = Breaker::error_count(2)
        .min_requests(1)
        .open_for(Duration::from_millis(2_500));
    let layer = layer(&clock, breaker);
    let stats = layer.handle();
    let app = flaky.router(layer);

    let _ = statuses(&app, "/flaky", 3).await;
    assert_eq!(flaky.calls(), 3);
    let before = stats.snapshot("/flaky").expect("seen").block;
    let refused = send(&app, req("/flaky")).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.retry_after(), 3, "2.5 s rounded up, {}", at(&clock));
    assert_eq!(flaky.calls(), 3, "the route is not called while open");
    assert_eq!(stats.snapshot("/flaky").expect("seen").block, before + 1);

    clock.advance(ms(2_000));
    assert_eq!(
        send(&app, req("/flaky")).await.retry_after(),
        1,
        "{}",
        at(&clock)
    );
    assert_eq!(
        state(&stats, "/flaky"),
        BreakerState::Open {
            half_open_in: ms(500)
        }
    );
    // Other keys have their own breakers.
    assert_eq!(send(&app, req("/healthy")).await.status, StatusCode::OK);
    assert_eq!(state(&stats, "/healthy"), BreakerState::Closed);
}

#[tokio::test]
async fn half_open_lets_one_probe_through_and_a_success_closes_with_fresh_statistics() {
    let clock = clock();
    let flaky = Flaky::new(StatusCode::INTERNAL_SERVER_ERROR);
    let breaker = Breaker::error_count(1)
        .min_requests(1)
        .open_for(Duration::from_secs(5));
    let layer = layer(&clock, breaker);
    let stats = layer.handle();
    let app = flaky.router(layer);
    let _ = statuses(&app, "/flaky", 2).await;
    assert!(is_open(state(&stats, "/flaky")));

    clock.advance(Duration::from_secs(5));
    assert_eq!(
        state(&stats, "/flaky"),
        BreakerState::HalfOpen,
        "{}",
        at(&clock)
    );
    flaky.set(StatusCode::OK);
    assert_eq!(send(&app, req("/flaky")).await.status, StatusCode::OK);
    assert_eq!(state(&stats, "/flaky"), BreakerState::Closed);
    // Fresh statistics: the two failures before are gone, so one failure
    // (not more than 1) does not open it again.
    flaky.set(StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(send(&app, req("/flaky")).await.status, 500);
    assert_eq!(
        state(&stats, "/flaky"),
        BreakerState::Closed,
        "{}",
        at(&clock)
    );
}

#[tokio::test]
async fn a_failed_probe_opens_again_for_open_for() {
    let clock = clock();
    let flaky = Flaky::new(StatusCode::INTERNAL_SERVER_ERROR);
    let breaker = Breaker::error_ratio(0.0)
        .min_requests(1)
        .open_for(Duration::from_secs(3));
    let layer = layer(&clock, breaker);
    let app = flaky.router(layer);
    let _ = statuses(&app, "/flaky", 1).await;
    clock.advance(Duration::from_secs(3));
    assert_eq!(send(&app, req("/flaky")).await.status, 500, "the probe");
    let refused = send(&app, req("/flaky")).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.retry_after(), 3, "{}", at(&clock));
    assert_eq!(flaky.calls(), 2);
}

#[tokio::test]
async fn a_slow_probe_fails_a_slow_ratio_breaker_and_a_fast_one_closes_it() {
    let clock = clock();
    let delay = Arc::new(AtomicUsize::new(300));
    let handler = {
        let (clock, delay) = (clock.clone(), Arc::clone(&delay));
        move || {
            let (clock, delay) = (clock.clone(), Arc::clone(&delay));
            async move {
                clock.advance(ms(delay.load(Ordering::SeqCst) as u64));
                "done"
            }
        }
    };
    let breaker = Breaker::slow_ratio(ms(100), 0.5)
        .min_requests(2)
        .open_for(Duration::from_secs(1));
    let layer = layer(&clock, breaker);
    let stats = layer.handle();
    let app = Router::new().route("/slow", get(handler)).layer(layer);

    // A call of exactly max_rt is not slow; one over it is.
    delay.store(100, Ordering::SeqCst);
    assert_eq!(send(&app, req("/slow")).await.status, StatusCode::OK);
    delay.store(101, Ordering::SeqCst);
    assert_eq!(send(&app, req("/slow")).await.status, StatusCode::OK);
    assert_eq!(
        state(&stats, "/slow"),
        BreakerState::Closed,
        "1 of 2 is not over 50%"
    );
    assert_eq!(send(&app, req("/slow")).await.status, StatusCode::OK);
    assert!(is_open(state(&stats, "/slow")), "{}", at(&clock));

    clock.advance(Duration::from_secs(1));
    delay.store(300, Ordering::SeqCst);
    assert_eq!(send(&app, req("/slow")).await.status, StatusCode::OK);
    assert!(is_open(state(&stats, "/slow")), "a slow probe fails");
    clock.advance(Duration::from_secs(1));
    delay.store(10, Ordering::SeqCst);
    assert_eq!(send(&app, req("/slow")).await.status, StatusCode::OK);
    assert_eq!(
        state(&stats, "/slow"),
        BreakerState::Closed,
        "{}",
        at(&clock)
    );
}

#[tokio::test]
async fn a_4xx_storm_does_not_open_an_error_breaker_by_default() {
    let clock = clock();
    let flaky = Flaky::new(StatusCode::BAD_REQUEST);
    let layer = layer(&clock, Breaker::error_ratio(0.0).min_requests(1));
    let stats = layer.handle();
    let app = flaky.router(layer);
    let got = statuses(&app, "/flaky", 200).await;
    assert!(got.iter().all(|s| *s == StatusCode::BAD_REQUEST));
    assert_eq!(state(&stats, "/flaky"), BreakerState::Closed);
    flaky.set(StatusCode::SERVICE_UNAVAILABLE);
    let _ = statuses(&app, "/flaky", 1).await;
    assert!(is_open(state(&stats, "/flaky")), "one 5xx is over 0%");
}

#[tokio::test]
async fn a_probe_refused_by_the_window_frees_the_probe_slot() {
    let clock = ManualClock::new(0);
    let flaky = Flaky::new(StatusCode::INTERNAL_SERVER_ERROR);
    let layer = SlidingWindowLayer::qps(4)
        .key(PathKey)
        .clock(clock.clone())
        .breaker(Breaker::error_count(3).min_requests(1).open_for(ms(500)));
    let stats = layer.handle();
    let app = flaky.router(layer);
    let _ = statuses(&app, "/flaky", 4).await;
    assert!(is_open(state(&stats, "/flaky")));

    // Half-open at 600 ms, but the window still holds four passes: the
    // probe is refused with 429 and must not leave the breaker stuck.
    clock.set(600);
    flaky.set(StatusCode::OK);
    assert_eq!(
        send(&app, req("/flaky")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        state(&stats, "/flaky"),
        BreakerState::HalfOpen,
        "{}",
        at(&clock)
    );
    clock.set(1_000);
    assert_eq!(
        send(&app, req("/flaky")).await.status,
        StatusCode::OK,
        "the next probe"
    );
    assert_eq!(state(&stats, "/flaky"), BreakerState::Closed);
    assert_eq!(flaky.calls(), 5);
}

/// A route that waits on `gate` before it answers 200.
fn gated(
    clock: &ManualClock,
    gate: &Arc<Semaphore>,
    breaker: Breaker,
) -> (Router, StatsHandle<String>) {
    let layer = layer(clock, breaker);
    let stats = layer.handle();
    let gate = Arc::clone(gate);
    let fail = Arc::new(AtomicUsize::new(1));
    let handler = move || {
        let (gate, fail) = (Arc::clone(&gate), Arc::clone(&fail));
        async move {
            // The first call fails at once and opens the breaker.
            if fail.swap(0, Ordering::SeqCst) == 1 {
                return StatusCode::INTERNAL_SERVER_ERROR;
            }
            gate.acquire().await.expect("open").forget();
            StatusCode::OK
        }
    };
    let app = Router::new().route("/gated", get(handler)).layer(layer);
    (app, stats)
}

#[tokio::test]
async fn a_cancelled_probe_frees_the_probe_slot() {
    let clock = clock();
    let gate = Arc::new(Semaphore::new(0));
    let breaker = Breaker::error_count(0).min_requests(1).open_for(ms(100));
    let (app, stats) = gated(&clock, &gate, breaker);
    assert_eq!(send(&app, req("/gated")).await.status, 500);
    clock.advance(ms(100));

    // The probe starts and waits in the handler; meanwhile others get 503.
    let probe = tokio::spawn(app.clone().oneshot(req("/gated")));
    while stats.snapshot("/gated").expect("seen").concurrency == 0 {
        tokio::task::yield_now().await;
    }
    // Bounded: a second probe would wait in the handler for good.
    let other = tokio::time::timeout(Duration::from_secs(30), send(&app, req("/gated")))
        .await
        .expect("refused at once, not let through as a second probe");
    assert_eq!(other.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(state(&stats, "/gated"), BreakerState::HalfOpen);
    // ...and is dropped: the client went away.
    probe.abort();
    assert!(probe.await.expect_err("aborted").is_cancelled());

    gate.add_permits(1);
    assert_eq!(
        send(&app, req("/gated")).await.status,
        StatusCode::OK,
        "the next request probes at once, {}",
        at(&clock)
    );
    assert_eq!(state(&stats, "/gated"), BreakerState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_threads_on_a_half_open_key_get_exactly_one_probe() {
    const TASKS: usize = 64;
    let clock = clock();
    let gate = Arc::new(Semaphore::new(0));
    let breaker = Breaker::error_count(0).min_requests(1).open_for(ms(100));
    let (app, stats) = gated(&clock, &gate, breaker);
    assert_eq!(send(&app, req("/gated")).await.status, 500);
    clock.advance(ms(100));

    let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (app, barrier) = (app.clone(), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                app.oneshot(req("/gated"))
                    .await
                    .expect("infallible")
                    .status()
            })
        })
        .collect();
    // Everyone but the probe is answered at once; then the probe finishes.
    let refused = async {
        while stats.snapshot("/gated").expect("seen").block < (TASKS - 1) as u64 {
            tokio::time::sleep(ms(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), refused)
        .await
        .expect("all but one refused");
    gate.add_permits(TASKS);
    let mut ok = 0;
    let mut unavailable = 0;
    for task in tasks {
        match task.await.expect("no panic") {
            StatusCode::OK => ok += 1,
            StatusCode::SERVICE_UNAVAILABLE => unavailable += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((ok, unavailable), (1, TASKS - 1), "{}", at(&clock));
    assert_eq!(state(&stats, "/gated"), BreakerState::Closed);
}

#[test]
fn many_os_threads_racing_for_the_probe_slot_get_one() {
    use tower_sliding_window::breaker::CircuitBreaker;
    const THREADS: usize = 8;
    for round in 0..50u64 {
        let breaker = Arc::new(CircuitBreaker::new(
            Breaker::error_count(0).min_requests(1).open_for(ms(10)),
        ));
        breaker
            .try_pass(0)
            .expect("closed")
            .complete(0, ms(1), true);
        let barrier = Arc::new(std::sync::Barrier::new(THREADS));
        let probes = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                let (breaker, barrier, probes) = (
                    Arc::clone(&breaker),
                    Arc::clone(&barrier),
                    Arc::clone(&probes),
                );
                std::thread::spawn(move || {
                    barrier.wait();
                    if let Ok(permit) = breaker.try_pass(10) {
                        assert!(permit.is_probe());
                        probes.fetch_add(1, Ordering::SeqCst);
                        // Held until every thread has tried: forget it (the
                        // breaker stays half-open with the probe out).
                        std::mem::forget(permit);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no panic");
        }
        assert_eq!(probes.load(Ordering::SeqCst), 1, "round {round}");
    }
}

#[tokio::test]
async fn an_open_breaker_keeps_its_key_from_eviction() {
    let clock = clock();
    let flaky = Flaky::new(StatusCode::INTERNAL_SERVER_ERROR);
    let layer = layer(&clock, Breaker::error_count(0).min_requests(1)).max_keys(1);
    let stats = layer.handle();
    let app = flaky.router(layer);
    let _ = statuses(&app, "/flaky", 1).await;
    // The key's window empties; a new key finds the table full and sweeps.
    clock.advance(Duration::from_secs(2));
    let _ = statuses(&app, "/healthy", 1).await;
    assert!(is_open(state(&stats, "/flaky")), "{}", at(&clock));
    assert_eq!(
        send(&app, req("/flaky")).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
}

#[tokio::test]
async fn several_breakers_must_all_let_a_request_through() {
    let clock = clock();
    let flaky = Flaky::new(StatusCode::INTERNAL_SERVER_ERROR);
    let layer = layer(&clock, Breaker::error_count(100))
        .breaker(Breaker::error_count(0).min_requests(1).open_for(ms(1_000)));
    let stats = layer.handle();
    let app = flaky.router(layer);
    let _ = statuses(&app, "/flaky", 1).await;
    let states = stats.breakers("/flaky");
    assert_eq!(states[0], BreakerState::Closed);
    assert!(is_open(states[1]));
    assert_eq!(
        send(&app, req("/flaky")).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(flaky.calls(), 1);
}

fn panic_message(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
    let err = std::panic::catch_unwind(f).expect_err("should panic");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn invalid_settings_panic_naming_the_setting() {
    for ratio in [-0.1, 1.01, f64::NAN, f64::INFINITY] {
        let msg = panic_message(move || {
            let _ = Breaker::error_ratio(ratio);
        });
        assert!(
            msg.contains("`ratio`") && msg.contains("0.0..=1.0"),
            "{msg}"
        );
        let msg = panic_message(move || {
            let _ = Breaker::slow_ratio(ms(10), ratio);
        });
        assert!(
            msg.contains("Breaker::slow_ratio") && msg.contains("`ratio`"),
            "{msg}"
        );
    }
    let msg = panic_message(|| {
        let _ = Breaker::error_count(1).min_requests(0);
    });
    assert!(msg.contains("`min_requests`"), "{msg}");
    let msg = panic_message(|| {
        let _ = Breaker::error_count(1).stat_interval(Duration::ZERO);
    });
    assert!(
        msg.contains("`stat_interval`") && msg.contains("at least 1 ms"),
        "{msg}"
    );
    let msg = panic_message(|| {
        let _ = Breaker::error_count(1).stat_interval(Duration::from_micros(1_500));
    });
    assert!(
        msg.contains("`stat_interval`") && msg.contains("whole number"),
        "{msg}"
    );
    let msg = panic_message(|| {
        let _ = Breaker::error_count(1).open_for(Duration::ZERO);
    });
    assert!(msg.contains("`open_for`"), "{msg}");
    let msg = panic_message(|| {
        let _ = Breaker::error_count(1).open_for(Duration::from_secs(u64::MAX));
    });
    assert!(
        msg.contains("`open_for`") && msg.contains("too long"),
        "{msg}"
    );
    let msg = panic_message(|| {
        let mut layer = SlidingWindowLayer::qps(1);
        for _ in 0..65 {
            layer = layer.breaker(Breaker::error_count(1));
        }
    });
    assert!(msg.contains("`breaker`") && msg.contains("64"), "{msg}");
}

#[tokio::test]
async fn a_probe_that_panics_failed_and_opens_the_breaker_again() {
    let clock = clock();
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = {
        let calls = Arc::clone(&calls);
        move || {
            let calls = Arc::clone(&calls);
            async move {
                // The first call fails and opens the breaker; the second,
                // the probe, panics.
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    return StatusCode::INTERNAL_SERVER_ERROR;
                }
                panic!("the probe panics on purpose");
            }
        }
    };
    let layer = layer(
        &clock,
        Breaker::error_count(0).min_requests(1).open_for(ms(100)),
    );
    let stats = layer.handle();
    let app = Router::new().route("/p", get(handler)).layer(layer);
    assert_eq!(send(&app, req("/p")).await.status, 500);
    clock.advance(ms(100));
    let joined = tokio::spawn(app.clone().oneshot(req("/p"))).await;
    assert!(joined.expect_err("the probe's task panicked").is_panic());
    assert_eq!(
        state(&stats, "/p"),
        BreakerState::Open {
            half_open_in: ms(100)
        },
        "{}",
        at(&clock)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A probe that waits for its paced turn (`throttle`) keeps the probe slot
/// through the wait: every other request is refused meanwhile, and the
/// probe's completion closes the breaker.
#[cfg(feature = "tokio")]
#[tokio::test]
async fn a_probe_waiting_for_its_paced_turn_keeps_the_probe_slot() {
    let clock = clock();
    let flaky = Flaky::new(StatusCode::INTERNAL_SERVER_ERROR);
    // 10 per second: turns 100 ms apart.
    let layer = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .clock(clock.clone())
        .throttle(ms(500))
        .breaker(Breaker::error_count(0).min_requests(1).open_for(ms(10)));
    let stats = layer.handle();
    let app = flaky.router(layer);
    assert_eq!(send(&app, req("/flaky")).await.status, 500);
    clock.advance(ms(10));
    flaky.set(StatusCode::OK);

    // The probe's turn is 90 ms away: it waits (on tokio's timer).
    let probe = tokio::spawn(app.clone().oneshot(req("/flaky")));
    let waiting = async {
        while stats.snapshot("/flaky").expect("seen").waiting == 0 {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the probe waits for its turn");
    for _ in 0..5 {
        assert_eq!(
            send(&app, req("/flaky")).await.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            at(&clock)
        );
    }
    let answer = probe.await.expect("no panic").expect("infallible");
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(state(&stats, "/flaky"), BreakerState::Closed);
    assert_eq!(flaky.calls(), 2);
}

#[tokio::test]
async fn panicking_handlers_count_as_failed_requests_for_a_closed_breaker() {
    let clock = clock();
    async fn handler() -> StatusCode {
        panic!("the handler panics on purpose");
    }
    // More than 2 failures of at least 3 requests: the key's window counts
    // a panic as an exception without a completion, so the breaker must
    // count the request itself.
    let layer = layer(&clock, Breaker::error_count(2).min_requests(3));
    let stats = layer.handle();
    let app = Router::new()
        .route("/p", get(handler))
        .route("/ok", get(|| async { "fine" }))
        .layer(layer);
    for round in 0..3 {
        if round > 0 {
            assert_eq!(state(&stats, "/p"), BreakerState::Closed, "round {round}");
        }
        let joined = tokio::spawn(app.clone().oneshot(req("/p"))).await;
        assert!(joined.expect_err("the handler panicked").is_panic());
    }
    assert!(is_open(state(&stats, "/p")), "{}", at(&clock));
    assert_eq!(send(&app, req("/p")).await.status, 503);
    assert_eq!(send(&app, req("/ok")).await.status, 200);
}

#[tokio::test]
async fn a_stat_interval_longer_than_the_window_remembers_older_failures() {
    // The layer's window is 1 s; the breaker's interval is 10 s, so it
    // counts on its own and still sees the failures of 5 s ago.
    let clock = clock();
    let flaky = Flaky::new(StatusCode::INTERNAL_SERVER_ERROR);
    let layer = layer(
        &clock,
        Breaker::error_count(2)
            .min_requests(1)
            .stat_interval(Duration::from_secs(10)),
    );
    let stats = layer.handle();
    let app = flaky.router(layer);
    for _ in 0..2 {
        assert_eq!(send(&app, req("/flaky")).await.status, 500);
        clock.advance(Duration::from_secs(2));
    }
    assert_eq!(state(&stats, "/flaky"), BreakerState::Closed);
    assert_eq!(stats.snapshot("/flaky").expect("seen").exception, 0);
    assert_eq!(send(&app, req("/flaky")).await.status, 500);
    assert!(is_open(state(&stats, "/flaky")), "{}", at(&clock));
}

#[tokio::test]
async fn a_breaker_on_the_window_forgets_failures_that_left_it() {
    // The default stat interval is the layer's window (1 s): failures two
    // seconds apart never make three in one interval.
    let clock = clock();
    let flaky = Flaky::new(StatusCode::INTERNAL_SERVER_ERROR);
    let layer = layer(&clock, Breaker::error_count(2).min_requests(1));
    let stats = layer.handle();
    let app = flaky.router(layer);
    for _ in 0..5 {
        assert_eq!(send(&app, req("/flaky")).await.status, 500);
        assert_eq!(state(&stats, "/flaky"), BreakerState::Closed);
        clock.advance(Duration::from_secs(2));
    }
    assert_eq!(
        statuses(&app, "/flaky", 2).await,
        [StatusCode::INTERNAL_SERVER_ERROR; 2]
    );
    assert_eq!(state(&stats, "/flaky"), BreakerState::Closed);
    assert_eq!(send(&app, req("/flaky")).await.status, 500);
    assert!(is_open(state(&stats, "/flaky")), "{}", at(&clock));
}

/// A breaker whose open time is over, on a key that has seen no request for
/// a window, is idle: its key gives its place in the table back (a request
/// for it would have probed anyway). 64 failing paths fill a table of 64;
/// a day later 10 new clients get their own keys, not the shared overflow
/// entry's 5 per second.
#[tokio::test]
async fn idle_breakers_past_their_open_time_give_their_keys_back() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(5)
        .key(PathKey)
        .max_keys(64)
        .clock(clock.clone())
        .breaker(Breaker::error_count(1).min_requests(1));
    let stats = layer.handle();
    let app = Router::new()
        .route(
            "/failing/{n}",
            get(|| async { StatusCode::INTERNAL_SERVER_ERROR }),
        )
        .route("/client/{n}", get(|| async { "fine" }))
        .layer(layer);
    for n in 0..64 {
        let path = format!("/failing/{n}");
        assert_eq!(
            statuses(&app, &path, 2).await,
            [StatusCode::INTERNAL_SERVER_ERROR; 2]
        );
        assert!(is_open(state(&stats, &path)), "{path}");
    }
    assert_eq!(stats.len(), 64);

    clock.advance(Duration::from_secs(24 * 60 * 60));
    assert_eq!(state(&stats, "/failing/0"), BreakerState::HalfOpen);
    let mut refused = 0;
    for client in 0..10 {
        let path = format!("/client/{client}");
        let answers = statuses(&app, &path, 5).await;
        refused += answers.iter().filter(|s| **s != StatusCode::OK).count();
    }
    assert_eq!(
        refused,
        0,
        "of 50 requests of 10 new clients, {}",
        at(&clock)
    );
    assert_eq!(stats.len(), 10, "the 64 idle keys were evicted");
    assert!(stats.breakers("/failing/0").is_empty());
    // A failing path that comes back starts closed: its handler is called.
    assert_eq!(
        send(&app, req("/failing/0")).await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
}

/// A half-open breaker whose probe was dropped (the slot is free again) is
/// idle as well once its key is quiet.
#[tokio::test]
async fn a_half_open_breaker_with_a_dropped_probe_gives_its_key_back() {
    let clock = clock();
    let layer = layer(&clock, Breaker::error_count(0).min_requests(1)).max_keys(1);
    let stats = layer.handle();
    let fail = Arc::new(AtomicUsize::new(1));
    let handler = move || {
        let fail = Arc::clone(&fail);
        async move {
            // The first call fails and opens the breaker; the probe hangs.
            if fail.swap(0, Ordering::SeqCst) == 1 {
                return StatusCode::INTERNAL_SERVER_ERROR;
            }
            std::future::pending::<()>().await;
            StatusCode::OK
        }
    };
    let app = Router::new()
        .route("/hangs", get(handler))
        .route("/other", get(|| async { "fine" }))
        .layer(layer);
    assert_eq!(
        send(&app, req("/hangs")).await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    clock.advance(Duration::from_secs(10));
    // The probe goes in and is dropped while its handler hangs.
    let probe = tokio::time::timeout(ms(10), app.clone().oneshot(req("/hangs"))).await;
    assert!(probe.is_err(), "the probe's handler hangs");
    assert_eq!(state(&stats, "/hangs"), BreakerState::HalfOpen);

    clock.advance(Duration::from_secs(2));
    assert_eq!(send(&app, req("/other")).await.status, StatusCode::OK);
    assert!(stats.breakers("/hangs").is_empty(), "{}", at(&clock));
}
