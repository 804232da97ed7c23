//! `load memory`: what one key costs, as growth of resident memory.
//!
//! Each subject runs in a child process of its own (this binary, started
//! again with [`CHILD_ENV`] set), so no subject reuses memory another one
//! freed. The child builds the subject, reads its resident set size from
//! `/proc/self/statm`, inserts its keys one request (or one `check_key`) at
//! a time, reads the resident set size again and prints both on one line
//! that the parent reads. Bytes per key are the growth over the keys: the
//! table, the keys and their windows, whatever the allocator keeps around
//! them, and pages of a preallocated table only once they are touched.
//!
//! The growth is divided by the keys the subject holds at the end (the
//! handle's `len`, or governor's), not by the keys sent: a key that found
//! no room shares the overflow entry and costs nothing of its own. A
//! subject holding fewer than 99 % of the keys sent fails the run (its
//! figure would describe a different table); the table gives both counts.

use std::io::Write as _;
use std::process::Command;

use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::{HeaderKey, KeyExtractor, PeerIpKey, SlidingWindowLayer};

use crate::direct::{self, Driven};
use crate::soak::{page_kib, rss_kib};

/// Set in a child's environment: `SUBJECT KEYS`.
pub const CHILD_ENV: &str = "PERF_LOAD_MEMORY_CHILD";

/// The prefix of the line a child prints its figures on.
const RESULT: &str = "memory-result";

/// One way of holding keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// Our compact tier keyed by `PeerIpKey`, IPv4 peers.
    CompactIpv4,
    /// Our compact tier keyed by `PeerIpKey`, IPv6 peers (one /64 each).
    CompactIpv6,
    /// Our compact tier keyed by `HeaderKey`, 64-byte values.
    CompactHeader,
    /// Our full tier keyed by `PeerIpKey`, IPv4 peers.
    FullIpv4,
    /// governor's keyed limiter, `IpAddr` keys (IPv4).
    GovernorIpv4,
    /// governor's keyed limiter, `IpAddr` keys (IPv6, one /64 each).
    GovernorIpv6,
    /// governor's keyed limiter, 64-byte `String` keys.
    GovernorString,
}

impl Subject {
    /// Every subject, in the order of the table.
    pub const ALL: [Subject; 7] = [
        Subject::CompactIpv4,
        Subject::CompactIpv6,
        Subject::CompactHeader,
        Subject::FullIpv4,
        Subject::GovernorIpv4,
        Subject::GovernorIpv6,
        Subject::GovernorString,
    ];

    /// Its name on the command line of a child.
    pub fn slug(self) -> &'static str {
        match self {
            Subject::CompactIpv4 => "compact-ipv4",
            Subject::CompactIpv6 => "compact-ipv6",
            Subject::CompactHeader => "compact-header",
            Subject::FullIpv4 => "full-ipv4",
            Subject::GovernorIpv4 => "governor-ipv4",
            Subject::GovernorIpv6 => "governor-ipv6",
            Subject::GovernorString => "governor-string",
        }
    }

    fn from_slug(slug: &str) -> Option<Subject> {
        Subject::ALL.into_iter().find(|s| s.slug() == slug)
    }

    /// What the table's first column says.
    pub fn describe(self) -> &'static str {
        match self {
            Subject::CompactIpv4 | Subject::CompactIpv6 => "ours, compact tier, `PeerIpKey`",
            Subject::CompactHeader => "ours, compact tier, `HeaderKey`",
            Subject::FullIpv4 => "ours, full tier, `PeerIpKey`",
            Subject::GovernorIpv4 | Subject::GovernorIpv6 => {
                "governor 0.10 keyed (`DashMap`), `IpAddr`"
            }
            Subject::GovernorString => "governor 0.10 keyed (`DashMap`), `String`",
        }
    }

    /// The keys, as the table's second column says.
    pub fn keys(self) -> &'static str {
        match self {
            Subject::CompactIpv4 | Subject::FullIpv4 | Subject::GovernorIpv4 => "IPv4",
            Subject::CompactIpv6 | Subject::GovernorIpv6 => "IPv6, distinct /64s",
            Subject::CompactHeader | Subject::GovernorString => "64-byte strings",
        }
    }

    /// The most bytes per key the compact tier may cost with these keys
    /// (the tier's memory target), `None` for the other subjects.
    pub fn budget(self) -> Option<f64> {
        match self {
            Subject::CompactIpv4 | Subject::CompactIpv6 => Some(64.0),
            Subject::CompactHeader => Some(128.0),
            _ => None,
        }
    }

    /// Whether this is our layer (governor's has no `max_keys`).
    pub fn ours(self) -> bool {
        !matches!(
            self,
            Subject::GovernorIpv4 | Subject::GovernorIpv6 | Subject::GovernorString
        )
    }

    /// Whether this is our full tier, whose keys are measured fewer at a
    /// time (about 5 KiB each).
    pub fn full_tier(self) -> bool {
        matches!(self, Subject::FullIpv4)
    }
}

