//! `load dashboard`: what readers of the dashboard cost the service it
//! watches.
//!
//! One server: the base app behind our layer keyed by path, with
//! [`KEYS`] keys in its table, and `dashboard::router` (default options)
//! nested at `/limits`, outside the limiter. The service's clients keep
//! `--connections` connections busy (closed loop), each request on the
//! next of the keys in turn, so every key has traffic. Each round measures
//! the service twice, once with no reader and once with [`READERS`]
//! clients reading `/limits/stats` back to back as fast as answers come
//! (what a page left open in many tabs, or a hostile reader, does), in an
//! order that alternates from round to round. The readers run on their own
//! thread, so their client work does not slow the service's clients.
//!
//! The figures: the service's p99 latency and throughput with readers, as
//! ratios to the same round without; the medians over rounds are reported.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use axum::Router;
use hdrhistogram::Histogram;
use tokio::time::Instant;
use tower_sliding_window::{dashboard, PathKey, SlidingWindowLayer};

use crate::bench::median;
use crate::cli::Config;
use crate::client::{self, Tally};
use crate::servers::{self, Built, Server, NEVER_REJECT};

/// Keys in the layer's table while measuring.
pub const KEYS: usize = 20_000;

/// Readers of the dashboard in the measurement with readers.
pub const READERS: usize = 8;

/// One measurement of the service.
#[derive(Debug, Clone)]
pub struct Run {
    /// Readers of `/limits/stats` meanwhile.
    pub readers: usize,
    /// The service's requests per second.
    pub rps: f64,
    /// The service's latency, microseconds.
    pub latency: Histogram<u64>,
    /// Answers the readers got, per second (all readers).
    pub reads_per_sec: f64,
    /// Bytes of one reader's answer, on average.
    pub read_bytes: u64,
}

/// Every round's pair of runs: without readers, then with.
pub fn run(config: &Config) -> Result<Vec<(Run, Run)>, String> {
    let server = Server::start_with(config.server_threads, || {
        let layer = SlidingWindowLayer::qps(NEVER_REJECT)
            .key(PathKey)
            .max_keys(2 * KEYS);
        let stats = layer.handle();
        let router: Router = servers::base_router()
            .layer(layer)
            .nest("/limits", dashboard::router(stats));
        Ok(Built {
            router,
            recorder: None,
            stats: None,
        })
    })?;
    let addr = server.addr;
    let runtime = client::runtime(config.client_threads)?;
    let paths: Arc<Vec<String>> = Arc::new((0..KEYS).map(|i| format!("/items/{i}")).collect());
    runtime.block_on(async {
        // Every key gets its entry before anything is measured.
        let mut conns = client::connect_many(addr, config.connections).await?;
        for chunk in paths.chunks(config.connections * 64) {
            let (back, answers) = client::fan_out(conns, chunk.to_vec()).await?;
            conns = back;
            if let Some(bad) = answers.iter().find(|a| a.status != 200) {
                return Err(format!("filling the key table: {bad:?}"));
            }
        }
        drop(conns);
        let mut rounds = Vec::new();
        for round in 0..config.rounds {
            let mut pair = [None, None];
            // Alternate which goes first, so drift lands on both alike.
            let order = if round % 2 == 0 {
                [0, READERS]
            } else {
                [READERS, 0]
            };
            for readers in order {
                let run = measure(addr, config, Arc::clone(&paths), readers).await?;
                eprintln!(
                    "load dashboard: round {}/{} with {readers} readers: {:.0} req/s, p99 {} µs, \
                     {:.0} reads/s",
                    round + 1,
                    config.rounds,
                    run.rps,
                    run.latency.value_at_quantile(0.99),
                    run.reads_per_sec
                );
                pair[usize::from(readers > 0)] = Some(run);
            }
            if let [Some(without), Some(with)] = pair {
                rounds.push((without, with));
            }
        }
        Ok(rounds)
    })
}

