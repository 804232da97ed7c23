//! `CircuitBreaker`: one breaker's state machine and its statistics.
//!
//! # Implementation details
//!
//! The state is one atomic word: the low two bits are the state's tag, the
//! rest a time in milliseconds.
//!
//! | word                    | state                                          |
//! |-------------------------|------------------------------------------------|
//! | `CLOSED` (0)            | closed                                         |
//! | `until << 2 \| OPEN`     | open until `until`; half-open from then on    |
//! | `start << 2 \| PROBING`  | half-open, the probe that took the slot at `start` is out |
//! | `CLOSING`               | half-open, a successful probe is closing it    |
//! | `start << 2 \| FREE`     | half-open, the slot is free again (`start`: the last probe's) |
//!
//! An open breaker whose time has come is half-open without any write: the
//! first request after it takes the probe slot by swapping `OPEN` (or
//! `FREE`) for `PROBING` in one compare-and-swap, so among any number of
//! racing requests exactly one wins it. The `PROBING` word it wrote is the
//! probe's token: every move away from it is a compare-and-swap from that
//! word, so exactly one move leaves each probe's word, whoever makes it:
//!
//! - the probe, when it completes (to `OPEN` if it failed, to `CLOSING`
//!   then `CLOSED` if it succeeded) or is dropped or refused by a flow rule
//!   (to `FREE`);
//! - any other request that finds the probe overdue (see
//!   [`Breaker::probe_deadline_ms`]): to `OPEN`, as for a failed probe.
//!
//! A probe whose swap fails was overdue and lost its slot: its completion
//! is an ordinary one (counted, deciding nothing while the breaker is not
//! closed), so a late probe never closes or reopens a breaker that has
//! moved on. Probe starts are made strictly increasing (a new probe starts
//! after the last one's start and after the open time it follows), so a
//! token is not handed out twice unless the clock steps back by more than
//! that; even then every probe word is left by exactly one move.
//!
//! A successful probe swaps its word for `CLOSING`, which only it can
//! leave: it writes the fresh statistics (the single writer of `Fresh`),
//! then stores `CLOSED`. `CLOSED` becomes `OPEN` by compare-and-swap, so of
//! several completions that find the threshold exceeded at once, one opens
//! the breaker (and logs it).
//!
//! Statistics are counted one of two ways.
//!
//! - **On the key's statistics** (a breaker of the layer whose
//!   `stat_interval` is the layer's window interval, the default): the key's
//!   window already counts every completion (`success`) and every failure
//!   (`exception`), bucket by bucket. The breaker reads them when a bad
//!   completion comes in, and counts nothing for a good one. Its own window
//!   has the same buckets and holds only what the key's window does not: a
//!   completion whose handler panicked (`success`; the key counts it as an
//!   exception only) and, for `slow_ratio`, the slow completions
//!   (`exception`). Fresh statistics after a successful probe are a start:
//!   buckets older than the bucket of the close are left out, and that
//!   bucket counts from the close on (its counts then are kept as a
//!   baseline and subtracted).
//! - **Its own** (any other `stat_interval`, and a breaker built with
//!   [`CircuitBreaker::new`]): a one-bucket window of `stat_interval`, as
//!   Sentinel's degrade rules count. Every completion adds one to the
//!   bucket's `success` count, and one to its `exception` count when it
//!   counts against the breaker. Closing after a successful probe resets the
//!   bucket.
//!
//! Either way, a completion racing with a close may be counted on either
//! side of it, which moves the next opening by that one completion.

use std::time::Duration;

use super::rule::{Breaker, Measure};
use super::state::BreakerState;
use crate::stat::{BucketLeapArray, MetricBucket, StatisticNode};
use crate::sync::{fence, AtomicU64, Ordering};

const TAG_BITS: u32 = 2;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const PROBING: u64 = 2;
const FREE: u64 = 3;
/// The largest time a word holds.
const MAX_TIME: u64 = u64::MAX >> TAG_BITS;
/// A successful probe closing the breaker: `PROBING` with a start no probe
/// has (it is never overdue), left only by that probe.
const CLOSING: u64 = (MAX_TIME << TAG_BITS) | PROBING;

/// The word of a breaker open until `until_ms`.
fn open_until(until_ms: u64) -> u64 {
    (until_ms.min(MAX_TIME) << TAG_BITS) | OPEN
}

/// The word of a probe that took the slot at `start_ms` (below `CLOSING`'s).
fn probing_since(start_ms: u64) -> u64 {
    (start_ms.min(MAX_TIME - 1) << TAG_BITS) | PROBING
}

