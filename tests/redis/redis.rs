//! The Redis store against a real `redis-server` (feature `redis`): each
//! test starts its own server on a free loopback port and stops it.
//!
//! `cargo test --features redis --test redis`

#![cfg(feature = "redis")]

use crate::redis_server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis_server::{raw, RedisServer};
use tower_sliding_window::clock::{Clock, ManualClock};
use tower_sliding_window::store::{
    KeyBytes, RedisStore, StoreError, StoreErrorKind, StoreKey, StoreMode, Verdict,
};

/// Connects `n` independent stores (one connection each) sharing `clock`,
/// with a timeout that only a dead server reaches (these tests are about
/// counts, on a machine that may be busy).
async fn stores(server: &RedisServer, n: usize, clock: &ManualClock) -> Vec<RedisStore> {
    let mut stores = Vec::new();
    for _ in 0..n {
        let store = RedisStore::connect(&server.url())
            .await
            .expect("connect")
            .timeout(Duration::from_secs(10))
            .clock(clock.clone());
        stores.push(store);
    }
    stores
}

/// Fires `per_store` concurrent admissions of `key` at `limit` through each
/// store; returns every verdict.
async fn burst(stores: &[RedisStore], key: &str, limit: u64, per_store: usize) -> Vec<Verdict> {
    let mut tasks = Vec::new();
    for store in stores {
        for _ in 0..per_store {
            let store = store.clone();
            let key = key.to_owned();
            tasks.push(tokio::spawn(async move {
                store.admit(&key, limit).await.expect("redis answers")
            }));
        }
    }
    let mut verdicts = Vec::new();
    for task in tasks {
        verdicts.push(task.await.expect("no panic"));
    }
    verdicts
}

