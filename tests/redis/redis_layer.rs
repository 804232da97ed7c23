//! The layer with a Redis store (feature `redis`), against a real
//! `redis-server` that each test starts on a free loopback port.
//!
//! `cargo test --features redis --test redis_layer`

#![cfg(feature = "redis")]

use crate::redis_replica::{burst, in_turn, send, Replica};
use crate::redis_server;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use redis_server::RedisServer;
use tower::ServiceExt;
use tower_sliding_window::clock::{Clock, ManualClock};
use tower_sliding_window::response::Rejection;
use tower_sliding_window::store::{RedisStore, StoreErrorKind, StoreFailure, StoreMode};
use tower_sliding_window::{PathKey, SlidingWindowLayer};

async fn replica(
    server: &RedisServer,
    clock: &ManualClock,
    limit: u64,
    policy: StoreFailure,
    timeout: Duration,
) -> Replica {
    let store = RedisStore::connect(&server.url()).await.expect("connect");
    with_store(store, clock, limit, policy, timeout)
}

/// A replica on `store`, with the test's clock, timeout and a 50 ms probe
/// interval.
fn with_store(
    store: RedisStore,
    clock: &ManualClock,
    limit: u64,
    policy: StoreFailure,
    timeout: Duration,
) -> Replica {
    let store = store
        .clock(clock.clone())
        .timeout(timeout)
        .probe_interval(Duration::from_millis(50));
    let layer = SlidingWindowLayer::qps(limit)
        .key(PathKey)
        .clock(clock.clone())
        .store(store)
        .on_store_error(policy);
    Replica::new(layer)
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_routers_admit_exactly_the_limit_per_window() {
    let server = RedisServer::start();
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

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_and_set_limit_reach_every_replica() {
    let server = RedisServer::start();
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

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_with_sees_the_stores_refusals_and_each_block_is_recorded_once() {
    let server = RedisServer::start();
    let clock = ManualClock::new(5_000_000);
    // A generous timeout: a round trip past the 100 ms default on a
    // loaded machine would fall back to the local window, which answers
    // with another reason.
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .clock(clock.clone())
        .timeout(Duration::from_secs(10));
    let layer = SlidingWindowLayer::qps(1)
        .key(PathKey)
        .clock(clock.clone())
        .store(store)
        .reject_with(|rejection: &Rejection| {
            let body = format!("{:?} {}", rejection.reason(), rejection.limit);
            let mut response = Response::new(Bytes::from(body));
            *response.status_mut() = rejection.status;
            response
        });
    let stats = layer.handle();
    let app = Router::new()
        .route("/{*path}", get(|| async { "ok" }))
        .layer(layer);
    let body = |response: Response<Body>| async move {
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.expect("body");
        (
            parts.status,
            String::from_utf8(bytes.to_vec()).expect("text"),
        )
    };
    let get = |path: &str| Request::get(path).body(Body::empty()).expect("request");

    let first = app.clone().oneshot(get("/s")).await.expect("infallible");
    assert_eq!(first.status(), StatusCode::OK);
    // Refused by Redis after the round trip, then (the store knows the key
    // is blocked) at once: the same reason either way.
    for _ in 0..2 {
        let refused = app.clone().oneshot(get("/s")).await.expect("infallible");
        let (status, text) = body(refused).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(text, "Store 1");
    }
    let snapshot = stats.snapshot("/s").expect("seen");
    assert_eq!((snapshot.pass, snapshot.block), (1, 2));
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_answered_by_each_policy_without_5xx() {
    let mut server = RedisServer::start();
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

/// Every key name in the server.
async fn names(conn: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let mut names: Vec<String> = redis::AsyncCommands::keys(conn, "*").await.expect("keys");
    names.sort();
    names
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_second_and_a_per_minute_layer_on_one_route_keep_apart() {
    let server = RedisServer::start();
    let clock = ManualClock::new(6_000_000);
    // One connection, the default prefix, the same route: only the windows
    // differ (10 buckets of 100 ms, and 60 of 1 s).
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .clock(clock.clone())
        .timeout(Duration::from_secs(10));
    let per_second = SlidingWindowLayer::qps(100)
        .key(PathKey)
        .clock(clock.clone())
        .store(store.clone())
        .on_store_error(StoreFailure::Deny);
    let per_minute = SlidingWindowLayer::qps(10)
        .window(Duration::from_secs(60), 60)
        .key(PathKey)
        .clock(clock.clone())
        .store(store)
        .on_store_error(StoreFailure::Deny);
    let minute_stats = per_minute.handle();
    let app = Router::new()
        .route("/{*path}", get(|| async { "ok" }))
        .layer(per_second)
        .layer(per_minute);
    // 3 requests a second for a minute: 10 fit the minute.
    let mut passed = 0;
    for second in 0..60 {
        for _ in 0..3 {
            match send(&app, "/report").await {
                StatusCode::OK => passed += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("second {second}: unexpected status {other}"),
            }
        }
        clock.advance(Duration::from_secs(1));
    }
    assert_eq!(passed, 10, "passes in one minute at 10 per minute");
    let status = minute_stats.store_status().expect("a store");
    assert_eq!((status.mode, status.failures), (StoreMode::Remote, 0));

    // Each window has its own name, with its shape in it.
    let mut conn = redis_server::raw(&server.url()).await;
    let names = names(&mut conn).await;
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.iter().any(|n| n.ends_with("}:100x10")), "{names:?}");
    assert!(names.iter().any(|n| n.ends_with("}:1000x60")), "{names:?}");
}

/// One hostile thing to find in a key's data.
#[derive(Debug, Clone, Copy)]
enum BadData {
    /// This count in two of the key's buckets (the current one, and one
    /// still in the window).
    Count(&'static str),
    /// A string where the key's hash should be.
    WrongType,
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_keys_bad_data_is_that_keys_alone() {
    let server = RedisServer::start();
    let cases = [
        BadData::Count("-1000"),
        BadData::Count("nan"),
        BadData::Count("inf"),
        BadData::Count("-inf"),
        BadData::Count("1e400"),
        BadData::Count("2.5"),
        BadData::Count("99999999999999999999"),
        BadData::WrongType,
    ];
    let mut conn = redis_server::raw(&server.url()).await;
    for (case, bad) in cases.into_iter().enumerate() {
        // Bucket-aligned: the first pass at `t - 500`, the bad data at `t`
        // and `t - 300`, the bursts at `t`.
        let t = 10_000_000 + case as u64 * 10_000;
        let clock = ManualClock::new(t - 500);
        let timeout = Duration::from_secs(10);
        let mut replicas = Vec::new();
        for _ in 0..2 {
            let replica = replica(&server, &clock, 10, StoreFailure::Local, timeout).await;
            replicas.push(replica);
        }
        let (bad_path, good_path) = (format!("/bad-{case}"), format!("/good-{case}"));

        let before = names(&mut conn).await;
        assert_eq!(send(&replicas[0].app, &bad_path).await, StatusCode::OK);
        let after = names(&mut conn).await;
        let made: Vec<&String> = after.iter().filter(|n| !before.contains(n)).collect();
        let [name] = made[..] else {
            panic!("{bad:?}: one new key expected: {made:?}");
        };
        match bad {
            BadData::Count(value) => {
                for at in [t, t - 300] {
                    let _: () = redis::AsyncCommands::hset(&mut conn, name, at, value)
                        .await
                        .expect("hset");
                }
            }
            BadData::WrongType => {
                let _: () = redis::AsyncCommands::del(&mut conn, name)
                    .await
                    .expect("del");
                let _: () = redis::AsyncCommands::set(&mut conn, name, "a string")
                    .await
                    .expect("set");
            }
        }
        clock.set(t);

        // The bad key first, so that its trouble comes before the other's.
        let bad_passed = burst(&replicas, &bad_path, 20).await;
        let good_passed = burst(&replicas, &good_path, 20).await;
        assert_eq!(good_passed, 10, "{bad:?}: the other key, 10 of 40");
        for (i, replica) in replicas.iter().enumerate() {
            let status = replica.stats.store_status().expect("a store");
            assert_eq!(status.mode, StoreMode::Remote, "{bad:?}, replica {i}");
            assert_eq!((status.failures, status.outages), (0, 0), "{bad:?}");
        }
        match bad {
            BadData::Count(_) => {
                // Dropped, not counted: the first pass is still there, and
                // 9 more fit.
                assert_eq!(bad_passed, 9, "{bad:?}: the bad key itself");
                let mut fields: Vec<(String, String)> =
                    redis::AsyncCommands::hgetall(&mut conn, name)
                        .await
                        .expect("hgetall");
                fields.sort();
                assert_eq!(
                    fields,
                    {
                        let mut expected = vec![
                            ((t - 500).to_string(), "1".to_owned()),
                            (t.to_string(), "9".to_owned()),
                        ];
                        expected.sort();
                        expected
                    },
                    "{bad:?}: bad buckets deleted"
                );
                let errors: u64 = replicas
                    .iter()
                    .map(|r| r.stats.store_status().expect("a store").key_errors)
                    .sum();
                assert_eq!(errors, 0);
            }
            BadData::WrongType => {
                // Answered by the failure policy (each replica's own
                // window: one pass was already in replica 0's), and counted.
                assert_eq!(bad_passed, 9 + 10, "{bad:?}: local windows");
                let errors: u64 = replicas
                    .iter()
                    .map(|r| r.stats.store_status().expect("a store").key_errors)
                    .sum();
                assert_eq!(errors, 40, "{bad:?}: every request of the key");
                let kept: String = redis::AsyncCommands::get(&mut conn, name)
                    .await
                    .expect("get");
                assert_eq!(kept, "a string", "another program's value is left alone");
            }
        }
    }
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_server_decides_nothing_however_it_is_flooded() {
    let server =
        RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"]);
    let clock = ManualClock::new(20_000_000);
    let mut conn = redis_server::raw(&server.url()).await;
    // Ten replicas, one after another in one window, each asking for 10
    // passes of a key limited to 10 in all, with a flood of other data
    // between them: an LRU server evicts the key's window each time, and
    // would let each replica pass its 10 again. Refused as a store, the
    // server decides nothing: the policy (here fail closed) answers.
    let mut passed = 0;
    for round in 0..10 {
        let replica = replica(
            &server,
            &clock,
            10,
            StoreFailure::Deny,
            Duration::from_secs(10),
        )
        .await;
        for _ in 0..10 {
            match send(&replica.app, "/k").await {
                StatusCode::OK => passed += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("unexpected status {other}"),
            }
        }
        let status = replica.stats.store_status().expect("a store");
        assert!(status.evicting, "{status:?}");
        assert_eq!(status.mode, StoreMode::Fallback, "{status:?}");
        let mut pipe = redis::pipe();
        for i in 0..1_000 {
            pipe.set(format!("flood:{round}:{i}"), "x".repeat(1_024))
                .ignore();
        }
        let _: () = pipe.query_async(&mut conn).await.expect("flood");
    }
    assert_eq!(passed, 0, "nothing decided on an evicting server");
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await
        .expect("info");
    assert!(
        !info.contains("evicted_keys:0\r"),
        "the flood evicted keys: {info}"
    );
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_is_answered_by_each_policy_without_5xx() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let clock = ManualClock::new(30_000_000);
    let timeout = Duration::from_secs(10);
    let local = replica(&server, &clock, 5, StoreFailure::Local, timeout).await;
    let allow = replica(&server, &clock, 5, StoreFailure::Allow, timeout).await;
    let deny = replica(&server, &clock, 5, StoreFailure::Deny, timeout).await;
    assert_eq!(send(&local.app, "/a").await, StatusCode::OK);

    // A tiny maxmemory: every write is refused (OOM).
    let mut conn = redis_server::raw(&server.url()).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query_async(&mut conn)
        .await
        .expect("config set");
    let set: redis::RedisResult<()> = redis::AsyncCommands::set(&mut conn, "x", "y").await;
    assert_eq!(set.expect_err("full").code(), Some("OOM"));

    let (mut local_ok, mut allow_ok, mut deny_ok) = (0, 0, 0);
    for _ in 0..20 {
        // New keys: each needs a write that the server refuses.
        for (replica, count) in [
            (&local, &mut local_ok),
            (&allow, &mut allow_ok),
            (&deny, &mut deny_ok),
        ] {
            match send(&replica.app, "/b").await {
                StatusCode::OK => *count += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("unexpected status {other}"),
            }
        }
    }
    assert_eq!((local_ok, allow_ok, deny_ok), (5, 20, 0));
    for replica in [&local, &allow, &deny] {
        let status = replica.stats.store_status().expect("a store");
        assert_eq!(status.mode, StoreMode::Fallback, "{status:?}");
        assert!(status.failures >= 1 && !status.evicting, "{status:?}");
    }

    // Room again: the next probe finds Redis.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query_async(&mut conn)
        .await
        .expect("config set");
    clock.advance(Duration::from_secs(1));
    assert_eq!(send(&deny.app, "/c").await, StatusCode::OK);
    assert_eq!(
        deny.stats.store_status().expect("a store").mode,
        StoreMode::Remote
    );
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_started_before_redis_serve_and_then_share_the_limit() {
    let mut server = RedisServer::not_started(&[]);
    let clock = ManualClock::new(40_000_000);
    // Nothing listens yet: `connect` says so.
    let err = RedisStore::connect(&server.url())
        .await
        .expect_err("no server yet");
    assert_eq!(err.kind(), StoreErrorKind::Connect, "{err}");

    let timeout = Duration::from_millis(200);
    let lazy = || RedisStore::connect_lazy(&server.url()).expect("a valid url");
    let deny = with_store(lazy(), &clock, 5, StoreFailure::Deny, timeout);
    let local = with_store(lazy(), &clock, 5, StoreFailure::Local, timeout);
    assert_eq!(
        deny.stats.store_status().expect("a store").mode,
        StoreMode::Fallback
    );
    let mut slowest = Duration::ZERO;
    let (mut deny_ok, mut local_ok) = (0, 0);
    for _ in 0..20 {
        for (replica, count) in [(&deny, &mut deny_ok), (&local, &mut local_ok)] {
            let started = Instant::now();
            match send(&replica.app, "/a").await {
                StatusCode::OK => *count += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("unexpected status {other}"),
            }
            slowest = slowest.max(started.elapsed());
        }
    }
    assert_eq!((deny_ok, local_ok), (0, 5), "each by its failure policy");
    assert!(slowest < Duration::from_secs(2), "slowest {slowest:?}");

    // Redis comes up: both replicas find it on their own.
    server.begin();
    let deadline = Instant::now() + Duration::from_secs(20);
    for replica in [&deny, &local] {
        while replica.stats.store_status().expect("a store").mode != StoreMode::Remote {
            assert!(Instant::now() < deadline, "never joined");
            clock.advance(Duration::from_millis(60));
            let _ = send(&replica.app, "/probe").await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // A fresh window: the two share 5, under 5x overload.
    clock.advance(Duration::from_secs(2));
    let replicas = [deny, local];
    assert_eq!(burst(&replicas, "/shared", 13).await, 5);
    for replica in &replicas {
        let status = replica.stats.store_status().expect("a store");
        assert_eq!(status.mode, StoreMode::Remote, "{status:?}");
    }
}

/// `key` after `store` never panics: the store carries over when the key
/// type stays the same, and is dropped (with a warning) when the new key
/// type could not name keys in it, as rules of another key type are.
#[tokio::test]
async fn key_after_store_keeps_the_store_for_the_same_key_type_and_drops_it_otherwise() {
    let store = || {
        // Nothing listens on port 1: the store stays in fallback, and no
        // test needs a server.
        RedisStore::connect_lazy("redis://127.0.0.1:1/").expect("a valid url")
    };
    let same = SlidingWindowLayer::qps(5)
        .key(PathKey)
        .store(store())
        .key(tower_sliding_window::MethodPathKey);
    assert!(same.handle().store_status().is_some(), "String keys both");

    let other = SlidingWindowLayer::qps(5).store(store()).key(PathKey);
    assert!(
        other.handle().store_status().is_none(),
        "a store for `()` keys cannot name `String` keys"
    );
}

/// A refusal decided in Redis comes after the request waited for the
/// store's answer: its key is still counted in `top_blocked` of the
/// replica that refused it, once per refusal.
#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_decided_in_redis_count_in_top_blocked() {
    let server = RedisServer::start();
    let clock = ManualClock::new(2_000_000);
    let a = replica(
        &server,
        &clock,
        3,
        StoreFailure::Deny,
        Duration::from_secs(10),
    )
    .await;
    let b = replica(
        &server,
        &clock,
        3,
        StoreFailure::Deny,
        Duration::from_secs(10),
    )
    .await;
    for _ in 0..3 {
        assert_eq!(send(&a.app, "/api").await, StatusCode::OK);
    }
    // `b` has seen no verdict yet: it asks Redis, which refuses.
    assert_eq!(send(&b.app, "/api").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(b.stats.top_blocked(5), [("/api".to_owned(), 1)]);
    assert_eq!(a.stats.top_blocked(5), []);
    assert_eq!(send(&b.app, "/api").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(b.stats.top_blocked(5), [("/api".to_owned(), 2)]);
}

/// One replica on a window of a minute (so that a restart of Redis fits in
/// it whatever the clock's steps) with a 1 ms probe interval.
async fn minute_replica(server: &RedisServer, clock: &ManualClock, limit: u64) -> Replica {
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .clock(clock.clone())
        .timeout(Duration::from_secs(2))
        .probe_interval(Duration::from_millis(1));
    let layer = SlidingWindowLayer::qps(limit)
        .window(Duration::from_secs(60), 60)
        .key(PathKey)
        .clock(clock.clone())
        .store(store)
        .on_store_error(StoreFailure::Local);
    Replica::new(layer)
}

/// Redis forgets a key's passes mid-window (FLUSHALL, or a restart without
/// persistence): whatever it grants afterwards, one replica never admits
/// more than the limit in its own window.
#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_losing_its_state_mid_window_never_lets_one_replica_past_the_limit() {
    let mut server = RedisServer::start();
    let mut conn = redis_server::raw(&server.url()).await;
    let clock = ManualClock::new(20_000_000);
    let replica = minute_replica(&server, &clock, 10).await;

    // FLUSHALL: the data is gone, the connection and the script stay.
    assert_eq!(in_turn(&replica.app, "/flushed", 10).await, 10);
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut conn)
        .await
        .expect("flushall");
    clock.advance(Duration::from_millis(500));
    assert_eq!(
        in_turn(&replica.app, "/flushed", 20).await,
        0,
        "after FLUSHALL: 10 passed already in this replica's window"
    );
    let snapshot = replica.stats.snapshot("/flushed").expect("seen");
    assert_eq!((snapshot.pass, snapshot.block), (10, 20));

    // A restart with empty memory: the connection breaks, the script
    // cache is empty (NOSCRIPT), the data is gone.
    assert_eq!(in_turn(&replica.app, "/restarted", 10).await, 10);
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    while replica.stats.store_status().expect("a store").mode != StoreMode::Remote
        || replica.stats.store_status().expect("a store").failures == 0
    {
        assert!(Instant::now() < deadline, "never recovered");
        clock.advance(Duration::from_millis(2));
        let _ = send(&replica.app, "/probe").await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        in_turn(&replica.app, "/restarted", 20).await,
        0,
        "after a restart: 10 passed already in this replica's window"
    );
    let status = replica.stats.store_status().expect("a store");
    assert_eq!(status.mode, StoreMode::Remote);

    // The next window is Redis's again, exactly.
    clock.advance(Duration::from_secs(61));
    assert_eq!(in_turn(&replica.app, "/restarted", 20).await, 10);
}

/// The bound across replicas: in the window in which Redis loses a key's
/// passes, the replicas admit at most twice the limit in all (what passed
/// before the loss, at most the limit, and what Redis counts after it, at
/// most the limit), and each at most the limit.
#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_flushall_three_replicas_admit_at_most_twice_the_limit_in_the_window() {
    let server = RedisServer::start();
    let mut conn = redis_server::raw(&server.url()).await;
    let clock = ManualClock::new(30_000_000);
    let limit = 10;
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(minute_replica(&server, &clock, limit).await);
    }
    // Before the loss: the whole limit through replica 0.
    assert_eq!(in_turn(&replicas[0].app, "/api", 10).await, 10);
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut conn)
        .await
        .expect("flushall");
    clock.advance(Duration::from_secs(1));
    // After it: Redis counts from 0 again and shares that count.
    let after = burst(&replicas[1..], "/api", 20).await;
    assert_eq!(after, limit, "replicas 1 and 2 share Redis's new count");
    assert_eq!(burst(&replicas, "/api", 20).await, 0);
    let passes: Vec<u64> = replicas
        .iter()
        .map(|r| r.stats.snapshot("/api").expect("seen").pass)
        .collect();
    for (i, pass) in passes.iter().enumerate() {
        assert!(*pass <= limit, "replica {i} admitted {pass}");
    }
    let total: u64 = passes.iter().sum();
    assert_eq!(total, 2 * limit, "passes per replica {passes:?}");

    // The same with every replica in the burst after the loss: replica 0's
    // share of Redis's new count is refused by its own full window.
    assert_eq!(in_turn(&replicas[0].app, "/all", 10).await, 10);
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut conn)
        .await
        .expect("flushall");
    let after = burst(&replicas, "/all", 20).await;
    let passes: Vec<u64> = replicas
        .iter()
        .map(|r| r.stats.snapshot("/all").expect("seen").pass)
        .collect();
    assert_eq!(passes[0], limit, "replica 0: nothing after the loss");
    assert!(after <= limit, "Redis's new count: {after}");
    assert!(passes.iter().sum::<u64>() <= 2 * limit, "{passes:?}");
}

/// Someone flushes the script cache (SCRIPT FLUSH) while the data stays:
/// the store loads the script again on NOSCRIPT and the count goes on
/// where it was, exact, with no failure.
#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_cache_is_reloaded_and_the_count_goes_on() {
    let server = RedisServer::start();
    let mut conn = redis_server::raw(&server.url()).await;
    let clock = ManualClock::new(40_000_000);
    let mut replicas = Vec::new();
    for _ in 0..2 {
        replicas.push(minute_replica(&server, &clock, 10).await);
    }
    assert_eq!(in_turn(&replicas[0].app, "/api", 4).await, 4);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("script flush");
    // Another script in the cache changes nothing: scripts are called by
    // their SHA-1, which names this store's script alone.
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return {1, 0, 0, 1000000, ''}")
        .query_async(&mut conn)
        .await
        .expect("script load");
    assert_eq!(burst(&replicas, "/api", 10).await, 6);
    for replica in &replicas {
        let status = replica.stats.store_status().expect("a store");
        assert_eq!((status.mode, status.failures), (StoreMode::Remote, 0));
    }
}
