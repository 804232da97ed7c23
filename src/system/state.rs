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
    /// The BBR check's estimate: the most requests in flight it lets
    /// through while it runs (see the [module docs](super)).
    pub max_in_flight: u64,
    /// Requests the layer passed in the last second.
    pub pass_qps: u64,
    /// The busiest 100 ms bucket's completions in the last second, scaled
    /// to a second.
    pub max_success_qps: u64,
    /// The shortest response time in the last second.
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
            node: StatisticNode::build(clock, SAMPLE_COUNT, INTERVAL_MS, false)
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
        let busy = self.cpu() >= self.cpu_threshold;
        if !busy && !self.cooling_down(now) {
            return Ok(());
        }
        if in_flight > self.max_in_flight() {
            if busy {
                self.last_drop
                    .fetch_max(now.saturating_add(1), Ordering::Relaxed);
            }
            return Err(Refused(SystemCheck::Bbr));
        }
        Ok(())
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
    /// whole request: `floor(max_success × buckets_per_second × min_rt_ms
    /// / 1000 + 0.5)`, over the last second (with the response time in
    /// microseconds). 0 while nothing has completed in the last second.
    pub(crate) fn max_in_flight(&self) -> u64 {
        let window = self.node.second_window();
        let Some(min_rt) = window.min_rt() else {
            return 0;
        };
        let buckets_per_second = (SAMPLE_COUNT as u64 * 1000 / INTERVAL_MS) as f64;
        let per_second = window.max_success() as f64 * buckets_per_second;
        (per_second * min_rt.as_micros() as f64 / 1_000_000.0 + 0.5).floor() as u64
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
            max_in_flight: self.max_in_flight(),
            pass_qps: window.pass(),
            max_success_qps: window.max_success() * (SAMPLE_COUNT as u64 * 1000 / INTERVAL_MS),
            min_rt: window.min_rt(),
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
}
