//! Several windows on a compact key (`SlidingWindowLayer::limit_per` with
//! `compact`): the all-or-none decision of `flow::windows` over
//! [`CompactWindow`]s.
//!
//! # Implementation details: all or none
//!
//! As for a full key: the further windows are asked first, in order, each
//! pass taken with the window's own compare-and-swap and remembered by the
//! bucket it landed in (the newest of the moment: a rotation racing the
//! decision may have moved it past the request's time); the first window is asked last, and its
//! compare-and-swap commits the request. If any window refuses, every pass
//! taken before is given back ([`CompactWindow::give_back`]: a
//! compare-and-swap of the head while its bucket is the newest, else the
//! ring entry under the rotation lock), and the first window was never
//! charged, or is the one that refused. Once every request has finished,
//! each window holds exactly the passes of the requests admitted. A pass
//! still held by a request being refused can make another request refuse
//! too, for the few instructions it lives; never admit more.

use super::decision::{Decision, Pass, Reason, Refusal};
use super::windows::Held;
use crate::stat::{CompactShape, CompactWindow};

/// One further window of a compact key: its window, shape and limit now.
#[derive(Clone, Copy)]
pub(crate) struct CompactFurther<'a> {
    pub(crate) window: &'a CompactWindow,
    pub(crate) shape: &'a CompactShape,
    pub(crate) limit: u64,
}

/// Gives back every further pass taken (the start of the bucket each
/// landed in), newest first: window `i` took the `i`-th.
fn give_back<'a>(taken: &Held<u64>, further: impl Fn(usize) -> CompactFurther<'a>) {
    for (i, at) in taken.newest_first() {
        let window = further(i);
        window.window.give_back(window.shape, at);
    }
}

/// The decision of every window of a compact key on one request whose clock
/// reads `now`: `(at, behind, decision)` as [`CompactWindow::admit`] gives
/// them for the first window (`first`, of `shape`, under `limit`), with a
/// pass charged to every window or a refusal charged to none, whose retry
/// time is the longest wait among the windows (a window with room waits 0).
/// `count` further windows, `further(i)` the `i`-th; `overflow` says the
/// key is counted on the overflow window.
pub(crate) fn all_compact_windows<'a>(
    first: &CompactWindow,
    shape: &CompactShape,
    limit: u64,
    count: usize,
    further: impl Fn(usize) -> CompactFurther<'a>,
    now: u64,
    overflow: bool,
) -> (u64, u64, Decision<Pass>) {
    let at = anchor(first, shape, count, &further, now);
    let behind = first.lag(shape, now, at);
    let mut taken = Held::new(0);
    let mut refused = false;
    for i in 0..count {
        let window = further(i);
        let w_at = window.window.effective_now(window.shape, at);
        let w_behind = behind + window.window.lag(window.shape, at, w_at);
        match window
            .window
            .decide_placed(window.shape, (w_at, w_behind), window.limit, overflow)
        {
            // A pass always says where it landed; the time it was decided
            // at stands in otherwise.
            (Decision::Pass(_), landed) => taken.push(landed.unwrap_or(w_at)),
            (Decision::Block(_), _) => {
                refused = true;
                break;
            }
            (Decision::Wait(never), _) => match never {},
        }
    }
    if !refused {
        match first.decide(shape, (at, behind), limit, overflow) {
            pass @ Decision::Pass(_) => return (at, behind, pass),
            Decision::Block(_) => {}
            Decision::Wait(never) => match never {},
        }
    }
    give_back(&taken, &further);
    (
        at,
        behind,
        Decision::Block(refusal(
            first,
            shape,
            limit,
            count,
            &further,
            (at, behind),
            overflow,
        )),
    )
}

/// The time a compact key's windows decide at for a clock reading `now`:
/// the first window's [`effective_now`](CompactWindow::effective_now). When
/// that re-anchors the first window (the clock stepped back by more than a
/// window), every further window is moved back as far, so that the key's
/// windows keep their places relative to each other, as a full key's
/// further windows keep running with its first window under its skew.
pub(crate) fn anchor<'a>(
    first: &CompactWindow,
    shape: &CompactShape,
    count: usize,
    further: &impl Fn(usize) -> CompactFurther<'a>,
    now: u64,
) -> u64 {
    let (at, moved) = first.effective_now_moved(shape, now);
    if moved > 0 {
        shift_further(count, further, moved, now);
    }
    at
}

#[cold]
#[inline(never)]
fn shift_further<'a>(
    count: usize,
    further: &impl Fn(usize) -> CompactFurther<'a>,
    moved: u64,
    now: u64,
) {
    for i in 0..count {
        let window = further(i);
        window
            .window
            .shift_back(window.shape, moved, now.saturating_add(moved));
    }
}

