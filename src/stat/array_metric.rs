use std::fmt;
use std::time::Duration;

use super::admission::MetricArray;
use super::counts::MetricEvent;
use super::counts::{micros, BucketSnapshot, MetricNode};
use super::view::BucketRef;
use crate::clock::{Clock, SharedClock};
use crate::error::ConfigError;

/// Windowed counters over a bucket ring, read and written at the clock's
/// current time: Sentinel's `ArrayMetric` with its whole `Metric` API.
///
/// Every read covers the buckets in the window at the current time (see
/// [`LeapArray`](super::LeapArray) for the exact window edge), and behaves as though the
/// current bucket had been opened: nothing needs to be written first.
///
/// Admission against a limit is [`TryPass::try_pass`](crate::flow::TryPass::try_pass)
/// (in `flow`): exact in every bucket-aligned window under any number of
/// concurrent callers.
///
/// Its buckets are managed: reads hand out [`BucketSnapshot`]s, never the
/// buckets, so nothing a reader holds can upset admission.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::clock::ManualClock;
/// use tower_sliding_window::stat::ArrayMetric;
///
/// let clock = ManualClock::new(10_000);
/// let metric = ArrayMetric::with_clock(10, 1000, clock.clone())?;
///
/// metric.add_pass(3);
/// metric.add_success(2);
/// metric.add_rt(Duration::from_millis(30));
/// clock.advance(Duration::from_millis(400));
/// metric.add_pass(1);
/// metric.add_block(2);
///
/// assert_eq!(metric.pass(), 4);
/// assert_eq!(metric.block(), 2);
/// assert_eq!(metric.rt(), Duration::from_millis(30));
/// assert_eq!(metric.max_success(), 2);
///
/// // One second after the first events, their bucket has slid out.
/// clock.advance(Duration::from_millis(600));
/// assert_eq!(metric.pass(), 1);
/// # Ok::<(), tower_sliding_window::ConfigError>(())
/// ```
pub struct ArrayMetric {
    array: MetricArray,
    clock: SharedClock,
}

impl ArrayMetric {
    /// A metric of `sample_count` buckets over `interval_ms`, on the
    /// [`SystemClock`](crate::clock::SystemClock).
    ///
    /// # Errors
    ///
    /// See [`LeapArray::new`](super::LeapArray::new).
    pub fn new(sample_count: usize, interval_ms: u64) -> Result<Self, ConfigError> {
        Self::build(sample_count, interval_ms, SharedClock::system(), false)
    }

    /// A metric on the given clock.
    ///
    /// # Errors
    ///
    /// See [`LeapArray::new`](super::LeapArray::new).
    pub fn with_clock(
        sample_count: usize,
        interval_ms: u64,
        clock: impl Clock,
    ) -> Result<Self, ConfigError> {
        Self::build(sample_count, interval_ms, SharedClock::new(clock), false)
    }

    /// A metric that can lend quota from future buckets (Sentinel's
    /// `enableOccupy`): [`add_waiting`](Self::add_waiting) reserves passes in
    /// a future bucket, which count as [`waiting`](Self::waiting) until that
    /// bucket opens and as passes from then on.
    ///
    /// # Errors
    ///
    /// See [`LeapArray::new`](super::LeapArray::new).
    pub fn occupiable(
        sample_count: usize,
        interval_ms: u64,
        clock: impl Clock,
    ) -> Result<Self, ConfigError> {
        Self::build(sample_count, interval_ms, SharedClock::new(clock), true)
    }

    pub(crate) fn build(
        sample_count: usize,
        interval_ms: u64,
        clock: SharedClock,
        occupiable: bool,
    ) -> Result<Self, ConfigError> {
        Ok(ArrayMetric {
            array: MetricArray::new(sample_count, interval_ms, occupiable)?,
            clock,
        })
    }

    pub(crate) fn from_array(array: MetricArray, clock: SharedClock) -> Self {
        ArrayMetric { array, clock }
    }

    /// The admission ring, for `flow` and for `StatisticNode`.
    #[inline]
    pub(crate) fn array(&self) -> &MetricArray {
        &self.array
    }

    /// The window's buckets at `now` as `(start, passes)`, oldest first
    /// (for `flow`'s wait estimate; no allocation).
    #[inline]
    pub(crate) fn window_passes(&self, now: u64) -> impl Iterator<Item = (u64, u64)> + Clone + '_ {
        self.array.pass_buckets(now)
    }

    /// The clock's current time, in milliseconds.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.clock.now_millis()
    }

    /// The clock this metric reads.
    #[inline]
    pub(crate) fn shared_clock(&self) -> &SharedClock {
        &self.clock
    }

    fn sum(&self, f: impl Fn(BucketRef<'_>) -> u64) -> u64 {
        self.array.sum(self.now(), f)
    }
}

