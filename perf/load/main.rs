//! Load harness: throughput, latency, accuracy, Retry-After honesty and a
//! soak, for our layer side by side with bare axum, a no-op layer,
//! tower_governor and tower's `RateLimitLayer`, all over loopback HTTP.
//!
//! ```text
//! cargo run --release -p perf --bin load -- bench
//! cargo run --release -p perf --bin load -- accuracy
//! cargo run --release -p perf --bin load -- retry
//! cargo run --release -p perf --bin load -- soak
//! cargo run --release -p perf --bin load -- soak --hostile --seconds 90
//! cargo run --release -p perf --bin load -- soak --compact
//! cargo run --release -p perf --bin load -- short
//! cargo run --release -p perf --bin load -- all --out docs/perf
//! cargo run --release -p perf --bin load --features redis -- redis
//! cargo run --release -p perf --bin load -- dashboard
//! cargo run --release -p perf --bin load -- memory
//! cargo run --release -p perf --bin load -- eviction
//! cargo run --release -p perf --bin load -- overload --out docs
//! ```
//!
//! `--help` lists the options. Every mode is bounded in time, binds only
//! `127.0.0.1`, and writes its charts and a Markdown report to `--out`
//! (`target/load` by default). `short` checks only what cannot flake and
//! exits non-zero, naming the check, when one fails; CI runs the same
//! checks as a test of this binary (`cargo test -p perf --bins`, a debug
//! build), so it needs no release build of the harness.

mod accuracy;
mod analysis;
mod bench;
mod cli;
mod client;
#[cfg(feature = "dashboard")]
mod dashboard;
mod direct;
mod eviction;
mod hostile;
mod memory;
mod ours;
mod overhead;
mod overload;
mod plots;
mod progress;
#[cfg(feature = "redis")]
mod redis_store;
mod report;
mod retry;
mod scenario;
mod servers;
mod short;
mod soak;

use std::process::ExitCode;

use cli::{Config, Mode};
use report::Report;