/// The refusal of a request no window was charged for (as
/// `flow::windows`'s): the longest wait among the windows, the first
/// window's limit; its passes are read by the answer.
#[cold]
#[inline(never)]
fn refusal<'a>(
    first: &CompactWindow,
    shape: &CompactShape,
    limit: u64,
    count: usize,
    further: &impl Fn(usize) -> CompactFurther<'a>,
    (at, behind): (u64, u64),
    overflow: bool,
) -> Refusal {
    let first_wait = first
        .retry_ms(shape, at, behind, 1, limit)
        .unwrap_or(shape.interval_ms);
    let retry_after_ms = (0..count)
        .map(|i| compact_retry_ms(further(i), at, behind, 1))
        .fold(first_wait, u64::max);
    Refusal {
        reason: Reason::of_window(overflow),
        retry_after_ms,
        limit,
        window_pass: None,
    }
}

/// Milliseconds until `n` more passes fit in a further window at `at` (on
/// the clock: `behind` later), 0 if they fit now; the window's interval if
/// they never can (as `flow::window_retry_ms`).
pub(crate) fn compact_retry_ms(window: CompactFurther<'_>, at: u64, behind: u64, n: u64) -> u64 {
    window
        .window
        .retry_ms(window.shape, at, behind, n, window.limit)
        .unwrap_or(window.shape.interval_ms)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const FIRST: CompactShape = CompactShape::new(2, 20, false);
    const MINUTE: CompactShape = CompactShape::new(2, 60, false);

    struct Key {
        first: CompactWindow,
        further: CompactWindow,
    }

    fn request(key: &Key, now: u64, first_limit: u64, further_limit: u64) -> Decision<Pass> {
        let further = |_| CompactFurther {
            window: &key.further,
            shape: &MINUTE,
            limit: further_limit,
        };
        all_compact_windows(&key.first, &FIRST, first_limit, 1, further, now, false).2
    }

    fn passes(key: &Key, now: u64) -> (u64, u64) {
        (
            key.first.window_counts(&FIRST, now).0,
            key.further.window_counts(&MINUTE, now).0,
        )
    }

    /// A refusal by either window leaves both as they were, and its wait is
    /// the longest among the windows that refused.
    #[test]
    fn a_refusal_by_either_window_is_charged_to_none() {
        let key = Key {
            first: CompactWindow::new(),
            further: CompactWindow::new(),
        };
        // First window: 2 per 20 ms; further: 3 per 60 ms.
        assert!(matches!(request(&key, 100, 2, 3), Decision::Pass(_)));
        assert!(matches!(request(&key, 101, 2, 3), Decision::Pass(_)));
        // The first window refuses: the further window's pass is given back
        // (in its newest bucket). Wait: until 120, where the bucket at 100
        // leaves the first window.
        match request(&key, 102, 2, 3) {
            Decision::Block(refusal) => assert_eq!(refusal.retry_after_ms, 18),
            other => panic!("{other:?}"),
        }
        assert_eq!(passes(&key, 102), (2, 2));
        assert!(matches!(request(&key, 125, 2, 3), Decision::Pass(_)));
        assert_eq!(passes(&key, 125), (1, 3));
        // The further window refuses (3 in its window until 150): the first
        // is never charged.
        match request(&key, 126, 2, 3) {
            Decision::Block(refusal) => assert_eq!(refusal.retry_after_ms, 150 - 126),
            other => panic!("{other:?}"),
        }
        assert_eq!(passes(&key, 126), (1, 3));
    }

    /// A pass taken in a further window whose bucket a rotation sealed
    /// since is given back into the ring, and the next admission sees it.
    #[test]
    fn a_pass_given_back_into_a_sealed_bucket_frees_its_room() {
        let window = CompactWindow::new();
        let pass = |now| {
            matches!(
                window.decide(&MINUTE, (now, 0), 2, false),
                Decision::Pass(_)
            )
        };
        assert!(pass(30));
        assert!(pass(31));
        // The bucket at 30 sealed by a block recorded at 60.
        window.record_block(&MINUTE, 60);
        assert!(!pass(61));
        // The pass at 31 landed in the bucket at 30.
        window.give_back(&MINUTE, 30);
        assert_eq!(window.window_counts(&MINUTE, 61).0, 1);
        assert!(pass(61));
        // A bucket that has left the ring: nothing to give back.
        window.give_back(&MINUTE, 0);
        assert_eq!(window.window_counts(&MINUTE, 61).0, 2);
    }
}

