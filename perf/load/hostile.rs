//! The hostile soak (`soak --hostile`): a flood of distinct keys, every one
//! near the largest request head hyper accepts, through `axum::serve`, with
//! resident memory sampled every second.
//!
//! Two phases, each on a fresh server with the layer's default `max_keys`
//! (4096), limit 1 per key:
//!
//! 1. [`HeaderKey`] on `x-key`: every request carries one value of
//!    [`HEADER_VALUE_BYTES`] (400 KiB; the head stays under hyper's default
//!    read-buffer limit of 8 KiB + 400 x 4 KiB = 408 KiB, which bounds a whole
//!    HTTP/1 request head). Every [`INVALID_EVERY`]th value is not UTF-8
//!    (bytes 0x80 to 0xFF throughout), the rest are ASCII.
//! 2. [`PathKey`]: every request target is `/items/` and a segment of
//!    [`PATH_BYTES`] (65 000 bytes; `http::Uri` refuses targets of more than
//!    65 534 bytes, so this is the longest a path key can get through a real
//!    server). Every [`INVALID_EVERY`]th path is `%FF`-escaped bytes (a raw
//!    byte above 0x7F is not a valid request target).
//!
//! No two requests share a key. The layer runs on a [`ManualClock`] that
//! the client moves 61 s ahead after every [`EPOCH`] requests: within an
//! epoch no key goes idle, so the table fills to `max_keys` and the
//! remaining keys of the epoch share the overflow entry (and mostly get
//! 429); after the jump every key is idle, and the next epoch's keys evict
//! them. So the table holds 4096 maximum-size keys most of the time, and
//! churns through all of them every epoch.
//!
//! The harness fails (the process exits non-zero) when resident memory
//! grows, from the end of the warm-up to its peak, by more than
//! [`table_bound`] + [`server_margin`], when the table ever holds more than
//! `max_keys + 1` entries, or when any request gets anything but 200 or 429
//! (a transport failure included).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Uri};
use http_body_util::{BodyExt, Empty};
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::{HeaderKey, PathKey, SlidingWindowLayer};

use crate::cli::Config;
use crate::client::{self, Conn, Tally};
use crate::progress::Progress;
use crate::servers::{self, Built, Server};
use crate::soak;

/// Bytes of every `x-key` value in the header phase (400 KiB).
pub const HEADER_VALUE_BYTES: usize = 400 * 1024;

/// Bytes of the varying path segment in the path phase.
pub const PATH_BYTES: usize = 65_000;

/// One request in this many carries bytes that are not UTF-8 (header) or
/// `%FF` escapes (path).
pub const INVALID_EVERY: u64 = 4;

/// The layer's default `max_keys`, the bound the docs state a cost for.
pub const MAX_KEYS: usize = 4096;

/// Requests between two clock jumps: one and a half tables.
pub const EPOCH: u64 = (MAX_KEYS + MAX_KEYS / 2) as u64;

/// Connections the client keeps open (each with one request in flight).
pub const CONNECTIONS: usize = 8;

/// How long one request may take before it counts as lost.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How often memory and the table's length are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// The bound `max_keys` documents for the default table: "at most about
/// 20.9 MiB, however hostile its keys", rounded up to 21 MiB.
pub fn table_bound() -> u64 {
    21 * 1024 * 1024
}

/// What the server and the client in the same process may hold beyond the
/// table while requests are in flight: per connection the server's read
/// buffer (up to hyper's 408 KiB), the client's copy of the value and its
/// encoded head (about 400 KiB each), so three maximum heads per
/// connection; plus 8 MiB that the allocator may keep of freed heads in
/// its per-thread arenas (server worker, client worker, sampler).
pub fn server_margin() -> u64 {
    let head = 408 * 1024;
    CONNECTIONS as u64 * 3 * head + 8 * 1024 * 1024
}

/// Which key the layer uses in a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// `HeaderKey` on `x-key`, 400 KiB values.
    Header,
    /// `PathKey`, 65 000-byte paths.
    Path,
}

impl Phase {
    /// The name used in tables and the chart.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Header => "HeaderKey, 400 KiB values",
            Phase::Path => "PathKey, 65 000-byte paths",
        }
    }
}

/// One sample: time, resident memory and the table's length.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Seconds since the flood started.
    pub secs: f64,
    /// Resident set size, KiB (whole process).
    pub rss_kib: u64,
    /// Keys held by the current phase's table (overflow entry included).
    pub keys: usize,
}

