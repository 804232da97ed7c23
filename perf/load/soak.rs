//! The soak: many minutes of churn across far more keys than the registry
//! may hold, with resident memory sampled every few seconds.
//!
//! The layer runs on a [`ManualClock`] that the harness moves 100 ms after
//! every batch, so each window holds exactly the last ten batches. At the end
//! of every "epoch" (ten batches, one full window) the handle's
//! `pass + block` summed over all keys must equal the requests of that
//! epoch: every request was counted once, whether its key was kept, newly
//! admitted after an eviction, or sent to the overflow entry. Memory is read
//! from `/proc/self/statm`; the whole process is measured (client and server
//! share it), which only makes a leak easier to see.
//!
//! Between epochs the clock jumps [`GAP`]. A key is idle, and may be
//! evicted, once neither its second nor its minute window holds an event,
//! so keys stay for about three epochs: the registry runs full, and sweeps
//! keep evicting the oldest keys while newer ones stay. Every tenth epoch is
//! a flood: more distinct keys in one window than `max_keys`, so the
//! overflow entry is exercised too.
//!
//! `soak --compact` soaks a compact layer (`SlidingWindowLayer::compact`)
//! instead: 1 000 000 keys by default and four times as many distinct keys,
//! [`COMPACT_KEYS_PER_BATCH`] new keys per batch. A compact key is idle once
//! its one-second window holds no pass, so after each gap every key is
//! idle, and once the table is full every new key takes the slot of an idle
//! one. No epoch floods (a window of more keys than the table holds would
//! take millions of requests; the hostile soak floods). The warm-up lasts
//! until twice `max_keys` distinct keys have been sent, so that every group
//! of the table has had its slots allocated and turned over; after it, the
//! resident set must stay within [`COMPACT_GROWTH`] of its first sample,
//! and every epoch's counts must match, or the soak fails.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tower_sliding_window::clock::ManualClock;

use crate::cli::Config;
use crate::client::{self, Tally};
use crate::ours;
use crate::progress::Progress;
use crate::servers::{self, Built, Server};

/// How often resident memory is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Connections the soak client uses.
const CONNECTIONS: usize = 32;

/// Distinct keys per batch in a normal epoch (each key is asked twice).
const KEYS_PER_BATCH: usize = 200;

/// How far the clock jumps between epochs (on top of the last 100 ms step).
const GAP: Duration = Duration::from_secs(20);

/// Distinct keys per batch in a flood epoch.
const FLOOD_KEYS_PER_BATCH: usize = 1_500;

/// Distinct keys per batch in the compact soak (each key is asked twice).
const COMPACT_KEYS_PER_BATCH: usize = 5_000;

/// The most the resident set may grow after the compact soak's warm-up,
/// as a share of its first sample after it: a leak of what an evicted key
/// held (its string, a few dozen bytes) over the millions of keys turned
/// over after the warm-up would exceed it many times.
const COMPACT_GROWTH: f64 = 0.05;

/// One memory sample.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Seconds since the soak started.
    pub secs: f64,
    /// Resident set size, KiB.
    pub rss_kib: u64,
}

/// What the soak saw.
#[derive(Debug, Clone, Default)]
pub struct SoakResult {
    /// Memory over time.
    pub samples: Vec<Sample>,
    /// Samples before this many seconds are warm-up.
    pub warmup_secs: f64,
    /// Epochs completed (each one full window).
    pub epochs: u64,
    /// Requests sent.
    pub sent: u64,
    /// Answers by class.
    pub tally: Tally,
    /// The handle's pass count, summed over epochs.
    pub handle_pass: u64,
    /// The handle's block count, summed over epochs.
    pub handle_block: u64,
    /// Epochs whose handle counts did not match what the client saw.
    pub mismatches: Vec<String>,
    /// The most keys the handle ever reported.
    pub max_len: usize,
    /// The registry bound.
    pub max_keys: usize,
    /// Distinct keys cycled through.
    pub keys: usize,
    /// Wall-clock length of the soak.
    pub elapsed: Duration,
    /// Whether the layer was a compact one.
    pub compact: bool,
}

