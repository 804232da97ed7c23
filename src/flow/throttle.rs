//! The pacing controller: Sentinel's rate limiter (`RateLimiterController`,
//! later `ThrottlingController`), uniform pacing with a bounded wait.
//!
//! # Implementation details
//!
//! The pacer's main word is the *latest turn*: the time (ns on the
//! limiter's clock) of the last turn handed out, or [`NEVER`]. A caller at `now` asks for the
//! turn `max(latest + cost, now)`, with `cost = ceil(interval / limit)`
//! nanoseconds:
//!
//! - turn `- now <= max_wait`: it swaps `latest` for its turn with one
//!   compare-and-swap (`AcqRel`; a failed swap recomputes from the value it
//!   returned). So every caller's turn is exactly one `cost` after the turn
//!   before it, or `now` after an idle spell: no two callers share a turn,
//!   and none is skipped.
//! - further away: refused, nothing written.
//!
//! Sentinel sets `latest = now` on its fast path with a plain write and adds
//! `cost` on the slow one, so two callers can take one turn
//! (alibaba/Sentinel#3091); sentinel-golang uses a compare-and-swap on the
//! fast path only. Sentinel also needed a nanosecond mode for costs under a
//! millisecond (alibaba/Sentinel#1615); here time is kept in nanoseconds
//! throughout, so 3 000 per second paces at 333 334 ns, not at 333 or 334 µs.
//!
//! **Ending a turn.** Every turn handed out as [`Turn::Wait`] ends with one
//! call: [`Pacer::used`] when its request went ahead, or
//! [`Pacer::give_back`] when it will not (the request was dropped while it
//! waited). A turn given back while it is still the latest is handed to the
//! next caller: `latest` is swapped from the turn back to `turn - cost`. An
//! earlier one cannot be: later callers keep their places (moving them up
//! would rewrite turns already promised), and it stays a hole, which is
//! harmless for the limit: it can only space the passes that happen
//! further apart, never closer.
//!
//! **When the last holder leaves.** Holes would otherwise outlive everyone:
//! 10 000 waiters cancelled oldest first leave `latest` 10 000 turns ahead,
//! and the next caller would wait for turns nobody uses. So the pacer also
//! keeps the latest turn *used* and counts the callers *present* (from
//! `reserve` until their turn ends). A caller that arrives when nobody is
//! present knows that every turn after the latest used one was given back:
//! it takes its turn one `cost` after the latest used turn (or now) instead
//! of after `latest`, exactly as if nobody had queued. This is decided by
//! compare-and-swap too, so the pacer stays lock-free (see `reserve` for the
//! argument that no promised turn is ever overwritten).
//!
//! A caller that never ends its turn (neither `used` nor `give_back`) stays
//! present for good; the pacer then keeps working as above, except that
//! holes are only ever reclaimed from the tail.
//!
//! **A clock that stepped back.** In a sane clock no turn is handed out more
//! than `max_wait` ahead of now, and a used turn is never ahead of now. A
//! caller that arrives with nobody present and finds the latest used turn
//! more than `max_wait` ahead of its clock therefore knows the clock went
//! back: if `latest` is as far ahead, it takes its turn from now, so a key
//! is not frozen for the length of the step; the callers after it are
//! spaced from its turn as usual (the used turns from before the step are
//! not taken as a sign that everything since was given back). What that
//! costs: the passes of at most one `max_wait` before the step are not
//! spaced from the passes after it, and until the clock is back past the
//! old turns, holes are reclaimed from the tail only.

use std::fmt;
use std::time::Duration;

use crate::sync::{AtomicU64, Ordering};

/// `latest` before the first turn.
const NEVER: u64 = u64::MAX;

/// The latest turn any caller can be given: one below [`NEVER`], so that
/// `used` can store `turn + 1` (0: no turn used yet).
const LAST_TURN: u64 = NEVER - 1;

