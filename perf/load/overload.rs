//! `load overload`: what each kind of protection keeps of a service driven
//! past its capacity.
//!
//! Two workloads, each served by a child process of its own (this binary,
//! started again with [`SERVER_ENV`] set) so that the CPU the system rule
//! reads is the server's alone, not the load generator's:
//!
//! - `cpu`: the handler hashes [`CPU_CHUNKS`] chunks of [`CHUNK_BYTES`]
//!   bytes, yielding to the runtime between chunks as an async handler that
//!   works through a body does. Its capacity is the CPU.
//! - `dependency`: the handler hashes one chunk, then waits for one of
//!   [`POOL`] connections to a dependency and holds it while the dependency
//!   answers, after [`BASE_DEPENDENCY_MS`] ms. Its capacity is the pool. In
//!   the second half of every measured level the dependency's latency
//!   triples, so that its capacity falls to a third while the load goes on.
//!
//! On a machine with at least two CPUs the server is pinned to CPU 0
//! (`taskset -c 0`) with [`Config::server_threads`](crate::cli::Config)
//! runtime workers (one by default), and the load generator to CPU 1, so
//! the server's process may use exactly one CPU, which is what the system
//! rule measures its use against (the CPUs of its affinity mask).
//!
//! The run:
//!
//! 1. capacity: the unprotected server under closed-loop load (64
//!    connections); its requests per second are the capacity;
//! 2. unloaded latency: the unprotected server at 1/5 of its capacity,
//!    open loop;
//! 3. for each contender, a fresh server: a warm-up at 1x (long enough for
//!    the CPU average the system rule reads to rise: 16 s from idle to 80 %
//!    of a fully busy CPU), then 1x, 2x and 4x the capacity, open loop (each
//!    request due at a fixed instant whatever the server does; latency from
//!    that instant, so the client's queue is counted).
//!
//! The figures per level: goodput (2xx answers within [`DEADLINE`] of the
//! instant they were due, per second of the level), p50 and p99 latency of
//! the 2xx answers, refusals (any other status), and requests that got no
//! answer before the run stopped waiting (a second after the last was due).

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::State;
use axum::routing::get;
use axum::Router;
use hdrhistogram::Histogram;
use http::StatusCode;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tower::{BoxError, ServiceBuilder};
use tower_sliding_window::system::SystemRule;
use tower_sliding_window::{SlidingWindowLayer, StatsHandle};

use crate::cli::Config;
use crate::client::{self, latency_histogram, record};

/// Set in a server child's environment: `WORKLOAD CONTENDER WORKERS`.
pub const SERVER_ENV: &str = "PERF_LOAD_OVERLOAD_SERVER";

/// The line a server child prints once it listens: `LISTENING ADDR`.
const LISTENING: &str = "overload-listening";

/// The line a server child with a system rule prints every
/// [`STATUS_EVERY`]: `STATUS CPU ACTIVE IN_FLIGHT MAX_IN_FLIGHT`.
const STATUS: &str = "overload-status";

/// How often a server child reports its system rule's state.
const STATUS_EVERY: Duration = Duration::from_millis(250);

/// What a server child reads on its standard input: the dependency's
/// latency from now on, in milliseconds.
const SET_DEPENDENCY_MS: &str = "dependency-ms";

/// Chunks a `cpu` request hashes.
pub const CPU_CHUNKS: usize = 20;

/// Bytes of one chunk.
pub const CHUNK_BYTES: usize = 256 * 1024;

/// Connections to the dependency (`dependency` workload).
pub const POOL: usize = 16;

/// The dependency's latency before it triples.
pub const BASE_DEPENDENCY_MS: u64 = 20;

/// The fixed limit of tower's `ConcurrencyLimit` and of the system rule's
/// `max_concurrency` contender: the dependency's pool, and a few requests
/// per worker for the CPU-bound handler.
pub const FIXED_LIMIT: usize = 16;

/// A 2xx answer later than this after its due instant is not goodput.
pub const DEADLINE: Duration = Duration::from_secs(1);

/// The load factors, in the order they run.
pub const FACTORS: [u64; 3] = [1, 2, 4];

/// Connections of the closed-loop capacity measurement.
const CAPACITY_CONNECTIONS: usize = 64;

/// The unloaded latency is measured at this fraction of the capacity.
const UNLOADED_FRACTION: f64 = 0.2;

/// How long after a level began its requests count as settled.
pub const SETTLE: Duration = Duration::from_secs(3);

/// The pause between levels, so the last answers of one are not counted in
/// the next.
const PAUSE: Duration = Duration::from_secs(2);

/// What the handler does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Hashing, in chunks: CPU-bound.
    Cpu,
    /// Waiting on a pooled dependency whose latency triples mid-level.
    Dependency,
}

impl Workload {
    /// Both, in the order they run.
    pub const ALL: [Workload; 2] = [Workload::Cpu, Workload::Dependency];

