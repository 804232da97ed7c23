//! Reading the process's CPU time on Linux: the cgroup v2 files, with
//! `/proc/self/stat` as the fallback. The parsers take the files' text, so
//! that they are tested on strings.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where the kernel mounts the unified (v2) cgroup hierarchy.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Clock ticks per second of the times in `/proc/<pid>/stat` (`USER_HZ`):
/// 100 on every architecture Linux runs where this crate builds (the
/// kernel scales its internal tick to this fixed user-space unit).
const USER_HZ: u64 = 100;

/// The CPU limit in `cpu.max` (`"<quota> <period>"`, or `"max <period>"`
/// without a quota), as a number of CPUs: `Ok(None)` without a quota.
pub(crate) fn parse_cpu_max(text: &str) -> Result<Option<f64>, String> {
    let mut fields = text.split_whitespace();
    let (Some(quota), Some(period), None) = (fields.next(), fields.next(), fields.next()) else {
        return Err(format!(
            "cpu.max: expected \"<quota> <period>\", got {text:?}"
        ));
    };
    let period: u64 = period
        .parse()
        .map_err(|_| format!("cpu.max: the period is not a whole number: {period:?}"))?;
    if period == 0 {
        return Err("cpu.max: the period is 0".to_owned());
    }
    if quota == "max" {
        return Ok(None);
    }
    let quota: u64 = quota.parse().map_err(|_| {
        format!("cpu.max: the quota is neither \"max\" nor a whole number: {quota:?}")
    })?;
    if quota == 0 {
        return Err("cpu.max: the quota is 0".to_owned());
    }
    Ok(Some(quota as f64 / period as f64))
}

/// The CPU time the cgroup has used, in microseconds: the `usage_usec`
/// line of `cpu.stat`.
pub(crate) fn parse_cpu_stat(text: &str) -> Result<u64, String> {
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        if fields.next() == Some("usage_usec") {
            return match (fields.next().map(str::parse::<u64>), fields.next()) {
                (Some(Ok(usec)), None) => Ok(usec),
                _ => Err(format!("cpu.stat: malformed usage_usec line: {line:?}")),
            };
        }
    }
    Err("cpu.stat: no usage_usec line".to_owned())
}

/// The process's cgroup in the v2 hierarchy: the path of the `0::` line of
/// `/proc/self/cgroup` (`None` on a v1-only system).
pub(crate) fn parse_proc_cgroup(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::trim)
        .filter(|path| path.starts_with('/'))
}

/// The process's CPU time (user and system) in microseconds, from the text
/// of `/proc/self/stat`: fields 14 and 15, counted after the command name,
/// which is in parentheses and may hold spaces and parentheses itself.
pub(crate) fn parse_proc_stat(text: &str) -> Result<u64, String> {
    let after = text
        .rfind(')')
        .map(|i| &text[i + 1..])
        .ok_or_else(|| "/proc/self/stat: no command name".to_owned())?;
    // After the name: field 3 (state) is the first, so utime (14) is the
    // twelfth and stime (15) the thirteenth.
    let mut fields = after.split_whitespace().skip(11);
    let mut tick = || -> Result<u64, String> {
        fields
            .next()
            .and_then(|f| f.parse::<u64>().ok())
            .ok_or_else(|| format!("/proc/self/stat: malformed times in {text:?}"))
    };
    let (utime, stime) = (tick()?, tick()?);
    Ok(utime
        .saturating_add(stime)
        .saturating_mul(1_000_000 / USER_HZ))
}

/// How the sampler reads the CPU time: a cgroup's `cpu.stat` against its
/// CPU limit, or the process's own times against the CPUs it may run on.
#[derive(Debug)]
pub(crate) enum CpuReader {
    Cgroup {
        stat: PathBuf,
        /// CPUs the cgroup may use: its `cpu.max` quota, or the CPUs
        /// available without one.
        cpus: f64,
    },
    Process {
        cpus: f64,
    },
}