/// One caller present, in [`Pacer::callers`] (the low 32 bits).
const PRESENT: u64 = 1;
/// One caller that arrived, in [`Pacer::callers`] (the high 32 bits).
const ARRIVED: u64 = 1 << 32;
/// The callers present, in [`Pacer::callers`].
const PRESENT_MASK: u64 = ARRIVED - 1;

/// The outcome of [`Pacer::reserve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a turn says whether and when the request may proceed"]
pub enum Turn {
    /// The turn is `wait` from now (zero: go now). It is taken: end it with
    /// [`Pacer::used`] when the request goes ahead, or with
    /// [`Pacer::give_back`] if it will not.
    Wait {
        /// How long until the turn.
        wait: Duration,
        /// The turn, in nanoseconds on the caller's clock (for `used` and
        /// `give_back`).
        at_ns: u64,
    },
    /// The next turn is more than `max_wait` away; nothing was taken (and
    /// nothing needs ending).
    Refuse {
        /// How long until a caller could get a turn within `max_wait`, if no
        /// one else takes one meanwhile.
        retry_after: Duration,
    },
}

/// Uniform pacing for one resource: Sentinel's rate limiter, with turns
/// reserved by compare-and-swap (module docs of `flow::throttle`).
///
/// ```
/// use std::time::Duration;
/// use tower_sliding_window::flow::{Pacer, Turn};
///
/// // 4 per second: a turn every 250 ms; wait at most 600 ms.
/// let pacer = Pacer::new();
/// let cost = Pacer::cost_ns(1000, 4).unwrap();
/// let max_wait = Duration::from_millis(600);
/// let now = 10_000_000_000; // ns
/// let turns: Vec<_> = (0..4)
///     .map(|_| match pacer.reserve(now, cost, max_wait) {
///         Turn::Wait { wait, at_ns } => Some((wait.as_millis(), at_ns)),
///         Turn::Refuse { .. } => None,
///     })
///     .collect();
/// let waits: Vec<_> = turns.iter().map(|t| t.map(|(wait, _)| wait)).collect();
/// assert_eq!(waits, [Some(0), Some(250), Some(500), None]);
///
/// // The first goes now; the other two give their turns back, oldest first
/// // (the middle one is not the latest: a hole for now).
/// let at = |i: usize| turns[i].unwrap().1;
/// pacer.used(at(0));
/// assert!(!pacer.give_back(at(1), cost));
/// assert!(pacer.give_back(at(2), cost));
/// // Nobody holds a turn any more: the next caller is spaced from the one
/// // used turn only, as if nobody had queued.
/// assert!(matches!(
///     pacer.reserve(now, cost, max_wait),
///     Turn::Wait { wait, .. } if wait.as_millis() == 250
/// ));
/// ```
pub struct Pacer {
    /// The latest turn handed out (ns), or `NEVER`. Changed only by
    /// compare-and-swap: raised by `reserve` to a turn at least one `cost`
    /// above it, lowered by `give_back` from a turn still the latest to one
    /// `cost` before it, or moved by a caller that arrived alone to one
    /// `cost` after `used` (see `reserve`).
    latest: AtomicU64,
    /// The latest turn used, plus one (0: none). Only raised (`fetch_max`),
    /// and always before its caller leaves `callers` (Release), so a caller
    /// that arrives after (Acquire on `callers`) sees it.
    used: AtomicU64,
    /// High 32 bits: callers that arrived (wrapping); low 32 bits: callers
    /// present, from `reserve` until their turn ends (a refused or
    /// panicking `reserve` leaves at once). Every change is a
    /// read-modify-write (AcqRel), so the changes form one release
    /// sequence: a caller that arrives sees everything the callers who
    /// left before did. A present count can not reach 2^32: each present
    /// caller holds a request.
    callers: AtomicU64,
}

impl Pacer {
    /// A pacer that has handed out no turn: the first caller goes at once.
    pub fn new() -> Self {
        Pacer {
            latest: AtomicU64::new(NEVER),
            used: AtomicU64::new(0),
            callers: AtomicU64::new(0),
        }
    }

