//! Several windows per key (`SlidingWindowLayer::limit_per`) with a Redis
//! store, against a real `redis-server` that each test starts on a free
//! loopback port: every window of a key decided in one script call, all or
//! none, across replicas.
//!
//! `cargo test --all-features --test redis -- --include-ignored windows`

#![cfg(feature = "redis")]

use crate::redis_replica::{burst, send, Replica};
use crate::redis_server;

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use redis_server::RedisServer;
use tower::ServiceExt;
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::store::{RedisStore, StoreFailure, StoreMode};
use tower_sliding_window::{PathKey, SlidingWindowLayer};

const MINUTE: Duration = Duration::from_secs(60);

/// A replica of `qps(10).limit_per(60 s, 15)` on its own connection, with
/// the test's clock.
async fn replica(server: &RedisServer, clock: &ManualClock, policy: StoreFailure) -> Replica {
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .clock(clock.clone())
        .timeout(Duration::from_secs(10))
        .probe_interval(Duration::from_millis(50));
    let layer = SlidingWindowLayer::qps(10)
        .limit_per(MINUTE, 15)
        .key(PathKey)
        .clock(clock.clone())
        .store(store)
        .on_store_error(policy);
    Replica::new(layer)
}

/// Every key name in the server.
async fn names(conn: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let mut names: Vec<String> = redis::AsyncCommands::keys(conn, "*").await.expect("keys");
    names.sort();
    names
}

