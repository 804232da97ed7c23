//! The time-parameterised core behind `ArrayMetric`: a bucket ring plus an
//! optional ring of reservations, with exact admission. Every method takes
//! the time, so a `StatisticNode` can read the clock once per operation.

use std::sync::OnceLock;
use std::time::Duration;

use super::bucket::{pass_word, Counts};
use super::leap_array::{validate, OpenHooks};
use super::{FutureBucketLeapArray, LeapArray, MetricBucket, MetricNode, WindowWrap};
use crate::error::ConfigError;
use crate::flow::{wait_for_quota, Admission};
use crate::sync::{backoff, fence, AtomicU64, Ordering};

/// A bucket of the window as reads see it.
#[derive(Clone, Copy)]
pub(crate) enum BucketRef<'a> {
    /// The main ring holds the bucket.
    Held(&'a MetricBucket),
    /// The main ring never opened the bucket, but quota reserved for it has
    /// matured: reads count it as passes, as if the bucket had been opened.
    Reserved(u64),
}

impl BucketRef<'_> {
    pub(crate) fn pass(self) -> u64 {
        match self {
            BucketRef::Held(b) => b.pass(),
            BucketRef::Reserved(n) => n,
        }
    }

    fn with(self, f: impl FnOnce(&MetricBucket) -> u64) -> u64 {
        match self {
            BucketRef::Held(b) => f(b),
            BucketRef::Reserved(_) => 0,
        }
    }

    pub(crate) fn block(self) -> u64 {
        self.with(MetricBucket::block)
    }

    pub(crate) fn success(self) -> u64 {
        self.with(MetricBucket::success)
    }

    pub(crate) fn exception(self) -> u64 {
        self.with(MetricBucket::exception)
    }

    pub(crate) fn occupied_pass(self) -> u64 {
        self.with(MetricBucket::occupied_pass)
    }

    pub(crate) fn rt_micros(self) -> u64 {
        self.with(MetricBucket::rt_micros)
    }

    /// Every count of the bucket (a matured reservation has passes only).
    pub(crate) fn counts(self) -> Counts {
        match self {
            BucketRef::Held(b) => b.counts(),
            BucketRef::Reserved(pass) => Counts {
                pass,
                ..Counts::default()
            },
        }
    }

    pub(crate) fn min_rt_micros(self) -> u64 {
        match self {
            BucketRef::Held(b) => b.min_rt_micros(),
            BucketRef::Reserved(_) => u64::MAX,
        }
    }
}

/// Bucket ring + optional reservation ring.
pub(crate) struct MetricArray {
    main: LeapArray<MetricBucket>,
    /// `None`: not occupiable, reservations are ignored. `Some`: occupiable;
    /// the ring itself is allocated on the first reservation, so nodes that
    /// never borrow quota do not pay for it.
    borrow: Option<OnceLock<FutureBucketLeapArray>>,
    /// Per slot: the passes of the window's older buckets, computed when the
    /// slot's bucket was opened as the newest, packed with the value of
    /// `stragglers` at that moment (see [`before_word`]). An admission reuses
    /// it while `stragglers` is unchanged, instead of summing the older
    /// buckets on every request. `UNKNOWN` when there is nothing to reuse.
    before: Box<[AtomicU64]>,
    /// Bumped after every pass recorded into a sealed bucket, i.e. behind
    /// the newest bucket, where the cached sums of older buckets cannot see
    /// it. `Release` on the bump, `Acquire` on the read: an admission that
    /// sees the old value may only be ordered before that late pass.
    stragglers: AtomicU64,
    /// Where buckets go when their slot is reused, if anywhere: a
    /// `StatisticNode`'s minute window.
    rollup: Option<Rollup>,
}

