//! Keys known to be blocked, refused without a round trip until their
//! wait is over.
//!
//! Redis answers a refusal with the time until a pass could fit (on the
//! server's clock, as a duration); the key is then refused locally until
//! that much time has passed on this store's clock. This never admits
//! more: a refusal here is one Redis would have given (the passes it counts
//! only age out with time), unless the limit is raised meanwhile, which a
//! [`RedisStore::set_limit`](super::RedisStore::set_limit) on this store
//! clears at once and other replicas see within the wait.
//!
//! The table is bounded: at most [`MAX_BLOCKED`] keys; expired entries are
//! swept when it is full, and a key that still finds no room is simply not
//! remembered (its next request costs a round trip).

use std::sync::Mutex;

use std::collections::HashMap;

use super::KeyId;

/// Most keys remembered as blocked at once.
pub(crate) const MAX_BLOCKED: usize = 4096;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Blocked {
    /// Refused until this time (store clock, ms).
    pub(crate) until_ms: u64,
    /// Passes the refusal was for: a request for at least as many is
    /// refused too.
    pub(crate) n: u64,
    pub(crate) window_pass: u64,
    pub(crate) limit: u64,
}

#[derive(Debug, Default)]
pub(crate) struct BlockedKeys {
    keys: Mutex<HashMap<KeyId, Blocked>>,
}

impl BlockedKeys {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<KeyId, Blocked>> {
        // A panic while holding this lock leaves a plain map; keep using it.
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The refusal still in force for `id` at `now_ms` for `n` passes.
    pub(crate) fn check(&self, id: KeyId, n: u64, now_ms: u64) -> Option<Blocked> {
        let mut keys = self.lock();
        let blocked = *keys.get(&id)?;
        if now_ms >= blocked.until_ms {
            keys.remove(&id);
            return None;
        }
        (n >= blocked.n).then_some(blocked)
    }

    pub(crate) fn remember(&self, id: KeyId, blocked: Blocked, now_ms: u64) {
        let mut keys = self.lock();
        if keys.len() >= MAX_BLOCKED && !keys.contains_key(&id) {
            keys.retain(|_, b| b.until_ms > now_ms);
            if keys.len() >= MAX_BLOCKED {
                return;
            }
        }
        keys.insert(id, blocked);
    }

    pub(crate) fn forget(&self, id: KeyId) {
        self.lock().remove(&id);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::identity;

    fn id(n: u64) -> KeyId {
        identity(&n)
    }

    fn blocked(until_ms: u64) -> Blocked {
        Blocked {
            until_ms,
            n: 1,
            window_pass: 3,
            limit: 3,
        }
    }

    #[test]
    fn refused_until_the_wait_is_over() {
        let keys = BlockedKeys::default();
        keys.remember(id(1), blocked(100), 0);
        assert!(keys.check(id(1), 1, 99).is_some());
        assert!(keys.check(id(2), 1, 99).is_none());
        assert!(keys.check(id(1), 1, 100).is_none());
        assert_eq!(keys.len(), 0, "expired entries are dropped when read");
    }

    #[test]
    fn a_flood_of_keys_stays_bounded() {
        let keys = BlockedKeys::default();
        let flood = MAX_BLOCKED as u64 * 3;
        for n in 0..flood {
            keys.remember(id(n), blocked(1_000), 0);
        }
        assert_eq!(keys.len(), MAX_BLOCKED);
        // Once the old ones expire, new keys find room again.
        keys.remember(id(flood), blocked(5_000), 1_000);
        assert_eq!(keys.len(), 1);
        assert!(keys.check(id(flood), 1, 1_001).is_some());
    }
}
