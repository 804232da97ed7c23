//! Markdown tables of every result, printed and written to `report.md`.

use std::fmt::Write as _;

use crate::accuracy::Run;
use crate::bench::{paired_ratio, BenchRow};
use crate::hostile::{self, HostileResult};
use crate::overhead::OverheadRow;
use crate::retry::{Honesty, RetryRun};
use crate::servers::Contender;
use crate::soak::SoakResult;

/// A report being assembled, one Markdown section at a time.
#[derive(Debug, Default)]
pub struct Report {
    /// The Markdown so far.
    text: String,
}

/// `a / b`, or 0 when `b` is 0.
fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else {
        a / b
    }
}

impl Report {
    /// The Markdown text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Adds a free-form line (conditions, commands).
    pub fn note(&mut self, line: &str) {
        let _ = writeln!(self.text, "{line}\n");
    }

    /// How each contender is configured, in words.
    pub fn contenders(&mut self) {
        let t = &mut self.text;
        let _ = writeln!(
            t,
            "### Contenders
"
        );
        for (name, how) in [
            (Contender::Bare, "`Router` with no layer; every ratio is taken against it.".to_owned()),
            (Contender::Noop, "a layer whose service only forwards `poll_ready` and `call`.".to_owned()),
            (Contender::OursGlobal, "`SlidingWindowLayer::qps(limit)` (one global key, 10 x 100 ms buckets; responses keep axum's body type, the default).".to_owned()),
            (Contender::OursPath, "`SlidingWindowLayer::qps(limit).key(MatchedPathKey)` (a key per route).".to_owned()),
            (Contender::OursThrottle, "`SlidingWindowLayer::qps(limit).throttle(max_wait)` (one global key; passes paced 1 s / limit apart, a request whose turn is at most `max_wait` away waits for it inside the response future, one further away is answered 429).".to_owned()),
            (Contender::OursStrict, "`SlidingWindowLayer::qps(limit).strict()` (one global key; admission counts the window and the bucket that has just left it, 11 x 100 ms).".to_owned()),
            (
                Contender::GovernorUsual,
                "`GovernorConfigBuilder::default().period(1 s / limit).burst_size(limit)` with \
                 `GlobalKeyExtractor`. Its `per_second(n)` would mean one request every n seconds \
                 (a period, not a rate), so the rate is written as a period; burst = limit is what \
                 `Quota::per_second(limit)` gives, and lets up to twice the limit through in the \
                 first second."
                    .to_owned(),
            ),
            (Contender::GovernorBurst1, "the same period with `burst_size(1)`: one request every 1 s / limit.".to_owned()),
            (
                Contender::TowerRateLimit,
                format!(
                    "`RateLimitLayer::new(limit, 1 s)` is not `Clone` and waits in `poll_ready` \
                     instead of rejecting, so under axum it needs `BufferLayer::new({})` (Clone, \
                     one worker task), `LoadShedLayer` (fail instead of wait when the buffer is \
                     full) and `HandleErrorLayer` (turn `Overloaded` into 429; there is nothing to \
                     compute a Retry-After from). Up to {} requests wait in the buffer for the next \
                     window.",
                    crate::servers::TOWER_BUFFER,
                    crate::servers::TOWER_BUFFER
                ),
            ),
        ] {
            let _ = writeln!(t, "- **{}**: {how}", name.name());
        }
        let _ = writeln!(t);
    }