    /// Nanoseconds between turns for `limit` per `interval_ms`, rounded up
    /// (so `limit` turns never fit in less than the interval); `None` when
    /// `limit` is 0 (no turn ever).
    pub fn cost_ns(interval_ms: u64, limit: u64) -> Option<u64> {
        if limit == 0 {
            return None;
        }
        let interval_ns = u128::from(interval_ms) * 1_000_000;
        let cost = interval_ns.div_ceil(u128::from(limit)).max(1);
        Some(u64::try_from(cost).unwrap_or(u64::MAX))
    }

    /// Takes the next turn at `now_ns` if it is at most `max_wait` away
    /// (compare-and-swap; see the module docs). A [`Turn::Wait`] must be
    /// ended with [`used`](Self::used) or [`give_back`](Self::give_back).
    ///
    /// # Why a caller that arrives alone may move `latest` back
    ///
    /// Such a caller (nobody present when it arrived) reads `latest` and
    /// `used`, then checks with a read-modify-write on `callers` that nobody
    /// arrived since, and only then swaps `latest` from the value it read.
    /// Everyone who arrived before it has left: their turns were used (at
    /// most `used`) or given back. Everyone who arrives after the check
    /// changes `latest` only by raising it above its current value or by
    /// lowering it from their own turn to one `cost` before it, so while any
    /// of their turns is held or used, `latest` stays above the value read.
    /// The swap therefore succeeds only when no turn but those up to `used`
    /// is promised, and its turn is one `cost` after `used`.
    pub fn reserve(&self, now_ns: u64, cost_ns: u64, max_wait: Duration) -> Turn {
        let max_wait_ns = u64::try_from(max_wait.as_nanos()).unwrap_or(u64::MAX);
        let turn_after = |base: u64| match base {
            NEVER => now_ns.min(LAST_TURN),
            base => base.saturating_add(cost_ns).max(now_ns).min(LAST_TURN),
        };
        // AcqRel: see what the callers who left did (their turns and
        // `used`), and let later callers see this arrival.
        let arrived = self.callers.fetch_add(ARRIVED + PRESENT, Ordering::AcqRel);
        // Acquire: see the turn the previous caller took.
        let mut latest = self.latest.load(Ordering::Acquire);
        let mut base = latest;
        if arrived & PRESENT_MASK == 0 {
            // Further ahead than any turn handed out now could be: only a
            // clock that went back leaves such a turn.
            let far = |turn: u64| turn != NEVER && turn - now_ns.min(turn) > max_wait_ns;
            let from = match self.used.load(Ordering::Acquire).checked_sub(1) {
                // Nothing used: every turn handed out was given back.
                None => NEVER,
                // The clock went back: what was used since is not known
                // apart from the turns before the step, so `latest` stands,
                // unless it is as far ahead.
                Some(used) if far(used) => {
                    if far(latest) {
                        NEVER
                    } else {
                        latest
                    }
                }
                // Every turn after the latest used one was given back.
                Some(used) if used < latest => used,
                Some(_) => latest,
            };
            let me = arrived.wrapping_add(ARRIVED + PRESENT);
            if turn_after(from) < turn_after(latest)
                && self
                    .callers
                    .compare_exchange(me, me, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                base = from;
            }
        }
        loop {
            let turn = turn_after(base);
            let wait_ns = turn.saturating_sub(now_ns);
            if wait_ns > max_wait_ns {
                self.leave();
                return Turn::Refuse {
                    retry_after: Duration::from_nanos(wait_ns - max_wait_ns),
                };
            }
            match self
                .latest
                .compare_exchange(latest, turn, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Turn::Wait {
                        wait: Duration::from_nanos(wait_ns),
                        at_ns: turn,
                    }
                }
                // Someone else moved `latest`: not alone after all (or
                // never was); the next turn follows theirs.
                Err(actual) => {
                    latest = actual;
                    base = actual;
                }
            }
        }
    }

    /// The latest turn used (ns), if any.
    pub(crate) fn used_ns(&self) -> Option<u64> {
        self.used.load(Ordering::Relaxed).checked_sub(1)
    }

    /// Ends the turn `at_ns`: its request went ahead.
    pub fn used(&self, at_ns: u64) {
        // Before leaving (Release on `callers`): a caller arriving after
        // sees it.
        self.used
            .fetch_max(at_ns.min(LAST_TURN) + 1, Ordering::AcqRel);
        self.leave();
    }

    /// Ends the turn `at_ns` taken with `cost_ns`: it will not be used.
    /// Handed to the next caller if it is still the latest (`true`);
    /// otherwise it stays a hole until every caller holding a turn has left
    /// (module docs).
    pub fn give_back(&self, at_ns: u64, cost_ns: u64) -> bool {
        let previous = at_ns.checked_sub(cost_ns).unwrap_or(NEVER);
        let handed_on = self
            .latest
            .compare_exchange(at_ns, previous, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        self.leave();
        handed_on
    }

    /// A caller's turn ended (or it was refused): it is no longer present.
    fn leave(&self) {
        // Release: what this caller did is seen by the next to arrive. A
        // caller that ends more turns than it took would wrap the count into
        // `arrived`, which only makes later arrivals think they are not
        // alone (the old behaviour, never an early turn).
        self.callers.fetch_sub(PRESENT, Ordering::AcqRel);
    }
}

