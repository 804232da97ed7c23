//! Command line: which mode to run and the knobs each mode reads.
//!
//! The parser is deliberately tiny (`--name value` pairs after the mode) so
//! the harness needs nothing beyond the crate's dev-dependencies.

use std::path::PathBuf;
use std::time::Duration;

use crate::servers::Contender;

/// What the harness was asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Throughput and latency over loopback plus the in-process overhead rounds.
    Bench,
    /// Only the in-process per-request overhead rounds.
    Overhead,
    /// Admission accuracy under open-loop overload.
    Accuracy,
    /// Whether waiting exactly `Retry-After` gets the next attempt through.
    Retry,
    /// The long run with key churn and memory sampling.
    Soak,
    /// The few-second deterministic checks that CI runs.
    Short,
    /// Bench, accuracy and retry in one go (the reference run, soak excluded).
    All,
    /// The Redis store against local mode and a GCRA peer (feature `redis`).
    Redis,
    /// The service's latency and throughput with and without readers of
    /// the dashboard (feature `dashboard`).
    Dashboard,
    /// Resident memory per key of our tiers and governor's keyed limiter,
    /// each in a child process of its own.
    Memory,
    /// Admission latency with a full key table turning over, against one
    /// with room.
    Eviction,
    /// Goodput and latency at 1x, 2x and 4x a service's capacity, with no
    /// protection, tower's and tower-acc's concurrency limits and our
    /// system rule.
    Overload,
}

impl Mode {
    /// Parses a mode name as typed on the command line.
    fn parse(word: &str) -> Option<Mode> {
        Some(match word {
            "bench" => Mode::Bench,
            "overhead" => Mode::Overhead,
            "accuracy" => Mode::Accuracy,
            "retry" => Mode::Retry,
            "soak" => Mode::Soak,
            "short" => Mode::Short,
            "all" => Mode::All,
            "redis" => Mode::Redis,
            "dashboard" => Mode::Dashboard,
            "memory" => Mode::Memory,
            "eviction" => Mode::Eviction,
            "overload" => Mode::Overload,
            _ => return None,
        })
    }
}

/// Every setting of a run, with the defaults used for the reference run.
#[derive(Debug, Clone)]
pub struct Config {
    /// The mode to run.
    pub mode: Mode,
    /// Where charts and the Markdown report are written.
    pub out: PathBuf,
    /// Worker threads of each server's runtime.
    pub server_threads: usize,
    /// Worker threads of the client's runtime.
    pub client_threads: usize,
    /// Paired rounds in `bench` (each contender once per round).
    pub rounds: usize,
    /// Measured time per contender per round in `bench`.
    pub bench_time: Duration,
    /// Unmeasured warm-up before each `bench` measurement.
    pub warmup: Duration,
    /// Concurrent connections in `bench`.
    pub connections: usize,
    /// Paired rounds of the in-process overhead measurement.
    pub overhead_rounds: usize,
    /// Requests per contender per overhead round.
    pub overhead_requests: u64,
    /// The limit (passes per 1 s window) in `accuracy` and `retry`.
    pub limit: u64,
    /// The longest wait for a turn of the throttle contender in `accuracy`.
    pub max_wait: Duration,
    /// Length of each `accuracy` and `retry` scenario.
    pub scenario_time: Duration,
    /// Connections of the open-loop generator.
    pub open_connections: usize,
    /// Length of each `retry` setting.
    pub retry_time: Duration,
    /// Length of the soak.
    pub soak_time: Duration,
    /// `soak --hostile`: a flood of distinct maximum-size keys instead.
    pub hostile: bool,
    /// `soak --compact`: the soak's layer is a compact one.
    pub compact: bool,
    /// Distinct keys the soak cycles through.
    pub soak_keys: usize,
    /// The registry bound during the soak.
    pub soak_max_keys: usize,
    /// Run only the contenders with these slugs (all when empty).
    pub only: Vec<String>,
    /// Keys per subject in `memory` (and the `max_keys` of ours).
    pub memory_keys: u64,
    /// Keys inserted into the full tier in `memory`.
    pub memory_full_keys: u64,
    /// Keys per round of the compact tier in `eviction`.
    pub eviction_keys: usize,
    /// Keys per round of the full tier in `eviction`.
    pub eviction_full_keys: usize,
    /// Length of each measured level of `overload`.
    pub overload_time: Duration,
    /// The unmeasured warm-up at 1x before each contender's levels in
    /// `overload`.
    pub overload_warmup: Duration,
}

impl Config {
    /// Keeps the contenders the user asked for (all when `--only` is unset).
    pub fn select(&self, contenders: &[Contender]) -> Vec<Contender> {
        contenders
            .iter()
            .copied()
            .filter(|c| self.only.is_empty() || self.only.iter().any(|s| s == c.slug()))
            .collect()
    }