impl CpuReader {
    /// The cgroup v2 reader if the process's cgroup has a readable
    /// `cpu.stat`, else the `/proc/self/stat` reader.
    pub(crate) fn detect() -> CpuReader {
        let available = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let cgroup = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|text| {
                parse_proc_cgroup(&text).map(|p| cgroup_dir(Path::new(CGROUP_ROOT), p))
            });
        if let Some(dir) = cgroup {
            let stat = dir.join("cpu.stat");
            if std::fs::read_to_string(&stat)
                .ok()
                .is_some_and(|text| parse_cpu_stat(&text).is_ok())
            {
                // No `cpu.max` (the root cgroup has none) or an unreadable
                // one: no quota of this cgroup's own.
                let quota = std::fs::read_to_string(dir.join("cpu.max"))
                    .ok()
                    .and_then(|text| parse_cpu_max(&text).ok().flatten());
                return CpuReader::Cgroup {
                    stat,
                    cpus: quota.unwrap_or(available),
                };
            }
        }
        CpuReader::Process { cpus: available }
    }

    /// CPU time used so far, in microseconds; `None` if the file could not
    /// be read or parsed this time.
    pub(crate) fn used_us(&self) -> Option<u64> {
        match self {
            CpuReader::Cgroup { stat, .. } => {
                parse_cpu_stat(&std::fs::read_to_string(stat).ok()?).ok()
            }
            CpuReader::Process { .. } => {
                parse_proc_stat(&std::fs::read_to_string("/proc/self/stat").ok()?).ok()
            }
        }
    }

    /// The CPUs the reading is measured against.
    pub(crate) fn cpus(&self) -> f64 {
        match self {
            CpuReader::Cgroup { cpus, .. } | CpuReader::Process { cpus } => *cpus,
        }
    }
}

/// The time a thread has spent ready to run but waiting for a CPU, in
/// microseconds: the second field of `/proc/self/task/<tid>/schedstat`
/// (nanoseconds on a run queue).
pub(crate) fn parse_schedstat(text: &str) -> Result<u64, String> {
    let mut fields = text.split_whitespace();
    match (
        fields.next().map(str::parse::<u64>),
        fields.next().map(str::parse::<u64>),
    ) {
        (Some(Ok(_)), Some(Ok(waited_ns))) => Ok(waited_ns / 1000),
        _ => Err(format!(
            "schedstat: expected \"<run ns> <wait ns> <slices>\", got {text:?}"
        )),
    }
}

/// The run-queue waits of the process's threads, between readings.
///
/// A thread that is runnable but finds every CPU it may use taken (by
/// other processes, or by more of its own threads than CPUs) uses no CPU
/// time while it waits, so CPU time alone reads a service starved by its
/// neighbours as idle, however long its queue. Its wait is demand for the
/// CPU all the same: the sampler counts it with the CPU time.
#[derive(Debug, Default)]
pub(crate) struct Waits {
    /// Each live thread's wait at the last reading, by thread id.
    last: HashMap<u64, u64>,
}

impl Waits {
    /// The time, in microseconds, the process's threads waited for a CPU
    /// since the last call: each thread's wait since it was last seen
    /// (all of it, for a thread not seen before). A thread that ended
    /// since takes its last stretch with it. 0 when `/proc/self/task`
    /// cannot be read.
    pub(crate) fn advance(&mut self) -> u64 {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return 0;
        };
        let mut now = HashMap::with_capacity(self.last.len());
        let mut waited = 0u64;
        for task in tasks.flatten() {
            let Some(tid) = task
                .file_name()
                .to_str()
                .and_then(|t| t.parse::<u64>().ok())
            else {
                continue;
            };
            // A thread may end between the listing and this read.
            let Some(wait) = std::fs::read_to_string(task.path().join("schedstat"))
                .ok()
                .and_then(|text| parse_schedstat(&text).ok())
            else {
                continue;
            };
            let before = self.last.get(&tid).copied().unwrap_or(0);
            waited = waited.saturating_add(wait.saturating_sub(before));
            now.insert(tid, wait);
        }
        self.last = now;
        waited
    }
}