/// Model-checked with loom (`ci/loom.sh` runs every `loom_models` test):
/// a compact key with two windows, its first and one further window, each
/// of two buckets of 1 ms, and two requests racing. Whatever the
/// interleaving, at most the tighter limit passes, and once both have
/// finished each window holds exactly the passes of the requests that
/// passed: a refusal by either window leaves the other's counts as they
/// were.
#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// The first window: one bucket of 1 ms.
    const FIRST: CompactShape = CompactShape::new(1, 1, false);
    /// The further window: two buckets of 1 ms.
    const SHAPE: CompactShape = CompactShape::new(2, 2, false);

    struct Key {
        first: CompactWindow,
        further: CompactWindow,
        first_limit: u64,
        further_limit: u64,
    }

    fn key(first_limit: u64, further_limit: u64) -> Arc<Key> {
        Arc::new(Key {
            first: CompactWindow::new(),
            further: CompactWindow::new(),
            first_limit,
            further_limit,
        })
    }

    /// One request at `now`: whether it passed.
    fn request(key: &Key, now: u64) -> bool {
        let further = |_| CompactFurther {
            window: &key.further,
            shape: &SHAPE,
            limit: key.further_limit,
        };
        match all_compact_windows(&key.first, &FIRST, key.first_limit, 1, further, now, false).2 {
            Decision::Pass(_) => true,
            Decision::Block(_) => false,
            Decision::Wait(never) => match never {},
        }
    }

    fn first_passes(key: &Key, now: u64) -> u64 {
        key.first.window_counts(&FIRST, now).0
    }

    fn further_passes(key: &Key, now: u64) -> u64 {
        key.further.window_counts(&SHAPE, now).0
    }

    /// Opens both windows' buckets at 0 (with a block), so that the race
    /// is over the words, not the first rotation.
    fn opened(key: &Key) {
        key.further.record_block(&SHAPE, 0);
        key.first.record_block(&FIRST, 0);
    }

    /// The first window is the tighter (1 against 2): both requests take a
    /// pass in the further window, one is refused by the first and gives
    /// its pass back. Exactly one passes; each window holds one pass.
    #[test]
    fn a_refusal_by_the_first_window_gives_the_further_pass_back() {
        loom::model(|| {
            let key = key(1, 2);
            opened(&key);
            let other = {
                let key = Arc::clone(&key);
                thread::spawn(move || request(&key, 0))
            };
            let mine = request(&key, 0);
            let theirs = other.join().unwrap();
            assert_eq!(u64::from(mine) + u64::from(theirs), 1);
            assert_eq!(further_passes(&key, 0), 1);
            assert_eq!(first_passes(&key, 0), 1);
        });
    }

    /// The further window is the tighter (1 against 2): the request it
    /// refuses never reaches the first window. Exactly one pass in each.
    #[test]
    fn a_refusal_by_the_further_window_leaves_the_first_untouched() {
        loom::model(|| {
            let key = key(2, 1);
            opened(&key);
            let other = {
                let key = Arc::clone(&key);
                thread::spawn(move || request(&key, 0))
            };
            let mine = request(&key, 0);
            let theirs = other.join().unwrap();
            assert_eq!(u64::from(mine) + u64::from(theirs), 1);
            assert_eq!(further_passes(&key, 0), 1);
            assert_eq!(first_passes(&key, 0), 1);
        });
    }

    /// A pass moved forward by a rotation is given back where it landed:
    /// the first window (one bucket of 1 ms) holds its limit at 0, so a
    /// request at 0 is refused there after taking a pass in the further
    /// window (limit 2), while a request at 1 opens the next bucket of both
    /// windows and passes. The request at 0 may take its further pass in
    /// the bucket at 0 (then sealed by the rotation) or, decided after the
    /// rotation, in the bucket at 1: either way its give-back leaves the
    /// further window with exactly the passes made.
    #[test]
    fn a_pass_moved_forward_by_a_rotation_is_given_back_where_it_landed() {
        loom::model(|| {
            let key = key(1, 2);
            assert!(matches!(
                key.first.decide(&FIRST, (0, 0), 1, false),
                Decision::Pass(_)
            ));
            key.further.record_block(&SHAPE, 0);
            let other = {
                let key = Arc::clone(&key);
                thread::spawn(move || request(&key, 0))
            };
            let late = request(&key, 1);
            let early = other.join().unwrap();
            let passed = u64::from(early) + u64::from(late);
            assert_eq!(further_passes(&key, 1), passed);
            assert_eq!(first_passes(&key, 1), passed);
        });
    }

    /// A give-back racing a rotation of the further window: the first
    /// window (one bucket of 1 ms) holds its limit at 0, so a request at 0
    /// takes a pass in the further window's bucket at 0 and gives it back,
    /// while a request at 1 opens the next bucket of both windows (sealing
    /// the further window's bucket at 0 into its ring). The request at 0
    /// may also be moved forward to 1, as a late caller is, and pass there.
    /// Whatever the interleaving: at most one passes (the further limit),
    /// each window holds exactly the passes made, and the pass given back
    /// is not left in the sealed bucket: a last request at 1 passes exactly
    /// when nothing else did.
    #[test]
    fn a_give_back_into_a_sealed_bucket_is_seen_by_the_next_admission() {
        loom::model(|| {
            let key = key(1, 1);
            assert!(matches!(
                key.first.decide(&FIRST, (0, 0), 1, false),
                Decision::Pass(_)
            ));
            key.further.record_block(&SHAPE, 0);
            let other = {
                let key = Arc::clone(&key);
                thread::spawn(move || request(&key, 0))
            };
            let late = request(&key, 1);
            let early = other.join().unwrap();
            let passed = u64::from(early) + u64::from(late);
            assert!(passed <= 1, "the further window's limit");
            assert_eq!(further_passes(&key, 1), passed);
            assert_eq!(first_passes(&key, 1), passed);
            assert_eq!(request(&key, 1), passed == 0);
        });
    }
}