    /// Its name in a child's environment and in file names.
    pub fn slug(self) -> &'static str {
        match self {
            Workload::Cpu => "cpu",
            Workload::Dependency => "dependency",
        }
    }

    fn from_slug(slug: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.slug() == slug)
    }

    /// What the handler does, for the report.
    pub fn describe(self) -> String {
        match self {
            Workload::Cpu => format!(
                "CPU-bound: each request hashes {CPU_CHUNKS} chunks of {} KiB (SipHash), \
                 yielding to the runtime between chunks",
                CHUNK_BYTES / 1024
            ),
            Workload::Dependency => format!(
                "a dependency: each request hashes one {} KiB chunk, then holds one of {POOL} \
                 pooled connections while the dependency answers after {BASE_DEPENDENCY_MS} ms; \
                 in the second half of every level the dependency takes {} ms",
                CHUNK_BYTES / 1024,
                3 * BASE_DEPENDENCY_MS
            ),
        }
    }
}

/// The protection in front of the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// None.
    None,
    /// tower's `ConcurrencyLimit` ([`FIXED_LIMIT`]) behind `LoadShed`,
    /// its errors answered 503 by axum's `HandleErrorLayer`.
    Tower,
    /// tower-acc's adaptive `ConcurrencyLimit` (Vegas, its defaults)
    /// behind `LoadShed`, the same way.
    TowerAcc,
    /// Our layer with `.system(SystemRule::bbr())` and a per-key limit it
    /// never reaches.
    System,
    /// The same with `.max_concurrency(FIXED_LIMIT)` added.
    SystemConcurrency,
}

impl Guard {
    /// Every contender, in the order they run.
    pub const ALL: [Guard; 5] = [
        Guard::None,
        Guard::Tower,
        Guard::TowerAcc,
        Guard::System,
        Guard::SystemConcurrency,
    ];

    /// Its name in a child's environment.
    pub fn slug(self) -> &'static str {
        match self {
            Guard::None => "none",
            Guard::Tower => "tower",
            Guard::TowerAcc => "tower-acc",
            Guard::System => "system",
            Guard::SystemConcurrency => "system-concurrency",
        }
    }

    fn from_slug(slug: &str) -> Option<Guard> {
        Guard::ALL.into_iter().find(|g| g.slug() == slug)
    }

    /// Its name in the table and the charts.
    pub fn name(self) -> String {
        match self {
            Guard::None => "no protection".to_owned(),
            Guard::Tower => format!("tower ConcurrencyLimit({FIXED_LIMIT}) + LoadShed"),
            Guard::TowerAcc => "tower-acc Vegas + LoadShed".to_owned(),
            Guard::System => ".system(SystemRule::bbr())".to_owned(),
            Guard::SystemConcurrency => {
                format!(".system(SystemRule::bbr().max_concurrency({FIXED_LIMIT}))")
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The server child.

/// The server, when this process is a child of `load overload`: serves
/// until its standard input closes.
pub fn child_from_env() -> Option<Result<(), String>> {
    let spec = std::env::var(SERVER_ENV).ok()?;
    Some(serve_child(&spec))
}

fn serve_child(spec: &str) -> Result<(), String> {
    let words: Vec<&str> = spec.split_whitespace().collect();
    let [workload, guard, workers] = words[..] else {
        return Err(format!(
            "{SERVER_ENV}: expected `WORKLOAD CONTENDER WORKERS`, got `{spec}`"
        ));
    };
    let workload = Workload::from_slug(workload)
        .ok_or_else(|| format!("{SERVER_ENV}: unknown workload `{workload}`"))?;
    let guard = Guard::from_slug(guard)
        .ok_or_else(|| format!("{SERVER_ENV}: unknown contender `{guard}`"))?;
    let workers: usize = workers
        .parse()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{SERVER_ENV}: `{workers}` is not a number of workers"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("overload-server")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the server runtime: {e}"))?;
    let dependency_ms = Arc::new(AtomicU64::new(BASE_DEPENDENCY_MS));
    let result = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("cannot bind a loopback port: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("cannot read the bound address: {e}"))?;
        let (router, stats) = app(workload, guard, Arc::clone(&dependency_ms));
        tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, router).await {
                eprintln!("load overload (server): stopped: {error}");
            }
        });
        say(&format!("{LISTENING} {addr}"))?;
        if let Some(stats) = stats {
            tokio::spawn(report_status(stats));
        }
        // Standard input on a thread of its own: its end (the parent closed
        // it, or died) ends the server.
        let (tx, mut rx) = mpsc::unbounded_channel::<String>();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        while let Some(line) = rx.recv().await {
            let ms = line
                .strip_prefix(SET_DEPENDENCY_MS)
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| format!("load overload (server): cannot read `{line}`"))?;
            dependency_ms.store(ms, Ordering::Relaxed);
        }
        Ok::<(), String>(())
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// Prints one line on standard output, at once.
fn say(line: &str) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write to the parent: {e}"))
}

/// Prints the system rule's state every [`STATUS_EVERY`].
async fn report_status(stats: StatsHandle<()>) {
    loop {
        tokio::time::sleep(STATUS_EVERY).await;
        let Some(s) = stats.system() else { return };
        let line = format!(
            "{STATUS} {} {} {} {}",
            s.cpu,
            u8::from(s.bbr_active),
            s.in_flight,
            s.max_in_flight
        );
        if say(&line).is_err() {
            return;
        }
    }
}

