//! The CPU use the BBR check reads: the [`CpuSource`] trait, and the
//! process's own use, sampled by one background thread shared by every
//! layer with a system rule.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the sampler folds the CPU use into the average both ways
/// (Kratos BBR's 500 ms).
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// How often the sampler reads the CPU time between those: a reading over
/// this short a time that is above the average raises it at once (see
/// [`fold_short`]). `SAMPLE_EVERY` is a whole number of these.
pub(crate) const SHORT_EVERY: Duration = Duration::from_millis(50);

/// Short readings a full sample spans.
const SHORTS_PER_SAMPLE: u32 = (SAMPLE_EVERY.as_millis() / SHORT_EVERY.as_millis()) as u32;

/// The weight of the previous average in each new sample below it
/// (Kratos BBR's `decay = 0.95`): `cpu = cpu × 0.95 + sample × 0.05`.
pub(crate) const DECAY: f64 = 0.95;

/// The name of the sampler thread.
pub(crate) const THREAD_NAME: &str = "tsw-cpu-sampler";

/// Where a [`SystemRule`](super::SystemRule) reads the CPU use it compares
/// with its [`cpu_threshold`](super::SystemRule::cpu_threshold).
///
/// The default is the process's own use, sampled in the background (see
/// the [module docs](super)). Give another with
/// [`SystemRule::cpu_source`](super::SystemRule::cpu_source): a fixed or
/// test-controlled figure, or a reading of a host agent's. Any
/// `Fn() -> f64 + Send + Sync` is one.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use tower_sliding_window::system::SystemRule;
///
/// // A figure the test moves: f64 bits in an atomic.
/// let cpu = Arc::new(AtomicU64::new(0.9f64.to_bits()));
/// let reading = Arc::clone(&cpu);
/// let rule = SystemRule::bbr()
///     .cpu_source(move || f64::from_bits(reading.load(Ordering::Relaxed)));
/// cpu.store(0.1f64.to_bits(), Ordering::Relaxed);
/// # let _ = rule;
/// ```
pub trait CpuSource: Send + Sync + 'static {
    /// The CPU use now, as a fraction of the CPU the service may use: 0.0
    /// idle, 1.0 all of it. Called on every request the BBR check sees, so
    /// it must be cheap (a load of a sampled figure). A value that is not a
    /// number reads as 0.
    fn cpu_usage(&self) -> f64;
}

impl<F: Fn() -> f64 + Send + Sync + 'static> CpuSource for F {
    fn cpu_usage(&self) -> f64 {
        self()
    }
}

/// The process's CPU use, as the shared sampler thread keeps it: one
/// subscription to the thread, which runs while any exists.
pub(crate) struct ProcessCpu {
    sampler: Arc<Sampler>,
}

impl ProcessCpu {
    /// Subscribes to the sampler, starting its thread if no one else holds
    /// it.
    pub(crate) fn subscribe() -> ProcessCpu {
        ProcessCpu {
            sampler: Sampler::shared(),
        }
    }
}

impl CpuSource for ProcessCpu {
    fn cpu_usage(&self) -> f64 {
        self.sampler.state.load()
    }
}

impl fmt::Debug for ProcessCpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessCpu")
            .field("cpu_usage", &self.sampler.state.load())
            .finish()
    }
}

/// The one sampler of the process, while someone holds it. Its `Drop`
/// (with the last holder) stops and joins the thread.
static SAMPLER: Mutex<Weak<Sampler>> = Mutex::new(Weak::new());

/// The sampler thread and what it shares with its readers.
struct Sampler {
    state: Arc<SamplerState>,
    thread: Option<JoinHandle<()>>,
}

/// What the sampler thread shares: the average, and the stop signal.
struct SamplerState {
    /// The EWMA of the CPU use, as `f64` bits. Written by the sampler
    /// thread alone; read relaxed by requests: a figure read on its own,
    /// a stale one for up to a sample is what the check expects.
    ewma: AtomicU64,
    /// Set once, by the `Sampler`'s drop; the thread waits on `wake`.
    stop: Mutex<bool>,
    wake: Condvar,
}

impl SamplerState {
    fn load(&self) -> f64 {
        f64::from_bits(self.ewma.load(Ordering::Relaxed))
    }
}

impl Sampler {
    /// The running sampler, or a new one (with its thread) if none runs.
    fn shared() -> Arc<Sampler> {
        let mut slot = SAMPLER.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sampler) = slot.upgrade() {
            return sampler;
        }
        let state = Arc::new(SamplerState {
            ewma: AtomicU64::new(0f64.to_bits()),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let thread_state = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name(THREAD_NAME.to_owned())
            .spawn(move || run(&thread_state))
            .expect("SlidingWindowLayer::system: could not start the CPU sampler thread");
        let sampler = Arc::new(Sampler {
            state,
            thread: Some(thread),
        });
        *slot = Arc::downgrade(&sampler);
        sampler
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        *self.state.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.state.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            // The thread holds only the state, never the `Sampler`, so this
            // drop never runs on it.
            let _ = thread.join();
        }
    }
}

