//! [`StatisticNode`]: one resource's second window, minute window and
//! concurrency gauge on one clock.

use std::fmt;
use std::time::Duration;

use super::admission::MetricArray;
use super::array_metric::ArrayMetric;
use super::counts::{micros, Counts, MetricNode};
use super::view::MinuteWindow;
use crate::clock::{Clock, SharedClock};
use crate::error::ConfigError;
use crate::sync::{AtomicU64, Ordering};

/// Default second window: 10 buckets of 100 ms.
const SECOND_SAMPLE_COUNT: usize = 10;
const SECOND_INTERVAL_MS: u64 = 1000;
/// The minute window: 60 buckets of one second.
const MINUTE_SAMPLE_COUNT: usize = 60;
const MINUTE_INTERVAL_MS: u64 = 60_000;
/// Sentinel's default occupy timeout.
const DEFAULT_OCCUPY_TIMEOUT_MS: u64 = 500;
/// `last_fetch` before the first `metrics()` call.
const NEVER_FETCHED: u64 = u64::MAX;

/// Real-time statistics of one resource: Sentinel's `StatisticNode`.
///
/// It keeps two windows on one clock, read once per operation so the two
/// never disagree about the time:
///
/// - a **second window** (by default 10 buckets over 1000 ms; configurable
///   with [`with_second_window`](Self::with_second_window)) for the live
///   figures and for admission. It can lend quota from its future buckets
///   ([`try_occupy_next`](Self::try_occupy_next));
/// - a **minute window** (60 buckets of one second) for totals and for the
///   per-second history ([`metrics`](Self::metrics)). Recording writes the
///   second window only; its buckets roll up into the minute window as the
///   second window reuses their slots, and reads combine both (see
///   [`MinuteWindow`]), so a request costs one bucket update, not two.
///
/// plus a concurrency gauge (requests in flight).
///
/// The `*_qps` figures are per second: the second window's count divided by
/// its length in seconds.
///
/// Admission against a limit is [`TryPass`](crate::flow::TryPass) in `flow`.
///
/// # Memory
///
/// A default node takes 4 952 bytes on a 64-bit target (4 640 of them on
/// the heap), plus 640 once it lends quota. In general: the struct, plus 80
/// bytes per second-window bucket, plus 3 840 for the minute window, plus 64
/// per second-window bucket once it lends quota. `sample_count` is capped at
/// 600 (52 152 bytes, 90 552 with reservations).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::clock::ManualClock;
/// use tower_sliding_window::flow::TryPass;
/// use tower_sliding_window::stat::StatisticNode;
///
/// let clock = ManualClock::new(0);
/// let node = StatisticNode::with_clock(clock.clone());
///
/// for _ in 0..4 {
///     assert!(node.try_pass(1, 3).is_pass() || node.block_qps() > 0.0);
/// }
/// node.add_rt_and_success(Duration::from_millis(20), 1);
/// node.add_rt_and_success(Duration::from_millis(40), 1);
///
/// assert_eq!(node.pass_qps(), 3.0);
/// assert_eq!(node.block_qps(), 1.0);
/// assert_eq!(node.avg_rt(), Some(Duration::from_millis(30)));
/// assert_eq!(node.min_rt(), Some(Duration::from_millis(20)));
/// assert_eq!(node.total_request(), 4);
/// ```
pub struct StatisticNode {
    /// The second window, rolling its buckets up into the minute window as
    /// it reuses their slots.
    second: ArrayMetric,
    /// Requests in flight. Relaxed: a gauge, read on its own.
    concurrency: AtomicU64,
    /// Longest wait `try_occupy_next` may hand out, in milliseconds.
    occupy_timeout_ms: AtomicU64,
    /// Start of the newest second reported by `metrics()`. Advanced with a
    /// compare-and-swap so that concurrent callers split the seconds between
    /// them instead of both reporting one.
    last_fetch: AtomicU64,
    /// Milliseconds added to the clock's readings (see `effective_now`):
    /// 0 until a reading lags the newest bucket by more than one window.
    /// Only raised (`fetch_max`), so the node's time never goes back.
    /// Relaxed: a thread that reads an older value reaches the same time
    /// through the newest bucket's start, and raises it itself.
    skew_ms: AtomicU64,
}