/// # Configuration and buckets
impl ArrayMetric {
    /// Number of buckets.
    pub fn sample_count(&self) -> usize {
        self.array.sample_count()
    }

    /// Length of the window, in milliseconds.
    pub fn interval_ms(&self) -> u64 {
        self.array.interval_ms()
    }

    /// Length of one bucket, in milliseconds.
    pub fn window_length_ms(&self) -> u64 {
        self.array.window_length_ms()
    }

    /// Snapshots of the buckets the ring holds for the current window,
    /// oldest first, each with its window (reservations that matured without
    /// their bucket being opened are not buckets; [`details`](Self::details)
    /// has them).
    ///
    /// Snapshots, not the buckets: the ring's buckets carry the bookkeeping
    /// that makes admission exact, and only this metric writes them.
    pub fn list(&self) -> Vec<BucketSnapshot> {
        self.array.list(self.now())
    }

    /// A snapshot of the held bucket containing `time_ms`, without opening
    /// it (Sentinel's `getWindowValue`).
    pub fn window_value(&self, time_ms: u64) -> Option<BucketSnapshot> {
        self.array.window_value(time_ms)
    }
}

/// # Reading the window
impl ArrayMetric {
    /// Completed requests in the window.
    pub fn success(&self) -> u64 {
        self.sum(|b| b.success())
    }

    /// The largest success count of any single bucket in the window; 0 when
    /// the window is empty.
    pub fn max_success(&self) -> u64 {
        self.array.max_success(self.now())
    }

    /// Failed completions in the window.
    pub fn exception(&self) -> u64 {
        self.sum(|b| b.exception())
    }

    /// Rejected requests in the window.
    pub fn block(&self) -> u64 {
        self.sum(|b| b.block())
    }

    /// Admitted requests in the window, including reservations whose bucket
    /// has been reached.
    pub fn pass(&self) -> u64 {
        self.sum(|b| b.pass())
    }

    /// Requests admitted on borrowed quota, in the window.
    pub fn occupied_pass(&self) -> u64 {
        self.sum(|b| b.occupied_pass())
    }

    /// Passes reserved in buckets that have not started yet. Always 0 for a
    /// metric that is not [occupiable](Self::occupiable).
    pub fn waiting(&self) -> u64 {
        self.array.waiting(self.now())
    }

    /// Passes of the bucket just before the current one; 0 if it is not held.
    pub fn previous_window_pass(&self) -> u64 {
        self.array.previous(self.now()).map_or(0, |b| b.pass())
    }

    /// Blocks of the bucket just before the current one; 0 if it is not held.
    pub fn previous_window_block(&self) -> u64 {
        self.array.previous(self.now()).map_or(0, |b| b.block())
    }

    /// Sum of the response times in the window.
    pub fn rt(&self) -> Duration {
        Duration::from_micros(self.sum(|b| b.rt_micros()))
    }

    /// Smallest response time in the window; `None` when no response time was
    /// recorded.
    pub fn min_rt(&self) -> Option<Duration> {
        self.array.min_rt(self.now())
    }

    /// Passes of the bucket containing `time_ms`, without opening it; 0 when
    /// the ring does not hold that bucket.
    pub fn window_pass(&self, time_ms: u64) -> u64 {
        self.array.window_pass(time_ms, self.now())
    }

    /// One [`MetricNode`] per bucket in the window, oldest first.
    pub fn details(&self) -> Vec<MetricNode> {
        self.array.details(self.now())
    }
}

/// # Recording
impl ArrayMetric {
    /// Records `n` admitted requests, unconditionally. Use
    /// [`TryPass::try_pass`](crate::flow::TryPass::try_pass) to admit
    /// against a limit.
    pub fn add_pass(&self, n: u64) {
        self.array.add_pass(self.now(), n);
    }

    /// Records `n` rejected requests.
    pub fn add_block(&self, n: u64) {
        self.array.current(self.now()).tallies().add_block(n);
    }

    /// Records `n` completions.
    pub fn add_success(&self, n: u64) {
        self.array.current(self.now()).tallies().add_success(n);
    }

    /// Records `n` failed completions.
    pub fn add_exception(&self, n: u64) {
        self.array.current(self.now()).tallies().add_exception(n);
    }

    /// Records `n` requests admitted on borrowed quota.
    pub fn add_occupied_pass(&self, n: u64) {
        self.array
            .current(self.now())
            .tallies()
            .add_occupied_pass(n);
    }

    /// Records one response time (the window's sum saturates rather than
    /// wraps).
    pub fn add_rt(&self, rt: Duration) {
        let micros = micros(rt);
        self.array
            .current(self.now())
            .tallies()
            .add_rt_micros(micros, micros);
    }

