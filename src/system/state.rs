//! The layer-wide statistics node and the checks of a [`SystemRule`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::cpu::{CpuSource, ProcessCpu};
use super::rule::SystemRule;
use crate::clock::SharedClock;
use crate::flow::{Reason, Refusal};
use crate::stat::StatisticNode;

/// Buckets of the layer-wide window: 10 of 100 ms over one second, the
/// bucket of Kratos BBR over Sentinel's one-second totals.
const SAMPLE_COUNT: usize = 10;
const INTERVAL_MS: u64 = 1000;

/// How far back the BBR estimate looks for its busiest bucket and its
/// shortest response time (Kratos BBR takes both over its whole window,
/// 10 s of 100 buckets).
pub(crate) const BBR_WINDOW_MS: u64 = 10_000;

/// The onset check (a departure from Kratos, see [`System::onset`]): while
/// the CPU reads below the threshold but at least half of it, a request is
/// refused when more than this many times the estimate (at least 1) are in
/// flight.
pub(crate) const ONSET_FACTOR: u64 = 16;

/// The least limit of the BBR check while it runs, whatever its estimate:
/// a request that finds at most this many in flight passes it (a departure
/// from Kratos, whose least limit is 1; see [`System::bbr_limit`]).
pub(crate) const MIN_BBR_LIMIT: u64 = 2;

/// How long the BBR check keeps running after its last refusal made while
/// the CPU was busy (Kratos BBR: 1 s).
pub(crate) const COOL_DOWN_MS: u64 = 1000;

/// `Retry-After` of a system refusal: the overload lasts no predictable
/// time; a second is the cool-down's length.
const RETRY_AFTER_MS: u64 = 1000;

/// Which check of a [`SystemRule`] refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SystemCheck {
    /// [`max_qps`](SystemRule::max_qps).
    Qps,
    /// [`max_concurrency`](SystemRule::max_concurrency).
    Concurrency,
    /// [`max_avg_rt`](SystemRule::max_avg_rt).
    AvgRt,
    /// The CPU-gated in-flight check ([`bbr`](SystemRule::bbr)).
    Bbr,
}

impl SystemCheck {
    /// Every check, in the order the layer asks them.
    pub const ALL: [SystemCheck; 4] = [
        SystemCheck::Qps,
        SystemCheck::Concurrency,
        SystemCheck::AvgRt,
        SystemCheck::Bbr,
    ];

    /// A short lowercase name (`"qps"`, `"concurrency"`, `"avg_rt"`,
    /// `"bbr"`), as in the exporter's labels.
    ///
    /// ```
    /// use tower_sliding_window::system::SystemCheck;
    ///
    /// assert_eq!(SystemCheck::Bbr.as_str(), "bbr");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            SystemCheck::Qps => "qps",
            SystemCheck::Concurrency => "concurrency",
            SystemCheck::AvgRt => "avg_rt",
            SystemCheck::Bbr => "bbr",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The state of a layer's system rule, from
/// [`StatsHandle::system`](crate::StatsHandle::system): what the checks
/// read now, and how many requests each has refused.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SystemStatus {
    /// The CPU use the BBR check compares with its threshold.
    pub cpu: f64,
    /// The rule's CPU threshold.
    pub cpu_threshold: f64,
    /// Whether the BBR check runs now: the CPU is at or above the
    /// threshold, or the cool-down after a refusal has not ended.
    pub bbr_active: bool,
    /// Requests of the layer in flight, all keys together.
    pub in_flight: u64,
    /// The BBR check's estimate: while the check runs, a request that
    /// finds more than this many in flight, and more than 2, is refused
    /// (see the [module docs](super)).
    pub max_in_flight: u64,
    /// Requests the layer passed in the last second.
    pub pass_qps: u64,
    /// The busiest 100 ms bucket's completions in the last 10 s, scaled
    /// to a second, which the BBR estimate is made of.
    pub max_success_qps: u64,
    /// The shortest response time in the last 10 s, which the BBR
    /// estimate is made of.
    pub min_rt: Option<Duration>,
    /// The average response time in the last second.
    pub avg_rt: Option<Duration>,
    /// Refusals per check since the layer was built, in the order of
    /// [`SystemCheck::ALL`].
    pub refusals: [u64; 4],
}

impl SystemStatus {
    /// The refusals of one check since the layer was built.
    pub fn refusals_of(&self, check: SystemCheck) -> u64 {
        self.refusals[check.index()]
    }