impl StatisticNode {
    /// A node with the default windows on the
    /// [`SystemClock`](crate::clock::SystemClock).
    pub fn new() -> Self {
        Self::defaults(SharedClock::system())
    }

    /// A node with the default windows on the given clock.
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::defaults(SharedClock::new(clock))
    }

    fn defaults(clock: SharedClock) -> Self {
        Self::build(clock, SECOND_SAMPLE_COUNT, SECOND_INTERVAL_MS, false)
            .expect("the default second window is valid")
    }

    /// A node whose second window has `sample_count` buckets over
    /// `interval_ms` (the minute window is always 60 × 1 s).
    ///
    /// # Errors
    ///
    /// See [`LeapArray::new`](super::LeapArray::new).
    pub fn with_second_window(
        clock: impl Clock,
        sample_count: usize,
        interval_ms: u64,
    ) -> Result<Self, ConfigError> {
        Self::build(SharedClock::new(clock), sample_count, interval_ms, false)
    }

    /// A node on `clock` with a second window of `sample_count` buckets over
    /// `interval_ms`; `strict` makes admission also count the bucket that has
    /// just left the window (see `admission`, "Strict rings").
    pub(crate) fn build(
        clock: SharedClock,
        sample_count: usize,
        interval_ms: u64,
        strict: bool,
    ) -> Result<Self, ConfigError> {
        Self::build_with_peaks(clock, sample_count, interval_ms, strict, 0)
    }

    /// Like [`build`](Self::build); a `peak_window_ms` above 0 also keeps,
    /// per second of the minute window within that long, the busiest
    /// second-window bucket's completions (read with
    /// `second_window().array().peak_success`).
    pub(crate) fn build_with_peaks(
        clock: SharedClock,
        sample_count: usize,
        interval_ms: u64,
        strict: bool,
        peak_window_ms: u64,
    ) -> Result<Self, ConfigError> {
        Ok(StatisticNode {
            second: ArrayMetric::from_array(
                MetricArray::with_rollup(
                    sample_count,
                    interval_ms,
                    true,
                    MINUTE_SAMPLE_COUNT,
                    MINUTE_INTERVAL_MS,
                    strict,
                    peak_window_ms,
                )?,
                clock,
            ),
            concurrency: AtomicU64::new(0),
            occupy_timeout_ms: AtomicU64::new(DEFAULT_OCCUPY_TIMEOUT_MS.min(interval_ms)),
            last_fetch: AtomicU64::new(NEVER_FETCHED),
            skew_ms: AtomicU64::new(0),
        })
    }

    /// Sets the longest wait [`try_occupy_next`](Self::try_occupy_next) may
    /// hand out (default 500 ms).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for `occupy_timeout` when it is longer than the
    /// second window: quota can be borrowed from that window only.
    pub fn set_occupy_timeout(&self, timeout: Duration) -> Result<(), ConfigError> {
        let interval = self.second.interval_ms();
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        if ms > interval {
            return Err(ConfigError::new(
                "occupy_timeout",
                "must not exceed the second window's interval",
                format!("got {ms} ms, interval = {interval} ms"),
            ));
        }
        // Relaxed: a setting read on its own; nothing is published with it.
        self.occupy_timeout_ms.store(ms, Ordering::Relaxed);
        Ok(())
    }

    /// The longest wait [`try_occupy_next`](Self::try_occupy_next) may hand out.
    pub fn occupy_timeout(&self) -> Duration {
        Duration::from_millis(self.occupy_timeout_ms.load(Ordering::Relaxed))
    }

    /// The second window.
    pub fn second_window(&self) -> &ArrayMetric {
        &self.second
    }

    /// The minute window.
    pub fn minute_window(&self) -> MinuteWindow<'_> {
        MinuteWindow::new(self.sec(), self.clock())
    }

    /// The minute window's seconds at `now`, oldest first.
    fn minute_buckets(&self, now: u64) -> Vec<(u64, Counts)> {
        self.sec().rollup_buckets(now)
    }

    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.second.now()
    }

    /// The node's clock (kept once, by the second window).
    pub(crate) fn clock(&self) -> &SharedClock {
        self.second.shared_clock()
    }

    /// The second window's admission ring.
    #[inline]
    fn sec(&self) -> &MetricArray {
        self.second.array()
    }

    fn interval_secs(&self) -> f64 {
        self.second.interval_ms() as f64 / 1000.0
    }

    fn per_second(&self, count: u64) -> f64 {
        count as f64 / self.interval_secs()
    }
}