    /// The defaults for `mode`.
    fn defaults(mode: Mode) -> Config {
        Config {
            mode,
            out: PathBuf::from("target/load"),
            server_threads: 1,
            client_threads: 1,
            rounds: 4,
            bench_time: Duration::from_secs(4),
            warmup: Duration::from_secs(1),
            connections: 32,
            overhead_rounds: 60,
            overhead_requests: 20_000,
            limit: 100,
            max_wait: Duration::from_millis(500),
            scenario_time: Duration::from_secs(5),
            open_connections: 256,
            retry_time: Duration::from_secs(15),
            soak_time: Duration::from_secs(600),
            hostile: false,
            compact: false,
            soak_keys: 100_000,
            soak_max_keys: 10_000,
            only: Vec::new(),
            memory_keys: 1_000_000,
            memory_full_keys: 100_000,
            eviction_keys: 1_000_000,
            eviction_full_keys: 20_000,
            overload_time: Duration::from_secs(8),
            overload_warmup: Duration::from_secs(20),
        }
    }
}

/// `max_keys` of the compact soak unless given.
pub const COMPACT_SOAK_MAX_KEYS: usize = 1_000_000;

/// The usage text printed on `--help` or a bad argument.
pub const USAGE: &str = "\
usage: cargo run --release -p perf --bin load -- MODE [OPTIONS]

modes:
  bench      throughput and latency (loopback) + in-process overhead
  overhead   in-process overhead rounds only
  accuracy   admission accuracy at 2x, 5x, 20x the limit, steady and bursty
  retry      Retry-After honesty in steady overload
  soak       >= 10 minutes of key churn with memory sampling (not for CI);
             with --hostile: distinct near-maximum-size header and path
             keys (a share not UTF-8) through the default max_keys, for
             --soak-secs (90 s unless given), failing on memory growth;
             with --compact: a compact layer of 1000000 keys (unless
             --soak-max-keys), 4x as many distinct keys (unless
             --soak-keys) turning over, failing when a count is lost or
             memory grows after the table has turned over twice
  short      a few seconds of deterministic checks (CI)
  all        bench + accuracy + retry (the reference run)
  redis      the Redis store's latency and throughput against local mode
             and a GCRA Lua peer, then a limit shared by 3 replicas under
             2x overload (build with --features redis; REDIS_URL
             or a redis-server started on a free port); reads
             --overhead-requests, --connections, --bench-secs
  dashboard  the service's p99 and throughput with 0 and with 8 readers
             polling the dashboard's JSON, 20000 keys (feature
             dashboard, on by default); reads --rounds, --bench-secs,
             --warmup-secs, --connections, --server-threads; fails when
             the p99 grows over 2x or throughput falls under 0.8x
  memory     resident memory per key (growth of RSS over the keys) of
             our tiers and governor's keyed limiter, each subject in a
             child process of its own; reads --memory-keys and
             --memory-full-keys; fails when a compact subject costs
             more than its target (64 B per address, 128 B per string)
  eviction   admission latency (p50 to max) of a key table that is full
             and evicting idle keys, against one with room; reads
             --eviction-keys and --eviction-full-keys
  overload   goodput and admitted latency of a CPU-bound handler and of
             one waiting on a dependency whose latency triples, open loop
             at 1x, 2x and 4x the capacity measured first: no protection,
             tower ConcurrencyLimit + LoadShed, tower-acc (Vegas) +
             LoadShed, .system(SystemRule::bbr()) and the same with
             .max_concurrency(16); each server in a child
             process pinned to CPU 0 (the client on CPU 1); reads
             --server-threads, --open-connections, --overload-secs,
             --overload-warmup-secs, --only (workloads cpu, dependency
             and contenders none, tower, tower-acc, system,
             system-concurrency, each set all when none is named); fails
             when the system rule misses its targets on the CPU workload

options (defaults in brackets):
  --out DIR               charts and report [target/load]
  --server-threads N      server runtime workers [1]
  --client-threads N      client runtime workers [1]
  --rounds N              bench rounds, contenders alternated [4]
  --bench-secs S          measured seconds per contender per round [4]
  --warmup-secs S         warm-up before each measurement [1]
  --connections N         bench connections [32]
  --overhead-rounds N     in-process paired rounds [60]
  --overhead-requests N   requests per contender per round [20000]
  --limit N               passes per second in accuracy/retry [100]
  --max-wait-ms MS        the throttle contender's max_wait [500]
  --scenario-secs S       length of each accuracy/retry scenario [5]
  --open-connections N    open-loop generator connections [256]
  --retry-secs S          length of each retry setting [15]
  --soak-secs S           soak length [600; 90 with --hostile]
  --seconds S             the same as --soak-secs
  --hostile               soak with hostile keys (takes no value)
  --compact               soak a compact layer (takes no value)
  --soak-keys N           distinct keys in the soak [100000; 4x
                          --soak-max-keys with --compact]
  --soak-max-keys N       registry bound in the soak [10000; 1000000
                          with --compact]
  --memory-keys N         keys per subject in memory [1000000]
  --memory-full-keys N    keys of the full tier in memory [100000]
  --eviction-keys N       keys per round, compact tier, eviction [1000000]
  --eviction-full-keys N  keys per round, full tier, eviction [20000]
  --overload-secs S       measured seconds per level in overload [8]
  --overload-warmup-secs S  warm-up at 1x per contender in overload [20]
  --only SLUG,SLUG        run only these contenders (bare, noop, ours-global,
                          ours-path, ours-strict, ours-throttle,
                          governor-usual, governor-burst1,
                          tower-ratelimit) [all]