/// What one phase saw.
#[derive(Debug, Clone)]
pub struct PhaseResult {
    /// The key in use.
    pub phase: Phase,
    /// Seconds since the flood started at which the phase began and ended.
    pub span: (f64, f64),
    /// Requests sent.
    pub sent: u64,
    /// Answers by class.
    pub tally: Tally,
    /// Requests whose key was not UTF-8 (or `%FF`-escaped).
    pub invalid: u64,
    /// Bytes of the key's source per request: the header value or the
    /// path (the largest).
    pub key_bytes: usize,
    /// The most keys the table held.
    pub max_len: usize,
    /// Clock jumps (completed epochs).
    pub epochs: u64,
    /// The first transport errors, if any.
    pub errors: Vec<String>,
}

/// What the hostile soak saw.
#[derive(Debug, Clone, Default)]
pub struct HostileResult {
    /// Memory and keys over time.
    pub samples: Vec<Sample>,
    /// Resident memory at the end of the warm-up, KiB.
    pub baseline_kib: u64,
    /// The phases in order.
    pub phases: Vec<PhaseResult>,
    /// Wall-clock length of the flood.
    pub elapsed: Duration,
    /// The load average (1, 5, 15 min) when the flood started and ended.
    pub loadavg: (String, String),
}

impl HostileResult {
    /// Peak resident memory, KiB.
    pub fn peak_kib(&self) -> u64 {
        self.samples
            .iter()
            .map(|s| s.rss_kib)
            .max()
            .unwrap_or(self.baseline_kib)
    }

    /// Resident memory at the last sample, KiB.
    pub fn end_kib(&self) -> u64 {
        self.samples.last().map_or(self.baseline_kib, |s| s.rss_kib)
    }

    /// Peak resident memory while `phase` ran, KiB.
    pub fn phase_peak_kib(&self, phase: &PhaseResult) -> u64 {
        self.samples
            .iter()
            .filter(|s| s.secs >= phase.span.0 && s.secs <= phase.span.1)
            .map(|s| s.rss_kib)
            .max()
            .unwrap_or(0)
    }

    /// Growth from the end of the warm-up to the peak, bytes.
    pub fn growth_bytes(&self) -> u64 {
        self.peak_kib().saturating_sub(self.baseline_kib) * 1024
    }

    /// Every failed check, in words.
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        let bound = table_bound() + server_margin();
        if self.growth_bytes() > bound {
            failures.push(format!(
                "resident memory grew by {:.1} MiB, bound {:.1} MiB (table {:.1} + margin {:.1})",
                self.growth_bytes() as f64 / 1048576.0,
                bound as f64 / 1048576.0,
                table_bound() as f64 / 1048576.0,
                server_margin() as f64 / 1048576.0
            ));
        }
        for p in &self.phases {
            if p.tally.ok + p.tally.limited != p.sent || p.tally.other + p.tally.failed > 0 {
                failures.push(format!(
                    "{}: {} sent, 200 {} + 429 {}, other {}, failed {}",
                    p.phase.name(),
                    p.sent,
                    p.tally.ok,
                    p.tally.limited,
                    p.tally.other,
                    p.tally.failed
                ));
            }
            if p.max_len > MAX_KEYS + 1 {
                failures.push(format!(
                    "{}: the table held {} keys, bound {MAX_KEYS} + 1",
                    p.phase.name(),
                    p.max_len
                ));
            }
            if p.sent == 0 {
                failures.push(format!("{}: no request was sent", p.phase.name()));
            }
        }
        failures
    }
}

/// `/proc/loadavg`'s three averages.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The key of request `n`: its bytes and whether they are "invalid".
fn header_value(n: u64) -> (HeaderValue, bool) {
    let invalid = n % INVALID_EVERY == INVALID_EVERY - 1;
    let mut value = vec![0u8; HEADER_VALUE_BYTES];
    if invalid {
        // Bytes 0x80..=0xFF: allowed in a header value (obs-text), never
        // valid UTF-8 in this order (a continuation byte first).
        for (i, b) in value.iter_mut().enumerate() {
            *b = 0x80 | (i as u8 & 0x7f);
        }
    } else {
        value.fill(b'k');
    }
    let tag = format!("{n:016x}");
    value[..16].copy_from_slice(tag.as_bytes());
    // Only visible ASCII and 0x80..=0xFF: always a valid header value.
    let value = HeaderValue::from_maybe_shared(Bytes::from(value))
        .unwrap_or_else(|_| HeaderValue::from_static("unreachable"));
    (value, invalid)
}

/// The request target of request `n` in the path phase.
fn path_target(n: u64) -> (Uri, bool) {
    let invalid = n % INVALID_EVERY == INVALID_EVERY - 1;
    let mut path = String::with_capacity(PATH_BYTES + 32);
    path.push_str("/items/");
    path.push_str(&format!("{n:016x}"));
    let fill = if invalid { "%FF" } else { "p" };
    while path.len() + fill.len() <= PATH_BYTES + 7 {
        path.push_str(fill);
    }
    let uri = Uri::from_maybe_shared(Bytes::from(path)).unwrap_or_else(|_| Uri::from_static("/"));
    (uri, invalid)
}

