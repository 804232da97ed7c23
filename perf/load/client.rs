//! The load generator: HTTP/1.1 over loopback with hyper's connection API.
//!
//! Two shapes of load:
//! - [`closed_loop`]: a fixed number of connections, each sending its next
//!   request as soon as the previous answer arrives, for a fixed time. This
//!   measures what a server can do.
//! - [`open_loop`]: requests are due at fixed instants whatever the server
//!   does, so overload is real. Latency is measured from the instant a
//!   request was due, not from when a connection became free, so a slow
//!   server cannot hide its queue (no coordinated omission).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Mutex};
use tokio::time::Instant;

/// One open HTTP/1.1 connection.
pub type Conn = SendRequest<Empty<Bytes>>;

/// What came back for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// `Retry-After` in whole seconds, when present and numeric.
    pub retry_after: Option<u64>,
}

/// The client's runtime: `threads` worker threads, timers and I/O.
pub fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("load-client")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the client runtime: {e}"))
}

/// Opens a connection to `addr` and drives it on the current runtime.
pub async fn connect(addr: SocketAddr) -> Result<Conn, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    stream
        .set_nodelay(true)
        .map_err(|e| format!("cannot set TCP_NODELAY: {e}"))?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP/1.1 handshake with {addr} failed: {e}"))?;
    tokio::spawn(async move {
        // The connection ends when the sender is dropped or the server goes
        // away; either is expected at the end of a run.
        let _ = connection.await;
    });
    Ok(sender)
}

/// Sends `GET path` on `conn` and reads the whole answer.
pub async fn get(conn: &mut Conn, path: &str) -> Result<Answer, String> {
    exchange(conn, path).await.map(|(answer, _)| answer)
}

/// Sends `GET path` on `conn`, expects a 200 and returns the body's length.
pub async fn get_len(conn: &mut Conn, path: &str) -> Result<u64, String> {
    let (answer, len) = exchange(conn, path).await?;
    if answer.status != 200 {
        return Err(format!("GET {path}: {}", answer.status));
    }
    Ok(len)
}

/// Sends `GET path` on `conn` and reads the whole answer: its status,
/// `Retry-After`, and the body's length.
async fn exchange(conn: &mut Conn, path: &str) -> Result<(Answer, u64), String> {
    conn.ready()
        .await
        .map_err(|e| format!("connection closed: {e}"))?;
    let request = Request::get(path)
        .header(hyper::header::HOST, "127.0.0.1")
        .body(Empty::new())
        .map_err(|e| format!("cannot build a request for {path}: {e}"))?;
    let response = conn
        .send_request(request)
        .await
        .map_err(|e| format!("GET {path} failed: {e}"))?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(hyper::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the body of GET {path} failed: {e}"))?
        .to_bytes();
    let answer = Answer {
        status,
        retry_after,
    };
    Ok((answer, body.len() as u64))
}

/// Waits for closed-loop connection tasks and merges what each measured.
pub async fn join_closed(
    tasks: Vec<tokio::task::JoinHandle<(Histogram<u64>, Tally)>>,
) -> Result<(Histogram<u64>, Tally), String> {
    let mut latency = latency_histogram();
    let mut tally = Tally::default();
    for task in tasks {
        let (histogram, part) = task
            .await
            .map_err(|e| format!("a client connection task failed: {e}"))?;
        latency
            .add(&histogram)
            .map_err(|e| format!("cannot merge histograms: {e}"))?;
        tally.merge(part);
    }
    Ok((latency, tally))
}

/// A latency histogram in microseconds, 1 µs to 100 s at 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    // The bounds are constants that hdrhistogram accepts.
    Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid histogram bounds")
}

/// Records `elapsed` into `histogram`, clamping to its range.
pub fn record(histogram: &mut Histogram<u64>, elapsed: Duration) {
    let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    histogram.saturating_record(micros.clamp(1, 100_000_000));
}