/// One circuit breaker: the state machine of the [module docs](crate::breaker)
/// with its own statistics, independent of HTTP and of the clock (every
/// call is given the time, in milliseconds).
///
/// The layer keeps one per key and breaker setting; it is public for code
/// that guards something other than a tower service.
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::breaker::{Breaker, BreakerState, CircuitBreaker};
///
/// let breaker = CircuitBreaker::new(
///     Breaker::error_count(1).min_requests(1).open_for(Duration::from_secs(5)),
/// );
/// for _ in 0..2 {
///     let permit = breaker.try_pass(0).expect("closed");
///     permit.complete(10, Duration::from_millis(10), true);
/// }
/// assert!(matches!(breaker.state(10), BreakerState::Open { .. }));
/// assert_eq!(breaker.try_pass(10).err(), Some(Duration::from_millis(5_000)));
///
/// // Half-open after five seconds: one probe, which decides.
/// let probe = breaker.try_pass(5_010).expect("the probe");
/// assert!(probe.is_probe());
/// assert!(breaker.try_pass(5_010).is_err(), "one probe at a time");
/// probe.complete(5_020, Duration::from_millis(10), false);
/// assert_eq!(breaker.state(5_020), BreakerState::Closed);
/// ```
#[derive(Debug)]
pub struct CircuitBreaker {
    rule: Breaker,
    /// The state word (see the module's implementation details).
    state: AtomicU64,
    /// The breaker's own counts (see the module's implementation details):
    /// every completion and the bad ones when it counts on its own; only
    /// what the key's window does not count when it counts on the key's.
    window: BucketLeapArray,
    /// `Some` when it counts on the key's statistics.
    fresh: Option<Fresh>,
}

/// Where a breaker counting on its key's statistics starts counting: the
/// bucket of its last close, and that bucket's counts at the close.
///
/// A sequence lock with one writer: only the request holding the probe
/// writes, before it stores `CLOSED`. It marks `from` as being written,
/// writes the baseline, then the new start; a reader that finds the mark,
/// or a start that changed while it read the baseline, gets nothing (the
/// completion it serves decides nothing), so a start is never read with
/// another start's baseline.
#[derive(Debug)]
struct Fresh {
    /// Start of the bucket of the last close (0: never closed after a
    /// probe, every bucket counts), or [`WRITING`].
    from: AtomicU64,
    /// The key's `success` (low half) and `exception` (high half) counts of
    /// that bucket at the close, each capped at `u32::MAX`.
    baseline: AtomicU64,
}

/// `Fresh::from` while a close writes a new start.
const WRITING: u64 = u64::MAX;

impl Fresh {
    fn new() -> Self {
        Fresh {
            from: AtomicU64::new(0),
            baseline: AtomicU64::new(0),
        }
    }

    /// Counting starts at the bucket starting at `from`, whose counts
    /// `success` and `exception` so far are left out. Only the request
    /// holding the probe calls it.
    fn start_at(&self, from: u64, success: u64, exception: u64) {
        self.from.store(WRITING, Ordering::Relaxed);
        // Release fence: a reader whose baseline load sees the store below
        // sees the mark above on its second load of `from` (or later).
        fence(Ordering::Release);
        self.baseline
            .store(pack(success, exception), Ordering::Relaxed);
        // Release: whoever reads this start reads the baseline above.
        self.from.store(from, Ordering::Release);
    }

    /// The start and its baseline, `(from, success, exception)`; `None`
    /// while a close writes them.
    fn read(&self) -> Option<(u64, u64, u64)> {
        let from = self.from.load(Ordering::Acquire);
        let baseline = self.baseline.load(Ordering::Relaxed);
        // Acquire fence: pairs with the writer's release fence, so a
        // baseline from a newer close shows its mark (or start) below.
        fence(Ordering::Acquire);
        if from == WRITING || self.from.load(Ordering::Relaxed) != from {
            return None;
        }
        let (success, exception) = unpack(baseline);
        Some((from, success, exception))
    }
}

/// A completion, as the layer reports it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Completion {
    /// When it completed, in milliseconds.
    pub(crate) now: u64,
    /// How long it took, in microseconds.
    pub(crate) rt_us: u64,
    /// Whether it failed (the classifier's verdict, or a panic).
    pub(crate) failed: bool,
    /// Whether the handler panicked: the key's statistics then count an
    /// exception but no success.
    pub(crate) panicked: bool,
}

/// The probe slot of one breaker, as a request holds it: the `PROBING` word
/// it wrote when it took the slot (see the implementation details).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProbeToken(u64);

/// What a probe's completion found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decided {
    /// It succeeded and holds `CLOSING`: the caller closes the breaker.
    Closing,
    /// It failed: the breaker is open again.
    Failed,
    /// It had lost the slot (failed as overdue by another request): it
    /// decides nothing.
    Lost,
}

/// How a completion moved its breaker: out of the closed state (exactly one
/// completion reports each opening of a closed breaker), back into it
/// (the probe's), or neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Moved {
    No,
    Opened,
    Closed,
}

impl Completion {
    /// A completion whose handler did not panic.
    pub(crate) fn finished(now: u64, rt_us: u64, failed: bool) -> Self {
        Completion {
            now,
            rt_us,
            failed,
            panicked: false,
        }
    }
}

