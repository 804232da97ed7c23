//! The key table against races and clocks that step: reads that must not stall requests, an eviction sweep with a
//! stale clock reading, and clocks that step back or read far ahead.
//!
//! Interleavings are forced with key types whose `Hash` or `Clone` stops at
//! a barrier for one named key; no assertion depends on how long anything
//! takes.

use crate::support;

use std::cell::Cell;
use std::collections::HashMap;
use std::convert::Infallible;
use std::hash::{Hash, Hasher};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::thread;
use std::time::Duration;

use axum::body::Body;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_sliding_window::clock::{Clock, ManualClock};
use tower_sliding_window::SlidingWindowLayer;

use support::{at, clock, read};

/// Barriers that the key named by the map's key stops at, once.
fn pauses() -> &'static Mutex<HashMap<String, Arc<Barrier>>> {
    static PAUSES: OnceLock<Mutex<HashMap<String, Arc<Barrier>>>> = OnceLock::new();
    PAUSES.get_or_init(Default::default)
}

/// Makes the next hash (for `HashPause`) or clone (for `ClonePause`) of the
/// key `name` wait twice on the returned barrier: once to say it got there,
/// once to be let go.
fn pause_at(name: &str) -> Arc<Barrier> {
    let barrier = Arc::new(Barrier::new(2));
    pauses()
        .lock()
        .unwrap()
        .insert(name.to_owned(), Arc::clone(&barrier));
    barrier
}

fn stop_if_paused(name: &str) {
    let pause = pauses().lock().unwrap().remove(name);
    if let Some(barrier) = pause {
        barrier.wait();
        barrier.wait();
    }
}

/// A key whose `Hash` stops where `pause_at` says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HashPause(String);

impl Hash for HashPause {
    fn hash<H: Hasher>(&self, state: &mut H) {
        stop_if_paused(&self.0);
        self.0.hash(state);
    }
}

thread_local! {
    static CLONES: Cell<usize> = const { Cell::new(0) };
}

/// A key whose `Clone` stops where `pause_at` says, and counts clones made
/// on the current thread.
#[derive(Debug, PartialEq, Eq, Hash)]
struct ClonePause(String);

impl Clone for ClonePause {
    fn clone(&self) -> Self {
        CLONES.with(|n| n.set(n.get() + 1));
        stop_if_paused(&self.0);
        ClonePause(self.0.clone())
    }
}

fn key_header(parts: &Parts) -> String {
    parts
        .headers
        .get("x-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

fn req(key: &str) -> Request<Body> {
    Request::get("/")
        .header("x-key", key)
        .body(Body::empty())
        .expect("valid request")
}

/// Runs `future` to completion on a fresh current-thread runtime.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(future)
}

/// Sends one request through a clone of `svc` and reads the answer.
fn send<S>(svc: &S, key: &str) -> support::Answer
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
{
    block_on(async { read(svc.clone().oneshot(req(key)).await.expect("infallible")).await })
}

fn ok_service(
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send> + Clone
{
    service_fn(|_: Request<Body>| async { Ok::<_, Infallible>(Response::new(Body::empty())) })
}

// A thread read the clock, was preempted before its sweep,
// and the sweep then evicted a key that had passed meanwhile in a newer
// bucket; the key passed again: 2 passes in one bucket under a limit of 1.
#[test]
fn a_sweep_with_a_stale_clock_reading_keeps_a_key_that_passed_since() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1)
        .key(|p: &Parts| HashPause(format!("stale-sweep/{}", key_header(p))))
        .max_keys(1)
        .clock(clock.clone());
    let stats = layer.handle();
    let svc = layer.layer(ok_service());

    assert_eq!(send(&svc, "a").status, StatusCode::OK, "{}", at(&clock));
    // `a`'s pass leaves the second window at 11 000 ms and the minute window
    // at 70 000 ms: `a` is idle from then on.
    clock.set(71_050);

    // A request for a new key reads the clock (71 050), then stops before
    // its lookup, insert and sweep.
    let barrier = pause_at("stale-sweep/s");
    let sweeper = {
        let svc = svc.clone();
        thread::spawn(move || send(&svc, "s").status)
    };
    barrier.wait();

    // Meanwhile time moves on and `a` passes in the next bucket.
    clock.set(71_150);
    assert_eq!(send(&svc, "a").status, StatusCode::OK, "{}", at(&clock));

    // The stale request sweeps the full table at 71 050: `a` holds a pass at
    // 71 100, newer than that, and must stay.
    barrier.wait();
    let _ = sweeper.join().expect("the sweeping request");

    assert_eq!(
        send(&svc, "a").status,
        StatusCode::TOO_MANY_REQUESTS,
        "a second pass for `a` in its bucket, {}",
        at(&clock)
    );
    let a = stats
        .snapshot(&HashPause("stale-sweep/a".to_owned()))
        .expect("`a` kept its entry");
    assert_eq!((a.pass, a.block), (1, 1), "{}", at(&clock));
}