/// Sends one request and reads the whole answer; its status.
async fn send(conn: &mut Conn, request: Request<Empty<Bytes>>) -> Result<u16, String> {
    conn.ready()
        .await
        .map_err(|e| format!("connection closed: {e}"))?;
    let response = conn
        .send_request(request)
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let status = response.status().as_u16();
    response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the body failed: {e}"))?;
    Ok(status)
}

/// Builds request `n` of `phase`; the request, whether its key is invalid,
/// and the bytes of the header value or the path.
fn request(phase: Phase, n: u64) -> Result<(Request<Empty<Bytes>>, bool, usize), String> {
    let (request, invalid, head) = match phase {
        Phase::Header => {
            let (value, invalid) = header_value(n);
            let head = value.len();
            let request = Request::get("/items/1")
                .header(http::header::HOST, "127.0.0.1")
                .header(HeaderName::from_static("x-key"), value)
                .body(Empty::new());
            (request, invalid, head)
        }
        Phase::Path => {
            let (uri, invalid) = path_target(n);
            let head = uri.path().len();
            let request = Request::get(uri)
                .header(http::header::HOST, "127.0.0.1")
                .body(Empty::new());
            (request, invalid, head)
        }
    };
    let request = request.map_err(|e| format!("cannot build request {n}: {e}"))?;
    Ok((request, invalid, head))
}

/// Shared counters of one phase.
#[derive(Debug, Default)]
struct Counters {
    /// Requests sent so far (also the next request number).
    sent: AtomicU64,
    /// Requests with an invalid key.
    invalid: AtomicU64,
    /// Clock jumps.
    epochs: AtomicU64,
}