fn pack(success: u64, exception: u64) -> u64 {
    let half = |n: u64| n.min(u64::from(u32::MAX));
    half(success) | half(exception) << 32
}

fn unpack(word: u64) -> (u64, u64) {
    (word & u64::from(u32::MAX), word >> 32)
}

impl CircuitBreaker {
    /// A closed breaker with the settings of `rule`, counting completions
    /// in its own window.
    pub fn new(rule: Breaker) -> Self {
        CircuitBreaker {
            rule,
            state: AtomicU64::new(CLOSED),
            window: BucketLeapArray::new(1, rule.stat_interval_ms)
                .expect("one bucket over an interval checked by `Breaker`"),
            fresh: None,
        }
    }

    /// A closed breaker for a key whose statistics window has
    /// `sample_count` buckets over `interval_ms`: it counts on them when
    /// `rule`'s stat interval is that interval, else on its own.
    pub(crate) fn on_key(rule: Breaker, sample_count: usize, interval_ms: u64) -> Self {
        if rule.stat_interval_ms != interval_ms {
            return Self::new(rule);
        }
        CircuitBreaker {
            rule,
            state: AtomicU64::new(CLOSED),
            window: BucketLeapArray::new(sample_count, interval_ms)
                .expect("the key's window shape, validated by the layer"),
            fresh: Some(Fresh::new()),
        }
    }

    /// The breaker's settings.
    pub fn rule(&self) -> &Breaker {
        &self.rule
    }

    /// Whether it counts every completion in its own window (rather than
    /// on the key's statistics).
    pub(crate) fn counts_every_completion(&self) -> bool {
        self.fresh.is_none()
    }

