//! The short mode: a few seconds, small loads, and only checks that cannot
//! flake (CI runs them as this module's test).
//!
//! - The accuracy maths on hand-made data.
//! - Our layer on a [`ManualClock`] over real HTTP: at every 100 ms step,
//!   the passes must equal what an exact 10 x 100 ms window allows, and the
//!   handle must agree with what the client saw (nothing lost:
//!   `pass + block = sent`); every 429 carries `Retry-After >= 1`.
//! - The same with matched-path keys: each route is limited on its own.
//! - Every contender answers a fixed set of requests with 2xx or 429.
//!
//! Nothing here depends on speed: the clock only moves when told to, and
//! each step waits for all its answers before checking.

use std::collections::VecDeque;
use std::time::Duration;

use tower_sliding_window::clock::ManualClock;

use crate::analysis;
use crate::cli::Config;
use crate::client;
use crate::ours;
use crate::servers::{self, Built, Contender, Server, Settings};

/// Short mode gives up (and fails) after this long.
pub const TIME_LIMIT: Duration = Duration::from_secs(120);

/// Requests per step sent to each route (all at once, one per connection).
const BURST: usize = 35;

/// The limit in the manual-clock checks.
const LIMIT: u64 = 20;

/// Manual-clock steps of 100 ms (a bit over two windows).
const STEPS: usize = 23;

/// Which of our contenders a manual-clock check drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keying {
    /// One global key; all requests to `/items/{n}`.
    Global,
    /// Matched-path keys; requests split between `/` and `/items/{n}`.
    MatchedPath,
}

/// Runs every check; returns the failures (empty when all passed).
pub async fn run(config: &Config) -> Result<Vec<String>, String> {
    let mut failures = analysis::self_check();
    eprintln!("short: accuracy maths checked");
    failures.extend(manual_clock(config, Keying::Global).await?);
    eprintln!("short: global key on a manual clock checked");
    failures.extend(manual_clock(config, Keying::MatchedPath).await?);
    eprintln!("short: matched-path keys on a manual clock checked");
    failures.extend(smoke(config).await?);
    eprintln!("short: other contenders checked");
    Ok(failures)
}

/// Steps a frozen clock through two windows and checks every count.
async fn manual_clock(config: &Config, keying: Keying) -> Result<Vec<String>, String> {
    let clock = ManualClock::new(50_000);
    let layer_clock = clock.clone();
    let server = Server::start_with(config.server_threads, move || {
        let app = servers::base_router();
        let (router, stats) = match keying {
            Keying::Global => ours::global(app, LIMIT, Some(layer_clock)),
            Keying::MatchedPath => ours::matched_path(app, LIMIT, Some(layer_clock)),
        };
        Ok(Built {
            router,
            recorder: None,
            stats: Some(stats),
        })
    })?;
    let stats = server
        .stats
        .clone()
        .ok_or("our contender has no statistics handle")?;
    let routes: &[&str] = match keying {
        Keying::Global => &["/items/"],
        Keying::MatchedPath => &["/", "/items/"],
    };
    let label = match keying {
        Keying::Global => "global key",
        Keying::MatchedPath => "matched-path keys",
    };
    let mut conns = client::connect_many(server.addr, BURST * routes.len()).await?;
    let mut failures = Vec::new();
    // Per route: passes of the previous nine steps, oldest first.
    let mut history: Vec<VecDeque<u64>> = vec![VecDeque::new(); routes.len()];
    // All routes: (passed, limited, sent) of the last ten steps.
    let mut window: VecDeque<(u64, u64, u64)> = VecDeque::new();
    // All routes, all steps: (passed, limited, sent).
    let mut totals = (0u64, 0u64, 0u64);
    for step in 0..STEPS {
        let now_ms = 50_000 + step as u64 * 100;
        let mut paths = Vec::new();
        for route in routes {
            for j in 0..BURST {
                paths.push(if *route == "/" {
                    "/".to_owned()
                } else {
                    format!("{route}{j}")
                });
            }
        }
        let sent = paths.len() as u64;
        let (back, answers) = client::fan_out(conns, paths).await?;
        conns = back;
        let (mut step_ok, mut step_limited) = (0, 0);
        for (r, route) in routes.iter().enumerate() {
            let mine = &answers[r * BURST..(r + 1) * BURST];
            let ok = mine.iter().filter(|a| a.status == 200).count() as u64;
            let limited: Vec<_> = mine.iter().filter(|a| a.status == 429).collect();
            let other = BURST as u64 - ok - limited.len() as u64;
            let used: u64 = history[r].iter().sum();
            let expected = (BURST as u64).min(LIMIT - used);
            if ok != expected || other != 0 {
                failures.push(format!(
                    "{label}, clock {now_ms} ms, route {route}: {ok} passed and {other} were \
                     neither 200 nor 429; an exact 10 x 100 ms window allows {expected} \
                     (passes in the previous 900 ms: {used})"
                ));
            }
            if let Some(bad) = limited.iter().find(|a| a.retry_after.unwrap_or(0) < 1) {
                failures.push(format!(
                    "{label}, clock {now_ms} ms, route {route}: a 429 had Retry-After {:?}, \
                     expected a whole number of seconds >= 1",
                    bad.retry_after
                ));
            }
            history[r].push_back(ok);
            if history[r].len() > 9 {
                history[r].pop_front();
            }
            step_ok += ok;
            step_limited += limited.len() as u64;
        }
        totals.0 += step_ok;
        totals.1 += step_limited;
        totals.2 += sent;
        window.push_back((step_ok, step_limited, sent));
        if window.len() > 10 {
            window.pop_front();
        }
        // Nothing lost: the handle's window holds this step and the nine
        // before it, and must count every request of them exactly once.
        let pass: u64 = window.iter().map(|w| w.0).sum();
        let block: u64 = window.iter().map(|w| w.1).sum();
        let sent_in_window: u64 = window.iter().map(|w| w.2).sum();
        let total = stats.total();
        if total.pass != pass || total.block != block || total.pass + total.block != sent_in_window
        {
            failures.push(format!(
                "{label}, clock {now_ms} ms: handle pass {} + block {} but the client saw \
                 {pass} passed + {block} limited of {sent_in_window} sent in the window",
                total.pass, total.block
            ));
        }
        clock.advance(Duration::from_millis(100));
    }
    let (passed, limited, sent) = totals;
    eprintln!(
        "short: {label}: {STEPS} steps of 100 ms, {sent} requests, {passed} passed, \
         {limited} limited, {} failure(s)",
        failures.len()
    );
    if keying == Keying::MatchedPath {
        let keys = stats.keys();
        if keys.len() != 2 {
            failures.push(format!(
                "{label}: expected one key per route (2), the handle holds {keys:?}"
            ));
        }
        for key in &keys {
            if stats.snapshot(key).is_none() {
                failures.push(format!(
                    "{label}: key {key:?} is listed but has no snapshot"
                ));
            }
        }
    }
    Ok(failures)
}

