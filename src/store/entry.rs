use crate::clock::SharedClock;
use crate::stat::StatisticNode;
use crate::sync::{AtomicU64, Ordering};

use super::Window;

/// One key's statistics and limit.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) node: StatisticNode,
    /// The limit admissions are checked against. Relaxed: read once per
    /// request on its own; a change applies from the next request.
    limit: AtomicU64,
    /// Names the key's policy in RateLimit headers when the key has its own
    /// limit: a keyed hash of the key, never the key itself. `u64::MAX` when
    /// the key runs on the default limit.
    policy_tag: AtomicU64,
    /// Holds no counted slot of `max_keys`: created for a key that had its
    /// own limit (never overflowed), or for the single key of a zero-sized
    /// key type. Eviction gives a slot back only for entries that hold one.
    pub(crate) pinned: bool,
}

const DEFAULT_POLICY: u64 = u64::MAX;

impl Entry {
    pub(crate) fn new(
        window: Window,
        clock: SharedClock,
        limit: u64,
        policy_tag: Option<u64>,
        pinned: bool,
    ) -> Self {
        Entry {
            node: StatisticNode::build(
                clock,
                window.sample_count,
                window.interval_ms,
                window.strict,
            )
            .expect("the window was validated when the layer was built"),
            limit: AtomicU64::new(limit),
            policy_tag: AtomicU64::new(policy_tag.map_or(DEFAULT_POLICY, |t| t & 0xFFFF_FFFF)),
            pinned,
        }
    }

    #[inline]
    pub(crate) fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Sets the limit and the tag naming its policy (`None`: the default
    /// policy).
    pub(crate) fn set_limit(&self, limit: u64, policy_tag: Option<u64>) {
        self.limit.store(limit, Ordering::Relaxed);
        self.policy_tag.store(
            policy_tag.map_or(DEFAULT_POLICY, |t| t & 0xFFFF_FFFF),
            Ordering::Relaxed,
        );
    }

    /// The tag naming this key's own policy, or `None` on the default one.
    pub(crate) fn policy_tag(&self) -> Option<u32> {
        match self.policy_tag.load(Ordering::Relaxed) {
            DEFAULT_POLICY => None,
            tag => Some(tag as u32),
        }
    }
}
