//! Leases: several passes of a hot key's current bucket, reserved in Redis
//! in one round trip and spent by this replica without asking again.
//!
//! # How a lease is taken
//!
//! A request that finds no leased pass asks the script for `want` passes
//! instead of one. The script grants `min(want, room)` when at least its
//! own pass fits (`room` is `limit` minus the passes its window counts, so
//! the window never holds more than the limit) and records them all, at
//! once, as passes of the bucket that is current on the server. The caller
//! keeps one; the rest go to this key's pool. Later requests take from the
//! pool, with no round trip, until it is empty or the bucket ends.
//!
//! # Why it never over-admits
//!
//! A leased pass is spent only before its bucket ends (on a deadline that
//! errs early, see [`KeyLease::granted`]), so every admission lies in the
//! bucket its pass was recorded in, and each bucket's count in Redis is at
//! least the admissions made in it. For any bucket-aligned window, the last
//! script call that granted passes in one of its buckets saw every earlier
//! bucket's count and granted only up to the limit: the window holds at
//! most `limit` admissions, whatever the number of replicas, the order of
//! their calls or the order their replies arrive in. Passes not spent by
//! the end of their bucket are never given back: they stay counted, and
//! expire with the bucket ("stranded"), which can only refuse more.
//!
//! # How big a lease is
//!
//! [`KeyLease::step`]: the passes this replica expects to need for the key
//! over a short cover time (`COVER_RTTS` = 16 round trips, at most 1/8 of
//! a rate tick), from the arrivals it counted in the last 100 ms tick,
//! less what it holds or has asked for already; at least 1, at most
//! [`max_lease`]. The script cuts a lease further to what that rate brings
//! in the part of the bucket it can still be spent in (`time_cap`), so a
//! lease taken near a bucket's end is small. A key needs at least 16
//! arrivals in a tick (160/s) for a lease of 2: a key that sees one
//! request a second always asks for exactly one pass, the call it made
//! before leases.
//!
//! # Requests that queue
//!
//! A request that finds no pass in the pool while a call for the key is in
//! flight waits for that call (the store bounds the wait by its timeout).
//! The next call then asks for the waiting requests too (`batch`, not cut
//! to the rate or to [`max_lease`], only to the room left), and they take
//! their passes from the pool when its answer comes. So one call decides
//! the requests of a replica that queue behind another, leases or not.
//!
//! # What a lease can strand
//!
//! At most `max_lease - 1` passes per replica per bucket for a key are
//! left in a pool when the bucket ends, and [`max_lease`] is at most
//! `limit / (span * LEASE_SHARE)` (the script caps it too, on the limit it
//! applies). So across `N` replicas a window of `span` buckets strands at
//! most `N * limit / LEASE_SHARE` passes (about 9.4 % of the limit for
//! three replicas) in the worst case: demand that stops right after each
//! lease. To that add the passes of a batch whose waiting requests went
//! away (dropped, or past the timeout) before its answer, when no other
//! request takes them before the bucket ends. Under steady load the pool
//! is spent long before the bucket ends. A limit below
//! `2 * span * LEASE_SHARE` (640 for the default window) never leases.

use std::collections::HashMap;

/// Length of the tick a key's arrival rate is counted over, in µs.
pub(crate) const TICK_US: u64 = 100_000;

/// A lease covers the arrivals expected over this many round trips.
pub(crate) const COVER_RTTS: u64 = 16;

/// A lease is at most `limit / (span * LEASE_SHARE)` passes (and one when
/// that is less than two).
pub(crate) const LEASE_SHARE: u64 = 32;

/// Slack taken off a lease's deadline when the server's clock cuts the
/// buckets, on top of 1/1000 of the time left (see [`slack_us`]).
pub(crate) const SERVER_CLOCK_SLACK_US: u64 = 200;

/// What is taken off a lease's deadline when the server's clock cuts the
/// buckets, for a bucket that ends `ends_us` after the server read its
/// time: the server's clock and this process's may run at different
/// rates (NTP slews a clock by at most 500 ppm; this allows 1000 ppm), and
/// 200 µs more.
pub(crate) fn slack_us(ends_us: u64) -> u64 {
    SERVER_CLOCK_SLACK_US + ends_us / 1000
}

/// The script's cap on a lease from the time left in its bucket: at most
/// what `rate` arrivals per tick bring in the `ends_us - lag_us` µs the
/// lease can still be spent in (and at least the caller's own pass).
/// `admit.lua` computes the same; the model of the script uses this.
#[cfg(test)]
pub(crate) fn time_cap(rate: u64, ends_us: u64, lag_us: u64) -> u64 {
    (rate.saturating_mul(ends_us.saturating_sub(lag_us)) / TICK_US).max(1)
}

