//! `StatsHandle::top_blocked`: who is being limited, over the last minute,
//! in bounded memory: exact counts with few keys, a flood of distinct keys
//! with a few heavy ones, blocks ageing out on the layer's clock, blocks
//! from several threads, every kind of refusal, and `n` at its edges.

use crate::support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use http::request::Parts;
use http::{Request, Response, StatusCode};
use tower::{Service, ServiceExt};
use tower_sliding_window::breaker::Breaker;
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::{SlidingWindowLayer, StatsHandle};

use support::at;

/// Counters per period over all shards, and per shard: the figures the
/// docs of `top_blocked` give.
const CAPACITY: usize = 1024;
const PER_SHARD: u64 = 64;

/// The client's key: its `x-client` header, `""` without one.
fn client(parts: &Parts) -> String {
    parts
        .headers
        .get("x-client")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

type App = tower::util::BoxCloneService<Request<String>, Response<String>, Infallible>;

/// A layer keyed by [`client`] in front of a service that answers `200`
/// (or `500` for the path `/fail`), and its handle.
fn app(layer: SlidingWindowLayer) -> (App, StatsHandle<String>) {
    let layer = layer.key(client);
    let stats = layer.handle();
    let service = tower::ServiceBuilder::new().layer(layer).service_fn(
        |request: Request<String>| async move {
            let status = if request.uri().path() == "/fail" {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::OK
            };
            let mut response = Response::new(axum::body::Body::empty());
            *response.status_mut() = status;
            Ok::<_, Infallible>(response)
        },
    );
    let service = ServiceExt::<Request<String>>::map_response(service, |response| {
        response.map(|_| String::new())
    });
    (App::new(service), stats)
}

async fn send(app: &mut App, path: &str, key: &str) -> StatusCode {
    let request = Request::get(path)
        .header("x-client", key)
        .body(String::new())
        .expect("valid request");
    let service = app.ready().await.expect("infallible");
    service.call(request).await.expect("infallible").status()
}

/// Key `i` of 40 sends `i + 2` requests against a limit of 1 per second:
/// `i + 1` blocks each, in interleaved order. Fewer keys than any shard's
/// counters: the counts are exact and the order is by count.
#[tokio::test]
async fn exact_counts_and_order_with_fewer_keys_than_counters() {
    let clock = ManualClock::new(10_050);
    let (mut app, stats) = app(SlidingWindowLayer::qps(1).clock(clock.clone()));
    assert!(stats.top_blocked(10).is_empty(), "nothing blocked yet");
    for round in 0..42 {
        for i in 0..40usize {
            if round < i + 2 {
                send(&mut app, "/", &format!("client-{i}")).await;
            }
        }
    }
    let want: Vec<(String, u64)> = (0..40u64)
        .rev()
        .map(|i| (format!("client-{i}"), i + 1))
        .collect();
    assert_eq!(stats.top_blocked(100), want, "{}", at(&clock));
    assert_eq!(stats.top_blocked(3), want[..3]);
    assert_eq!(stats.top_blocked(1), want[..1]);
    // The counts agree with the keys' own statistics here (one window).
    for (key, count) in &want {
        assert_eq!(stats.snapshot(key).map(|s| s.block), Some(*count), "{key}");
    }
}

/// A compact layer's refusals feed the same summary: the same exact counts
/// and order as a full layer's, under the same traffic.
#[tokio::test]
async fn a_compact_layers_refusals_count_as_a_full_layers_do() {
    let clock = ManualClock::new(10_050);
    let (mut app, stats) = app(SlidingWindowLayer::qps(1).compact().clock(clock.clone()));
    for round in 0..12 {
        for i in 0..10usize {
            if round < i + 2 {
                send(&mut app, "/", &format!("client-{i}")).await;
            }
        }
    }
    let want: Vec<(String, u64)> = (0..10u64)
        .rev()
        .map(|i| (format!("client-{i}"), i + 1))
        .collect();
    assert_eq!(stats.top_blocked(100), want, "{}", at(&clock));
    assert_eq!(
        stats.total().block,
        want.iter().map(|(_, n)| n).sum::<u64>()
    );
}

/// 100 000 distinct keys blocked once each and three heavy keys blocked
/// 3 000, 2 000 and 1 000 times among them: the summary holds at most its
/// 1 024 keys, the heavy keys come first, and each count lies within the
/// documented bound (never under, over by at most the blocks / 64).
#[tokio::test]
async fn a_flood_of_distinct_keys_stays_bounded_and_the_heavy_keys_lead() {
    let clock = ManualClock::new(10_050);
    let (mut app, stats) = app(SlidingWindowLayer::qps(0).clock(clock.clone()));
    let heavy = ["heavy-a", "heavy-b", "heavy-c"];
    let weights = [3u64, 2, 1];
    let mut truth: HashMap<String, u64> = HashMap::new();
    let mut held = Vec::new();
    for i in 0..100_000u32 {
        let key = format!("flood-{i}");
        assert_eq!(
            send(&mut app, "/", &key).await,
            StatusCode::TOO_MANY_REQUESTS
        );
        *truth.entry(key).or_default() += 1;
        if i % 100 == 0 {
            for (key, weight) in heavy.iter().zip(weights) {
                for _ in 0..weight {
                    send(&mut app, "/", key).await;
                    *truth.entry((*key).to_owned()).or_default() += 1;
                }
            }
        }
        if i % 10_000 == 9_999 {
            // Still within the first period of 10 s.
            clock.advance(Duration::from_millis(500));
            held.push(stats.top_blocked(usize::MAX).len());
        }
    }
    let blocks: u64 = truth.values().sum();
    assert_eq!(blocks, 106_000);
    // The summary's size is constant: it never holds more than its
    // capacity, however many keys were blocked.
    assert!(
        held.iter().all(|&n| (1..=CAPACITY).contains(&n)),
        "keys held along the flood: {held:?}"
    );
    let top = stats.top_blocked(usize::MAX);
    let firsts: Vec<&str> = top[..3].iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(firsts, heavy, "{:?}", &top[..5]);
    for (key, count) in &top {
        let exact = truth[key];
        assert!(*count >= exact, "{key}: {count} < {exact}");
        assert!(
            count - exact <= blocks / PER_SHARD,
            "{key}: {count} for {exact}, bound {}",
            blocks / PER_SHARD
        );
    }
    for (key, weight) in heavy.iter().zip(weights) {
        assert!(truth[*key] == 1_000 * weight);
    }
    assert_eq!(stats.top_blocked(0), []);
    assert_eq!(stats.top_blocked(3).len(), 3);
}

/// Blocks are counted for the 10 s period they fall in and the five after
/// it, then drop out.
#[tokio::test]
async fn blocks_older_than_the_covered_minute_drop_out() {
    // 10 050 ms: in the period [10 s, 20 s), covered until 70 s.
    let clock = ManualClock::new(10_050);
    let (mut app, stats) = app(SlidingWindowLayer::qps(1).clock(clock.clone()));
    for _ in 0..4 {
        send(&mut app, "/", "early").await;
    }
    clock.set(65_000);
    for _ in 0..2 {
        send(&mut app, "/", "late").await;
    }
    let both = vec![("early".to_owned(), 3), ("late".to_owned(), 1)];
    assert_eq!(stats.top_blocked(5), both, "{}", at(&clock));
    clock.set(69_999);
    assert_eq!(stats.top_blocked(5), both, "{}", at(&clock));
    clock.set(70_000);
    assert_eq!(
        stats.top_blocked(5),
        [("late".to_owned(), 1)],
        "{}",
        at(&clock)
    );
    // `late` (65 s, period [60 s, 70 s)) is covered until 120 s.
    clock.set(119_999);
    assert_eq!(stats.top_blocked(5).len(), 1, "{}", at(&clock));
    clock.set(120_000);
    assert_eq!(stats.top_blocked(5), [], "{}", at(&clock));
    // A clock stepped back: the layer times `late`'s refusals at its
    // newest bucket (65 s), and they are counted there, with the first; a
    // read behind the newest block reads the minute up to that block's
    // period, which holds `early` again.
    clock.set(30_000);
    send(&mut app, "/", "late").await;
    send(&mut app, "/", "late").await;
    let mut top = stats.top_blocked(5);
    top.sort();
    assert_eq!(
        top,
        [("early".to_owned(), 3), ("late".to_owned(), 3)],
        "{}",
        at(&clock)
    );
}

/// Four threads, each on its own runtime, block eight keys at once: every
/// block is counted, exactly.
#[test]
fn blocks_from_several_threads_are_all_counted() {
    let clock = ManualClock::new(10_050);
    let (app, stats) = app(SlidingWindowLayer::qps(0).clock(clock.clone()));
    let threads = 4;
    let start = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let mut app = app.clone();
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .expect("a runtime");
                start.wait();
                runtime.block_on(async {
                    for i in 0..2_000usize {
                        let key = format!("key-{}", (i + t) % 8);
                        assert_eq!(
                            send(&mut app, "/", &key).await,
                            StatusCode::TOO_MANY_REQUESTS
                        );
                    }
                });
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("no panic");
    }
    let mut top = stats.top_blocked(100);
    top.sort();
    let want: Vec<(String, u64)> = (0..8).map(|k| (format!("key-{k}"), 1_000)).collect();
    assert_eq!(top, want);
}