    /// The throughput and latency table.
    pub fn bench(&mut self, rows: &[BenchRow], connections: usize, rounds: usize, secs: u64) {
        let t = &mut self.text;
        let _ = writeln!(
            t,
            "### Throughput and latency (loopback, {connections} connections, {rounds} rounds x {secs} s per contender, limit never reached)\n"
        );
        let _ = writeln!(
            t,
            "| contender | req/s | vs bare | vs bare (median of rounds) | p50 µs | p99 µs | p99.9 µs | p50 vs bare | p99 vs bare | p99.9 vs bare | non-2xx |"
        );
        let _ = writeln!(t, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        let bare = rows.iter().find(|r| r.contender == Contender::Bare);
        for row in rows {
            let (vs, paired, q) = match bare {
                Some(b) => (
                    ratio(row.rps, b.rps),
                    paired_ratio(row, b),
                    [0.5, 0.99, 0.999].map(|q| ratio(row.quantile(q) as f64, b.quantile(q) as f64)),
                ),
                None => (0.0, 0.0, [0.0; 3]),
            };
            let _ = writeln!(
                t,
                "| {} | {:.0} | {:.3} | {:.3} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {} |",
                row.contender.name(),
                row.rps,
                vs,
                paired,
                row.quantile(0.5),
                row.quantile(0.99),
                row.quantile(0.999),
                q[0],
                q[1],
                q[2],
                row.tally.limited + row.tally.other + row.tally.failed
            );
        }
        let _ = writeln!(t);
    }

    /// The in-process overhead table and the governor comparison.
    pub fn overhead(&mut self, rows: &[OverheadRow], rounds: usize, requests: u64) {
        let t = &mut self.text;
        let _ = writeln!(
            t,
            "### Per-request cost in process ({rounds} paired rounds x {requests} requests, one thread)\n"
        );
        let _ = writeln!(
            t,
            "| contender | ns per request | ns beyond a no-op layer |"
        );
        let _ = writeln!(t, "|---|---:|---:|");
        for row in rows {
            let _ = writeln!(
                t,
                "| {} | {:.0} | {:.0} |",
                row.contender.name(),
                row.ns,
                row.beyond_noop_ns
            );
        }
        let find = |c: Contender| {
            rows.iter()
                .find(|r| r.contender == c)
                .map(|r| r.beyond_noop_ns)
        };
        if let Some(gov) = find(Contender::GovernorUsual) {
            for ours in [Contender::OursGlobal, Contender::OursPath] {
                if let Some(cost) = find(ours) {
                    let _ = writeln!(
                        t,
                        "\n{}: cost beyond a no-op layer = {:.2}x tower_governor's.",
                        ours.name(),
                        ratio(cost, gov)
                    );
                }
            }
        }
        let _ = writeln!(t);
    }

    /// The accuracy table.
    pub fn accuracy(&mut self, runs: &[Run]) {
        let t = &mut self.text;
        let Some(first) = runs.first() else { return };
        let limit = first.limit;
        let _ = writeln!(
            t,
            "### Accuracy under overload (limit {limit} per 1 s window; windows of 10 x 100 ms)\n"
        );
        let _ = writeln!(
            t,
            "| scenario | contender | offered | admitted | rate /s | rate after 1st s | bucket-aligned max (bound) | full windows at limit | sliding 1 s max | largest 100 ms bucket | 429 | 429 with room | unanswered | p50 / p99 ms |"
        );
        let _ = writeln!(
            t,
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for run in runs {
            let a = &run.accuracy;
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | {:.1} ({:.2}x) | {:.1} ({:.2}x) | {} ({}) | {}/{} | {} ({:.2}x) | {} | {} | {} | {} | {:.1} / {:.1} |",
                run.scenario,
                run.contender.name(),
                run.sent,
                a.passes,
                a.rate,
                ratio(a.rate, limit as f64),
                a.rate_after_first,
                ratio(a.rate_after_first, limit as f64),
                a.bucket_max,
                a.bucket_max_bound,
                a.full_windows_at_limit,
                a.full_windows,
                a.sliding_max,
                ratio(a.sliding_max as f64, limit as f64),
                a.bucket_peak,
                run.tally.limited,
                a.blocked_with_room,
                run.unanswered,
                run.p50_us as f64 / 1000.0,
                run.p99_us as f64 / 1000.0
            );
        }
        let _ = writeln!(
            t,
            "\n\"bucket-aligned max\" places each admission in the 100 ms bucket of its handler reading; \
             the bound in brackets allows it anywhere between the reading taken before the limiter and \
             the handler's. \"full windows at limit\" counts the 1 s windows lying wholly inside the \
             offered load whose count equals the limit (fewer means the offered load left a bucket \
             short, or the limiter refused with room). \"429 with room\" counts refusals while the \
             bucket-aligned window held fewer than the limit, at both readings around the limiter \
             (for our layer: under-admission). \"sliding 1 s max\" is exact over microsecond \
             handler timestamps; it is at most the bucket-aligned max plus the largest 100 ms bucket \
             (to within the millisecond reading), since a true 1 s window covers one bucket-aligned \
             window plus part of the bucket before it. \
             Target for our layer: bucket-aligned = limit, sliding <= {}.\n",
            limit + limit / 10
        );
    }

    /// The flow behaviours beside the default window and tower_governor: the
    /// true sliding maximum, the long-run rate, the wait, and the verdicts
    /// on the targets of strict mode and pacing.
    pub fn flow(&mut self, runs: &[Run]) {
        let t = &mut self.text;
        let Some(first) = runs.first() else { return };
        let limit = first.limit;
        let buckets = crate::analysis::Grid::DEFAULT.buckets;
        let strict_rate = limit as f64 * buckets as f64 / (buckets + 1) as f64;
        let shown = [
            Contender::OursGlobal,
            Contender::OursStrict,
            Contender::OursThrottle,
            Contender::GovernorUsual,
            Contender::GovernorBurst1,
        ];
        let _ = writeln!(t, "### Flow behaviours (limit {limit} per 1 s)\n");
        let _ = writeln!(
            t,
            "| scenario | contender | sliding 1 s max | long-run rate /s | an exact log, same arrivals /s | wait p50 / p99 / p100 ms | timer lateness p50 / p99 / p100 ms | passes per 100 ms while saturated (buckets) |"
        );
        let _ = writeln!(t, "|---|---|---:|---:|---:|---:|---:|---:|");
        for run in runs.iter().filter(|r| shown.contains(&r.contender)) {
            let a = &run.accuracy;
            let [p50, p99, p100] = a.wait_us.map(|us| us as f64 / 1000.0);
            let [l50, l99, l100] = run.timer_late_us.map(|us| us as f64 / 1000.0);
            let saturated = match a.saturated {
                Some((min, max)) => format!("{min}-{max} ({})", a.saturated_buckets),
                None => "none".to_owned(),
            };
            let _ = writeln!(
                t,
                "| {} | {} | {} | {:.1} | {:.1} | {p50:.2} / {p99:.2} / {p100:.2} | {l50:.2} / {l99:.2} / {l100:.2} | {saturated} |",
                run.scenario,
                run.contender.name(),
                a.sliding_max,
                a.rate_after_first,
                a.exact_log_rate,
            );
        }
        let _ = writeln!(
            t,
            "\n\"sliding 1 s max\": the most passes in any half-open 1 s interval, every start \
             point, over the pass timestamps (read in a service just inside the limiter, in the \
             same synchronous step as its decision or at the end of its wait). \"long-run \
             rate\": passes per second from the end of the first second to the end of the \
             offered load. \"an exact log\": the long-run rate a limiter keeping every \
             pass time would have given the same arrivals (each admitted when fewer than the \
             limit passed in the 1 s before it reached the limiter), the most any limiter \
             that holds the limit in every 1 s interval can admit of them. \"wait\": from the reading before the limiter to the pass, over \
             every admitted request (a limiter that does not pace shows its own few \
             microseconds). \"timer lateness\": how late a task sleeping until a fixed \
             instant every 10 ms on the server's runtime woke during the run, the delay any \
             waiting request meets on top of its turn. \"while saturated\": passes per 100 ms bucket, by pass timestamp, \
             in the buckets during which some admitted request was waiting all the time.\n"
        );
        let strict: Vec<&Run> = runs
            .iter()
            .filter(|r| r.contender == Contender::OursStrict)
            .collect();
        if !strict.is_empty() {
            let within = strict
                .iter()
                .filter(|r| r.accuracy.sliding_max <= limit)
                .count();
            let worst = strict
                .iter()
                .map(|r| r.accuracy.sliding_max)
                .max()
                .unwrap_or(0);
            let steady: Vec<&&Run> = strict
                .iter()
                .filter(|r| r.scenario.shape == crate::scenario::Shape::Steady)
                .collect();
            let rate_ok = strict
                .iter()
                .filter(|r| r.accuracy.rate_after_first >= strict_rate)
                .count();
            let steady_ok = steady
                .iter()
                .filter(|r| r.accuracy.rate_after_first >= strict_rate)
                .count();
            let lowest = |rs: &mut dyn Iterator<Item = f64>| rs.fold(f64::INFINITY, f64::min);
            let _ = writeln!(
                t,
                "Strict: sliding 1 s max <= {limit} in {within} of {} scenarios (largest {worst}); \
                 long-run rate >= {strict_rate:.1} (limit x {buckets}/{}) in {rate_ok} of {} \
                 scenarios, {steady_ok} of {} steady ones (lowest {:.1} overall, {:.1} steady).\n",
                strict.len(),
                buckets + 1,
                strict.len(),
                steady.len(),
                lowest(&mut strict.iter().map(|r| r.accuracy.rate_after_first)),
                lowest(&mut steady.iter().map(|r| r.accuracy.rate_after_first)),
            );
        }
    }

    /// The verdicts on the throttle's targets, against `max_wait`.
    pub fn throttle(&mut self, runs: &[Run], max_wait: std::time::Duration) {
        let t = &mut self.text;
        let paced: Vec<&Run> = runs
            .iter()
            .filter(|r| r.contender == Contender::OursThrottle)
            .collect();
        let Some(first) = paced.first() else { return };
        let limit = first.limit;
        let per_bucket = limit / crate::analysis::Grid::DEFAULT.buckets;
        let max_wait_us = u64::try_from(max_wait.as_micros()).unwrap_or(u64::MAX);
        let waits_ok = paced
            .iter()
            .filter(|r| r.accuracy.wait_us[2] <= max_wait_us)
            .count();
        let longest = paced
            .iter()
            .map(|r| r.accuracy.wait_us[2])
            .max()
            .unwrap_or(0);
        let with_saturated: Vec<&&Run> = paced
            .iter()
            .filter(|r| r.accuracy.saturated.is_some())
            .collect();
        let paced_ok = with_saturated
            .iter()
            .filter(|r| {
                r.accuracy
                    .saturated
                    .is_some_and(|(min, max)| min + 1 >= per_bucket && max <= per_bucket + 1)
            })
            .count();
        let buckets: u64 = paced.iter().map(|r| r.accuracy.saturated_buckets).sum();
        let (low, high) = with_saturated
            .iter()
            .filter_map(|r| r.accuracy.saturated)
            .fold((u64::MAX, 0), |(lo, hi), (min, max)| {
                (lo.min(min), hi.max(max))
            });
        let within = paced
            .iter()
            .filter(|r| r.accuracy.sliding_max <= limit)
            .count();
        let late = paced.iter().map(|r| r.timer_late_us[2]).max().unwrap_or(0);
        let _ = writeln!(
            t,
            "Throttle (max_wait {} ms): largest wait {:.2} ms, <= max_wait in {waits_ok} of {} \
             scenarios (the timer probe on the same runtimes woke up to {:.2} ms late); passes per 100 ms while saturated within {per_bucket} +- 1 in {paced_ok} \
             of the {} scenarios with saturated buckets ({buckets} buckets, {}-{} passes); \
             sliding 1 s max <= {limit} in {within} of {}.\n",
            max_wait.as_millis(),
            longest as f64 / 1000.0,
            paced.len(),
            late as f64 / 1000.0,
            with_saturated.len(),
            if low == u64::MAX { 0 } else { low },
            high,
            paced.len(),
        );
    }

    /// The Retry-After table.
    pub fn retry(&mut self, runs: &[RetryRun], limit: u64) {
        let t = &mut self.text;
        let _ = writeln!(
            t,
            "### Retry-After honesty (steady 2x overload, limit {limit}/s)\n"
        );
        let _ = writeln!(
            t,
            "| contender | alone: retries | alone: passed | contended: retries | contended: passed | 429s with Retry-After 0 | 429s without Retry-After | largest Retry-After (s) |"
        );
        let _ = writeln!(t, "|---|---:|---:|---:|---:|---:|---:|---:|");
        let share = |h: &Honesty| match h.share() {
            Some(s) => format!("{:.1}%", s * 100.0),
            None => "no 429".to_owned(),
        };
        for run in runs {
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                run.contender.name(),
                run.alone.retries,
                share(&run.alone),
                run.contended.retries,
                share(&run.contended),
                run.alone.zero + run.contended.zero,
                run.alone.no_header + run.contended.no_header,
                run.alone.max_wait.max(run.contended.max_wait)
            );
        }
        let _ = writeln!(
            t,
            "\n\"alone\": one client sends at twice the limit and, on a 429, waits exactly the \
             Retry-After it got (0 when absent) before its next attempt. \"contended\": four such \
             clients ride along a crowd at twice the limit that never waits.\n"
        );
    }