/// What the handlers share.
#[derive(Clone)]
struct AppState {
    /// The dependency's latency now, in milliseconds. Relaxed: one figure
    /// read on its own.
    dependency_ms: Arc<AtomicU64>,
    /// The dependency's connections.
    pool: Arc<Semaphore>,
}

/// The workload's app behind `guard`, and our layer's handle for ours.
fn app(
    workload: Workload,
    guard: Guard,
    dependency_ms: Arc<AtomicU64>,
) -> (Router, Option<StatsHandle<()>>) {
    let state = AppState {
        dependency_ms,
        pool: Arc::new(Semaphore::new(POOL)),
    };
    let router = match workload {
        Workload::Cpu => Router::new().route("/work", get(cpu_handler)),
        Workload::Dependency => Router::new().route("/work", get(dependency_handler)),
    }
    .with_state(state);
    let shed = |_: BoxError| async { StatusCode::SERVICE_UNAVAILABLE };
    match guard {
        Guard::None => (router, None),
        Guard::Tower => (
            router.layer(
                ServiceBuilder::new()
                    .layer(HandleErrorLayer::new(shed))
                    .load_shed()
                    .concurrency_limit(FIXED_LIMIT),
            ),
            None,
        ),
        Guard::TowerAcc => (
            router.layer(
                ServiceBuilder::new()
                    .layer(HandleErrorLayer::new(shed))
                    .load_shed()
                    .layer(tower_acc::ConcurrencyLimitLayer::new(
                        tower_acc::Vegas::default(),
                    )),
            ),
            None,
        ),
        Guard::System | Guard::SystemConcurrency => {
            let rule = if guard == Guard::System {
                SystemRule::bbr()
            } else {
                SystemRule::bbr().max_concurrency(FIXED_LIMIT as u64)
            };
            let layer = SlidingWindowLayer::qps(crate::servers::NEVER_REJECT).system(rule);
            let stats = layer.handle();
            (router.layer(layer), Some(stats))
        }
    }
}