/// Counts of answers by class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// 2xx answers.
    pub ok: u64,
    /// 429 answers.
    pub limited: u64,
    /// Any other status.
    pub other: u64,
    /// Requests that failed at the transport level.
    pub failed: u64,
}

impl Tally {
    /// Adds one answer (or a transport failure).
    pub fn add(&mut self, answer: Option<Answer>) {
        match answer.map(|a| a.status) {
            Some(200..=299) => self.ok += 1,
            Some(429) => self.limited += 1,
            Some(_) => self.other += 1,
            None => self.failed += 1,
        }
    }

    /// Sums two tallies.
    pub fn merge(&mut self, other: Tally) {
        self.ok += other.ok;
        self.limited += other.limited;
        self.other += other.other;
        self.failed += other.failed;
    }

    /// Everything that got an HTTP answer.
    pub fn answered(&self) -> u64 {
        self.ok + self.limited + self.other
    }
}

/// What a closed-loop run measured.
#[derive(Debug, Clone)]
pub struct ClosedResult {
    /// Requests completed inside the measured interval.
    pub requests: u64,
    /// The measured interval.
    pub elapsed: Duration,
    /// Answers by class (measured interval only).
    pub tally: Tally,
    /// Latency of measured requests, microseconds.
    pub latency: Histogram<u64>,
}

/// Drives `addr` with `connections` connections for `warmup + time`,
/// measuring only the last `time`.
pub async fn closed_loop(
    addr: SocketAddr,
    connections: usize,
    warmup: Duration,
    time: Duration,
    path: &'static str,
) -> Result<ClosedResult, String> {
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + time;
    let mut tasks = Vec::with_capacity(connections);
    for _ in 0..connections {
        let mut conn = connect(addr).await?;
        tasks.push(tokio::spawn(async move {
            let mut histogram = latency_histogram();
            let mut tally = Tally::default();
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let answer = get(&mut conn, path).await;
                let done = Instant::now();
                if sent >= measure_from && done <= end {
                    record(&mut histogram, done - sent);
                    tally.add(answer.as_ref().ok().copied());
                }
                if answer.is_err() {
                    // A broken connection is not retried: the run reports
                    // it as a failed request instead of hiding it.
                    break;
                }
            }
            (histogram, tally)
        }));
    }
    let (latency, tally) = join_closed(tasks).await?;
    Ok(ClosedResult {
        requests: tally.answered(),
        elapsed: time,
        tally,
        latency,
    })
}

/// One request of an open-loop schedule.
#[derive(Debug, Clone, Copy)]
pub struct Due {
    /// When it must be sent.
    pub at: Instant,
    /// Which path it asks for (an index into the path list).
    pub path: usize,
}

/// What an open-loop run saw.
#[derive(Debug, Clone)]
pub struct OpenResult {
    /// Requests that were due.
    pub sent: u64,
    /// Answers by class; `sent - tally.answered() - tally.failed` requests
    /// were still unanswered when the run gave up waiting.
    pub tally: Tally,
    /// Latency from the due instant to the answer, microseconds.
    pub latency: Histogram<u64>,
    /// Requests never answered before the drain deadline.
    pub unanswered: u64,
}