/// # Recording
impl StatisticNode {
    /// Records `n` passed requests, unconditionally.
    pub fn add_pass_request(&self, n: u64) {
        self.sec().add_pass(self.now(), n);
    }

    /// Records `n` blocked requests.
    pub fn increase_block_qps(&self, n: u64) {
        self.sec().current(self.now()).tallies().add_block(n);
    }

    /// Records `n` completions that took `rt` in all (the time is added once,
    /// the count `n` times, as Sentinel's `StatisticSlot` does on exit).
    ///
    /// The minimum response time is offered `rt / n`, the time per request,
    /// so that [`min_rt`](Self::min_rt) never exceeds [`avg_rt`](Self::avg_rt).
    pub fn add_rt_and_success(&self, rt: Duration, n: u64) {
        let tallies = self.sec().current(self.now()).tallies();
        tallies.add_success(n);
        let micros = micros(rt);
        tallies.add_rt_micros(micros, micros / n.max(1));
    }

    /// Records `n` completions classified as failures.
    pub fn increase_exception_qps(&self, n: u64) {
        self.sec().current(self.now()).tallies().add_exception(n);
    }

    /// One more request in flight.
    pub fn increase_concurrency(&self) {
        self.concurrency.fetch_add(1, Ordering::Relaxed);
    }

