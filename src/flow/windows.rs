//! Several windows per key (`SlidingWindowLayer::limit_per`): a request
//! passes only if every window admits it, and is charged to all of them or
//! to none.
//!
//! # Implementation details: all or none
//!
//! Each window admits with its own one-step "add if it fits" (a
//! compare-and-swap on its newest bucket, see `stat::admission`). The
//! further windows are asked first, in order; each pass taken in one is a
//! reservation, with where it landed. The first window (the key's
//! `StatisticNode`, whose pass also feeds its statistics and minute
//! history) is asked last: its compare-and-swap commits the request. If any
//! window refuses, every reservation taken before is given back (a
//! compare-and-swap on the same bucket, checked against its round), and
//! the first window was never charged, or is the one that refused.
//!
//! So once every request has finished, each window holds exactly the
//! passes of the requests that were admitted: never a pass counted in one
//! window only. While a refused request is still giving its reservations
//! back, another request may see them and be refused too: a reservation
//! can only make the layer refuse more, never admit more, and only for the
//! few instructions it lives.
//!
//! With one window (no `limit_per`) nothing here runs: the entry has no
//! further windows, and admission is the first window's one
//! compare-and-swap, as before.

use super::admission::{fits, retry_on_clock, try_admit, Admission};
use super::decision::{Decision, Pass, Reason, Refusal};
use super::quota::wait_for_quota;
use crate::stat::{ExtraWindow, ExtraWindows, Placed, StatisticNode};

/// Reservations held at once without allocating: a layer with more further
/// windows than this keeps the rest on the heap while it decides.
const INLINE: usize = 8;

/// What a request took from its further windows while it is decided, in
/// window order (window `i` took the `i`-th): the first [`INLINE`] on the
/// stack, the rest on the heap. Both tiers give them back newest first.
pub(super) struct Held<T> {
    inline: [T; INLINE],
    more: Vec<T>,
    len: usize,
}

impl<T: Copy> Held<T> {
    /// Nothing held; `empty` fills the unused inline slots.
    pub(super) fn new(empty: T) -> Self {
        Held {
            inline: [empty; INLINE],
            more: Vec::new(),
            len: 0,
        }
    }

    pub(super) fn push(&mut self, taken: T) {
        if self.len < INLINE {
            self.inline[self.len] = taken;
        } else {
            self.more.push(taken);
        }
        self.len += 1;
    }

    /// Each one held with its window's index, newest first.
    pub(super) fn newest_first(&self) -> impl Iterator<Item = (usize, T)> + '_ {
        (0..self.len).rev().map(|i| {
            let taken = if i < INLINE {
                self.inline[i]
            } else {
                self.more[i - INLINE]
            };
            (i, taken)
        })
    }
}

/// Gives back every reservation, newest first.
fn give_back(held: &Held<Placed>, windows: &ExtraWindows) {
    for (i, placed) in held.newest_first() {
        if let Some(window) = windows.get(i) {
            window.give_back(placed, 1);
        }
    }
}

/// The decision of every window of a key on one request at `at` (moved
/// forward by `behind` from the clock): a pass charged to every window, or
/// a refusal charged to none, whose retry time is the longest wait among
/// the windows that refused. `limit` is the first window's limit (after
/// warm-up); `overflow` says, only when it refuses, whether the key is the
/// overflow entry.
pub(crate) fn all_windows(
    node: &StatisticNode,
    windows: &ExtraWindows,
    (at, behind): (u64, u64),
    limit: u64,
    interval_ms: u64,
    overflow: impl FnOnce() -> bool,
) -> Decision<Pass> {
    let mut held = Held::new(Placed::NONE);
    let mut refused = false;
    for window in windows.iter() {
        let cap = window.limit();
        match window.try_take(at, 1, move |pass| fits(pass, 1, cap)) {
            Ok((_, placed)) => held.push(placed),
            Err(_) => {
                refused = true;
                break;
            }
        }
    }
    let first = if refused {
        None
    } else {
        Some(try_admit(node, at, 1, limit))
    };
    match first {
        Some(Admission::Pass { window_pass }) => Decision::Pass(Pass {
            limit,
            window_pass: Some(window_pass),
            reset_ms: None,
        }),
        _ => {
            give_back(&held, windows);
            Decision::Block(refusal(
                node,
                windows,
                (at, behind),
                limit,
                interval_ms,
                overflow(),
            ))
        }
    }
}

/// The refusal of a request no window was charged for: the longest wait
/// among the windows (a window with room waits 0), the first window's
/// limit and passes (the RateLimit fields then list every window, see
/// `layer::quota`).
#[cold]
#[inline(never)]
fn refusal(
    node: &StatisticNode,
    windows: &ExtraWindows,
    (at, behind): (u64, u64),
    limit: u64,
    interval_ms: u64,
    overflow: bool,
) -> Refusal {
    let first = retry_on_clock(node, at, behind, 1, limit).unwrap_or(interval_ms);
    let retry_after_ms = windows
        .iter()
        .map(|window| window_retry_ms(window, at, behind, 1))
        .fold(first, u64::max);
    Refusal {
        reason: Reason::of_window(overflow),
        retry_after_ms,
        limit,
        window_pass: None,
    }
}