/// Runs one phase until `deadline` on a fresh server.
async fn run_phase(
    config: &Config,
    phase: Phase,
    started: Instant,
    deadline: Instant,
    table_len: &Arc<AtomicUsize>,
) -> Result<PhaseResult, String> {
    let clock = ManualClock::new(1_000_000);
    let layer_clock = clock.clone();
    let mut header_stats = None;
    let mut path_stats = None;
    let server = Server::start_with(config.server_threads, || {
        let router = match phase {
            Phase::Header => {
                let layer = SlidingWindowLayer::qps(1)
                    .key(HeaderKey::new(HeaderName::from_static("x-key")))
                    .clock(layer_clock);
                header_stats = Some(layer.handle());
                servers::base_router().layer(layer)
            }
            Phase::Path => {
                let layer = SlidingWindowLayer::qps(1).key(PathKey).clock(layer_clock);
                path_stats = Some(layer.handle());
                servers::base_router().layer(layer)
            }
        };
        Ok(Built {
            router,
            recorder: None,
            stats: None,
        })
    })?;
    let len = move || -> usize {
        header_stats
            .as_ref()
            .map(|h| h.len())
            .or_else(|| path_stats.as_ref().map(|h| h.len()))
            .unwrap_or(0)
    };
    let begin = started.elapsed().as_secs_f64();
    let counters = Arc::new(Counters::default());
    let mut tasks = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let mut conn = client::connect(server.addr).await?;
        let counters = Arc::clone(&counters);
        let clock = clock.clone();
        let addr = server.addr;
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut key_bytes = 0;
            let mut errors = Vec::new();
            while Instant::now() < deadline {
                let n = counters.sent.fetch_add(1, Ordering::Relaxed);
                if n > 0 && n % EPOCH == 0 {
                    // A whole window and a minute ahead: every key of the
                    // last epoch is idle from now on.
                    clock.advance(Duration::from_secs(61));
                    counters.epochs.fetch_add(1, Ordering::Relaxed);
                }
                let built = match request(phase, n) {
                    Ok(built) => built,
                    Err(e) => {
                        tally.add(None);
                        errors.push(e);
                        break;
                    }
                };
                let (req, invalid, bytes) = built;
                key_bytes = key_bytes.max(bytes);
                if invalid {
                    counters.invalid.fetch_add(1, Ordering::Relaxed);
                }
                let answer = tokio::time::timeout(REQUEST_TIMEOUT, send(&mut conn, req))
                    .await
                    .unwrap_or_else(|_| Err(format!("no answer within {REQUEST_TIMEOUT:?}")));
                match answer {
                    Ok(status) => tally.add(Some(client::Answer {
                        status,
                        retry_after: None,
                    })),
                    Err(e) => {
                        tally.add(None);
                        errors.push(format!("request {n}: {e}"));
                        // Reconnect once per failure; a failed connect ends
                        // this connection's share.
                        match client::connect(addr).await {
                            Ok(fresh) => conn = fresh,
                            Err(_) => break,
                        }
                    }
                }
            }
            (tally, key_bytes, errors)
        }));
    }
    let mut max_len = 0;
    let mut tally = Tally::default();
    let mut key_bytes = 0;
    let mut errors = Vec::new();
    let mut tasks = tasks;
    let mut progress = Progress::timed("soak --hostile", started, config.soak_time);
    // Publish the table's length for the sampler while the clients run.
    loop {
        progress.round(
            counters.epochs.load(Ordering::Relaxed) + 1,
            format_args!(
                "{phase:?} phase, {} requests",
                counters.sent.load(Ordering::Relaxed)
            ),
        );
        let current = len();
        table_len.store(current, Ordering::Relaxed);
        max_len = max_len.max(current);
        if tasks.iter().all(|t| t.is_finished()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for task in tasks.drain(..) {
        let (t, h, e) = task
            .await
            .map_err(|e| format!("a client task failed: {e}"))?;
        tally.merge(t);
        key_bytes = key_bytes.max(h);
        errors.extend(e);
    }
    max_len = max_len.max(len());
    errors.truncate(5);
    let end = started.elapsed().as_secs_f64();
    drop(server);
    table_len.store(0, Ordering::Relaxed);
    Ok(PhaseResult {
        phase,
        span: (begin, end),
        sent: counters.sent.load(Ordering::Relaxed),
        tally,
        invalid: counters.invalid.load(Ordering::Relaxed),
        key_bytes,
        max_len,
        epochs: counters.epochs.load(Ordering::Relaxed),
        errors,
    })
}

/// Warms the process up: one server, one maximum-size request per
/// connection for a few rounds, then everything dropped.
async fn warm_up(config: &Config) -> Result<(), String> {
    let server = Server::start_with(config.server_threads, || {
        let layer = SlidingWindowLayer::qps(1)
            .key(HeaderKey::new(HeaderName::from_static("x-key")))
            .clock(ManualClock::new(1_000_000));
        Ok(Built {
            router: servers::base_router().layer(layer),
            recorder: None,
            stats: None,
        })
    })?;
    let mut tasks = Vec::new();
    for c in 0..CONNECTIONS as u64 {
        let mut conn = client::connect(server.addr).await?;
        tasks.push(tokio::spawn(async move {
            for round in 0..4u64 {
                let n = u64::MAX - (round * CONNECTIONS as u64 + c);
                let (req, _, _) = request(Phase::Header, n)?;
                send(&mut conn, req).await?;
                let (req, _, _) = request(Phase::Path, n)?;
                send(&mut conn, req).await?;
            }
            Ok::<(), String>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| format!("a warm-up task failed: {e}"))??;
    }
    drop(server);
    Ok(())
}

/// Runs the hostile soak for `config.soak_time`: two thirds of it keyed by
/// header, one third by path.
pub async fn run(config: &Config) -> Result<HostileResult, String> {
    warm_up(config).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let page = soak::page_kib();
    let baseline_kib = soak::rss_kib(page).ok_or("cannot read /proc/self/statm")?;
    let load_start = loadavg();
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let table_len = Arc::new(AtomicUsize::new(0));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let stop = Arc::clone(&stop);
        let table_len = Arc::clone(&table_len);
        let samples = Arc::clone(&samples);
        std::thread::spawn(move || {
            let mut next = started;
            while !stop.load(Ordering::Relaxed) {
                if Instant::now() >= next {
                    if let Some(rss) = soak::rss_kib(page) {
                        samples
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(Sample {
                                secs: started.elapsed().as_secs_f64(),
                                rss_kib: rss,
                                keys: table_len.load(Ordering::Relaxed),
                            });
                    }
                    next += SAMPLE_EVERY;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let header_end = started + config.soak_time * 2 / 3;
    let path_end = started + config.soak_time;
    let mut phases = Vec::new();
    let outcome = async {
        phases.push(run_phase(config, Phase::Header, started, header_end, &table_len).await?);
        phases.push(run_phase(config, Phase::Path, started, path_end, &table_len).await?);
        Ok::<(), String>(())
    }
    .await;
    let elapsed = started.elapsed();
    // One last sample after both servers are gone.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    stop.store(true, Ordering::Relaxed);
    sampler
        .join()
        .map_err(|_| "the memory sampler thread panicked".to_owned())?;
    outcome?;
    let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(HostileResult {
        samples,
        baseline_kib,
        phases,
        elapsed,
        loadavg: (load_start, loadavg()),
    })
}
