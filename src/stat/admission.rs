//! The admission engine: a ring of managed buckets, the cache that makes an
//! admission one compare-and-swap, and (optionally) a reservation ring and a
//! roll-up. Every method takes the time, so a `StatisticNode` can read the
//! clock once per operation.
//!
//! This file holds the managed bucket and its admission word
//! ([`AdmissionBucket`]), the ring (`MetricArray`) with its bookkeeping for
//! opening buckets, recording and admission. The ring's reads are in
//! `view`, its roll-up reads in `minute`, its reservation ring in `occupy`.
//!
//! The engine offers the *mechanism* of exact admission,
//! [`MetricArray::try_add_pass`]: "add `n` passes to the newest bucket if
//! `decide(window_pass)` says yes, in one compare-and-swap". The *rule*
//! (`window_pass + n <= limit`) lives in `crate::flow`.
//!
//! # Implementation details: exact admission
//!
//! Sentinel checks and then adds, so two threads can both see room for one
//! (alibaba/Sentinel#1592). Here the decision and the record are one
//! compare-and-swap on the admission word of the newest bucket (layout in
//! "The admission word" below).
//!
//! 1. The caller moves its time forward to the newest opened bucket if its
//!    clock lags behind it, and opens that bucket ([`MetricArray::open`]).
//! 2. It takes the passes of the older buckets in the window. Those are
//!    final for admission: whenever a newer bucket is opened, the opener
//!    sets the `SEALED` bit on every older bucket *before* publishing the new
//!    one, and an admission only succeeds on an unsealed word. So the opener
//!    sums them once, under the rotation lock, and caches the sum beside the
//!    slot (`before`); the admissions of that bucket reuse it. A pass
//!    recorded into a sealed bucket (by `add_pass` from a clock behind the
//!    newest bucket) bumps a straggler counter (`Release`) after landing;
//!    the cache is stamped with that counter, and an admission that reads
//!    (`Acquire`) a different value sums the buckets again (without writing
//!    the cache back: only the opener knows which window of the slot a sum
//!    belongs to). Either the late pass was complete before the admission
//!    began, and the admission sees the bump, or the two were concurrent and
//!    the admission may be ordered first.
//! 3. It loads the current bucket's word (`Acquire`). If the word is sealed
//!    or its round tag is not this window's, a newer bucket exists: start
//!    over at step 1. Otherwise it asks `decide` about `older + count` and,
//!    if yes (and the 47-bit count has room), swaps in `count + n`
//!    (`AcqRel`). A failed swap re-decides with the value it returned.
//!
//! So every admission is decided against the whole window as it is at the
//! moment of its swap: the older buckets cannot gain an admission after
//! being sealed, and the current one cannot change between the load and the
//! successful swap. The round tag changes every time the slot is reused, so
//! a caller delayed across whole rotations cannot succeed with a stale word
//! that happens to hold the same count (ABA), unless it slept through 65 534
//! of them. It is never 0, so no valid word equals the 0 a reset briefly
//! leaves in the word before the new round's word is stored.
//!
//! Passes recorded with `add_pass` (not through admission) still count in
//! the window; they are simply not limited.
//!
//! Exact means: in every window the ring evaluates (the buckets of
//! `(start(t) - interval, start(t)]`), admitted passes never exceed the
//! limit. An interval that is not aligned to bucket starts can hold up to
//! twice the limit under bursts (the end of one window and the start of the
//! next).
//!
//! # Strict rings
//!
//! A strict ring (built with `strict = true`) decides against one bucket
//! more: the window's buckets *and* the bucket that has just left it, the
//! one starting at `start(t) - interval`. Any interval of length `interval`,
//! wherever it starts, lies inside those `sample_count + 1` buckets, so it
//! never holds more admitted passes than the limit.
//!
//! The ring still has `sample_count` slots: the bucket that has just left
//! the window lives in the very slot the newest bucket reuses. So its opener,
//! under the rotation lock, reads the passes of the departing bucket before
//! emptying the slot (0 when the slot held an older window, or the quota
//! still reserved for that bucket if it was never opened), adds them to the
//! cached sum of older passes, and keeps them beside the slot (`before`, second
//! half) for admissions that cannot use the cache. The hot path is the same
//! one load of the cached sum and one compare-and-swap; only the opener (once
//! per bucket length) does one read more. A pass added with `add_pass` to the
//! departing bucket while it is being emptied (a caller whose clock is a whole
//! window behind, never an admission) may be missing from that figure; such
//! passes are unlimited anyway.
//!
//! Reads (statistics, `details`, `list`) still report the
//! `sample_count`-bucket window.
//!
//! # The admission word
//!
//! The managed bucket keeps the counters of a
//! [`MetricBucket`](super::MetricBucket), with the pass count packed into an
//! admission word.
//!
//! ```text
//!  63     62 ........ 47  46 ............. 0
//! [SEALED][ round tag  ][     count        ]
//! ```
//!
//! - `count`: the bucket's passes, saturating at [`pass_word::COUNT_MAX`]
//!   (about 1.4 × 10^14).
//! - `round tag`: which window of its slot the bucket holds (see
//!   `round_tag`). An admission succeeds only on a word whose tag is the
//!   one it decided for, so a caller delayed across a rotation cannot land
//!   in the next window with a stale count (ABA).
//! - `SEALED`: set once a newer bucket of the ring has been opened; an
//!   admission never succeeds on a sealed word.
//!
//! `AdmissionBucket` is crate-private: a safe public `reset` on it would zero the
//! tag and stall every admission until the clock left the bucket. Readers
//! outside the crate get [`BucketSnapshot`](super::BucketSnapshot)s.