impl SoakResult {
    /// Memory after warm-up: first, last, lowest, highest (KiB) and the
    /// least-squares slope in KiB per minute.
    pub fn memory_summary(&self) -> Option<(u64, u64, u64, u64, f64)> {
        let after: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.secs >= self.warmup_secs)
            .collect();
        let first = after.first()?.rss_kib;
        let last = after.last()?.rss_kib;
        let min = after.iter().map(|s| s.rss_kib).min()?;
        let max = after.iter().map(|s| s.rss_kib).max()?;
        let n = after.len() as f64;
        let mean_x = after.iter().map(|s| s.secs).sum::<f64>() / n;
        let mean_y = after.iter().map(|s| s.rss_kib as f64).sum::<f64>() / n;
        let (mut sxy, mut sxx) = (0.0, 0.0);
        for s in &after {
            sxy += (s.secs - mean_x) * (s.rss_kib as f64 - mean_y);
            sxx += (s.secs - mean_x) * (s.secs - mean_x);
        }
        let slope = if sxx > 0.0 { sxy / sxx * 60.0 } else { 0.0 };
        Some((first, last, min, max, slope))
    }

    /// The compact soak's memory check: `None` when the resident set after
    /// the warm-up stayed within [`COMPACT_GROWTH`] of its first sample
    /// (or for the full soak, which only reports its memory).
    pub fn memory_failure(&self) -> Option<String> {
        if !self.compact {
            return None;
        }
        let Some((first, _, _, max, slope)) = self.memory_summary() else {
            return Some(format!(
                "no memory sample after the warm-up ({:.0} s of {:.0} s): the soak was too short \
                 for {} distinct keys to pass through the table twice",
                self.warmup_secs,
                self.elapsed.as_secs_f64(),
                2 * self.max_keys
            ));
        };
        let allowed = first as f64 * (1.0 + COMPACT_GROWTH);
        (max as f64 > allowed).then(|| {
            format!(
                "the resident set grew after the warm-up: first {first} KiB, highest {max} KiB \
                 (allowed {allowed:.0} KiB), trend {slope:+.1} KiB/min"
            )
        })
    }
}

/// The kernel's page size in KiB (from `/proc/self/smaps`; 4 if unknown).
pub fn page_kib() -> u64 {
    std::fs::read_to_string("/proc/self/smaps")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("KernelPageSize:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(4)
}

/// Resident set size in KiB, from `/proc/self/statm`.
pub fn rss_kib(page_kib: u64) -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_kib)
}