    /// Asks to let one request through at `now_ms`. `Ok` carries the permit
    /// to [complete](Permit::complete) when the request completes (dropping
    /// it instead means the request was cancelled: it counts for nothing
    /// and, if it was the probe, frees the probe slot). `Err` carries how
    /// long until the breaker turns half-open (zero while it is half-open
    /// with the probe out). A request that finds the probe overdue (see
    /// [`Breaker::open_for`]) fails it: the breaker is open again, and the
    /// request gets `Err` with the new open time.
    pub fn try_pass(&self, now_ms: u64) -> Result<Permit<'_>, Duration> {
        match self.enter(now_ms) {
            Ok(probe) => Ok(Permit {
                breaker: self,
                probe: probe.map(|token| token.0),
            }),
            Err(wait_ms) => Err(Duration::from_millis(wait_ms)),
        }
    }

    /// The state at `now_ms`.
    pub fn state(&self, now_ms: u64) -> BreakerState {
        let word = self.state.load(Ordering::Acquire);
        match word & TAG_MASK {
            CLOSED => BreakerState::Closed,
            OPEN if now_ms < word >> TAG_BITS => BreakerState::Open {
                half_open_in: Duration::from_millis((word >> TAG_BITS) - now_ms),
            },
            _ => BreakerState::HalfOpen,
        }
    }

    /// Whether the breaker is closed (nothing to keep for it but counts).
    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.state.load(Ordering::Acquire) == CLOSED
    }

    /// Whether the breaker holds nothing a request at `now` would not
    /// rebuild: closed, or half-open with its probe slot free (open with
    /// its open time over, or a probe gone). A new breaker in its place
    /// would let the next request through, as the probe this one would let
    /// through. A probe out is not idle (its request holds the key anyway).
    pub(crate) fn is_idle_at(&self, now: u64) -> bool {
        let word = self.state.load(Ordering::Acquire);
        match word & TAG_MASK {
            CLOSED | FREE => true,
            OPEN => now >= word >> TAG_BITS,
            _ => false,
        }
    }

    /// Lets a request through at `now`: `Ok(Some(token))` when it is the
    /// probe, `Ok(None)` when the breaker is closed, `Err(ms until
    /// half-open)` otherwise (0 while the probe is out). A request that
    /// finds the probe overdue fails it (see
    /// [`Breaker::probe_deadline_ms`]): the breaker is open again, and the
    /// request is refused for `open_for`.
    #[inline]
    pub(crate) fn enter(&self, now: u64) -> Result<Option<ProbeToken>, u64> {
        // Acquire: pairs with the release of the store or swap that wrote
        // the word, so a request let through after a close sees the reset
        // statistics.
        let mut word = self.state.load(Ordering::Acquire);
        loop {
            let tag = word & TAG_MASK;
            let time = word >> TAG_BITS;
            let next = match tag {
                CLOSED => return Ok(None),
                OPEN if now < time => return Err(time - now),
                PROBING if word == CLOSING || !self.overdue(time, now) => return Err(0),
                // An overdue probe failed: open again, as its completion
                // would have. Its late completion finds the word moved on.
                PROBING => open_until(self.reopen_at(now, time)),
                // OPEN whose time has come (every earlier probe started
                // before it), or FREE (after the last probe's start): the
                // probe slot, with a start later than any earlier probe's.
                OPEN => probing_since(now),
                _ => probing_since(now.max(time.saturating_add(1))),
            };
            // One compare-and-swap, so exactly one racing request takes the
            // slot, or fails the overdue probe.
            match self
                .state
                .compare_exchange(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if tag == PROBING => {
                    self.log_transition("half_open", "open");
                    return Err(self.reopen_at(now, time) - now);
                }
                Ok(_) => {
                    if tag == OPEN {
                        self.log_transition("open", "half_open");
                    }
                    return Ok(Some(ProbeToken(next)));
                }
                Err(current) => word = current,
            }
        }
    }

    /// Until when a probe that took the slot at `start` and failed at `now`
    /// opens the breaker again: `open_for` from the later of the two, so
    /// the next probe starts after this one.
    fn reopen_at(&self, now: u64, start: u64) -> u64 {
        now.max(start)
            .saturating_add(self.rule.open_for_ms)
            .min(MAX_TIME)
    }

    /// Whether a probe that took the slot at `start` is overdue at `now`:
    /// known to be slower than `max_rt` (a `slow_ratio` breaker), or out
    /// for longer than [`Breaker::probe_deadline_ms`].
    fn overdue(&self, start: u64, now: u64) -> bool {
        let elapsed = now.saturating_sub(start);
        if elapsed >= self.rule.probe_deadline_ms() {
            return true;
        }
        match self.rule.measure {
            // Times are whole milliseconds: the probe started within the
            // millisecond `start` and it is at least `now`, so it has run
            // for more than `elapsed - 1` ms.
            Measure::SlowRatio { max_rt_us, .. } => {
                elapsed.saturating_sub(1).saturating_mul(1_000) >= max_rt_us
            }
            Measure::ErrorRatio { .. } | Measure::ErrorCount { .. } => false,
        }
    }

    /// Records `done`; `probe`: the request took the probe slot, and
    /// decides if it still holds it (an overdue probe that another request
    /// failed completes as an ordinary request). `key`: the statistics of
    /// the key the breaker guards, which have already recorded `done`
    /// (`None` outside the layer). Says whether the breaker left or
    /// re-entered the closed state.
    #[inline]
    pub(crate) fn complete(
        &self,
        done: Completion,
        probe: Option<ProbeToken>,
        key: Option<&StatisticNode>,
    ) -> Moved {
        match (&self.fresh, key) {
            (Some(fresh), Some(node)) => self.complete_on_key(done, probe, fresh, node),
            _ => self.complete_on_own(done, probe),
        }
    }

    /// [`complete`](Self::complete) counting on the breaker's own window.
    fn complete_on_own(&self, done: Completion, probe: Option<ProbeToken>) -> Moved {
        let Completion {
            now, rt_us, failed, ..
        } = done;
        if let Some(token) = probe {
            match self.decide(token, now, rt_us, failed) {
                Decided::Lost => {}
                Decided::Failed => return Moved::No,
                Decided::Closing => {
                    self.window.current_window(now).value().reset();
                    return self.close();
                }
            }
        }
        let bad = self.rule.is_bad(rt_us, failed);
        let bucket: &MetricBucket = self.window.current_window(now).value();
        bucket.add_success(1);
        if bad {
            bucket.add_exception(1);
        }
        // Only a closed breaker opens on its counts; completions of requests
        // let through before it opened count but decide nothing meanwhile.
        if self.is_closed() && self.rule.exceeded(bucket.success(), bucket.exception()) {
            return self.open_from_closed(now);
        }
        Moved::No
    }

    /// [`complete`](Self::complete) counting on the key's statistics: a
    /// good completion of a request that did not panic costs nothing.
    #[inline]
    fn complete_on_key(
        &self,
        done: Completion,
        probe: Option<ProbeToken>,
        fresh: &Fresh,
        node: &StatisticNode,
    ) -> Moved {
        let Completion {
            now,
            rt_us,
            failed,
            panicked,
        } = done;
        if let Some(token) = probe {
            match self.decide(token, now, rt_us, failed) {
                Decided::Lost => {}
                Decided::Failed => return Moved::No,
                Decided::Closing => {
                    self.restart_on_key(now, fresh, node);
                    return self.close();
                }
            }
        }
        let bad = self.rule.is_bad(rt_us, failed);
        if !bad && !panicked {
            return Moved::No;
        }
        let slow = bad && matches!(self.rule.measure, Measure::SlowRatio { .. });
        if panicked || slow {
            let own: &MetricBucket = self.window.current_window(now).value();
            if panicked {
                // The key counted an exception but no completion.
                own.add_success(1);
            }
            if slow {
                // The key does not count slow completions.
                own.add_exception(1);
            }
        }
        if !bad || !self.is_closed() {
            return Moved::No;
        }
        let (total, bad) = self.counts_on_key(now, fresh, node);
        if self.rule.exceeded(total, bad) {
            return self.open_from_closed(now);
        }
        Moved::No
    }

    /// Completions and bad ones since the last close, within the window at
    /// `now`, from the key's counts and the breaker's own.
    fn counts_on_key(&self, now: u64, fresh: &Fresh, node: &StatisticNode) -> (u64, u64) {
        // A clock reading behind the key's newest bucket reads the window
        // the completion was recorded in.
        let now = node.effective_now(now);
        let Some((from, base_success, base_exception)) = fresh.read() else {
            // A close is writing a fresh start: this completion decides
            // nothing (it is counted for the next one).
            return (0, 0);
        };
        let (mut total, mut failed, mut slow) = (0u64, 0u64, 0u64);
        for (start, success, exception) in node.window_completions(now) {
            let (success, exception) = match start.cmp(&from) {
                std::cmp::Ordering::Less => continue,
                std::cmp::Ordering::Equal => (
                    success.saturating_sub(base_success),
                    exception.saturating_sub(base_exception),
                ),
                std::cmp::Ordering::Greater => (success, exception),
            };
            total = total.saturating_add(success);
            failed = failed.saturating_add(exception);
        }
        for (start, own) in self.window.values_with_start(now) {
            if start >= from {
                total = total.saturating_add(own.success());
                slow = slow.saturating_add(own.exception());
            }
        }
        match self.rule.measure {
            Measure::SlowRatio { .. } => (total, slow),
            Measure::ErrorRatio { .. } | Measure::ErrorCount { .. } => (total, failed),
        }
    }

    /// Fresh statistics from `now` on, for a breaker counting on the key's:
    /// the bucket of `now` becomes the first that counts, with its counts
    /// so far as the baseline, and the breaker's own bucket is reset.
    fn restart_on_key(&self, now: u64, fresh: &Fresh, node: &StatisticNode) {
        let now = node.effective_now(now);
        let from = self.window.start_of(now);
        let (success, exception) = node
            .window_completions(now)
            .find(|(start, ..)| *start == from)
            .map_or((0, 0), |(_, success, exception)| (success, exception));
        fresh.start_at(from, success, exception);
        self.window.current_window(now).value().reset();
    }

    /// Opens a closed breaker at `now` for `open_for`: one compare-and-swap,
    /// so of several completions that find the threshold exceeded at once,
    /// one opens it (and logs it, and says so).
    fn open_from_closed(&self, now: u64) -> Moved {
        let until = now.saturating_add(self.rule.open_for_ms);
        if self
            .state
            .compare_exchange(
                CLOSED,
                open_until(until),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            self.log_transition("closed", "open");
            return Moved::Opened;
        }
        Moved::No
    }

    /// The completion of the probe holding `token` decides, if the slot is
    /// still its own: [`Decided::Closing`] when it succeeded (the caller
    /// makes the statistics fresh, then [`close`](Self::close)s), else the
    /// breaker is open again for `open_for` from the later of `now` and
    /// the probe's start. [`Decided::Lost`]: another request failed the
    /// probe as overdue, and the breaker has moved on without it.
    fn decide(&self, token: ProbeToken, now: u64, rt_us: u64, failed: bool) -> Decided {
        let (next, decided) = if self.rule.probe_succeeded(rt_us, failed) {
            (CLOSING, Decided::Closing)
        } else {
            let until = self.reopen_at(now, token.0 >> TAG_BITS);
            (open_until(until), Decided::Failed)
        };
        // AcqRel: CLOSING is left only by this probe, which then writes the
        // fresh statistics; a failed swap reads the move that beat it.
        if self
            .state
            .compare_exchange(token.0, next, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Decided::Lost;
        }
        if decided == Decided::Failed {
            self.log_transition("half_open", "open");
        }
        decided
    }

    /// Closes the breaker after a successful probe, which holds `CLOSING`.
    fn close(&self) -> Moved {
        // Release: the fresh statistics are visible to whoever sees CLOSED.
        // A plain store: nobody else moves the word away from CLOSING.
        self.state.store(CLOSED, Ordering::Release);
        self.log_transition("half_open", "closed");
        Moved::Closed
    }

    /// Frees the probe slot of a probe that was dropped or refused: the
    /// breaker stays half-open and the next request may probe. Nothing
    /// when the probe was overdue and another request failed it already.
    pub(crate) fn release_probe(&self, token: ProbeToken) {
        let start = token.0 >> TAG_BITS;
        let _ = self.state.compare_exchange(
            token.0,
            (start << TAG_BITS) | FREE,
            Ordering::Release,
            Ordering::Relaxed,
        );
    }

    /// One event per transition (never per request), without the key.
    fn log_transition(&self, from: &'static str, to: &'static str) {
        if to == "open" {
            tracing::warn!(
                breaker = self.rule.kind(),
                from,
                to,
                open_for_ms = self.rule.open_for_ms,
                "circuit breaker opened"
            );
        } else {
            tracing::info!(breaker = self.rule.kind(), from, to, "circuit breaker {to}");
        }
    }
}