    /// One more request in flight if fewer than `max` are: Sentinel's thread
    /// grade, made exact. The check and the increment are one
    /// compare-and-swap, so with any number of concurrent callers the gauge
    /// never goes past `max` (Sentinel reads the count, then increments:
    /// alibaba/Sentinel#628). `false`, recording nothing, when `max` are in
    /// flight already. Release a place with
    /// [`decrease_concurrency`](Self::decrease_concurrency).
    ///
    /// ```
    /// use tower_sliding_window::clock::ManualClock;
    /// use tower_sliding_window::stat::StatisticNode;
    ///
    /// let node = StatisticNode::with_clock(ManualClock::new(0));
    /// assert!(node.try_increase_concurrency(2));
    /// assert!(node.try_increase_concurrency(2));
    /// assert!(!node.try_increase_concurrency(2));
    /// node.decrease_concurrency();
    /// assert!(node.try_increase_concurrency(2));
    /// assert_eq!(node.cur_concurrency(), 2);
    /// ```
    pub fn try_increase_concurrency(&self, max: u64) -> bool {
        // Relaxed: the gauge guards nothing but its own count, and every
        // read-modify-write of one atomic sees the latest value.
        self.concurrency
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    /// One request fewer in flight. Saturates at zero: an unmatched call
    /// cannot wrap the gauge around.
    pub fn decrease_concurrency(&self) {
        let _ = self
            .concurrency
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// One request fewer in flight, for a caller that counted it in with
    /// [`increase_concurrency`](Self::increase_concurrency): a plain
    /// decrement, without the saturation check.
    #[inline]
    pub(crate) fn release_concurrency(&self) {
        let previous = self.concurrency.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(
            previous > 0,
            "release_concurrency without a matching increase"
        );
    }

    /// Records `n` requests admitted on borrowed quota: in the minute window,
    /// as occupied passes and as passes (Sentinel's bookkeeping; the second
    /// window gets the passes when the reserved bucket opens).
    pub fn add_occupied_pass(&self, n: u64) {
        self.sec().add_rollup_occupied_pass(self.now(), n);
    }

    /// Reserves `n` passes in the second-window bucket containing
    /// `future_time_ms`.
    pub fn add_waiting_request(&self, future_time_ms: u64, n: u64) {
        self.sec().add_waiting(Some(self.now()), future_time_ms, n);
    }
}

/// # Live figures (second window, per second)
impl StatisticNode {
    /// Passes per second.
    pub fn pass_qps(&self) -> f64 {
        self.per_second(self.second.pass())
    }

    /// Blocks per second.
    pub fn block_qps(&self) -> f64 {
        self.per_second(self.second.block())
    }

    /// Completions per second.
    pub fn success_qps(&self) -> f64 {
        self.per_second(self.second.success())
    }

    /// Failed completions per second.
    pub fn exception_qps(&self) -> f64 {
        self.per_second(self.second.exception())
    }

    /// Passes plus blocks per second.
    pub fn total_qps(&self) -> f64 {
        let now = self.now();
        let total = self.sec().sum(now, |b| b.pass().saturating_add(b.block()));
        self.per_second(total)
    }

    /// Passes on borrowed quota per second (second window; Sentinel records
    /// those in the minute window only, so this stays 0 unless recorded
    /// through [`ArrayMetric::add_occupied_pass`]).
    pub fn occupied_pass_qps(&self) -> f64 {
        self.per_second(self.second.occupied_pass())
    }

    /// The busiest bucket's completions, scaled to a second.
    pub fn max_success_qps(&self) -> f64 {
        self.second.max_success() as f64 * self.second.sample_count() as f64 / self.interval_secs()
    }

    /// Passes in the previous whole second (minute window).
    pub fn previous_pass_qps(&self) -> f64 {
        self.minute_window().previous_window_pass() as f64
    }

    /// Blocks in the previous whole second (minute window).
    pub fn previous_block_qps(&self) -> f64 {
        self.minute_window().previous_window_block() as f64
    }

    /// Average response time over the second window's completions; `None`
    /// when nothing completed. Never below [`min_rt`](Self::min_rt), also
    /// after absurd response times saturated the sum.
    pub fn avg_rt(&self) -> Option<Duration> {
        self.sec().counts(self.now()).avg_rt()
    }

    /// Smallest response time in the second window.
    pub fn min_rt(&self) -> Option<Duration> {
        self.second.min_rt()
    }

    /// Requests in flight.
    pub fn cur_concurrency(&self) -> u64 {
        self.concurrency.load(Ordering::Relaxed)
    }

    /// Passes reserved in future buckets.
    pub fn waiting(&self) -> u64 {
        self.second.waiting()
    }
}

/// # Minute totals
impl StatisticNode {
    /// Passes plus blocks in the last minute.
    pub fn total_request(&self) -> u64 {
        self.minute_window().total()
    }

    /// Passes in the last minute.
    pub fn total_pass(&self) -> u64 {
        self.minute_window().pass()
    }

    /// Completions in the last minute.
    pub fn total_success(&self) -> u64 {
        self.minute_window().success()
    }

    /// Failed completions in the last minute.
    pub fn total_exception(&self) -> u64 {
        self.minute_window().exception()
    }

    /// Blocks in the last minute.
    pub fn block_request(&self) -> u64 {
        self.minute_window().block()
    }
}

/// # Borrowing quota (occupy)
impl StatisticNode {
    /// How long a request of `acquire` permits would wait to pass on quota
    /// borrowed from the second window, if at all.
    ///
    /// Returns `Some(wait_ms)` when, after `wait_ms`, enough of the window's
    /// passes will have slid out for the request and everything already
    /// reserved to fit under `threshold` (per second), and the wait is within
    /// the [occupy timeout](Self::occupy_timeout); `None` otherwise, or when
    /// a whole window's quota is already reserved. Records nothing: on `Some`,
    /// the caller reserves with [`add_waiting_request`](Self::add_waiting_request)
    /// and [`add_occupied_pass`](Self::add_occupied_pass).
    ///
    /// This is Sentinel's `tryOccupyNext` arithmetic on this node's own
    /// second window, so with 10 × 100 ms buckets the waits come in 100 ms
    /// steps rather than Java's 500 ms.
    pub fn try_occupy_next(&self, now_ms: u64, acquire: u64, threshold: f64) -> Option<u64> {
        let sec = self.sec();
        let interval = sec.interval_ms();
        let len = sec.window_length_ms();
        let timeout = self.occupy_timeout_ms.load(Ordering::Relaxed);
        let max_count = threshold * interval as f64 / 1000.0;
        let borrowed = sec.waiting(now_ms);
        if borrowed as f64 >= max_count {
            return None;
        }
        let mut current_pass = sec.sum(now_ms, |b| b.pass());
        let offset = now_ms % len;
        // Start of the oldest bucket in the window (may be before time 0).
        let mut earliest =
            i128::from(now_ms) - i128::from(offset) + i128::from(len) - i128::from(interval);
        let mut idx = 0u64;
        while earliest < i128::from(now_ms) {
            let wait = idx * len + len - offset;
            if wait >= timeout {
                break;
            }
            let window_pass = u64::try_from(earliest).map_or(0, |t| sec.window_pass(t, now_ms));
            let needed = current_pass
                .saturating_add(borrowed)
                .saturating_add(acquire)
                .saturating_sub(window_pass);
            if needed as f64 <= max_count {
                return Some(wait);
            }
            earliest += i128::from(len);
            current_pass = current_pass.saturating_sub(window_pass);
            idx += 1;
        }
        None
    }
}

/// # History
impl StatisticNode {
    /// Every finished second of the minute window not reported by an earlier
    /// call, oldest first, skipping seconds without events; never the
    /// current second. Each second is reported exactly once, also across
    /// concurrent callers (Sentinel's `metrics()`, which feeds its metric
    /// log).
    pub fn metrics(&self) -> Vec<MetricNode> {
        let now = self.now();
        loop {
            let last = self.last_fetch.load(Ordering::Acquire);
            let nodes: Vec<MetricNode> = self
                .history(now)
                .into_iter()
                .filter(|n| last == NEVER_FETCHED || n.timestamp_ms > last)
                .filter(|n| {
                    n.pass | n.block | n.success | n.exception | n.occupied_pass != 0
                        || n.rt.is_some()
                })
                .collect();
            let Some(newest) = nodes.last().map(|n| n.timestamp_ms) else {
                return nodes;
            };
            // AcqRel: a caller that loses the race re-reads `last` and skips
            // what the winner reported.
            if self
                .last_fetch
                .compare_exchange(last, newest, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return nodes;
            }
        }
    }

    /// The finished seconds of the minute window at `now`, oldest first,
    /// skipping seconds without events; never the current second. A read:
    /// unlike [`metrics`](Self::metrics), it reports the same seconds again
    /// on the next call.
    pub(crate) fn history(&self, now: u64) -> Vec<MetricNode> {
        let length = self.sec().rollup_window_length_ms().unwrap_or(1000);
        let current_second = now - now % length;
        self.minute_buckets(now)
            .iter()
            .filter(|(start, _)| *start < current_second)
            .map(|(start, counts)| MetricNode::from_counts(*start, counts))
            .collect()
    }
}

/// # For the HTTP layer and `flow`
impl StatisticNode {
    /// Records one completion at `now`: a success taking `rt`, and an
    /// exception on top when it `failed`, with one bucket lookup.
    #[inline]
    pub(crate) fn record_completion_at(&self, now: u64, rt: Duration, failed: bool) {
        let tallies = self.sec().current(now).tallies();
        tallies.add_success(1);
        let micros = micros(rt);
        tallies.add_rt_micros(micros, micros);
        if failed {
            tallies.add_exception(1);
        }
    }

    /// The second window's buckets at `now` as `(start, success,
    /// exception)`, oldest first: the completions and failures a circuit
    /// breaker on the key reads instead of counting them again. No
    /// allocation.
    #[inline]
    pub(crate) fn window_completions(
        &self,
        now: u64,
    ) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.sec()
            .buckets(now)
            .map(|(start, bucket)| (start, bucket.success(), bucket.exception()))
    }

    /// The time the node is read, decided and judged idle at: the clock
    /// reading `now` plus the node's skew (0 unless the clock went back
    /// further than a window, below), or the start of the second window's
    /// newest bucket if that is later. Admission moves a reading that lags
    /// behind that bucket forward to it, so this is the earliest time the
    /// statistics can be read at without missing the newest events.
    ///
    /// A reading that lags the newest bucket by at most one window (a slow
    /// thread, a small step back) is moved forward to that bucket, which
    /// then holds still until the clock catches up: at most one window. A
    /// reading that lags it by more (the clock stepped back, or one reading
    /// ran far ahead and the clock is sane again) would hold it still for
    /// the whole step, so the node instead takes the difference as its skew
    /// and from then on runs that much ahead of the clock: its windows keep
    /// sliding at the clock's pace, the passes recorded before the step
    /// count for one more window at most, and the key can be idle again a
    /// window later. Readings are clamped at 2^62 ms, so a node written at
    /// that clamp stays there.
    ///
    /// See [`lag`](Self::lag) for how long `now` must wait for the result.
    #[inline]
    pub(crate) fn effective_now(&self, now: u64) -> u64 {
        let skewed = now.saturating_add(self.skew_ms.load(Ordering::Relaxed));
        let Some(newest) = self.sec().newest_bucket_start() else {
            return skewed;
        };
        if newest <= skewed {
            return skewed;
        }
        if newest - skewed > self.sec().interval_ms() {
            self.skew_ms.fetch_max(newest - now, Ordering::Relaxed);
        }
        newest
    }

    /// How long the clock, reading `now`, must run before it reaches the
    /// node's time `at` (a result of [`effective_now`](Self::effective_now)
    /// at `now`): the lag behind the newest bucket that the node's skew does
    /// not cover (at most one window, see `effective_now`). A wait computed
    /// at `at` is that much longer on the clock.
    #[inline]
    pub(crate) fn lag(&self, now: u64, at: u64) -> u64 {
        at.saturating_sub(now.saturating_add(self.skew_ms.load(Ordering::Relaxed)))
    }

    /// Adds `n` passes to the second window at `now` if
    /// `decide(window_pass)` says yes, in one atomic step (see
    /// `MetricArray::try_add_pass`): `Ok(window_pass)` before the add, or
    /// `Err(window_pass)` when refused.
    #[inline]
    pub(crate) fn try_add_pass_at(
        &self,
        now: u64,
        n: u64,
        decide: impl Fn(u64) -> bool,
    ) -> Result<u64, u64> {
        self.sec().try_add_pass(now, n, decide)
    }

    /// Records `n` blocked requests at `now`.
    #[inline]
    pub(crate) fn record_block_at(&self, now: u64, n: u64) {
        self.sec().current(now).tallies().add_block(n);
    }

    /// The second window's buckets at `now` as `(start, passes)`, oldest
    /// first (for `flow`'s wait estimate; no allocation).
    #[inline]
    pub(crate) fn window_passes(&self, now: u64) -> impl Iterator<Item = (u64, u64)> + Clone + '_ {
        self.second.window_passes(now)
    }