fn passes(verdicts: &[Verdict]) -> u64 {
    verdicts.iter().filter(|v| v.passed).count() as u64
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_stores_admit_exactly_the_limit_in_every_window() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_000_000);
    let stores = stores(&server, 3, &clock).await;
    let limit = 40;
    // 5x overload, from three stores at once, in each of 6 windows; the
    // clock jumps a whole window between bursts, so each burst is one
    // bucket-aligned window.
    for window in 0..6 {
        let verdicts = burst(&stores, "/search", limit, (limit as usize * 5).div_ceil(3)).await;
        assert_eq!(
            passes(&verdicts),
            limit,
            "window {window} at {} ms",
            clock.now_millis()
        );
        let top = verdicts.iter().map(|v| v.window_pass).max();
        assert_eq!(top, Some(limit), "the last pass fills the window");
        clock.advance(Duration::from_secs(1));
    }
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_server_clock_no_pass_ever_sees_more_than_the_limit() {
    let server = RedisServer::start();
    let mut stores = Vec::new();
    for _ in 0..3 {
        let store = RedisStore::connect(&server.url())
            .await
            .expect("connect")
            .timeout(Duration::from_secs(10))
            .window(Duration::from_millis(200), 4);
        stores.push(store);
    }
    let limit = 10;
    let passed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for store in &stores {
        for _ in 0..4 {
            let (store, passed) = (store.clone(), Arc::clone(&passed));
            tasks.push(tokio::spawn(async move {
                let mut seen = Vec::new();
                let until = Instant::now() + Duration::from_millis(600);
                while Instant::now() < until {
                    let verdict = store.admit("k", limit).await.expect("redis answers");
                    if verdict.passed {
                        passed.fetch_add(1, Ordering::Relaxed);
                        seen.push(verdict.window_pass);
                    } else {
                        // Refused keys are answered locally until their
                        // wait is over; do not spin on them.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
                seen
            }));
        }
    }
    let mut seen = Vec::new();
    for task in tasks {
        seen.extend(task.await.expect("no panic"));
    }
    assert!(
        seen.iter().all(|&w| (1..=limit).contains(&w)),
        "window passes seen by passes: {seen:?}"
    );
    assert!(seen.contains(&limit), "overload fills a window: {seen:?}");
    // 600 ms is at most 4 windows of 200 ms started (one partly before).
    assert!(passed.load(Ordering::Relaxed) <= 4 * limit);
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_limits_are_kept_apart() {
    let server = RedisServer::start();
    let clock = ManualClock::new(50_000);
    let stores = stores(&server, 3, &clock).await;
    let login = burst(&stores, "/login", 3, 10).await;
    let search = burst(&stores, "/search", 25, 10).await;
    assert_eq!(passes(&login), 3);
    assert_eq!(passes(&search), 25);
    assert!(login.iter().all(|v| v.limit == 3));
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_limit_on_one_store_reaches_every_replica() {
    let server = RedisServer::start();
    let clock = ManualClock::new(70_000);
    let stores = stores(&server, 3, &clock).await;
    stores[0].set_limit("/export", 4).await.expect("set");
    // The other replicas pass their own limit (100): the shared one wins.
    let verdicts = burst(&stores[1..], "/export", 100, 20).await;
    assert_eq!(passes(&verdicts), 4);
    assert!(verdicts.iter().all(|v| v.limit == 4));

    // Removing it gives every replica its own limit back.
    assert!(stores[2].remove_limit("/export").await.expect("remove"));
    assert!(!stores[2].remove_limit("/export").await.expect("remove"));
    clock.advance(Duration::from_secs(1));
    let verdicts = burst(&stores, "/export", 9, 10).await;
    assert_eq!(passes(&verdicts), 9);

    // The shared limit expires: it carries a TTL.
    stores[1].set_limit("/other", 1).await.expect("set");
    let mut conn = raw(&server.url()).await;
    let keys: Vec<String> = conn.keys("tsw:*:limit").await.expect("keys");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let ttl: i64 = conn.pttl(&keys[0]).await.expect("pttl");
    assert!(ttl > 0, "the shared limit expires: {ttl}");
}

/// `calls=` of one command in `INFO commandstats`, 0 if never called.
async fn calls(conn: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("info");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count"))
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_keys_are_refused_without_a_round_trip() {
    let server = RedisServer::start();
    let clock = ManualClock::new(90_050);
    let store = stores(&server, 1, &clock).await.remove(0);
    let mut conn = raw(&server.url()).await;
    for _ in 0..5 {
        assert!(store.admit("k", 5).await.expect("redis").passed);
    }
    let refused = store.admit("k", 5).await.expect("redis");
    assert!(!refused.passed && !refused.answered_locally);
    // Every pass was at 90 050, in the bucket [90 000, 90 100): it leaves
    // the window at 91 000, 950 ms from now.
    assert_eq!(refused.retry_after, Some(Duration::from_millis(950)));

    let before = (
        calls(&mut conn, "evalsha").await,
        store.status().round_trips,
    );
    for step in 0..50 {
        clock.advance(Duration::from_millis(18));
        let verdict = store.admit("k", 5).await.expect("redis");
        assert!(!verdict.passed, "step {step} at {} ms", clock.now_millis());
        assert!(verdict.answered_locally);
        assert_eq!(verdict.window_pass, 5);
    }
    let after = (
        calls(&mut conn, "evalsha").await,
        store.status().round_trips,
    );
    assert_eq!(
        before, after,
        "no round trip while the key is known blocked"
    );
    assert_eq!(store.status().answered_locally, 50);

    // Once the wait is over, Redis is asked again, and the key passes.
    clock.set(91_000);
    let verdict = store.admit("k", 5).await.expect("redis");
    assert!(verdict.passed && !verdict.answered_locally);
    assert_eq!(calls(&mut conn, "evalsha").await, after.0 + 1);
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_counts_the_bucket_that_just_left() {
    let server = RedisServer::start();
    let clock = ManualClock::new(950);
    let store = stores(&server, 1, &clock).await.remove(0).strict();
    for _ in 0..10 {
        assert!(store.admit("k", 10).await.expect("redis").passed);
    }
    clock.set(1_950);
    let refused = store.admit("k", 10).await.expect("redis");
    assert!(!refused.passed, "[950, 1950) is one second");
    // The passes reported are the window's (without the extra bucket).
    assert_eq!(refused.window_pass, 0);
    clock.set(2_000);
    assert!(store.admit("k", 10).await.expect("redis").passed);
}

/// What became of each request.
#[derive(Debug, Default)]
struct Tally {
    verdicts: u64,
    unavailable: u64,
    failed: u64,
}

impl Tally {
    fn add(&mut self, result: Result<Verdict, StoreError>) {
        match result {
            Ok(_) => self.verdicts += 1,
            Err(err) if err.kind() == StoreErrorKind::Unavailable => self.unavailable += 1,
            Err(_) => self.failed += 1,
        }
    }
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_falls_back_and_a_restarted_one_is_used_again() {
    let mut server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .timeout(Duration::from_millis(200))
        .probe_interval(Duration::from_millis(50));
    let mut tally = Tally::default();
    for _ in 0..20 {
        tally.add(store.admit("k", 1_000).await);
    }
    assert_eq!(store.status().mode, StoreMode::Remote);

    server.kill();
    let mut slowest = Duration::ZERO;
    for _ in 0..200 {
        let started = Instant::now();
        tally.add(store.admit("k", 1_000).await);
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let down = store.status();
    assert_eq!(down.mode, StoreMode::Fallback);
    assert_eq!(down.outages, 1, "one switch, however many requests");
    assert!(
        down.failures >= 1 && down.fallbacks > down.failures,
        "{down:?}"
    );
    // Bounded by the timeout (200 ms), far below what an unbounded wait on
    // a dead server would take; the margin is for a loaded machine.
    assert!(slowest < Duration::from_secs(2), "slowest {slowest:?}");

    server.restart();
    let mut recovered = false;
    for _ in 0..400 {
        let result = store.admit("k", 1_000).await;
        let ok = result.is_ok();
        tally.add(result);
        if ok {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(recovered, "{:?}", store.status());
    let up = store.status();
    assert_eq!(up.mode, StoreMode::Remote);
    assert_eq!(up.outages, 1);
    // Every request is accounted for exactly once.
    assert_eq!(up.failures, tally.failed);
    assert_eq!(up.fallbacks, tally.unavailable);
    assert_eq!(up.round_trips, tally.verdicts + tally.failed);
    // The script was loaded again after the restart (NOSCRIPT).
    assert!(store.admit("k", 1_000).await.expect("redis").passed);
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_server_is_bounded_by_the_timeout() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .timeout(Duration::from_millis(100));
    assert!(store.admit("k", 5).await.expect("redis").passed);
    let url = server.url();
    let sleeper = tokio::spawn(async move {
        let mut conn = raw(&url).await;
        let _: redis::RedisResult<()> = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(2)
            .query_async(&mut conn)
            .await;
    });
    // Until the server sleeps: a PING on a connection of its own goes
    // unanswered. (A fixed 200 ms was not always long enough on a loaded
    // machine for the sleeper to connect and send its command.)
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let probe = tokio::time::timeout(Duration::from_millis(50), async {
            let mut conn = raw(&server.url()).await;
            let _: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut conn).await;
        })
        .await;
        if probe.is_err() {
            break;
        }
        assert!(Instant::now() < deadline, "the server never slept");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    let err = store.admit("k", 5).await.expect_err("redis is asleep");
    let took = started.elapsed();
    assert_eq!(err.kind(), StoreErrorKind::Timeout, "{err}");
    assert!(took < Duration::from_millis(1500), "took {took:?}");
    assert_eq!(store.status().mode, StoreMode::Fallback);
    sleeper.await.expect("no panic");
    // Awake again: the next probe succeeds.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(store.admit("k", 5).await.expect("awake").passed);
    assert_eq!(store.status().mode, StoreMode::Remote);
}

/// A key of raw bytes, valid UTF-8 or not.
struct Bytes(Vec<u8>);

impl StoreKey for Bytes {
    fn write_bytes(&self, out: &mut KeyBytes) {
        out.tag(9);
        out.write(&(self.0.len() as u64).to_le_bytes());
        out.write(&self.0);
    }
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_cost_redis_short_names_that_all_expire() {
    let server = RedisServer::start();
    let clock = ManualClock::new(5_000);
    // A long window, so that no key expires while the test looks.
    let store = stores(&server, 1, &clock)
        .await
        .remove(0)
        .prefix("hostile:")
        .window(Duration::from_secs(60), 10);
    // A 4 MiB key, invalid UTF-8, and a flood of distinct keys.
    let huge = "x".repeat(4 << 20);
    assert!(store.admit(huge.as_str(), 1).await.expect("redis").passed);
    assert!(!store.admit(huge.as_str(), 1).await.expect("redis").passed);
    let invalid = Bytes(vec![0xff, 0xfe, b'{', 0, b'}', 0xc3]);
    assert!(store.admit(&invalid, 1).await.expect("redis").passed);
    assert!(!store.admit(&invalid, 1).await.expect("redis").passed);
    let flood = 3_000;
    for i in 0..flood {
        store.admit(&format!("flood-{i}"), 1).await.expect("redis");
    }

    let mut conn = raw(&server.url()).await;
    let mut cursor = 0u64;
    let mut names = Vec::new();
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("scan");
        names.extend(batch);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    assert_eq!(names.len(), flood + 2, "one hash per key");
    for name in &names {
        let text = std::str::from_utf8(name).expect("names are ASCII");
        // `hostile:{<64 hex digits>}:6000x10`: the SHA-256 digest, and the
        // window's shape (10 buckets of 6 s).
        let digest = text
            .strip_prefix("hostile:{")
            .and_then(|rest| rest.strip_suffix("}:6000x10"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(
            digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
            "{text}"
        );
        let ttl: i64 = conn.pttl(name).await.expect("pttl");
        // Two windows at most.
        assert!((1..=120_000).contains(&ttl), "{text} has PTTL {ttl}");
    }
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_redis_is_an_error_never_a_panic() {
    let server = RedisServer::start();
    let clock = ManualClock::new(5_000);
    let store = stores(&server, 1, &clock)
        .await
        .remove(0)
        .probe_interval(Duration::from_millis(1));
    assert!(store.admit("k", 3).await.expect("redis").passed);
    let mut conn = raw(&server.url()).await;
    let keys: Vec<String> = conn.keys("tsw:*").await.expect("keys");
    let [window] = &keys[..] else {
        panic!("one key expected: {keys:?}")
    };
    // Fields the script did not write are dropped, not counted.
    let _: () = conn.hset(window, "not-a-bucket", "x").await.expect("hset");
    let _: () = conn.hset(window, "5000", "many").await.expect("hset");
    let verdict = store.admit("k", 3).await.expect("garbage dropped");
    assert!(verdict.passed);
    assert_eq!(verdict.window_pass, 1);
    // A shared limit that is not a whole number is ignored.
    for limit in ["lots", "inf", "1e400", "-5", "nan", "2.5"] {
        let _: () = conn
            .set(format!("{window}:limit"), limit)
            .await
            .expect("set");
        assert_eq!(
            store.admit("k", 3).await.expect("redis").limit,
            3,
            "{limit}"
        );
    }
    let _: () = conn.del(format!("{window}:limit")).await.expect("del");
    // A new window: the key is no longer known to be blocked.
    clock.advance(Duration::from_secs(1));
    // A key of the wrong type: this key's error, counted, and the store
    // stays in Redis for the others.
    let _: () = conn.del(window).await.expect("del");
    let _: () = conn.set(window, "a string").await.expect("set");
    let err = store.admit("k", 3).await.expect_err("wrong type");
    assert_eq!(err.kind(), StoreErrorKind::KeyData, "{err}");
    let status = store.status();
    assert_eq!(
        (status.mode, status.failures, status.key_errors),
        (StoreMode::Remote, 0, 1),
        "{status:?}"
    );
    assert!(store.admit("other", 3).await.expect("another key").passed);
    // A limit of the wrong type is ignored too.
    let _: () = conn.del(window).await.expect("del");
    let _: () = conn
        .hset(format!("{window}:limit"), "a", "b")
        .await
        .expect("hset");
    assert!(store.admit("k", 3).await.expect("repaired").passed);
    assert_eq!(store.status().failures, 0);
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_limit_belongs_to_its_window() {
    let server = RedisServer::start();
    let clock = ManualClock::new(8_000);
    let per_second = stores(&server, 1, &clock).await.remove(0);
    let per_minute = per_second.clone().window(Duration::from_secs(60), 60);
    per_minute.set_limit("/report", 2).await.expect("set");
    // The per-second window keeps its own limit, and its own passes.
    for _ in 0..5 {
        assert!(per_second.admit("/report", 5).await.expect("redis").passed);
    }
    assert!(!per_second.admit("/report", 5).await.expect("redis").passed);
    let minute: Vec<bool> = {
        let mut passed = Vec::new();
        for _ in 0..3 {
            passed.push(
                per_minute
                    .admit("/report", 100)
                    .await
                    .expect("redis")
                    .passed,
            );
        }
        passed
    };
    assert_eq!(minute, [true, true, false]);
    // Strict is part of the shape too.
    let strict = per_second.clone().strict();
    assert_eq!(
        strict.admit("/report", 5).await.expect("redis").window_pass,
        1
    );
    assert!(per_minute.remove_limit("/report").await.expect("remove"));
    assert!(!per_second.remove_limit("/report").await.expect("remove"));
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_server_is_refused_unless_allowed() {
    let server =
        RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]);
    let mut conn = raw(&server.url()).await;
    for policy in [
        "allkeys-lru",
        "allkeys-lfu",
        "allkeys-random",
        "volatile-lru",
        "volatile-ttl",
    ] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg(policy)
            .query_async(&mut conn)
            .await
            .expect("config set");
        let clock = ManualClock::new(9_000);
        let store = stores(&server, 1, &clock)
            .await
            .remove(0)
            .probe_interval(Duration::from_millis(50));
        let status = store.status();
        assert!(status.evicting, "{policy}: {status:?}");
        assert_eq!(status.mode, StoreMode::Fallback, "{policy}");
        // The first request probes (and is told the policy again), the
        // others are answered by the failure policy at once.
        let err = store.admit("k", 5).await.expect_err("refused");
        assert_eq!(err.kind(), StoreErrorKind::Evicting, "{policy}: {err}");
        assert!(err.to_string().contains(policy), "{err}");
        let err = store.admit("k", 5).await.expect_err("refused");
        assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{policy}: {err}");
        assert_eq!(store.status().fallbacks, 2);

        // Allowed: decided in Redis, and still reported.
        let allowed = store.clone().allow_evicting_server();
        assert!(allowed.admit("k", 5).await.expect("allowed").passed);
        let status = allowed.status();
        assert_eq!((status.mode, status.evicting), (StoreMode::Remote, true));
    }
    let keys: Vec<String> = conn.keys("tsw:*").await.expect("keys");
    assert_eq!(keys.len(), 1, "only the allowed stores wrote: {keys:?}");

    // Set to noeviction: the next probe reads it, and the store is back.
    let clock = ManualClock::new(9_000);
    let store = stores(&server, 1, &clock)
        .await
        .remove(0)
        .probe_interval(Duration::from_millis(50));
    assert!(store.admit("after", 5).await.is_err());
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query_async(&mut conn)
        .await
        .expect("config set");
    assert!(
        store.admit("after", 5).await.is_err(),
        "until the next probe"
    );
    clock.advance(Duration::from_millis(50));
    assert!(store.admit("after", 5).await.expect("trusted again").passed);
    let status = store.status();
    assert_eq!((status.mode, status.evicting), (StoreMode::Remote, false));
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_lazy_refuses_only_a_bad_url() {
    let err = RedisStore::connect_lazy("http://127.0.0.1/").expect_err("not redis");
    assert_eq!(err.kind(), StoreErrorKind::InvalidUrl, "{err}");
    // No server on this port: a store anyway, in fallback, that answers
    // at once.
    let nothing = RedisServer::not_started(&[]);
    let store = RedisStore::connect_lazy(&nothing.url())
        .expect("a valid url")
        .timeout(Duration::from_millis(100));
    assert_eq!(store.status().mode, StoreMode::Fallback);
    let started = Instant::now();
    for _ in 0..10 {
        assert!(store.admit("k", 5).await.is_err());
    }
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn connect_lazy_outside_a_runtime_is_an_error() {
    let err = RedisStore::connect_lazy("redis://127.0.0.1:6379/").expect_err("no runtime");
    assert_eq!(err.kind(), StoreErrorKind::Connect);
    assert!(err.to_string().contains("tokio runtime"), "{err}");
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_lazy_to_a_running_server_switches_to_redis_on_its_own() {
    let server = RedisServer::start();
    let store = RedisStore::connect_lazy(&server.url())
        .expect("a valid url")
        .timeout(Duration::from_secs(10));
    // The connection is made in the background, without a request.
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.status().mode != StoreMode::Remote {
        assert!(Instant::now() < deadline, "{:?}", store.status());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The script is loaded by its first call.
    for _ in 0..3 {
        assert!(store.admit("k", 3).await.expect("redis").passed);
    }
    assert!(!store.admit("k", 3).await.expect("redis").passed);
    let status = store.status();
    assert_eq!(
        (status.failures, status.outages, status.evicting),
        (0, 0, false)
    );
}
