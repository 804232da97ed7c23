//! `.system(SystemRule)`: Sentinel's system checks and Kratos's BBR over
//! the layer's totals, with an injected CPU source and a manual clock; and
//! the process's CPU sampler thread, which runs only while a layer with a
//! system rule exists.

use crate::support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tower::{Layer, Service, ServiceExt};
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::flow::Reason;
use tower_sliding_window::response::Rejection;
use tower_sliding_window::system::{SystemCheck, SystemRule};
use tower_sliding_window::{PathKey, SlidingWindowLayer, StatsHandle};

use support::{ms, read, req, Answer};

/// The layer's clock starts at a bucket boundary.
const T0: u64 = 10_000;

/// A CPU figure the test moves.
#[derive(Clone)]
struct Cpu(Arc<AtomicU64>);

impl Cpu {
    fn new(value: f64) -> Cpu {
        Cpu(Arc::new(AtomicU64::new(value.to_bits())))
    }

    fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }

    fn rule(&self) -> SystemRule {
        let cpu = Arc::clone(&self.0);
        SystemRule::bbr().cpu_source(move || f64::from_bits(cpu.load(Ordering::Relaxed)))
    }
}

/// A service behind a layer with a system rule: `/slow` waits for a
/// permit of `gate`, every other path answers at once.
struct Harness {
    clock: ManualClock,
    gate: Arc<Semaphore>,
    app: tower_sliding_window::SlidingWindow<
        tower::util::BoxCloneSyncService<Request<Body>, Response<Body>, Infallible>,
        PathKey,
    >,
    stats: StatsHandle<String>,
}

impl Harness {
    fn new(rule: SystemRule) -> Harness {
        Self::with_layer(SlidingWindowLayer::qps(1_000_000).key(PathKey), rule)
    }

    fn with_layer(layer: SlidingWindowLayer<PathKey>, rule: SystemRule) -> Harness {
        let clock = ManualClock::new(T0);
        let gate = Arc::new(Semaphore::new(0));
        let layer = layer.clock(clock.clone()).system(rule);
        let stats = layer.handle();
        let app = layer.layer(inner(&gate));
        Harness {
            clock,
            gate,
            app,
            stats,
        }
    }

    /// Sends one request to `/slow`: `Ok` with its task if it is in flight
    /// (it passed and waits at the gate), `Err` with the answer if it was
    /// answered at once (refused).
    async fn enter(&self) -> Result<JoinHandle<Answer>, Answer> {
        let app = self.app.clone();
        let task = tokio::spawn(async move {
            let response = app.oneshot(req("/slow")).await.expect("infallible");
            read(response).await
        });
        settle().await;
        if task.is_finished() {
            Err(task.await.expect("no panic"))
        } else {
            Ok(task)
        }
    }

    /// `n` requests that pass, all in flight.
    async fn hold(&self, n: usize) -> Vec<JoinHandle<Answer>> {
        let mut held = Vec::with_capacity(n);
        for i in 0..n {
            match self.enter().await {
                Ok(task) => held.push(task),
                Err(answer) => panic!("request {i} of {n} was refused: {answer:?}"),
            }
        }
        held
    }

    /// Lets every held request complete now.
    async fn complete(&self, held: Vec<JoinHandle<Answer>>) {
        self.gate.add_permits(held.len());
        for task in held {
            let answer = task.await.expect("no panic");
            assert_eq!(answer.status, StatusCode::OK);
        }
    }

    /// `n` completions at once, each `rt` long.
    async fn completions(&self, n: usize, rt: Duration) {
        let held = self.hold(n).await;
        self.clock.advance(rt);
        self.complete(held).await;
    }

    fn refusals(&self, check: SystemCheck) -> u64 {
        self.stats
            .system()
            .expect("a system rule")
            .refusals_of(check)
    }
}

fn inner(
    gate: &Arc<Semaphore>,
) -> tower::util::BoxCloneSyncService<Request<Body>, Response<Body>, Infallible> {
    let gate = Arc::clone(gate);
    tower::util::BoxCloneSyncService::new(tower::service_fn(move |request: Request<Body>| {
        let gate = Arc::clone(&gate);
        async move {
            if request.uri().path() == "/slow" {
                gate.acquire().await.expect("open").forget();
            }
            Ok::<_, Infallible>(Response::new(Body::empty()))
        }
    }))
}

