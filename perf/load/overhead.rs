//! Per-request cost of each layer, in process (no sockets).
//!
//! Loopback HTTP on two cores cannot resolve a few tens of nanoseconds, so
//! this calls each app as a tower `Service` on one thread, for the same
//! request, many times. Each round times every contender once (order rotated
//! per round); the cost "beyond a no-op layer" is the difference to the
//! no-op layer *within a round*, and the reported figure is the median over
//! rounds.

use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::Router;
use http_body_util::BodyExt;
use tower::{Service, ServiceExt};

use crate::bench::median;
use crate::cli::Config;
use crate::progress::Progress;
use crate::servers::{self, Contender, Settings, NEVER_REJECT};

/// Everything timed in process: the same contenders as the throughput run
/// (the no-op layer must stay in that list).
pub use crate::bench::CONTENDERS;

/// One contender's per-request figures.
#[derive(Debug, Clone)]
pub struct OverheadRow {
    /// The contender.
    pub contender: Contender,
    /// Median nanoseconds per request over rounds.
    pub ns: f64,
    /// Median over rounds of (this − no-op layer) nanoseconds per request.
    pub beyond_noop_ns: f64,
}

/// Sends `n` requests through `app` one after another; nanoseconds each.
async fn time_requests(app: &mut Router, n: u64) -> Result<f64, String> {
    let start = Instant::now();
    for _ in 0..n {
        let request = Request::get("/items/7")
            .body(Body::empty())
            .map_err(|e| format!("cannot build a request: {e}"))?;
        let ready = ServiceExt::<Request>::ready(app)
            .await
            .map_err(|e| format!("the app was not ready: {e}"))?;
        let response = ready
            .call(request)
            .await
            .map_err(|e| format!("the app failed: {e}"))?;
        if !response.status().is_success() {
            return Err(format!(
                "the app answered {} with a limit it should never reach",
                response.status()
            ));
        }
        response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading a body failed: {e}"))?;
    }
    Ok(start.elapsed().as_nanos() as f64 / n as f64)
}

/// Runs the paired rounds on a single-threaded runtime on this thread.
pub fn run(config: &Config) -> Result<Vec<OverheadRow>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let contenders = config.select(&CONTENDERS);
    let settings = Settings {
        limit: NEVER_REJECT,
        record: false,
        manual_clock: None,
        max_wait: config.max_wait,
    };
    runtime.block_on(async {
        let mut apps = Vec::new();
        for &contender in &contenders {
            apps.push(servers::build(contender, &settings)?.router);
        }
        // Warm every app (allocator, caches, the limiters' first keys).
        for app in &mut apps {
            time_requests(app, config.overhead_requests / 10 + 1).await?;
        }
        let n = apps.len().max(1);
        let mut per_round = vec![Vec::new(); apps.len()];
        let mut progress = Progress::rounds("overhead", config.overhead_rounds as u64);
        for round in 0..config.overhead_rounds {
            for k in 0..apps.len() {
                let i = (k + round) % n;
                let ns = time_requests(&mut apps[i], config.overhead_requests).await?;
                per_round[i].push(ns);
            }
            progress.round(round as u64 + 1, "");
        }
        let noop = contenders.iter().position(|&c| c == Contender::Noop);
        let mut rows = Vec::new();
        for (i, &contender) in contenders.iter().enumerate() {
            let mut beyond: Vec<f64> = match noop {
                Some(j) => per_round[i]
                    .iter()
                    .zip(&per_round[j])
                    .map(|(a, b)| a - b)
                    .collect(),
                None => Vec::new(),
            };
            let mut own = per_round[i].clone();
            rows.push(OverheadRow {
                contender,
                ns: median(&mut own),
                beyond_noop_ns: median(&mut beyond),
            });
        }
        Ok(rows)
    })
}