/// A coarser ring the main ring rolls its buckets into as it reuses their
/// slots. Recording touches only the main ring; the rollup sees a bucket's
/// counts once the bucket leaves the main ring, and readers combine the two.
struct Rollup {
    ring: LeapArray<MetricBucket>,
    /// Per main-ring slot: the passes its current bucket started with from
    /// matured reservations. Sentinel counts borrowed quota in the minute
    /// window when it is granted (`StatisticNode::add_occupied_pass`), so
    /// these are left out of the roll-up. Written under the rotation lock,
    /// inside the sequence lock.
    prefilled: Box<[AtomicU64]>,
    /// A sequence lock around every roll-up: odd while a bucket moves from
    /// the main ring into the rollup, even otherwise. Readers retry when it
    /// changed under them, so a bucket is counted in exactly one of the two.
    /// Writers are serialised by the main ring's rotation lock.
    seq: AtomicU64,
}

/// `MetricArray::before` entry with nothing cached.
const UNKNOWN: u64 = u64::MAX;

/// Packing of a cached sum: the round tag of the bucket it was computed
/// for (16 bits), the straggler generation (20 bits) and the sum (28 bits).
/// A sum that does not fit is not cached. The tag lets an admission check
/// that the cached sum belongs to the round its pass word is in, without
/// dividing to compute the round of the window start.
mod before_word {
    const TAG_SHIFT: u32 = 48;
    const GEN_SHIFT: u32 = 28;
    const GEN_MASK: u64 = (1 << 20) - 1;
    const SUM_MAX: u64 = (1 << GEN_SHIFT) - 1;

    pub(super) fn pack(tag: u64, generation: u64, sum: u64) -> Option<u64> {
        (sum <= SUM_MAX)
            .then_some((tag << TAG_SHIFT) | ((generation & GEN_MASK) << GEN_SHIFT) | sum)
    }

    /// The cached sum, if `word` was computed for round `tag` at straggler
    /// generation `generation`.
    #[inline]
    pub(super) fn unpack(word: u64, tag: u64, generation: u64) -> Option<u64> {
        let matches = word != super::UNKNOWN
            && word >> TAG_SHIFT == tag
            && (word >> GEN_SHIFT) & GEN_MASK == generation & GEN_MASK;
        matches.then_some(word & SUM_MAX)
    }
}

/// The round tag of a window start: how many whole intervals precede it,
/// modulo 2^16 - 1, plus one. Consecutive windows of one slot differ.
///
/// Never 0: a bucket reset clears the whole pass word to 0 before the new
/// round's word is stored, and a fresh bucket's word is 0 too. With a tag of
/// 0 allowed, the first bucket of a tag-0 round (for example the first
/// interval after time 0) has the word 0 while it is empty; an admission
/// that loaded that word, stalled while a rotation reused the slot, and
/// swapped in the middle of the reset would succeed against the cleared
/// word, and the reset would then overwrite it: admitted, but counted in no
/// window.
#[inline]
fn round_tag(start: u64, interval_ms: u64) -> u64 {
    (start / interval_ms) % 0xFFFF + 1
}

impl MetricArray {
    pub(crate) fn new(
        sample_count: usize,
        interval_ms: u64,
        occupiable: bool,
    ) -> Result<Self, ConfigError> {
        Self::build(sample_count, interval_ms, occupiable, None)
    }

    /// Like [`new`](Self::new), rolling buckets up into a ring of
    /// `rollup_sample_count` buckets over `rollup_interval_ms` as their slots
    /// are reused.
    pub(crate) fn with_rollup(
        sample_count: usize,
        interval_ms: u64,
        occupiable: bool,
        rollup_sample_count: usize,
        rollup_interval_ms: u64,
    ) -> Result<Self, ConfigError> {
        // Validate before sizing `prefilled` by the sample count.
        validate(sample_count, interval_ms)?;
        let rollup = Rollup {
            ring: LeapArray::new(rollup_sample_count, rollup_interval_ms)?,
            prefilled: (0..sample_count).map(|_| AtomicU64::new(0)).collect(),
            seq: AtomicU64::new(0),
        };
        Self::build(sample_count, interval_ms, occupiable, Some(rollup))
    }

