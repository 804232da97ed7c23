//! Retry-After honesty: a client that is told to wait, waits exactly that
//! long, and tries again. Does its next attempt get through?
//!
//! Two settings of the steady 2x overload:
//! - **alone**: the honest client produces the overload itself (one
//!   connection, requests due at twice the limit). Nothing else competes for
//!   the quota, so a failed retry means the header named too short a wait.
//! - **contended**: the same steady 2x overload comes from an open-loop
//!   crowd that never waits, and four honest clients (a tenth of the limit
//!   each) ride along. No header can reserve a slot against such a crowd;
//!   this shows how much a header-following client still gets.

use std::time::Duration;

use tokio::time::Instant;

use crate::accuracy::{aligned_start, item_paths};
use crate::cli::Config;
use crate::client::{self, Due};
use crate::servers::{Contender, Server, Settings};

/// The contenders that limit.
pub const CONTENDERS: [Contender; 4] = [
    Contender::OursGlobal,
    Contender::GovernorUsual,
    Contender::GovernorBurst1,
    Contender::TowerRateLimit,
];

/// What honest clients saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Honesty {
    /// Requests sent, retries included.
    pub requests: u64,
    /// 429 answers that were followed by a retry.
    pub retries: u64,
    /// Retries that were admitted.
    pub retries_passed: u64,
    /// 429 answers with no usable `Retry-After` (treated as 0 s).
    pub no_header: u64,
    /// 429 answers whose `Retry-After` was 0.
    pub zero: u64,
    /// The largest `Retry-After` seen, seconds.
    pub max_wait: u64,
}

impl Honesty {
    /// Sums two clients' counts.
    fn merge(&mut self, other: Honesty) {
        self.requests += other.requests;
        self.retries += other.retries;
        self.retries_passed += other.retries_passed;
        self.no_header += other.no_header;
        self.zero += other.zero;
        self.max_wait = self.max_wait.max(other.max_wait);
    }

    /// The share of retries that got through, if there were any.
    pub fn share(&self) -> Option<f64> {
        (self.retries > 0).then(|| self.retries_passed as f64 / self.retries as f64)
    }
}

/// One contender's result.
#[derive(Debug, Clone)]
pub struct RetryRun {
    /// The contender.
    pub contender: Contender,
    /// The honest client producing the overload itself.
    pub alone: Honesty,
    /// Honest clients inside a crowd that never waits.
    pub contended: Honesty,
}

/// An honest client: requests due every `interval`; on a 429 it waits the
/// `Retry-After` it got, retries once, then resumes its schedule.
async fn honest(
    addr: std::net::SocketAddr,
    interval: Duration,
    start: Instant,
    until: Instant,
) -> Result<Honesty, String> {
    let mut conn = client::connect(addr).await?;
    let mut seen = Honesty::default();
    let mut next = start;
    while next < until {
        tokio::time::sleep_until(next).await;
        let answer = client::get(&mut conn, "/items/1").await?;
        seen.requests += 1;
        next += interval;
        if answer.status != 429 {
            continue;
        }
        let wait = match answer.retry_after {
            Some(0) => {
                seen.zero += 1;
                0
            }
            Some(secs) => secs,
            None => {
                seen.no_header += 1;
                0
            }
        };
        seen.max_wait = seen.max_wait.max(wait);
        tokio::time::sleep(Duration::from_secs(wait)).await;
        let retry = client::get(&mut conn, "/items/1").await?;
        seen.requests += 1;
        seen.retries += 1;
        if (200..300).contains(&retry.status) {
            seen.retries_passed += 1;
        }
        // Resume the schedule from now: the time spent waiting is not owed.
        next = Instant::now() + interval;
    }
    Ok(seen)
}

/// Runs both settings against one contender.
async fn run_one(contender: Contender, config: &Config) -> Result<RetryRun, String> {
    let limit = config.limit;
    let settings = Settings {
        limit,
        record: false,
        manual_clock: None,
        max_wait: config.max_wait,
    };
    let length = config.retry_time;

    // Alone: one client at twice the limit.
    let server = Server::start(contender, &settings, config.server_threads)?;
    let (_, start) = aligned_start(500);
    let interval = Duration::from_secs(1) / u32::try_from(2 * limit).unwrap_or(u32::MAX);
    let alone = honest(server.addr, interval, start, start + length).await?;
    drop(server);

    // Contended: an open-loop crowd at 2x plus four honest clients.
    let server = Server::start(contender, &settings, config.server_threads)?;
    let (_, start) = aligned_start(1000);
    let per_second = 2 * limit;
    let total = per_second * length.as_secs();
    let schedule: Vec<Due> = (0..total)
        .map(|i| Due {
            at: start + Duration::from_micros(i * 1_000_000 / per_second),
            path: usize::try_from(i % 100).unwrap_or(0),
        })
        .collect();
    let honest_interval = Duration::from_secs(10) / u32::try_from(limit).unwrap_or(u32::MAX);
    let mut clients = Vec::new();
    for _ in 0..4 {
        let addr = server.addr;
        clients.push(tokio::spawn(async move {
            honest(addr, honest_interval, start, start + length).await
        }));
    }
    client::open_loop(
        server.addr,
        config.open_connections,
        schedule,
        item_paths(),
        Duration::from_secs(3),
    )
    .await?;
    let mut contended = Honesty::default();
    for handle in clients {
        let part = handle
            .await
            .map_err(|e| format!("an honest client task failed: {e}"))??;
        contended.merge(part);
    }
    drop(server);
    Ok(RetryRun {
        contender,
        alone,
        contended,
    })
}

/// The retry run over every selected contender.
pub async fn run(config: &Config) -> Result<Vec<RetryRun>, String> {
    let mut runs = Vec::new();
    for contender in config.select(&CONTENDERS) {
        eprintln!("retry: {}", contender.name());
        runs.push(run_one(contender, config).await?);
    }
    Ok(runs)
}
