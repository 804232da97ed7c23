//! `.strict()`: no interval of the window's length, starting anywhere, holds
//! more than the limit. Arithmetic under a `ManualClock`, through the layer
//! (axum `Router` and a plain tower service), and on real threads with the
//! clock frozen between phases so every pass has an exact timestamp.

use crate::support;

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Barrier;
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, Response, StatusCode};
use tower::{service_fn, Layer, Service};
use tower_sliding_window::clock::{Clock, ManualClock};
use tower_sliding_window::{PathKey, SlidingWindowLayer};

use support::{at, req, send, statuses};

fn app(layer: SlidingWindowLayer<PathKey>) -> Router {
    Router::new()
        .route("/a", get(|| async { "a" }))
        .route("/b", get(|| async { "b" }))
        .layer(layer)
}

/// The largest number of passes in any interval `[a, a + interval)`, from
/// exact pass times (sorted).
fn sliding_max(times: &[u64], interval: u64) -> (u64, u64) {
    let mut best = (0, 0);
    let mut lo = 0;
    for hi in 0..times.len() {
        while times[hi] - times[lo] >= interval {
            lo += 1;
        }
        let n = (hi - lo + 1) as u64;
        if n > best.0 {
            best = (n, times[lo]);
        }
    }
    best
}

/// Sends one request to a plain tower service at the clock's time; true when
/// it passed. The decision is made in `call`, the inner future is ready.
fn pass_now<S>(svc: &mut S) -> bool
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }
    let waker = Waker::from(Arc::new(Noop));
    let mut future = pin!(svc.call(Request::new(Body::empty())));
    match future.as_mut().poll(&mut Context::from_waker(&waker)) {
        Poll::Ready(response) => response.expect("infallible").status() == StatusCode::OK,
        Poll::Pending => panic!("the inner service is always ready"),
    }
}

fn tower_service(
    layer: SlidingWindowLayer,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone + Send {
    layer.layer(service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::from("ok")))
    }))
}

#[tokio::test]
async fn a_burst_at_the_end_of_a_window_holds_through_the_next_bucket() {
    let clock = ManualClock::new(10_950);
    let layer = SlidingWindowLayer::qps(5)
        .key(PathKey)
        .strict()
        .clock(clock.clone());
    let app = app(layer);
    assert_eq!(
        statuses(&app, "/a", 5).await,
        vec![StatusCode::OK; 5],
        "{}",
        at(&clock)
    );
    // At 11 950 the window is the buckets (10 950, 11 900]: the burst at
    // 10 950 (bucket 10 900) has left it, but [10 950, 11 950) is one second.
    clock.set(11_950);
    let blocked = send(&app, req("/a")).await;
    assert_eq!(
        blocked.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        at(&clock)
    );
    // The burst counts until 12 000, one bucket after it left the window.
    assert_eq!(blocked.retry_after(), 1);
    // Another key has its own windows.
    assert_eq!(send(&app, req("/b")).await.status, StatusCode::OK);
    clock.set(12_000);
    assert_eq!(
        send(&app, req("/a")).await.status,
        StatusCode::OK,
        "{}",
        at(&clock)
    );
}

#[tokio::test]
async fn without_strict_the_same_burst_passes_twice_in_one_second() {
    // The contrast the docs state: the default window is exact only in
    // bucket-aligned windows.
    let clock = ManualClock::new(10_950);
    let app = app(SlidingWindowLayer::qps(5).key(PathKey).clock(clock.clone()));
    assert_eq!(statuses(&app, "/a", 5).await, vec![StatusCode::OK; 5]);
    clock.set(11_950);
    assert_eq!(statuses(&app, "/a", 5).await, vec![StatusCode::OK; 5]);
}