/// Every contender, ours on the system clock included, answers a fixed
/// set of requests with 2xx or 429 only (2xx only where nothing limits).
async fn smoke(config: &Config) -> Result<Vec<String>, String> {
    let mut failures = Vec::new();
    let settings = Settings {
        limit: 50,
        record: false,
        manual_clock: None,
        max_wait: config.max_wait,
    };
    for contender in [
        Contender::Bare,
        Contender::Noop,
        Contender::OursGlobal,
        Contender::OursPath,
        Contender::OursStrict,
        Contender::OursThrottle,
        Contender::GovernorUsual,
        Contender::GovernorBurst1,
        Contender::TowerRateLimit,
    ] {
        let server = Server::start(contender, &settings, config.server_threads)?;
        let conns = client::connect_many(server.addr, 4).await?;
        let paths = (0..40).map(|i| format!("/items/{i}")).collect();
        let (conns, answers) = client::fan_out(conns, paths).await?;
        drop(conns);
        drop(server);
        let mut t = client::Tally::default();
        for answer in answers {
            t.add(Some(answer));
        }
        if t.answered() != 40 || t.other > 0 {
            failures.push(format!(
                "{}: of 40 requests {} answered 2xx, {} answered 429, {} something else",
                contender.name(),
                t.ok,
                t.limited,
                t.other
            ));
        }
        if matches!(contender, Contender::Bare | Contender::Noop) && t.limited > 0 {
            failures.push(format!(
                "{}: answered 429 without a limiter",
                contender.name()
            ));
        }
    }
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The short mode's checks as a test of the harness (`cargo test -p
    /// perf`): a debug build is enough, since nothing here depends on
    /// speed, so CI needs no release build of the harness for them.
    #[test]
    fn the_short_checks_pass() {
        let config = crate::cli::parse(["short".to_owned()]).expect("short mode parses");
        let runtime = client::runtime(config.client_threads).expect("a client runtime");
        let failures = runtime
            .block_on(async { tokio::time::timeout(TIME_LIMIT, run(&config)).await })
            .expect("short mode finishes within its time limit")
            .expect("short mode runs");
        assert!(failures.is_empty(), "failed checks: {failures:#?}");
    }
}
