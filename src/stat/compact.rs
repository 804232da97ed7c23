//! TEMPORARY: the interface of the compact window, delegating to a full
//! node so that the layer integration can be built and tested before the
//! real one is merged. Removed before the merge.

use std::sync::OnceLock;

use crate::clock::SharedClock;
use crate::flow::{self, Decision, Pass};
use crate::stat::StatisticNode;

pub(crate) const COMPACT_MAX_BUCKETS: usize = 10;
pub(crate) const COMPACT_MAX_LIMIT: u64 = 65_535;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CompactShape {
    pub(crate) sample_count: usize,
    pub(crate) interval_ms: u64,
    pub(crate) strict: bool,
}

impl CompactShape {
    pub(crate) fn bucket_ms(&self) -> u64 {
        self.interval_ms / self.sample_count as u64
    }
}

#[derive(Debug, Default)]
pub(crate) struct CompactWindow(OnceLock<StatisticNode>);

impl CompactWindow {
    pub(crate) const fn new() -> Self {
        CompactWindow(OnceLock::new())
    }
    fn node(&self, s: &CompactShape) -> &StatisticNode {
        self.0.get_or_init(|| {
            StatisticNode::build(SharedClock::system(), s.sample_count, s.interval_ms, s.strict)
                .unwrap()
        })
    }
    pub(crate) fn effective_now(&self, s: &CompactShape, now: u64) -> u64 {
        self.node(s).effective_now(now)
    }
    pub(crate) fn lag(&self, s: &CompactShape, now: u64, at: u64) -> u64 {
        self.node(s).lag(now, at)
    }
    pub(crate) fn decide(
        &self,
        s: &CompactShape,
        (at, behind): (u64, u64),
        limit: u64,
        overflow: bool,
    ) -> Decision<Pass> {
        flow::window(self.node(s), (at, behind), limit, s.interval_ms, || overflow)
    }
    pub(crate) fn record_block(&self, s: &CompactShape, at: u64) {
        self.node(s).record_block_at(at, 1)
    }
    pub(crate) fn pass_reset_ms(
        &self,
        s: &CompactShape,
        at: u64,
        behind: u64,
        limit: u64,
        window_pass: u64,
    ) -> u64 {
        flow::pass_reset_ms(self.node(s), at, behind, limit, window_pass)
    }
    pub(crate) fn window_counts(&self, s: &CompactShape, now: u64) -> (u64, u64) {
        let c = self.node(s).window_counts(now);
        (c.pass, c.block)
    }
    pub(crate) fn is_idle(&self, s: &CompactShape, now: u64) -> bool {
        let n = self.node(s);
        n.is_idle_at(n.effective_now(now))
    }
}