/// The time at the end of a bucket in which a lease granted then cannot be
/// spent: the round trip, and the deadline's slack (`slack_us`, 0 under a
/// manual clock).
pub(crate) fn lag_us(rtt_us: u64, slack_us: u64) -> u64 {
    rtt_us.saturating_add(slack_us)
}

/// Most keys with lease state at once; beyond that a key asks for one pass
/// at a time, as before leases.
pub(crate) const MAX_LEASED_KEYS: usize = 4096;

/// The largest lease for `limit` on a window of `span` counted buckets.
pub(crate) fn max_lease(limit: u64, span: u64) -> u64 {
    (limit / span.max(1).saturating_mul(LEASE_SHARE)).max(1)
}

/// What a script call granted, as the lease logic needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// Passes recorded by the call (the caller's own included when it kept
    /// one).
    pub(crate) granted: u64,
    /// Start of the bucket they were recorded in (server's time, ms).
    pub(crate) bucket_start: u64,
    /// µs from the call's time (the server's) to the end of that bucket.
    pub(crate) ends_us: u64,
    /// Passes of the window after the call, as the script reported.
    pub(crate) window_pass: u64,
    /// The limit the script applied.
    pub(crate) limit: u64,
}

/// A pass taken from a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spent {
    pub(crate) limit: u64,
    pub(crate) window_pass: u64,
}

/// What a request for a key does next, given its lease state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Pass with a leased pass; then, if set, ask for a refill of this
    /// many passes for the pool (see [`KeyLease::refill`]).
    Spend(Spent, Option<u64>),
    /// Wait for the call in flight (its passes may cover this request),
    /// then take the next step again, without waiting a second time.
    Wait,
    /// Ask the script for passes: one for the caller, the rest for the
    /// pool.
    Ask(Ask),
}

/// What a request that asks the script asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ask {
    /// Passes in all (at least 1).
    pub(crate) want: u64,
    /// Of those, the caller's own and those of the requests waiting with
    /// no call in flight to cover them: these are not cut to the key's
    /// rate (they are already here), only to the room left.
    pub(crate) batch: u64,
}

/// Most requests one call decides at once.
pub(crate) const MAX_BATCH: u64 = 1024;

/// One key's lease state on one replica. Times are µs on the store's lease
/// clock (monotonic; the manual clock's ms times 1000 under a manual
/// clock).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyLease {
    /// The rate tick being counted, and its arrivals.
    tick: u64,
    arrivals: u64,
    /// Arrivals in the tick before `tick` (0 if that tick saw none).
    last_arrivals: u64,
    /// Leased passes not spent yet, all of the bucket `bucket_start`.
    pool: u64,
    bucket_start: u64,
    /// The pool may be spent while the lease clock is before this.
    deadline_us: u64,
    limit: u64,
    window_pass: u64,
    /// Passes beyond their callers' own asked for by calls in flight.
    asking: u64,
    /// Calls in flight (asks and refills).
    in_flight: u64,
    /// Requests waiting for them.
    waiting: u64,
}

impl KeyLease {
    /// Counts one request for the key at `now_us`.
    pub(crate) fn arrive(&mut self, now_us: u64) {
        let tick = now_us / TICK_US;
        if tick != self.tick {
            self.last_arrivals = if tick == self.tick + 1 {
                self.arrivals
            } else {
                0
            };
            self.tick = tick;
            self.arrivals = 0;
        }
        self.arrivals += 1;
    }

    /// The pool's passes whose bucket has ended at `now_us`: dropped, and
    /// returned as the count stranded.
    pub(crate) fn expire(&mut self, now_us: u64) -> u64 {
        if self.pool > 0 && now_us >= self.deadline_us {
            std::mem::take(&mut self.pool)
        } else {
            0
        }
    }

    /// Takes one leased pass, if the pool holds one that is still in its
    /// bucket at `now_us`.
    pub(crate) fn take(&mut self, now_us: u64) -> Option<Spent> {
        if self.pool == 0 || now_us >= self.deadline_us {
            return None;
        }
        self.pool -= 1;
        Some(Spent {
            limit: self.limit,
            window_pass: self.window_pass.saturating_sub(self.pool),
        })
    }

