//! The minute window's store: `Rollup`, the coarser ring an admission ring
//! rolls its buckets into (its read side, [`MinuteWindow`](super::MinuteWindow),
//! is with the admission ring's reads in `view`).
//!
//! # The roll-up
//!
//! Recording touches only the admission ring (the second window). When the
//! admission ring reuses a slot, its opener takes every counter of the old
//! bucket out (`swap`: a late writer's add is either taken or left for the
//! new bucket, never both) and adds them to the rollup bucket (the second)
//! the old bucket started in. Reads of the rollup add the admission ring's
//! buckets not rolled up yet. So a request costs one bucket update, not two.
//!
//! ## The sequence lock
//!
//! A bucket must never be counted in both places, or in neither, by a
//! reader. [`Rollup::seq`] is odd while a bucket moves and until the
//! admission ring has published the slot's new window; writers are
//! serialised by the admission ring's rotation lock. The write side is a
//! [`Move`] guard (odd on creation, `Release` fence; even again on drop,
//! `Release`), the read side [`Rollup::read`] (`Acquire` load, read,
//! `Acquire` fence, compare, retry).
//!
//! ## Lifetime totals
//!
//! Exporters need counters that only grow, while both rings forget. So once
//! an exporter has asked for them ([`want_lifetime_totals`]), the opener
//! also adds every bucket it moves to the rollup's lifetime totals, whether
//! or not the bucket is still inside the minute window. That is one more
//! bucket update per rotation (at most one per admission bucket length),
//! never one per request. A key's lifetime totals are then those plus the
//! admission ring's buckets not moved yet, read under the same sequence
//! lock, so every event is counted exactly once. The totals are kept in a
//! table beside the rollups ([`totals`]); until an exporter asks, nothing is
//! kept and a rotation pays one relaxed load.
//!
//! ## Peaks
//!
//! A rollup bucket sums the admission buckets it took in, so the busiest of
//! them is lost. A rollup built with a peak window also keeps, per rollup
//! bucket within that window, the most completions of one admission bucket
//! moved into it: one word per rollup bucket, written by the opener inside
//! the [`Move`] (one compare and store per rotation), read under the same
//! sequence lock. The layer-wide node of a system rule keeps them for the
//! BBR estimate, whose busiest bucket spans 10 s (Kratos BBR's window);
//! every other node's rollup has none and pays nothing for them.

use std::sync::atomic::AtomicBool;

use super::bucket::MetricBucket;
use super::counts::Counts;
use super::leap_array::LeapArray;
use crate::error::ConfigError;
use crate::sync::{backoff, fence, AtomicU64, Ordering};

/// A coarser ring the admission ring rolls its buckets into.
pub(crate) struct Rollup {
    ring: LeapArray<MetricBucket>,
    /// The first word per admission-ring slot: the passes its current
    /// bucket started with from matured reservations. Sentinel counts
    /// borrowed quota in the minute window when it is granted
    /// (`StatisticNode::add_occupied_pass`), so these are left out of the
    /// roll-up. Then, with a peak window, one word per peak entry (module
    /// docs, "Peaks"; see [`peak`]): its length is the setting, so a rollup
    /// without peaks pays nothing for them. Written inside a [`Move`].
    prefilled: Box<[AtomicU64]>,
    /// The sequence lock (module docs): odd while a bucket moves.
    seq: AtomicU64,
}

/// Whether any exporter wants lifetime totals (see
/// [`want_lifetime_totals`]). Process-wide, so that the statistics need no
/// setting for it: one relaxed load per bucket rotation.
static LIFETIME_WANTED: AtomicBool = AtomicBool::new(false);

/// Starts keeping lifetime totals for every rollup, from its next bucket
/// move on. Until an exporter calls this, no rollup pays anything for them.
#[cfg_attr(not(feature = "prometheus"), allow(dead_code))]
pub(crate) fn want_lifetime_totals() {
    LIFETIME_WANTED.store(true, Ordering::Relaxed);
}