/// What one child measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// The subject.
    pub subject: Subject,
    /// Keys inserted.
    pub keys: u64,
    /// Keys held at the end (the others share the overflow entry).
    pub held: u64,
    /// The `max_keys` of our subjects (0 for governor's).
    pub max_keys: u64,
    /// Resident set size before the keys, KiB.
    pub before_kib: u64,
    /// Resident set size after them, KiB.
    pub after_kib: u64,
}

impl Measured {
    /// Resident growth per key held, in bytes.
    pub fn bytes_per_key(&self) -> f64 {
        self.after_kib.saturating_sub(self.before_kib) as f64 * 1024.0 / self.held as f64
    }
}

/// The settings of the memory mode.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Keys per subject (and the `max_keys` of ours).
    pub keys: u64,
    /// Keys inserted into the full tier.
    pub full_keys: u64,
}

/// Runs every subject in a child process of its own, one after another.
pub fn run(plan: Plan, subjects: &[Subject]) -> Result<Vec<Measured>, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find this program to start a child: {e}"))?;
    subjects
        .iter()
        .map(|&subject| {
            let keys = if subject.full_tier() {
                plan.full_keys
            } else {
                plan.keys
            };
            eprintln!("memory: {} with {keys} keys", subject.slug());
            let mut command = Command::new(&exe);
            command.args(["memory"]);
            measure_in_child(command, subject, keys, plan.keys)
        })
        .collect()
}