    /// The soak summary.
    pub fn soak(&mut self, result: &SoakResult) {
        let t = &mut self.text;
        let _ = writeln!(
            t,
            "### Soak{} ({:.0} s, {} distinct keys, max_keys {})\n",
            if result.compact {
                ", compact layer"
            } else {
                ""
            },
            result.elapsed.as_secs_f64(),
            result.keys,
            result.max_keys
        );
        let _ = writeln!(t, "| figure | value |");
        let _ = writeln!(t, "|---|---:|");
        let rows: Vec<(String, String)> = {
            let mut rows = vec![
                ("requests sent".to_owned(), result.sent.to_string()),
                (
                    "requests per second".to_owned(),
                    format!(
                        "{:.0}",
                        ratio(result.sent as f64, result.elapsed.as_secs_f64())
                    ),
                ),
                (
                    "answered 2xx / 429 / other / failed".to_owned(),
                    format!(
                        "{} / {} / {} / {}",
                        result.tally.ok,
                        result.tally.limited,
                        result.tally.other,
                        result.tally.failed
                    ),
                ),
                (
                    "handle pass + block (summed per window)".to_owned(),
                    format!(
                        "{} + {} = {}",
                        result.handle_pass,
                        result.handle_block,
                        result.handle_pass + result.handle_block
                    ),
                ),
                ("windows checked".to_owned(), result.epochs.to_string()),
                (
                    "windows that did not match".to_owned(),
                    result.mismatches.len().to_string(),
                ),
                (
                    "most keys held (overflow included)".to_owned(),
                    result.max_len.to_string(),
                ),
            ];
            if let Some((first, last, min, max, slope)) = result.memory_summary() {
                rows.push((
                    format!(
                        "RSS after {:.0} s warm-up: first / last",
                        result.warmup_secs
                    ),
                    format!(
                        "{:.1} / {:.1} MiB",
                        first as f64 / 1024.0,
                        last as f64 / 1024.0
                    ),
                ));
                rows.push((
                    "RSS after warm-up: min / max".to_owned(),
                    format!(
                        "{:.1} / {:.1} MiB",
                        min as f64 / 1024.0,
                        max as f64 / 1024.0
                    ),
                ));
                rows.push((
                    "RSS trend after warm-up".to_owned(),
                    format!("{slope:+.1} KiB/min"),
                ));
            }
            rows
        };
        for (k, v) in rows {
            let _ = writeln!(t, "| {k} | {v} |");
        }
        for m in result.mismatches.iter().take(5) {
            let _ = writeln!(t, "\n- {m}");
        }
        let _ = writeln!(t);
    }