/// Every refusal counts under the request's own key: the window's, a key
/// that shares the overflow entry, an open breaker's.
#[tokio::test]
async fn every_refusal_counts_under_the_requests_own_key() {
    let clock = ManualClock::new(10_050);
    let (mut app, stats) = app(SlidingWindowLayer::qps(2)
        .max_keys(1)
        .breaker(Breaker::error_count(1).min_requests(1))
        .clock(clock.clone()));
    // `a` holds the one entry; `b` and `c` share the overflow entry.
    for key in ["a", "a", "a", "a", "b", "b", "c"] {
        send(&mut app, "/", key).await;
    }
    assert!(stats.snapshot("b").is_none(), "b shares the overflow entry");
    let top = stats.top_blocked(10);
    assert_eq!(top[0], ("a".to_owned(), 2), "{top:?}");
    // Over the overflow entry's limit of 2: `b` passed twice, `c` not.
    assert_eq!(top[1..], [("c".to_owned(), 1)], "{top:?}");

    // A failure opens `a`'s breaker (two errors over one), which then
    // refuses with 503.
    clock.advance(Duration::from_secs(2));
    send(&mut app, "/fail", "a").await;
    send(&mut app, "/fail", "a").await;
    assert_eq!(
        send(&mut app, "/", "a").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(stats.top_blocked(1), [("a".to_owned(), 3)]);
    let a = stats.snapshot("a").expect("a has an entry");
    assert_eq!(a.block, 1, "the breaker's refusal in the current window");
}
