//! Throughput and latency over loopback with a limit no contender reaches.
//!
//! Each round runs every contender once, in an order rotated from round to
//! round (A B C, B C A, ...), so slow drift of the machine lands on all of
//! them alike. Ratios are taken against bare axum from the same run.

use hdrhistogram::Histogram;

use crate::cli::Config;
use crate::client::{self, Tally};
use crate::progress::Progress;
use crate::servers::{Contender, Server, Settings, NEVER_REJECT};

/// Everything served in the throughput run.
pub const CONTENDERS: [Contender; 6] = [
    Contender::Bare,
    Contender::Noop,
    Contender::OursGlobal,
    Contender::OursPath,
    Contender::GovernorUsual,
    Contender::TowerRateLimit,
];

/// One contender's totals over all rounds.
#[derive(Debug, Clone)]
pub struct BenchRow {
    /// The contender.
    pub contender: Contender,
    /// Requests per second over all measured time.
    pub rps: f64,
    /// Requests per second in each round, in round order.
    pub round_rps: Vec<f64>,
    /// Latency of all measured requests, microseconds.
    pub latency: Histogram<u64>,
    /// Answers by class (anything but 2xx means the limit was reached).
    pub tally: Tally,
}

impl BenchRow {
    /// The latency at quantile `q`, microseconds.
    pub fn quantile(&self, q: f64) -> u64 {
        self.latency.value_at_quantile(q)
    }
}

/// Runs the rounds and returns one row per contender, bare axum first.
pub async fn run(config: &Config) -> Result<Vec<BenchRow>, String> {
    let contenders = config.select(&CONTENDERS);
    let settings = Settings {
        limit: NEVER_REJECT,
        record: false,
        manual_clock: None,
        max_wait: config.max_wait,
    };
    let mut rows: Vec<BenchRow> = contenders
        .iter()
        .map(|&contender| BenchRow {
            contender,
            rps: 0.0,
            round_rps: Vec::new(),
            latency: client::latency_histogram(),
            tally: Tally::default(),
        })
        .collect();
    let mut seconds = vec![0.0f64; rows.len()];
    let mut progress = Progress::rounds("bench", config.rounds as u64);
    for round in 0..config.rounds {
        let n = rows.len().max(1);
        for k in 0..rows.len() {
            let i = (k + round) % n;
            let contender = rows[i].contender;
            eprintln!("bench: round {} / {}", round + 1, contender.name());
            let server = Server::start(contender, &settings, config.server_threads)?;
            let result = client::closed_loop(
                server.addr,
                config.connections,
                config.warmup,
                config.bench_time,
                "/items/7",
            )
            .await?;
            drop(server);
            let row = &mut rows[i];
            let secs = result.elapsed.as_secs_f64();
            row.round_rps.push(result.requests as f64 / secs);
            row.latency
                .add(&result.latency)
                .map_err(|e| format!("cannot merge histograms: {e}"))?;
            row.tally.merge(result.tally);
            seconds[i] += secs;
        }
        progress.round(round as u64 + 1, "");
    }
    for (row, secs) in rows.iter_mut().zip(seconds) {
        if secs > 0.0 {
            row.rps = row.tally.answered() as f64 / secs;
        }
    }
    Ok(rows)
}

/// The median of the per-round ratios of `row` to `base` (paired rounds).
pub fn paired_ratio(row: &BenchRow, base: &BenchRow) -> f64 {
    let mut ratios: Vec<f64> = row
        .round_rps
        .iter()
        .zip(&base.round_rps)
        .filter(|(_, b)| **b > 0.0)
        .map(|(r, b)| r / b)
        .collect();
    median(&mut ratios)
}

/// The median of `values` (0 when empty); sorts in place.
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}