/// Samples memory every [`SAMPLE_EVERY`] on a thread of its own until `stop`.
fn start_sampler(
    started: Instant,
    stop: Arc<AtomicBool>,
) -> (std::thread::JoinHandle<()>, Arc<Mutex<Vec<Sample>>>) {
    let samples = Arc::new(Mutex::new(Vec::new()));
    let out = Arc::clone(&samples);
    let page = page_kib();
    let handle = std::thread::spawn(move || {
        let mut next = started;
        while !stop.load(Ordering::Relaxed) {
            if Instant::now() >= next {
                if let Some(rss) = rss_kib(page) {
                    out.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(Sample {
                            secs: started.elapsed().as_secs_f64(),
                            rss_kib: rss,
                        });
                }
                next += SAMPLE_EVERY;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    (handle, samples)
}

/// Runs the soak for `config.soak_time`.
pub async fn run(config: &Config) -> Result<SoakResult, String> {
    let clock = ManualClock::new(1_000_000);
    let max_keys = config.soak_max_keys;
    let compact = config.compact;
    let layer_clock = clock.clone();
    let server = Server::start_with(config.server_threads, move || {
        let (router, stats) =
            ours::per_path(servers::base_router(), 1, max_keys, layer_clock, compact);
        Ok(Built {
            router,
            recorder: None,
            stats: Some(stats),
        })
    })?;
    let stats = server
        .stats
        .clone()
        .ok_or("the soak server has no statistics handle")?;
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let (sampler, samples) = start_sampler(started, Arc::clone(&stop));
    let mut result = SoakResult {
        // The compact soak's warm-up ends when enough keys have been sent.
        warmup_secs: if compact {
            f64::INFINITY
        } else {
            (config.soak_time.as_secs_f64() / 5.0).min(60.0)
        },
        max_keys,
        keys: config.soak_keys,
        compact,
        ..SoakResult::default()
    };
    // The most keys the handle may report: `max_keys` plus the overflow
    // entry; a compact table is made with 8/7 slots per key in groups of 16
    // (see `SlidingWindowLayer::compact`) and may fill them all.
    let bound = if compact {
        (max_keys * 8).div_ceil(7).div_ceil(16) * 16 + 1
    } else {
        max_keys + 1
    };
    let mut distinct_sent = 0usize;
    let mut conns = client::connect_many(server.addr, CONNECTIONS).await?;
    let mut next_key = 0usize;
    let deadline = started + config.soak_time;
    let mut progress = Progress::timed("soak", started, config.soak_time);
    while Instant::now() < deadline {
        let flood = !compact && result.epochs % 10 == 9;
        let per_batch = if compact {
            COMPACT_KEYS_PER_BATCH
        } else if flood {
            FLOOD_KEYS_PER_BATCH
        } else {
            KEYS_PER_BATCH
        };
        let mut epoch = Tally::default();
        for batch in 0..10 {
            let mut paths = Vec::with_capacity(per_batch * 2);
            for _ in 0..per_batch {
                let path = format!("/items/{next_key}");
                paths.push(path.clone());
                paths.push(path);
                next_key = (next_key + 1) % config.soak_keys;
            }
            distinct_sent += per_batch;
            let count = paths.len() as u64;
            let (back, answers) = client::fan_out(conns, paths).await?;
            conns = back;
            for answer in answers {
                epoch.add(Some(answer));
            }
            result.sent += count;
            if batch < 9 {
                clock.advance(Duration::from_millis(100));
            }
        }
        // The window now holds exactly this epoch's ten batches.
        let total = stats.total();
        let len = stats.len();
        result.max_len = result.max_len.max(len);
        result.handle_pass += total.pass;
        result.handle_block += total.block;
        if total.pass != epoch.ok || total.block != epoch.limited || epoch.other + epoch.failed > 0
        {
            result.mismatches.push(format!(
                "epoch {}: handle pass {} block {}, client saw 2xx {} 429 {} other {} failed {}",
                result.epochs,
                total.pass,
                total.block,
                epoch.ok,
                epoch.limited,
                epoch.other,
                epoch.failed
            ));
        }
        if len > bound {
            result.mismatches.push(format!(
                "epoch {}: {len} keys held, bound is {bound}",
                result.epochs
            ));
        }
        if compact && result.warmup_secs.is_infinite() && distinct_sent >= 2 * max_keys {
            result.warmup_secs = started.elapsed().as_secs_f64();
        }
        result.tally.merge(epoch);
        result.epochs += 1;
        progress.round(
            result.epochs,
            format_args!("{} requests, {len} keys held", result.sent),
        );
        clock.advance(Duration::from_millis(100) + GAP);
    }
    result.elapsed = started.elapsed();
    if result.warmup_secs.is_infinite() {
        // Never warmed up: no sample counts as after the warm-up.
        result.warmup_secs = result.elapsed.as_secs_f64();
    }
    stop.store(true, Ordering::Relaxed);
    sampler
        .join()
        .map_err(|_| "the memory sampler thread panicked".to_owned())?;
    result.samples = std::mem::take(&mut *samples.lock().unwrap_or_else(PoisonError::into_inner));
    drop(conns);
    drop(server);
    Ok(result)
}
