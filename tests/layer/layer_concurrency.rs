//! Real concurrency on a multi-thread runtime with a frozen `ManualClock`:
//! exactly `limit` requests pass per key however many race, and the handle
//! agrees with what clients saw. Then a flood of distinct keys: memory stays
//! bounded by `max_keys` and the flood gets no more than the limit through
//! the shared overflow entry.

use crate::support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::StatusCode;
use tokio::sync::Barrier;
use tower::ServiceExt;
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::{PathKey, SlidingWindowLayer, StatsHandle};

use support::{at, clock, req, send};

async fn hello() -> &'static str {
    // Yield once so requests overlap in flight.
    tokio::task::yield_now().await;
    "hello"
}

/// Sends `per_path` requests to each of `paths` from one task each, all
/// released at once, and counts the statuses per path.
async fn race(
    app: Router,
    paths: &[&'static str],
    per_path: usize,
) -> HashMap<(&'static str, StatusCode), usize> {
    let tasks = paths.len() * per_path;
    let barrier = Arc::new(Barrier::new(tasks));
    let mut handles = Vec::with_capacity(tasks);
    for i in 0..tasks {
        let path = paths[i % paths.len()];
        let app = app.clone();
        let barrier = Arc::clone(&barrier);
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            let response = app.oneshot(req(path)).await.expect("infallible");
            (path, response.status())
        }));
    }
    let mut counts = HashMap::new();
    for handle in handles {
        let outcome = handle.await.expect("no task panicked");
        *counts.entry(outcome).or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_the_limit_passes_under_contention() {
    const LIMIT: u64 = 100;
    const REQUESTS: usize = 2_000;
    let clock = clock();
    let layer = SlidingWindowLayer::qps(LIMIT).clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new().route("/", get(hello)).layer(layer);

    let counts = race(app, &["/"], REQUESTS).await;
    let ok = counts.get(&("/", StatusCode::OK)).copied().unwrap_or(0);
    let blocked = counts
        .get(&("/", StatusCode::TOO_MANY_REQUESTS))
        .copied()
        .unwrap_or(0);
    assert_eq!(ok as u64, LIMIT, "200s {} ({counts:?})", at(&clock));
    assert_eq!(ok + blocked, REQUESTS, "only 200 and 429: {counts:?}");

    let s = stats.snapshot(&()).expect("global key");
    assert_eq!(s.pass, ok as u64, "handle pass vs 200s {}", at(&clock));
    assert_eq!(
        s.block,
        blocked as u64,
        "handle block vs 429s {}",
        at(&clock)
    );
    assert_eq!(s.success, LIMIT, "{}", at(&clock));
    assert_eq!(s.concurrency, 0, "{}", at(&clock));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_the_limit_passes_per_key_when_keys_are_created_concurrently() {
    const LIMIT: u64 = 25;
    const PATHS: [&str; 8] = ["/0", "/1", "/2", "/3", "/4", "/5", "/6", "/7"];
    let clock = clock();
    let layer = SlidingWindowLayer::qps(LIMIT)
        .key(PathKey)
        .rule("/7", 3)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new().fallback(hello).layer(layer);

    let counts = race(app, &PATHS, 150).await;
    for path in PATHS {
        let limit = if path == "/7" { 3 } else { LIMIT };
        let ok = counts.get(&(path, StatusCode::OK)).copied().unwrap_or(0);
        let blocked = counts
            .get(&(path, StatusCode::TOO_MANY_REQUESTS))
            .copied()
            .unwrap_or(0);
        assert_eq!(ok as u64, limit, "{path}: {counts:?} {}", at(&clock));
        assert_eq!(ok + blocked, 150, "{path}: {counts:?}");
        let s = stats.snapshot(path).expect("every path has an entry");
        assert_eq!(
            (s.pass, s.block, s.concurrency),
            (ok as u64, blocked as u64, 0),
            "{path} {}",
            at(&clock)
        );
    }
    assert_eq!(
        stats.len(),
        PATHS.len(),
        "one entry per key: {:?}",
        stats.keys()
    );
}

#[tokio::test]
async fn a_flood_of_distinct_keys_stays_bounded_and_limited() {
    const KEYS: usize = 100_000;
    const MAX_KEYS: usize = 1_000;
    const LIMIT: u64 = 5;
    let clock = clock();
    let layer = SlidingWindowLayer::qps(LIMIT)
        .key(PathKey)
        .max_keys(MAX_KEYS)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new().fallback(|| async { "hello" }).layer(layer);

    let mut ok = 0u64;
    for i in 0..KEYS {
        let status = send(&app, req(&format!("/k/{i}"))).await.status;
        if status == StatusCode::OK {
            ok += 1;
        }
        let len = stats.len();
        assert!(
            len <= MAX_KEYS + 1,
            "{len} entries after {} keys {}",
            i + 1,
            at(&clock)
        );
    }

    assert_eq!(
        stats.len(),
        MAX_KEYS + 1,
        "full table plus the overflow entry"
    );
    let overflow = stats.overflow();
    assert_eq!(
        overflow.pass,
        LIMIT,
        "the flood shares one limit {}",
        at(&clock)
    );
    assert_eq!(overflow.block, (KEYS - MAX_KEYS) as u64 - LIMIT);
    // One pass per key that got its own entry, and the overflow's limit.
    assert_eq!(ok, MAX_KEYS as u64 + LIMIT, "{}", at(&clock));
    assert!(
        stats.snapshot("/k/99999").is_none(),
        "overflowed keys have no entry"
    );
    assert_eq!(stats.total().pass, ok);
}

#[tokio::test]
async fn a_flood_over_time_evicts_idle_keys_and_never_grows() {
    const KEYS: usize = 40_000;
    const STEP_MS: u64 = 2;
    const PER_SECOND: usize = 1_000 / STEP_MS as usize;
    // Smaller than in the test above: every sweep scans the whole table,
    // and a sweep runs every 100 ms of clock time while the table is full.
    const MAX_KEYS: usize = 200;
    const LIMIT: u64 = 5;
    let clock = clock();
    let layer = SlidingWindowLayer::qps(LIMIT)
        .key(PathKey)
        .max_keys(MAX_KEYS)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new().fallback(|| async { "hello" }).layer(layer);

    // One new key every 2 ms: 80 s of flood, longer than the minute window,
    // so early keys go idle and must be evicted to make room.
    let mut ok_in_second = 0u64;
    let mut own_entries = 0;
    for i in 0..KEYS {
        let uri = format!("/k/{i}");
        let status = send(&app, req(&uri)).await.status;
        if status == StatusCode::OK {
            ok_in_second += 1;
        }
        if stats.snapshot(&uri).is_some() {
            own_entries += 1;
        }
        let len = stats.len();
        assert!(len <= MAX_KEYS + 1, "{len} entries {}", at(&clock));
        let overflow = stats.overflow().pass;
        assert!(
            overflow <= LIMIT,
            "overflow passed {overflow} {}",
            at(&clock)
        );
        clock.advance(Duration::from_millis(STEP_MS));
        if (i + 1) % PER_SECOND == 0 {
            // At most one pass per key with its own entry, plus the
            // overflow's limit, in any second.
            assert!(
                ok_in_second <= MAX_KEYS as u64 + LIMIT,
                "{ok_in_second} passes in a second {}",
                at(&clock)
            );
            ok_in_second = 0;
        }
    }
    assert!(
        stats.snapshot("/k/0").is_none(),
        "the first key was evicted {}",
        at(&clock)
    );
    // The first keys filled the table; once their minute window
    // emptied (60 s later) they were evicted and later keys got entries.
    assert!(
        own_entries > MAX_KEYS,
        "only {own_entries} keys ever got an entry {}",
        at(&clock)
    );

    // When the flood is over and its keys have gone idle, a new key gets its
    // own entry again.
    clock.advance(Duration::from_secs(61));
    assert_eq!(send(&app, req("/after")).await.status, StatusCode::OK);
    assert!(
        stats.snapshot("/after").is_some(),
        "room after the flood {}",
        at(&clock)
    );
    assert!(stats.len() <= MAX_KEYS + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_concurrent_flood_of_distinct_keys_stays_bounded() {
    const TASKS: usize = 8;
    const PER_TASK: usize = 2_500;
    const MAX_KEYS: usize = 1_000;
    const LIMIT: u64 = 7;
    let clock = clock();
    let layer = SlidingWindowLayer::qps(LIMIT)
        .key(PathKey)
        .max_keys(MAX_KEYS)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new().fallback(|| async { "hello" }).layer(layer);

    let barrier = Arc::new(Barrier::new(TASKS));
    let mut handles = Vec::new();
    for t in 0..TASKS {
        let app = app.clone();
        let stats = stats.clone();
        let barrier = Arc::clone(&barrier);
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut ok = 0u64;
            let mut max_len = 0;
            for i in 0..PER_TASK {
                let uri = format!("/k/{t}/{i}");
                let response = app.clone().oneshot(req(&uri)).await.expect("infallible");
                if response.status() == StatusCode::OK {
                    ok += 1;
                }
                max_len = max_len.max(stats.len());
            }
            (ok, max_len)
        }));
    }
    let mut ok = 0;
    for handle in handles {
        let (task_ok, max_len) = handle.await.expect("no task panicked");
        assert!(max_len <= MAX_KEYS + 1, "{max_len} entries {}", at(&clock));
        ok += task_ok;
    }
    // Every key is distinct, so exactly `MAX_KEYS` of them got an entry (one
    // pass each); the other 19 000 shared the overflow's limit.
    assert_eq!(stats.overflow().pass, LIMIT, "{}", at(&clock));
    assert_eq!(ok, MAX_KEYS as u64 + LIMIT, "{}", at(&clock));
    assert_eq!(stats.len(), MAX_KEYS + 1);
}

/// Races `change` on a fresh layer's handle against the layer's very first
/// request, on real threads, 2 000 times; after each round the global key's
/// limit must be `expected`.
fn race_with_the_first_request(
    layer: impl Fn(ManualClock) -> SlidingWindowLayer,
    change: impl Fn(&StatsHandle<()>),
    expected: u64,
) {
    use std::sync::Barrier as ThreadBarrier;
    use tower::Layer;

    for round in 0..2_000 {
        let clock = clock();
        let layer = layer(clock.clone());
        let stats = layer.handle();
        let service = layer.layer(tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
        }));
        let barrier = Arc::new(ThreadBarrier::new(2));
        let request = {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .expect("runtime");
                runtime.block_on(service.oneshot(http::Request::new(())))
            })
        };
        barrier.wait();
        change(&stats);
        request.join().expect("no panic").expect("infallible");
        let limit = stats.snapshot(&()).map(|s| s.limit);
        assert_eq!(
            limit,
            Some(expected),
            "round {round}: the change was lost, {}",
            at(&clock)
        );
    }
}

/// Regression: a `set_limit` on the global key racing with the key's very
/// first request could be lost for good (the limit was written only into an
/// entry that already existed, and the racing request built the entry from
/// the limits it had read before).
#[test]
fn set_limit_on_the_global_key_never_loses_a_race_with_the_first_request() {
    race_with_the_first_request(
        |clock| SlidingWindowLayer::qps(1_000).clock(clock),
        |stats| stats.set_limit((), 7),
        7,
    );
}

/// Regression: a `remove_limit` on the global key racing with the key's very
/// first request could be lost for good: the request built the entry from
/// the rule it had read before the removal, and the removal reset only an
/// entry that already existed.
#[test]
fn remove_limit_on_the_global_key_never_loses_a_race_with_the_first_request() {
    race_with_the_first_request(
        |clock| SlidingWindowLayer::qps(1_000).rule((), 7).clock(clock),
        |stats| assert!(stats.remove_limit(&()), "the rule was there"),
        1_000,
    );
}
