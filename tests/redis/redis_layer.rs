//! The layer with a Redis store (feature `redis`), against a real
//! `redis-server` that each test starts on a free loopback port.
//!
//! `cargo test --features redis --test redis_layer`

#![cfg(feature = "redis")]

use crate::redis_server;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use redis_server::RedisServer;
use tower::ServiceExt;
use tower_sliding_window::clock::{Clock, ManualClock};
use tower_sliding_window::store::{RedisStore, StoreFailure, StoreMode};
use tower_sliding_window::{PathKey, SlidingWindowLayer, StatsHandle};

/// One replica: a router behind its own layer and its own store
/// (connection), and the layer's handle.
struct Replica {
    app: Router,
    stats: StatsHandle<String>,
}

async fn replica(
    server: &RedisServer,
    clock: &ManualClock,
    limit: u64,
    policy: StoreFailure,
    timeout: Duration,
) -> Replica {
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .clock(clock.clone())
        .timeout(timeout)
        .probe_interval(Duration::from_millis(50));
    let layer = SlidingWindowLayer::qps(limit)
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

async fn send(app: &Router, path: &str) -> StatusCode {
    let request = Request::get(path).body(Body::empty()).expect("request");
    app.clone()
        .oneshot(request)
        .await
        .expect("infallible")
        .status()
}

/// Sends `per_replica` concurrent requests for `path` to each replica;
/// returns how many were answered 200, and panics on anything but 200/429.
async fn burst(replicas: &[Replica], path: &str, per_replica: usize) -> u64 {
    let mut tasks = Vec::new();
    for replica in replicas {
        for _ in 0..per_replica {
            let (app, path) = (replica.app.clone(), path.to_owned());
            tasks.push(tokio::spawn(async move { send(&app, &path).await }));
        }
    }
    let mut ok = 0;
    for task in tasks {
        match task.await.expect("no panic") {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected status {other}"),
        }
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_routers_admit_exactly_the_limit_per_window() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = ManualClock::new(2_000_000);
    let limit = 30;
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let replica = replica(
            &server,
            &clock,
            limit,
            StoreFailure::Deny,
            Duration::from_secs(10),
        )
        .await;
        replicas.push(replica);
    }
    // 5x overload in each of 5 bucket-aligned windows.
    for window in 0..5 {
        let passed = burst(&replicas, "/api", (limit as usize * 5).div_ceil(3)).await;
        assert_eq!(
            passed,
            limit,
            "window {window} at {} ms",
            clock.now_millis()
        );
        // Each replica's statistics count what Redis decided for it.
        let (pass, block) = replicas.iter().fold((0, 0), |(p, b), r| {
            let s = r.stats.snapshot("/api").expect("seen");
            (p + s.pass, b + s.block)
        });
        assert_eq!(pass, limit);
        assert_eq!(pass + block, 3 * (limit * 5).div_ceil(3));
        // Every replica was refused by Redis at least once in the burst
        // (50 requests each, 30 passes in all), so each now knows the key
        // is blocked until the window ends and refuses without a round
        // trip. (Inside the burst, how many were answered locally depends
        // on how the replies and the requests interleave.)
        for replica in &replicas {
            let before = replica.stats.store_status().expect("a store");
            assert_eq!(
                send(&replica.app, "/api").await,
                StatusCode::TOO_MANY_REQUESTS
            );
            let after = replica.stats.store_status().expect("a store");
            assert_eq!(
                after.answered_locally,
                before.answered_locally + 1,
                "window {window}: a blocked key is answered locally"
            );
            assert_eq!(after.round_trips, before.round_trips);
        }
        clock.advance(Duration::from_secs(1));
    }
    let status = replicas[0].stats.store_status().expect("a store");
    assert_eq!((status.mode, status.failures), (StoreMode::Remote, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_and_set_limit_reach_every_replica() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let clock = ManualClock::new(3_000_000);
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let replica = replica(
            &server,
            &clock,
            50,
            StoreFailure::Deny,
            Duration::from_secs(10),
        )
        .await;
        replicas.push(replica);
    }
    // A handle's set_limit on one replica is written to Redis in the
    // background; wait until it is there.
    replicas[0].stats.set_limit("/export", 2);
    let mut conn = redis_server::raw(&server.url()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let keys: Vec<String> = redis::AsyncCommands::keys(&mut conn, "tsw:*:limit")
            .await
            .expect("keys");
        if !keys.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "the limit never reached Redis");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(burst(&replicas[1..], "/export", 10).await, 2);
    assert_eq!(burst(&replicas, "/other", 30).await, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_answered_by_each_policy_without_5xx() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let clock = ManualClock::new(4_000_000);
    let timeout = Duration::from_millis(200);
    let local = replica(&server, &clock, 5, StoreFailure::Local, timeout).await;
    let allow = replica(&server, &clock, 5, StoreFailure::Allow, timeout).await;
    let deny = replica(&server, &clock, 5, StoreFailure::Deny, timeout).await;
    assert_eq!(send(&local.app, "/a").await, StatusCode::OK);

    server.kill();
    let mut slowest = Duration::ZERO;
    let (mut local_ok, mut allow_ok, mut deny_ok) = (0, 0, 0);
    for _ in 0..20 {
        for (replica, count) in [
            (&local, &mut local_ok),
            (&allow, &mut allow_ok),
            (&deny, &mut deny_ok),
        ] {
            let started = Instant::now();
            let status = send(&replica.app, "/a").await;
            slowest = slowest.max(started.elapsed());
            assert!(
                status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
                "{status}"
            );
            if status == StatusCode::OK {
                *count += 1;
            }
        }
    }
    // Local: this replica's own window (5, one of which passed before).
    assert_eq!(local_ok, 4);
    assert_eq!(allow_ok, 20);
    assert_eq!(deny_ok, 0);
    assert!(slowest < Duration::from_secs(2), "slowest {slowest:?}");
    for replica in [&local, &allow, &deny] {
        let status = replica.stats.store_status().expect("a store");
        assert_eq!(status.mode, StoreMode::Fallback);
        assert_eq!(status.outages, 1);
    }
    let snapshot = allow.stats.snapshot("/a").expect("seen");
    assert_eq!((snapshot.pass, snapshot.block), (20, 0));
    let snapshot = deny.stats.snapshot("/a").expect("seen");
    assert_eq!((snapshot.pass, snapshot.block), (0, 20));

    // Restarted on the same port: the stores find it again on their own.
    server.restart();
    clock.advance(Duration::from_secs(1));
    let deadline = Instant::now() + Duration::from_secs(20);
    while deny.stats.store_status().expect("a store").mode != StoreMode::Remote {
        assert!(Instant::now() < deadline, "never recovered");
        clock.advance(Duration::from_millis(60));
        let _ = send(&deny.app, "/b").await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(send(&deny.app, "/c").await, StatusCode::OK);
}
