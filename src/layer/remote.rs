//! The hook of a shared store ([`RedisStore`], feature `redis`) into the
//! layer: where each admission is decided when the layer has one.
//!
//! With a store, a request's pass or block comes from Redis; the layer's
//! own window only records it (the key's statistics stay per replica) and
//! decides in Redis's stead under [`StoreFailure::Local`]. A key the store
//! knows to be blocked is refused in `call`, with no round trip; any other
//! request waits at a [`Gate`] for the store's verdict, so the round trip
//! never blocks a thread, and the inner service is called only after a
//! pass. The gate records the pass or the block in the key's window.

use std::sync::Arc;

use super::wait::{Gate, Verdict};
use crate::clock::Clock;
use crate::flow::{self, Admission};
use crate::store::redis::{KeyId, RedisStore, StoreFailure};
use crate::store::{effective_now, Entry};

/// What a request for `entry` (store identity `id`, this replica's
/// limit `limit`) waits for: the store's verdict, or the failure
/// policy's when Redis cannot decide. `interval_ms` is the window's
/// length (the retry time of a refusal that can never pass).
pub(crate) fn gate(
    store: RedisStore,
    policy: StoreFailure,
    entry: Arc<Entry>,
    id: KeyId,
    limit: u64,
    interval_ms: u64,
) -> Gate {
    Box::pin(async move {
        let result = store.admit_id(id, limit, 1).await;
        let now = effective_now(&entry, entry.node.clock().now_millis());
        let pass = |entry: &Entry| {
            let _ = entry.node.try_add_pass_at(now, 1, |_| true);
            Verdict::Pass
        };
        let refuse = |entry: &Entry, retry_after_ms: u64, limit: u64, window_pass: u64| {
            entry.node.record_block_at(now, 1);
            Verdict::Refuse {
                retry_after_ms: retry_after_ms.max(1),
                limit,
                window_pass,
            }
        };
        match result {
            Ok(verdict) if verdict.passed => pass(&entry),
            Ok(verdict) => {
                let retry_after_ms = verdict.retry_after.map_or(interval_ms, |wait| {
                    u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)
                });
                refuse(&entry, retry_after_ms, verdict.limit, verdict.window_pass)
            }
            Err(_) => match policy {
                StoreFailure::Local => match flow::try_admit(&entry.node, now, 1, limit) {
                    Admission::Pass { .. } => Verdict::Pass,
                    Admission::Block { window_pass } => {
                        let retry_after_ms =
                            flow::retry_after_ms(&entry.node, now, 1, limit).unwrap_or(interval_ms);
                        refuse(&entry, retry_after_ms, limit, window_pass)
                    }
                },
                StoreFailure::Allow => pass(&entry),
                StoreFailure::Deny => {
                    let window_pass = entry.node.window_counts(now).pass;
                    refuse(&entry, store.probe_ms(), limit, window_pass)
                }
            },
        }
    })
}
