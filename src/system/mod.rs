//! Adaptive protection: Sentinel's system rule, with Kratos's BBR check.
//!
//! A [`SystemRule`] set with
//! [`SlidingWindowLayer::system`](crate::SlidingWindowLayer::system) guards
//! the whole layer, whatever the key: it reads the layer's totals (requests
//! in flight, passes, completions and response times over the last second,
//! all keys together) and the CPU use, and refuses requests before any
//! per-key rule is asked, so that an overloaded service keeps answering the
//! requests it admits at the speed it can. Its refusals are
//! `503 Service Unavailable` with `Retry-After: 1` and no RateLimit fields
//! (the service is busy; the client's quota is not spent), or gRPC status
//! 14 `UNAVAILABLE` under [`grpc`](crate::SlidingWindowLayer::grpc), whose
//! clients retry it as a transient condition. Each is counted as a block
//! of the request's key, with [`Reason::System`](crate::flow::Reason::System),
//! and per check in [`StatsHandle::system`](crate::StatsHandle::system).
//!
//! # The checks
//!
//! In the order Sentinel's `SystemRuleManager` asks them; the first that
//! refuses decides:
//!
//! | check | refuses when | use it for |
//! |---|---|---|
//! | [`max_qps`](SystemRule::max_qps) | the layer passed `max` requests in the last second | a known capacity, measured in a load test |
//! | [`max_concurrency`](SystemRule::max_concurrency) | `max` requests are in flight | a pool (database connections, worker threads) that holds one per request |
//! | [`max_avg_rt`](SystemRule::max_avg_rt) | the average response time of the last second is above `max` | a latency target you would rather shed load than miss |
//! | BBR ([`bbr`](SystemRule::bbr)) | the CPU is busy, more than two requests are in flight, and more than the estimate below | a CPU-bound service whose capacity you do not know or that changes |
//!
//! The first three are exact at their thresholds: `max_qps(n)` passes `n`
//! requests in any second of the layer's window and refuses the next;
//! `max_concurrency(n)` lets `n` be in flight and refuses the next one
//! (Sentinel's `curThreadNum > maxThread` lets `maxThread + 1` in);
//! `max_avg_rt(d)` refuses once the average is above `d`. They read the
//! counts when the request arrives and reserve nothing, as Sentinel's
//! do: requests arriving at the same instant may each see the last place.
//!
//! BBR follows Kratos (`ratelimit/bbr`): while the CPU use is at or above
//! [`cpu_threshold`](SystemRule::cpu_threshold) (default 0.8), a request is
//! refused when `in_flight > 1` (here `in_flight > 2`, see below) and
//! `in_flight > max_in_flight`, where
//!
//! ```text
//! max_in_flight = floor(max_pass × buckets_per_second × min_rt / 1000 + 0.5)
//! ```
//!
//! `max_pass` is the most completions in one 100 ms bucket and `min_rt`
//! the shortest response time (ms), both over the last 10 s (Kratos's
//! window): by Little's law,
//! the requests the service can hold when it runs at its best throughput
//! and its best latency. Anything above that is queueing, which only adds
//! latency. The check keeps running for 1 s after its last refusal made
//! while the CPU was busy, even if the CPU falls below the threshold, so
//! that it does not flap (Kratos measures that second from when dropping
//! started; here it is from the last drop). Unlike Sentinel's, the CPU is
//! a gate of BBR, never a refusal of its own.
//!
//! Differences from the originals: the window is the last second's 10
//! buckets of 100 ms plus, for each of the seconds before it that started
//! within 10 s, its busiest bucket's completions and its shortest response
//! time, kept as the buckets roll up into the minute window (Kratos keeps
//! 10 s of 100 buckets; Sentinel takes both over one second of 2);
//! `min_rt` is the shortest response time rather than the shortest bucket
//! average (Kratos's is a bucket's average in whole milliseconds, at least
//! 1); the estimate is rounded to the nearest whole request (Kratos's
//! expression adds its 0.5 after the floor, so it rounds down); and while
//! nothing has completed in the last 10 s the estimate is 0.
//! Over one second, `min_rt` was the queue's once an overload had run
//! unchecked for that long, and the estimate kept the queue; and
//! `max_pass` could follow the throughput down, the refusals of one second
//! cutting the completions the next second's estimate is made of. Over
//! 10 s both are still the service's unloaded figures.
//!
//! And one departure: BBR refuses only beyond two requests in flight
//! whatever the estimate, where Kratos refuses beyond one. On a service
//! whose requests each keep a CPU busy for most of their time the
//! estimate is about one per CPU, rounded from anything between 0.5 and
//! 1.5; its requests arrive in batches, and the two let in finish about
//! together, so under overload its CPU presumably idled until the next
//! batch.
//! Measured in the `perf` harness's `overload` mode on one CPU (a shared
//! machine: single runs scatter), the rule's median goodput at 4x went
//! from 66 to 91 % of the capacity, and the runs where it kept under 90 %
//! of its goodput at 1x from 4 of 11 to 1 of 13, with about the same
//! admitted p99.
//!
//! One addition, at the onset of an overload: while the CPU reads below the
//! threshold but at least half of it, a request is refused when more than
//! 16 requests and more than 16 times the estimate (at least 1) are in
//! flight, without starting the cool-down. The CPU reading lags a step in
//! the load, and at several times the capacity what is admitted meanwhile
//! is a queue that makes the p99 of the whole overload. Sixteen times what
//! the service holds at its best is a queue, not a burst, and a CPU under
//! half the threshold (a service waiting on a dependency, a quiet one)
//! never sees the check. A service at half the threshold or more whose
//! slowest requests take more than sixteen times its fastest can be
//! refused by it with many in flight before its CPU is busy: raise
//! [`cpu_threshold`](SystemRule::cpu_threshold) or bound it with
//! [`max_concurrency`](SystemRule::max_concurrency) instead.
//!
//! # The CPU use
//!
//! An average sampled every 500 ms, starting from 0. A sample above the
//! average replaces it at once; a sample below moves it as Kratos's
//! average does, `cpu = cpu × 0.95 + sample × 0.05` (from fully busy to
//! idle, 2 s above 0.8). Kratos folds rising samples in at 5 % too, so a
//! service that goes from idle to overloaded reads 0.8 only after 16 s; its
//! queue grows all that while, and so does the shortest response time the
//! estimate is made of, until the estimate keeps the queue it should have
//! prevented. Measured in the `perf` harness's `overload` mode (see the
//! README's "Adaptive protection"), this is why the check is let in at the
//! first busy sample. Between the 500 ms samples the sampler also reads
//! the CPU every 50 ms, and a reading above the average raises it at once
//! (one below changes nothing, so the average still falls 5 % a sample):
//! after a lull, a step in the load starts the check within 50 to 100 ms
//! instead of up to a second.
//!
//! On Linux the sample is the CPU time used between two readings, plus the
//! time this process's threads spent ready to run but waiting for a CPU
//! (`/proc/self/task/*/schedstat`), over the wall time times the CPUs the
//! reading is against (capped at 1). The wait is there because a service
//! whose CPUs are shared with other processes gets less CPU time the more
//! they take, and would read as idle however long its queue; its threads'
//! wait is demand for the CPU all the same. The CPU time is:
//!
//! - the process's cgroup (v2): `usage_usec` of its `cpu.stat` against
//!   its `cpu.max` quota, so a container limited to 2 CPUs is at 1.0 when
//!   it uses 2, or against the CPUs available
//!   ([`available_parallelism`](std::thread::available_parallelism), which
//!   also counts the process's CPU affinity) without a quota. This counts
//!   every process of the cgroup, which is what a container's limit is
//!   about;
//! - without a v2 hierarchy mounted at `/sys/fs/cgroup` (a v1 or hybrid
//!   host, where the CPU controller lives in v1): the process's own user and
//!   system time from `/proc/self/stat` against the CPUs available. The
//!   process, not the machine (`/proc/stat`): what the layer can relieve
//!   is its own process's load.
//!
//! The CPUs available are those the process may run on, not those its
//! runtime uses: a Tokio runtime with one worker on a machine of 2 CPUs is
//! fully busy at 0.5 and never reaches the default threshold. Pin the
//! process to as many CPUs as it has workers (`taskset`, a container's
//! `cpuset`), or lower the threshold to the share of the CPUs it can use
//! (0.4 for one worker of 2 CPUs).
//!
//! One thread samples for every layer of the process (named
//! `tsw-cpu-sampler`): it starts when the first layer with a system rule
//! that samples the process is built (makes its first service or handle),
//! and stops with the last (its services, clones and handles all dropped).
//! A layer without `system` starts nothing and pays nothing. A failed
//! reading keeps the last average.
//!
//! Elsewhere than Linux the process's CPU use cannot be read:
//! [`system`](crate::SlidingWindowLayer::system) panics with a message
//! that says so, unless the rule reads another [`CpuSource`]
//! ([`SystemRule::cpu_source`]), which is also how tests drive the check.
//!
//! # Which check for which overload
//!
//! Measured in the `perf` crate's load harness (`load overload`; the
//! README's "Adaptive protection" has the table and the charts):
//!
//! - **A CPU-bound service** (its handlers compute): BBR. Past the
//!   capacity it keeps its estimate in flight (about one per busy CPU,
//!   at least two), so the
//!   admitted requests are answered at the unloaded speed and the rest are
//!   refused at once, whatever the capacity is that day.
//! - **A service waiting on a dependency** (a pool of connections, a
//!   downstream service): its CPU stays idle when the dependency slows, so
//!   BBR never runs. Bound what waits with
//!   [`max_concurrency`](SystemRule::max_concurrency), at the pool's size:
//!   the requests past it would only queue for a connection.
//! - [`max_qps`](SystemRule::max_qps) when a load test gave the capacity,
//!   [`max_avg_rt`](SystemRule::max_avg_rt) to shed before a latency
//!   target is missed.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::time::Duration;
//! use axum::{body::Body, http::Request, http::StatusCode, routing::get, Router};
//! use tower::ServiceExt;
//! use tower_sliding_window::{system::SystemRule, SlidingWindowLayer};
//!
//! // Each request holds one of 16 connections to the database: the CPU
//! // check for what computes, at most 16 in flight for what waits.
//! let limit = SlidingWindowLayer::qps(10_000).system(SystemRule::bbr().max_concurrency(16));
//! let stats = limit.handle();
//! let app: Router = Router::new()
//!     .route(
//!         "/orders",
//!         get(|| async {
//!             tokio::time::sleep(Duration::from_millis(1)).await;
//!             "ok"
//!         }),
//!     )
//!     .layer(limit);
//!
//! let request = Request::get("/orders").body(Body::empty()).unwrap();
//! let response = app.oneshot(request).await.unwrap();
//! assert_eq!(response.status(), StatusCode::OK);
//! let system = stats.system().expect("the layer has a system rule");
//! assert_eq!(system.in_flight, 0);
//! assert_eq!(system.pass_qps, 1);
//! # }
//! ```
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use axum::{routing::get, Router};
//! use tower_sliding_window::{system::SystemRule, PeerIpKey, SlidingWindowLayer};
//!
//! let limit = SlidingWindowLayer::qps(100)
//!     .key(PeerIpKey)
//!     .system(SystemRule::bbr().max_concurrency(512));
//! let stats = limit.handle();
//! let app: Router = Router::new().route("/", get(|| async { "hi" })).layer(limit);
//! let system = stats.system().expect("the layer has a system rule");
//! assert_eq!(system.in_flight, 0);
//! assert_eq!(system.total_refusals(), 0);
//! # let _ = app;
//! ```