/// Starts `command` with [`CHILD_ENV`] naming the subject and the counts,
/// and reads its result line.
pub fn measure_in_child(
    mut command: Command,
    subject: Subject,
    keys: u64,
    max_keys: u64,
) -> Result<Measured, String> {
    let output = command
        .env(CHILD_ENV, format!("{} {keys} {max_keys}", subject.slug()))
        .output()
        .map_err(|e| format!("cannot start the child for {}: {e}", subject.slug()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "the child measuring {} failed ({}): {}{}",
            subject.slug(),
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let line = stdout
        .lines()
        // Under the test harness the line may follow the test's name.
        .find_map(|line| line.split_once(RESULT).map(|(_, figures)| figures))
        .ok_or_else(|| {
            format!(
                "the child measuring {} printed no result: {stdout}",
                subject.slug()
            )
        })?;
    let numbers: Vec<u64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("a bad result line `{line}`: {e}"))?;
    let [before_kib, after_kib, held] = numbers[..] else {
        return Err(format!(
            "a bad result line `{line}`: expected three numbers"
        ));
    };
    if held.saturating_mul(100) < keys.saturating_mul(99) {
        return Err(format!(
            "{}: {keys} keys sent but only {held} held: more than 1 % found no room, so the \
             growth is not that of {keys} keys",
            subject.slug()
        ));
    }
    Ok(Measured {
        subject,
        keys,
        held,
        max_keys: if subject.ours() { max_keys } else { 0 },
        before_kib,
        after_kib,
    })
}

/// The child's side: reads [`CHILD_ENV`], measures, prints the result line.
/// `None` when this process is not a child.
pub fn child_from_env() -> Option<Result<(), String>> {
    let spec = std::env::var(CHILD_ENV).ok()?;
    Some(child(&spec))
}

fn child(spec: &str) -> Result<(), String> {
    let words: Vec<&str> = spec.split_whitespace().collect();
    let [slug, keys, max_keys] = words[..] else {
        return Err(format!(
            "{CHILD_ENV}=`{spec}`: expected SUBJECT KEYS MAX_KEYS"
        ));
    };
    let subject =
        Subject::from_slug(slug).ok_or_else(|| format!("{CHILD_ENV}: unknown subject `{slug}`"))?;
    let number = |word: &str| {
        word.parse::<u64>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{CHILD_ENV}: `{word}` is not a positive whole number"))
    };
    let (keys, max_keys) = (number(keys)?, number(max_keys)?);
    let (before_kib, after_kib, held) = measure(subject, keys, max_keys)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{RESULT} {before_kib} {after_kib} {held}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot print the result: {e}"))
}

/// Builds `subject`, inserts `keys` keys, and returns the resident set size
/// before and after (KiB) and the keys held.
fn measure(subject: Subject, keys: u64, max_keys: u64) -> Result<(u64, u64, u64), String> {
    let page = page_kib();
    let rss = || rss_kib(page).ok_or("cannot read /proc/self/statm");
    match subject {
        Subject::CompactIpv4 => {
            let layer = ours(PeerIpKey, max_keys).compact();
            fill(layer, keys, rss, |i| direct::from_peer(direct::ipv4(i)))
        }
        Subject::CompactIpv6 => {
            let layer = ours(PeerIpKey, max_keys).compact();
            fill(layer, keys, rss, |i| direct::from_peer(direct::ipv6(i)))
        }
        Subject::CompactHeader => {
            let layer = ours(HeaderKey::new(direct::API_KEY), max_keys).compact();
            fill(layer, keys, rss, |i| {
                direct::with_api_key(&direct::string64(i))
            })
        }
        Subject::FullIpv4 => {
            let layer = ours(PeerIpKey, max_keys);
            fill(layer, keys, rss, |i| direct::from_peer(direct::ipv4(i)))
        }
        Subject::GovernorIpv4 => fill_governor(keys, rss, direct::ipv4),
        Subject::GovernorIpv6 => fill_governor(keys, rss, direct::ipv6),
        Subject::GovernorString => fill_governor(keys, rss, direct::string64),
    }
}

/// Our layer keyed by `extractor`, room for `max_keys` keys, on a clock
/// that does not move, with a limit every key keeps far below.
fn ours<X: KeyExtractor>(extractor: X, max_keys: u64) -> SlidingWindowLayer<X> {
    SlidingWindowLayer::qps(1_000)
        .key(extractor)
        .max_keys(max_keys as usize)
        .clock(ManualClock::new(1_000_000))
}

/// Inserts `keys` keys into our layer, one request each.
fn fill<X: KeyExtractor>(
    layer: SlidingWindowLayer<X>,
    keys: u64,
    rss: impl Fn() -> Result<u64, &'static str>,
    request: impl Fn(u64) -> http::Request<()>,
) -> Result<(u64, u64, u64), String> {
    let mut driven = Driven::new(layer);
    let before = rss()?;
    for i in 0..keys {
        let status = driven.call(request(i));
        if status != http::StatusCode::OK {
            return Err(format!(
                "key {i} was answered {status}; every key must pass"
            ));
        }
    }
    let after = rss()?;
    // The overflow entry, counted by `len` while in use, is no key's own.
    let overflow = u64::from(driven.handle.overflow().pass > 0);
    let held = (driven.handle.len() as u64).saturating_sub(overflow);
    Ok((before, after, held))
}

/// Inserts `keys` keys into governor's keyed limiter, one `check_key` each.
fn fill_governor<K: Clone + std::hash::Hash + Eq>(
    keys: u64,
    rss: impl Fn() -> Result<u64, &'static str>,
    key: impl Fn(u64) -> K,
) -> Result<(u64, u64, u64), String> {
    let limiter = direct::governor_keyed::<K>();
    let before = rss()?;
    for i in 0..keys {
        if limiter.check_key(&key(i)).is_err() {
            return Err(format!("governor refused key {i}; every key must pass"));
        }
    }
    let after = rss()?;
    Ok((before, after, limiter.len() as u64))
}

/// The Markdown table of a run.
pub fn table(rows: &[Measured]) -> String {
    let mut text = String::from(
        "| subject | keys | keys sent | keys held | `max_keys` | RSS before (MiB) | RSS growth \
         (MiB) | bytes per key held | target |\n|---|---|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for row in rows {
        let max_keys = if row.max_keys == 0 {
            "-".to_owned()
        } else {
            row.max_keys.to_string()
        };
        let target = match row.subject.budget() {
            Some(budget) if row.bytes_per_key() <= budget => format!("<= {budget} B: met"),
            Some(budget) => format!("<= {budget} B: MISSED"),
            None => "-".to_owned(),
        };
        text.push_str(&format!(
            "| {} | {} | {} | {} | {max_keys} | {:.1} | {:.1} | {:.1} | {target} |\n",
            row.subject.describe(),
            row.subject.keys(),
            row.keys,
            row.held,
            row.before_kib as f64 / 1024.0,
            row.after_kib.saturating_sub(row.before_kib) as f64 / 1024.0,
            row.bytes_per_key()
        ));
    }
    text
}

/// The compact subjects that cost more per key than their target.
pub fn over_budget(rows: &[Measured]) -> Vec<String> {
    rows.iter()
        .filter_map(|row| {
            let budget = row.subject.budget()?;
            (row.bytes_per_key() > budget).then(|| {
                format!(
                    "{} ({}): {:.1} bytes per key, the target is at most {budget}",
                    row.subject.describe(),
                    row.subject.keys(),
                    row.bytes_per_key()
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys per subject: enough that the table's pages and the allocator's
    /// first arenas are a small share of the growth, few enough for a
    /// debug build.
    const KEYS: u64 = 20_000;

    /// The child processes of the check below: this test binary started
    /// again with only this test selected and [`CHILD_ENV`] set. Run on its
    /// own (without that variable) it has nothing to measure.
    #[test]
    #[ignore = "the child process of the memory check, which starts it with its environment"]
    fn memory_child() {
        if let Some(result) = child_from_env() {
            result.expect("the child measures its subject");
        }
    }

    fn in_child(subject: Subject) -> Measured {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut command = Command::new(exe);
        command.args([
            "memory::tests::memory_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ]);
        measure_in_child(command, subject, KEYS, KEYS).expect("the child's figures")
    }

    /// The memory mode at a small key count: a compact key costs less than
    /// a quarter of a full key in resident memory, and each subject's
    /// growth is at least the bytes of its keys (the reading sees the keys
    /// at all).
    #[test]
    fn a_compact_key_costs_under_a_quarter_of_a_full_key() {
        let compact = in_child(Subject::CompactIpv4);
        let full = in_child(Subject::FullIpv4);
        for row in [&compact, &full] {
            assert!(
                row.bytes_per_key() >= 17.0,
                "{:?}: {:.1} bytes per key is less than its key; the reading is wrong: {row:?}",
                row.subject,
                row.bytes_per_key()
            );
        }
        assert!(
            compact.bytes_per_key() * 4.0 < full.bytes_per_key(),
            "a compact key costs {:.1} bytes, a full key {:.1}: not under a quarter",
            compact.bytes_per_key(),
            full.bytes_per_key()
        );
    }
}