    fn build(
        sample_count: usize,
        interval_ms: u64,
        occupiable: bool,
        rollup: Option<Rollup>,
    ) -> Result<Self, ConfigError> {
        Ok(MetricArray {
            main: LeapArray::new(sample_count, interval_ms)?,
            borrow: occupiable.then(OnceLock::new),
            before: (0..sample_count).map(|_| AtomicU64::new(UNKNOWN)).collect(),
            stragglers: AtomicU64::new(0),
            rollup,
        })
    }

    pub(crate) fn leap_array(&self) -> &LeapArray<MetricBucket> {
        &self.main
    }

    pub(crate) fn is_occupiable(&self) -> bool {
        self.borrow.is_some()
    }

    fn borrow(&self) -> Option<&LeapArray<MetricBucket>> {
        self.borrow
            .as_ref()
            .and_then(OnceLock::get)
            .map(|f| &f.ring)
    }

    pub(crate) fn sample_count(&self) -> usize {
        self.main.sample_count()
    }

    pub(crate) fn interval_ms(&self) -> u64 {
        self.main.interval_ms()
    }

    pub(crate) fn window_length_ms(&self) -> u64 {
        self.main.window_length_ms()
    }

    // --- writes -------------------------------------------------------------

    /// The bucket to record into at `now`, opened if needed.
    #[inline]
    pub(crate) fn current(&self, now: u64) -> &MetricBucket {
        self.current_window(now).value()
    }

