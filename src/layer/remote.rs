//! The hook of a shared store ([`RedisStore`], feature `redis`) into the
//! layer: where each admission is decided when the layer has one.
//!
//! With a store, a request's pass or block comes from Redis; the layer's
//! own window records it (the key's statistics stay per replica), caps
//! it (a pass from Redis is admitted only if it also fits this replica's
//! window at the limit Redis applied, so a Redis that lost its state never
//! lets one replica past the limit), and decides in Redis's stead under
//! [`StoreFailure::Local`]. A request that finds a leased pass of a hot
//! key (see [leases](crate::store::redis#leases-for-hot-keys)) passes
//! in `call`, with no round trip, if it fits this replica's window; a key
//! the store knows to be blocked is refused in `call`; any other
//! request waits at a [`Gate`] for the store's verdict, so the round trip
//! never blocks a thread, and the inner service is called only after a
//! pass. The gate records a pass in the key's window; a refusal is recorded
//! with its answer, as every block is. The store's [`Verdict`] becomes a
//! [`Decision`] here, at the boundary.
//!
//! A key with further windows (`limit_per`) is decided on all of them in
//! one script call ([`RedisStore::admit_windows`]), never with a lease; a
//! pass from Redis must then fit every window of this replica's entry,
//! charged to all or none, as without a store.

use std::sync::Arc;
use std::time::Duration;

use super::wait::Gate;
use crate::clock::Clock;
use crate::flow::{self, Decision, Pass, Reason, Refusal};
use crate::store::redis::{FurtherWindow, KeyId, RedisStore, StoreFailure, Verdict};
use crate::store::{effective_now, Entry};

/// The store's decision on a request for `entry` (store identity `id`,
/// this replica's limit `limit`): a refusal at once if the store knows
/// the key to be blocked, else a wait at a gate for its verdict (or the
/// failure policy's when Redis cannot decide). `interval_ms` is the
/// window's length (the retry time of a refusal that can never pass).
pub(crate) fn decide(
    store: &RedisStore,
    policy: StoreFailure,
    entry: &Arc<Entry>,
    id: KeyId,
    limit: u64,
    interval_ms: u64,
) -> Decision<Pass, Gate> {
    if let Some(windows) = entry.windows() {
        // Every window in one script call, never a lease. A refusal that
        // can never pass is retried after the longest window.
        let further: Vec<FurtherWindow> = windows
            .iter()
            .map(|window| FurtherWindow {
                interval_ms: window.interval_ms(),
                limit: window.limit(),
            })
            .collect();
        let longest = further
            .iter()
            .map(|window| window.interval_ms)
            .fold(interval_ms, u64::max);
        if let Some(verdict) = store.known_blocked(id, 1) {
            return Decision::Block(refusal(&verdict, longest));
        }
        return Decision::Wait(gate(
            store.clone(),
            policy,
            Arc::clone(entry),
            id,
            limit,
            (interval_ms, longest),
            further,
        ));
    }
    // A leased pass of the current bucket: no round trip. It must fit this
    // replica's window too, as any pass from Redis.
    if let Some(verdict) = store.spend_lease(id, limit) {
        let now = effective_now(entry, entry.node.clock().now_millis());
        return match flow::window(&entry.node, (now, 0), verdict.limit, interval_ms, || {
            entry.is_overflow()
        }) {
            Decision::Pass(pass) => Decision::Pass(pass),
            Decision::Block(mut refused) => {
                refused.retry_after_ms = refused.retry_after_ms.max(1);
                Decision::Block(refused)
            }
            Decision::Wait(never) => match never {},
        };
    }
    if let Some(verdict) = store.known_blocked(id, 1) {
        return Decision::Block(refusal(&verdict, 1));
    }
    Decision::Wait(gate(
        store.clone(),
        policy,
        Arc::clone(entry),
        id,
        limit,
        (interval_ms, interval_ms),
        Vec::new(),
    ))
}

/// The refusal the store's `verdict` says, to retry after `never_ms` if
/// it says the key can never pass; at least 1 ms.
fn refusal(verdict: &Verdict, never_ms: u64) -> Refusal {
    let retry_after_ms = verdict.retry_after.map_or(never_ms, millis).max(1);
    Refusal {
        reason: Reason::Store,
        retry_after_ms,
        limit: verdict.limit,
        window_pass: Some(verdict.window_pass),
    }
}

fn millis(wait: Duration) -> u64 {
    u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)
}

/// What a request waits for: the store's verdict, or the failure policy's.
/// `interval_ms` is the first window's length and the longest window's
/// (the retry time of a refusal that can never pass); `further` the key's
/// further windows (empty without `limit_per`).
fn gate(
    store: RedisStore,
    policy: StoreFailure,
    entry: Arc<Entry>,
    id: KeyId,
    limit: u64,
    (interval_ms, longest_ms): (u64, u64),
    further: Vec<FurtherWindow>,
) -> Gate {
    Box::pin(async move {
        let result = if further.is_empty() {
            // `decide` found no leased pass (and counted the request).
            store.admit_after_lease(id, limit, 1).await
        } else {
            store.admit_windows(id, limit, &further).await
        };
        let now = effective_now(&entry, entry.node.clock().now_millis());
        // This replica's own windows decide at `limit` (the first window's;
        // each further window at its limit on the entry, the one sent to
        // Redis): the pass is recorded only if it fits every window, in
        // all or none.
        let overflow = || entry.is_overflow();
        let local = |limit: u64| match entry.windows() {
            Some(windows) => {
                flow::all_windows(&entry.node, windows, (now, 0), limit, interval_ms, overflow)
            }
            None => flow::window(&entry.node, (now, 0), limit, interval_ms, overflow),
        };
        let local = |limit: u64| match local(limit) {
            Decision::Pass(_) => Decision::Pass(()),
            Decision::Block(mut refused) => {
                refused.retry_after_ms = refused.retry_after_ms.max(1);
                Decision::Block(refused)
            }
            Decision::Wait(never) => match never {},
        };
        match result {
            // A pass from Redis must fit this replica's own window too, at
            // the limit Redis applied: if Redis lost the key's passes (a
            // FLUSHALL, a restart without persistence, a promoted replica
            // that had not seen them), it grants passes it already
            // granted, and the local window is what keeps this replica at
            // the limit. A pass refused here stays counted in Redis (it
            // errs toward fewer passes, never more).
            Ok(verdict) if verdict.passed => local(verdict.limit),
            Ok(verdict) => Decision::Block(refusal(&verdict, longest_ms)),
            Err(_) => match policy {
                StoreFailure::Local => local(limit),
                StoreFailure::Allow => {
                    let _ = entry.node.try_add_pass_at(now, 1, |_| true);
                    // Every window counts the pass, as the first does.
                    for window in entry
                        .windows()
                        .into_iter()
                        .flat_map(|windows| windows.iter())
                    {
                        let _ = window.try_take(now, 1, |_| true);
                    }
                    Decision::Pass(())
                }
                StoreFailure::Deny => {
                    Decision::Block(Refusal::new(Reason::Store, store.probe_ms().max(1), limit))
                }
            },
        }
    })
}