use super::bucket::Tallies;
use super::counts::Counts;
use super::leap_array::{validate, BucketValue, LeapArray};
use super::minute::Rollup;
use super::occupy::Reservations;
use crate::error::ConfigError;
use crate::sync::{backoff, AtomicU64, Ordering};

/// Layout of the admission word (see the module docs).
pub(crate) mod pass_word {
    /// Set on a bucket's word once a newer bucket of the same ring has been
    /// opened: admissions must move on to the newer bucket.
    pub(crate) const SEALED: u64 = 1 << 63;
    pub(crate) const TAG_SHIFT: u32 = 47;
    pub(crate) const TAG_MASK: u64 = 0xFFFF << TAG_SHIFT;
    pub(crate) const COUNT_MAX: u64 = (1 << TAG_SHIFT) - 1;

    #[inline]
    pub(crate) const fn count(word: u64) -> u64 {
        word & COUNT_MAX
    }

    #[inline]
    pub(crate) const fn tag(word: u64) -> u64 {
        (word & TAG_MASK) >> TAG_SHIFT
    }

    /// The word's bits from the tag up: its round tag when the word is
    /// open, a value above `0xFFFF` when it is sealed. Comparing this with
    /// a round's tag checks both at once.
    #[inline]
    pub(crate) const fn open_tag(word: u64) -> u64 {
        word >> TAG_SHIFT
    }

    #[inline]
    pub(crate) const fn is_sealed(word: u64) -> bool {
        word & SEALED != 0
    }

    #[inline]
    pub(crate) const fn with_tag(tag: u64, count: u64) -> u64 {
        ((tag << TAG_SHIFT) & TAG_MASK) | (count & COUNT_MAX)
    }
}

/// Adds below this size go through a plain `fetch_add`; at most this much can
/// be added concurrently by any realistic number of threads before the count
/// reaches [`pass_word::COUNT_MAX`], which keeps carries out of the tag bits.
const FAST_ADD_LIMIT: u64 = 1 << 32;
const FAST_ADD_HEADROOM: u64 = 1 << 40;

/// A managed bucket (56 bytes, like `MetricBucket`).
pub(crate) struct AdmissionBucket {
    /// The admission word: seal bit, round tag, pass count.
    word: AtomicU64,
    tallies: Tallies,
}

impl Default for AdmissionBucket {
    fn default() -> Self {
        AdmissionBucket {
            word: AtomicU64::new(0),
            tallies: Tallies::new(),
        }
    }
}

impl BucketValue for AdmissionBucket {
    fn reset(&self) {
        AdmissionBucket::reset(self);
    }
}

impl AdmissionBucket {
    /// The tallies (block, success, response times, ...).
    #[inline]
    pub(crate) fn tallies(&self) -> &Tallies {
        &self.tallies
    }

    /// Admitted requests.
    #[inline]
    pub(crate) fn pass(&self) -> u64 {
        pass_word::count(self.pass_word())
    }

    /// Every counter (each read on its own).
    pub(crate) fn counts(&self) -> Counts {
        self.tallies.counts(self.pass())
    }

    /// The raw admission word.
    #[inline]
    pub(crate) fn pass_word(&self) -> u64 {
        // Acquire: pairs with the Release of `start_round`, so a reader of a
        // round's word also sees what its opener stored before it.
        self.word.load(Ordering::Acquire)
    }

    /// Adds `n` passes unconditionally (saturating) and returns the word as
    /// it was before.
    #[inline]
    pub(crate) fn add_pass_returning(&self, n: u64) -> u64 {
        // Relaxed: only a guess at the headroom; the add below decides.
        let current = self.word.load(Ordering::Relaxed);
        if n < FAST_ADD_LIMIT
            && pass_word::count(current) < pass_word::COUNT_MAX - FAST_ADD_HEADROOM
        {
            // AcqRel keeps the word's modification order usable by the
            // admission protocol, which reads it with Acquire.
            return self.word.fetch_add(n, Ordering::AcqRel);
        }
        self.add_pass_saturating(n)
    }

    #[cold]
    fn add_pass_saturating(&self, n: u64) -> u64 {
        // AcqRel / Acquire: as the fast path above.
        let mut current = self.word.load(Ordering::Acquire);
        loop {
            let count = pass_word::count(current)
                .saturating_add(n)
                .min(pass_word::COUNT_MAX);
            let next = (current & !pass_word::COUNT_MAX) | count;
            match self.word.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(previous) => return previous,
                Err(actual) => current = actual,
            }
        }
    }

    /// Replaces the word if it still equals `current`.
    #[inline]
    pub(crate) fn cas_pass_word(&self, current: u64, next: u64) -> Result<u64, u64> {
        // AcqRel on success: the admission is ordered after everything the
        // caller read to decide it. Acquire on failure: the fresh value is
        // used for the next decision.
        self.word
            .compare_exchange(current, next, Ordering::AcqRel, Ordering::Acquire)
    }

    /// Sets the seal bit, leaving count and tag alone.
    #[inline]
    pub(crate) fn seal(&self) {
        // AcqRel: the seal is ordered with the admissions on this word, so an
        // admission swapping after it fails.
        self.word.fetch_or(pass_word::SEALED, Ordering::AcqRel);
    }

    /// Tags a freshly emptied word for a new round and adds `count`, keeping
    /// any pass a late writer added since the reset (it counts in the new
    /// round, like any write behind its bucket). The word's tag and seal
    /// bits must be zero: only the bucket's opener, which emptied it, sets
    /// them.
    pub(crate) fn start_round(&self, tag: u64, count: u64) {
        debug_assert_eq!(
            self.word.load(Ordering::Relaxed) & !pass_word::COUNT_MAX,
            0,
            "start_round on a word that was not reset"
        );
        // Release: an admission that reads this round's word (Acquire) also
        // sees what the opener stored before it, the cached sum of the
        // older buckets.
        self.word
            .fetch_add(pass_word::with_tag(tag, count), Ordering::Release);
    }

    /// Empties the bucket and returns what it held. Each counter is swapped
    /// out in one atomic step, so a concurrent add is either in the result or
    /// left in the emptied bucket: never lost, never in both.
    pub(crate) fn take(&self) -> Counts {
        // AcqRel: ordered with the admissions on the word (see `seal`).
        let pass = pass_word::count(self.word.swap(0, Ordering::AcqRel));
        self.tallies.take(pass)
    }

    /// Clears every counter, the admission word included.
    pub(crate) fn reset(&self) {
        // Relaxed: the ring's owner publishes the reset with the slot's
        // stamp (Release) before anyone may write the new window.
        self.word.store(0, Ordering::Relaxed);
        self.tallies.reset();
    }
}