/// The buckets of the hash `name`: bucket start to passes.
async fn buckets(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> BTreeMap<u64, u64> {
    redis::AsyncCommands::hgetall(conn, name)
        .await
        .expect("hgetall")
}

/// The names of the first window's buckets and of the minute's, among
/// `names`.
fn second_and_minute(names: &[String]) -> (String, String) {
    let [a, b] = names else {
        panic!("two keys expected: {names:?}");
    };
    let (second, minute) = if a.ends_with("/60000ms") {
        (b, a)
    } else {
        (a, b)
    };
    assert!(second.ends_with("}:100x10"), "{names:?}");
    assert_eq!(minute, &format!("{second}/60000ms"), "{names:?}");
    (second.clone(), minute.clone())
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_every_window_and_admit_exactly_fifteen_in_the_minute() {
    let server = RedisServer::start();
    // Minute-aligned, so that the minute's buckets (6 s) start at `t0`.
    let t0 = 6_000_000;
    let clock = ManualClock::new(t0);
    let replicas = [
        replica(&server, &clock, StoreFailure::Deny).await,
        replica(&server, &clock, StoreFailure::Deny).await,
    ];

    // One script call per admission, each replica's: every request of the
    // first 6 (one after another, none refused) is one round trip.
    for i in 0..6 {
        let replica = &replicas[i % 2];
        let before = replica.stats.store_status().expect("a store").round_trips;
        assert_eq!(send(&replica.app, "/api").await, StatusCode::OK, "{i}");
        let after = replica.stats.store_status().expect("a store").round_trips;
        assert_eq!(after, before + 1, "request {i}: one script call");
    }
    // 4 more fit the second's 10, across both replicas, under overload.
    assert_eq!(burst(&replicas, "/api", 20).await, 4);
    // Both windows in Redis hold the 10 passes; the second refused the
    // rest, and the minute was charged none of them.
    let mut conn = redis_server::raw(&server.url()).await;
    let (second, minute) = second_and_minute(&names(&mut conn).await);
    assert_eq!(
        buckets(&mut conn, &second).await,
        BTreeMap::from([(t0, 10)])
    );
    assert_eq!(
        buckets(&mut conn, &minute).await,
        BTreeMap::from([(t0, 10)])
    );
    clock.advance(Duration::from_secs(1));
    // A new second: the minute has 5 left, whoever asks.
    assert_eq!(burst(&replicas, "/api", 20).await, 5);

    // Redis holds the 15 passes in the minute, and the second only the 5
    // of this second: the requests the minute refused were not charged to
    // the second (whose bucket of t0 has left its window and is gone).
    assert_eq!(
        buckets(&mut conn, &second).await,
        BTreeMap::from([(t0 + 1000, 5)]),
        "the second's buckets"
    );
    assert_eq!(
        buckets(&mut conn, &minute).await,
        BTreeMap::from([(t0, 15)]),
        "the minute's buckets"
    );

    // Later seconds of the minute admit nothing more, and charge nothing.
    for second_of_minute in 2..5 {
        clock.advance(Duration::from_secs(1));
        assert_eq!(
            burst(&replicas, "/api", 10).await,
            0,
            "second {second_of_minute}"
        );
    }
    let charged = buckets(&mut conn, &second).await;
    assert!(
        charged.keys().all(|&at| at <= t0 + 1000),
        "no later second was charged: {charged:?}"
    );
    assert_eq!(
        buckets(&mut conn, &minute).await,
        BTreeMap::from([(t0, 15)])
    );

    // Retry-After is the longest wait: the second has room, the minute
    // frees its first bucket at t0 + 60 s, 56 s from now.
    let request = Request::get("/api").body(Body::empty()).expect("request");
    let refused = replicas[1]
        .app
        .clone()
        .oneshot(request)
        .await
        .expect("infallible");
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "56");

    // Each replica's own windows hold its own passes, 15 in all.
    let mut passes = [0; 2];
    for replica in &replicas {
        let windows = replica.stats.windows("/api").expect("seen");
        assert_eq!(windows.len(), 2);
        passes[0] += windows[0].pass;
        passes[1] += windows[1].pass;
        let status = replica.stats.store_status().expect("a store");
        assert_eq!((status.mode, status.failures), (StoreMode::Remote, 0));
    }
    // The second's window (1 s) holds only what passed in this second.
    assert_eq!(passes, [0, 15]);

    // The minute goes on: at t0 + 60 s its first bucket leaves, and the
    // second's 10 fit again.
    clock.set(t0 + 60_000);
    assert_eq!(burst(&replicas, "/api", 20).await, 10);
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_data_in_the_minute_key_is_that_keys_alone() {
    let server = RedisServer::start();
    let t0 = 12_000_000;
    let clock = ManualClock::new(t0);
    let replica = replica(&server, &clock, StoreFailure::Local).await;
    let mut conn = redis_server::raw(&server.url()).await;

    assert_eq!(send(&replica.app, "/bad").await, StatusCode::OK);
    let (second, minute) = second_and_minute(&names(&mut conn).await);

    // Counts the script could not have written are dropped, never counted.
    for value in [
        "-1000",
        "nan",
        "inf",
        "1e400",
        "2.5",
        "99999999999999999999",
    ] {
        let _: () = redis::AsyncCommands::hset(&mut conn, &minute, t0 - 6000, value)
            .await
            .expect("hset");
    }
    assert_eq!(send(&replica.app, "/bad").await, StatusCode::OK);
    assert_eq!(
        buckets(&mut conn, &minute).await,
        BTreeMap::from([(t0, 2)]),
        "bad buckets deleted"
    );

    // A minute key that is not a hash: that key's error, and nothing is
    // written to the second's either (all or none); the failure policy
    // answers (here this replica's own windows, which have room).
    let _: () = redis::AsyncCommands::del(&mut conn, &minute)
        .await
        .expect("del");
    let _: () = redis::AsyncCommands::set(&mut conn, &minute, "a string")
        .await
        .expect("set");
    assert_eq!(send(&replica.app, "/bad").await, StatusCode::OK);
    let status = replica.stats.store_status().expect("a store");
    assert_eq!(
        (status.mode, status.failures, status.key_errors),
        (StoreMode::Remote, 0, 1),
        "{status:?}"
    );
    assert_eq!(
        buckets(&mut conn, &second).await,
        BTreeMap::from([(t0, 2)]),
        "the second's key is not charged"
    );
    let kept: String = redis::AsyncCommands::get(&mut conn, &minute)
        .await
        .expect("get");
    assert_eq!(kept, "a string", "another program's value is left alone");
    // The local windows still cap the key: 3 passed, 7 more fit the second.
    let mut passed = 0;
    for _ in 0..12 {
        if send(&replica.app, "/bad").await == StatusCode::OK {
            passed += 1;
        }
    }
    assert_eq!(passed, 7);
    // Another key is decided in Redis as before.
    assert_eq!(send(&replica.app, "/good").await, StatusCode::OK);
    let status = replica.stats.store_status().expect("a store");
    assert_eq!((status.mode, status.failures), (StoreMode::Remote, 0));
    assert_eq!(names(&mut conn).await.len(), 4);
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_redis_grants_after_losing_its_state_must_fit_every_local_window() {
    let server = RedisServer::start();
    let t0 = 18_000_000;
    let clock = ManualClock::new(t0);
    let replica = replica(&server, &clock, StoreFailure::Deny).await;
    // 15 passes, none refused (so none is remembered as blocked): 10 in
    // the first second, 5 in the next.
    for (second, count) in [(0, 10), (1, 5)] {
        for i in 0..count {
            assert_eq!(
                send(&replica.app, "/api").await,
                StatusCode::OK,
                "second {second}, request {i}"
            );
        }
        clock.advance(Duration::from_secs(1));
    }
    // Redis forgets every window; it grants again, but this replica's
    // minute window holds its 15 passes already, and refuses them all.
    let mut conn = redis_server::raw(&server.url()).await;
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut conn)
        .await
        .expect("flushall");
    for i in 0..10 {
        assert_eq!(
            send(&replica.app, "/api").await,
            StatusCode::TOO_MANY_REQUESTS,
            "request {i} after the flush"
        );
    }
    let windows = replica.stats.windows("/api").expect("seen");
    assert_eq!((windows[0].pass, windows[1].pass), (0, 15));
    // Redis counted them (it errs toward fewer passes, never more).
    let (_, minute) = second_and_minute(&names(&mut conn).await);
    assert_eq!(
        buckets(&mut conn, &minute).await,
        BTreeMap::from([(t0, 10)])
    );
    let status = replica.stats.store_status().expect("a store");
    assert_eq!((status.mode, status.failures), (StoreMode::Remote, 0));
}

/// Sends 30 concurrent requests for `/hot` every ms of `clock` for `ms` ms
/// through `replica`; returns how many passed.
async fn hot_load(replica: &Replica, clock: &ManualClock, ms: u64) -> u64 {
    let mut passed = 0;
    for _ in 0..ms {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..30 {
            let app = replica.app.clone();
            tasks.spawn(async move { send(&app, "/hot").await == StatusCode::OK });
        }
        while let Some(ok) = tasks.join_next().await {
            if ok.expect("no panic") {
                passed += 1;
            }
        }
        clock.advance(Duration::from_millis(1));
    }
    passed
}

/// A replica of `qps(20 000)` (with `limit_per(60 s, 1 000 000)` when
/// `windows`). The server's clock cuts the buckets (leases need it); the
/// layer's own windows follow the test's.
async fn hot_replica(server: &RedisServer, clock: &ManualClock, windows: bool) -> Replica {
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .timeout(Duration::from_secs(10));
    let layer = SlidingWindowLayer::qps(20_000);
    let layer = if windows {
        layer.limit_per(MINUTE, 1_000_000)
    } else {
        layer
    };
    Replica::new(
        layer
            .key(PathKey)
            .clock(clock.clone())
            .store(store)
            .on_store_error(StoreFailure::Deny),
    )
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_with_further_windows_never_leases_one_call_per_admission() {
    let server = RedisServer::start();
    let clock = ManualClock::new(30_000_000);
    // The same load leases on a layer of one window...
    let single = hot_replica(&server, &clock, false).await;
    assert_eq!(hot_load(&single, &clock, 100).await, 3_000);
    let status = single.stats.store_status().expect("a store");
    assert!(status.leased > 0, "{status:?}");
    assert!(status.round_trips < 3_000, "{status:?}");

    // ...and never with further windows: one script call per request.
    let several = hot_replica(&server, &clock, true).await;
    assert_eq!(hot_load(&several, &clock, 100).await, 3_000);
    let status = several.stats.store_status().expect("a store");
    assert_eq!(
        (status.leased, status.lease_spent, status.stranded),
        (0, 0, 0),
        "{status:?}"
    );
    assert_eq!(
        (status.round_trips, status.admitted, status.answered_locally),
        (3_000, 3_000, 0),
        "{status:?}"
    );
    let windows = several.stats.windows("/hot").expect("seen");
    assert_eq!(windows[1].pass, 3_000);
}

#[cfg(feature = "redis-cluster")]
#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_window_of_a_key_is_in_one_slot_of_a_cluster() {
    use redis_server::RedisCluster;

    let cluster = RedisCluster::start(3);
    let t0 = 60_000_000;
    let clock = ManualClock::new(t0);
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::connect_cluster(cluster.urls())
            .await
            .expect("connect to the cluster")
            .clock(clock.clone())
            .timeout(Duration::from_secs(2))
            .probe_interval(Duration::from_millis(50));
        let layer = SlidingWindowLayer::qps(10)
            .limit_per(MINUTE, 15)
            .key(PathKey)
            .clock(clock.clone())
            .store(store)
            .on_store_error(StoreFailure::Deny);
        replicas.push(Replica::new(layer));
    }
    // 20 keys, each decided in one call on the primary of its slot (a call
    // naming keys of two slots would fail, and Deny would refuse).
    for key in 0..20 {
        assert_eq!(
            burst(&replicas, &format!("/k{key}"), 15).await,
            10,
            "/k{key}"
        );
    }
    clock.advance(Duration::from_secs(1));
    for key in 0..20 {
        assert_eq!(
            burst(&replicas, &format!("/k{key}"), 15).await,
            5,
            "/k{key}"
        );
    }
    // Both windows of each key on one primary, and the keys spread.
    let urls = cluster.urls();
    let mut per_node = Vec::new();
    let mut all = Vec::new();
    for i in cluster.primaries() {
        let mut conn = redis_server::raw(&urls[i]).await;
        let names = names(&mut conn).await;
        per_node.push(names.len());
        for name in &names {
            if let Some(second) = name.strip_suffix("/60000ms") {
                assert!(names.contains(&second.to_owned()), "{name} on node {i}");
                assert_eq!(buckets(&mut conn, name).await, BTreeMap::from([(t0, 15)]));
            }
        }
        all.extend(names);
    }
    assert_eq!(all.len(), 40, "two windows per key: {all:?}");
    assert!(per_node.iter().all(|&n| n > 0), "{per_node:?}");
    for replica in &replicas {
        let status = replica.stats.store_status().expect("a store");
        assert_eq!((status.mode, status.failures), (StoreMode::Remote, 0));
    }
}