    /// What admission counts at `now`, as `(start, passes)` oldest first,
    /// and how long a bucket counts for it: the second window's buckets over
    /// its interval, led, on a strict node, by the bucket that has just left
    /// the window, each counting one bucket length longer. No allocation.
    #[inline]
    pub(crate) fn admission_passes(
        &self,
        now: u64,
    ) -> (impl Iterator<Item = (u64, u64)> + Clone + '_, u64) {
        let array = self.sec();
        let departed = array.departed_bucket(now);
        let span = if array.is_strict() {
            array.interval_ms() + array.window_length_ms()
        } else {
            array.interval_ms()
        };
        (departed.into_iter().chain(self.window_passes(now)), span)
    }

    /// Every count recorded since the node was made (for exporters'
    /// counters; see `MetricArray::lifetime_counts`). Costs one read of each
    /// second-window bucket; recording pays nothing for it.
    pub(crate) fn lifetime_counts(&self) -> Counts {
        self.sec().lifetime_counts()
    }

    /// The second window's counts at `now`, summed.
    pub(crate) fn window_counts(&self, now: u64) -> Counts {
        self.sec().counts(now)
    }

    /// Whether the key is idle at `now`: nothing in flight, and nothing the
    /// second window or its reservation ring holds can count in a window at
    /// `now` or later. O(1): the rings' newest starts stand for all their
    /// buckets.
    ///
    /// The minute window does not keep a node alive: once its second window
    /// is empty, a node may be evicted, and its minute-window history is
    /// lost with it.
    pub(crate) fn is_idle_at(&self, now: u64) -> bool {
        let interval = self.second.interval_ms();
        let window_start = now - now % self.second.window_length_ms();
        // A bucket counts at `now` or later if its start is later than one
        // interval before the current bucket (reservations may be ahead).
        let counts = |start: u64| start.saturating_add(interval) > window_start;
        self.cur_concurrency() == 0 && !self.sec().newest_start().is_some_and(counts)
    }
}