    /// Reserves `n` passes in the bucket containing `future_time_ms`.
    ///
    /// On a metric that is not [occupiable](Self::occupiable) this does
    /// nothing (Sentinel throws; a statistics call should not fail).
    pub fn add_waiting(&self, future_time_ms: u64, n: u64) {
        self.array.add_waiting(Some(self.now()), future_time_ms, n);
    }
}

impl fmt::Debug for ArrayMetric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArrayMetric")
            .field("sample_count", &self.sample_count())
            .field("interval_ms", &self.interval_ms())
            .field("occupiable", &self.array.is_occupiable())
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

/// A bucket ring that can lend quota from future buckets: Sentinel's
/// `OccupiableBucketLeapArray`.
///
/// Reservations ([`add_waiting`](Self::add_waiting)) wait in a reservation
/// ring of the same shape. When the reserved bucket opens, its pass count
/// starts at the reservation; reads at a time inside that bucket count the
/// reservation as passes even before anything opens it.
/// [`ArrayMetric::occupiable`] is the same
/// ring behind a clock.
///
/// Its buckets are managed (they carry the bookkeeping the ring relies on):
/// record through [`add`](Self::add) and read [`BucketSnapshot`]s.
///
/// # Examples
///
/// ```
/// use tower_sliding_window::stat::OccupiableBucketLeapArray;
///
/// let ring = OccupiableBucketLeapArray::new(2, 1000)?;
/// ring.add_waiting(1_000, 3);
/// assert_eq!(ring.current_waiting(700), 3);
/// assert_eq!(ring.current_window(1_000).pass(), 3);
/// assert_eq!(ring.current_waiting(1_000), 0);
/// # Ok::<(), tower_sliding_window::ConfigError>(())
/// ```
pub struct OccupiableBucketLeapArray {
    array: MetricArray,
}

impl OccupiableBucketLeapArray {
    /// A ring of `sample_count` buckets over `interval_ms`, with a reservation
    /// ring of the same shape.
    ///
    /// # Errors
    ///
    /// See [`LeapArray::new`](super::LeapArray::new).
    pub fn new(sample_count: usize, interval_ms: u64) -> Result<Self, ConfigError> {
        Ok(OccupiableBucketLeapArray {
            array: MetricArray::new(sample_count, interval_ms, true)?,
        })
    }

    /// Opens the bucket for `now_ms` if needed (a newly opened bucket starts
    /// with the passes reserved for it) and returns a snapshot of it.
    pub fn current_window(&self, now_ms: u64) -> BucketSnapshot {
        self.array.current_snapshot(now_ms)
    }

    /// Records `n` events in the bucket for `now_ms` (opened if needed). For
    /// [`MetricEvent::Rt`], `n` is a response time in microseconds.
    ///
    /// ```
    /// use tower_sliding_window::stat::{MetricEvent, OccupiableBucketLeapArray};
    ///
    /// let ring = OccupiableBucketLeapArray::new(2, 1000)?;
    /// ring.add(700, MetricEvent::Pass, 2);
    /// assert_eq!(ring.current_window(700).pass(), 2);
    /// # Ok::<(), tower_sliding_window::ConfigError>(())
    /// ```
    pub fn add(&self, now_ms: u64, event: MetricEvent, n: u64) {
        let tallies = || self.array.current(now_ms).tallies();
        match event {
            MetricEvent::Pass => self.array.add_pass(now_ms, n),
            MetricEvent::Block => tallies().add_block(n),
            MetricEvent::Exception => tallies().add_exception(n),
            MetricEvent::Success => tallies().add_success(n),
            MetricEvent::Rt => tallies().add_rt_micros(n, n),
            MetricEvent::OccupiedPass => tallies().add_occupied_pass(n),
        }
    }

    /// Reserves `n` passes in the bucket containing `future_time_ms`.
    pub fn add_waiting(&self, future_time_ms: u64, n: u64) {
        self.array.add_waiting(None, future_time_ms, n);
    }

    /// Passes reserved in buckets that start after `now_ms`.
    pub fn current_waiting(&self, now_ms: u64) -> u64 {
        self.array.waiting(now_ms)
    }

    /// One [`MetricNode`] per bucket in the window at `now_ms`, oldest first,
    /// matured reservations included.
    pub fn details(&self, now_ms: u64) -> Vec<MetricNode> {
        self.array.details(now_ms)
    }

    /// Snapshots of the buckets the ring holds for the window at `now_ms`,
    /// oldest first (see [`ArrayMetric::list`](super::ArrayMetric::list)).
    pub fn list(&self, now_ms: u64) -> Vec<BucketSnapshot> {
        self.array.list(now_ms)
    }
}

impl fmt::Debug for OccupiableBucketLeapArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OccupiableBucketLeapArray")
            .field("sample_count", &self.array.sample_count())
            .field("interval_ms", &self.array.interval_ms())
            .finish_non_exhaustive()
    }
}
