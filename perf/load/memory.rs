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
//! Every inserted key must have its own entry at the end (the handle's
//! `len`, or governor's), or the run fails: a subject that sent keys to its
//! overflow entry would look cheaper than it is.

use std::io::Write as _;
use std::process::Command;

use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::{KeyExtractor, PeerIpKey, SlidingWindowLayer};

use crate::direct::{self, Driven};
use crate::soak::{page_kib, rss_kib};

/// Set in a child's environment: `SUBJECT KEYS`.
pub const CHILD_ENV: &str = "PERF_LOAD_MEMORY_CHILD";

/// The prefix of the line a child prints its figures on.
const RESULT: &str = "memory-result";

/// One way of holding keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
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
    pub const ALL: [Subject; 4] = [
        Subject::FullIpv4,
        Subject::GovernorIpv4,
        Subject::GovernorIpv6,
        Subject::GovernorString,
    ];

    /// Its name on the command line of a child.
    pub fn slug(self) -> &'static str {
        match self {
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
            Subject::FullIpv4 | Subject::GovernorIpv4 => "IPv4",
            Subject::GovernorIpv6 => "IPv6, distinct /64s",
            Subject::GovernorString => "64-byte strings",
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
    /// The `max_keys` of our subjects (0 for governor's).
    pub max_keys: u64,
    /// Resident set size before the keys, KiB.
    pub before_kib: u64,
    /// Resident set size after them, KiB.
    pub after_kib: u64,
}

impl Measured {
    /// Resident growth per key, in bytes.
    pub fn bytes_per_key(&self) -> f64 {
        self.after_kib.saturating_sub(self.before_kib) as f64 * 1024.0 / self.keys as f64
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
        .find_map(|line| line.strip_prefix(RESULT))
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
    let [before_kib, after_kib] = numbers[..] else {
        return Err(format!("a bad result line `{line}`: expected two numbers"));
    };
    Ok(Measured {
        subject,
        keys,
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
    let (before_kib, after_kib) = measure(subject, keys, max_keys)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{RESULT} {before_kib} {after_kib}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot print the result: {e}"))
}

/// Builds `subject`, inserts `keys` keys, and returns the resident set size
/// before and after (KiB).
fn measure(subject: Subject, keys: u64, max_keys: u64) -> Result<(u64, u64), String> {
    let page = page_kib();
    let rss = || rss_kib(page).ok_or("cannot read /proc/self/statm");
    match subject {
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
) -> Result<(u64, u64), String> {
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
    let held = driven.handle.len() as u64;
    if held != keys {
        return Err(format!(
            "{keys} keys inserted but the layer holds {held} entries: keys were dropped or \
             shared the overflow entry, so the growth is not theirs"
        ));
    }
    Ok((before, after))
}

/// Inserts `keys` keys into governor's keyed limiter, one `check_key` each.
fn fill_governor<K: Clone + std::hash::Hash + Eq>(
    keys: u64,
    rss: impl Fn() -> Result<u64, &'static str>,
    key: impl Fn(u64) -> K,
) -> Result<(u64, u64), String> {
    let limiter = direct::governor_keyed::<K>();
    let before = rss()?;
    for i in 0..keys {
        if limiter.check_key(&key(i)).is_err() {
            return Err(format!("governor refused key {i}; every key must pass"));
        }
    }
    let after = rss()?;
    let held = limiter.len() as u64;
    if held != keys {
        return Err(format!("{keys} keys inserted but governor holds {held}"));
    }
    Ok((before, after))
}

/// The Markdown table of a run.
pub fn table(rows: &[Measured]) -> String {
    let mut text = String::from(
        "| subject | keys | keys inserted | `max_keys` | RSS before (MiB) | RSS growth (MiB) | \
         bytes per key |\n|---|---|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let max_keys = if row.max_keys == 0 {
            "-".to_owned()
        } else {
            row.max_keys.to_string()
        };
        text.push_str(&format!(
            "| {} | {} | {} | {max_keys} | {:.1} | {:.1} | {:.1} |\n",
            row.subject.describe(),
            row.subject.keys(),
            row.keys,
            row.before_kib as f64 / 1024.0,
            row.after_kib.saturating_sub(row.before_kib) as f64 / 1024.0,
            row.bytes_per_key()
        ));
    }
    text
}