    /// Like [`current`](Self::current), with the window the bucket holds.
    #[inline]
    pub(crate) fn current_window(&self, now: u64) -> WindowWrap<'_, MetricBucket> {
        let (idx, start) = self.main.open(now, self);
        WindowWrap::new(start, self.main.window_length_ms(), self.main.value_at(idx))
    }

    /// Records `n` passes at `now`, unconditionally.
    pub(crate) fn add_pass(&self, now: u64, n: u64) {
        let previous = self.current(now).add_pass_returning(n);
        if pass_word::is_sealed(previous) {
            // Behind the newest bucket: cached sums of older buckets must be
            // recomputed to include it.
            self.stragglers.fetch_add(1, Ordering::Release);
        }
    }

    /// Reserves `n` passes in the bucket containing `future_time`, for a
    /// caller whose clock reads `now` (`None` when it has none: the newest
    /// opened bucket stands in for it). Does nothing on an array that is not
    /// occupiable.
    pub(crate) fn add_waiting(&self, now: Option<u64>, future_time: u64, n: u64) {
        let Some(cell) = &self.borrow else {
            return;
        };
        let borrow = &cell
            .get_or_init(|| FutureBucketLeapArray {
                ring: LeapArray::with_shape_of(&self.main),
            })
            .ring;
        let hooks = BorrowHooks { owner: self, now };
        let (idx, _) = borrow.open(future_time, &hooks);
        borrow.value_at(idx).add_pass(n);
    }

    // --- reads --------------------------------------------------------------

    /// The bucket starting at `start`, as reads see it.
    #[inline]
    fn bucket(&self, start: u64) -> Option<BucketRef<'_>> {
        self.bucket_at(self.main.index_of(start), start)
    }

    /// [`bucket`](Self::bucket) with the slot of `start` already known (the
    /// reservation ring has the same shape, so the same slot).
    #[inline]
    fn bucket_at(&self, idx: usize, start: u64) -> Option<BucketRef<'_>> {
        if let Some(held) = self.main.held_at(idx, start) {
            return Some(BucketRef::Held(held));
        }
        self.borrow()?
            .held_at(idx, start)
            .map(|reserved| BucketRef::Reserved(reserved.pass()))
    }

    /// The window's buckets at `now`, oldest first, with their starts.
    pub(crate) fn buckets(
        &self,
        now: u64,
    ) -> impl Iterator<Item = (u64, BucketRef<'_>)> + Clone + '_ {
        self.main
            .window_slots(now)
            .filter_map(move |(idx, start)| self.bucket_at(idx, start).map(|b| (start, b)))
    }

    /// Every count of the window at `now`, summed.
    pub(crate) fn counts(&self, now: u64) -> Counts {
        self.buckets(now)
            .fold(Counts::default(), |mut counts, (_, bucket)| {
                counts.merge(&bucket.counts());
                counts
            })
    }

    pub(crate) fn sum(&self, now: u64, f: impl Fn(BucketRef<'_>) -> u64) -> u64 {
        self.buckets(now)
            .fold(0u64, |sum, (_, b)| sum.saturating_add(f(b)))
    }

    pub(crate) fn max_success(&self, now: u64) -> u64 {
        self.buckets(now)
            .map(|(_, b)| b.success())
            .max()
            .unwrap_or(0)
    }

    pub(crate) fn min_rt(&self, now: u64) -> Option<Duration> {
        match self
            .buckets(now)
            .map(|(_, b)| b.min_rt_micros())
            .min()
            .unwrap_or(u64::MAX)
        {
            u64::MAX => None,
            micros => Some(Duration::from_micros(micros)),
        }
    }

    /// The bucket one bucket before the one containing `now`.
    pub(crate) fn previous(&self, now: u64) -> Option<BucketRef<'_>> {
        let start = self
            .main
            .start_of(now)
            .checked_sub(self.main.window_length_ms())?;
        if !self.main.in_window(start, now) {
            return None;
        }
        self.bucket(start)
    }

    /// Passes of the bucket containing `time`, if that bucket is held, or
    /// reserved and matured by `now`.
    pub(crate) fn window_pass(&self, time: u64, now: u64) -> u64 {
        let start = self.main.start_of(time);
        if let Some(held) = self.main.held(start) {
            return held.pass();
        }
        if start > self.main.start_of(now) {
            return 0;
        }
        self.bucket(start).map_or(0, |b| b.pass())
    }

    /// Reserved passes in buckets that start after `now`.
    pub(crate) fn waiting(&self, now: u64) -> u64 {
        let Some(borrow) = self.borrow() else {
            return 0;
        };
        borrow
            .held_slots()
            .filter(|&(_, start, _)| start > now)
            .fold(0u64, |sum, (_, _, b)| sum.saturating_add(b.pass()))
    }

    pub(crate) fn details(&self, now: u64) -> Vec<MetricNode> {
        self.buckets(now)
            .map(|(start, b)| MetricNode::from_bucket(start, b))
            .collect()
    }

    // --- rollup (minute window) reads -------------------------------------

    /// Folds `f` over the rollup's window at `now`: every bucket already
    /// rolled up, and every main-ring bucket not rolled up yet, each with the
    /// start of the rollup bucket it belongs to. A rollup bucket may be
    /// visited more than once (once rolled up, then once per main-ring bucket
    /// still to come). Starts from `init` again whenever a roll-up
    /// interfered. `init` without a rollup.
    pub(crate) fn rollup_fold<T: Clone>(
        &self,
        now: u64,
        init: T,
        mut f: impl FnMut(&mut T, u64, Counts),
    ) -> T {
        let Some(rollup) = &self.rollup else {
            return init;
        };
        let mut round = 0;
        loop {
            // Sequence lock, read side: even before, unchanged after.
            let seq = rollup.seq.load(Ordering::Acquire);
            if seq & 1 == 1 {
                backoff(&mut round);
                continue;
            }
            let mut acc = init.clone();
            for start in rollup.ring.window_starts(now) {
                if let Some(bucket) = rollup.ring.held(start) {
                    f(&mut acc, start, bucket.counts());
                }
            }
            let newest_main = self.main.start_of(now);
            for (slot, start, bucket) in self.main.held_slots() {
                let second = rollup.ring.start_of(start);
                if start <= newest_main && rollup.ring.in_window(second, now) {
                    let mut counts = bucket.counts();
                    // Matured reservations (prefilled passes) are left out:
                    // see `Rollup::prefilled`.
                    let prefilled = rollup.prefilled[slot].load(Ordering::Relaxed);
                    counts.pass = counts.pass.saturating_sub(prefilled);
                    f(&mut acc, second, counts);
                }
            }
            fence(Ordering::Acquire);
            if rollup.seq.load(Ordering::Relaxed) == seq {
                return acc;
            }
            backoff(&mut round);
        }
    }

    /// The rollup's window at `now`, one entry per rollup bucket (a second,
    /// for a `StatisticNode`), oldest first, empty ones left out.
    pub(crate) fn rollup_buckets(&self, now: u64) -> Vec<(u64, Counts)> {
        let mut out = self.rollup_fold(now, Vec::new(), |out, start, counts| {
            out.push((start, counts));
        });
        out.sort_unstable_by_key(|&(start, _)| start);
        out.dedup_by(|later, earlier| {
            let same = later.0 == earlier.0;
            if same {
                earlier.1.merge(&later.1);
            }
            same
        });
        out.retain(|(_, counts)| !counts.is_empty());
        out
    }

    /// Records `n` occupied passes, and as many passes, straight into the
    /// rollup at `now` (Sentinel's minute-window bookkeeping of borrowed
    /// quota; the matching prefilled passes of the main ring are left out
    /// of the roll-up, see `Rollup::prefilled`).
    pub(crate) fn add_rollup_occupied_pass(&self, now: u64, n: u64) {
        if let Some(rollup) = &self.rollup {
            let bucket = rollup.ring.current_window(now).value();
            bucket.add_occupied_pass(n);
            bucket.add_pass(n);
        }
    }

    /// Passes reserved for the bucket starting at `start`.
    fn reserved_for(&self, start: u64) -> u64 {
        self.borrow()
            .and_then(|borrow| borrow.held(start))
            .map_or(0, MetricBucket::pass)
    }

    /// The rollup's shape, if there is one: (sample count, interval).
    pub(crate) fn rollup_shape(&self) -> Option<(usize, u64)> {
        self.rollup
            .as_ref()
            .map(|r| (r.ring.sample_count(), r.ring.interval_ms()))
    }

    // --- admission ----------------------------------------------------------

    /// Admits `n` if the window's pass count plus `n` stays within `limit`,
    /// recording the passes in the same atomic step.
    #[inline]
    pub(crate) fn try_pass(&self, now: u64, n: u64, limit: u64) -> Admission {
        match self.try_pass_newest(now, n, limit) {
            Some(admission) => admission,
            None => self.try_pass_slow(now, n, limit),
        }
    }

    /// The common case, small enough to inline: `now` lies in the newest
    /// opened bucket (or behind it) and the bucket's cached sum of older
    /// passes is current for the round its pass word is in. `None` when any
    /// of that does not hold, or the bucket was sealed meanwhile: the general
    /// path then takes over.
    #[inline]
    fn try_pass_newest(&self, now: u64, n: u64, limit: u64) -> Option<Admission> {
        let idx = self.main.newest_covering(now)?;
        let current = self.main.value_at(idx);
        let word = current.pass_word();
        let tag = pass_word::tag(word);
        let generation = self.stragglers.load(Ordering::Acquire);
        let cached = self.before[idx].load(Ordering::Acquire);
        let before = before_word::unpack(cached, tag, generation)?;
        admit(current, word, tag, before, n, limit)
    }

    /// [`try_pass`](Self::try_pass) when the fast path does not apply: opens
    /// buckets, sums the older ones if the cache cannot be used, and retries
    /// after a rotation.
    #[cold]
    #[inline(never)]
    fn try_pass_slow(&self, now: u64, n: u64, limit: u64) -> Admission {
        let mut round = 0;
        loop {
            // A caller whose clock lags behind the newest opened bucket is
            // moved forward to it: admissions are serialised on the newest
            // bucket only (see "Exact admission" in the module docs).
            let t = self
                .main
                .newest_start()
                .map_or(now, |newest| now.max(newest));
            let (idx, start) = self.main.open(t, self);
            let current = self.main.value_at(idx);
            let word = current.pass_word();
            let (before, tag) = self.passes_before(idx, start, word);
            if let Some(admission) = admit(current, word, tag, before, n, limit) {
                return admission;
            }
            // Sealed or re-tagged: a newer bucket was opened after this one;
            // try again there.
            backoff(&mut round);
        }
    }

    /// Passes of the window's buckets older than the newest one, `start`,
    /// held in slot `idx` whose pass word read `word`, and the round tag of
    /// `start`: from the cache when it is current for that round.
    #[inline]
    fn passes_before(&self, idx: usize, start: u64, word: u64) -> (u64, u64) {
        let generation = self.stragglers.load(Ordering::Acquire);
        let cached = self.before[idx].load(Ordering::Acquire);
        let word_tag = pass_word::tag(word);
        if let Some(sum) = before_word::unpack(cached, word_tag, generation) {
            // The opener of this round stored the cache before the pass
            // word, so a matching tag names the round `start` is in, or a
            // later one whose word the admission's tag check then sees.
            return (sum, word_tag);
        }
        // No refill here: the entry does not say which window of the slot
        // it was computed for, so only the bucket's opener, under the
        // rotation lock, may write it. A caller still aimed at an older
        // window of this slot would otherwise store that window's sum after
        // the opener stored the new one, and every admission into the new
        // bucket would then miss the older buckets' passes.
        (
            self.sum_before(start),
            round_tag(start, self.main.interval_ms()),
        )
    }

    /// Sums the passes of the window's buckets older than `start`.
    fn sum_before(&self, start: u64) -> u64 {
        self.main
            .window_slots(start)
            .filter(|&(_, s)| s != start)
            .filter_map(|(idx, s)| self.bucket_at(idx, s))
            .fold(0u64, |sum, b| sum.saturating_add(b.pass()))
    }

    /// Milliseconds from `now` until `n` more passes fit under `limit` if
    /// nothing else passes; `None` if they never can.
    pub(crate) fn wait_for_quota(&self, now: u64, n: u64, limit: u64) -> Option<u64> {
        let buckets = self.buckets(now).map(|(s, b)| (s, b.pass()));
        wait_for_quota(buckets, now, self.main.interval_ms(), n, limit)
    }
}

