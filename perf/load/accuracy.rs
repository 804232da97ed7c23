//! The accuracy run: every scenario against every limiting contender, with
//! the contenders alternated from one scenario to the next.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tower_sliding_window::clock::{Clock, SystemClock};

use crate::analysis::{self, Accuracy, Grid, Span};
use crate::cli::Config;
use crate::client::{self, Due, Tally};
use crate::scenario::Scenario;
use crate::servers::{Contender, Server, Settings};

/// The contenders that limit (bare axum has nothing to measure here).
pub const CONTENDERS: [Contender; 7] = [
    Contender::OursGlobal,
    Contender::OursPath,
    Contender::OursStrict,
    Contender::OursThrottle,
    Contender::GovernorUsual,
    Contender::GovernorBurst1,
    Contender::TowerRateLimit,
];

/// Distinct paths the open-loop clients cycle through (`/items/0` ..).
const PATHS: usize = 100;

/// One contender in one scenario.
#[derive(Debug, Clone)]
pub struct Run {
    /// The scenario.
    pub scenario: Scenario,
    /// The contender.
    pub contender: Contender,
    /// The limit it was set to.
    pub limit: u64,
    /// Requests offered.
    pub sent: u64,
    /// Answers by class.
    pub tally: Tally,
    /// Requests still unanswered at the drain deadline.
    pub unanswered: u64,
    /// The analysis of its admissions.
    pub accuracy: Accuracy,
    /// Admissions per 100 ms from the start.
    pub per_bucket: Vec<u64>,
    /// Admissions in the trailing 1 s, every 10 ms.
    pub trailing: Vec<(f64, u64)>,
    /// Median latency from due instant to answer, microseconds.
    pub p50_us: u64,
    /// 99th percentile of the same.
    pub p99_us: u64,
    /// How late a task sleeping on the server's runtime woke during the
    /// run (median, 99th percentile, largest), microseconds.
    pub timer_late_us: [u64; 3],
}

/// The paths of the open-loop schedule.
pub fn item_paths() -> Arc<Vec<String>> {
    Arc::new((0..PATHS).map(|i| format!("/items/{i}")).collect())
}

/// A start instant on a whole second of our layer's clock, at least
/// `lead_ms` away: the clock reading and the matching Tokio instant.
pub fn aligned_start(lead_ms: u64) -> (u64, Instant) {
    let clock = SystemClock::new();
    let now_us = clock.now_micros();
    let now = Instant::now();
    let start_ms = (now_us / 1000 + lead_ms).div_ceil(1000) * 1000;
    let wait = Duration::from_micros(start_ms * 1000 - now_us);
    (start_ms, now + wait)
}

/// Offers `scenario` to a fresh server of `contender` and analyses it.
pub async fn run_one(
    contender: Contender,
    scenario: Scenario,
    config: &Config,
) -> Result<Run, String> {
    let settings = Settings {
        limit: config.limit,
        record: true,
        manual_clock: None,
        max_wait: config.max_wait,
    };
    let server = Server::start(contender, &settings, config.server_threads)?;
    let probe = server.timer_probe();
    let seconds = config.scenario_time.as_secs();
    let (start_ms, start) = aligned_start(1500);
    let schedule: Vec<Due> = scenario
        .offsets_us(config.limit, seconds)
        .into_iter()
        .enumerate()
        .map(|(i, us)| Due {
            at: start + Duration::from_micros(us),
            path: i % PATHS,
        })
        .collect();
    let result = client::open_loop(
        server.addr,
        config.open_connections,
        schedule,
        item_paths(),
        Duration::from_secs(3),
    )
    .await?;
    let (admits, blocks) = server
        .recorder
        .as_ref()
        .map(|r| (r.take(), r.take_blocks()))
        .unwrap_or_default();
    drop(server);
    let timer_late_us = {
        let mut late = probe.lock().unwrap_or_else(PoisonError::into_inner).clone();
        late.sort_unstable();
        analysis::nearest_ranks(&late)
    };
    let span = Span {
        start_ms,
        end_ms: start_ms + scenario.length_ms(seconds),
    };
    let grid = Grid::DEFAULT;
    Ok(Run {
        scenario,
        contender,
        limit: config.limit,
        sent: result.sent,
        tally: result.tally,
        unanswered: result.unanswered,
        accuracy: analysis::analyse(&admits, &blocks, span, grid, config.limit),
        per_bucket: analysis::per_bucket(&admits, span, grid),
        trailing: analysis::trailing(&admits, span, grid, 10),
        p50_us: result.latency.value_at_quantile(0.5),
        p99_us: result.latency.value_at_quantile(0.99),
        timer_late_us,
    })
}

/// Every scenario against every selected contender, alternating the order.
pub async fn run(config: &Config) -> Result<Vec<Run>, String> {
    let contenders = config.select(&CONTENDERS);
    let mut runs = Vec::new();
    for (i, scenario) in Scenario::all().into_iter().enumerate() {
        let mut order = contenders.clone();
        if !order.is_empty() {
            let n = order.len();
            order.rotate_left(i % n);
        }
        for contender in order {
            eprintln!("accuracy: {scenario} / {}", contender.name());
            runs.push(run_one(contender, scenario, config).await?);
        }
    }
    Ok(runs)
}

/// The raw series of every run as JSON (for re-plotting or checking).
pub fn to_json(runs: &[Run]) -> serde_json::Value {
    serde_json::Value::Array(
        runs.iter()
            .map(|r| {
                serde_json::json!({
                    "scenario": r.scenario.slug(),
                    "contender": r.contender.slug(),
                    "limit": r.limit,
                    "sent": r.sent,
                    "admitted": r.accuracy.passes,
                    "limited": r.tally.limited,
                    "unanswered": r.unanswered,
                    "bucket_max": r.accuracy.bucket_max,
                    "bucket_max_bound": r.accuracy.bucket_max_bound,
                    "sliding_max": r.accuracy.sliding_max,
                    "bucket_peak": r.accuracy.bucket_peak,
                    "blocked_with_room": r.accuracy.blocked_with_room,
                    "sliding_at_us": r.accuracy.sliding_at_us,
                    "rate": r.accuracy.rate,
                    "rate_after_first": r.accuracy.rate_after_first,
                    "exact_log_rate": r.accuracy.exact_log_rate,
                    "wait_us_p50_p99_p100": r.accuracy.wait_us,
                    "saturated_100ms_min_max": r.accuracy.saturated,
                    "saturated_buckets": r.accuracy.saturated_buckets,
                    "timer_late_us_p50_p99_p100": r.timer_late_us,
                    "per_100ms": r.per_bucket,
                })
            })
            .collect(),
    )
}