/// The directory of cgroup `path` under `root`.
fn cgroup_dir(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// The use of the CPUs between two readings: CPU time used (with the time
/// spent waiting for a CPU, see [`Waits`]) over the wall time passed times
/// the CPUs available, capped at 1 (a reading can run a little ahead of the
/// wall clock, and waits of several threads at once add up past it).
/// `None` when no time passed.
pub(crate) fn usage(used_us: u64, wall_us: u64, cpus: f64) -> Option<f64> {
    if wall_us == 0 || cpus.is_nan() || cpus <= 0.0 {
        return None;
    }
    Some((used_us as f64 / (wall_us as f64 * cpus)).min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_max_without_a_quota_is_none() {
        assert_eq!(parse_cpu_max("max 100000\n"), Ok(None));
    }

    #[test]
    fn cpu_max_with_a_quota_is_a_number_of_cpus() {
        assert_eq!(parse_cpu_max("200000 100000\n"), Ok(Some(2.0)));
        assert_eq!(parse_cpu_max("50000 100000"), Ok(Some(0.5)));
    }

    #[test]
    fn cpu_max_garbage_is_an_error() {
        for text in [
            "",
            "max",
            "200000",
            "abc 100000",
            "200000 0",
            "0 100000",
            "1 2 3",
            "-5 100000",
        ] {
            assert!(parse_cpu_max(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn cpu_stat_gives_usage_usec() {
        let text = "usage_usec 8723311\nuser_usec 5000000\nsystem_usec 3723311\n\
                    nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n";
        assert_eq!(parse_cpu_stat(text), Ok(8_723_311));
    }

    #[test]
    fn cpu_stat_garbage_is_an_error() {
        for text in [
            "",
            "user_usec 5\n",
            "usage_usec\n",
            "usage_usec x\n",
            "usage_usec 1 2\n",
        ] {
            assert!(parse_cpu_stat(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn proc_cgroup_finds_the_v2_path() {
        let text = "12:cpu,cpuacct:/old\n0::/system.slice/app.service\n";
        assert_eq!(parse_proc_cgroup(text), Some("/system.slice/app.service"));
        assert_eq!(parse_proc_cgroup("0::/\n"), Some("/"));
        assert_eq!(parse_proc_cgroup("4:cpu:/docker/abc\n"), None);
        assert_eq!(parse_proc_cgroup(""), None);
        assert_eq!(
            cgroup_dir(Path::new("/sys/fs/cgroup"), "/"),
            PathBuf::from("/sys/fs/cgroup")
        );
        assert_eq!(
            cgroup_dir(Path::new("/sys/fs/cgroup"), "/a/b"),
            PathBuf::from("/sys/fs/cgroup/a/b")
        );
    }

    #[test]
    fn proc_stat_sums_user_and_system_time() {
        // A command name with spaces and a parenthesis; utime 250 and stime
        // 50 ticks: 3 s.
        let text = "4242 (my (odd) app) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 \
                    9 0 12345 100000000 2000 18446744073709551615";
        assert_eq!(parse_proc_stat(text), Ok(3_000_000));
    }

    #[test]
    fn proc_stat_garbage_is_an_error() {
        for text in [
            "",
            "4242 app S 1",
            "4242 (app) S 1 2 3",
            "4242 (app) S 1 2 3 4 5 6 7 8 9 10 x y",
        ] {
            assert!(parse_proc_stat(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn missing_files_read_as_nothing() {
        let reader = CpuReader::Cgroup {
            stat: PathBuf::from("/nonexistent/cpu.stat"),
            cpus: 2.0,
        };
        assert_eq!(reader.used_us(), None);
        assert_eq!(reader.cpus(), 2.0);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_detected_reader_reads_this_process() {
        let reader = CpuReader::detect();
        let first = reader.used_us().expect("a reading on Linux");
        // Some CPU time, so that the next reading has moved.
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let second = reader.used_us().expect("a reading on Linux");
        assert!(second >= first, "{first} then {second}");
        assert!(reader.cpus() > 0.0);
    }

    #[test]
    fn schedstat_gives_the_wait_in_microseconds() {
        assert_eq!(parse_schedstat("123456789 2500000 17\n"), Ok(2500));
        for text in ["", "12", "a b c", "1 -2 3"] {
            assert!(parse_schedstat(text).is_err(), "{text:?}");
        }
    }

    /// Three spinning threads per CPU: at any instant two of every three
    /// are ready to run with no CPU free, so the process's threads wait
    /// about twice the wall time per CPU. CPU time alone can never exceed
    /// one wall time per CPU, which is all the sampler saw before it
    /// counted the waits: a service its neighbours starve read as idle.
    #[cfg(target_os = "linux")]
    #[test]
    fn threads_waiting_for_a_cpu_are_counted() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;

        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut waits = Waits::default();
        let stop = Arc::new(AtomicBool::new(false));
        let spinners: Vec<_> = (0..3 * cpus)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
                    }
                })
            })
            .collect();
        // Every spinner seen once, so the next reading is its wait since.
        std::thread::sleep(std::time::Duration::from_millis(50));
        waits.advance();
        let start = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(400));
        // Read while the spinners live: an ended thread's wait is gone.
        let waited = waits.advance();
        let wall_us = start.elapsed().as_micros() as f64;
        stop.store(true, Ordering::Relaxed);
        for spinner in spinners {
            spinner.join().expect("a spinner");
        }
        assert!(
            waited as f64 >= 0.5 * cpus as f64 * wall_us,
            "{waited} µs waited in {wall_us} µs on {cpus} CPUs"
        );
        // Nothing seen twice: a reading right after counts only new waits.
        assert!(waits.advance() < waited);
    }

    #[test]
    fn usage_is_against_the_cpus_available() {
        // A container limited to 2 CPUs that used 2 CPUs' time is at 100 %.
        assert_eq!(usage(1_000_000, 500_000, 2.0), Some(1.0));
        assert_eq!(usage(500_000, 500_000, 2.0), Some(0.5));
        // Never above 1, nothing from no time.
        assert_eq!(usage(3_000_000, 500_000, 2.0), Some(1.0));
        assert_eq!(usage(1, 0, 2.0), None);
        assert_eq!(usage(1, 1, 0.0), None);
    }
}