/// The admission ring (module docs).
pub(crate) struct MetricArray {
    pub(super) main: LeapArray<AdmissionBucket>,
    /// `None`: not occupiable, reservations are ignored.
    pub(super) reservations: Option<Reservations>,
    /// Per slot: the passes of the window's older buckets, computed when the
    /// slot's bucket was opened as the newest, packed with the value of
    /// `stragglers` at that moment (see [`before_word`]). An admission reuses
    /// it while `stragglers` is unchanged, instead of summing the older
    /// buckets on every request. `UNKNOWN` when there is nothing to reuse.
    /// Written only under the rotation lock (`Release`), read with `Acquire`.
    ///
    /// A strict ring (module docs) has twice as many entries: entry
    /// `sample_count + i` holds the passes of the bucket that slot `i`
    /// held before its current one, when that bucket is the one that has
    /// just left the window (else 0). Its length is the strict flag, so a
    /// ring that is not strict pays nothing for it.
    before: Box<[AtomicU64]>,
    /// Bumped after every pass recorded into a sealed bucket, i.e. behind
    /// the newest bucket, where the cached sums of older buckets cannot see
    /// it. `Release` on the bump, `Acquire` on the read: an admission that
    /// sees the old value may only be ordered before that late pass.
    stragglers: AtomicU64,
    /// Where buckets go when their slot is reused, if anywhere: a
    /// `StatisticNode`'s minute window.
    pub(super) rollup: Option<Rollup>,
}

/// `MetricArray::before` entry with nothing cached. Its tag field reads
/// `0xFFFF`, which no round has (see [`round_tag`]), so it matches no pass
/// word in [`before_word::unpack`].
const UNKNOWN: u64 = u64::MAX;

/// Packing of a cached sum: the round tag of the bucket it was computed
/// for (16 bits), the straggler generation (20 bits) and the sum (28 bits).
/// A sum that does not fit is not cached. The tag lets an admission check
/// that the cached sum belongs to the round its pass word is in, without
/// dividing to compute the round of the window start.
mod before_word {
    const TAG_SHIFT: u32 = 48;
    const GEN_SHIFT: u32 = 28;
    const GEN_BITS: u32 = TAG_SHIFT - GEN_SHIFT;
    const GEN_MASK: u64 = (1 << GEN_BITS) - 1;
    const SUM_MAX: u64 = (1 << GEN_SHIFT) - 1;

    pub(super) fn pack(tag: u64, generation: u64, sum: u64) -> Option<u64> {
        (sum <= SUM_MAX)
            .then_some((tag << TAG_SHIFT) | ((generation & GEN_MASK) << GEN_SHIFT) | sum)
    }

    /// The cached sum, if `word` was computed for round `tag` at straggler
    /// generation `generation`: one comparison of the entry's upper 36 bits.
    ///
    /// `tag` may be a pass word's bits from the tag up, seal bit included
    /// (`pass_word::open_tag`): a sealed word's is above 16 bits and
    /// matches no entry. [`UNKNOWN`](super::UNKNOWN) matches nothing
    /// either: its tag field reads `0xFFFF`, a tag no round has, and a pass
    /// word's tag is a round's or 0 (a word being reset).
    #[inline]
    pub(super) fn unpack(word: u64, tag: u64, generation: u64) -> Option<u64> {
        let key = (tag << GEN_BITS) | (generation & GEN_MASK);
        (word >> GEN_SHIFT == key).then_some(word & SUM_MAX)
    }
}

/// The round tag of a window start: how many whole intervals precede it,
/// modulo 2^16 - 2, plus one. Consecutive windows of one slot differ.
///
/// Never `0xFFFF`: that is the tag field of an empty cache entry
/// ([`UNKNOWN`]), so the fast path's one comparison of a pass word's tag
/// against a cache entry also rules out an empty entry.
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
    (start / interval_ms) % 0xFFFE + 1
}

impl MetricArray {
    /// A ring of `sample_count` buckets over `interval_ms`; `occupiable`
    /// adds a reservation ring.
    pub(crate) fn new(
        sample_count: usize,
        interval_ms: u64,
        occupiable: bool,
    ) -> Result<Self, ConfigError> {
        Self::build(sample_count, interval_ms, occupiable, None, false)
    }

