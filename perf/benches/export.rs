//! The dashboard's JSON (`GET /stats` of `dashboard::router`) for 4096
//! keys, each with a full minute of history, read afresh for every request
//! (`Options::refresh(Duration::ZERO)`: what one refresh period costs,
//! once, whatever the number of readers): the group `dashboard_json`, with
//! `page_4096_keys` (what the page asks for: every key read and ordered,
//! the 100 busiest listed with their history) and `search_4096_keys` (a
//! search that 1000 keys match, the busiest 100 of them listed).
//!
//! The keys are filled through the layer on a manual clock: for 59
//! seconds, every key gets one pass and one block per second, so every
//! key's history holds 59 seconds with both series non-zero (the worst case
//! for the JSON's size). In the 60th second, where the clock then stays
//! put, key `i` gets one pass and `1 + i % 4` blocks: every key has traffic
//! in its current window (no key is skipped as idle) and the busiest-first
//! order has both differences and ties to sort. Every iteration serializes
//! the same figures.

use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use criterion::{Criterion, Throughput};
use http::Request;
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::dashboard::{self, Options};
use tower_sliding_window::{PathKey, SlidingWindowLayer};

use crate::layer::runtime;

const KEYS: usize = 4096;
const SECONDS: u64 = 60;

pub(crate) fn bench(c: &mut Criterion) {
    let rt = runtime();
    let clock = ManualClock::new(1_000_000);
    let layer = SlidingWindowLayer::qps(1)
        .key(PathKey)
        .max_keys(KEYS)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route("/{*path}", get(|| async { "ok" }))
        .layer(layer);
    let paths: Vec<String> = (0..KEYS).map(|i| format!("/tenant/{i:04}")).collect();
    rt.block_on(async {
        for second in 0..SECONDS {
            let last = second + 1 == SECONDS;
            for (i, path) in paths.iter().enumerate() {
                let requests = if last { 2 + i % 4 } else { 2 };
                for _ in 0..requests {
                    let request = Request::get(path.as_str()).body(Body::empty()).unwrap();
                    app.clone().oneshot(request).await.unwrap();
                }
            }
            if !last {
                clock.advance(Duration::from_secs(1));
            }
        }
    });
    assert_eq!(stats.keys().len(), KEYS, "every key has its own entry");
    let history = stats.history(paths[0].as_str());
    assert_eq!(history.len() as u64, SECONDS - 1, "seconds of history");
    assert!(history.iter().all(|s| s.pass == 1 && s.block == 1));
    for (i, path) in paths.iter().enumerate() {
        let now = stats.snapshot(path.as_str()).expect("an entry");
        assert_eq!((now.pass, now.block), (1, 1 + i as u64 % 4), "{path}");
    }

    // Every request reads every key: the cost of one refresh period.
    let board = dashboard::router_with(stats, Options::new().refresh(Duration::ZERO));
    let get_stats = |uri: &'static str| {
        let board = board.clone();
        async move {
            let request = Request::get(uri).body(Body::empty()).unwrap();
            let response = board.oneshot(request).await.unwrap();
            response.into_body().collect().await.unwrap().to_bytes()
        }
    };

    let mut group = c.benchmark_group("dashboard_json");
    group.throughput(Throughput::Elements(KEYS as u64));
    group.sample_size(30);
    // What the page asks for, then a search that keys /tenant/1000 to
    // /tenant/1999 match.
    for (name, uri) in [
        ("page_4096_keys", "/stats"),
        ("search_4096_keys", "/stats?search=%2Ftenant%2F1"),
    ] {
        let size = rt.block_on(get_stats(uri)).len();
        println!(
            "dashboard_json/{name}: {KEYS} keys, {} KiB of JSON",
            size / 1024
        );
        group.bench_function(name, |b| b.iter(|| rt.block_on(get_stats(uri))));
    }
    group.finish();
}