/// Step 3 of "Exact admission": decides against the bucket's pass word,
/// first read as `word`, and records with one compare-and-swap. `None` once
/// the word is sealed or carries another round's tag: a newer bucket exists.
#[inline]
fn admit(
    current: &MetricBucket,
    mut word: u64,
    tag: u64,
    before: u64,
    n: u64,
    limit: u64,
) -> Option<Admission> {
    while !pass_word::is_sealed(word) && pass_word::tag(word) == tag {
        let count = pass_word::count(word);
        let window_pass = before.saturating_add(count);
        if window_pass.saturating_add(n) > limit || n > pass_word::COUNT_MAX - count {
            return Some(Admission::Block { window_pass });
        }
        match current.cas_pass_word(word, word + n) {
            Ok(_) => {
                return Some(Admission::Pass {
                    window_pass: window_pass + n,
                })
            }
            Err(actual) => word = actual,
        }
    }
    None
}

/// Steps taken while a bucket of the main ring opens.
impl OpenHooks<MetricBucket> for MetricArray {
    fn before_reset(&self, array: &LeapArray<MetricBucket>, slot: usize, start: u64, newest: bool) {
        if !newest {
            self.before[slot].store(UNKNOWN, Ordering::Release);
            return;
        }
        // A new newest bucket: seal every older one so that an admission
        // still aimed at one of them fails its compare-and-swap and moves on.
        // Runs before this bucket is published, so anyone who can see the new
        // bucket also sees the seals.
        for (idx, held, bucket) in array.held_slots() {
            if idx != slot && held < start && !pass_word::is_sealed(bucket.pass_word()) {
                bucket.seal_pass();
            }
        }
        // Sealed, the older buckets take no more admissions; cache their sum
        // for every admission into this bucket.
        let generation = self.stragglers.load(Ordering::Acquire);
        let tag = round_tag(start, self.main.interval_ms());
        let cached = before_word::pack(tag, generation, self.sum_before(start)).unwrap_or(UNKNOWN);
        self.before[slot].store(cached, Ordering::Release);
    }