    /// Like [`new`](Self::new), rolling buckets up into a ring of
    /// `rollup_sample_count` buckets over `rollup_interval_ms`; `strict`
    /// makes admission count the bucket that has just left the window too
    /// (module docs); a `peak_window_ms` above 0 keeps the busiest bucket's
    /// completions per rollup bucket over that long (see
    /// [`peak_success`](Self::peak_success)).
    pub(crate) fn with_rollup(
        sample_count: usize,
        interval_ms: u64,
        occupiable: bool,
        rollup_sample_count: usize,
        rollup_interval_ms: u64,
        strict: bool,
        peak_window_ms: u64,
    ) -> Result<Self, ConfigError> {
        // Validate before sizing the rollup's bookkeeping by the sample count.
        validate(sample_count, interval_ms)?;
        let rollup = Rollup::new(
            rollup_sample_count,
            rollup_interval_ms,
            sample_count,
            peak_window_ms,
        )?;
        Self::build(sample_count, interval_ms, occupiable, Some(rollup), strict)
    }

    pub(super) fn build(
        sample_count: usize,
        interval_ms: u64,
        occupiable: bool,
        rollup: Option<Rollup>,
        strict: bool,
    ) -> Result<Self, ConfigError> {
        let main = LeapArray::new(sample_count, interval_ms)?;
        let entries = if strict {
            2 * sample_count
        } else {
            sample_count
        };
        Ok(MetricArray {
            reservations: occupiable.then(|| Reservations::with_shape_of(&main)),
            // The departed entries of a strict ring start at 0: nothing has
            // left the window yet.
            before: (0..entries)
                .map(|i| AtomicU64::new(if i < sample_count { UNKNOWN } else { 0 }))
                .collect(),
            stragglers: AtomicU64::new(0),
            rollup,
            main,
        })
    }

    pub(crate) fn is_occupiable(&self) -> bool {
        self.reservations.is_some()
    }

    /// Whether admission also counts the bucket that has just left the
    /// window (module docs, "Strict rings").
    #[inline]
    pub(crate) fn is_strict(&self) -> bool {
        self.before.len() > self.main.sample_count()
    }