mod cgroup;
mod cpu;
mod rule;
mod state;

pub use cpu::CpuSource;
pub use rule::SystemRule;
pub use state::{SystemCheck, SystemStatus};

pub(crate) use state::System;

/// Panics, naming `.system` and the platform, when `rule` samples the
/// process's CPU use where it cannot be read.
pub(crate) fn check_platform(rule: &SystemRule) {
    if let Some(message) = unsupported(rule, std::env::consts::OS) {
        panic!("{message}");
    }
}

/// Why `rule` cannot run on `os`, if it cannot: the process's CPU use is
/// read on Linux only.
fn unsupported(rule: &SystemRule, os: &str) -> Option<String> {
    (rule.samples_process_cpu() && os != "linux").then(|| {
        format!(
            "SlidingWindowLayer::system: the process's CPU use can be read on Linux only, \
             not on {os}; give the rule a CpuSource (SystemRule::cpu_source)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elsewhere_than_linux_the_process_cpu_is_refused_with_the_platform_named() {
        let message = unsupported(&SystemRule::bbr(), "macos").expect("unsupported");
        assert!(message.contains("SlidingWindowLayer::system"), "{message}");
        assert!(message.contains("not on macos"), "{message}");
        assert!(message.contains("SystemRule::cpu_source"), "{message}");
        assert_eq!(unsupported(&SystemRule::bbr(), "linux"), None);
        assert_eq!(
            unsupported(&SystemRule::bbr().cpu_source(|| 0.5), "windows"),
            None
        );
    }

    #[test]
    #[should_panic(expected = "SystemRule::cpu_threshold: must be in (0, 1]")]
    fn a_threshold_above_one_is_refused() {
        let _ = SystemRule::bbr().cpu_threshold(1.5);
    }

    #[test]
    #[should_panic(expected = "SystemRule::cpu_threshold: must be in (0, 1]")]
    fn a_nan_threshold_is_refused() {
        let _ = SystemRule::bbr().cpu_threshold(f64::NAN);
    }

    #[test]
    #[should_panic(expected = "SystemRule::max_qps: must be at least 1")]
    fn a_zero_max_qps_is_refused() {
        let _ = SystemRule::bbr().max_qps(0);
    }

    #[test]
    #[should_panic(expected = "SystemRule::max_concurrency: must be at least 1")]
    fn a_zero_max_concurrency_is_refused() {
        let _ = SystemRule::bbr().max_concurrency(0);
    }

    #[test]
    #[should_panic(expected = "SystemRule::max_avg_rt: must be more than zero")]
    fn a_zero_max_avg_rt_is_refused() {
        let _ = SystemRule::bbr().max_avg_rt(std::time::Duration::ZERO);
    }
}
