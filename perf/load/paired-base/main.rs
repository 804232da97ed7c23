//! The layer of two commits side by side in one process: the current tree
//! (`tower_sliding_window`) and a base commit (`base`, the same crate at
//! another revision), with a no-op layer and tower_governor, in paired
//! rounds.
//!
//! Built and run by `run.sh` next to this file, which extracts the base
//! commit and writes a throwaway manifest depending on both; see
//! docs/benchmarks-layer.md. Arguments: rounds, then the base's label.
//!
//! Each round sends [`BATCH`] requests (`GET /items/7` with
//! `x-api-key: client-42`, `ready().call()`, the body read to the end) to
//! every contender back to back, the starting contender rotating by one
//! each round, and notes each one's nanoseconds per request. The figures
//! printed are medians over rounds of the per-request time and of the
//! difference to the no-op layer *in the same round*, and of the difference
//! between the current layer and the base layer in the same round.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use axum::Router;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::GlobalKeyExtractor;
use tower_governor::GovernorLayer;

#[path = "../../benches/layer/common.rs"]
mod common;

use common::NoopLayer;

/// Requests per contender per round.
const BATCH: u32 = 32;

/// A limit no round can reach.
const NEVER_REJECT: u64 = u64::MAX / 4;

/// The contenders, in report order; the no-op layer is index 1.
const NAMES: [&str; 5] = [
    "bare router",
    "no-op layer",
    "qps(n), current tree",
    "qps(n), base commit",
    "tower_governor",
];

/// The app every contender wraps, prepared as `axum::serve` prepares it.
fn app(layer: usize) -> Router {
    let app = Router::new()
        .route("/", get(handler))
        .route("/items/{id}", get(handler));
    let app = match layer {
        0 => app,
        1 => app.layer(NoopLayer),
        2 => app.layer(tower_sliding_window::SlidingWindowLayer::qps(NEVER_REJECT)),
        3 => app.layer(base::SlidingWindowLayer::qps(NEVER_REJECT)),
        _ => {
            let config = GovernorConfigBuilder::default()
                .period(Duration::from_nanos(1))
                .burst_size(u32::MAX)
                .key_extractor(GlobalKeyExtractor)
                .finish()
                .expect("a non-zero period and burst");
            app.layer(GovernorLayer::new(config))
        }
    };
    app.with_state(())
}

async fn handler() -> &'static str {
    "ok"
}


/// One request through `app`, its body read to the end.
async fn serve_one(app: &mut Router) -> StatusCode {
    let request = Request::get("/items/7")
        .header("x-api-key", "client-42")
        .body(Body::empty())
        .expect("a valid request");
    common::serve(app, request).await
}

/// The median and quartiles of `values`.
fn quartiles(mut values: Vec<f64>) -> [f64; 3] {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let rank = q * (values.len() - 1) as f64;
        let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
        values[lo] + (values[hi] - values[lo]) * (rank - lo as f64)
    };
    [at(0.25), at(0.5), at(0.75)]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args
        .next()
        .map(|a| a.parse().expect("rounds: a whole number"))
        .unwrap_or(40_000);
    let base_label = args.next().unwrap_or_else(|| "base".to_owned());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    let mut apps: Vec<Router> = (0..NAMES.len()).map(app).collect();
    runtime.block_on(async {
        // Warm-up, and the check that nothing rejects.
        for (i, app) in apps.iter_mut().enumerate() {
            for _ in 0..2_000 {
                assert_eq!(serve_one(app).await, StatusCode::OK, "{}", NAMES[i]);
            }
        }
    });
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let started = Instant::now();
    let n = NAMES.len();
    let mut ns: Vec<Vec<f64>> = Vec::with_capacity(rounds);
    runtime.block_on(async {
        for round in 0..rounds {
            let mut row = vec![0.0; n];
            for k in 0..n {
                let i = (round + k) % n;
                let begin = Instant::now();
                for _ in 0..BATCH {
                    serve_one(&mut apps[i]).await;
                }
                row[i] = begin.elapsed().as_nanos() as f64 / f64::from(BATCH);
            }
            ns.push(row);
        }
    });
    let column = |i: usize| ns.iter().map(|r| r[i]).collect::<Vec<_>>();
    let beyond = |i: usize| ns.iter().map(|r| r[i] - r[1]).collect::<Vec<_>>();
    println!(
        "paired-base: {rounds} rounds of {BATCH} requests per contender, rotated order, \
         {:.1} s; base = {base_label}; load average at the start: {}",
        started.elapsed().as_secs_f64(),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    println!(
        "{:<24} {:>11} {:>13}  quartiles of beyond",
        "contender", "ns/request", "beyond no-op"
    );
    for (i, name) in NAMES.iter().enumerate() {
        let own = quartiles(column(i));
        let b = quartiles(beyond(i));
        println!(
            "{name:<24} {:>11.1} {:>13.1}  [{:.1}, {:.1}]",
            own[1], b[1], b[0], b[2]
        );
    }
    let governor = quartiles(beyond(4))[1];
    for (i, name) in [(2, NAMES[2]), (3, NAMES[3])] {
        println!(
            "{name} / tower_governor beyond no-op: {:.2} (ratio of medians)",
            quartiles(beyond(i))[1] / governor
        );
    }
    let diff = quartiles(ns.iter().map(|r| r[2] - r[3]).collect());
    println!(
        "current - base, same round: median {:.1} ns per request, quartiles [{:.1}, {:.1}]",
        diff[1], diff[0], diff[2]
    );
}