    /// Where a strict ring keeps the passes of the bucket slot `idx` held
    /// before its current one; `None` on a ring that is not strict.
    #[inline]
    fn departed_entry(&self, idx: usize) -> Option<&AtomicU64> {
        self.before.get(self.main.sample_count() + idx)
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

    /// The newest window start this ring, or its reservation ring, holds
    /// anything for: the newest bucket that can still count in a window.
    #[inline]
    pub(crate) fn newest_start(&self) -> Option<u64> {
        let reserved = self
            .reservations
            .as_ref()
            .and_then(Reservations::newest_start);
        self.main.newest_start().max(reserved)
    }

    /// The newest bucket start of the main ring: where admission records
    /// for a caller whose clock lags behind it.
    #[inline]
    pub(crate) fn newest_bucket_start(&self) -> Option<u64> {
        self.main.newest_start()
    }

    // --- opening buckets ------------------------------------------------------

    /// Opens the bucket for `now` and returns its slot and the start of the
    /// window the slot holds (newer than `now`'s for a clock behind it).
    #[inline]
    pub(crate) fn open(&self, now: u64) -> (usize, u64) {
        match self.main.find(now) {
            Ok(found) => found,
            Err((idx, start)) => self.open_slow(idx, start),
        }
    }

    /// Opens slot `idx` for the window `start`: the rotation protocol of
    /// `leap_array`, with this ring's bookkeeping, in order.
    #[cold]
    #[inline(never)]
    fn open_slow(&self, idx: usize, start: u64) -> (usize, u64) {
        let mut round = 0;
        loop {
            // 1. A slot already holding this window (or a newer one) is
            //    written in place.
            if let Some(held) = self.main.holding(idx, start) {
                return (idx, held);
            }
            // 2. Lock; whoever holds the lock may be opening this very slot.
            let Some(mut rotation) = self.main.try_lock_rotation() else {
                backoff(&mut round);
                continue;
            };
            // 3. Re-check under the lock.
            if let Some(held) = rotation.holding(idx, start) {
                return (idx, held);
            }
            let newest = rotation.is_newest(start);
            let bucket = self.main.value_at(idx);
            // 4a. A new newest bucket: seal every older one, so that an
            //     admission still aimed at one of them fails its swap and
            //     moves on, then cache their (now final) sum for every
            //     admission into this bucket. Done before this bucket is
            //     published, so anyone who can see it also sees the seals.
            //     An older bucket opened late caches nothing.
            let cached = if newest {
                for (other, held, older) in self.main.held_slots() {
                    if other != idx && held < start && !pass_word::is_sealed(older.pass_word()) {
                        older.seal();
                    }
                }
                // Acquire: pairs with the Release bumps of late passes.
                let generation = self.stragglers.load(Ordering::Acquire);
                let tag = round_tag(start, self.main.interval_ms());
                let mut older = self.sum_before(start);
                if let Some(entry) = self.departed_entry(idx) {
                    // Strict: the bucket leaving the window through this
                    // slot counts for every admission into the new one.
                    let departed = self.departing(idx, start, rotation.previous(idx));
                    // Release: published again by the round's word.
                    entry.store(departed, Ordering::Release);
                    older = older.saturating_add(departed);
                }
                before_word::pack(tag, generation, older).unwrap_or(UNKNOWN)
            } else {
                UNKNOWN
            };
            // Release: published again by the round's word (`start_round`).
            self.before[idx].store(cached, Ordering::Release);
            // 4b. Empty the bucket. Writers that loaded the old stamp may
            //     still add to it; their events land either before this (the
            //     old, expired window) or after it (the new one): once either
            //     way. With a roll-up, the old counts move there inside the
            //     sequence lock, which stays odd until the publication.
            let reserved = self.reserved_for(start);
            let moving = match &self.rollup {
                Some(rollup) => {
                    let moving = rollup.begin_move();
                    let counts = bucket.take();
                    let previous = rotation.previous(idx);
                    rollup.roll_up(&moving, idx, previous, counts, reserved, start);
                    let slots = self.main.sample_count();
                    rollup.raise_peak(&moving, slots, previous, counts.success, start);
                    Some(moving)
                }
                None => {
                    bucket.reset();
                    None
                }
            };
            // 4c. Start the round: the tag, plus the quota reserved for this
            //     bucket as its first passes. An older bucket opened late
            //     takes plain writes, never admissions.
            bucket.start_round(round_tag(start, self.main.interval_ms()), reserved);
            if !newest {
                bucket.seal();
                if reserved > 0 {
                    // Release: see `stragglers`.
                    self.stragglers.fetch_add(1, Ordering::Release);
                }
            }
            // 4d. Publish (Release store of the stamp), end the move, and
            //     unlock as `rotation` drops.
            rotation.publish(idx, start);
            drop(moving);
            return (idx, start);
        }
    }

    // --- recording -----------------------------------------------------------

    /// The bucket to record into at `now`, opened if needed.
    #[inline]
    pub(crate) fn current(&self, now: u64) -> &AdmissionBucket {
        let (idx, _) = self.open(now);
        self.main.value_at(idx)
    }

    /// Records `n` passes at `now`, unconditionally.
    pub(crate) fn add_pass(&self, now: u64, n: u64) {
        let previous = self.current(now).add_pass_returning(n);
        if pass_word::is_sealed(previous) {
            // Behind the newest bucket: cached sums of older buckets must be
            // recomputed to include it. Release: see `stragglers`.
            self.stragglers.fetch_add(1, Ordering::Release);
        }
    }

    /// Reserves `n` passes in the bucket containing `future_time`, for a
    /// caller whose clock reads `now` (`None` when it has none: the newest
    /// opened bucket stands in for it). Does nothing on a ring that is not
    /// occupiable.
    pub(crate) fn add_waiting(&self, now: Option<u64>, future_time: u64, n: u64) {
        let Some(reservations) = &self.reservations else {
            return;
        };
        reservations.reserve(future_time, n, |old, _passes| {
            // Matured means the bucket has started by the caller's time.
            // Reads count a matured reservation whether or not anything has
            // opened the admission ring since, so its newest bucket alone is
            // not enough: a run of reservations with no other write in
            // between would drop every one of them.
            let matured = now.is_some_and(|now| old <= now)
                || self.main.newest_start().is_some_and(|newest| old <= newest);
            if matured && self.main.held(old).is_none() {
                self.open(old);
            }
        });
    }

    /// Passes of the bucket that leaves the window when slot `idx`, which
    /// holds `previous`, is reused for the newest bucket `start`: the
    /// bucket starting one interval before `start`. It is in the slot if
    /// the slot holds it (sealed, so only unlimited `add_pass` can still
    /// change it); else only a reservation for it can hold passes.
    #[cold]
    fn departing(&self, idx: usize, start: u64, previous: Option<u64>) -> u64 {
        let Some(departed) = start.checked_sub(self.main.interval_ms()) else {
            return 0;
        };
        if previous == Some(departed) {
            return self.main.value_at(idx).pass();
        }
        self.reservations
            .as_ref()
            .and_then(|reservations| reservations.held_at(idx, departed))
            .unwrap_or(0)
    }

    /// A strict ring's bucket that has just left the window at `now`, as
    /// `(start, passes)`: still in its slot if the bucket for `now` has not
    /// been opened, else the figure its opener kept. `None` on a ring that
    /// is not strict, or when the slot has moved on past `now`'s bucket.
    pub(crate) fn departed_bucket(&self, now: u64) -> Option<(u64, u64)> {
        if !self.is_strict() {
            return None;
        }
        let (idx, current) = self.main.locate(now);
        let departed = current.checked_sub(self.main.interval_ms())?;
        match self.main.held_start(idx) {
            Some(held) if held == departed => Some((departed, self.main.value_at(idx).pass())),
            Some(held) if held == current => {
                // Acquire: pairs with the opener's Release store.
                let passes = self.departed_entry(idx)?.load(Ordering::Acquire);
                Some((departed, passes))
            }
            Some(held) if held > current => None,
            _ => Some((departed, self.departing(idx, current, None))),
        }
    }

    /// Passes reserved for the bucket starting at `start`.
    fn reserved_for(&self, start: u64) -> u64 {
        self.reservations
            .as_ref()
            .map_or(0, |reservations| reservations.reserved_for(start))
    }

    // --- admission ---------------------------------------------------------

    /// Adds `n` passes to the newest bucket if `decide(window_pass)` says
    /// yes, where `window_pass` is the window's pass count right before this
    /// add; decision and record are one compare-and-swap (module docs).
    /// `Ok(window_pass)` when added, `Err(window_pass)` when `decide` said no
    /// or the bucket's 47-bit count has no room for `n`.
    #[inline]
    pub(crate) fn try_add_pass(
        &self,
        now: u64,
        n: u64,
        decide: impl Fn(u64) -> bool,
    ) -> Result<u64, u64> {
        match self.try_add_newest(now, n, &decide) {
            Some(outcome) => outcome,
            // By value: a closure of plain values stays in registers on
            // the fast path instead of being written to the stack for the
            // slow path's sake.
            None => self.try_add_slow(now, n, decide),
        }
    }

    /// The common case, small enough to inline: `now` lies in the newest
    /// opened bucket (or behind it) and the bucket's cached sum of older
    /// passes is current for the round its word is in. `None` when any of
    /// that does not hold, or the bucket was sealed meanwhile: the general
    /// path then takes over.
    #[inline]
    fn try_add_newest(
        &self,
        now: u64,
        n: u64,
        decide: &impl Fn(u64) -> bool,
    ) -> Option<Result<u64, u64>> {
        let idx = self.main.newest_covering(now)?;
        let current = self.main.value_at(idx);
        let word = current.pass_word();
        // The word's bits from the tag up: its round's tag if it is open,
        // more than 16 bits if it is sealed (then nothing below matches).
        let tag = pass_word::open_tag(word);
        // Acquire (both): see `stragglers` and `before`.
        let generation = self.stragglers.load(Ordering::Acquire);
        let cached = self.before.get(idx)?.load(Ordering::Acquire);
        // One comparison: the cache was computed for this word's round, at
        // the current straggler generation, and the word is not sealed.
        let before = before_word::unpack(cached, tag, generation)?;
        add_if_open(current, word, tag, before, n, decide)
    }

    /// [`try_add_pass`](Self::try_add_pass) when the fast path does not
    /// apply: opens buckets, sums the older ones if the cache cannot be
    /// used, and retries after a rotation.
    #[cold]
    #[inline(never)]
    fn try_add_slow(&self, now: u64, n: u64, decide: impl Fn(u64) -> bool) -> Result<u64, u64> {
        let mut round = 0;
        loop {
            // A caller whose clock lags behind the newest opened bucket is
            // moved forward to it: admissions are serialised on the newest
            // bucket only (step 1 of the module docs).
            let t = self
                .main
                .newest_start()
                .map_or(now, |newest| now.max(newest));
            let (idx, start) = self.open(t);
            let current = self.main.value_at(idx);
            let word = current.pass_word();
            let (before, tag) = self.passes_before(idx, start, word);
            if let Some(outcome) = add_if(current, word, tag, before, n, &decide) {
                return outcome;
            }
            // Sealed or re-tagged: a newer bucket was opened after this one;
            // try again there.
            backoff(&mut round);
        }
    }

    /// Passes of the window's buckets older than the newest one, `start`,
    /// held in slot `idx` whose word read `word`, and the round tag of
    /// `start`: from the cache when it is current for that round.
    #[inline]
    fn passes_before(&self, idx: usize, start: u64, word: u64) -> (u64, u64) {
        // Acquire (both): see `stragglers` and `before`.
        let generation = self.stragglers.load(Ordering::Acquire);
        let cached = self.before[idx].load(Ordering::Acquire);
        let word_tag = pass_word::tag(word);
        if let Some(sum) = before_word::unpack(cached, word_tag, generation) {
            // The opener of this round stored the cache before the word, so
            // a matching tag names the round `start` is in, or a later one
            // whose word the admission's tag check then sees.
            return (sum, word_tag);
        }
        // No refill here: the entry does not say which window of the slot
        // it was computed for, so only the bucket's opener, under the
        // rotation lock, may write it. A caller still aimed at an older
        // window of this slot would otherwise store that window's sum after
        // the opener stored the new one, and every admission into the new
        // bucket would then miss the older buckets' passes.
        let mut sum = self.sum_before(start);
        if let Some(entry) = self.departed_entry(idx) {
            // Strict: stored by this round's opener before its word (a
            // later round's value fails the tag check in `add_if`).
            sum = sum.saturating_add(entry.load(Ordering::Acquire));
        }
        (sum, round_tag(start, self.main.interval_ms()))
    }

    /// Sums the passes of the window's buckets older than `start`.
    fn sum_before(&self, start: u64) -> u64 {
        self.main
            .window_slots(start)
            .filter(|&(_, s)| s != start)
            .filter_map(|(idx, s)| self.bucket_at(idx, s))
            .fold(0u64, |sum, b| sum.saturating_add(b.pass()))
    }
}

/// Where an admission of [`MetricArray::try_take`] landed: the slot of its
/// bucket and the round tag of that bucket, so that the passes can be given
/// back to that very bucket ([`MetricArray::give_back`]) and to no later
/// round of its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    idx: usize,
    tag: u64,
}

