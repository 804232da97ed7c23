//! Requests that wait before they reach the inner service: a turn under
//! [`throttle`](crate::SlidingWindowLayer::throttle), quota borrowed from a
//! later bucket under [`prioritized`](crate::SlidingWindowLayer::prioritized).
//!
//! A waiting request carries a [`Gate`]: a future that ends with a
//! [`Decision`]. The response future polls it first and calls the inner
//! service only when it says pass, so the wait never blocks a thread and
//! never happens in `poll_ready`. Each gate owns a guard that keeps the
//! key's waiting gauge and undoes its reservation if the request is dropped
//! while it waits.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::flow::Decision;
use crate::store::Entry;

/// A decision that takes time: it ends in a pass (the gate has recorded
/// it) or a refusal (recorded with the answer, as every block is). The
/// waits of this crate's flow behaviours always end in a pass; a gate that
/// asks someone else (a remote store) can end in a refusal. `Send`, so
/// that the response future stays `Send` whatever it waits for.
pub(crate) type Gate = Pin<Box<dyn Future<Output = Decision> + Send + 'static>>;

/// The resolution of tokio's timer: a sleep ends on the first millisecond
/// tick at or after its deadline, up to this much late on a runtime that
/// keeps up.
pub(crate) const TIMER_TICK: Duration = Duration::from_millis(1);

#[cfg(feature = "tokio")]
std::thread_local! {
    /// Set once a timer could not be made on this thread (a tokio runtime
    /// built without `enable_time`), so that the attempt is not repeated.
    static NO_TIMER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread may be able to wait: inside a tokio runtime whose
/// timer has not failed here. Outside one (another executor, a bare thread)
/// a request that would have to wait is refused instead.
#[cfg(feature = "tokio")]
pub(crate) fn can_wait() -> bool {
    !NO_TIMER.get() && tokio::runtime::Handle::try_current().is_ok()
}

/// A timer for `wait`, made now (in `call`, on the caller's runtime), or
/// `None` if this runtime has no timer. tokio panics when asked for a timer
/// on a runtime built without one; that panic is caught here, logged once
/// per thread, and the request is refused instead of failing.
#[cfg(feature = "tokio")]
pub(crate) fn timer(wait: Duration) -> Option<Pin<Box<tokio::time::Sleep>>> {
    if !can_wait() {
        return None;
    }
    let made = std::panic::catch_unwind(|| Box::pin(tokio::time::sleep(wait)));
    match made {
        Ok(sleep) => Some(sleep),
        Err(_) => {
            NO_TIMER.set(true);
            tracing::warn!(
                "the tokio runtime has no timer (build it with `enable_time`): requests that \
                 would wait under `throttle` or `prioritized` are refused on this thread"
            );
            None
        }
    }
}

/// A request's place in its key's waiting gauge, with what to undo if the
/// request goes away before its wait ends.
pub(crate) struct Waiter {
    entry: Arc<Entry>,
    /// A turn taken from the key's pacer: `(at_ns, cost_ns)`.
    turn: Option<(u64, u64)>,
    done: bool,
}

impl Waiter {
    /// Counts a request as waiting on `entry`.
    pub(crate) fn new(entry: Arc<Entry>, turn: Option<(u64, u64)>) -> Self {
        entry.start_waiting();
        Waiter {
            entry,
            turn,
            done: false,
        }
    }

    /// The wait is over and its reservation used.
    pub(crate) fn finish(mut self) -> Arc<Entry> {
        self.done = true;
        if let (Some((at_ns, _)), Some(pacer)) = (self.turn, self.entry.pacer()) {
            pacer.used(at_ns);
        }
        Arc::clone(&self.entry)
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if !self.done {
            if let (Some((at_ns, cost_ns)), Some(pacer)) = (self.turn, self.entry.pacer()) {
                // The latest turn goes back to the next caller; an earlier
                // one stays unused, which only spaces later passes further
                // apart, until the last waiter has left (see
                // `flow::throttle`).
                pacer.give_back(at_ns, cost_ns);
            }
            // Borrowed quota stays reserved in its bucket: it can only make
            // that bucket admit fewer, never more.
        }
        self.entry.stop_waiting();
    }
}

/// A gate that waits for `timer`, then passes, recording the pass with
/// `record` (called with the entry when the wait is over).
#[cfg(feature = "tokio")]
pub(crate) fn after(
    timer: Pin<Box<tokio::time::Sleep>>,
    waiter: Waiter,
    record: impl FnOnce(&Entry) + Send + 'static,
) -> Gate {
    Box::pin(async move {
        timer.await;
        let entry = waiter.finish();
        record(&entry);
        Decision::Pass(())
    })
}
