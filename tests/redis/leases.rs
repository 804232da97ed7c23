//! Leases of hot keys against a real `redis-server`: several replicas
//! (independent stores, one connection each) share one manual clock, so
//! every admission has an exact time and every bucket-aligned window can
//! be counted.
//!
//! `cargo test --all-features --test redis leases -- --include-ignored`

#![cfg(feature = "redis")]

use crate::redis_server;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use redis_server::RedisServer;
use tower_sliding_window::clock::{Clock, ManualClock};
use tower_sliding_window::store::{RedisStore, StoreStatus};

/// `n` stores sharing `clock`, on the default window (10 buckets of
/// 100 ms).
async fn replicas(server: &RedisServer, n: usize, clock: &ManualClock) -> Vec<RedisStore> {
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

/// Runs `ms` rounds of 1 ms on the manual clock; in each, every replica
/// admits `per_ms` requests of `key` at once. Returns the passes per
/// clock ms.
async fn overload(
    stores: &[RedisStore],
    clock: &ManualClock,
    key: &str,
    limit: u64,
    (per_ms, ms): (usize, u64),
) -> BTreeMap<u64, u64> {
    let mut passes = BTreeMap::new();
    for _ in 0..ms {
        let now = clock.now_millis();
        let mut tasks = tokio::task::JoinSet::new();
        for store in stores {
            for _ in 0..per_ms {
                let (store, key) = (store.clone(), key.to_owned());
                tasks.spawn(async move { store.admit(&key, limit).await });
            }
        }
        while let Some(verdict) = tasks.join_next().await {
            let verdict = verdict.expect("no panic").expect("redis answers");
            if verdict.passed {
                *passes.entry(now).or_insert(0) += 1;
            }
        }
        clock.advance(Duration::from_millis(1));
    }
    passes
}

/// The most passes in any `buckets` consecutive buckets of `bucket_ms`.
fn busiest(passes: &BTreeMap<u64, u64>, bucket_ms: u64, buckets: u64) -> u64 {
    let mut per_bucket: BTreeMap<u64, u64> = BTreeMap::new();
    for (&at, &n) in passes {
        *per_bucket.entry(at / bucket_ms).or_default() += n;
    }
    per_bucket
        .keys()
        .map(|&first| {
            per_bucket
                .range(first..first + buckets)
                .map(|(_, n)| n)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server"]
async fn three_replicas_leasing_a_hot_key_never_pass_the_limit_and_admit_nearly_all_of_it() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_000_000);
    let stores = replicas(&server, 3, &clock).await;
    // 20 000 a window of 1 s; 3 x 10 requests every ms: 1.5 x the limit.
    let limit = 20_000;
    let passes = overload(&stores, &clock, "/hot", limit, (10, 3_000)).await;

    let worst = busiest(&passes, 100, 10);
    assert!(
        worst <= limit,
        "{worst} passes in one window, limit {limit}"
    );
    // After the first second, each window of 10 buckets admits at least
    // 95 % of the limit.
    let steady: u64 = passes.range(1_001_000..).map(|(_, n)| n).sum();
    assert!(
        steady as f64 >= 0.95 * 2.0 * limit as f64,
        "{steady} passes over the last two windows, limit {limit}"
    );

    let mut leased = 0;
    let (mut round_trips, mut admitted) = (0, 0);
    for store in &stores {
        let status = store.status();
        leased += status.leased;
        round_trips += status.round_trips;
        admitted += status.admitted;
        assert!(status.lease_spent <= status.leased);
    }
    let total: u64 = passes.values().sum();
    assert_eq!(admitted, total, "every pass is counted once");
    assert!(leased > 0, "the hot key leased");
    assert!(
        (round_trips as f64) < 0.25 * admitted as f64,
        "{round_trips} round trips for {admitted} admissions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server"]
async fn a_key_seen_once_a_second_costs_one_call_per_request_and_never_leases() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_000_000);
    let stores = replicas(&server, 1, &clock).await;
    for _ in 0..20 {
        let verdict = stores[0].admit("/cold", 1_000_000).await.expect("answers");
        assert!(verdict.passed && !verdict.answered_locally);
        clock.advance(Duration::from_secs(1));
    }
    let status = stores[0].status();
    assert_eq!((status.round_trips, status.admitted), (20, 20));
    assert_eq!(
        (status.leased, status.lease_spent, status.stranded),
        (0, 0, 0)
    );
    assert_eq!(status.round_trips_per_admission(), Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server"]
async fn passes_leased_and_not_spent_stay_counted_until_their_bucket_leaves() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_000_000);
    let stores = replicas(&server, 2, &clock).await;
    let limit = 20_000;
    // 200 ms of demand on the first replica makes the key hot there.
    let hot = overload(&stores[..1], &clock, "/stop", limit, (20, 200)).await;
    // Refills run in the background: let the last ones land.
    settle(|| stores[0].status()).await;
    let status = stores[0].status();
    assert!(status.leased > 0, "the key leased");
    let unspent = status.leased - status.lease_spent - status.stranded;
    assert!(unspent > 0, "demand stopped with passes in the pool");
    let admitted_hot: u64 = hot.values().sum();
    // Demand stops: the pool's passes are not spent, and nobody gets them
    // back in this window. The other replica can take only what is left.
    clock.advance(Duration::from_millis(150));
    let other = overload(&stores[1..], &clock, "/stop", limit, (200, 100)).await;
    let admitted_other: u64 = other.values().sum();
    assert!(
        admitted_hot + admitted_other + unspent <= limit,
        "{admitted_hot} + {admitted_other} passed, {unspent} unspent, limit {limit}"
    );
    // The first replica counts them as stranded once it sees their bucket
    // is over.
    stores[0].admit("/stop", limit).await.expect("answers");
    let after = stores[0].status();
    assert_eq!(after.stranded, status.stranded + unspent);
    assert_eq!(
        after.leased, status.leased,
        "a key gone cold does not lease"
    );
}

/// A layered service answering 200 or the layer's refusal.
type Service = tower::util::BoxCloneSyncService<
    http::Request<String>,
    http::Response<http_body_util::Full<bytes::Bytes>>,
    std::convert::Infallible,
>;

/// A layer with a store on the manual clock: its service and handle.
fn layer_with_store(
    store: RedisStore,
    clock: &ManualClock,
    limit: u64,
) -> (Service, tower_sliding_window::StatsHandle<()>) {
    let layer = tower_sliding_window::SlidingWindowLayer::qps(limit)
        .clock(clock.clone())
        .store(store.clock(clock.clone()));
    let handle = layer.handle();
    let inner = tower::service_fn(|_: http::Request<String>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(
            http_body_util::Full::<bytes::Bytes>::default(),
        ))
    });
    let service = tower::util::BoxCloneSyncService::new(tower::Layer::layer(&layer, inner));
    (service, handle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs redis-server"]
async fn a_layer_spends_leased_passes_within_its_own_window_and_reports_them() {
    use tower::ServiceExt;

    let server = RedisServer::start();
    let clock = ManualClock::new(1_000_000);
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .timeout(Duration::from_secs(10));
    let limit = 20_000;
    let (service, handle) = layer_with_store(store, &clock, limit);
    let mut passes = BTreeMap::new();
    // 30 requests every ms for 1.5 s: 1.5 x the limit.
    for _ in 0..1_500 {
        let now = clock.now_millis();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..30 {
            let service = service.clone();
            tasks.spawn(async move {
                let response = service
                    .oneshot(http::Request::new(String::new()))
                    .await
                    .unwrap_or_else(|never| match never {});
                response.status() == http::StatusCode::OK
            });
        }
        while let Some(passed) = tasks.join_next().await {
            if passed.expect("no panic") {
                *passes.entry(now).or_insert(0u64) += 1;
            }
        }
        clock.advance(Duration::from_millis(1));
    }
    let worst = busiest(&passes, 100, 10);
    assert!(
        worst <= limit,
        "{worst} passes in one window, limit {limit}"
    );
    // Let the last refills land, so that the counts hold still.
    settle(|| handle.store_status().expect("a store")).await;
    let status = handle.store_status().expect("a store");
    assert!(status.lease_spent > 0, "the layer spent leased passes");
    let admitted: u64 = passes.values().sum();
    // Every admission went through the store; a leased pass the layer's
    // own window refused is spent but not admitted.
    assert!(status.admitted >= admitted, "{status:?} vs {admitted}");
    let per_admission = status.round_trips_per_admission().expect("admissions");
    assert!(
        per_admission < 0.25,
        "{per_admission} round trips per admission"
    );

    #[cfg(feature = "prometheus")]
    {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(handle.collector()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        let status = handle.store_status().expect("a store");
        for (name, value) in [
            ("sliding_window_store_round_trips_total", status.round_trips),
            ("sliding_window_store_admitted_total", status.admitted),
            ("sliding_window_store_leased_total", status.leased),
            ("sliding_window_store_lease_spent_total", status.lease_spent),
            ("sliding_window_store_stranded_total", status.stranded),
            ("sliding_window_store_fallback", 0),
        ] {
            let line = format!("{name} {value}\n");
            assert!(text.contains(&line), "{line:?} missing from\n{text}");
        }
    }
}

// One thread: the connection's task cannot answer between the one poll
// and the drop.
#[tokio::test(flavor = "current_thread")]
#[ignore = "needs redis-server"]
async fn a_request_dropped_during_its_call_leaves_no_one_waiting_for_it() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .timeout(Duration::from_secs(3));
    for limit in [10, 100_000] {
        // Polled until it waits for Redis, then dropped (a client that
        // went away, a timeout layer above).
        let mut dropped = Box::pin(store.admit("/gone", limit));
        let ready =
            std::future::poll_fn(|cx| std::task::Poll::Ready(dropped.as_mut().poll(cx).is_ready()))
                .await;
        assert!(!ready, "Redis cannot have answered yet");
        drop(dropped);
        let started = std::time::Instant::now();
        let verdict = store.admit("/gone", limit).await.expect("answers");
        assert!(verdict.passed);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the next request waited {:?} for a call that was dropped",
            started.elapsed()
        );
    }
}

/// Waits until a store's counts hold still: its round trips and leases the
/// same over three reads 100 ms apart (a refill in flight moves them), for
/// at most 10 s. A fixed 200 ms was not always enough on a loaded machine.
async fn settle(status: impl Fn() -> StoreStatus) {
    let counts = || {
        let s = status();
        (s.round_trips, s.leased, s.lease_spent, s.stranded)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (mut last, mut still) = (counts(), 0);
    while still < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the store never settled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = counts();
        still = if now == last { still + 1 } else { 0 };
        last = now;
    }
}
