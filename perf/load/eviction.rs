//! `load eviction`: admission latency while the key table is full and
//! turning over, against the same traffic into a table with room.
//!
//! The traffic: every request carries a new key (an IPv4 peer, keyed by
//! `PeerIpKey`), and a [`ManualClock`] moves one step after every
//! `keys / 20` requests, a step being a tenth of the time after which a key
//! with no newer event is idle. So about `keys / 2` keys are busy at any
//! time and the rest of the table is idle. `3 x keys` requests are sent; the
//! last `keys` of them are timed, one at a time, the request built before
//! the timer starts.
//!
//! - "with room": `max_keys` is `4 x keys`, so the table never fills and
//!   nothing is evicted.
//! - "full, turning over": `max_keys` is `keys`; after the first `keys`
//!   requests every new key needs an idle key evicted.
//!
//! The overflow limit is 0 and each key's limit is far above its one
//! request, so a request that found no room (no empty or idle slot where
//! its key may live) is answered 429; the table counts those. The two
//! settings alternate over [`ROUNDS`] rounds and their timings are merged
//! per setting.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::{PeerIpKey, SlidingWindowLayer};

use crate::direct::{self, Driven};

/// Rounds of (with room, full) per tier.
const ROUNDS: usize = 2;

/// Which of our tiers a run drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The compact tier (`SlidingWindowLayer::compact`): a key is idle once
    /// its one-second window holds no pass; a new key evicts an idle key of
    /// its two groups.
    Compact,
    /// The full tier: a key is idle once its minute window is empty, and a
    /// full table is swept at most once per bucket.
    Full,
}

impl Tier {
    /// The name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Compact => "compact",
            Tier::Full => "full",
        }
    }

    /// One clock step: a tenth of the time after which a key is idle (the
    /// default one-second window of a compact key, the minute window of a
    /// full key).
    fn step(self) -> Duration {
        match self {
            Tier::Compact => Duration::from_millis(100),
            Tier::Full => Duration::from_secs(6),
        }
    }

    fn layer(self, max_keys: usize, clock: ManualClock) -> SlidingWindowLayer<PeerIpKey> {
        let layer = SlidingWindowLayer::qps(1_000)
            .key(PeerIpKey)
            .max_keys(max_keys)
            .overflow_limit(0)
            .clock(clock);
        match self {
            Tier::Compact => layer.compact(),
            Tier::Full => layer,
        }
    }
}

/// Whether the table has room or is full and turning over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// `max_keys` four times the keys per round: never full.
    WithRoom,
    /// `max_keys` equal to the keys per round: full, evicting.
    Full,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::WithRoom => "with room",
            Table::Full => "full, turning over",
        }
    }
}

/// The timings of one tier in one setting.
pub struct Row {
    /// The tier.
    pub tier: Tier,
    /// The setting.
    pub table: Table,
    /// Its `max_keys`.
    pub max_keys: usize,
    /// Admission latency, ns, over all rounds.
    pub latency: Histogram<u64>,
    /// Requests (all rounds, timed or not) that found no room.
    pub no_room: u64,
}

/// Runs both settings of `tier` with `keys` keys per round.
pub fn run(tier: Tier, keys: usize) -> Result<[Row; 2], String> {
    let keys = keys.max(20);
    let new_row = |table, max_keys| -> Result<Row, String> {
        Ok(Row {
            tier,
            table,
            max_keys,
            latency: Histogram::new_with_bounds(1, 60_000_000_000, 3)
                .map_err(|e| format!("cannot make a histogram: {e}"))?,
            no_room: 0,
        })
    };
    let mut rows = [
        new_row(Table::WithRoom, keys * 4)?,
        new_row(Table::Full, keys)?,
    ];
    for round in 0..ROUNDS {
        for row in &mut rows {
            eprintln!(
                "eviction: {} tier, {}, round {}/{ROUNDS}",
                tier.name(),
                row.table.name(),
                round + 1
            );
            one_round(tier, keys, row)?;
        }
    }
    Ok(rows)
}

/// Sends one round of traffic into a new layer, timing its last `keys`
/// requests into `row`.
fn one_round(tier: Tier, keys: usize, row: &mut Row) -> Result<(), String> {
    let clock = ManualClock::new(1_000_000);
    let mut driven = Driven::new(tier.layer(row.max_keys, clock.clone()));
    let per_step = (keys / 20) as u64;
    let total = 3 * keys as u64;
    let timed_from = 2 * keys as u64;
    for i in 0..total {
        if i > 0 && i % per_step == 0 {
            clock.advance(tier.step());
        }
        let request = direct::from_peer(direct::ipv4(i));
        let start = Instant::now();
        let status = driven.call(request);
        let elapsed = start.elapsed();
        match status {
            http::StatusCode::OK => {}
            http::StatusCode::TOO_MANY_REQUESTS => row.no_room += 1,
            other => {
                return Err(format!(
                    "{} tier, {}: request {i} was answered {other}",
                    tier.name(),
                    row.table.name()
                ))
            }
        }
        if i >= timed_from {
            row.latency
                .record(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX).max(1))
                .map_err(|e| format!("cannot record a latency: {e}"))?;
        }
    }
    Ok(())
}

/// The Markdown table of the rows, and per tier the ratio of the p99.9
/// latencies (full over with room).
pub fn table(rows: &[Row]) -> String {
    let mut text = String::from(
        "| tier | table | `max_keys` | requests timed | found no room (all rounds) | p50 (ns) | \
         p99 (ns) | p99.9 (ns) | max (ns) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let h = &row.latency;
        text.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            row.tier.name(),
            row.table.name(),
            row.max_keys,
            h.len(),
            row.no_room,
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.max()
        ));
    }
    for pair in rows.chunks(2) {
        if let [room, full] = pair {
            text.push_str(&format!(
                "\n{} tier: p99.9 full and turning over / with room = {:.2} (target: at most \
                 2)\n",
                room.tier.name(),
                p999_ratio(room, full)
            ));
        }
    }
    text
}

/// p99.9 of `full` over p99.9 of `room`.
pub fn p999_ratio(room: &Row, full: &Row) -> f64 {
    full.latency.value_at_quantile(0.999) as f64 / room.latency.value_at_quantile(0.999) as f64
}