/// Leave for one request to go through a [`CircuitBreaker`], from
/// [`CircuitBreaker::try_pass`].
///
/// [`complete`](Self::complete) it when the request completes. Dropping it
/// uncompleted counts the request for nothing, and frees the probe slot if
/// it held it.
#[derive(Debug)]
#[must_use = "a permit records the request's completion; dropping it counts nothing"]
pub struct Permit<'a> {
    breaker: &'a CircuitBreaker,
    /// The probe's token (`ProbeToken`), when it is the probe.
    probe: Option<u64>,
}

impl Permit<'_> {
    /// Whether this request is the half-open breaker's probe.
    pub fn is_probe(&self) -> bool {
        self.probe.is_some()
    }

    /// Records the request's completion at `now_ms`: it took `rt` and
    /// `failed` or not. A probe decides the breaker's state, unless another
    /// request found it overdue and failed it meanwhile: it then counts as
    /// an ordinary completion.
    pub fn complete(mut self, now_ms: u64, rt: Duration, failed: bool) {
        let rt_us = u64::try_from(rt.as_micros()).unwrap_or(u64::MAX);
        let done = Completion::finished(now_ms, rt_us, failed);
        let probe = self.probe.take().map(ProbeToken);
        let _ = self.breaker.complete(done, probe, None);
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if let Some(token) = self.probe {
            self.breaker.release_probe(ProbeToken(token));
        }
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// A close moves the start of fresh statistics while a completion reads
    /// it: a reader that sees the new start sees its baseline, never the
    /// old one (which would count the close's bucket from its beginning).
    #[test]
    fn a_fresh_start_is_read_with_its_baseline() {
        loom::model(|| {
            let fresh = Arc::new(Fresh::new());
            fresh.start_at(500, 4, 3);
            let closer = {
                let fresh = Arc::clone(&fresh);
                thread::spawn(move || fresh.start_at(1_500, 9, 2))
            };
            match fresh.read() {
                None | Some((500, 4, 3)) | Some((1_500, 9, 2)) => {}
                Some(torn) => panic!("a start read with another's baseline: {torn:?}"),
            }
            closer.join().unwrap();
            assert_eq!(fresh.read(), Some((1_500, 9, 2)));
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, SharedClock};

    fn tripped(rule: Breaker) -> CircuitBreaker {
        let breaker = CircuitBreaker::new(rule.min_requests(1));
        for _ in 0..3 {
            let _ = breaker.complete(Completion::finished(0, 0, true), None, None);
        }
        breaker
    }

    #[test]
    fn a_released_probe_frees_the_slot() {
        let breaker = tripped(Breaker::error_count(1).open_for(Duration::from_millis(100)));
        assert_eq!(breaker.enter(50), Err(50));
        let token = breaker.enter(100).unwrap().expect("the probe");
        assert_eq!(breaker.enter(100), Err(0));
        breaker.release_probe(token);
        assert_eq!(breaker.state(100), BreakerState::HalfOpen);
        assert!(breaker.enter(101).unwrap().is_some());
    }

    #[test]
    fn a_probe_that_lost_its_slot_frees_and_decides_nothing() {
        // Deadline: max(stat_interval 1 s, open_for 100 ms).
        let breaker = tripped(Breaker::error_count(1).open_for(Duration::from_millis(100)));
        let stale = breaker.enter(100).unwrap().expect("the probe");
        assert_eq!(breaker.enter(1_099), Err(0), "not overdue yet");
        assert_eq!(breaker.enter(1_100), Err(100), "overdue: open again");
        let probe = breaker.enter(1_200).unwrap().expect("the next probe");
        assert_ne!(stale, probe);
        // The old probe is dropped, then completes: neither frees nor
        // decides the new probe's slot.
        breaker.release_probe(stale);
        assert_eq!(breaker.enter(1_200), Err(0), "one probe out");
        let late = Completion::finished(1_250, 0, false);
        assert_eq!(breaker.complete(late, Some(stale), None), Moved::No);
        assert_eq!(breaker.state(1_250), BreakerState::HalfOpen);
        let done = Completion::finished(1_260, 0, false);
        assert_eq!(breaker.complete(done, Some(probe), None), Moved::Closed);
        assert_eq!(breaker.state(1_260), BreakerState::Closed);
    }

    #[test]
    fn probes_within_one_millisecond_get_distinct_tokens() {
        let breaker = tripped(Breaker::error_count(1).open_for(Duration::from_millis(100)));
        let first = breaker.enter(100).unwrap().expect("the probe");
        breaker.release_probe(first);
        let second = breaker.enter(100).unwrap().expect("the slot is free");
        assert_ne!(first, second);
        // The first's token no longer frees anything.
        breaker.release_probe(first);
        assert_eq!(breaker.enter(100), Err(0));
    }

    #[test]
    fn a_slow_ratio_probe_is_overdue_once_known_slower_than_max_rt() {
        let rule = Breaker::slow_ratio(Duration::from_millis(20), 0.5)
            .min_requests(1)
            .open_for(Duration::from_millis(500));
        let breaker = CircuitBreaker::new(rule);
        let slow = Completion::finished(0, 30_000, false);
        assert_eq!(breaker.complete(slow, None, None), Moved::Opened);
        let _probe = breaker.enter(500).unwrap().expect("the probe");
        // At 520 it may have run 19.x ms; at 521, more than 20 ms.
        assert_eq!(breaker.enter(520), Err(0));
        assert_eq!(breaker.enter(521), Err(500));
        assert!(breaker.is_idle_at(1_021), "open time over, slot free");
        assert!(!breaker.is_idle_at(1_020));
    }

    #[test]
    fn a_failed_probe_opens_again_from_its_completion() {
        let breaker = tripped(Breaker::error_count(1).open_for(Duration::from_millis(100)));
        let probe = breaker.enter(200).unwrap();
        let _ = breaker.complete(Completion::finished(250, 0, true), probe, None);
        assert_eq!(
            breaker.state(250),
            BreakerState::Open {
                half_open_in: Duration::from_millis(100)
            }
        );
    }

    #[test]
    fn completions_while_open_decide_nothing() {
        let breaker = tripped(Breaker::error_count(1).open_for(Duration::from_millis(100)));
        let _ = breaker.complete(Completion::finished(10, 0, false), None, None);
        assert!(matches!(breaker.state(10), BreakerState::Open { .. }));
    }

    /// A key's statistics (2 buckets over 1 s, as a `qps` layer's) and a
    /// breaker counting on them; `complete` records as the layer does: the
    /// key first, then the breaker.
    struct OnKey {
        node: StatisticNode,
        breaker: CircuitBreaker,
    }

    impl OnKey {
        fn new(rule: Breaker) -> Self {
            let clock = SharedClock::new(ManualClock::new(0));
            let node = StatisticNode::build(clock, 2, 1_000, false).unwrap();
            let breaker = CircuitBreaker::on_key(rule, 2, 1_000);
            assert!(breaker.fresh.is_some(), "counts on the key");
            OnKey { node, breaker }
        }

        fn complete(&self, now: u64, rt_us: u64, failed: bool, probe: Option<ProbeToken>) {
            let rt = Duration::from_micros(rt_us);
            self.node.record_completion_at(now, rt, failed);
            let _ = self.breaker.complete(
                Completion::finished(now, rt_us, failed),
                probe,
                Some(&self.node),
            );
        }

        fn panicked(&self, now: u64) {
            self.node.increase_exception_qps(1);
            let done = Completion {
                panicked: true,
                ..Completion::finished(now, 0, true)
            };
            let _ = self.breaker.complete(done, None, Some(&self.node));
        }

        /// Buckets the breaker's own window holds at `now`.
        fn own_buckets(&self, now: u64) -> usize {
            self.breaker.window.values(now).count()
        }
    }

    #[test]
    fn another_stat_interval_counts_on_its_own() {
        let rule = Breaker::error_count(1).stat_interval(Duration::from_secs(10));
        let breaker = CircuitBreaker::on_key(rule, 2, 1_000);
        assert!(breaker.fresh.is_none());
        assert_eq!(breaker.window.sample_count(), 1);
        assert_eq!(breaker.window.interval_ms(), 10_000);
    }

    #[test]
    fn good_completions_on_the_key_touch_nothing_of_the_breaker() {
        let key = OnKey::new(Breaker::error_ratio(0.5));
        for now in 0..1_000 {
            key.complete(now, 10, false, None);
        }
        assert_eq!(key.own_buckets(999), 0, "nothing counted twice");
        assert_eq!(key.breaker.state(999), BreakerState::Closed);
    }

    #[test]
    fn an_error_ratio_on_the_key_reads_its_completions_and_failures() {
        let key = OnKey::new(Breaker::error_ratio(0.5).min_requests(4));
        // 3 good completions, then 3 failures: 3 of 6 is not over half.
        for _ in 0..3 {
            key.complete(100, 10, false, None);
        }
        for _ in 0..3 {
            key.complete(600, 10, true, None);
        }
        assert_eq!(key.breaker.state(600), BreakerState::Closed);
        assert_eq!(key.own_buckets(600), 0, "failures are the key's to count");
        // A 4th: 4 of 7.
        key.complete(700, 10, true, None);
        assert!(matches!(key.breaker.state(700), BreakerState::Open { .. }));
    }

    #[test]
    fn a_sliding_window_forgets_what_left_it() {
        let key = OnKey::new(Breaker::error_count(2).min_requests(1));
        key.complete(0, 0, true, None);
        key.complete(400, 0, true, None);
        // At 1 000 the bucket [0, 500) has left the window: one failure,
        // not three.
        key.complete(1_000, 0, true, None);
        assert_eq!(key.breaker.state(1_000), BreakerState::Closed);
        key.complete(1_100, 0, true, None);
        assert_eq!(key.breaker.state(1_100), BreakerState::Closed);
        key.complete(1_200, 0, true, None);
        assert!(matches!(
            key.breaker.state(1_200),
            BreakerState::Open { .. }
        ));
    }

    #[test]
    fn slow_completions_are_counted_by_the_breaker_only() {
        let key = OnKey::new(Breaker::slow_ratio(Duration::from_millis(100), 0.5).min_requests(4));
        for _ in 0..4 {
            key.complete(0, 10_000, false, None);
        }
        // Two slow of six: under half; only the slow ones were counted.
        for _ in 0..2 {
            key.complete(10, 100_001, false, None);
        }
        assert_eq!(key.breaker.state(10), BreakerState::Closed);
        let own: u64 = key
            .breaker
            .window
            .values(10)
            .map(MetricBucket::exception)
            .sum();
        assert_eq!(own, 2);
        // Failures that are fast are not slow.
        for _ in 0..4 {
            key.complete(10, 10, true, None);
        }
        assert_eq!(key.breaker.state(10), BreakerState::Closed);
        for _ in 0..5 {
            key.complete(20, 200_000, false, None);
        }
        // 7 slow of 15.
        assert_eq!(key.breaker.state(20), BreakerState::Closed);
        key.complete(20, 200_000, false, None);
        // 8 of 16 is not over half; a 9th of 17 is.
        assert_eq!(key.breaker.state(20), BreakerState::Closed);
        key.complete(20, 200_000, false, None);
        assert!(matches!(key.breaker.state(20), BreakerState::Open { .. }));
    }

    #[test]
    fn panics_count_as_failed_completions() {
        let key = OnKey::new(Breaker::error_count(2).min_requests(3));
        key.panicked(0);
        key.panicked(0);
        assert_eq!(key.breaker.state(0), BreakerState::Closed);
        key.panicked(0);
        assert!(matches!(key.breaker.state(0), BreakerState::Open { .. }));
    }

    #[test]
    fn a_close_on_the_key_starts_fresh_statistics() {
        let rule = Breaker::error_count(2)
            .min_requests(1)
            .open_for(Duration::from_millis(100));
        let key = OnKey::new(rule);
        for _ in 0..3 {
            key.complete(0, 0, true, None);
        }
        assert!(matches!(key.breaker.state(0), BreakerState::Open { .. }));
        // Half-open at 100, in the bucket that still holds the three
        // failures; the probe succeeds.
        let probe = key.breaker.enter(150).unwrap();
        assert!(probe.is_some());
        key.complete(150, 0, false, probe);
        assert_eq!(key.breaker.state(150), BreakerState::Closed);
        // Two failures after the close are two, not five.
        key.complete(200, 0, true, None);
        key.complete(300, 0, true, None);
        assert_eq!(key.breaker.state(300), BreakerState::Closed);
        // A third opens it, from the next bucket on as well.
        key.complete(600, 0, true, None);
        assert!(matches!(key.breaker.state(600), BreakerState::Open { .. }));
    }

    #[test]
    fn a_close_leaves_older_buckets_out() {
        let rule = Breaker::error_count(1)
            .min_requests(1)
            .open_for(Duration::from_millis(400));
        let key = OnKey::new(rule);
        key.complete(400, 0, true, None);
        key.complete(400, 0, true, None);
        assert!(matches!(key.breaker.state(400), BreakerState::Open { .. }));
        // The probe at 800 (bucket [500, 1 000)) succeeds; [0, 500) is
        // still in the window but older than the close.
        let probe = key.breaker.enter(800).unwrap();
        assert!(probe.is_some());
        key.complete(800, 0, false, probe);
        key.complete(900, 0, true, None);
        assert_eq!(key.breaker.state(900), BreakerState::Closed);
        key.complete(900, 0, true, None);
        assert!(matches!(key.breaker.state(900), BreakerState::Open { .. }));
    }

    #[test]
    fn a_close_leaves_older_slow_counts_out() {
        let rule = Breaker::slow_ratio(Duration::from_millis(100), 0.5)
            .min_requests(2)
            .open_for(Duration::from_millis(400));
        let key = OnKey::new(rule);
        key.complete(400, 200_000, false, None);
        key.complete(400, 200_000, false, None);
        assert!(matches!(key.breaker.state(400), BreakerState::Open { .. }));
        let probe = key.breaker.enter(800).unwrap();
        assert!(probe.is_some());
        key.complete(800, 10, false, probe);
        // One fast, one slow after the close: half, not over it. The two
        // slow ones in [0, 500) no longer count.
        key.complete(900, 10, false, None);
        key.complete(900, 200_000, false, None);
        assert_eq!(key.breaker.state(900), BreakerState::Closed);
        key.complete(900, 200_000, false, None);
        assert!(matches!(key.breaker.state(900), BreakerState::Open { .. }));
    }

    #[test]
    fn baselines_are_packed_and_capped() {
        assert_eq!(unpack(pack(3, 7)), (3, 7));
        assert_eq!(
            unpack(pack(u64::MAX, 1 << 40)),
            (u64::from(u32::MAX), u64::from(u32::MAX))
        );
    }
}