/// One run: the service under closed-loop load for `warmup + bench_time`
/// (measured over the last `bench_time`), with `readers` readers.
async fn measure(
    addr: SocketAddr,
    config: &Config,
    paths: Arc<Vec<String>>,
    readers: usize,
) -> Result<Run, String> {
    let start = Instant::now();
    let measure_from = start + config.warmup;
    let end = measure_from + config.bench_time;
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let read_bytes = Arc::new(AtomicU64::new(0));
    let reader_thread = (readers > 0).then(|| {
        let (stop, reads, read_bytes) = (
            Arc::clone(&stop),
            Arc::clone(&reads),
            Arc::clone(&read_bytes),
        );
        std::thread::spawn(move || read_until(addr, readers, measure_from, stop, reads, read_bytes))
    });
    let mut tasks = Vec::with_capacity(config.connections);
    for c in 0..config.connections {
        let mut conn = client::connect(addr).await?;
        let paths = Arc::clone(&paths);
        let step = config.connections;
        tasks.push(tokio::spawn(async move {
            let mut histogram = client::latency_histogram();
            let mut tally = Tally::default();
            let mut next = c;
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let answer = client::get(&mut conn, &paths[next % paths.len()]).await;
                next += step;
                let done = Instant::now();
                if sent >= measure_from && done <= end {
                    client::record(&mut histogram, done - sent);
                    tally.add(answer.as_ref().ok().copied());
                }
                if answer.is_err() {
                    break;
                }
            }
            (histogram, tally)
        }));
    }
    let (latency, tally) = client::join_closed(tasks).await?;
    stop.store(true, Ordering::Relaxed);
    if let Some(thread) = reader_thread {
        thread
            .join()
            .map_err(|_| "the reader thread panicked".to_owned())??;
    }
    if tally.ok != tally.answered() || tally.failed > 0 {
        return Err(format!(
            "the service did not answer 200 to everything: {tally:?}"
        ));
    }
    let seconds = config.bench_time.as_secs_f64();
    let reads = reads.load(Ordering::Relaxed);
    Ok(Run {
        readers,
        rps: tally.answered() as f64 / seconds,
        latency,
        reads_per_sec: reads as f64 / seconds,
        read_bytes: read_bytes.load(Ordering::Relaxed) / reads.max(1),
    })
}

/// `readers` connections reading `/limits/stats` back to back on a
/// runtime of this thread until `stop`; counts the answers (and their
/// bytes) from `measure_from` on.
fn read_until(
    addr: SocketAddr,
    readers: usize,
    measure_from: Instant,
    stop: Arc<AtomicBool>,
    reads: Arc<AtomicU64>,
    read_bytes: Arc<AtomicU64>,
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the readers' runtime: {e}"))?;
    runtime.block_on(async move {
        let mut tasks = Vec::new();
        for _ in 0..readers {
            let mut conn = client::connect(addr).await?;
            let (stop, reads, read_bytes) = (
                Arc::clone(&stop),
                Arc::clone(&reads),
                Arc::clone(&read_bytes),
            );
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let bytes = client::get_len(&mut conn, "/limits/stats").await?;
                    if Instant::now() >= measure_from {
                        reads.fetch_add(1, Ordering::Relaxed);
                        read_bytes.fetch_add(bytes, Ordering::Relaxed);
                    }
                }
                Ok::<(), String>(())
            }));
        }
        for task in tasks {
            task.await
                .map_err(|e| format!("a reader task failed: {e}"))??;
        }
        Ok(())
    })
}

/// The report's section: the rounds, then the medians of the ratios.
pub fn report(config: &Config, rounds: &[(Run, Run)]) -> String {
    let mut text = format!(
        "## The dashboard's readers against the service\n\n\
         {KEYS} keys, `dashboard::router` with its default options, {} service \
         connections (closed loop, a different key each request), server runtime {} worker \
         thread(s), {} s measured per run after {} s of warm-up, {} rounds alternating which \
         run goes first.\n\n\
         | round | readers | service req/s | p50 µs | p99 µs | reads/s | bytes/read |\n\
         |---|---|---|---|---|---|---|\n",
        config.connections,
        config.server_threads,
        config.bench_time.as_secs(),
        config.warmup.as_secs(),
        rounds.len(),
    );
    for (i, pair) in rounds.iter().enumerate() {
        for run in [&pair.0, &pair.1] {
            text.push_str(&format!(
                "| {} | {} | {:.0} | {} | {} | {:.0} | {} |\n",
                i + 1,
                run.readers,
                run.rps,
                run.latency.value_at_quantile(0.5),
                run.latency.value_at_quantile(0.99),
                run.reads_per_sec,
                run.read_bytes
            ));
        }
    }
    let (p99, rps) = ratios(rounds);
    text.push_str(&format!(
        "\nWith {READERS} readers, median over rounds: the service's p99 is **{p99:.2}x** and its \
         throughput **{rps:.2}x** of the same round without readers (target: p99 at most 2x, \
         throughput at least 0.8x).\n"
    ));
    text
}

/// The medians over rounds of the service's p99 and throughput with
/// readers as ratios to the same round without.
pub fn ratios(rounds: &[(Run, Run)]) -> (f64, f64) {
    let p99 = |run: &Run| run.latency.value_at_quantile(0.99) as f64;
    let mut p99s: Vec<f64> = rounds.iter().map(|(a, b)| p99(b) / p99(a)).collect();
    let mut rps: Vec<f64> = rounds.iter().map(|(a, b)| b.rps / a.rps).collect();
    (median(&mut p99s), median(&mut rps))
}

/// The ratios' targets: `Ok` when both medians are met.
pub fn check(rounds: &[(Run, Run)]) -> Result<(), String> {
    let (p99, rps) = ratios(rounds);
    if p99 <= 2.0 && rps >= 0.8 {
        Ok(())
    } else {
        Err(format!(
            "with {READERS} readers the service's p99 is {p99:.2}x (at most 2x) and its \
             throughput {rps:.2}x (at least 0.8x)"
        ))
    }
}