    fn reset_value(&self, bucket: &MetricBucket, slot: usize, previous: Option<u64>, start: u64) {
        let Some(rollup) = &self.rollup else {
            bucket.reset();
            return;
        };
        // Sequence lock, write side: odd, fence, move the counts, publish
        // the new window, even (in `after_publish`), so that readers never
        // pair the old window's stamp with the new window's bookkeeping.
        let seq = rollup.seq.load(Ordering::Relaxed);
        rollup.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        let mut counts = bucket.take();
        let prefilled = rollup.prefilled[slot].swap(self.reserved_for(start), Ordering::Relaxed);
        counts.pass = counts.pass.saturating_sub(prefilled);
        if let Some(previous) = previous {
            let second = rollup.ring.start_of(previous);
            // A bucket older than the rollup's window has nothing to add.
            if !counts.is_empty() && rollup.ring.in_window(second, start) {
                rollup.ring.current_window(previous).value().absorb(&counts);
            }
        }
    }

    fn after_publish(&self) {
        if let Some(rollup) = &self.rollup {
            // Odd since `reset_value`; only the rotation lock holder writes.
            rollup.seq.fetch_add(1, Ordering::Release);
        }
    }

    fn after_reset(&self, bucket: &MetricBucket, start: u64, newest: bool) {
        // Quota reserved for this bucket becomes its first passes.
        let reserved = self.reserved_for(start);
        // Not a plain store: a late writer's pass that landed after the
        // reset must not be overwritten.
        bucket.start_round(round_tag(start, self.main.interval_ms()), reserved);
        if !newest {
            // An older bucket opened late (a clock behind the others): it
            // takes plain writes, never admissions.
            bucket.seal_pass();
            if reserved > 0 {
                self.stragglers.fetch_add(1, Ordering::Release);
            }
        }
    }
}

/// Steps taken while a bucket of the reservation ring opens.
struct BorrowHooks<'a> {
    owner: &'a MetricArray,
    /// The reserving caller's time, if it has a clock.
    now: Option<u64>,
}

impl OpenHooks<MetricBucket> for BorrowHooks<'_> {
    fn before_reset(
        &self,
        array: &LeapArray<MetricBucket>,
        slot: usize,
        _start: u64,
        _newest: bool,
    ) {
        // The slot's old reservation may have matured without the main ring
        // ever opening its bucket; open it now so the passes are not dropped
        // with the reservation. (Lock order: reservation ring, then main.)
        if let Some(old) = array.held_start(slot) {
            let main = &self.owner.main;
            // Matured means the bucket has started by the caller's time.
            // Reads count a matured reservation whether or not anything has
            // opened the main ring since, so the main ring's newest bucket
            // alone is not enough: a run of reservations with no other
            // write in between would drop every one of them here.
            let matured = self.now.is_some_and(|now| old <= now)
                || main.newest_start().is_some_and(|newest| old <= newest);
            if matured && array.value_at(slot).pass() > 0 && main.held(old).is_none() {
                main.open(old, self.owner);
            }
        }
    }
}