    /// Every refusal of the rule since the layer was built.
    pub fn total_refusals(&self) -> u64 {
        self.refusals.iter().sum()
    }
}

/// A system check's refusal, before the key it is counted against is
/// known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused(pub(crate) SystemCheck);

impl Refused {
    /// The refusal to answer and record against a key whose limit is
    /// `limit` (only a reject_with builder sees it: a system refusal
    /// carries no RateLimit fields).
    pub(crate) fn refusal(self, limit: u64) -> Refusal {
        Refusal::new(Reason::System, RETRY_AFTER_MS, limit)
    }
}

/// A layer's system rule, built: its thresholds, where it reads the CPU,
/// and the layer-wide statistics every request of the layer records into
/// (Sentinel's inbound entry node).
pub(crate) struct System {
    max_qps: Option<u64>,
    max_concurrency: Option<u64>,
    max_avg_rt: Option<Duration>,
    cpu_threshold: f64,
    cpu: Arc<dyn CpuSource>,
    /// Passes (at admission), completions with their response times, and
    /// requests in flight, of every key of the layer. Its concurrency
    /// gauge goes up with each `InFlight` guard and down with its drop.
    node: StatisticNode,
    /// The clock time (ms) of the last BBR refusal made while the CPU was
    /// at or above the threshold, plus one; 0: none yet. Relaxed, raised
    /// with `fetch_max`: racing refusals keep the latest time, and the
    /// cool-down read beside it is a heuristic that tolerates a stale one.
    last_drop: AtomicU64,
    /// Refusals per check, in `SystemCheck` order. Relaxed counters, read
    /// alone.
    refusals: [AtomicU64; 4],
}

impl System {
    /// The rule built on the layer's clock; subscribes to the process's
    /// CPU sampler unless the rule has a source of its own.
    pub(crate) fn new(rule: &SystemRule, clock: SharedClock) -> System {
        let cpu: Arc<dyn CpuSource> = match &rule.cpu {
            Some(source) => Arc::clone(source),
            None => Arc::new(ProcessCpu::subscribe()),
        };
        System {
            max_qps: rule.max_qps,
            max_concurrency: rule.max_concurrency,
            max_avg_rt: rule.max_avg_rt,
            cpu_threshold: rule.cpu_threshold,
            cpu,
            node: StatisticNode::build_with_peaks(
                clock,
                SAMPLE_COUNT,
                INTERVAL_MS,
                false,
                BBR_WINDOW_MS,
            )
            .expect("the system window is valid"),
            last_drop: AtomicU64::new(0),
            refusals: Default::default(),
        }
    }

    /// The checks, in Sentinel's order: the layer's pass rate, its
    /// requests in flight, its average response time, then BBR. A refusal
    /// is counted here, with its check.
    pub(crate) fn check(&self) -> Result<(), Refused> {
        let result = self.decide();
        if let Err(Refused(check)) = result {
            self.refusals[check.index()].fetch_add(1, Ordering::Relaxed);
            self.node.record_block_at(self.node.now(), 1);
        }
        result
    }

    fn decide(&self) -> Result<(), Refused> {
        let node = &self.node;
        if let Some(max) = self.max_qps {
            // This request would be pass number `pass + 1` of the second.
            if node.second_window().pass() >= max {
                return Err(Refused(SystemCheck::Qps));
            }
        }
        let in_flight = node.cur_concurrency();
        if let Some(max) = self.max_concurrency {
            // With this one there would be `in_flight + 1`.
            if in_flight >= max {
                return Err(Refused(SystemCheck::Concurrency));
            }
        }
        // The average reads the clock and folds the window: only for a
        // rule that has the limit.
        if let Some(max) = self.max_avg_rt {
            if node.avg_rt().is_some_and(|avg| avg > max) {
                return Err(Refused(SystemCheck::AvgRt));
            }
        }
        // BBR: nothing to do while at most one request is in flight, so the
        // CPU and the estimate are read only beyond that.
        if in_flight <= 1 {
            return Ok(());
        }
        let now = node.now();
        let cpu = self.cpu();
        let busy = cpu >= self.cpu_threshold;
        if !busy && !self.cooling_down(now) {
            return self.onset(in_flight, cpu, now);
        }
        if in_flight > self.bbr_limit(now) {
            if busy {
                self.last_drop
                    .fetch_max(now.saturating_add(1), Ordering::Relaxed);
            }
            return Err(Refused(SystemCheck::Bbr));
        }
        Ok(())
    }