    /// The next step of a request at `now_us` (counted with
    /// [`arrive`](Self::arrive) first): spend a leased pass, else wait for
    /// a call in flight (when `may_wait`), else ask for passes for itself,
    /// for the requests waiting with no call to cover them (one call
    /// decides them all), and for the pool if the key is hot. Registers
    /// what it decides: a refill or an ask as asked for and in flight, a
    /// wait as waiting (until [`woken`](Self::woken)).
    pub(crate) fn step(
        &mut self,
        now_us: u64,
        rtt_us: u64,
        max_lease: u64,
        may_wait: bool,
    ) -> Step {
        if let Some(spent) = self.take(now_us) {
            return Step::Spend(spent, self.refill(rtt_us, max_lease));
        }
        if may_wait && self.in_flight > 0 {
            self.waiting += 1;
            return Step::Wait;
        }
        let batch = (1 + self.waiting.saturating_sub(self.asking)).min(MAX_BATCH);
        let want = self.want(rtt_us, max_lease).max(batch);
        self.asking += want - 1;
        self.in_flight += 1;
        Step::Ask(Ask { want, batch })
    }

    /// A request that waited is done waiting (it takes its next step).
    pub(crate) fn woken(&mut self) {
        self.waiting = self.waiting.saturating_sub(1);
    }

    /// Passes the key is expected to need over the cover time, from the
    /// last full tick's arrivals and the round-trip time `rtt_us`.
    fn expected(&self, rtt_us: u64) -> u64 {
        let cover_us = rtt_us.saturating_mul(COVER_RTTS).min(TICK_US / 8);
        self.last_arrivals.saturating_mul(cover_us) / TICK_US
    }

    /// How many passes the key's rate asks for when the pool is empty: 1,
    /// or more for a hot key (at most `max_lease`).
    fn want(&self, rtt_us: u64, max_lease: u64) -> u64 {
        self.expected(rtt_us)
            .saturating_sub(self.pool + self.asking)
            .clamp(1, max_lease.max(1))
    }

    /// After a pass was taken from the pool: the size of a refill to ask
    /// for now (all of it for the pool), when the pool and the calls in
    /// flight hold less than half of what the key is expected to need: a
    /// whole cover time's worth, so that the pool is not empty when the
    /// answer comes.
    /// Registered as asked for, like [`want`](Self::want).
    pub(crate) fn refill(&mut self, rtt_us: u64, max_lease: u64) -> Option<u64> {
        let expected = self.expected(rtt_us);
        let held = self.pool + self.asking;
        if max_lease < 2 || expected < 2 || held >= expected / 2 {
            return None;
        }
        let want = expected.min(max_lease);
        self.asking += want;
        self.in_flight += 1;
        Some(want)
    }

    /// A call that asked for `asked` passes for the pool (beyond its
    /// caller's own) ended without a grant.
    pub(crate) fn failed(&mut self, asked: u64) {
        self.asking = self.asking.saturating_sub(asked);
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// A call sent at `sent_us`, which asked for `asked` passes for the
    /// pool, was granted `grant` (answer read at `now_us`); `kept` of the
    /// granted passes went to its caller (1, or 0 for a refill). The rest
    /// join the pool, to be spent before `sent_us + ends_us - slack_us`:
    /// the server read its time after the call was sent, so its bucket
    /// ends no earlier than that. Returns the passes stranded now: granted
    /// too late to be spent, or of an older bucket than the pool's, or the
    /// pool's own when the grant is of a newer bucket.
    pub(crate) fn granted(
        &mut self,
        asked: u64,
        kept: u64,
        grant: Grant,
        (sent_us, now_us, slack_us): (u64, u64, u64),
    ) -> u64 {
        self.asking = self.asking.saturating_sub(asked);
        self.in_flight = self.in_flight.saturating_sub(1);
        let extra = grant.granted.saturating_sub(kept);
        if extra == 0 {
            return 0;
        }
        let deadline_us = sent_us
            .saturating_add(grant.ends_us)
            .saturating_sub(slack_us);
        if now_us >= deadline_us {
            return extra;
        }
        let mut stranded = self.expire(now_us);
        if self.pool > 0 {
            if grant.bucket_start < self.bucket_start {
                return stranded + extra;
            }
            if grant.bucket_start == self.bucket_start {
                // Two lower bounds of one bucket's end: the later is one too.
                self.pool += extra;
                self.deadline_us = self.deadline_us.max(deadline_us);
                self.window_pass = self.window_pass.max(grant.window_pass);
                self.limit = grant.limit;
                return stranded;
            }
            // A newer bucket: the old pool cannot be spent any more (its
            // bucket ended before the server read its time for this grant).
            stranded += std::mem::take(&mut self.pool);
        }
        self.pool = extra;
        self.bucket_start = grant.bucket_start;
        self.deadline_us = deadline_us;
        self.window_pass = grant.window_pass;
        self.limit = grant.limit;
        stranded
    }

    /// Arrivals in the last full tick: the rate the script caps a lease by.
    pub(crate) fn rate(&self) -> u64 {
        self.last_arrivals
    }

    /// Whether the state can be dropped: nothing pooled or asked for, and
    /// no arrival in the last two ticks.
    fn idle(&self, now_us: u64) -> bool {
        self.pool == 0
            && self.in_flight == 0
            && self.waiting == 0
            && now_us / TICK_US > self.tick + 1
    }

    /// Passes in the pool (for tests and the stranded count on forget).
    pub(crate) fn pooled(&self) -> u64 {
        self.pool
    }
}

/// The lease state of a store's keys: bounded at [`MAX_LEASED_KEYS`].
#[derive(Debug, Default)]
pub(crate) struct LeaseTable {
    keys: HashMap<super::KeyId, KeyLease>,
    /// When the full table was last swept (lease clock, µs): at most one
    /// sweep a tick, so a flood of new keys costs each request O(1) work
    /// (they ask one pass at a time until a sweep makes room).
    swept_us: Option<u64>,
}

impl LeaseTable {
    /// The key's state, made if there is room (idle keys are swept when
    /// the table is full, at most once a tick); `None`: no room, the key
    /// asks one pass at a time. Passes stranded by the sweep are added to `stranded`.
    pub(crate) fn get(
        &mut self,
        id: super::KeyId,
        now_us: u64,
        stranded: &mut u64,
    ) -> Option<&mut KeyLease> {
        if self.keys.len() >= MAX_LEASED_KEYS && !self.keys.contains_key(&id) {
            if self
                .swept_us
                .is_some_and(|swept| now_us.saturating_sub(swept) < TICK_US)
            {
                return None;
            }
            self.swept_us = Some(now_us);
            self.keys.retain(|_, lease| {
                *stranded += lease.expire(now_us);
                !lease.idle(now_us)
            });
            if self.keys.len() >= MAX_LEASED_KEYS {
                return None;
            }
        }
        Some(self.keys.entry(id).or_default())
    }