/// Lets the spawned requests reach their handlers.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// A system refusal: 503, `Retry-After: 1`, no RateLimit fields.
fn assert_system_refusal(answer: &Answer) {
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE, "{answer:?}");
    assert_eq!(answer.retry_after(), 1);
    assert!(!answer.headers.contains_key("ratelimit"), "{answer:?}");
    assert!(
        !answer.headers.contains_key("ratelimit-policy"),
        "{answer:?}"
    );
}

async fn get(harness: &Harness, path: &str) -> Answer {
    support::send(&harness.app, req(path)).await
}

#[tokio::test]
async fn max_qps_refuses_the_request_past_the_layers_total_in_the_second() {
    let h = Harness::new(Cpu::new(0.0).rule().max_qps(5));
    // Over two keys: the rule counts the layer, not a key.
    for path in ["/a", "/b", "/a", "/b", "/a"] {
        assert_eq!(get(&h, path).await.status, StatusCode::OK, "{path}");
    }
    let refused = get(&h, "/b").await;
    assert_system_refusal(&refused);
    assert_eq!(refused.body, "Service Unavailable: retry in 1 s\n");
    assert_eq!(h.refusals(SystemCheck::Qps), 1);
    // Counted as a block of the key it refused.
    assert_eq!(h.stats.snapshot("/b").expect("seen").block, 1);
    assert_eq!(h.stats.snapshot("/a").expect("seen").block, 0);
    // Still the second: still refused; a second later, room again.
    h.clock.advance(ms(999));
    assert_system_refusal(&get(&h, "/a").await);
    h.clock.advance(ms(1));
    assert_eq!(get(&h, "/a").await.status, StatusCode::OK);
    let status = h.stats.system().expect("a system rule");
    assert_eq!(status.pass_qps, 1);
    assert_eq!(status.refusals_of(SystemCheck::Qps), 2);
    assert_eq!(status.total_refusals(), 2);
}

#[tokio::test]
async fn max_concurrency_lets_exactly_max_in_flight() {
    let h = Harness::new(Cpu::new(0.0).rule().max_concurrency(3));
    let mut held = h.hold(3).await;
    assert_eq!(h.stats.system().expect("a system rule").in_flight, 3);
    assert_system_refusal(&h.enter().await.expect_err("a fourth is refused"));
    assert_eq!(h.refusals(SystemCheck::Concurrency), 1);
    // One leaves (whichever takes the permit): one more fits, and no more.
    h.gate.add_permits(1);
    while h.stats.system().expect("a system rule").in_flight > 2 {
        settle().await;
    }
    held.retain(|task| !task.is_finished());
    assert_eq!(held.len(), 2);
    held.push(h.enter().await.expect("room for one"));
    assert_system_refusal(&h.enter().await.expect_err("full again"));
    // A request dropped in flight gives its place back.
    let dropped = held.pop().expect("held");
    dropped.abort();
    assert!(dropped.await.expect_err("aborted").is_cancelled());
    held.push(h.enter().await.expect("the dropped one's place"));
    assert_eq!(h.refusals(SystemCheck::Concurrency), 2);
    h.complete(held).await;
    assert_eq!(h.stats.system().expect("a system rule").in_flight, 0);
}

#[tokio::test]
async fn max_avg_rt_refuses_once_the_average_is_above_it() {
    let h = Harness::new(Cpu::new(0.0).rule().max_avg_rt(ms(100)));
    h.completions(1, ms(100)).await;
    // An average of exactly 100 ms passes.
    let status = h.stats.system().expect("a system rule");
    assert_eq!(status.avg_rt, Some(ms(100)));
    let held = h.enter().await.expect("the average is at the limit");
    h.clock.advance(ms(102));
    h.complete(vec![held]).await;
    // (100 + 102) / 2 = 101 ms: above.
    assert_eq!(
        h.stats.system().expect("a system rule").avg_rt,
        Some(ms(101))
    );
    assert_system_refusal(&h.enter().await.expect_err("the average is above"));
    assert_eq!(h.refusals(SystemCheck::AvgRt), 1);
    // Once those completions leave the last second, nothing is averaged.
    h.clock.advance(ms(1000));
    assert_eq!(h.stats.system().expect("a system rule").avg_rt, None);
    let held = h.enter().await.expect("no completions: passes");
    h.complete(vec![held]).await;
}