/// The bytes every request hashes.
fn chunk() -> &'static [u8] {
    static CHUNK: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    CHUNK.get_or_init(|| {
        // Any bytes do; these are not all alike.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        (0..CHUNK_BYTES)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    })
}

/// Hashes `chunks` chunks, yielding between them; the digest, so the work
/// is not optimised away.
async fn hash_chunks(chunks: usize) -> u64 {
    use std::hash::Hasher as _;
    let mut hasher = std::hash::DefaultHasher::new();
    for i in 0..chunks {
        if i > 0 {
            tokio::task::yield_now().await;
        }
        hasher.write(chunk());
    }
    hasher.finish()
}

async fn cpu_handler() -> String {
    format!("{:016x}", hash_chunks(CPU_CHUNKS).await)
}

async fn dependency_handler(State(state): State<AppState>) -> Result<String, StatusCode> {
    let digest = hash_chunks(1).await;
    let _connection = state
        .pool
        .acquire()
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    let ms = state.dependency_ms.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    Ok(format!("{digest:016x}"))
}

// ---------------------------------------------------------------------------
// The parent: server children and the load.

/// A running server child. Dropping it closes its standard input, which
/// stops it, and reaps it (killing it if it has not gone within 3 s).
struct Server {
    workload: Workload,
    guard: Guard,
    process: Child,
    stdin: Arc<Mutex<Option<ChildStdin>>>,
    addr: SocketAddr,
    /// The system rule's state lines, with when they arrived.
    status: Arc<Mutex<Vec<(Instant, Status)>>>,
}

/// One state line of a server child's system rule.
#[derive(Debug, Clone, Copy)]
struct Status {
    cpu: f64,
    active: bool,
    max_in_flight: u64,
}

impl Status {
    fn parse(line: &str) -> Option<Status> {
        let mut words = line.strip_prefix(STATUS)?.split_whitespace();
        let cpu = words.next()?.parse().ok()?;
        let active = words.next()? == "1";
        let _in_flight: u64 = words.next()?.parse().ok()?;
        let max_in_flight = words.next()?.parse().ok()?;
        Some(Status {
            cpu,
            active,
            max_in_flight,
        })
    }
}

/// Where the server and the client run.
#[derive(Debug, Clone, Copy)]
struct Pinning {
    /// `taskset -c 0` for the server, CPU 1 for this process.
    pinned: bool,
}

impl Server {
    fn start(
        workload: Workload,
        guard: Guard,
        workers: usize,
        pinning: Pinning,
    ) -> Result<Server, String> {
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find this program to start a server: {e}"))?;
        let mut command = if pinning.pinned {
            let mut c = Command::new("taskset");
            c.arg("-c").arg("0").arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        command
            .env(
                SERVER_ENV,
                format!("{} {} {workers}", workload.slug(), guard.slug()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut process = command
            .spawn()
            .map_err(|e| format!("cannot start a server child: {e}"))?;
        let stdin = process.stdin.take();
        let stdout = process
            .stdout
            .take()
            .ok_or("the server child has no standard output")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = match lines.next() {
            Some(Ok(line)) => line,
            _ => {
                let _ = process.kill();
                let _ = process.wait();
                return Err(format!(
                    "the {} server child ({}) ended before it listened",
                    workload.slug(),
                    guard.slug()
                ));
            }
        };
        let addr = first
            .strip_prefix(LISTENING)
            .and_then(|a| a.trim().parse::<SocketAddr>().ok())
            .ok_or_else(|| format!("the server child said `{first}`, not where it listens"))?;
        let status = Arc::new(Mutex::new(Vec::new()));
        let notes = Arc::clone(&status);
        std::thread::spawn(move || {
            for line in lines {
                let Ok(line) = line else { break };
                if let Some(s) = Status::parse(&line) {
                    notes
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((Instant::now(), s));
                }
            }
        });
        Ok(Server {
            workload,
            guard,
            process,
            stdin: Arc::new(Mutex::new(stdin)),
            addr,
            status,
        })
    }

    /// A handle that sets the dependency's latency.
    fn dependency(&self) -> Dependency {
        Dependency(Arc::clone(&self.stdin))
    }

    /// The state lines that arrived between `from` and `to`.
    fn status_between(&self, from: Instant, to: Instant) -> Vec<Status> {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .map(|(_, s)| *s)
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(
            self.stdin
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let give_up = std::time::Instant::now() + Duration::from_secs(3);
        while std::time::Instant::now() < give_up {
            if let Ok(Some(_)) = self.process.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Sets a server child's dependency latency.
#[derive(Clone)]
struct Dependency(Arc<Mutex<Option<ChildStdin>>>);

impl Dependency {
    fn set_ms(&self, ms: u64) -> Result<(), String> {
        let mut guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let stdin = guard.as_mut().ok_or("the server child's input is closed")?;
        writeln!(stdin, "{SET_DEPENDENCY_MS} {ms}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("cannot tell the server child the dependency's latency: {e}"))
    }
}

/// What one open-loop level saw.
#[derive(Debug, Clone)]
pub struct Level {
    /// Offered load as a multiple of the capacity.
    pub factor: u64,
    /// Requests per second offered.
    pub offered: f64,
    /// Its length.
    pub secs: f64,
    /// 2xx answers within [`DEADLINE`] of their due instant.
    pub good: u64,
    /// 2xx answers later than that.
    pub late: u64,
    /// Non-2xx answers.
    pub refused: u64,
    /// Requests that failed at the transport level or got no answer before
    /// the run stopped waiting.
    pub lost: u64,
    /// Latency of the 2xx answers, microseconds, from their due instant.
    pub admitted: Histogram<u64>,
    /// The same for the requests due [`SETTLE`] or more after the level
    /// began: what the protection holds once it has reacted to the step.
    pub admitted_settled: Histogram<u64>,
    /// The system rule's CPU reading over the level (mean, max), when the
    /// contender is ours.
    pub cpu: Option<(f64, f64)>,
    /// The share of the level's state lines with the BBR check running.
    pub bbr_active: Option<f64>,
    /// The median of BBR's estimate over the level.
    pub max_in_flight: Option<u64>,
}

impl Level {
    /// Goodput: 2xx answers within the deadline, per second.
    pub fn goodput(&self) -> f64 {
        self.good as f64 / self.secs
    }

    /// A quantile of the admitted latency, in milliseconds (0 with none).
    pub fn admitted_ms(&self, q: f64) -> f64 {
        quantile_ms(&self.admitted, q)
    }

    /// The same, of the requests due once the level had settled.
    pub fn settled_ms(&self, q: f64) -> f64 {
        quantile_ms(&self.admitted_settled, q)
    }
}

/// A quantile as a table cell: `-` with no answer to take it from.
fn cell_ms(histogram: &Histogram<u64>, q: f64) -> String {
    if histogram.is_empty() {
        "-".to_owned()
    } else {
        format!("{:.1} ms", quantile_ms(histogram, q))
    }
}

fn quantile_ms(histogram: &Histogram<u64>, q: f64) -> f64 {
    if histogram.is_empty() {
        0.0
    } else {
        histogram.value_at_quantile(q) as f64 / 1000.0
    }
}

/// One contender's levels.
#[derive(Debug, Clone)]
pub struct Run {
    /// The protection.
    pub guard: Guard,
    /// 1x, 2x and 4x, in order.
    pub levels: Vec<Level>,
}

/// One workload's whole run.
#[derive(Debug, Clone)]
pub struct WorkloadResult {
    /// The workload.
    pub workload: Workload,
    /// Requests per second of the unprotected server, closed loop.
    pub capacity: f64,
    /// The unprotected server at [`UNLOADED_FRACTION`] of its capacity.
    pub unloaded: Level,
    /// Every contender.
    pub runs: Vec<Run>,
}

impl WorkloadResult {
    /// Whether `.system(SystemRule::bbr())` met the targets (the CPU
    /// workload only; none are set for the other):
    /// goodput at 4x at least 90 % of that at 1x, and the admitted p99 of
    /// every level within 3x the unloaded p99. The misses, named.
    pub fn misses(&self) -> Vec<String> {
        let mut misses = Vec::new();
        if self.workload != Workload::Cpu {
            return misses;
        }
        let Some(run) = self.runs.iter().find(|r| r.guard == Guard::System) else {
            return misses;
        };
        let (Some(first), Some(last)) = (run.levels.first(), run.levels.last()) else {
            return misses;
        };
        if last.goodput() < 0.9 * first.goodput() {
            misses.push(format!(
                "{}: goodput at {}x {:.0}/s is under 90 % of {:.0}/s at {}x",
                self.workload.slug(),
                last.factor,
                last.goodput(),
                first.goodput(),
                first.factor
            ));
        }
        let unloaded = self.unloaded.admitted_ms(0.99);
        for level in &run.levels {
            let p99 = level.admitted_ms(0.99);
            if p99 > 3.0 * unloaded {
                misses.push(format!(
                    "{}: admitted p99 at {}x {p99:.1} ms is over 3x the unloaded {unloaded:.1} ms",
                    self.workload.slug(),
                    level.factor
                ));
            }
        }
        misses
    }
}

/// What `--only` keeps of an overload run: the workloads it names (both
/// when it names none) and the contenders it names (all when it names
/// none). A slug that is neither is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The workloads to run, in the order they run.
    pub workloads: Vec<Workload>,
    /// The contenders to run on each, in the order they run.
    pub guards: Vec<Guard>,
}

impl Selection {
    /// Reads `--only` (`config.only`).
    pub fn of(only: &[String]) -> Result<Selection, String> {
        for slug in only {
            if Workload::from_slug(slug).is_none() && Guard::from_slug(slug).is_none() {
                return Err(format!(
                    "`--only {slug}`: not a workload ({}) nor a contender ({})",
                    Workload::ALL.map(Workload::slug).join(", "),
                    Guard::ALL.map(Guard::slug).join(", ")
                ));
            }
        }
        let named = |slug: &str| only.iter().any(|s| s == slug);
        let workloads: Vec<Workload> = Workload::ALL
            .into_iter()
            .filter(|w| named(w.slug()))
            .collect();
        let guards: Vec<Guard> = Guard::ALL.into_iter().filter(|g| named(g.slug())).collect();
        Ok(Selection {
            workloads: if workloads.is_empty() {
                Workload::ALL.to_vec()
            } else {
                workloads
            },
            guards: if guards.is_empty() {
                Guard::ALL.to_vec()
            } else {
                guards
            },
        })
    }
}

/// Runs both workloads with every contender, or what `--only` names (see
/// [`Selection`]); also whether the server and the client were pinned to
/// a CPU each.
pub fn run(config: &Config) -> Result<(Vec<WorkloadResult>, bool), String> {
    let selection = Selection::of(&config.only)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pinning = Pinning {
        pinned: cores >= 2 && pin_self_to_cpu_1(),
    };
    let runtime = client::runtime(config.client_threads)?;
    let mut results = Vec::new();
    for &workload in &selection.workloads {
        results.push(runtime.block_on(run_workload(
            config,
            workload,
            &selection.guards,
            pinning,
        ))?);
    }
    runtime.shutdown_background();
    Ok((results, pinning.pinned))
}

/// Pins this process (every thread, and the threads it starts later) to
/// CPU 1; false when `taskset` could not.
fn pin_self_to_cpu_1() -> bool {
    Command::new("taskset")
        .args(["-a", "-p", "-c", "1"])
        .arg(std::process::id().to_string())
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

async fn run_workload(
    config: &Config,
    workload: Workload,
    guards: &[Guard],
    pinning: Pinning,
) -> Result<WorkloadResult, String> {
    let workers = config.server_threads;
    let (capacity, unloaded) = {
        let server = Server::start(workload, Guard::None, workers, pinning)?;
        let closed = client::closed_loop(
            server.addr,
            CAPACITY_CONNECTIONS,
            Duration::from_secs(2),
            config.overload_time,
            "/work",
        )
        .await?;
        let capacity = closed.tally.ok as f64 / closed.elapsed.as_secs_f64();
        if capacity < 10.0 {
            return Err(format!(
                "{}: the unprotected server answered {capacity:.1} requests per second; too few \
                 to scale a load from",
                workload.slug()
            ));
        }
        eprintln!(
            "load overload: {}: capacity {capacity:.0} requests/s ({} workers)",
            workload.slug(),
            workers
        );
        tokio::time::sleep(PAUSE).await;
        let unloaded = drive(
            &server,
            config,
            0,
            capacity * UNLOADED_FRACTION,
            config.overload_time,
            None,
        )
        .await?;
        eprintln!(
            "load overload: {}: unloaded p50 {:.2} ms, p99 {:.2} ms",
            workload.slug(),
            unloaded.admitted_ms(0.5),
            unloaded.admitted_ms(0.99)
        );
        (capacity, unloaded)
    };
    let mut runs = Vec::new();
    for &guard in guards {
        let server = Server::start(workload, guard, workers, pinning)?;
        let slows = workload == Workload::Dependency;
        // The warm-up: 1x, unmeasured, the dependency at its usual speed.
        drive(&server, config, 1, capacity, config.overload_warmup, None).await?;
        tokio::time::sleep(PAUSE).await;
        let mut levels = Vec::new();
        for factor in FACTORS {
            let dependency = slows.then(|| server.dependency());
            let level = drive(
                &server,
                config,
                factor,
                capacity * factor as f64,
                config.overload_time,
                dependency,
            )
            .await?;
            eprintln!(
                "load overload: {} {} {factor}x: goodput {:.0}/s, admitted p50 {:.2} ms p99 \
                 {:.2} ms (from 3 s: {:.2} ms), refused {}, late {}, lost {}{}",
                workload.slug(),
                guard.slug(),
                level.goodput(),
                level.admitted_ms(0.5),
                level.admitted_ms(0.99),
                level.settled_ms(0.99),
                level.refused,
                level.late,
                level.lost,
                level
                    .cpu
                    .map(|(mean, max)| format!(
                        ", cpu {mean:.2} (max {max:.2}), bbr active {:.0} %, max_in_flight {}",
                        100.0 * level.bbr_active.unwrap_or(0.0),
                        level.max_in_flight.unwrap_or(0)
                    ))
                    .unwrap_or_default()
            );
            levels.push(level);
            tokio::time::sleep(PAUSE).await;
        }
        runs.push(Run { guard, levels });
    }
    Ok(WorkloadResult {
        workload,
        capacity,
        unloaded,
        runs,
    })
}

/// Where `drive` writes every request and state line of each level, when
/// [`TRACE_ENV`] is set: for looking into a run, not for the report.
fn trace_dir() -> Option<std::path::PathBuf> {
    std::env::var_os(TRACE_ENV).map(std::path::PathBuf::from)
}

/// Names a directory for per-request traces of every level.
pub const TRACE_ENV: &str = "PERF_LOAD_OVERLOAD_TRACE";

/// Writes one level's requests (`due_ms latency_ms status`, status 0 for
/// a transport failure) and the server's state lines (`at_ms cpu active
/// max_in_flight`) under `dir`.
fn write_trace(
    dir: &std::path::Path,
    server: &Server,
    factor: u64,
    start: Instant,
    ended: Instant,
    mut trace: Vec<(u64, u64, u16)>,
) -> Result<(), String> {
    use std::fmt::Write as _;
    trace.sort_unstable();
    let stem = format!(
        "{}-{}-{factor}x",
        server.workload.slug(),
        server.guard.slug()
    );
    let mut text = String::new();
    for (due, latency, status) in trace {
        let _ = writeln!(
            text,
            "{:.1}\t{:.2}\t{status}",
            due as f64 / 1000.0,
            latency as f64 / 1000.0
        );
    }
    let path = dir.join(format!("{stem}-requests.tsv"));
    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let mut text = String::new();
    for (at, s) in server
        .status
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|(at, _)| *at >= start && *at <= ended)
    {
        let _ = writeln!(
            text,
            "{:.0}\t{:.3}\t{}\t{}",
            at.duration_since(start).as_secs_f64() * 1000.0,
            s.cpu,
            u8::from(s.active),
            s.max_in_flight
        );
    }
    let path = dir.join(format!("{stem}-status.tsv"));
    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Drives `server` open loop at `rate` requests per second for `time`;
/// with `dependency`, the dependency's latency triples halfway through and
/// is set back after.
async fn drive(
    server: &Server,
    config: &Config,
    factor: u64,
    rate: f64,
    time: Duration,
    dependency: Option<Dependency>,
) -> Result<Level, String> {
    let count = (rate * time.as_secs_f64()).round().max(1.0) as u64;
    let interval_ns = 1e9 / rate;
    let mut conns = Vec::with_capacity(config.open_connections);
    for _ in 0..config.open_connections {
        conns.push(client::connect(server.addr).await?);
    }
    // Everything is due from a little after the connections are open.
    let start = Instant::now() + Duration::from_millis(50);
    let due = move |i: u64| start + Duration::from_nanos((i as f64 * interval_ns) as u64);
    let last_due = due(count - 1);
    let settled = start + SETTLE;
    let (tx, rx) = mpsc::unbounded_channel::<Instant>();
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    // (good, late, refused, failed, admitted latency), per connection,
    // updated after every answer so an aborted worker loses nothing.
    type Partial = (
        u64,
        u64,
        u64,
        u64,
        Histogram<u64>,
        Vec<(u64, u64, u16)>,
        Histogram<u64>,
    );
    let mut partials: Vec<Arc<Mutex<Partial>>> = Vec::new();
    let mut workers = Vec::new();
    let tracing = trace_dir().is_some();
    for mut conn in conns {
        let rx = Arc::clone(&rx);
        let partial = Arc::new(Mutex::new((
            0,
            0,
            0,
            0,
            latency_histogram(),
            Vec::new(),
            latency_histogram(),
        )));
        partials.push(Arc::clone(&partial));
        let addr = server.addr;
        workers.push(tokio::spawn(async move {
            loop {
                let next = rx.lock().await.recv().await;
                let Some(at) = next else { break };
                let answer = client::get(&mut conn, "/work").await;
                let elapsed = at.elapsed();
                {
                    let mut p = partial.lock().unwrap_or_else(PoisonError::into_inner);
                    if tracing {
                        let status = answer.as_ref().map_or(0, |a| a.status);
                        let due_us = at.duration_since(start).as_micros() as u64;
                        p.5.push((due_us, elapsed.as_micros() as u64, status));
                    }
                    match answer.as_ref().map(|a| a.status) {
                        Ok(200..=299) => {
                            if elapsed <= DEADLINE {
                                p.0 += 1;
                            } else {
                                p.1 += 1;
                            }
                            record(&mut p.4, elapsed);
                            if at >= settled {
                                record(&mut p.6, elapsed);
                            }
                        }
                        Ok(_) => p.2 += 1,
                        Err(_) => p.3 += 1,
                    }
                }
                if answer.is_err() {
                    match client::connect(addr).await {
                        Ok(fresh) => conn = fresh,
                        Err(_) => break,
                    }
                }
            }
        }));
    }
    let switch = dependency.map(|dependency| {
        let half = start + time / 2;
        tokio::spawn(async move {
            tokio::time::sleep_until(half).await;
            dependency.set_ms(3 * BASE_DEPENDENCY_MS)
        })
    });
    for i in 0..count {
        let at = due(i);
        tokio::time::sleep_until(at).await;
        if tx.send(at).is_err() {
            break;
        }
    }
    drop(tx);
    // Anything answered after this is past its deadline anyway.
    let stop = last_due + DEADLINE + Duration::from_millis(100);
    for worker in workers {
        let abort = worker.abort_handle();
        if tokio::time::timeout_at(stop, worker).await.is_err() {
            abort.abort();
        }
    }
    let ended = Instant::now();
    if let Some(switch) = switch {
        switch
            .await
            .map_err(|e| format!("the dependency switch failed: {e}"))??;
        server.dependency().set_ms(BASE_DEPENDENCY_MS)?;
    }
    let (mut good, mut late, mut refused, mut failed) = (0, 0, 0, 0);
    let mut admitted = latency_histogram();
    let mut admitted_settled = latency_histogram();
    let mut trace = Vec::new();
    for partial in partials {
        let mut p = partial.lock().unwrap_or_else(PoisonError::into_inner);
        trace.append(&mut p.5);
        good += p.0;
        late += p.1;
        refused += p.2;
        failed += p.3;
        admitted
            .add(&p.4)
            .map_err(|e| format!("cannot merge histograms: {e}"))?;
        admitted_settled
            .add(&p.6)
            .map_err(|e| format!("cannot merge histograms: {e}"))?;
    }
    let answered = good + late + refused;
    let lost = count.saturating_sub(answered);
    debug_assert!(lost >= failed);
    let status = server.status_between(start, ended);
    if let Some(dir) = trace_dir() {
        write_trace(&dir, server, factor, start, ended, trace)?;
    }
    let (cpu, bbr_active, max_in_flight) = if status.is_empty() {
        (None, None, None)
    } else {
        let n = status.len() as f64;
        let mean = status.iter().map(|s| s.cpu).sum::<f64>() / n;
        let max = status.iter().map(|s| s.cpu).fold(0.0, f64::max);
        let active = status.iter().filter(|s| s.active).count() as f64 / n;
        let mut estimates: Vec<u64> = status.iter().map(|s| s.max_in_flight).collect();
        estimates.sort_unstable();
        let median = estimates[estimates.len() / 2];
        (Some((mean, max)), Some(active), Some(median))
    };
    Ok(Level {
        factor,
        offered: rate,
        secs: time.as_secs_f64(),
        good,
        late,
        refused,
        lost,
        admitted,
        admitted_settled,
        cpu,
        bbr_active,
        max_in_flight,
    })
}

// ---------------------------------------------------------------------------
// The report.

/// The Markdown report of the run.
pub fn report(config: &Config, results: &[WorkloadResult], pinned: bool) -> String {
    let mut text = String::new();
    text.push_str(&format!(
        "Overload: open-loop load at 1x, 2x and 4x the measured capacity, {} s a level after \
         a {} s warm-up at 1x, one fresh server process per contender. Server: {} runtime \
         worker(s){}; the load generator in another process{}. Goodput: 2xx answers within {} s \
         of the instant they were due, per second. Latency of the admitted (2xx) requests, \
         from the instant they were due; \"from 3 s\": of those due 3 s or more into the \
         level, once the protection has reacted to the step. Refused: answers other than 2xx (503 from every \
         contender). Lost: no answer before the run stopped waiting, 1 s after the last \
         request was due.\n\n",
        config.overload_time.as_secs(),
        config.overload_warmup.as_secs(),
        config.server_threads,
        if pinned { ", pinned to CPU 0" } else { "" },
        if pinned { ", pinned to CPU 1" } else { "" },
        DEADLINE.as_secs()
    ));
    for result in results {
        text.push_str(&format!(
            "### {}\n\n{}. Capacity (closed loop, {CAPACITY_CONNECTIONS} connections, no \
             protection): {:.0} requests/s. Unloaded ({:.0} % of capacity, open loop): p50 \
             {:.2} ms, p99 {:.2} ms.\n\n",
            result.workload.slug(),
            result.workload.describe(),
            result.capacity,
            100.0 * UNLOADED_FRACTION,
            result.unloaded.admitted_ms(0.5),
            result.unloaded.admitted_ms(0.99)
        ));
        text.push_str(
            "| contender | load | offered/s | goodput/s | vs 1x | admitted p50 | admitted p99 | \
             p99 from 3 s | refused | late | lost | CPU read (mean/max) | BBR running | BBR estimate |\n\
             |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for run in &result.runs {
            let base = run.levels.first().map_or(0.0, Level::goodput);
            for level in &run.levels {
                let vs = if base > 0.0 {
                    format!("{:.0} %", 100.0 * level.goodput() / base)
                } else {
                    "-".to_owned()
                };
                text.push_str(&format!(
                    "| {} | {}x | {:.0} | {:.0} | {vs} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                    run.guard.name(),
                    level.factor,
                    level.offered,
                    level.goodput(),
                    cell_ms(&level.admitted, 0.5),
                    cell_ms(&level.admitted, 0.99),
                    cell_ms(&level.admitted_settled, 0.99),
                    level.refused,
                    level.late,
                    level.lost,
                    level
                        .cpu
                        .map_or("-".to_owned(), |(mean, max)| format!("{mean:.2}/{max:.2}")),
                    level
                        .bbr_active
                        .map_or("-".to_owned(), |a| format!("{:.0} %", 100.0 * a)),
                    level
                        .max_in_flight
                        .map_or("-".to_owned(), |m| m.to_string()),
                ));
            }
        }
        text.push('\n');
        if result.workload == Workload::Cpu {
            let misses = result.misses();
            if misses.is_empty() {
                text.push_str(
                    "Targets met by `.system(SystemRule::bbr())`: goodput at 4x at least 90 % of \
                     that at 1x, admitted p99 within 3x the unloaded p99 at every level.\n\n",
                );
            } else {
                for miss in misses {
                    text.push_str(&format!("Target missed: {miss}.\n\n"));
                }
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(factor: u64, good: u64, p99_ms: u64) -> Level {
        let mut admitted = latency_histogram();
        // 99 answers at 1 ms and one at `p99_ms`: the p99 is 1 ms unless
        // the slow one is 2 in 100.
        for _ in 0..98 {
            admitted.saturating_record(1_000);
        }
        admitted.saturating_record(p99_ms * 1000);
        admitted.saturating_record(p99_ms * 1000);
        Level {
            factor,
            offered: 100.0 * factor as f64,
            secs: 1.0,
            good,
            late: 0,
            refused: 0,
            lost: 0,
            admitted_settled: admitted.clone(),
            admitted,
            cpu: None,
            bbr_active: None,
            max_in_flight: None,
        }
    }

    fn result(workload: Workload, levels: Vec<Level>) -> WorkloadResult {
        WorkloadResult {
            workload,
            capacity: 100.0,
            unloaded: level(0, 20, 10),
            runs: vec![
                Run {
                    guard: Guard::None,
                    levels: vec![level(1, 100, 1), level(4, 1, 5_000)],
                },
                Run {
                    guard: Guard::System,
                    levels,
                },
            ],
        }
    }

    #[test]
    fn the_targets_are_judged_on_the_system_rule_of_the_cpu_workload() {
        let met = result(Workload::Cpu, vec![level(1, 100, 12), level(4, 90, 30)]);
        assert_eq!(met.misses(), Vec::<String>::new());
        let missed = result(Workload::Cpu, vec![level(1, 100, 12), level(4, 89, 31)]);
        let misses = missed.misses();
        assert_eq!(misses.len(), 2, "{misses:?}");
        assert!(misses[0].contains("goodput at 4x 89/s"), "{misses:?}");
        assert!(misses[1].contains("p99 at 4x 31.0 ms"), "{misses:?}");
        // No target for the dependency workload.
        let dependency = result(
            Workload::Dependency,
            vec![level(1, 100, 12), level(4, 1, 900)],
        );
        assert_eq!(dependency.misses(), Vec::<String>::new());
    }

    #[test]
    fn a_state_line_is_read_back() {
        let s = Status::parse("overload-status 0.875 1 7 3").expect("a state line");
        assert_eq!((s.cpu, s.active, s.max_in_flight), (0.875, true, 3));
        assert!(Status::parse("overload-status 0.8 1").is_none());
        assert!(Status::parse("something else").is_none());
    }

    #[test]
    fn only_picks_workloads_and_contenders_by_their_slugs() {
        let only = |slugs: &[&str]| {
            Selection::of(&slugs.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
        };
        assert_eq!(
            only(&[]),
            Ok(Selection {
                workloads: Workload::ALL.to_vec(),
                guards: Guard::ALL.to_vec()
            })
        );
        // Named in any order, run in the usual one.
        assert_eq!(
            only(&["system-concurrency", "cpu", "none", "system"]),
            Ok(Selection {
                workloads: vec![Workload::Cpu],
                guards: vec![Guard::None, Guard::System, Guard::SystemConcurrency]
            })
        );
        assert_eq!(
            only(&["tower"]).map(|s| s.workloads),
            Ok(Workload::ALL.to_vec())
        );
        let error = only(&["cpu", "bare"]).unwrap_err();
        assert!(error.contains("`--only bare`"), "{error}");
    }

    #[test]
    fn the_names_round_trip() {
        for guard in Guard::ALL {
            assert_eq!(Guard::from_slug(guard.slug()), Some(guard));
        }
        for workload in Workload::ALL {
            assert_eq!(Workload::from_slug(workload.slug()), Some(workload));
        }
    }
}