impl Default for Pacer {
    fn default() -> Self {
        Pacer::new()
    }
}

impl fmt::Debug for Pacer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let latest = self.latest.load(Ordering::Relaxed);
        f.debug_struct("Pacer")
            .field("latest_turn_ns", &(latest != NEVER).then_some(latest))
            .field("latest_used_ns", &self.used_ns())
            .field(
                "present",
                &(self.callers.load(Ordering::Relaxed) & PRESENT_MASK),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn waits(pacer: &Pacer, now: u64, cost: u64, max_wait_ms: u64, n: usize) -> Vec<Option<u64>> {
        (0..n)
            .map(
                |_| match pacer.reserve(now, cost, Duration::from_millis(max_wait_ms)) {
                    Turn::Wait { wait, .. } => Some(u64::try_from(wait.as_nanos()).unwrap()),
                    Turn::Refuse { .. } => None,
                },
            )
            .collect()
    }

    #[test]
    fn spacing_is_interval_over_limit() {
        // Sentinel's example: count 10, 500 ms queue: 100 ms apart, five
        // wait, the rest are refused.
        let pacer = Pacer::new();
        let cost = Pacer::cost_ns(1000, 10).unwrap();
        assert_eq!(cost, 100 * MS);
        let got = waits(&pacer, 5_000 * MS, cost, 500, 8);
        let want = [0, 100, 200, 300, 400, 500].map(|ms| Some(ms * MS));
        assert_eq!(&got[..6], &want);
        assert_eq!(&got[6..], &[None, None]);
    }

    #[test]
    fn an_idle_pacer_starts_at_now_and_time_zero_is_ordinary() {
        let pacer = Pacer::new();
        let cost = Pacer::cost_ns(1000, 2).unwrap();
        assert_eq!(waits(&pacer, 0, cost, 0, 2), [Some(0), None]);
        // Long after: the turn is now again, not a backlog.
        assert_eq!(waits(&pacer, 10_000 * MS, cost, 0, 1), [Some(0)]);
    }

    #[test]
    fn sub_millisecond_spacing_keeps_nanoseconds() {
        // alibaba/Sentinel#1615: 3 000 per second.
        let cost = Pacer::cost_ns(1000, 3000).unwrap();
        assert_eq!(cost, 333_334);
        let pacer = Pacer::new();
        let now = 7_000 * MS;
        // Everything due within 1 ms: turns at 0, 333 334, 666 668, 1 000 002 ns.
        let got = waits(&pacer, now, cost, 1, 4);
        assert_eq!(got, [Some(0), Some(333_334), Some(666_668), None]);
        // A million per second paces at 1 µs, and a billion at 1 ns.
        assert_eq!(Pacer::cost_ns(1000, 1_000_000), Some(1_000));
        assert_eq!(Pacer::cost_ns(1000, 1_000_000_000), Some(1));
        assert_eq!(Pacer::cost_ns(1000, u64::MAX), Some(1));
        assert_eq!(Pacer::cost_ns(1000, 0), None);
    }

    #[test]
    fn a_refusal_says_when_a_turn_would_fit() {
        let pacer = Pacer::new();
        let cost = Pacer::cost_ns(1000, 1).unwrap();
        let now = 3_000 * MS;
        assert!(matches!(
            pacer.reserve(now, cost, Duration::ZERO),
            Turn::Wait { .. }
        ));
        let refused = pacer.reserve(now + 200 * MS, cost, Duration::from_millis(300));
        // Next turn at now + 1000 ms; within 300 ms of it from now + 700 ms.
        assert_eq!(
            refused,
            Turn::Refuse {
                retry_after: Duration::from_millis(500)
            }
        );
    }

    #[test]
    fn the_latest_turn_is_given_back_and_an_earlier_one_stays_unused() {
        let pacer = Pacer::new();
        let cost = Pacer::cost_ns(1000, 10).unwrap();
        let now = 1_000 * MS;
        let turns: Vec<u64> = (0..3)
            .map(|_| match pacer.reserve(now, cost, Duration::from_secs(1)) {
                Turn::Wait { at_ns, .. } => at_ns,
                Turn::Refuse { .. } => unreachable!(),
            })
            .collect();
        // The middle one cannot be given back: the third keeps its place.
        assert!(!pacer.give_back(turns[1], cost));
        // The last one can: the next caller gets that very turn.
        assert!(pacer.give_back(turns[2], cost));
        match pacer.reserve(now, cost, Duration::from_secs(1)) {
            Turn::Wait { at_ns, .. } => assert_eq!(at_ns, turns[2]),
            Turn::Refuse { .. } => unreachable!(),
        }
    }

    fn take(pacer: &Pacer, now: u64, cost: u64, max_wait: Duration) -> u64 {
        match pacer.reserve(now, cost, max_wait) {
            Turn::Wait { at_ns, .. } => at_ns,
            Turn::Refuse { .. } => panic!("no turn within {max_wait:?}"),
        }
    }

    #[test]
    fn a_queue_given_back_oldest_first_leaves_no_hole_behind() {
        // 1000 per second, 10 s of waiting: a turn now, 9 999 queued.
        let pacer = Pacer::new();
        let cost = Pacer::cost_ns(1000, 1000).unwrap();
        let max_wait = Duration::from_secs(10);
        let now = 50_000 * MS;
        let turns: Vec<u64> = (0..10_000)
            .map(|_| take(&pacer, now, cost, max_wait))
            .collect();
        pacer.used(turns[0]);
        for &turn in &turns[1..] {
            pacer.give_back(turn, cost);
        }
        // As if nobody had queued: one cost after the used turn.
        match pacer.reserve(now, cost, max_wait) {
            Turn::Wait { wait, at_ns } => {
                assert_eq!(wait, Duration::from_millis(1));
                assert_eq!(at_ns, turns[0] + cost);
            }
            Turn::Refuse { .. } => panic!("refused"),
        }
    }

    #[test]
    fn a_hole_is_kept_while_a_later_turn_is_held_then_reclaimed() {
        let pacer = Pacer::new();
        let cost = 10 * MS;
        let max_wait = Duration::from_secs(1);
        let now = 1_000 * MS;
        let [a, b, c] = [0; 3].map(|_| take(&pacer, now, cost, max_wait));
        pacer.used(a);
        // `b` leaves a hole: `c` keeps its place, the next is after `c`.
        assert!(!pacer.give_back(b, cost));
        let d = take(&pacer, now, cost, max_wait);
        assert_eq!(d, c + cost);
        // `c` is used, `d` leaves: nobody present, the next follows `c`.
        pacer.used(c);
        assert!(pacer.give_back(d, cost));
        assert_eq!(take(&pacer, now, cost, max_wait), c + cost);
    }

    #[test]
    fn every_turn_given_back_leaves_the_pacer_as_new() {
        let pacer = Pacer::new();
        let cost = 10 * MS;
        let max_wait = Duration::from_secs(1);
        let now = 1_000 * MS;
        let turns = [0; 5].map(|_| take(&pacer, now, cost, max_wait));
        for turn in turns {
            pacer.give_back(turn, cost);
        }
        assert_eq!(take(&pacer, now + 3 * MS, cost, max_wait), now + 3 * MS);
    }

    #[test]
    fn a_turn_never_ended_keeps_the_holes() {
        // Without `used` or `give_back` the caller stays present: holes are
        // only reclaimed from the tail, as before the count existed.
        let pacer = Pacer::new();
        let cost = 10 * MS;
        let max_wait = Duration::from_secs(1);
        let now = 1_000 * MS;
        let [_kept, b, c] = [0; 3].map(|_| take(&pacer, now, cost, max_wait));
        pacer.give_back(b, cost);
        pacer.give_back(c, cost);
        // `c` went back to the next caller; `b` stays a hole.
        assert_eq!(take(&pacer, now, cost, max_wait), c);
    }

    #[test]
    fn a_clock_stepped_back_does_not_freeze_the_pacer() {
        let pacer = Pacer::new();
        let cost = 100 * MS;
        let max_wait = Duration::from_millis(500);
        let now = 7_200_000 * MS;
        for step in 0..3 {
            let turn = take(&pacer, now + step * cost, cost, max_wait);
            pacer.used(turn);
        }
        // An hour back: the used turns lie an hour ahead. Within `max_wait`
        // of them the spacing still holds...
        let back = now - 3_600_000 * MS;
        let near = now + 2 * cost - max_wait.as_nanos() as u64;
        assert!(matches!(
            pacer.reserve(near, cost, max_wait),
            Turn::Refuse { .. }
        ));
        // ...further away the clock went back: a turn now...
        let first = take(&pacer, back, cost, max_wait);
        assert_eq!(first, back);
        pacer.used(first);
        // ...and the spacing holds on the clock's new time: the turns used
        // before the step do not make every caller "first".
        let second = take(&pacer, back, cost, max_wait);
        assert_eq!(second, back + cost);
        pacer.used(second);
        assert_eq!(take(&pacer, back + cost, cost, max_wait), back + 2 * cost);
        // A clock at the end of time saturates at the last turn, without a
        // panic.
        for _ in 0..2 {
            let end = take(&pacer, u64::MAX, cost, max_wait);
            assert_eq!(end, LAST_TURN);
            pacer.used(end);
        }
    }

    #[test]
    fn racing_arrivals_on_real_threads_never_share_a_turn() {
        // Rounds of two threads arriving together at a pacer nobody is
        // present at, each taking a turn and using it (either may find
        // itself alone), then one caller leaving a hole behind: the used
        // turns of a round are always one cost apart.
        use std::sync::{Arc, Barrier};
        let cost = 10;
        let max_wait = Duration::from_secs(1);
        let now = 1_000_000;
        let pacer = Arc::new(Pacer::new());
        let barrier = Arc::new(Barrier::new(2));
        let rounds = 20_000;
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (pacer, barrier) = (Arc::clone(&pacer), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    (0..rounds)
                        .map(|_| {
                            barrier.wait();
                            let mine = take(&pacer, now, cost, max_wait);
                            pacer.used(mine);
                            barrier.wait();
                            mine
                        })
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        let turns: Vec<Vec<u64>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let mut all: Vec<u64> = turns.concat();
        all.sort_unstable();
        for pair in all.windows(2) {
            assert!(
                pair[1] >= pair[0] + cost,
                "turns {} and {}",
                pair[0],
                pair[1]
            );
        }
    }
}