#[tokio::test]
async fn bbr_refuses_only_while_the_cpu_is_busy_and_in_flight_is_above_the_estimate() {
    let cpu = Cpu::new(0.5);
    let h = Harness::new(cpu.rule());
    // 10 completions of 100 ms in one 100 ms bucket: 100 per second, so
    // floor(10 × 10 × 100 / 1000 + 0.5) = 10.
    h.completions(10, ms(100)).await;
    let status = h.stats.system().expect("a system rule");
    assert_eq!(status.max_in_flight, 10);
    assert_eq!(status.max_success_qps, 100);
    assert_eq!(status.min_rt, Some(ms(100)));
    // CPU below the threshold: nothing is refused, whatever is in flight.
    let mut held = h.hold(12).await;
    assert!(!h.stats.system().expect("a system rule").bbr_active);
    // At the threshold (0.8 is "at or above"): 12 in flight > 10.
    cpu.set(0.8);
    assert_system_refusal(&h.enter().await.expect_err("busy and above"));
    assert_eq!(h.refusals(SystemCheck::Bbr), 1);
    let status = h.stats.system().expect("a system rule");
    assert!(status.bbr_active);
    assert_eq!((status.cpu, status.in_flight), (0.8, 12));
    // Down to 10 in flight: 10 is not above 10, so one more passes; then
    // 11 is above.
    for task in held.drain(10..) {
        task.abort();
        let _ = task.await;
    }
    held.push(h.enter().await.expect("10 in flight is not above 10"));
    assert_system_refusal(&h.enter().await.expect_err("11 in flight is above 10"));
    assert_eq!(h.refusals(SystemCheck::Bbr), 2);
    // Blocks of the key, with their reason in the layer's figures.
    assert_eq!(h.stats.snapshot("/slow").expect("seen").block, 2);
    h.complete(held).await;
}

#[tokio::test]
async fn bbr_keeps_checking_for_a_second_after_its_last_busy_refusal_then_stops() {
    let cpu = Cpu::new(0.0);
    let h = Harness::new(cpu.rule());
    h.completions(10, ms(100)).await;
    cpu.set(0.9);
    let last_busy_refusal = T0 + 100;
    let mut held = h.hold(11).await;
    assert_system_refusal(&h.enter().await.expect_err("busy, 11 > 10"));
    // The CPU falls: for the cool-down the check still runs (and its
    // refusals there do not lengthen it).
    cpu.set(0.1);
    h.clock.set(last_busy_refusal + 500);
    assert!(h.stats.system().expect("a system rule").bbr_active);
    assert_system_refusal(&h.enter().await.expect_err("cooling down"));
    h.clock.set(last_busy_refusal + 1000);
    assert_system_refusal(&h.enter().await.expect_err("the cool-down's last ms"));
    assert_eq!(h.refusals(SystemCheck::Bbr), 3);
    // Then it stops: the same 11 in flight pass.
    h.clock.set(last_busy_refusal + 1001);
    assert!(!h.stats.system().expect("a system rule").bbr_active);
    held.push(h.enter().await.expect("the cool-down is over"));
    held.extend(h.hold(5).await);
    assert_eq!(h.refusals(SystemCheck::Bbr), 3);
    h.complete(held).await;
}

#[tokio::test]
async fn bbr_lets_two_in_flight_before_anything_completed() {
    // Nothing completed yet: the estimate is 0, and BBR never refuses
    // while at most two requests are in flight.
    let h = Harness::new(Cpu::new(1.0).rule());
    assert_eq!(h.stats.system().expect("a system rule").max_in_flight, 0);
    let held = h.hold(3).await;
    assert_system_refusal(&h.enter().await.expect_err("3 in flight > 2 and > 0"));
    h.complete(held).await;
}