/// The lifetime totals of every rollup that has moved a bucket since they
/// were wanted (module docs, "Lifetime totals"), kept beside the rollups
/// rather than in them, so that a node's size does not change with
/// exporters. Each rollup is found by the address of its `prefilled`
/// allocation: stable when the rollup itself moves, unique while it lives,
/// and removed from here when it drops. Sharded by that address; a shard's
/// lock is taken once per bucket move of the rollups it holds and once per
/// exporter read, never per request.
mod totals {
    use std::collections::HashMap;
    use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};

    use super::Counts;

    const SHARDS: usize = 64;

    type Shard = Mutex<HashMap<usize, Counts>>;

    static TOTALS: LazyLock<Box<[Shard]>> =
        LazyLock::new(|| (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect());

    fn shard(id: usize) -> MutexGuard<'static, HashMap<usize, Counts>> {
        // Allocations are at least 8-byte aligned: skip the zero bits.
        TOTALS[(id >> 4) % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `counts` to rollup `id`'s totals (pass, block, success,
    /// exception and response time; the other fields stay empty).
    pub(super) fn add(id: usize, counts: &Counts) {
        let mut shard = shard(id);
        let total = shard.entry(id).or_default();
        total.pass = total.pass.saturating_add(counts.pass);
        total.block = total.block.saturating_add(counts.block);
        total.success = total.success.saturating_add(counts.success);
        total.exception = total.exception.saturating_add(counts.exception);
        total.rt_micros = total.rt_micros.saturating_add(counts.rt_micros);
    }

    /// Rollup `id`'s totals so far.
    pub(super) fn get(id: usize) -> Counts {
        shard(id).get(&id).copied().unwrap_or_default()
    }

    /// Forgets rollup `id` (it is dropping).
    pub(super) fn remove(id: usize) {
        shard(id).remove(&id);
    }
}

/// A peak entry's word: the index of its rollup bucket (its start over the
/// bucket length) in the high 32 bits, modulo 2^32, and the most
/// completions of one admission bucket moved into that rollup bucket in the
/// low 32, saturating. An entry whose index differs from the bucket asked
/// for holds an older bucket (or none: the empty word is index 0 with 0
/// completions, which reads as nothing).
mod peak {
    const INDEX_SHIFT: u32 = 32;
    const PEAK_MASK: u64 = (1 << INDEX_SHIFT) - 1;

    /// The word of rollup bucket number `index` with `peak` completions.
    pub(super) fn pack(index: u64, peak: u64) -> u64 {
        (index << INDEX_SHIFT) | peak.min(PEAK_MASK)
    }

    /// The completions `word` holds for rollup bucket number `index`, 0 when
    /// it holds another bucket.
    pub(super) fn of(word: u64, index: u64) -> u64 {
        if word >> INDEX_SHIFT == index & PEAK_MASK {
            word & PEAK_MASK
        } else {
            0
        }
    }
}

/// One bucket moving into the rollup: the write side of the sequence lock.
/// The admission ring's opener holds it from before it takes the old
/// bucket's counts until after it published the new window.
pub(crate) struct Move<'a> {
    rollup: &'a Rollup,
}

impl Drop for Rollup {
    fn drop(&mut self) {
        if LIFETIME_WANTED.load(Ordering::Relaxed) {
            totals::remove(self.id());
        }
    }
}

impl Drop for Move<'_> {
    fn drop(&mut self) {
        // Release: a reader that sees the even value (Acquire) sees the
        // moved counts and the new window's stamp. Odd since `begin_move`;
        // only the rotation lock holder writes.
        self.rollup.seq.fetch_add(1, Ordering::Release);
    }
}