// `keys()` cloned every key under the shard locks, and a
// request for a new key waited behind it.
#[test]
fn a_slow_read_of_the_keys_does_not_block_requests_for_new_keys() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .key(|p: &Parts| ClonePause(format!("slow-read/{}", key_header(p))))
        .clock(clock.clone());
    let stats = layer.handle();
    let svc = layer.layer(ok_service());

    // A table of large keys, one of which stops the reader in its clone.
    let filler = "k".repeat(4 * 1024);
    for i in 0..64 {
        send(&svc, &format!("{filler}{i}"));
    }
    send(&svc, "gate");
    let barrier = pause_at("slow-read/gate");
    let reader = {
        let stats = stats.clone();
        thread::spawn(move || stats.keys().len())
    };
    barrier.wait();

    // The reader is stopped inside a clone. Requests for new keys, enough
    // that some fall in every shard (16 shards, 400 keys: each shard gets
    // none with probability below 1e-10), must all complete now.
    let (done, finished) = mpsc::channel();
    let requests = {
        let svc = svc.clone();
        thread::spawn(move || {
            let passed = (0..400)
                .filter(|i| send(&svc, &format!("new-{i}")).status == StatusCode::OK)
                .count();
            let _ = done.send(passed);
        })
    };
    // Only a guard against a hang: the requests either complete while the
    // reader is stopped or never do (they wait for a lock it holds).
    let outcome = finished.recv_timeout(Duration::from_secs(120));
    barrier.wait();
    requests.join().expect("requests");
    let keys = reader.join().expect("reader");
    assert_eq!(
        outcome,
        Ok(400),
        "requests for new keys waited for a read of the statistics"
    );
    assert!(keys >= 65, "the read saw the table ({keys} keys)");
}

// `total()` cloned every key.
#[test]
fn total_clones_no_key() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .key(|p: &Parts| ClonePause(format!("total/{}", key_header(p))))
        .clock(clock.clone());
    let stats = layer.handle();
    let svc = layer.layer(ok_service());
    for i in 0..50 {
        send(&svc, &format!("{i}"));
    }

    CLONES.with(|n| n.set(0));
    let total = stats.total();
    assert_eq!(CLONES.with(Cell::get), 0, "total() cloned keys");
    assert_eq!(total.pass, 50);
    assert_eq!(total.limit, 500);
}

// A clock stepped back 1 h on a full key refused every
// request for 3601 s while answering `Retry-After: 1`, and the snapshot
// showed no blocks.
#[test]
fn a_clock_stepped_back_gets_an_honest_retry_after_and_counted_blocks() {
    // Two hours in, 50 ms into a bucket.
    let clock = ManualClock::new(7_200_050);
    let layer = SlidingWindowLayer::qps(2).clock(clock.clone());
    let stats = layer.handle();
    let svc = layer.layer(ok_service());

    assert_eq!(send(&svc, "").status, StatusCode::OK);
    assert_eq!(send(&svc, "").status, StatusCode::OK);
    clock.set(clock.now_millis() - 3_600_000);

    let refused = send(&svc, "");
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        at(&clock)
    );
    // A step back of more than a window: the key runs an hour ahead of the
    // clock from this request on (see `Clock`, "Steps"), so the passes at
    // 7 200 000 ms leave its window one second later, not an hour later,
    // and the answer says so.
    let retry_after = refused.retry_after();
    assert_eq!(retry_after, 1, "{}", at(&clock));
    assert_eq!(
        refused.header("ratelimit"),
        r#""default";r=0;t=1"#,
        "{}",
        at(&clock)
    );
    let snapshot = stats.snapshot(&()).expect("the global key");
    assert_eq!((snapshot.pass, snapshot.block), (2, 1), "{}", at(&clock));

    // Just before, still refused, and told the truth again.
    clock.advance(Duration::from_millis(900));
    let again = send(&svc, "");
    assert_eq!(again.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(again.retry_after(), 1, "{}", at(&clock));

    // A client that waits as told passes.
    clock.advance(Duration::from_secs(again.retry_after()));
    assert_eq!(send(&svc, "").status, StatusCode::OK, "{}", at(&clock));
}