#[tokio::test]
async fn the_system_rule_is_asked_before_the_keys_own_rules() {
    // The key's window would let 1 pass; the layer's max_qps(1) refuses
    // the second first, with its own reason.
    let layer = SlidingWindowLayer::qps(1)
        .key(PathKey)
        .reject_with(|r: &Rejection| {
            let mut response = Response::new(bytes::Bytes::from(r.reason().as_str()));
            *response.status_mut() = r.status;
            response
        });
    let h = Harness::with_layer(layer, Cpu::new(0.0).rule().max_qps(1));
    assert_eq!(get(&h, "/a").await.status, StatusCode::OK);
    let refused = get(&h, "/a").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.body, "system");
    assert_eq!(Reason::System.as_str(), "system");
    // A key refused by its own window says so.
    h.clock.advance(ms(1000));
    let h2 = Harness::with_layer(
        SlidingWindowLayer::qps(1).key(PathKey),
        Cpu::new(0.0).rule(),
    );
    assert_eq!(get(&h2, "/a").await.status, StatusCode::OK);
    assert_eq!(get(&h2, "/a").await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        h2.stats.system().expect("a system rule").total_refusals(),
        0
    );
}

#[tokio::test]
async fn under_grpc_a_system_refusal_is_unavailable() {
    let clock = ManualClock::new(T0);
    let layer = SlidingWindowLayer::qps(100)
        .clock(clock)
        .system(Cpu::new(0.0).rule().max_qps(1))
        .grpc();
    let mut app = layer.layer(tower::service_fn(|_: Request<Body>| async {
        let mut response = Response::new(Body::empty());
        response
            .headers_mut()
            .insert("grpc-status", http::HeaderValue::from_static("0"));
        Ok::<_, Infallible>(response)
    }));
    let first = app.ready().await.expect("ready").call(req("/")).await;
    assert_eq!(first.expect("infallible").status(), StatusCode::OK);
    let refused = app.ready().await.expect("ready").call(req("/")).await;
    let refused = refused.expect("infallible");
    assert_eq!(refused.status(), StatusCode::OK);
    assert_eq!(refused.headers()["grpc-status"], "14");
    assert_eq!(refused.headers()["retry-after"], "1");
}

/// The sampler threads running now: their names, read from the kernel.
fn sampler_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("Linux")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end() == "tsw-cpu-sampler")
        .count()
}

/// Waits until `n` sampler threads run: a new thread names itself once it
/// starts, and an exited one leaves the task list once the kernel reaps
/// it. Panics after 10 s with the count seen.
fn expect_samplers(n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = sampler_threads();
        if seen == n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "expected {n} sampler threads, saw {seen}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The sampler is one per process: tests that count it run one at a time.
static SAMPLER_TESTS: Mutex<()> = Mutex::new(());

#[test]
fn the_sampler_thread_starts_with_the_first_system_layer_and_stops_with_the_last() {
    let _one = SAMPLER_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    expect_samplers(0);
    // A layer without `system` starts nothing, built or not.
    let plain = SlidingWindowLayer::qps(10);
    let plain_stats = plain.handle();
    // Time for a thread, had one been started, to name itself.
    std::thread::sleep(Duration::from_millis(100));
    expect_samplers(0);
    // Nor does a rule with a CPU source of its own.
    let injected = SlidingWindowLayer::qps(10).system(Cpu::new(0.0).rule());
    let injected_stats = injected.handle();
    std::thread::sleep(Duration::from_millis(100));
    expect_samplers(0);
    // A system layer starts it once built (its first service or handle).
    let first = SlidingWindowLayer::qps(10).system(SystemRule::bbr());
    expect_samplers(0);
    let first_service = first.layer(tower::service_fn(|_: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    }));
    expect_samplers(1);
    let second = SlidingWindowLayer::qps(10).system(SystemRule::bbr());
    let second_stats = second.handle();
    expect_samplers(1);
    let cpu = second_stats.system().expect("a system rule").cpu;
    assert!((0.0..=1.0).contains(&cpu), "{cpu}");
    // The first layer's last holder goes: the second still needs it.
    drop(first);
    expect_samplers(1);
    drop(first_service);
    expect_samplers(1);
    // The second's layer and handle go: the thread stops (joined at once).
    drop(second);
    expect_samplers(1);
    drop(second_stats);
    expect_samplers(0);
    // And starts again with a new one.
    let again = SlidingWindowLayer::qps(10)
        .system(SystemRule::bbr())
        .handle();
    expect_samplers(1);
    drop(again);
    expect_samplers(0);
    drop((plain, plain_stats, injected, injected_stats));
}