impl Placed {
    /// A placement that names no bucket: giving it back does nothing.
    pub(crate) const NONE: Placed = Placed { idx: 0, tag: 0 };
}

/// # Reservations that can be given back (a key's further windows)
impl MetricArray {
    /// [`try_add_pass`](Self::try_add_pass), also telling where the passes
    /// landed. The same protocol (one compare-and-swap on the newest
    /// bucket's word decides and records); kept apart so that the first
    /// window's path is not made to carry the placement.
    #[inline]
    pub(crate) fn try_take(
        &self,
        now: u64,
        n: u64,
        decide: impl Fn(u64) -> bool,
    ) -> Result<(u64, Placed), u64> {
        // The fast path of `try_add_newest`.
        if let Some(idx) = self.main.newest_covering(now) {
            let current = self.main.value_at(idx);
            let word = current.pass_word();
            let tag = pass_word::open_tag(word);
            // Acquire (both): see `stragglers` and `before`.
            let generation = self.stragglers.load(Ordering::Acquire);
            if let Some(cached) = self.before.get(idx) {
                let cached = cached.load(Ordering::Acquire);
                if let Some(before) = before_word::unpack(cached, tag, generation) {
                    if let Some(outcome) = add_if_open(current, word, tag, before, n, &decide) {
                        return outcome.map(|pass| (pass, Placed { idx, tag }));
                    }
                }
            }
        }
        // The general path of `try_add_slow`.
        let mut round = 0;
        loop {
            let t = self
                .main
                .newest_start()
                .map_or(now, |newest| now.max(newest));
            let (idx, start) = self.open(t);
            let current = self.main.value_at(idx);
            let word = current.pass_word();
            let (before, tag) = self.passes_before(idx, start, word);
            if let Some(outcome) = add_if(current, word, tag, before, n, &decide) {
                return outcome.map(|pass| (pass, Placed { idx, tag }));
            }
            backoff(&mut round);
        }
    }