impl Rollup {
    /// A rollup of `sample_count` buckets over `interval_ms` for an
    /// admission ring of `main_sample_count` slots; with a `peak_window_ms`
    /// above 0 it keeps the peaks (module docs) of the rollup buckets that
    /// start within that long before a read.
    pub(crate) fn new(
        sample_count: usize,
        interval_ms: u64,
        main_sample_count: usize,
        peak_window_ms: u64,
    ) -> Result<Self, ConfigError> {
        let ring = LeapArray::new(sample_count, interval_ms)?;
        // The buckets that start in [now - window, now]: one more than fit
        // in the window when it starts on a bucket's start.
        let peaks = match peak_window_ms {
            0 => 0,
            window => usize::try_from(window.div_ceil(ring.window_length_ms()) + 1)
                .unwrap_or(usize::MAX)
                .min(sample_count),
        };
        Ok(Rollup {
            ring,
            prefilled: (0..main_sample_count + peaks)
                .map(|_| AtomicU64::new(0))
                .collect(),
            seq: AtomicU64::new(0),
        })
    }

    /// The rollup's shape: (sample count, interval).
    pub(crate) fn shape(&self) -> (usize, u64) {
        (self.ring.sample_count(), self.ring.interval_ms())
    }

    /// Length of one rollup bucket.
    pub(crate) fn window_length_ms(&self) -> u64 {
        self.ring.window_length_ms()
    }

    /// Start of the rollup bucket containing `time`.
    pub(crate) fn start_of(&self, time: u64) -> u64 {
        self.ring.start_of(time)
    }

    /// Whether the rollup bucket starting at `start` is in the window at
    /// `now`.
    pub(crate) fn in_window(&self, start: u64, now: u64) -> bool {
        self.ring.in_window(start, now)
    }