    /// The check while BBR does not run: with the CPU at half the threshold
    /// or more, a request is refused when more than `ONSET_FACTOR` requests
    /// and more than `ONSET_FACTOR` times the estimate (at least 1) are in
    /// flight. Such a refusal does not start the cool-down.
    ///
    /// Not in Kratos or Sentinel, whose check waits for the CPU reading.
    /// That reading lags a step in the load (a sample every 50 ms here,
    /// 500 ms in Kratos), and at several times the capacity the requests
    /// admitted meanwhile are a queue long enough to make the p99 of the
    /// whole overload. Sixteen times what the service holds at its best
    /// is a queue, not a burst; the CPU floor keeps a service whose CPU
    /// is mostly idle (one waiting on a dependency, a quiet one) from ever
    /// seeing it. The price: a service at half the threshold or more whose
    /// slowest requests take over sixteen times its fastest, with many in
    /// flight, can be refused before its CPU is busy; raise the threshold
    /// or set `max_concurrency` instead for such a service. The estimate
    /// (a fold of the windows) is read only beyond `ONSET_FACTOR` in
    /// flight.
    fn onset(&self, in_flight: u64, cpu: f64, now: u64) -> Result<(), Refused> {
        if in_flight <= ONSET_FACTOR || cpu < self.cpu_threshold / 2.0 {
            return Ok(());
        }
        if in_flight > ONSET_FACTOR.saturating_mul(self.max_in_flight_at(now).max(1)) {
            return Err(Refused(SystemCheck::Bbr));
        }
        Ok(())
    }

    /// The BBR check's limit while it runs: it refuses a request that
    /// finds more than this many in flight. The estimate, at least
    /// [`MIN_BBR_LIMIT`].
    ///
    /// Kratos's limit is at least 1 (it refuses only beyond one in
    /// flight). On a service whose requests each keep a CPU busy for most
    /// of their time, the estimate is about one per CPU (1 ms requests at
    /// 1 000 per second: 1), rounded from anything between 0.5 and 1.5.
    /// Such a service's requests arrive in batches (a worker reads every
    /// socket that is ready before it runs the handlers again), and the two
    /// let in share the CPU and finish about together, so under overload
    /// the CPU presumably idled until the next batch (the runs below show
    /// the goodput, not the idle time). In the `perf` harness's
    /// `overload` mode (CPU workload on one CPU, a machine shared with
    /// other work, so each figure is of one run and they scatter), with a
    /// limit of 1 the rule's goodput at 4x was 49 to 102 % of the capacity
    /// measured in the same run (median 66 %, 11 runs) and under 90 % of
    /// its goodput at 1x in 4 of them; with a limit of at least 2, 55 to
    /// 138 % (median 91 %, 13 runs), under 90 % of 1x in 1. The admitted
    /// p99 of the worst level was about the same (median 10.3 and 9.9 ms).
    /// At least 3 or 4 kept less of 1x at 4x in the runs made (63 to 86 %,
    /// 3 runs); at least 8 made the admitted p50 12 ms at every level, the
    /// handlers sharing one CPU.
    fn bbr_limit(&self, now: u64) -> u64 {
        self.max_in_flight_at(now).max(MIN_BBR_LIMIT)
    }

    /// The CPU use, 0 for a reading that is not a number.
    fn cpu(&self) -> f64 {
        let cpu = self.cpu.cpu_usage();
        if cpu.is_nan() {
            0.0
        } else {
            cpu
        }
    }

    /// Whether `now` is within the cool-down after the last refusal made
    /// while the CPU was busy (its end included, as Kratos's `<= 1 s`).
    fn cooling_down(&self, now: u64) -> bool {
        match self.last_drop.load(Ordering::Relaxed) {
            0 => false,
            plus_one => now.saturating_sub(plus_one - 1) <= COOL_DOWN_MS,
        }
    }

    /// Kratos BBR's `maxInFlight`: the busiest bucket's completions per
    /// second times the shortest response time, rounded to the nearest
    /// whole request (Kratos rounds down; see the module docs):
    /// `floor(max_success × buckets_per_second × min_rt_ms / 1000 + 0.5)`,
    /// both over Kratos's window, the last 10 s (see
    /// [`max_success`](Self::max_success) and [`min_rt`](Self::min_rt)),
    /// the response time in microseconds. 0 while nothing has completed in
    /// the last 10 s. At `now`, the clock reading of the check or the
    /// status that asks, so that the estimate reads no clock of its own.
    fn max_in_flight_at(&self, now: u64) -> u64 {
        let max_success = self.max_success(now);
        if max_success == 0 {
            return 0;
        }
        let Some(min_rt) = self.min_rt(now) else {
            return 0;
        };
        let buckets_per_second = (SAMPLE_COUNT as u64 * 1000 / INTERVAL_MS) as f64;
        let per_second = max_success as f64 * buckets_per_second;
        (per_second * min_rt.as_micros() as f64 / 1_000_000.0 + 0.5).floor() as u64
    }