    /// The key's state, if it has one.
    pub(crate) fn existing(&mut self, id: super::KeyId) -> Option<&mut KeyLease> {
        self.keys.get_mut(&id)
    }

    /// Drops the key's pool (its limit changed); returns what it held.
    pub(crate) fn forget(&mut self, id: super::KeyId) -> u64 {
        self.keys.remove(&id).map_or(0, |lease| lease.pooled())
    }
}

/// Wake-up shards: a request that waits for a call in flight waits on the
/// shard of its key; a reply wakes the shard of its key.
const WAKE_SHARDS: usize = 64;

/// A store's leases: the table, the round-trip estimate and the wake-ups.
/// Shared by the clones of a store with the same settings.
#[derive(Debug)]
pub(crate) struct Leases {
    table: std::sync::Mutex<LeaseTable>,
    /// Round-trip time of the script calls, µs: a moving average (7/8 of
    /// the last estimate, 1/8 of the new sample), 0 before the first call.
    /// Relaxed: an estimate, read and written on its own; a lost update
    /// costs one sample.
    rtt_us: std::sync::atomic::AtomicU64,
    /// The lease clock's origin when the server's clock cuts the buckets.
    epoch: std::time::Instant,
    wakes: [tokio::sync::Notify; WAKE_SHARDS],
}

impl Default for Leases {
    fn default() -> Self {
        Leases {
            table: std::sync::Mutex::default(),
            rtt_us: std::sync::atomic::AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            wakes: std::array::from_fn(|_| tokio::sync::Notify::new()),
        }
    }
}

impl Leases {
    /// The table, locked. Every critical section is a few arithmetic steps
    /// on one key's state (or, when the table is full, one sweep), with no
    /// await inside.
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, LeaseTable> {
        // A panic while holding the lock leaves plain counters; keep them.
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn rtt_us(&self) -> u64 {
        self.rtt_us.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn sample_rtt(&self, sample_us: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let old = self.rtt_us.load(Relaxed);
        let new = if old == 0 {
            sample_us.max(1)
        } else {
            (old.saturating_mul(7).saturating_add(sample_us) / 8).max(1)
        };
        self.rtt_us.store(new, Relaxed);
    }

    /// µs since this table was made, on a monotonic clock.
    pub(crate) fn elapsed_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Where requests for `id` wait for a call in flight.
    pub(crate) fn wake(&self, id: super::KeyId) -> &tokio::sync::Notify {
        &self.wakes[usize::from(id.shard_byte()) % WAKE_SHARDS]
    }
}

#[cfg(test)]
mod tests;
