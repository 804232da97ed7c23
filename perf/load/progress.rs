//! Progress lines for the long modes (`soak`, `soak --hostile`, `bench`,
//! `overhead`), on standard error: elapsed and remaining time, so a person
//! knows how long a 15-minute run has left.
//!
//! A timed mode (a run until a deadline) prints at most one line per
//! [`EVERY`]; a mode of counted rounds prints one line per round, its
//! remaining time estimated from the rounds done so far.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// The shortest gap between two lines of a timed mode.
const EVERY: Duration = Duration::from_secs(10);

enum Plan {
    /// Runs for this long.
    Timed(Duration),
    /// Runs this many rounds.
    Rounds(u64),
}

pub struct Progress {
    label: &'static str,
    started: Instant,
    plan: Plan,
    last: Option<Instant>,
}

/// `1h02m03s`, `2m05s`, `7s`.
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, s) => format!("{h}h{m:02}m{s:02}s"),
    }
}

impl Progress {
    /// A mode that runs for `total` from `started`.
    pub fn timed(label: &'static str, started: Instant, total: Duration) -> Self {
        Progress {
            label,
            started,
            plan: Plan::Timed(total),
            last: None,
        }
    }

    /// A mode of `rounds` rounds, starting now.
    pub fn rounds(label: &'static str, rounds: u64) -> Self {
        Progress {
            label,
            started: Instant::now(),
            plan: Plan::Rounds(rounds),
            last: None,
        }
    }

    /// Reports that round `done` (counted from 1) has finished, with
    /// `detail`. Timed modes print only if [`EVERY`] has passed since the
    /// last line.
    pub fn round(&mut self, done: u64, detail: impl Display) {
        let now = Instant::now();
        let elapsed = now - self.started;
        let (left, percent) = match self.plan {
            Plan::Timed(total) => {
                if self.last.is_some_and(|last| now - last < EVERY) {
                    return;
                }
                let left = total.saturating_sub(elapsed);
                (
                    left,
                    elapsed.as_secs_f64() * 100.0 / total.as_secs_f64().max(1e-9),
                )
            }
            Plan::Rounds(total) => {
                let done = done.max(1);
                let per_round = elapsed / u32::try_from(done).unwrap_or(u32::MAX);
                let remaining = u32::try_from(total.saturating_sub(done)).unwrap_or(u32::MAX);
                (
                    per_round * remaining,
                    done as f64 * 100.0 / total.max(1) as f64,
                )
            }
        };
        self.last = Some(now);
        let round = match self.plan {
            Plan::Rounds(total) => format!("round {done}/{total}"),
            Plan::Timed(_) => format!("round {done}"),
        };
        eprintln!(
            "{}: {round}, {} elapsed, {} left ({:.0}%){}{detail}",
            self.label,
            clock(elapsed),
            clock(left),
            percent.min(100.0),
            if detail.to_string().is_empty() {
                ""
            } else {
                ", "
            },
        );
    }
}