/// Milliseconds until `n` more passes fit in `window` at `at` (on the
/// clock: `behind` later), 0 if they fit now; the window's span if they
/// never can.
pub(crate) fn window_retry_ms(window: &ExtraWindow, at: u64, behind: u64, n: u64) -> u64 {
    let (buckets, span_ms) = window.admission_passes(at);
    match wait_for_quota(buckets, at, span_ms, n, window.limit()) {
        Some(0) => 0,
        Some(ms) => ms.saturating_add(behind),
        None => window.interval_ms(),
    }
}

/// Model-checked with loom (`ci/loom.sh` runs every `loom_models` test):
/// a key with two windows, its first (a `StatisticNode`) and one further
/// window, each of two buckets of 1 ms, and two requests racing. Whatever
/// the interleaving, at most the tighter limit passes, and once both have
/// finished each window holds exactly the passes of the requests that
/// passed: a reservation given back is never lost, never kept.
#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use crate::clock::{ManualClock, SharedClock};
    use crate::stat::WindowShape;
    use loom::sync::Arc;
    use loom::thread;

    struct Key {
        node: StatisticNode,
        windows: ExtraWindows,
        first_limit: u64,
    }

    fn key(first_limit: u64, further_limit: u64) -> Arc<Key> {
        let shape = WindowShape {
            sample_count: 2,
            interval_ms: 2,
        };
        Arc::new(Key {
            node: StatisticNode::build(SharedClock::new(ManualClock::new(0)), 1, 1, false)
                .expect("valid window"),
            windows: ExtraWindows::new(&[shape], false, |_| further_limit).expect("valid window"),
            first_limit,
        })
    }

    /// One request at `at`: whether it passed.
    fn request(key: &Key, at: u64) -> bool {
        match all_windows(&key.node, &key.windows, (at, 0), key.first_limit, 1, || {
            false
        }) {
            Decision::Pass(_) => true,
            Decision::Block(_) => false,
            Decision::Wait(never) => match never {},
        }
    }

    fn further_pass(key: &Key, at: u64) -> u64 {
        key.windows.get(0).expect("one further window").pass(at)
    }

    /// The first window is the tighter (1 against 2): both requests take a
    /// pass in the further window, one of them is refused by the first and
    /// gives its pass back. Exactly one passes; the further window ends
    /// with exactly one pass.
    #[test]
    fn a_refusal_by_the_first_window_gives_the_further_pass_back() {
        loom::model(|| {
            let key = key(1, 2);
            // Open the buckets at 0 first: the race is over the words.
            assert_eq!(further_pass(&key, 0), 0);
            let other = {
                let key = Arc::clone(&key);
                thread::spawn(move || request(&key, 0))
            };
            let mine = request(&key, 0);
            let theirs = other.join().unwrap();
            assert_eq!(u64::from(mine) + u64::from(theirs), 1);
            assert_eq!(further_pass(&key, 0), 1);
            assert_eq!(key.node.window_counts(0).pass, 1);
        });
    }

    /// The further window is the tighter (1 against 2): one request gets
    /// its pass, the other is refused there and never reaches the first
    /// window. Exactly one pass in each window.
    #[test]
    fn a_refusal_by_the_further_window_leaves_the_first_untouched() {
        loom::model(|| {
            let key = key(2, 1);
            assert_eq!(further_pass(&key, 0), 0);
            let other = {
                let key = Arc::clone(&key);
                thread::spawn(move || request(&key, 0))
            };
            let mine = request(&key, 0);
            let theirs = other.join().unwrap();
            assert_eq!(u64::from(mine) + u64::from(theirs), 1);
            assert_eq!(further_pass(&key, 0), 1);
            assert_eq!(key.node.window_counts(0).pass, 1);
        });
    }

    /// A give-back racing a rotation of the further window: the first
    /// window already holds its limit at 0, so a request at 0 takes a pass
    /// in the further window's bucket at 0 and gives it back when the
    /// first window refuses it, while a request at 1 opens the next bucket
    /// of both windows (sealing the further window's bucket at 0 and
    /// caching its passes). The request at 0 may also be moved forward to
    /// the bucket at 1, as a late caller is, and pass there. Whatever the
    /// interleaving: at most one passes (the further limit), each window
    /// holds exactly the passes made, and a pass given back into a sealed
    /// bucket is not left in the sum its successor cached: a last request
    /// at 1 passes exactly when nothing else did.
    #[test]
    fn a_give_back_into_a_sealed_bucket_is_seen_by_the_next_admission() {
        loom::model(|| {
            let key = key(1, 1);
            // The first window (1 bucket of 1 ms) holds its limit at 0.
            assert!(key.node.try_add_pass_at(0, 1, |_| true).is_ok());
            assert_eq!(further_pass(&key, 0), 0);
            let other = {
                let key = Arc::clone(&key);
                thread::spawn(move || request(&key, 0))
            };
            let late = request(&key, 1);
            let early = other.join().unwrap();
            let passed = u64::from(early) + u64::from(late);
            assert!(passed <= 1, "the further window's limit");
            assert_eq!(further_pass(&key, 1), passed);
            assert_eq!(key.node.window_counts(1).pass, passed);
            assert_eq!(request(&key, 1), passed == 0);
        });
    }
}