fn main() -> ExitCode {
    // A child of `load memory`: measure one subject and exit.
    if let Some(result) = memory::child_from_env() {
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("load memory (child): {message}");
                ExitCode::FAILURE
            }
        };
    }
    // A child of `load overload`: serve one contender until told to stop.
    if let Some(result) = overload::child_from_env() {
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("load overload (server): {message}");
                ExitCode::FAILURE
            }
        };
    }
    let config = match cli::parse(std::env::args().skip(1)) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(&config) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(message) => {
            eprintln!("load: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the selected mode; `Ok(false)` when a check failed.
fn run(config: &Config) -> Result<bool, String> {
    std::fs::create_dir_all(&config.out)
        .map_err(|e| format!("cannot create {}: {e}", config.out.display()))?;
    let mut report = Report::default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    report.note(&format!(
        "Conditions: {cores} cores visible, server runtime {} worker thread(s), client runtime {} \
         worker thread(s), client and server in one process over 127.0.0.1, release build.",
        config.server_threads, config.client_threads
    ));
    let mode = config.mode;
    if mode == Mode::Redis {
        return run_redis(config);
    }
    if mode == Mode::Dashboard {
        return run_dashboard(config);
    }
    if mode == Mode::Memory {
        return run_memory(config);
    }
    if mode == Mode::Eviction {
        return run_eviction(config);
    }
    if mode == Mode::Overload {
        return run_overload(config);
    }
    if mode != Mode::Soak {
        report.contenders();
    }
    let mut charts = Vec::new();
    if matches!(mode, Mode::Bench | Mode::Overhead | Mode::All) {
        let rows = overhead::run(config)?;
        report.overhead(&rows, config.overhead_rounds, config.overhead_requests);
    }
    let runtime = client::runtime(config.client_threads)?;
    let passed = runtime.block_on(async {
        let mut passed = true;
        if matches!(mode, Mode::Bench | Mode::All) {
            let rows = bench::run(config).await?;
            report.bench(
                &rows,
                config.connections,
                config.rounds,
                config.bench_time.as_secs(),
            );
            charts.push(plots::latency(&config.out, &rows)?);
        }
        if matches!(mode, Mode::Accuracy | Mode::All) {
            let runs = accuracy::run(config).await?;
            report.accuracy(&runs);
            report.flow(&runs);
            report.throttle(&runs, config.max_wait);
            let path = config.out.join("accuracy.json");
            let json = serde_json::to_string_pretty(&accuracy::to_json(&runs))
                .map_err(|e| format!("cannot encode the accuracy runs: {e}"))?;
            std::fs::write(&path, json)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            charts.extend(plots::accuracy(&config.out, &runs)?);
        }
        if matches!(mode, Mode::Retry | Mode::All) {
            let runs = retry::run(config).await?;
            report.retry(&runs, config.limit);
        }
        if mode == Mode::Soak && config.hostile {
            let result = hostile::run(config).await?;
            report.hostile(&result);
            charts.push(plots::hostile(&config.out, &result)?);
            let failures = result.failures();
            if failures.is_empty() {
                eprintln!("load soak --hostile: all checks passed");
            } else {
                eprintln!("load soak --hostile: {} check(s) FAILED:", failures.len());
                for failure in &failures {
                    eprintln!("  - {failure}");
                }
                passed = false;
            }
        } else if mode == Mode::Soak {
            let result = soak::run(config).await?;
            report.soak(&result);
            charts.push(plots::soak(&config.out, &result)?);
            let counted = result.handle_pass + result.handle_block;
            if !result.mismatches.is_empty() || counted != result.sent {
                eprintln!(
                    "load soak: FAILED: {} requests sent, the handle counted {counted}; {} window(s) \
                     did not match",
                    result.sent,
                    result.mismatches.len()
                );
                passed = false;
            }
            if let Some(failure) = result.memory_failure() {
                eprintln!("load soak --compact: FAILED: {failure}");
                passed = false;
            }
        }
        if mode == Mode::Short {
            // Nothing in short mode waits on time, so a stall means a hang.
            let failures = tokio::time::timeout(short::TIME_LIMIT, short::run(config))
                .await
                .map_err(|_| {
                    format!(
                        "short mode did not finish within {:?}: a server or the client hung",
                        short::TIME_LIMIT
                    )
                })??;
            if failures.is_empty() {
                println!("load short: all checks passed");
            } else {
                eprintln!("load short: {} check(s) FAILED:", failures.len());
                for failure in &failures {
                    eprintln!("  - {failure}");
                }
                passed = false;
            }
        }
        Ok::<bool, String>(passed)
    })?;
    runtime.shutdown_background();
    if mode != Mode::Short {
        report.charts(&charts);
        // The hostile soak writes next to the soak's report, not over it.
        let name = if config.hostile {
            "report-hostile.md"
        } else if config.compact {
            "report-compact.md"
        } else {
            "report.md"
        };
        let path = config.out.join(name);
        std::fs::write(&path, report.text())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("{}", report.text());
        eprintln!(
            "load: report and charts written to {}",
            config.out.display()
        );
    }
    Ok(passed)
}

/// `load memory`: one child process per subject; the table goes to
/// `report-memory.md`.
fn run_memory(config: &Config) -> Result<bool, String> {
    let plan = memory::Plan {
        keys: config.memory_keys,
        full_keys: config.memory_full_keys,
    };
    let rows = memory::run(plan, &memory::Subject::ALL)?;
    let text = format!(
        "Resident memory per key: growth of the resident set over the keys, each subject in a \
         fresh process.\n\n{}",
        memory::table(&rows)
    );
    let path = config.out.join("report-memory.md");
    std::fs::write(&path, &text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("{text}");
    let missed = memory::over_budget(&rows);
    for miss in &missed {
        eprintln!("load memory: target MISSED: {miss}");
    }
    Ok(missed.is_empty())
}

/// `load eviction`: the table goes to `report-eviction.md`.
fn run_eviction(config: &Config) -> Result<bool, String> {
    let mut rows = Vec::new();
    rows.extend(eviction::run(
        eviction::Tier::Compact,
        config.eviction_keys,
    )?);
    rows.extend(eviction::run(
        eviction::Tier::Full,
        config.eviction_full_keys,
    )?);
    let text = format!(
        "Admission latency, one request at a time in process, a new key each \
         (`PeerIpKey`, IPv4).\n\n{}",
        eviction::table(&rows)
    );
    let path = config.out.join("report-eviction.md");
    std::fs::write(&path, &text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("{text}");
    Ok(true)
}

/// `load overload`: the table goes to `report-overload.md`, the charts to
/// `overload-<workload>.svg`; fails when the system rule misses a target
/// on the CPU-bound workload.
fn run_overload(config: &Config) -> Result<bool, String> {
    let (results, pinned) = overload::run(config)?;
    let mut text = overload::report(config, &results, pinned);
    let mut charts = Vec::new();
    for result in &results {
        charts.push(plots::overload(&config.out, result)?);
    }
    text.push_str("Charts: ");
    text.push_str(&charts.join(", "));
    text.push('\n');
    let path = config.out.join("report-overload.md");
    std::fs::write(&path, &text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("{text}");
    let misses: Vec<String> = results.iter().flat_map(|r| r.misses()).collect();
    for miss in &misses {
        eprintln!("load overload: target MISSED: {miss}");
    }
    Ok(misses.is_empty())
}

/// `load redis`: its own runtime and report file (`report-redis.md`).
#[cfg(feature = "redis")]
fn run_redis(config: &Config) -> Result<bool, String> {
    let runtime = client::runtime(config.client_threads.max(2))?;
    let text = runtime.block_on(redis_store::run(config))?;
    let path = config.out.join("report-redis.md");
    std::fs::write(&path, &text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("{text}");
    Ok(true)
}

/// `load dashboard`: its own servers and report file
/// (`report-dashboard.md`); fails when a target is missed.
#[cfg(feature = "dashboard")]
fn run_dashboard(config: &Config) -> Result<bool, String> {
    let rounds = dashboard::run(config)?;
    let text = dashboard::report(config, &rounds);
    let path = config.out.join("report-dashboard.md");
    std::fs::write(&path, &text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("{text}");
    match dashboard::check(&rounds) {
        Ok(()) => Ok(true),
        Err(failure) => {
            eprintln!("load dashboard: FAILED: {failure}");
            Ok(false)
        }
    }
}

#[cfg(not(feature = "dashboard"))]
fn run_dashboard(_config: &Config) -> Result<bool, String> {
    Err("the dashboard mode needs the perf crate's `dashboard` feature".to_owned())
}

#[cfg(not(feature = "redis"))]
fn run_redis(_config: &Config) -> Result<bool, String> {
    Err("the redis mode needs `--features redis`".to_owned())
}