";

/// Parses the process arguments (without the program name).
///
/// Returns the usage text as the error for `--help` and for anything it
/// does not understand, so `main` can print it and exit non-zero.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Config, String> {
    let mut args = args.into_iter();
    let mode_word = args.next().ok_or_else(|| USAGE.to_owned())?;
    let mode =
        Mode::parse(&mode_word).ok_or_else(|| format!("unknown mode `{mode_word}`\n\n{USAGE}"))?;
    let mut config = Config::defaults(mode);
    let mut soak_time_set = false;
    let (mut soak_keys_set, mut soak_max_keys_set) = (false, false);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.to_owned());
        }
        if flag == "--compact" {
            if mode != Mode::Soak {
                return Err(format!("`--compact` goes with `soak` only\n\n{USAGE}"));
            }
            config.compact = true;
            continue;
        }
        soak_keys_set |= flag == "--soak-keys";
        soak_max_keys_set |= flag == "--soak-max-keys";
        if flag == "--hostile" {
            if mode != Mode::Soak {
                return Err(format!("`--hostile` goes with `soak` only\n\n{USAGE}"));
            }
            config.hostile = true;
            continue;
        }
        soak_time_set |= flag == "--soak-secs" || flag == "--seconds";
        let value = args
            .next()
            .ok_or_else(|| format!("`{flag}` needs a value\n\n{USAGE}"))?;
        apply(&mut config, &flag, &value)?;
    }
    if config.hostile && !soak_time_set {
        config.soak_time = Duration::from_secs(90);
    }
    if config.hostile && config.compact {
        return Err(format!(
            "`--hostile` and `--compact` do not go together\n\n{USAGE}"
        ));
    }
    if config.compact {
        if !soak_max_keys_set {
            config.soak_max_keys = COMPACT_SOAK_MAX_KEYS;
        }
        if !soak_keys_set {
            config.soak_keys = 4 * config.soak_max_keys;
        }
    }
    Ok(config)
}

/// Sets one option on `config`.
fn apply(config: &mut Config, flag: &str, value: &str) -> Result<(), String> {
    let number = || -> Result<u64, String> {
        value
            .parse::<u64>()
            .map_err(|e| format!("`{flag} {value}`: not a whole number ({e})"))
    };
    let count = || -> Result<usize, String> {
        let n = number()?;
        if n == 0 {
            return Err(format!("`{flag}` must be at least 1"));
        }
        usize::try_from(n).map_err(|_| format!("`{flag} {value}` is too large"))
    };
    let secs = || -> Result<Duration, String> { Ok(Duration::from_secs(number()?)) };
    match flag {
        "--out" => config.out = PathBuf::from(value),
        "--server-threads" => config.server_threads = count()?,
        "--client-threads" => config.client_threads = count()?,
        "--rounds" => config.rounds = count()?,
        "--bench-secs" => config.bench_time = secs()?,
        "--warmup-secs" => config.warmup = secs()?,
        "--connections" => config.connections = count()?,
        "--overhead-rounds" => config.overhead_rounds = count()?,
        "--overhead-requests" => config.overhead_requests = number()?.max(1),
        "--limit" => config.limit = number()?.max(10),
        "--max-wait-ms" => config.max_wait = Duration::from_millis(number()?),
        "--scenario-secs" => config.scenario_time = secs()?.max(Duration::from_secs(2)),
        "--open-connections" => config.open_connections = count()?,
        "--retry-secs" => config.retry_time = secs()?.max(Duration::from_secs(2)),
        "--soak-secs" | "--seconds" => config.soak_time = secs()?,
        "--soak-keys" => config.soak_keys = count()?,
        "--soak-max-keys" => config.soak_max_keys = count()?,
        "--memory-keys" => config.memory_keys = count()? as u64,
        "--memory-full-keys" => config.memory_full_keys = count()? as u64,
        "--eviction-keys" => config.eviction_keys = count()?,
        "--eviction-full-keys" => config.eviction_full_keys = count()?,
        "--overload-secs" => config.overload_time = secs()?.max(Duration::from_secs(4)),
        "--overload-warmup-secs" => config.overload_warmup = secs()?.max(Duration::from_secs(1)),
        "--only" => config.only = value.split(',').map(|s| s.trim().to_owned()).collect(),
        _ => return Err(format!("unknown option `{flag}`\n\n{USAGE}")),
    }
    Ok(())
}