#[tokio::test]
async fn statistics_still_report_the_sample_count_window() {
    let clock = ManualClock::new(20_950);
    let layer = SlidingWindowLayer::qps(4)
        .key(PathKey)
        .strict()
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);
    statuses(&app, "/a", 4).await;
    clock.set(21_950);
    assert_eq!(
        send(&app, req("/a")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let snapshot = stats.snapshot("/a").expect("known key");
    // The four passes have left the ten-bucket window; the block has not.
    assert_eq!((snapshot.pass, snapshot.block), (0, 1), "{}", at(&clock));
}

#[tokio::test]
async fn rules_and_set_limit_apply_to_the_extra_bucket_too() {
    let clock = ManualClock::new(30_950);
    let layer = SlidingWindowLayer::qps(2)
        .key(PathKey)
        .rule("/b", 6)
        .strict()
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);
    statuses(&app, "/b", 6).await;
    clock.set(31_950);
    assert_eq!(
        send(&app, req("/b")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Raised live: the six old passes plus one fit under seven.
    stats.set_limit("/b", 7);
    assert_eq!(send(&app, req("/b")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, req("/b")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// Steady overload, worst case: requests arrive every millisecond. The
/// long-run rate must be at least `limit * n / (n + 1)` per window, and no
/// interval may hold more than `limit`.
#[test]
fn long_run_rate_under_steady_overload() {
    for (limit, sample_count, interval_ms) in [(100, 10, 1000), (7, 2, 1000), (30, 5, 500)] {
        let clock = ManualClock::new(1_000_000);
        let layer = SlidingWindowLayer::qps(limit)
            .window(Duration::from_millis(interval_ms), sample_count)
            .strict()
            .clock(clock.clone());
        let mut svc = tower_service(layer);
        let windows = 20;
        let mut times = Vec::new();
        for ms in 0..interval_ms * windows {
            clock.set(1_000_000 + ms);
            // Two offered per millisecond: overload at any limit here.
            for _ in 0..2 {
                if pass_now(&mut svc) {
                    times.push(1_000_000 + ms);
                }
            }
        }
        let (max, from) = sliding_max(&times, interval_ms);
        assert!(
            max <= limit,
            "{max} passes in [{from}, {from} + {interval_ms})"
        );
        let n = sample_count as u64;
        let floor = limit * n * windows / (n + 1);
        let passed = times.len() as u64;
        println!(
            "limit {limit}, {sample_count} x {interval_ms} ms: {passed} passes in {windows} \
             windows = {:.2} per window (floor {:.2}), sliding max {max}",
            passed as f64 / windows as f64,
            (limit * n) as f64 / (n + 1) as f64,
        );
        assert!(passed >= floor, "{passed} passes, floor {floor}");
    }
}

/// The worst case of the bound is reached when every pass lands at the
/// start of a bucket: then exactly `limit` per `n + 1` buckets.
#[test]
fn the_long_run_floor_is_reached_by_bursts_at_bucket_starts() {
    let clock = ManualClock::new(0);
    let (limit, n) = (10u64, 10u64);
    let mut svc = tower_service(SlidingWindowLayer::qps(limit).strict().clock(clock.clone()));
    let mut passed = 0;
    for bucket in 0..110u64 {
        clock.set(bucket * 100);
        for _ in 0..limit * 2 {
            passed += u64::from(pass_now(&mut svc));
        }
    }
    // 110 buckets = 10 periods of n + 1 buckets, `limit` each.
    assert_eq!(passed, limit * 110 / (n + 1));
}

/// Real threads, exact timestamps: the clock is frozen while the threads
/// send, and moved forward by an uneven step between phases, so a pass's
/// time is its phase's time. No interval may hold more than the limit.
#[test]
fn stress_never_over_on_real_threads() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 8;
    let limit = 20u64;
    let clock = ManualClock::new(50_000);
    let svc = tower_service(SlidingWindowLayer::qps(limit).strict().clock(clock.clone()));
    let mut times = Vec::new();
    let mut step = 7u64;
    for _ in 0..600 {
        let passed = AtomicU64::new(0);
        let barrier = Barrier::new(THREADS);
        thread::scope(|s| {
            for _ in 0..THREADS {
                let mut svc = svc.clone();
                let (passed, barrier) = (&passed, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    for _ in 0..PER_THREAD {
                        if pass_now(&mut svc) {
                            passed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let now = clock.now_millis();
        times.extend(std::iter::repeat_n(now, passed.into_inner() as usize));
        // Uneven steps, so phases fall at every offset within a bucket.
        step = (step * 37 + 11) % 97;
        clock.advance(Duration::from_millis(step + 1));
    }
    let (max, from) = sliding_max(&times, 1000);
    assert!(max <= limit, "{max} passes in [{from}, {from} + 1000)");
    assert!(times.len() > 100, "only {} passes", times.len());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Random arrivals: every interval of the window's length, checked
    /// against the exact pass timestamps, holds at most the limit; and each
    /// decision is the one of a naive model that keeps every pass.
    #[test]
    fn strict_never_over_in_any_interval(
        limit in 1u64..12,
        sample_count in proptest::sample::select(vec![1usize, 2, 4, 5, 10]),
        arrivals in proptest::collection::vec((0u64..260, 1usize..6), 1..120),
    ) {
        let interval = 1000u64;
        let bucket = interval / sample_count as u64;
        let clock = ManualClock::new(3_000);
        let layer = SlidingWindowLayer::qps(limit)
            .window(Duration::from_millis(interval), sample_count)
            .strict()
            .clock(clock.clone());
        let mut svc = tower_service(layer);
        let mut now = 3_000u64;
        let mut times: Vec<u64> = Vec::new();
        for (gap, burst) in arrivals {
            now += gap;
            clock.set(now);
            for _ in 0..burst {
                // The model: passes in the last `sample_count + 1` buckets.
                let oldest = (now - now % bucket).saturating_sub(interval);
                let held = times.iter().filter(|&&t| t >= oldest).count() as u64;
                let expected = held < limit;
                let passed = pass_now(&mut svc);
                proptest::prop_assert_eq!(passed, expected, "at {} ms", now);
                if passed {
                    times.push(now);
                }
            }
        }
        let (max, from) = sliding_max(&times, interval);
        proptest::prop_assert!(max <= limit, "{} passes in [{}, {} + {})", max, from, from, interval);
    }
}