/// Sends every request of `schedule` (sorted by `at`) on its due instant
/// over a pool of `connections`, then waits up to `drain` for the last
/// answers.
pub async fn open_loop(
    addr: SocketAddr,
    connections: usize,
    schedule: Vec<Due>,
    paths: Arc<Vec<String>>,
    drain: Duration,
) -> Result<OpenResult, String> {
    let sent = u64::try_from(schedule.len()).unwrap_or(u64::MAX);
    let last_due = schedule.last().map(|d| d.at).unwrap_or_else(Instant::now);
    let (tx, rx) = mpsc::unbounded_channel::<Due>();
    let rx = Arc::new(Mutex::new(rx));
    let mut workers = Vec::with_capacity(connections);
    let mut partials = Vec::with_capacity(connections);
    for _ in 0..connections {
        let mut conn = connect(addr).await?;
        let rx = Arc::clone(&rx);
        let paths = Arc::clone(&paths);
        // Updated after every answer, so a worker aborted at the drain
        // deadline loses nothing it already saw.
        let partial = Arc::new(StdMutex::new((latency_histogram(), Tally::default())));
        partials.push(Arc::clone(&partial));
        workers.push(tokio::spawn(async move {
            loop {
                let next = rx.lock().await.recv().await;
                let Some(due) = next else { break };
                let path = paths.get(due.path).map(String::as_str).unwrap_or("/");
                let answer = get(&mut conn, path).await;
                let elapsed = due.at.elapsed();
                {
                    let mut guard = partial.lock().unwrap_or_else(PoisonError::into_inner);
                    record(&mut guard.0, elapsed);
                    guard.1.add(answer.as_ref().ok().copied());
                }
                if answer.is_err() {
                    // Reconnect once; a second failure ends this worker.
                    match connect(addr).await {
                        Ok(fresh) => conn = fresh,
                        Err(_) => break,
                    }
                }
            }
        }));
    }
    let dispatcher = tokio::spawn(async move {
        for due in schedule {
            tokio::time::sleep_until(due.at).await;
            if tx.send(due).is_err() {
                break;
            }
        }
        // Dropping `tx` here lets the workers finish once the queue drains.
    });
    dispatcher
        .await
        .map_err(|e| format!("the open-loop dispatcher failed: {e}"))?;
    let deadline = last_due.max(Instant::now()) + drain;
    for worker in workers {
        let abort = worker.abort_handle();
        if tokio::time::timeout_at(deadline, worker).await.is_err() {
            abort.abort();
        }
    }
    let mut latency = latency_histogram();
    let mut tally = Tally::default();
    for partial in partials {
        let guard = partial.lock().unwrap_or_else(PoisonError::into_inner);
        latency
            .add(&guard.0)
            .map_err(|e| format!("cannot merge histograms: {e}"))?;
        tally.merge(guard.1);
    }
    let unanswered = sent.saturating_sub(tally.answered() + tally.failed);
    Ok(OpenResult {
        sent,
        tally,
        latency,
        unanswered,
    })
}

/// Sends `paths` over `conns` (path `i` on connection `i % conns.len()`, each
/// connection in order), all connections at once; hands the connections
/// back with the answers in the order of `paths`.
pub async fn fan_out(
    conns: Vec<Conn>,
    paths: Vec<String>,
) -> Result<(Vec<Conn>, Vec<Answer>), String> {
    let n = conns.len();
    if n == 0 {
        return Err("fan_out needs at least one connection".to_owned());
    }
    let mut shares: Vec<Vec<(usize, String)>> = vec![Vec::new(); n];
    for (i, path) in paths.into_iter().enumerate() {
        shares[i % n].push((i, path));
    }
    let mut tasks = Vec::with_capacity(n);
    for (mut conn, share) in conns.into_iter().zip(shares) {
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::with_capacity(share.len());
            for (i, path) in share {
                answers.push((i, get(&mut conn, &path).await?));
            }
            Ok::<_, String>((conn, answers))
        }));
    }
    let mut conns = Vec::with_capacity(n);
    let mut indexed = Vec::new();
    for task in tasks {
        let (conn, answers) = task
            .await
            .map_err(|e| format!("a client task failed: {e}"))??;
        conns.push(conn);
        indexed.extend(answers);
    }
    indexed.sort_by_key(|(i, _)| *i);
    Ok((conns, indexed.into_iter().map(|(_, a)| a).collect()))
}

/// Opens `n` connections to `addr`.
pub async fn connect_many(addr: SocketAddr, n: usize) -> Result<Vec<Conn>, String> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(connect(addr).await?);
    }
    Ok(conns)
}