// One reading 10 years ahead set the last sweep there, and
// no sweep ran again until real time caught up.
#[test]
fn sweeps_resume_after_a_reading_far_ahead() {
    let clock = clock();
    let start = clock.now_millis();
    let layer = SlidingWindowLayer::qps(5)
        .key(|p: &Parts| key_header(p))
        .max_keys(2)
        .clock(clock.clone());
    let stats = layer.handle();
    let svc = layer.layer(ok_service());

    send(&svc, "a");
    send(&svc, "b");
    // One reading 10 years ahead, for a new key: it sweeps there.
    clock.set(start + 10 * 365 * 24 * 3_600_000);
    send(&svc, "c");
    assert!(stats.snapshot("c").is_some(), "{}", at(&clock));

    // Back to real time: `d` takes the free slot and goes idle.
    clock.set(start + 2_000);
    send(&svc, "d");
    assert!(stats.snapshot("d").is_some(), "{}", at(&clock));
    // A minute later (idle means no event in the minute window either) the
    // table is full (`c`, `d`); `d` is idle and must make room for `e`.
    clock.set(start + 2_000 + 61_000);
    send(&svc, "e");
    assert!(
        stats.snapshot("e").is_some(),
        "no sweep ran after the far reading, {}",
        at(&clock)
    );
    assert!(stats.snapshot("d").is_none(), "{}", at(&clock));
}

// Keys that find no room share the overflow entry; its
// limit is now a setting.
#[test]
fn overflow_limit_sets_the_limit_keys_without_room_share() {
    let run = |layer: SlidingWindowLayer<fn(&Parts) -> String>| {
        let clock = clock();
        let layer = layer.max_keys(1).clock(clock.clone());
        let stats = layer.handle();
        let svc = layer.layer(ok_service());
        // `busy` holds the only slot: it has events in its windows.
        assert_eq!(send(&svc, "busy").status, StatusCode::OK);
        let statuses: Vec<StatusCode> = ["new-1", "new-2", "new-3"]
            .into_iter()
            .map(|k| send(&svc, k).status)
            .collect();
        (
            statuses,
            stats.overflow(),
            stats.snapshot("new-1").is_none(),
        )
    };
    let keyed: fn(&Parts) -> String = key_header;
    let base = SlidingWindowLayer::qps(5).key(keyed);

    let (statuses, overflow, shared) = run(base.clone());
    assert_eq!(
        statuses,
        support::ok_then_429(3, 0),
        "default: the default limit"
    );
    assert_eq!((overflow.limit, overflow.pass), (5, 3));
    assert!(shared);

    let (statuses, overflow, _) = run(base.clone().overflow_limit(1));
    assert_eq!(statuses, support::ok_then_429(1, 2), "stricter");
    assert_eq!((overflow.limit, overflow.pass, overflow.block), (1, 1, 2));

    let (statuses, _, _) = run(base.clone().overflow_limit(0));
    assert_eq!(statuses, support::ok_then_429(0, 3), "closed");

    let (statuses, overflow, _) = run(SlidingWindowLayer::qps(1).key(keyed).overflow_limit(100));
    assert_eq!(
        statuses,
        support::ok_then_429(3, 0),
        "looser than the default"
    );
    assert_eq!(overflow.limit, 100);
}

#[test]
fn for_each_visits_every_key_and_clones_none() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .key(|p: &Parts| ClonePause(format!("for-each/{}", key_header(p))))
        .clock(clock.clone());
    let stats = layer.handle();
    let svc = layer.layer(ok_service());
    for i in 0..40 {
        for _ in 0..=(i % 3) {
            send(&svc, &format!("{i}"));
        }
    }

    CLONES.with(|n| n.set(0));
    let mut seen = Vec::new();
    stats.for_each(|key, snapshot| seen.push((key.0.clone(), snapshot.pass)));
    assert_eq!(CLONES.with(Cell::get), 0, "for_each cloned keys");
    seen.sort();
    let mut expected: Vec<(String, u64)> = stats
        .snapshots()
        .into_iter()
        .map(|(k, s)| (k.0, s.pass))
        .collect();
    expected.sort();
    assert_eq!(seen.len(), 40);
    assert_eq!(seen, expected);
}
