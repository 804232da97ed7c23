//! The Redis store on a Redis Cluster (feature `redis-cluster`): three
//! primaries, each a `redis-server` the test starts on a free loopback
//! port, made one cluster with `redis-cli --cluster create`.
//!
//! `cargo test --all-features --test redis cluster -- --include-ignored`
//!
//! These tests run Redis's `redis-server` and `redis-cli` (Debian packages
//! `redis-server`, `redis-tools`). A Valkey cluster speaks the same
//! protocol, but Valkey is not tested here: Debian 12 has no
//! `valkey-server` package (`apt-get install -y valkey-server` finds
//! none).

#![cfg(feature = "redis-cluster")]

use crate::redis_server;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use redis_server::RedisCluster;
use tower::ServiceExt;
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::store::{RedisStore, StoreFailure, StoreMode};
use tower_sliding_window::{PathKey, SlidingWindowLayer, StatsHandle};

struct Replica {
    app: Router,
    stats: StatsHandle<String>,
}

const LIMIT: u64 = 10;

async fn replica(
    cluster: &RedisCluster,
    clock: &ManualClock,
    policy: StoreFailure,
    timeout: Duration,
) -> Replica {
    let store = RedisStore::connect_cluster(cluster.urls())
        .await
        .expect("connect to the cluster")
        .clock(clock.clone())
        .timeout(timeout);
    // A window of a minute: the keys outlive (in Redis's own time) the
    // seconds a reshard takes.
    let layer = SlidingWindowLayer::qps(LIMIT)
        .window(Duration::from_secs(60), 60)
        .key(PathKey)
        .clock(clock.clone())
        .store(store)
        .on_store_error(policy);
    let stats = layer.handle();
    let app = Router::new()
        .route("/{*path}", get(|| async { "ok" }))
        .layer(layer);
    Replica { app, stats }
}

/// The status of one request and how long it took; panics on anything
/// but 200 or 429.
async fn send(app: &Router, path: &str) -> (StatusCode, Duration) {
    let request = Request::get(path).body(Body::empty()).expect("request");
    let started = Instant::now();
    let status = app
        .clone()
        .oneshot(request)
        .await
        .expect("infallible")
        .status();
    assert!(
        status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
        "{path}: unexpected status {status}"
    );
    (status, started.elapsed())
}

/// `per_replica` concurrent requests for `path` to each replica; how many
/// were answered 200.
async fn burst(replicas: &[&Replica], path: &str, per_replica: usize) -> u64 {
    let mut tasks = Vec::new();
    for replica in replicas {
        for _ in 0..per_replica {
            let (app, path) = (replica.app.clone(), path.to_owned());
            tasks.push(tokio::spawn(async move { send(&app, &path).await }));
        }
    }
    let mut ok = 0;
    for task in tasks {
        if task.await.expect("no panic").0 == StatusCode::OK {
            ok += 1;
        }
    }
    ok
}

/// How many keys each primary holds.
async fn keys_per_node(cluster: &RedisCluster) -> Vec<u64> {
    let mut counts = Vec::new();
    for url in cluster.urls() {
        let mut conn = redis_server::raw(&url).await;
        let size: u64 = redis::cmd("DBSIZE")
            .query_async(&mut conn)
            .await
            .expect("dbsize");
        counts.push(size);
    }
    counts
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_each_keys_limit_on_a_three_primary_cluster() {
    let mut cluster = RedisCluster::start(3);
    let clock = ManualClock::new(50_000_000);
    let timeout = Duration::from_millis(500);
    let deny = replica(&cluster, &clock, StoreFailure::Deny, timeout).await;
    let local = replica(&cluster, &clock, StoreFailure::Local, timeout).await;

    // 30 keys: 30 requests each, 15 per replica; exactly the limit passes
    // per key, wherever its slot is.
    for key in 0..30 {
        let path = format!("/k{key}");
        assert_eq!(burst(&[&deny, &local], &path, 15).await, LIMIT, "{path}");
    }
    let spread = keys_per_node(&cluster).await;
    assert!(
        spread.iter().all(|&keys| keys > 0),
        "keys on every primary: {spread:?}"
    );
    assert_eq!(spread.iter().sum::<u64>(), 30, "one hash per key");
    for replica in [&deny, &local] {
        let status = replica.stats.store_status().expect("a store");
        assert_eq!((status.mode, status.failures), (StoreMode::Remote, 0));
    }

    // Half of the limit on 30 more keys (no refusal, so no replica
    // remembers a key as blocked). Then every primary forgets the script
    // (SCRIPT FLUSH), and node 0's slots move, keys and all, to node 1:
    // the stores reload the script on NOSCRIPT, follow MOVED, and each key's
    // window goes on where it was: exactly 5 more pass.
    for key in 0..30 {
        let path = format!("/m{key}");
        for _ in 0..5 {
            assert_eq!(send(&deny.app, &path).await.0, StatusCode::OK, "{path}");
        }
    }
    for url in cluster.urls() {
        let mut conn = redis_server::raw(&url).await;
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .expect("script flush");
    }
    cluster.move_all_slots(0, 1);
    let spread = keys_per_node(&cluster).await;
    assert_eq!(spread[0], 0, "node 0 gave its keys away: {spread:?}");
    assert_eq!(spread.iter().sum::<u64>(), 60, "{spread:?}");
    for key in 0..30 {
        let path = format!("/m{key}");
        assert_eq!(burst(&[&deny, &local], &path, 15).await, 5, "{path}");
    }
    for replica in [&deny, &local] {
        let status = replica.stats.store_status().expect("a store");
        assert_eq!((status.mode, status.failures), (StoreMode::Remote, 0));
    }

    // A primary dies mid-run (no replica takes its slots over): no 5xx,
    // nobody waits past the timeout, and the failure policy answers.
    cluster.node(2).kill();
    let mut slowest = Duration::ZERO;
    let mut deny_after_failure = (0, 0);
    for key in 0..30 {
        let path = format!("/after{key}");
        let mut local_ok = 0;
        for _ in 0..15 {
            let failed = deny.stats.store_status().expect("a store").failures > 0;
            let (status, took) = send(&deny.app, &path).await;
            slowest = slowest.max(took);
            if failed {
                deny_after_failure.0 += 1;
                if status == StatusCode::OK {
                    deny_after_failure.1 += 1;
                }
            }
            let (status, took) = send(&local.app, &path).await;
            slowest = slowest.max(took);
            if status == StatusCode::OK {
                local_ok += 1;
            }
        }
        // Whether Redis or its own window decided, the local replica
        // admits at most the limit of a key (its window caps Redis too).
        assert!(local_ok <= LIMIT, "{path}: {local_ok}");
    }
    assert!(
        slowest < timeout + Duration::from_millis(500),
        "slowest {slowest:?} (timeout {timeout:?})"
    );
    let status = deny.stats.store_status().expect("a store");
    assert!(status.failures > 0, "the dead primary was noticed");
    assert_eq!(status.mode, StoreMode::Fallback);
    // The clock stands still, so no probe is due: once the first failure
    // was known, Deny refused every request.
    assert!(deny_after_failure.0 > 0);
    assert_eq!(deny_after_failure.1, 0, "Deny admitted after the failure");
    let status = local.stats.store_status().expect("a store");
    assert!(status.failures > 0);
}
