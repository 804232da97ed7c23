//! Instruction counts of one request through an axum `Router` with each
//! per-client layer, for `valgrind --tool=callgrind`: the counterpart of the
//! `layer_paired` bench that does not move with the load of the machine.
//!
//! Each contender serves [`REQUESTS`] requests (the bench's request: `GET
//! /items/7` with `x-api-key: client-42`, and the peer's address where the
//! contender keys by it) inside a function of its own that is never
//! inlined, so callgrind's inclusive count of that function divided by
//! [`REQUESTS`] is one request; the difference to the no-op layer sent the
//! same request is what the layer executes.
//!
//! ```text
//! cargo build --release -p perf --bin counts-layer
//! valgrind --tool=callgrind --callgrind-out-file=target/counts-layer.out \
//!     target/release/counts-layer
//! callgrind_annotate --inclusive=yes target/counts-layer.out | grep 'counts_layer::'
//! ```
//!
//! With `COUNTS_LAYER_ROUND=32` the contenders take their requests in
//! rounds of 32 in turn, as `layer_paired` sends them, for callgrind's
//! cache and branch simulation (`perf/cachesim.sh`).
//!
//! An instruction count weighs an atomic read-modify-write or a cache miss
//! as one instruction: it shows what a change removed, the paired bench
//! what it saved.

#[path = "../benches/layer/common.rs"]
mod common;
#[path = "../benches/layer/governor_setup.rs"]
mod governor_setup;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderName, HeaderValue, Request, StatusCode};
use axum::routing::get;
use axum::Router;
use tokio::runtime::Runtime;
use tower_governor::key_extractor::PeerIpKeyExtractor;
use tower_sliding_window::{HeaderKey, KeyExtractor, PeerIpKey, SlidingWindowLayer};

/// Requests per contender.
const REQUESTS: u32 = 20_000;

const API_KEY: HeaderName = HeaderName::from_static("x-api-key");
const CLIENT: &str = "client-42";
const PEER: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7)), 40_000);

fn request(peer: bool) -> Request<Body> {
    let mut request = Request::get("/items/7")
        .header(API_KEY, HeaderValue::from_static(CLIENT))
        .body(Body::empty())
        .expect("a valid request");
    if peer {
        request.extensions_mut().insert(ConnectInfo(PEER));
    }
    request
}

async fn handler() -> &'static str {
    "ok"
}

fn app(layered: impl FnOnce(Router) -> Router) -> Router {
    layered(
        Router::new()
            .route("/", get(handler))
            .route("/items/{id}", get(handler)),
    )
    .with_state(())
}

/// The compact layer of the bench, with buckets of 1 s where the bench's
/// are 1 ms (a limit of 65 535 per window, which the [`REQUESTS`] of one
/// contender do not reach either way). Under callgrind a request takes
/// about fifty times as long as on the machine itself, and with 1 ms
/// buckets about one request in twenty opens a new bucket (1 086 in
/// 20 000 when counted), where in the bench it is one in a few hundred
/// (`layer`) or a few dozen (`layer_paired`, one a round): the count would
/// weigh a bucket's opening far too much. With 1 s buckets it counts the
/// pass alone; an opening costs about 275 instructions.
fn compact<X: KeyExtractor>(key: X) -> SlidingWindowLayer<X> {
    SlidingWindowLayer::qps(65_535)
        .window(Duration::from_secs(10), 10)
        .key(key)
        .compact()
}

/// Serves the requests; `name` keeps the linker from folding the
/// contenders' functions, whose bodies are otherwise the same, into one.
#[inline(always)]
fn serve(runtime: &Runtime, app: &mut Router, requests: u32, peer: bool, name: &'static str) {
    std::hint::black_box(name);
    runtime.block_on(async {
        for _ in 0..requests {
            let status = common::serve(app, request(peer)).await;
            assert_eq!(status, StatusCode::OK);
        }
    });
}

#[inline(never)]
fn noop(runtime: &Runtime, app: &mut Router, requests: u32) {
    serve(runtime, app, requests, false, "noop");
}

#[inline(never)]
fn noop_peer_ip(runtime: &Runtime, app: &mut Router, requests: u32) {
    serve(runtime, app, requests, true, "noop_peer_ip");
}

#[inline(never)]
fn ours_compact_header(runtime: &Runtime, app: &mut Router, requests: u32) {
    serve(runtime, app, requests, false, "ours_compact_header");
}

#[inline(never)]
fn ours_compact_peer_ip(runtime: &Runtime, app: &mut Router, requests: u32) {
    serve(runtime, app, requests, true, "ours_compact_peer_ip");
}

#[inline(never)]
fn ours_header(runtime: &Runtime, app: &mut Router, requests: u32) {
    serve(runtime, app, requests, false, "ours_header");
}

#[inline(never)]
fn ours_global(runtime: &Runtime, app: &mut Router, requests: u32) {
    serve(runtime, app, requests, false, "ours_global");
}

#[inline(never)]
fn tower_governor_header(runtime: &Runtime, app: &mut Router, requests: u32) {
    serve(runtime, app, requests, false, "tower_governor_header");
}

#[inline(never)]
fn tower_governor_peer_ip(runtime: &Runtime, app: &mut Router, requests: u32) {
    serve(runtime, app, requests, true, "tower_governor_peer_ip");
}

/// A contender's function and its app.
type Run = (fn(&Runtime, &mut Router, u32), Router);

/// Runs each contender's [`REQUESTS`] requests in turn; with
/// `COUNTS_LAYER_ROUND=n` (`n` dividing [`REQUESTS`]), in rounds of `n`
/// requests to every contender in turn instead, as the `layer_paired`
/// bench sends them, so that callgrind's cache and branch simulation
/// (`--cache-sim=yes --branch-sim=yes`) sees each contender's state and
/// code leave the caches and predictors between its batches, as they do
/// in the bench.
fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    let mut runs: Vec<Run> = vec![
        (noop, app(|r| r.layer(common::NoopLayer))),
        (noop_peer_ip, app(|r| r.layer(common::NoopLayer))),
        (
            ours_compact_header,
            app(|r| r.layer(compact(HeaderKey::new(API_KEY)))),
        ),
        (ours_compact_peer_ip, app(|r| r.layer(compact(PeerIpKey)))),
        (
            ours_header,
            app(|r| r.layer(SlidingWindowLayer::qps(u64::MAX / 4).key(HeaderKey::new(API_KEY)))),
        ),
        (
            ours_global,
            app(|r| r.layer(SlidingWindowLayer::qps(u64::MAX / 4))),
        ),
        (
            tower_governor_header,
            app(|r| {
                r.layer(governor_setup::never_rejecting(
                    governor_setup::HeaderString(API_KEY),
                ))
            }),
        ),
        (
            tower_governor_peer_ip,
            app(|r| r.layer(governor_setup::never_rejecting(PeerIpKeyExtractor))),
        ),
    ];
    // Each contender serves `REQUESTS` requests either way: in one batch,
    // or in rounds of a batch that divides it.
    let batch = match std::env::var("COUNTS_LAYER_ROUND") {
        Err(_) => REQUESTS,
        Ok(n) => n
            .parse::<u32>()
            .ok()
            .filter(|&n| n > 0 && REQUESTS % n == 0)
            .unwrap_or_else(|| {
                panic!(
                    "COUNTS_LAYER_ROUND: a number of requests that divides {REQUESTS}, not {n:?}"
                )
            }),
    };
    for _ in 0..REQUESTS / batch {
        for (run, app) in &mut runs {
            run(&runtime, app, batch);
        }
    }
}
