//! Compact layers keyed by the peer's address, whose passes are recorded
//! without the key's group lock when the layer sends no RateLimit fields
//! on passes: the same answers as a full layer (a differential property
//! test), and exactly the limit per client under real threads, with a
//! frozen clock and with clients turning over the table between bursts.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use proptest::prelude::*;
use tower::{Layer, Service};
use tower_sliding_window::clock::{Clock, ManualClock};
use tower_sliding_window::{PeerIpKey, SlidingWindowLayer, Snapshot};

use super::compact::inner;

/// Sends one request from `peer` (`None`: no peer address) through
/// `service` outside any runtime (nothing waits): its status and headers,
/// sorted, with every policy tag (a keyed hash, random per layer) masked.
fn call<S, B>(service: &mut S, peer: Option<IpAddr>) -> (StatusCode, Vec<(String, String)>)
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let mut request = Request::get("/").body(Body::empty()).unwrap();
    if let Some(ip) = peer {
        request.extensions_mut().insert(SocketAddr::new(ip, 40_000));
    }
    let response = tokio_test::block_on(service.call(request)).unwrap();
    let mut headers: Vec<(String, String)> = response
        .headers()
        .iter()
        .map(|(name, value)| {
            let value = value.to_str().unwrap();
            let masked = match value.find("p-") {
                Some(at) if value.len() >= at + 10 => {
                    format!("{}p-TAG{}", &value[..at], &value[at + 10..])
                }
                _ => value.to_owned(),
            };
            (name.as_str().to_owned(), masked)
        })
        .collect();
    headers.sort();
    (response.status(), headers)
}

/// The clients of the property test: IPv4 ones, an IPv4-mapped one (the
/// same client as 10.0.0.1), two in one IPv6 /64 (one client), one in
/// another /64, and a request with no peer.
fn peers() -> [Option<IpAddr>; 7] {
    let v6 = |low: u16, net: u16| {
        Some(IpAddr::V6(Ipv6Addr::new(
            0x2001, 0xdb8, 0, net, 0, 0, 0, low,
        )))
    };
    [
        Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))),
        Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))),
        Some(IpAddr::V6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped())),
        v6(1, 7),
        v6(2, 7),
        v6(1, 8),
        None,
    ]
}

#[derive(Debug, Clone)]
enum Action {
    Request(usize),
    /// The client's own limit, through both handles.
    SetLimit(usize, u64),
    RemoveLimit(usize),
}

fn actions() -> impl Strategy<Value = Vec<(i64, Action)>> {
    let action = prop_oneof![
        12 => (0usize..7).prop_map(Action::Request),
        1 => (0usize..6, 0u64..6).prop_map(|(peer, limit)| Action::SetLimit(peer, limit)),
        1 => (0usize..6).prop_map(Action::RemoveLimit),
    ];
    // Mostly small steps forward; now and then a window or more, or back.
    let step = prop_oneof![
        8 => 0i64..30,
        2 => 30i64..1_500,
        1 => -300i64..0,
    ];
    prop::collection::vec((step, action), 1..120)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// One random sequence of clients, clock readings and limit changes
    /// through a full layer and a compact one keyed by the peer's address,
    /// with no RateLimit fields on passes (so that a compact pass is
    /// recorded without the lock): the same status and headers for every
    /// request and the same counts at the end. Neither evicts.
    #[test]
    fn a_compact_peer_layer_answers_exactly_as_a_full_layer(
        limit in 1u64..6,
        strict in any::<bool>(),
        (sample_count, bucket_ms) in (prop::sample::select(vec![1usize, 2, 5, 10]), prop::sample::select(vec![10u64, 100])),
        start in 0u64..5_000,
        steps in actions(),
    ) {
        let clock = ManualClock::new(start);
        let interval = Duration::from_millis(sample_count as u64 * bucket_ms);
        let configure = |layer: SlidingWindowLayer<PeerIpKey>| {
            let layer = layer
                .window(interval, sample_count)
                .clock(clock.clone())
                .policy_name("p");
            if strict { layer.strict() } else { layer }
        };
        let full = configure(SlidingWindowLayer::qps(limit).key(PeerIpKey));
        let compact = configure(SlidingWindowLayer::qps(limit).key(PeerIpKey)).compact();
        let (full_stats, compact_stats) = (full.handle(), compact.handle());
        let mut full = full.layer(inner());
        let mut compact = compact.layer(inner());
        let peers = peers();
        for (i, (step_ms, action)) in steps.iter().enumerate() {
            let now = clock.now_millis();
            clock.set(now.saturating_add_signed(*step_ms));
            match *action {
                Action::Request(peer) => {
                    let expected = call(&mut full, peers[peer]);
                    let got = call(&mut compact, peers[peer]);
                    prop_assert_eq!(&got, &expected, "request {} from {:?}", i, peers[peer]);
                }
                Action::SetLimit(peer, limit) => {
                    let key = PeerIpKey.key_of(peers[peer].unwrap());
                    full_stats.set_limit(Some(key), limit);
                    compact_stats.set_limit(Some(key), limit);
                }
                Action::RemoveLimit(peer) => {
                    let key = PeerIpKey.key_of(peers[peer].unwrap());
                    prop_assert_eq!(
                        compact_stats.remove_limit(&Some(key)),
                        full_stats.remove_limit(&Some(key))
                    );
                }
            }
        }
        let now = clock.now_millis();
        for peer in peers {
            let key = peer.map(|ip| PeerIpKey.key_of(ip));
            let full = full_stats.snapshot(&key).map(|s| (s.pass, s.limit));
            let compact = compact_stats.snapshot(&key).map(|s| (s.pass, s.limit));
            prop_assert_eq!(compact, full, "{:?} at {}", key, now);
        }
    }
}