    /// The hostile soak's summary.
    pub fn hostile(&mut self, result: &HostileResult) {
        let mib = |kib: u64| kib as f64 / 1024.0;
        let t = &mut self.text;
        let _ = writeln!(
            t,
            "### Hostile soak ({:.0} s, distinct maximum-size keys, default max_keys {})\n",
            result.elapsed.as_secs_f64(),
            hostile::MAX_KEYS
        );
        let _ = writeln!(
            t,
            "Load average (1/5/15 min) at the start: {}; at the end: {}.\n",
            result.loadavg.0, result.loadavg.1
        );
        let _ = writeln!(
            t,
            "| phase | seconds | requests | per second | not UTF-8 / %FF | key source bytes | \
             200 / 429 / other / failed | most keys held | clock jumps | RSS peak |"
        );
        let _ = writeln!(t, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for p in &result.phases {
            let secs = p.span.1 - p.span.0;
            let _ = writeln!(
                t,
                "| {} | {:.0}-{:.0} | {} | {:.0} | {} | {} | {} / {} / {} / {} | {} | {} | {:.1} MiB |",
                p.phase.name(),
                p.span.0,
                p.span.1,
                p.sent,
                ratio(p.sent as f64, secs),
                p.invalid,
                p.key_bytes,
                p.tally.ok,
                p.tally.limited,
                p.tally.other,
                p.tally.failed,
                p.max_len,
                p.epochs,
                mib(result.phase_peak_kib(p))
            );
        }
        let bound = hostile::table_bound() + hostile::server_margin();
        let _ = writeln!(t);
        let _ = writeln!(t, "| memory (whole process) | value |");
        let _ = writeln!(t, "|---|---:|");
        let rows = [
            (
                "RSS after warm-up (baseline)",
                format!("{:.1} MiB", mib(result.baseline_kib)),
            ),
            (
                "RSS peak / end",
                format!(
                    "{:.1} / {:.1} MiB",
                    mib(result.peak_kib()),
                    mib(result.end_kib())
                ),
            ),
            (
                "growth to the peak",
                format!("{:.1} MiB", result.growth_bytes() as f64 / 1048576.0),
            ),
            (
                "bound asserted: table + server margin",
                format!(
                    "{:.1} + {:.1} = {:.1} MiB",
                    hostile::table_bound() as f64 / 1048576.0,
                    hostile::server_margin() as f64 / 1048576.0,
                    bound as f64 / 1048576.0
                ),
            ),
        ];
        for (k, v) in rows {
            let _ = writeln!(t, "| {k} | {v} |");
        }
        let failures = result.failures();
        let _ = writeln!(
            t,
            "\nChecks: {}",
            if failures.is_empty() {
                "all passed".to_owned()
            } else {
                format!("{} FAILED", failures.len())
            }
        );
        for f in failures {
            let _ = writeln!(t, "\n- {f}");
        }
        for p in &result.phases {
            for e in &p.errors {
                let _ = writeln!(t, "\n- {}: {e}", p.phase.name());
            }
        }
        let _ = writeln!(t);
    }

    /// Links the charts written in this run.
    pub fn charts(&mut self, files: &[String]) {
        if files.is_empty() {
            return;
        }
        let t = &mut self.text;
        let _ = writeln!(t, "### Charts\n");
        for f in files {
            let _ = writeln!(t, "![{f}]({f})\n");
        }
    }
}
