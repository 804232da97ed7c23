use std::sync::Arc;

use crate::clock::SharedClock;
use crate::flow::breaker::{Breaker, Breakers, Completion, ProbeSet};
use crate::flow::warm_up::WarmUp;
use crate::flow::{Decision, Pacer, Reason, Refusal};
use crate::stat::{ExtraWindows, RtSlot, StatisticNode};
use crate::sync::{AtomicU64, Ordering};
use crate::system::System;

use super::Window;

/// One key's statistics, limit and circuit breakers.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) node: StatisticNode,
    /// The key's circuit breakers, one per `Breaker` of the layer (none:
    /// empty, nothing allocated).
    pub(crate) breakers: Breakers,
    /// The limit admissions are checked against. Relaxed: read once per
    /// request on its own; a change applies from the next request.
    limit: AtomicU64,
    /// Names the key's policy in RateLimit headers when the key has its own
    /// limit: a keyed hash of the key, never the key itself. `u64::MAX` when
    /// the key runs on the default limit, [`OVERFLOW_POLICY`] for the
    /// overflow entry (whose limit is never set).
    policy_tag: AtomicU64,
    /// Holds no counted slot of `max_keys`: created for a key that had its
    /// own limit (never overflowed), or for the single key of a zero-sized
    /// key type. Eviction gives a slot back only for entries that hold one.
    pub(crate) pinned: bool,
    /// The state of the behaviours a key may not have: its turns (under
    /// `throttle`), its warm-up tokens (under `warm_up`) and its further
    /// windows (under `limit_per`). One box for all three: 8 bytes per key
    /// when none is used, one predictable branch per request.
    optional: Option<Box<Optional>>,
    /// Requests of this key waiting now (for a turn, or for quota borrowed
    /// from a later bucket). Each waiter adds one when it starts waiting and
    /// its guard takes it off when the wait ends or is dropped, so the gauge
    /// never counts a request that is gone. Relaxed: a gauge, read alone.
    waiting: AtomicU64,
    /// The layer's response-time histogram, shared by every entry; empty
    /// until an exporter installs it, then set for good. `OnceLock::get`
    /// is an acquire load paired with the release of the set: a completion
    /// that sees the slot set sees the histogram whole.
    pub(crate) rt_histogram: RtSlot,
    /// The layer's system rule and its layer-wide statistics, shared by
    /// every entry; `None` (8 bytes, nothing allocated) without
    /// `SlidingWindowLayer::system`. Every in-flight guard of the key
    /// records into it.
    pub(crate) system: Option<Arc<System>>,
}

/// The per-key state of the behaviours a layer may not have (see
/// `Entry::optional`).
#[derive(Debug)]
struct Optional {
    pacer: Option<Pacer>,
    warm_up: Option<WarmUp>,
    windows: Option<ExtraWindows>,
}

const DEFAULT_POLICY: u64 = u64::MAX;
/// The overflow entry's policy: above every tag (tags are 32 bits).
const OVERFLOW_POLICY: u64 = u64::MAX - 1;