/// A compact layer keyed by the peer's address, on a frozen clock: four
/// threads send 40 rounds of a request from each of eight clients; each
/// client passes exactly `limit` times, and the handle counts the rest as
/// blocked.
#[test]
fn frozen_clock_real_threads_exactly_the_limit_passes_per_peer() {
    let limit = 50;
    let layer = SlidingWindowLayer::qps(limit)
        .key(PeerIpKey)
        .compact()
        .clock(ManualClock::new(10_050));
    let stats = layer.handle();
    let service = layer.layer(inner());
    let clients: Vec<IpAddr> = (1..=8)
        .map(|i| IpAddr::V4(Ipv4Addr::new(192, 0, 2, i)))
        .collect();
    let passed: Arc<Vec<AtomicU64>> = Arc::new(clients.iter().map(|_| AtomicU64::new(0)).collect());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let mut service = service.clone();
            let clients = clients.clone();
            let passed = Arc::clone(&passed);
            thread::spawn(move || {
                for _ in 0..40 {
                    for (i, &client) in clients.iter().enumerate() {
                        if call(&mut service, Some(client)).0 == StatusCode::OK {
                            passed[i].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    for (i, &client) in clients.iter().enumerate() {
        assert_eq!(passed[i].load(Ordering::Relaxed), limit, "{client}");
        let snapshot = stats.snapshot(&Some(client)).unwrap();
        assert_eq!(
            (snapshot.pass, snapshot.block),
            (limit, 160 - limit),
            "{client}"
        );
    }
}

/// Clients turning over a small table under real threads: in each of 12
/// bursts, on a clock frozen for the burst and a window past the last,
/// four threads send requests from 16 new clients to a table of 16 keys,
/// so that new clients evict idle ones while other threads pass requests
/// of clients already in without the lock. Every client that found a slot
/// passes exactly `limit` times in its burst; one whose two groups held no
/// idle key (a table this small has two groups) is counted on the
/// overflow window, which all such clients of a burst share under the
/// same limit.
#[test]
fn clients_turning_over_the_table_under_real_threads_pass_exactly_the_limit() {
    let limit = 5;
    let clock = ManualClock::new(1_000_000);
    let layer = SlidingWindowLayer::qps(limit)
        .key(PeerIpKey)
        .compact()
        .max_keys(16)
        .clock(clock.clone());
    let stats = layer.handle();
    clients_turning_over(
        layer.layer(inner()),
        &clock,
        limit,
        |burst, i| Some(IpAddr::V4(Ipv4Addr::new(198, 51, burst, i))),
        |service, client| call(service, *client).0,
        |client| stats.snapshot(client),
        || stats.len(),
    );
}

/// The bursts of [`clients_turning_over_the_table_under_real_threads_pass_exactly_the_limit`]
/// for a compact layer of limit `limit` and `max_keys` 16 on `clock`
/// (`service`): `client(burst, i)` is client `i` of a burst, `send`
/// sends one request of a client, `snapshot` reads a client from the
/// layer's handle and `len` its number of keys.
pub(super) fn clients_turning_over<K, S>(
    service: S,
    clock: &ManualClock,
    limit: u64,
    client: fn(u8, u8) -> K,
    send: fn(&mut S, &K) -> StatusCode,
    snapshot: impl Fn(&K) -> Option<Snapshot>,
    len: impl Fn() -> usize,
) where
    K: Clone + Send + Sync + std::fmt::Debug + 'static,
    S: Clone + Send + 'static,
{
    let mut in_slots = 0;
    for burst in 0..12u8 {
        let clients: Arc<Vec<K>> = Arc::new((0..16).map(|i| client(burst, i)).collect());
        let passed: Arc<Vec<AtomicU64>> =
            Arc::new(clients.iter().map(|_| AtomicU64::new(0)).collect());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let mut service = service.clone();
                let clients = Arc::clone(&clients);
                let passed = Arc::clone(&passed);
                thread::spawn(move || {
                    for round in 0..4 {
                        // Each thread starts at another client.
                        for k in 0..clients.len() {
                            let i = (k + 4 * t + round) % clients.len();
                            if send(&mut service, &clients[i]) == StatusCode::OK {
                                passed[i].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let mut overflowed = 0;
        for (i, client) in clients.iter().enumerate() {
            let passed = passed[i].load(Ordering::Relaxed);
            match snapshot(client) {
                Some(snapshot) => {
                    in_slots += 1;
                    assert_eq!(passed, limit, "burst {burst}: {client:?}");
                    assert_eq!(
                        (snapshot.pass, snapshot.block),
                        (limit, 16 - limit),
                        "burst {burst}: {client:?}"
                    );
                }
                None => overflowed += passed,
            }
        }
        assert!(
            overflowed <= limit,
            "burst {burst}: {overflowed} on the overflow window"
        );
        // The table's keys, and the overflow window's entry once used.
        assert!(len() <= 16 + 1, "burst {burst}: {} keys", len());
        clock.advance(Duration::from_millis(1_100));
    }
    // Clients took the slots of idle ones (the table holds 16).
    assert!(in_slots > 16 * 4, "{in_slots} clients found a slot");
}