    /// Takes back `n` passes that [`try_take`](Self::try_take) placed, if
    /// their bucket still holds the round they were placed in. A bucket
    /// whose slot was reused since has left every window: its passes count
    /// nowhere any more, and nothing is taken from the new round.
    ///
    /// One compare-and-swap loop on the bucket's word: it succeeds only on
    /// a word of the same round (the tag is checked on every attempt, so a
    /// reset racing the give-back is either before it, and nothing is
    /// taken, or after it, and the new round starts from the lower count).
    /// When the bucket was sealed (a newer bucket was opened meanwhile),
    /// the newer bucket's opener may have cached a sum that still holds
    /// these passes: the straggler generation is bumped after the swap, as
    /// for a late pass, so the next admission sums the older buckets again.
    /// Until then, admissions see the passes still there, and can only
    /// refuse more, never admit more. (On a strict ring, a pass given back
    /// after its bucket has left the window is still in the figure kept for
    /// that departed bucket, for at most one bucket length: again, more
    /// refusals only.)
    pub(crate) fn give_back(&self, placed: Placed, n: u64) {
        if placed == Placed::NONE || n == 0 {
            return;
        }
        let bucket = self.main.value_at(placed.idx);
        let mut word = bucket.pass_word();
        loop {
            if pass_word::tag(word) != placed.tag || pass_word::count(word) < n {
                return;
            }
            match bucket.cas_pass_word(word, word - n) {
                Ok(_) => {
                    if pass_word::is_sealed(word) {
                        // Release: see `stragglers`.
                        self.stragglers.fetch_add(1, Ordering::Release);
                    }
                    return;
                }
                Err(actual) => word = actual,
            }
        }
    }
}

/// Step 3 of exact admission: decides against the bucket's word, first
/// read as `word`, and records with one compare-and-swap. `None` once the
/// word is sealed or carries another round's tag than `tag`: a newer bucket
/// exists.
#[inline]
fn add_if(
    current: &AdmissionBucket,
    word: u64,
    tag: u64,
    before: u64,
    n: u64,
    decide: &impl Fn(u64) -> bool,
) -> Option<Result<u64, u64>> {
    // Unsealed and of round `tag`, in one comparison (`tag` is at most 16
    // bits; a sealed word's `open_tag` is not).
    if pass_word::open_tag(word) != tag {
        return None;
    }
    add_if_open(current, word, tag, before, n, decide)
}

