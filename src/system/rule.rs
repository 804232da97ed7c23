//! [`SystemRule`]: the thresholds of the layer's adaptive protection.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::cpu::CpuSource;

/// Kratos BBR's CPU threshold: 80 % (its `CPUThreshold` of 800 per mille).
pub(crate) const DEFAULT_CPU_THRESHOLD: f64 = 0.8;

/// The layer's adaptive protection: limits on the whole layer's traffic
/// and, while the CPU is busy, on what is in flight. Set with
/// [`SlidingWindowLayer::system`](crate::SlidingWindowLayer::system); see
/// the [module docs](super) for what each check reads and when to use it.
///
/// [`bbr`](Self::bbr) makes the rule with the CPU-gated in-flight check at
/// Kratos's defaults; the modifiers add Sentinel's checks on the layer's
/// totals and move the threshold.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::system::SystemRule;
///
/// let rule = SystemRule::bbr()
///     .max_qps(5_000)
///     .max_concurrency(200)
///     .max_avg_rt(Duration::from_millis(250))
///     .cpu_threshold(0.9);
/// # let _ = rule;
/// ```
///
/// # Panics
///
/// The modifiers panic, with a message naming the setting, on a value the
/// rule cannot use: a `max_qps` or `max_concurrency` of 0, a zero
/// `max_avg_rt`, a `cpu_threshold` outside `(0, 1]`.
#[derive(Clone)]
pub struct SystemRule {
    pub(crate) max_qps: Option<u64>,
    pub(crate) max_concurrency: Option<u64>,
    pub(crate) max_avg_rt: Option<Duration>,
    pub(crate) cpu_threshold: f64,
    /// `None`: the process's own CPU use, sampled once the layer is built.
    pub(crate) cpu: Option<Arc<dyn CpuSource>>,
}

impl SystemRule {
    /// The CPU-gated in-flight check (BBR) at Kratos's defaults: while the
    /// CPU use (an average, sampled every 500 ms and raised by a busier
    /// reading every 50 ms) is at or above 80 %, and for 1 s after the last
    /// refusal that made, a request is refused when more than two requests
    /// are in flight and more than the layer's best throughput (its busiest
    /// 100 ms bucket) times its shortest response time, both of the last
    /// 10 s; with the CPU at 40 % or more, when more than 16 times that are
    /// in flight (see the [module docs](super)). No other check until a
    /// modifier adds it.
    ///
    /// ```
    /// use tower_sliding_window::{system::SystemRule, SlidingWindowLayer};
    ///
    /// let layer = SlidingWindowLayer::qps(1_000).system(SystemRule::bbr());
    /// # let _ = layer;
    /// ```
    pub fn bbr() -> SystemRule {
        SystemRule {
            max_qps: None,
            max_concurrency: None,
            max_avg_rt: None,
            cpu_threshold: DEFAULT_CPU_THRESHOLD,
            cpu: None,
        }
    }

    /// Refuses a request when the layer has passed `max` requests in the
    /// last second (Sentinel's `qps`): the request that would be number
    /// `max + 1` within a second is refused. Counted over the layer's 1 s
    /// window of 10 buckets, all keys together.
    ///
    /// # Panics
    ///
    /// If `max` is 0.
    pub fn max_qps(mut self, max: u64) -> SystemRule {
        assert!(
            max > 0,
            "SystemRule::max_qps: must be at least 1 (got 0); leave it unset for no limit"
        );
        self.max_qps = Some(max);
        self
    }

    /// Refuses a request when `max` requests of the layer are in flight
    /// (Sentinel's `maxThread`): at most `max` at once, all keys together.
    ///
    /// # Panics
    ///
    /// If `max` is 0.
    pub fn max_concurrency(mut self, max: u64) -> SystemRule {
        assert!(
            max > 0,
            "SystemRule::max_concurrency: must be at least 1 (got 0); leave it unset for no limit"
        );
        self.max_concurrency = Some(max);
        self
    }

    /// Refuses a request when the average response time of the layer's
    /// completions over the last second is above `max` (Sentinel's
    /// `maxRt`); an average equal to `max` passes, and so does every
    /// request while nothing has completed in the last second.
    ///
    /// # Panics
    ///
    /// If `max` is zero.
    pub fn max_avg_rt(mut self, max: Duration) -> SystemRule {
        assert!(
            !max.is_zero(),
            "SystemRule::max_avg_rt: must be more than zero; leave it unset for no limit"
        );
        self.max_avg_rt = Some(max);
        self
    }

    /// The CPU use at and above which the BBR check runs, as a fraction
    /// of the CPU the service may use (default 0.8). From half of it, the
    /// onset check refuses a request when more than 16 times BBR's
    /// estimate are in flight (see the [module docs](super)).
    ///
    /// # Panics
    ///
    /// If `threshold` is not in `(0, 1]`.
    pub fn cpu_threshold(mut self, threshold: f64) -> SystemRule {
        assert!(
            threshold > 0.0 && threshold <= 1.0,
            "SystemRule::cpu_threshold: must be in (0, 1], a fraction of the CPU the service \
             may use (got {threshold})"
        );
        self.cpu_threshold = threshold;
        self
    }

    /// Reads the CPU use from `source` instead of sampling the process's
    /// (see [`CpuSource`]): no sampler thread runs for this rule. Also
    /// how tests drive the BBR check.
    pub fn cpu_source(mut self, source: impl CpuSource) -> SystemRule {
        self.cpu = Some(Arc::new(source));
        self
    }

    /// Whether the rule samples the process's CPU use itself.
    pub(crate) fn samples_process_cpu(&self) -> bool {
        self.cpu.is_none()
    }
}

impl fmt::Debug for SystemRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SystemRule")
            .field("max_qps", &self.max_qps)
            .field("max_concurrency", &self.max_concurrency)
            .field("max_avg_rt", &self.max_avg_rt)
            .field("cpu_threshold", &self.cpu_threshold)
            .field(
                "cpu",
                &if self.cpu.is_some() {
                    "custom"
                } else {
                    "process"
                },
            )
            .finish()
    }
}