/// The sampler thread: every `SHORT_EVERY`, the CPU use since the previous
/// reading raises the average if it is above it ([`fold_short`]); every
/// `SAMPLE_EVERY`, the use since the previous full sample is folded in
/// both ways ([`fold`]); until told to stop.
fn run(state: &SamplerState) {
    let reader = super::cgroup::CpuReader::detect();
    let mut waits = super::cgroup::Waits::default();
    waits.advance();
    let first = reader.used_us().map(|used| (used, Instant::now()));
    // The last reading, and the one that started the full sample; the wait
    // for a CPU counted since each.
    let (mut short, mut full) = (first, first);
    let mut waited_full = 0u64;
    let mut shorts = 0u32;
    let mut stop = state.stop.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let deadline = Instant::now() + SHORT_EVERY;
        while !*stop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            stop = state
                .wake
                .wait_timeout(stop, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if *stop {
            return;
        }
        let now = reader.used_us().map(|used| (used, Instant::now()));
        let waited = waits.advance();
        waited_full = waited_full.saturating_add(waited);
        shorts += 1;
        if let Some(sample) = sample_between(&reader, short, now, waited) {
            let average = state.load();
            state
                .ewma
                .store(fold_short(average, sample).to_bits(), Ordering::Relaxed);
        }
        if shorts >= SHORTS_PER_SAMPLE {
            if let Some(sample) = sample_between(&reader, full, now, waited_full) {
                state
                    .ewma
                    .store(fold(state.load(), sample).to_bits(), Ordering::Relaxed);
            }
            full = now;
            waited_full = 0;
            shorts = 0;
        }
        // A failed reading keeps the average and starts again from the
        // next good one.
        short = now;
    }
}

/// The CPU use between two readings, with `waited` µs of waiting for a
/// CPU on top; none without both readings.
fn sample_between(
    reader: &super::cgroup::CpuReader,
    before: Option<(u64, Instant)>,
    after: Option<(u64, Instant)>,
    waited: u64,
) -> Option<f64> {
    let ((used_before, at_before), (used, at)) = (before?, after?);
    let wall_us = at.duration_since(at_before).as_micros() as u64;
    let busy = used.saturating_sub(used_before).saturating_add(waited);
    super::cgroup::usage(busy, wall_us, reader.cpus())
}

/// A short reading (over `SHORT_EVERY`) against the average: above it, it
/// replaces it, as a full sample above it does; below it, it changes
/// nothing, so that the average still falls 5 % a full sample.
///
/// With readings every 500 ms alone, a service whose CPU had fallen below
/// the threshold (a lull, then a step to several times its capacity)
/// admitted everything for up to half a second, and more when the step
/// began mid-sample (the idle part of the sample kept it below the
/// threshold until the next): at four times the capacity that is a queue
/// of a second and a half of work, whose requests made the p99 of the
/// whole overload. A reading every 50 ms starts the check within 50 to
/// 100 ms (the process's CPU time comes in 10 ms ticks, so a reading is
/// within 20 % either way). It only starts it: the check refuses only
/// requests beyond the estimate, so a short busy burst without a queue
/// refuses nothing. The sampler thread wakes 20 times a second for it; the
/// request path still reads one atomic.
pub(crate) fn fold_short(average: f64, sample: f64) -> f64 {
    if sample > average {
        sample
    } else {
        average
    }
}

/// One sample folded into the average: a sample above the average
/// replaces it; one below moves it as Kratos BBR's average does, 5 %
/// of the way.
///
/// Kratos folds every sample in at 5 %, so from idle a fully busy process
/// reads 0.8 only after 32 samples (16 s), and from 0.5 after 18 (9 s):
/// through all that time an overloaded service admits everything, its
/// queue grows, and the shortest response time BBR's estimate is made of
/// grows with it, so that when the check starts it lets the queue stay.
/// Taken at once, the first busy sample starts the check while the
/// estimate still describes the service unloaded. The average still falls
/// slowly, so a service the check relieves keeps it running (from fully
/// busy to idle, 2 s above 0.8), and the check only ever refuses requests
/// beyond the estimate, so a busy CPU without a queue refuses nothing.
pub(crate) fn fold(average: f64, sample: f64) -> f64 {
    if sample >= average {
        sample
    } else {
        average * DECAY + sample * (1.0 - DECAY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busier_sample_is_taken_at_once() {
        // From idle, the first fully busy sample opens the BBR gate (0.8):
        // Kratos's average read it as 0.05, and 0.8 only after 16 s, while
        // the queue of an overloaded service grew unchecked.
        assert_eq!(fold(0.0, 1.0), 1.0);
        assert_eq!(fold(0.3, 0.85), 0.85);
        assert_eq!(fold(0.5, 0.5), 0.5);
    }

    #[test]
    fn a_short_busy_reading_raises_the_average_and_a_quiet_one_leaves_it() {
        // After a 3 s lull from fully busy, the average is 0.95^6 = 0.735,
        // under the 0.8 gate: a 50 ms reading of 0.9 opens it at once.
        let mut cpu = 1.0;
        for _ in 0..6 {
            cpu = fold(cpu, 0.0);
        }
        assert!(cpu < 0.8, "{cpu}");
        assert_eq!(fold_short(cpu, 0.9), 0.9);
        // A quiet short reading leaves the average to the full samples:
        // still 5 % of the way a full sample, never faster.
        assert_eq!(fold_short(0.9, 0.0), 0.9);
        assert_eq!(fold_short(0.5, 0.5), 0.5);
        assert_eq!(SHORTS_PER_SAMPLE, 10);
        assert_eq!(SHORT_EVERY * SHORTS_PER_SAMPLE, SAMPLE_EVERY);
    }

    #[test]
    fn a_quieter_sample_moves_the_average_five_percent_towards_it() {
        assert!((fold(1.0, 0.0) - 0.95).abs() < 1e-12);
        assert!((fold(0.9, 0.5) - (0.9 * 0.95 + 0.5 * 0.05)).abs() < 1e-12);
        // From fully busy to idle, the average stays at or above 0.8 for 4
        // samples (2 s): 0.95^4 = 0.815, 0.95^5 = 0.774.
        let mut cpu = 1.0;
        for _ in 0..4 {
            cpu = fold(cpu, 0.0);
        }
        assert!(cpu >= 0.8, "{cpu}");
        cpu = fold(cpu, 0.0);
        assert!(cpu < 0.8, "{cpu}");
    }
}