impl Entry {
    // The key's own settings, then the two layer-wide parts every entry
    // holds (the histogram slot and the system rule).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        window: Window,
        clock: SharedClock,
        limit: u64,
        policy_tag: Option<u64>,
        pinned: bool,
        breakers: &[Breaker],
        rt_histogram: &RtSlot,
        system: Option<&Arc<System>>,
        windows: Option<ExtraWindows>,
    ) -> Self {
        Entry {
            node: StatisticNode::build(
                clock,
                window.sample_count,
                window.interval_ms,
                window.strict,
            )
            .expect("the window was validated when the layer was built"),
            breakers: Breakers::new(breakers, window.sample_count, window.interval_ms),
            limit: AtomicU64::new(limit),
            policy_tag: AtomicU64::new(policy_tag.map_or(DEFAULT_POLICY, |t| t & 0xFFFF_FFFF)),
            pinned,
            optional: {
                let pacer = window.behaviours.throttle.map(|_| Pacer::new());
                let warm_up = window.behaviours.warm_up.map(|_| WarmUp::new());
                (pacer.is_some() || warm_up.is_some() || windows.is_some()).then(|| {
                    Box::new(Optional {
                        pacer,
                        warm_up,
                        windows,
                    })
                })
            },
            waiting: AtomicU64::new(0),
            rt_histogram: Arc::clone(rt_histogram),
            system: system.cloned(),
        }
    }

    /// This entry as the overflow entry: the keys that found no room in the
    /// table share it, and RateLimit fields name it `"overflow"`.
    pub(crate) fn into_overflow(self) -> Self {
        self.policy_tag.store(OVERFLOW_POLICY, Ordering::Relaxed);
        self
    }

    /// Whether this is the overflow entry.
    pub(crate) fn is_overflow(&self) -> bool {
        self.policy_tag.load(Ordering::Relaxed) == OVERFLOW_POLICY
    }

    /// The key's pacer; present when the window has a throttle.
    pub(crate) fn pacer(&self) -> Option<&Pacer> {
        self.optional.as_deref()?.pacer.as_ref()
    }

    /// The key's warm-up state; present when the window has a warm-up.
    pub(crate) fn warm_up(&self) -> Option<&WarmUp> {
        self.optional.as_deref()?.warm_up.as_ref()
    }

    /// The key's further windows; present under `limit_per`.
    #[inline]
    pub(crate) fn windows(&self) -> Option<&ExtraWindows> {
        self.optional.as_deref()?.windows.as_ref()
    }

    /// Requests of this key waiting now.
    pub(crate) fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// One more request waiting; matched by [`stop_waiting`](Self::stop_waiting).
    pub(crate) fn start_waiting(&self) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
    }

    /// A waiting request stopped waiting (passed, or was dropped).
    pub(crate) fn stop_waiting(&self) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
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

    /// Sets the limit alone, keeping the policy tag (the overflow entry's
    /// limit when the default changes).
    pub(crate) fn set_limit_only(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// The tag naming this key's own policy, or `None` on the default one.
    pub(crate) fn policy_tag(&self) -> Option<u32> {
        match self.policy_tag.load(Ordering::Relaxed) {
            DEFAULT_POLICY | OVERFLOW_POLICY => None,
            tag => Some(tag as u32),
        }
    }

    /// The breakers' decision on a request at `now`: a pass with the probe
    /// slots it took (`None`: it holds none, the usual case, which clones
    /// nothing), or a [`Reason::Breaker`](crate::flow::Reason) refusal to
    /// retry when they turn half-open (0 while a probe is out).
    #[inline]
    pub(crate) fn enter_breakers(self: &Arc<Self>, now: u64) -> Decision<Option<Probe>> {
        if self.breakers.is_empty() {
            return Decision::Pass(None);
        }
        match self.breakers.enter(now) {
            Ok(held) => Decision::Pass((!held.is_empty()).then(|| Probe {
                entry: Arc::clone(self),
                held,
            })),
            Err(half_open_in_ms) => {
                Decision::Block(Refusal::new(Reason::Breaker, half_open_in_ms, self.limit()))
            }
        }
    }

    /// Feeds a completion at `now` that took `rt_us` microseconds and
    /// `failed` or not (or `panicked`) to the key's breakers, once the key's
    /// statistics have recorded it; `probe`: the slots the request held,
    /// which it decides.
    pub(crate) fn complete_breakers(
        &self,
        now: u64,
        rt_us: u64,
        failed: bool,
        panicked: bool,
        probe: Option<Box<Probe>>,
    ) {
        if self.breakers.is_empty() {
            return;
        }
        let held = probe.map_or(ProbeSet::default(), |probe| probe.into_held());
        let done = Completion {
            now,
            rt_us,
            failed,
            panicked,
        };
        self.breakers.complete(done, &held, &self.node);
    }
}

/// The probe slots a request holds in its key's breakers. Dropped before
/// the request completes (refused by a flow rule, cancelled), it frees
/// them at once.
#[derive(Debug)]
pub(crate) struct Probe {
    entry: Arc<Entry>,
    held: ProbeSet,
}

impl Probe {
    /// The slots, for a completion that decides them; nothing is freed.
    fn into_held(mut self) -> ProbeSet {
        std::mem::take(&mut self.held)
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if !self.held.is_empty() {
            self.entry.breakers.release(&self.held);
        }
    }
}