    /// The most completions of one 100 ms bucket over the last 10 s: the
    /// peaks the node's per-second roll-up keeps for the seconds that
    /// started within 10 s, and the buckets not rolled up yet (Kratos BBR's
    /// `maxPASS`, over its whole window). Over one second the estimate
    /// could follow the throughput down: the refusals of one second cut
    /// the completions the next second's estimate is made of. The busiest
    /// bucket of the last 10 s is the service's throughput before them.
    /// Reads at most 11 peaks and the 10 buckets, without allocating; read
    /// only while BBR runs.
    fn max_success(&self, now: u64) -> u64 {
        let since = now.saturating_sub(BBR_WINDOW_MS);
        self.node.second_window().array().peak_success(now, since)
    }

    /// The shortest response time over the last 10 s: the second window's
    /// and that of the node's per-second roll-up for the seconds that
    /// started within 10 s (Kratos BBR's window). Over one second, the
    /// queue an overload built before the check ran made the shortest
    /// response time, so the estimate let that queue stay a second or two
    /// longer; the shortest of the last 10 s is still the unloaded one.
    /// Folds the roll-up without allocating; read only while BBR runs.
    fn min_rt(&self, now: u64) -> Option<Duration> {
        let window = self.node.second_window();
        let since = now.saturating_sub(BBR_WINDOW_MS);
        let recent = window
            .array()
            .rollup_fold(now, u64::MAX, |min, start, counts| {
                if start >= since {
                    *min = (*min).min(counts.min_rt_micros);
                }
            });
        let second = window.min_rt().map_or(u64::MAX, |rt| rt.as_micros() as u64);
        match recent.min(second) {
            u64::MAX => None,
            micros => Some(Duration::from_micros(micros)),
        }
    }

    /// One more request of the layer in flight, passed now.
    #[inline]
    pub(crate) fn enter(&self) {
        self.node.add_pass_request(1);
        self.node.increase_concurrency();
    }

    /// A request of the layer completed at `now_ms` after `rt`.
    #[inline]
    pub(crate) fn complete(&self, now_ms: u64, rt: Duration, failed: bool) {
        self.node.record_completion_at(now_ms, rt, failed);
    }

    /// A request whose handler panicked: a failure.
    pub(crate) fn panicked(&self) {
        self.node.increase_exception_qps(1);
    }

    /// A request of the layer left flight (its guard dropped); matched by
    /// the increase in `enter`.
    #[inline]
    pub(crate) fn leave(&self) {
        self.node.release_concurrency();
    }

    /// What the checks read now, and the refusals so far.
    pub(crate) fn status(&self) -> SystemStatus {
        let node = &self.node;
        let window = node.second_window();
        let now = node.now();
        let cpu = self.cpu();
        SystemStatus {
            cpu,
            cpu_threshold: self.cpu_threshold,
            bbr_active: cpu >= self.cpu_threshold || self.cooling_down(now),
            in_flight: node.cur_concurrency(),
            max_in_flight: self.max_in_flight_at(now),
            pass_qps: window.pass(),
            max_success_qps: self.max_success(now) * (SAMPLE_COUNT as u64 * 1000 / INTERVAL_MS),
            min_rt: self.min_rt(now),
            avg_rt: node.avg_rt(),
            refusals: std::array::from_fn(|i| self.refusals[i].load(Ordering::Relaxed)),
        }
    }
}

impl fmt::Debug for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("System")
            .field("max_qps", &self.max_qps)
            .field("max_concurrency", &self.max_concurrency)
            .field("max_avg_rt", &self.max_avg_rt)
            .field("cpu_threshold", &self.cpu_threshold)
            .field("in_flight", &self.node.cur_concurrency())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