    /// Starts moving a bucket (write side; the caller holds the admission
    /// ring's rotation lock).
    pub(crate) fn begin_move(&self) -> Move<'_> {
        // Relaxed: only the rotation lock holder writes `seq`; the fence
        // orders the odd value before the moves that follow.
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        Move { rollup: self }
    }

    /// Inside a [`Move`]: adds `counts`, taken from the admission ring's
    /// slot `slot` that held the window `previous` (if any), to the rollup
    /// at `now`, leaving out the passes the bucket started with from
    /// reservations, and records `prefill` as what the slot's new bucket
    /// starts with.
    pub(crate) fn roll_up(
        &self,
        _move: &Move<'_>,
        slot: usize,
        previous: Option<u64>,
        mut counts: Counts,
        prefill: u64,
        now: u64,
    ) {
        // Lifetime totals take the bucket as it was, prefilled passes
        // included, and whatever window it held (module docs).
        if LIFETIME_WANTED.load(Ordering::Relaxed) && !counts.is_empty() {
            totals::add(self.id(), &counts);
        }
        // Relaxed: inside the sequence lock, which orders it for readers.
        let prefilled = self.prefilled[slot].swap(prefill, Ordering::Relaxed);
        counts.pass = counts.pass.saturating_sub(prefilled);
        if let Some(previous) = previous {
            let second = self.ring.start_of(previous);
            // A bucket older than the rollup's window has nothing to add.
            if !counts.is_empty() && self.ring.in_window(second, now) {
                self.ring.current_window(previous).value().absorb(&counts);
            }
        }
    }

    /// The peak entries (module docs): the words after the admission-ring
    /// slots' prefilled passes; empty without a peak window.
    fn peaks(&self, main_sample_count: usize) -> &[AtomicU64] {
        self.prefilled.get(main_sample_count..).unwrap_or_default()
    }

    /// Inside a [`Move`], after [`roll_up`](Self::roll_up) of the same
    /// bucket: raises the peak (module docs) of the rollup bucket that the
    /// admission bucket `previous` (if any) belongs to, to `success`, that
    /// bucket's completions, when it is in the rollup's window at `now`.
    /// Nothing without a peak window (the admission ring has
    /// `main_sample_count` slots).
    pub(crate) fn raise_peak(
        &self,
        _move: &Move<'_>,
        main_sample_count: usize,
        previous: Option<u64>,
        success: u64,
        now: u64,
    ) {
        let peaks = self.peaks(main_sample_count);
        let Some(previous) = previous else {
            return;
        };
        if peaks.is_empty() || success == 0 {
            return;
        }
        let start = self.ring.start_of(previous);
        if !self.ring.in_window(start, now) {
            return;
        }
        let index = start / self.ring.window_length_ms();
        let entry = &peaks[(index % peaks.len() as u64) as usize];
        // Relaxed: inside the sequence lock, which orders it for readers;
        // writers are serialised by the admission ring's rotation lock.
        let held = peak::of(entry.load(Ordering::Relaxed), index);
        if success > held {
            entry.store(peak::pack(index, success), Ordering::Relaxed);
        }
    }

    /// The most completions of one admission bucket moved into a rollup
    /// bucket that starts in `[since, now]` (no sequence lock: call inside
    /// [`read`](Self::read)); 0 without a peak window. Reads one word per
    /// rollup bucket in the range, at most the entries kept.
    pub(crate) fn peak_since(&self, main_sample_count: usize, since: u64, now: u64) -> u64 {
        let peaks = self.peaks(main_sample_count);
        if peaks.is_empty() || since > now {
            return 0;
        }
        let length = self.ring.window_length_ms();
        let first = since.div_ceil(length);
        let last = self.ring.start_of(now) / length;
        let mut best = 0;
        // More buckets than entries only for a range longer than the peak
        // window: the newest are the ones kept.
        let first = first.max(last.saturating_sub(peaks.len() as u64 - 1));
        for index in first..=last {
            let entry = &peaks[(index % peaks.len() as u64) as usize];
            // Relaxed: inside `read`, whose fences order it.
            best = best.max(peak::of(entry.load(Ordering::Relaxed), index));
        }
        best
    }

    /// Passes the admission ring's slot `slot` started with from matured
    /// reservations (left out of the roll-up).
    pub(crate) fn prefilled(&self, slot: usize) -> u64 {
        // Relaxed: read inside `read`, whose fences order it.
        self.prefilled[slot].load(Ordering::Relaxed)
    }

    /// Runs `body` until no bucket moved while it ran (read side of the
    /// sequence lock) and returns its last result.
    pub(crate) fn read<T>(&self, mut body: impl FnMut() -> T) -> T {
        let mut round = 0;
        loop {
            // Acquire: pairs with the Release of the last `Move` drop.
            let seq = self.seq.load(Ordering::Acquire);
            if seq & 1 == 1 {
                backoff(&mut round);
                continue;
            }
            let result = body();
            // Acquire fence: the reads above happen before the re-check.
            fence(Ordering::Acquire);
            // Relaxed: ordered by the fence.
            if self.seq.load(Ordering::Relaxed) == seq {
                return result;
            }
            backoff(&mut round);
        }
    }

    /// Every count moved out of the admission ring so far: pass, block,
    /// success, exception and response time, the other fields empty (no
    /// sequence lock: call inside [`read`](Self::read)).
    pub(crate) fn moved_total(&self) -> Counts {
        if LIFETIME_WANTED.load(Ordering::Relaxed) {
            totals::get(self.id())
        } else {
            Counts::default()
        }
    }

    /// This rollup's name in [`totals`]: the address of its `prefilled`
    /// allocation (never empty: one word per admission-ring slot).
    fn id(&self) -> usize {
        self.prefilled.as_ptr() as usize
    }

    /// Calls `f` with every rollup bucket in the window at `now` and its
    /// start (no sequence lock: call inside [`read`](Self::read)).
    pub(crate) fn for_each_rolled(&self, now: u64, mut f: impl FnMut(u64, Counts)) {
        // Slots and starts together: no division per bucket.
        for (idx, start) in self.ring.window_slots(now) {
            if let Some(bucket) = self.ring.held_at(idx, start) {
                f(start, bucket.counts());
            }
        }
    }

    /// Records `n` occupied passes, and as many passes, straight into the
    /// rollup at `now` (Sentinel's minute-window bookkeeping of borrowed
    /// quota; the matching prefilled passes of the admission ring are left
    /// out of the roll-up).
    pub(crate) fn add_occupied_pass(&self, now: u64, n: u64) {
        let bucket = self.ring.current_window(now).value();
        bucket.add_occupied_pass(n);
        bucket.add_pass(n);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    // The ring that feeds a rollup, for the test of a whole move.
    use crate::stat::admission::MetricArray;

    /// A read whose body overlapped a bucket move (the sequence number
    /// changed while it ran) runs again, and returns the later result.
    #[test]
    fn a_read_that_overlaps_a_move_runs_again() {
        let rollup = Rollup::new(60, 60_000, 2, 0).unwrap();
        let mut runs = 0;
        let last = rollup.read(|| {
            runs += 1;
            if runs == 1 {
                drop(rollup.begin_move());
            }
            runs
        });
        assert_eq!(last, 2, "the first run saw a move and was discarded");
        // No move in between: one run.
        let mut runs = 0;
        rollup.read(|| runs += 1);
        assert_eq!(runs, 1);
    }

    /// While a bucket moves (from before its counts are taken until the
    /// new window is published) no read body runs: a reader waits for the
    /// move to end.
    #[test]
    fn a_read_waits_for_a_move_to_end() {
        let rollup = Rollup::new(60, 60_000, 2, 0).unwrap();
        let moving = rollup.begin_move();
        let ran = AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| rollup.read(|| ran.store(true, Ordering::Relaxed)));
            std::thread::sleep(Duration::from_millis(50));
            assert!(!ran.load(Ordering::Relaxed), "a read ran during a move");
            drop(moving);
            reader.join().unwrap();
        });
        assert!(
            ran.load(Ordering::Relaxed),
            "the read ran once the move ended"
        );
    }

    /// A rollup with a peak window keeps, per second within it, the most
    /// completions of one admission bucket moved into that second; one
    /// without keeps none.
    #[test]
    fn a_moved_bucket_leaves_its_completions_as_the_peak_of_its_second() {
        // Four buckets of 250 ms, a peak window of 3 s.
        let ring = MetricArray::with_rollup(4, 1_000, true, 60, 60_000, false, 3_000).unwrap();
        let plain = MetricArray::with_rollup(4, 1_000, true, 60, 60_000, false, 0).unwrap();
        for ring in [&ring, &plain] {
            for (at, n) in [(0, 7), (250, 9), (500, 2), (1_000, 4)] {
                ring.current(at).tallies().add_success(n);
            }
            // The buckets of second 0 move into the rollup as their slots
            // are reused.
            for at in [1_250, 1_500, 1_750] {
                ring.current(at);
            }
        }
        // The peak of second 0 (9, from the rollup), then of second 1 (4,
        // still in the admission ring).
        assert_eq!(ring.peak_success(1_750, 0), 9);
        assert_eq!(ring.peak_success(1_750, 1), 4);
        assert_eq!(plain.peak_success(1_750, 0), 4, "only the ring's buckets");
        // Four seconds on, second 4's entry is the one second 0 took: it
        // reads as nothing for second 4.
        assert_eq!(ring.peak_success(4_100, 1_100), 0);
        // A range longer than the peak window reads its newest seconds.
        assert_eq!(ring.peak_success(4_100, 0), 4);
    }

    /// A bucket the admission ring reuses moves into the rollup once: reads
    /// before and after the move see the same minute, and passes the bucket
    /// started with from matured reservations are left out of it.
    #[test]
    fn a_moved_bucket_is_counted_once() {
        // Two buckets of 500 ms rolling up into seconds.
        let ring = MetricArray::with_rollup(2, 1_000, true, 60, 60_000, false, 0).unwrap();
        ring.add_pass(0, 5);
        ring.add_pass(500, 1);
        ring.add_waiting(Some(500), 1_200, 4);
        let pass = |now| ring.rollup_fold(now, 0, |sum, _, counts| *sum += counts.pass);
        assert_eq!(pass(900), 6, "nothing moved yet");
        // Opening the bucket at 1 000 moves the one at 0 into second 0; the
        // bucket at 1 000 starts with the 4 reserved passes, not rolled up.
        ring.add_pass(1_000, 2);
        assert_eq!(pass(1_000), 8);
        assert_eq!(
            ring.rollup_buckets(1_000)
                .iter()
                .map(|(start, counts)| (*start, counts.pass))
                .collect::<Vec<_>>(),
            [(0, 6), (1_000, 2)]
        );
    }
}
