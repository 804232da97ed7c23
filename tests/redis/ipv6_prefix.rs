//! A Redis store shares IPv6 clients' limits by their network prefix: the
//! store names a key's window after the key the extractor returns, which
//! is the network address, so every host of a /64 draws on one window in
//! Redis, across replicas.
//!
//! `cargo test --features redis --test redis ipv6_prefix -- --include-ignored`

#![cfg(feature = "redis")]

use crate::redis_server;

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use redis_server::RedisServer;
use tower::ServiceExt;
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::store::{RedisStore, StoreFailure};
use tower_sliding_window::{KeyExtractor, PeerIpKey, SlidingWindowLayer};

/// A replica with its own connection to the store, keyed by `key`.
async fn replica<X>(server: &RedisServer, clock: &ManualClock, limit: u64, key: X) -> Router
where
    X: KeyExtractor<Key = Option<IpAddr>>,
{
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .clock(clock.clone())
        .timeout(Duration::from_secs(10));
    let layer = SlidingWindowLayer::qps(limit)
        .key(key)
        .clock(clock.clone())
        .store(store)
        .on_store_error(StoreFailure::Deny);
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

async fn from(app: &Router, peer: Ipv6Addr) -> StatusCode {
    let mut request = Request::get("/").body(Body::empty()).expect("request");
    request
        .extensions_mut()
        .insert(SocketAddr::new(IpAddr::V6(peer), 443));
    app.clone()
        .oneshot(request)
        .await
        .expect("infallible")
        .status()
}

fn host(network: u128, host: u64) -> Ipv6Addr {
    Ipv6Addr::from(network | u128::from(host))
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_of_one_network_share_one_window_in_redis_across_replicas() {
    let server = RedisServer::start();
    let clock = ManualClock::new(3_000_000);
    let replicas = [
        replica(&server, &clock, 4, PeerIpKey).await,
        replica(&server, &clock, 4, PeerIpKey).await,
    ];
    let network = 0x2001_0db8_0042_0007u128 << 64;

    // 12 hosts of one /64, alternating replicas: 4 pass in all.
    let mut passed = 0;
    for i in 0..12u64 {
        let peer = host(network, 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i + 1));
        match from(&replicas[i as usize % 2], peer).await {
            StatusCode::OK => passed += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(passed, 4, "hosts of one /64 are counted apart in Redis");

    // A host of the next /64 has a window of its own.
    let next = network + (1 << 64);
    assert_eq!(from(&replicas[1], host(next, 1)).await, StatusCode::OK);
}

#[ignore = "needs redis-server"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_address_key_is_its_own_window_in_redis() {
    // With a /128 the store keeps hosts apart, as the extractor does.
    let server = RedisServer::start();
    let clock = ManualClock::new(3_000_000);
    let full = PeerIpKey.ipv6_prefix(128);
    let replicas = [
        replica(&server, &clock, 1, full).await,
        replica(&server, &clock, 1, full).await,
    ];
    let network = 0x2001_0db8_0042_0007u128 << 64;
    for i in 0..6u64 {
        assert_eq!(
            from(&replicas[i as usize % 2], host(network, i + 1)).await,
            StatusCode::OK,
            "host {i}"
        );
    }
    assert_eq!(
        from(&replicas[0], host(network, 1)).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}