impl System {
    /// The estimate now.
    fn max_in_flight(&self) -> u64 {
        self.max_in_flight_at(self.node.now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Clock;

    /// A clock that counts how often it is read.
    struct Counting(Arc<AtomicU64>);

    impl Clock for Counting {
        fn now_millis(&self) -> u64 {
            self.0.fetch_add(1, Ordering::Relaxed);
            5_000
        }
    }

    #[test]
    fn with_one_request_in_flight_and_no_rt_limit_the_check_reads_no_clock() {
        let reads = Arc::new(AtomicU64::new(0));
        // The CPU fully busy: only the in-flight count keeps BBR away.
        let rule = SystemRule::bbr().cpu_source(|| 1.0);
        let system = System::new(&rule, SharedClock::new(Counting(Arc::clone(&reads))));
        for in_flight in 0..2 {
            let before = reads.load(Ordering::Relaxed);
            assert_eq!(system.check(), Ok(()), "{in_flight} in flight");
            // No clock reading and no window folded: the average response
            // time is read only for a rule with `max_avg_rt`.
            assert_eq!(
                reads.load(Ordering::Relaxed),
                before,
                "{in_flight} in flight"
            );
            system.enter();
        }
        // With an RT limit the window is read, and an average above it
        // refuses.
        let limited = SystemRule::bbr()
            .cpu_source(|| 0.0)
            .max_avg_rt(Duration::from_millis(10));
        let system = System::new(&limited, SharedClock::new(Counting(Arc::clone(&reads))));
        assert_eq!(system.check(), Ok(()));
        system.enter();
        system.complete(5_000, Duration::from_millis(50), false);
        system.leave();
        assert_eq!(system.check(), Err(Refused(SystemCheck::AvgRt)));
    }

    /// `n` requests that entered at `ms` and completed after `rt`.
    fn completed(system: &System, clock: &crate::clock::ManualClock, ms: u64, n: u64, rt: u64) {
        clock.set(ms);
        for _ in 0..n {
            system.enter();
        }
        clock.set(ms + rt);
        for _ in 0..n {
            system.complete(ms + rt, Duration::from_millis(rt), false);
            system.leave();
        }
    }

    #[test]
    fn a_queue_that_built_before_the_check_ran_does_not_make_the_estimate() {
        let clock = crate::clock::ManualClock::new(10_000);
        let rule = SystemRule::bbr().cpu_source(|| 1.0);
        let system = System::new(&rule, SharedClock::new(clock.clone()));
        // Unloaded: 20 completions of 2 ms in one bucket.
        completed(&system, &clock, 10_000, 20, 2);
        // Three seconds on, an overload admitted unchecked: the same
        // throughput, each request 300 ms late from the queue.
        completed(&system, &clock, 13_000, 20, 300);
        // Over one second the shortest response time is the queue's, and
        // the estimate (20 × 10 × 0.3 s = 60) keeps 60 in flight; over
        // 10 s it is the unloaded 2 ms: 20 × 10 × 0.002 s, 0.
        assert_eq!(
            system.status().min_rt,
            Some(Duration::from_millis(2)),
            "the shortest response time of the last 10 s"
        );
        assert_eq!(system.max_in_flight(), 0);
        for _ in 0..5 {
            system.enter();
        }
        assert_eq!(system.check(), Err(Refused(SystemCheck::Bbr)));
        // Ten seconds after the unloaded completions, they leave the
        // estimate: the queue's response time is all there is.
        completed(&system, &clock, 20_050, 20, 300);
        clock.set(20_400);
        assert_eq!(system.status().min_rt, Some(Duration::from_millis(300)));
        assert_eq!(system.max_in_flight(), 60);
    }

    #[test]
    fn the_busiest_bucket_of_the_last_ten_seconds_sets_the_estimate() {
        let clock = crate::clock::ManualClock::new(10_000);
        let rule = SystemRule::bbr().cpu_source(|| 1.0);
        let system = System::new(&rule, SharedClock::new(clock.clone()));
        // Busy: 30 completions of 10 ms in one bucket, 30 × 10 × 0.01 s = 3.
        completed(&system, &clock, 10_000, 30, 10);
        // Two seconds on, nothing since: the bucket has left the last second
        // but not its slot (not rolled up yet).
        clock.set(12_000);
        assert_eq!(system.max_in_flight(), 3);
        // Five seconds on, 5 completions of 10 ms in the same slot (over one
        // second, 5 × 10 × 0.01 s = 0.5, rounded to 1): the busy bucket
        // moves into the roll-up and its peak with it.
        completed(&system, &clock, 15_000, 5, 10);
        clock.set(15_100);
        assert_eq!(system.max_in_flight(), 3);
        assert_eq!(system.status().max_success_qps, 300);
        // 3 in flight is not above 3: one more passes; 4 is above.
        for in_flight in 0..4 {
            assert_eq!(system.check(), Ok(()), "{in_flight} in flight");
            system.enter();
        }
        assert_eq!(system.check(), Err(Refused(SystemCheck::Bbr)));
        for _ in 0..4 {
            system.leave();
        }
        // Its second still starts within 10 s at 20 000 ms, no longer at
        // 20 001: then the 5 completions are the busiest. At 21 100 the
        // peak's entry is the one second 21 000 would take: it holds
        // second 10 000, not 21 000, and reads as nothing.
        clock.set(20_000);
        assert_eq!(system.max_in_flight(), 3);
        clock.set(20_001);
        assert_eq!(system.max_in_flight(), 1);
        clock.set(21_100);
        assert_eq!(system.max_in_flight(), 1);
        assert_eq!(system.status().max_success_qps, 50);
        // Nothing completed in the last 10 s: no estimate.
        clock.set(25_001);
        assert_eq!(system.max_in_flight(), 0);
    }

    #[test]
    fn while_the_estimate_is_under_two_bbr_lets_two_in_flight() {
        let clock = crate::clock::ManualClock::new(10_000);
        let rule = SystemRule::bbr().cpu_source(|| 1.0);
        let system = System::new(&rule, SharedClock::new(clock.clone()));
        // Nothing completed: an estimate of 0, and two pass.
        for in_flight in 0..2 {
            assert_eq!(system.check(), Ok(()), "{in_flight} in flight");
            system.enter();
        }
        assert_eq!(system.max_in_flight(), 0);
        assert_eq!(system.check(), Ok(()), "2 in flight is not above 2");
        system.enter();
        assert_eq!(system.check(), Err(Refused(SystemCheck::Bbr)));
        for _ in 0..3 {
            system.leave();
        }
        // 10 completions of 10 ms in one bucket: 10 × 10 × 0.01 s = 1,
        // reported as it is; still two pass, not a third.
        completed(&system, &clock, 10_000, 10, 10);
        clock.set(10_100);
        assert_eq!(system.status().max_in_flight, 1);
        for in_flight in 0..3 {
            assert_eq!(system.check(), Ok(()), "{in_flight} in flight");
            system.enter();
        }
        assert_eq!(system.check(), Err(Refused(SystemCheck::Bbr)));
        assert_eq!(system.status().refusals_of(SystemCheck::Bbr), 2);
    }

    #[test]
    fn a_queue_sixteen_times_the_estimate_is_refused_before_the_cpu_reads_busy() {
        let clock = crate::clock::ManualClock::new(10_000);
        let cpu = Arc::new(AtomicU64::new(0.6f64.to_bits()));
        let reading = Arc::clone(&cpu);
        let rule =
            SystemRule::bbr().cpu_source(move || f64::from_bits(reading.load(Ordering::Relaxed)));
        let system = System::new(&rule, SharedClock::new(clock.clone()));
        // 20 completions of 10 ms in one bucket: 20 × 10 × 0.01 s = 2.
        completed(&system, &clock, 10_000, 20, 10);
        clock.set(10_100);
        assert_eq!(system.max_in_flight(), 2);
        // 0.6 is under the 0.8 threshold, at least half of it: with 32 in
        // flight one more passes (32 is not above 16 × 2), with 33 none.
        for in_flight in 0..33 {
            assert_eq!(system.check(), Ok(()), "{in_flight} in flight");
            system.enter();
        }
        assert_eq!(system.check(), Err(Refused(SystemCheck::Bbr)));
        assert_eq!(system.status().refusals_of(SystemCheck::Bbr), 1);
        // No cool-down from it: BBR does not run.
        assert!(!system.status().bbr_active);
        // A CPU under half the threshold (a service waiting on a
        // dependency) never sees the onset check.
        cpu.store(0.39f64.to_bits(), Ordering::Relaxed);
        for _ in 0..100 {
            system.enter();
        }
        assert_eq!(system.check(), Ok(()));
    }

    #[test]
    fn with_nothing_completed_the_onset_check_lets_sixteen_in_flight() {
        let clock = crate::clock::ManualClock::new(10_000);
        let rule = SystemRule::bbr().cpu_source(|| 0.5);
        let system = System::new(&rule, SharedClock::new(clock));
        for in_flight in 0..16 {
            assert_eq!(system.check(), Ok(()), "{in_flight} in flight");
            system.enter();
        }
        assert_eq!(system.check(), Ok(()), "16 in flight is not above 16");
        system.enter();
        assert_eq!(system.check(), Err(Refused(SystemCheck::Bbr)));
    }
}