impl Default for StatisticNode {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for StatisticNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatisticNode")
            .field("second", &self.second)
            .field("minute", &self.minute_window())
            .field("concurrency", &self.cur_concurrency())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn node(start: u64) -> (ManualClock, StatisticNode) {
        let clock = ManualClock::new(start);
        let node = StatisticNode::with_clock(clock.clone());
        (clock, node)
    }

    #[test]
    fn idle_once_the_second_window_is_empty() {
        let (clock, n) = node(10_000);
        assert!(n.is_idle_at(10_000), "a fresh node is idle");
        n.add_pass_request(1);
        assert!(!n.is_idle_at(10_000));
        assert!(!n.is_idle_at(10_999), "the bucket at 10 000 still counts");
        // The second window no longer holds the event; the minute window
        // does, but it does not keep the node alive.
        clock.set(11_000);
        assert!(n.is_idle_at(11_000));
        assert_eq!(n.total_pass(), 1, "still in the minute window");
    }

    #[test]
    fn in_flight_requests_and_reservations_keep_a_node_alive() {
        let (_, n) = node(10_000);
        n.increase_concurrency();
        assert!(!n.is_idle_at(10_000));
        n.release_concurrency();
        assert!(n.is_idle_at(10_000));

        n.add_waiting_request(10_500, 1);
        assert!(!n.is_idle_at(10_000), "reserved ahead");
        assert!(!n.is_idle_at(11_499), "matured, still in the window");
        assert!(n.is_idle_at(11_500), "slid out");
    }