/// [`add_if`] for a `word` already known to be open and of round `tag` (the
/// fast path's cache check proves both); a word read after a failed swap
/// is checked again here.
#[inline]
fn add_if_open(
    current: &AdmissionBucket,
    mut word: u64,
    tag: u64,
    before: u64,
    n: u64,
    decide: &impl Fn(u64) -> bool,
) -> Option<Result<u64, u64>> {
    loop {
        let count = pass_word::count(word);
        let window_pass = before.saturating_add(count);
        if n > pass_word::COUNT_MAX - count || !decide(window_pass) {
            return Some(Err(window_pass));
        }
        match current.cas_pass_word(word, word + n) {
            Ok(_) => return Some(Ok(window_pass)),
            Err(actual) if pass_word::open_tag(actual) == tag => word = actual,
            Err(_) => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_in_56_bytes() {
        assert_eq!(std::mem::size_of::<AdmissionBucket>(), 56);
    }

    #[test]
    fn pass_saturates_instead_of_corrupting_the_tag() {
        let b = AdmissionBucket::default();
        b.start_round(0xABCD, 0);
        b.add_pass_returning(u64::MAX);
        b.add_pass_returning(5);
        assert_eq!(b.pass(), pass_word::COUNT_MAX);
        assert_eq!(pass_word::tag(b.pass_word()), 0xABCD);
        assert!(!pass_word::is_sealed(b.pass_word()));
    }

    #[test]
    fn seal_keeps_count_and_tag() {
        let b = AdmissionBucket::default();
        b.start_round(7, 3);
        b.seal();
        b.add_pass_returning(2);
        let w = b.pass_word();
        assert!(pass_word::is_sealed(w));
        assert_eq!(pass_word::tag(w), 7);
        assert_eq!(b.pass(), 5);
    }

    /// The fast path compares a pass word's tag with a cache entry in one
    /// comparison and relies on the empty entry matching no word: no round
    /// may have the tag `0xFFFF`, the empty entry's tag field.
    #[test]
    fn no_round_tag_matches_an_empty_cache_entry() {
        let interval = 1_000;
        let mut seen_max = 0;
        // Every round tag there is, and one more turn of the counter.
        for round in 0..0x2_0000u64 {
            let tag = round_tag(round * interval, interval);
            assert!((1..0xFFFF).contains(&tag), "round {round}: tag {tag:#x}");
            seen_max = seen_max.max(tag);
            for generation in [0, 1, 0xF_FFFF, u64::MAX] {
                assert_eq!(
                    before_word::unpack(UNKNOWN, tag, generation),
                    None,
                    "round {round}, generation {generation:#x}"
                );
            }
        }
        assert_eq!(seen_max, 0xFFFE, "tags use their whole range but 0xFFFF");
        // A word being reset (tag 0) matches nothing either.
        assert_eq!(before_word::unpack(UNKNOWN, 0, 0xF_FFFF), None);
    }

    #[test]
    fn a_sealed_word_matches_no_cache_entry() {
        let tag = round_tag(7_000, 1_000);
        let generation = 3;
        let entry = before_word::pack(tag, generation, 42).expect("fits");
        let open = pass_word::with_tag(tag, 5);
        assert_eq!(
            before_word::unpack(entry, pass_word::open_tag(open), generation),
            Some(42)
        );
        let sealed = open | pass_word::SEALED;
        assert_eq!(
            before_word::unpack(entry, pass_word::open_tag(sealed), generation),
            None
        );
        // Another round's tag or another straggler generation: no match.
        assert_eq!(
            before_word::unpack(entry, pass_word::open_tag(open) + 1, generation),
            None
        );
        assert_eq!(
            before_word::unpack(entry, pass_word::open_tag(open), generation + 1),
            None
        );
    }

    /// The straggler generation is part of the cache key: an entry packed
    /// at one generation matches that generation only (compared modulo
    /// 2^20, the field's width), and a sum too large for its field is not
    /// cached at all.
    #[test]
    fn a_cache_entry_is_only_good_for_its_straggler_generation() {
        let tag = round_tag(3_000, 1_000);
        let entry = before_word::pack(tag, 41, 9).expect("fits");
        assert_eq!(before_word::unpack(entry, tag, 41), Some(9));
        for other in [0, 40, 42, 0xF_FFFF] {
            assert_eq!(
                before_word::unpack(entry, tag, other),
                None,
                "generation {other}"
            );
        }
        // The field keeps the low 20 bits: a whole turn later matches.
        assert_eq!(before_word::unpack(entry, tag, 41 + (1 << 20)), Some(9));
        let top = (1 << 28) - 1;
        assert_eq!(
            before_word::pack(tag, 0, top).map(|w| before_word::unpack(w, tag, 0)),
            Some(Some(top))
        );
        assert_eq!(before_word::pack(tag, 0, top + 1), None, "too large");
    }

    /// A pass recorded behind the newest bucket (into a sealed bucket, by a
    /// caller whose clock lags) bumps the straggler generation, so the next
    /// admission into the newest bucket does not trust the sum of older
    /// buckets its opener cached, and decides against the late pass too.
    #[test]
    fn a_late_pass_invalidates_the_cached_sum_of_older_buckets() {
        // Two buckets of 500 ms.
        let ring = MetricArray::new(2, 1_000, false).unwrap();
        assert_eq!(ring.try_add_pass(0, 1, |_| true), Ok(0));
        // Opening the bucket at 500 seals the one at 0 and caches its 1 pass.
        assert_eq!(ring.try_add_pass(500, 1, |_| true), Ok(1));
        // A caller whose clock still reads 0 records 5 passes there.
        ring.add_pass(0, 5);
        assert!(pass_word::is_sealed(ring.main.value_at(0).pass_word()));
        // The window holds 1 + 5 + 1 passes; the stale cache would say 1 + 1.
        assert_eq!(ring.try_add_pass(500, 1, |_| false), Err(7));
        assert_eq!(ring.try_add_pass(500, 1, |window| window < 8), Ok(7));
        assert_eq!(ring.try_add_pass(500, 1, |_| false), Err(8));
    }

    /// A strict ring decides against the bucket that has just left the
    /// window as well: its opener keeps that bucket's passes beside the
    /// slot it reuses (0 when the slot held an older window), and
    /// `departed_bucket` reports the same figure before and after the
    /// opening.
    #[test]
    fn a_strict_ring_counts_the_bucket_that_just_left_the_window() {
        // Two buckets of 500 ms; admission counts one bucket more.
        let ring = MetricArray::build(2, 1_000, false, None, true).unwrap();
        assert!(ring.is_strict());
        ring.add_pass(0, 3);
        assert_eq!(ring.try_add_pass(500, 1, |_| true), Ok(3));
        // At 1 000 the bucket at 0 leaves the window, through the slot the
        // bucket at 1 000 reuses.
        assert_eq!(ring.departed_bucket(1_000), Some((0, 3)), "still held");
        assert_eq!(ring.try_add_pass(1_000, 1, |_| false), Err(1 + 3));
        assert_eq!(ring.departed_bucket(1_000), Some((0, 3)), "kept aside");
        // Reads still report the two-bucket window.
        assert_eq!(ring.sum(1_000, |b| b.pass()), 1);
        // At 1 500 the bucket at 500 (1 pass) departs.
        assert_eq!(ring.try_add_pass(1_500, 1, |_| false), Err(1));
        // After a gap the slot held an older window: nothing departs.
        assert_eq!(ring.try_add_pass(5_000, 1, |_| false), Err(0));
        assert_eq!(ring.departed_bucket(5_000), Some((4_000, 0)));

        // A ring that is not strict counts the window alone.
        let plain = MetricArray::new(2, 1_000, false).unwrap();
        plain.add_pass(0, 3);
        assert_eq!(plain.try_add_pass(500, 1, |_| true), Ok(3));
        assert_eq!(plain.try_add_pass(1_000, 1, |_| false), Err(1));
        assert_eq!(plain.departed_bucket(1_000), None);
    }

    /// A departing bucket that was never opened can still hold passes:
    /// quota reserved for it, which reads count once it has matured.
    #[test]
    fn a_strict_ring_counts_quota_reserved_for_the_departing_bucket() {
        let ring = MetricArray::build(2, 1_000, true, None, true).unwrap();
        ring.add_waiting(Some(0), 4_500, 2);
        // At 5 500 the bucket at 4 500 departs; only its reservation held
        // passes, and the bucket at 5 000 was never opened.
        assert_eq!(ring.departed_bucket(5_500), Some((4_500, 2)));
        assert_eq!(ring.try_add_pass(5_500, 1, |_| false), Err(2));
        assert_eq!(ring.departed_bucket(5_500), Some((4_500, 2)));
    }
}