    #[test]
    fn a_clock_behind_the_newest_bucket_is_not_idle() {
        let (_, n) = node(10_000);
        n.add_pass_request(1);
        assert!(!n.is_idle_at(5_000));
    }

    #[test]
    fn history_is_a_read_of_the_finished_seconds() {
        let (clock, n) = node(10_000);
        n.add_pass_request(2);
        clock.set(11_200);
        n.increase_block_qps(1);
        // Second 12 is empty; the current second (13) is never reported.
        clock.set(13_100);
        n.add_pass_request(5);
        let history = n.history(13_100);
        let seconds: Vec<(u64, u64, u64)> = history
            .iter()
            .map(|m| (m.timestamp_ms, m.pass, m.block))
            .collect();
        assert_eq!(seconds, [(10_000, 2, 0), (11_000, 0, 1)]);
        assert_eq!(n.history(13_100), history, "a read, not a drain");
        // `metrics()` drains; `history` still reports the same seconds.
        assert_eq!(n.metrics(), history);
        assert_eq!(n.history(13_100), history);
    }

    #[test]
    fn window_counts_sum_the_second_window() {
        let (_, n) = node(10_000);
        n.add_pass_request(2);
        n.increase_block_qps(1);
        n.add_rt_and_success(Duration::from_millis(4), 2);
        let counts = n.window_counts(10_000);
        assert_eq!((counts.pass, counts.block, counts.success), (2, 1, 2));
        assert_eq!(counts.rt_micros, 4_000);
        assert_eq!(counts.min_rt(), Some(Duration::from_millis(2)));
        assert_eq!(counts.avg_rt(), Some(Duration::from_millis(2)));
    }
}
